"""End to end: `flwr run` against a real SuperLink (simulation runtime), as a user runs it.

The app's main paths (HK, FedProx, FedAvg with seeded evaluators, vision with SCKM selection) run in
tests/test_regression.py, which pins their numbers too; here: a bad run config, the baselines, and the
two drop-in Flower apps that are not ours.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bouquet.results import RunFolder

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e
#: The foreign apps' simulated federation.  Flower's Ray backend asks 2 CPUs per ClientApp unless told otherwise,
#: and each test worker's Ray head has the cores shared among the workers (1 each with two workers on 2 cores),
#: where no ClientApp of 2 CPUs could start: ask 1, as every other simulation of the suite does.
FOREIGN_FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"


def test_bad_run_config_value_stops_with_a_clear_message(run_app, superlink):
    """The run fails before any training, and the message names the key.  Flower 1.42 does not always ship the
    last lines of a simulation process that ends within seconds (3 of 8 runs of this file with ``-n 2`` on 2
    cores: the traceback never reached the SuperLink's stored log, ``flwr log --show``), so the message is
    checked wherever the error's line arrived; the failed status and the missing results always.  The
    message itself is pinned in ``test_config.py::test_bad_values_name_the_key``."""
    folder, output = run_app('strategy="fedavgx"', supernodes=2, check=False)
    run_id = re.search(r"Successfully started run (\d+)", output).group(1)
    (run,) = [r for r in json.loads(superlink.run_statuses())["runs"] if r["run-id"] == run_id]
    assert run["status"] == "finished:failed" and not (folder / "summary.json").exists()
    if "ConfigError" in output:
        assert "run-config 'strategy': unknown strategy 'fedavgx'" in output


def test_hk_strategy_drops_into_a_foreign_flower_app_on_an_existing_ray_cluster(superlink, ray_head):
    """A numpy linear-regression app that is not ours swaps FedAvg for HKFedAvg in one line.

    Run three times: the paper's one shared model, each coalition its own (``coalition_models="personal"``),
    and each its own with coalition memory (``memory=True``: the drop-in's keyword, nothing else changed).

    The simulation also joins the session's Ray head as a driver instead of starting a private Ray
    (scale-out, docs/DEPLOY.md): its driver log is in the head's session.
    """
    mse = {}
    for models, memory in (("shared", "false"), ("personal", "false"), ("personal", "true")):
        done = superlink.flwr_run(ROOT / "tests" / "foreign_app", federation_config=FOREIGN_FEDERATION,
                                  run_config=f'coalition-models="{models}" memory={memory}')
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        label = "HK cosine tau=0.5 with memory" if memory == "true" else "HK cosine tau=0.5"
        assert "Starting HKFedAvg strategy" in output and f"{label} -> K=2" in output
        # the app registers no bouquet query handler: none is sent (no traceback on any node), one line says so
        assert "No query function registered" not in output and "query.identify" not in output.replace(
            "no query.identify is sent", "")
        assert output.count("nodes are ordered by node id") == 1
        final = output.split("FOREIGN-APP-FINAL", 1)[1].split("]", 1)[0].strip(" [")
        weights = [float(v) for v in final.split(",")]
        assert len(weights) == 3 and all(np.isfinite(weights))
        mse[models, memory] = float(output.split("FOREIGN-APP-MSE", 1)[1].split()[0])
    # Its two client groups want opposite weights: the shared model (their mean) fits neither, each
    # coalition's own model fits its group (nothing changed on the clients), with memory (the validated
    # form, from memory=True in the app's own run config) as without.
    assert mse["personal", "false"] < 0.2 * mse["shared", "false"], mse
    assert mse["personal", "true"] < 0.2 * mse["shared", "false"], mse
    logs = [p.name for p in ray_head.temp_dir.glob("session_*/logs/*")]
    assert any(name.startswith("python-core-driver-") for name in logs), sorted(logs)[:20]
    assert ray_head.alive()  # the cluster outlives the run


@pytest.mark.parametrize("strategy", ["perfedavg-hf", "fixed-k-cosine"])
def test_baseline_strategies_run_end_to_end(run_app, strategy):
    folder, stdout = run_app(f'strategy="{strategy}" num-server-rounds=2 clients-per-round=3 '
                             "local-epochs=1 synthetic-households=150 active-factor=0.5", supernodes=3)
    assert f"bouquet summary: {strategy}, 2 rounds, 3 clients" in stdout
    train = RunFolder(folder).rounds("train")
    assert [r["replies"] for r in train] == [3, 3]
    if strategy.startswith("fixed-k"):
        assert all(r["coalitions"] == 2 for r in train)
        assert "fixed-K cosine K=2 -> K=2 coalitions" in stdout


def test_sckm_selection_drops_into_a_foreign_torch_app(superlink):
    """A torch app that is not ours adopts SCKM-Select: one strategy line + one client registration."""
    done = superlink.flwr_run(ROOT / "tests" / "foreign_sketch_app", federation_config=FOREIGN_FEDERATION)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    lines = [line.split("FOREIGN-SKETCH-ROUND", 1)[1].split() for line in output.splitlines()
             if "FOREIGN-SKETCH-ROUND" in line]
    assert [int(parts[0]) for parts in lines] == [1, 2]
    assert all(int(parts[1]) == 2 and int(parts[2]) == 4 * 2 * 4 for parts in lines)  # 4 nodes x 2 layers x 4 B
    assert "FOREIGN-SKETCH-FINAL True" in output


def test_selection_of_trained_updates_runs_end_to_end(run_app):
    # sketch-source local-update: all 4 nodes train, SCKM keeps 2 of their updates (issue 22)
    folder, stdout = run_app('task="vision" selection="sckm-select" sketch-source="local-update" strategy="fedavg" '
                             "num-server-rounds=2 clients-per-round=2 local-batches=2", supernodes=4)
    train = RunFolder(folder).rounds("train")
    assert [(r["updates-trained"], r["updates-aggregated"]) for r in train] == [(4, 2), (4, 2)]
    assert all(len(r["update-nodes"]) == 2 for r in train)
    assert "Selection of updates: sckm-select keeps 2" in stdout


def test_a_preset_file_with_a_key_changed_runs_and_the_key_wins(superlink, tmp_path):
    """A copy of the paper's preset file with one key changed (as a user edits it), run by ``flwr run``: the
    ServerApp and the nodes read the file's values, and the changed key holds its value although it is the
    default job's."""
    from bouquet.config import PRESETS_DIR

    results = tmp_path / "results"
    edited = tmp_path / "my-paper.toml"
    text = (PRESETS_DIR / "paper.toml").read_text()
    for old, new in (("local-epochs = 5", "local-epochs = 3"), ("learning-rate = 0.001", "learning-rate = 0.01"),
                     ("num-server-rounds = 20", "num-server-rounds = 1")):
        assert old in text
        text = text.replace(old, new)
    edited.write_text(text + f'strategy = "fedavg"\nclients-per-round = 3\nsynthetic-households = 150\n'
                             f'active-factor = 0.5\nresults-dir = "{results}"\nrun-name = "e2e"\n')
    done = superlink.flwr_run(ROOT, run_config=str(edited),
                              federation_config="num-supernodes=3 client-resources-num-cpus=1")
    assert done.returncode == 0 and (results / "e2e" / "summary.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    config = json.loads((results / "e2e" / "config.json").read_text())
    assert (config["forecaster"], config["local-epochs"], config["learning-rate"], config["forecast-baseline"],
            config["split"], config["num-server-rounds"]) == ("paper", 3, 0.01, "none", "fraction", 1)


@pytest.mark.tier2  # second tier: the default job (built on the improved forecaster) is pinned first-tier in test_regression.py
def test_the_improved_forecaster_runs_end_to_end_beside_the_naive_forecasts(run_app):
    folder, stdout = run_app('forecaster="improved" strategy="fedavg" num-server-rounds=2 clients-per-round=3 '
                             "local-epochs=1 synthetic-households=150 active-factor=0.5", supernodes=3)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["best-naive"] in summary["naive-mae-litres"] and "window median" in summary["naive-mae-litres"]
    assert abs(summary["skill-vs-best-naive"]) < 0.2  # it starts as the window median, 2 short rounds later
    config = json.loads((folder / "config.json").read_text())
    assert (config["forecaster"], config["calendar-inputs"], config["forecast-loss"]) == ("improved", "weekday", "l1")
    assert "the best naive forecast; skill" in stdout
