"""End to end: `flwr run` against a real local SuperLink (simulation runtime), as a user runs it."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bouquet.launch import local_superlink

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def run_app(tmp_path, run_config: str, supernodes: int = 4):
    results = tmp_path / "results"
    with local_superlink(tmp_path / "link") as link:
        done = link.flwr_run(ROOT, run_config=f'{run_config} results-dir="{results}" run-name="e2e"',
                             federation_config=f"num-supernodes={supernodes} client-resources-num-cpus=1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return results / "e2e", done.stdout


def test_fedavg_water_run_writes_results_and_learns(tmp_path):
    folder, stdout = run_app(tmp_path, 'strategy="fedavg" num-server-rounds=3 clients-per-round=3 local-epochs=2 '
                                       "synthetic-households=200 active-factor=0.5")
    assert "bouquet summary: fedavg, 3 rounds, 4 clients" in stdout
    config = json.loads((folder / "config.json").read_text())
    assert config["num-server-rounds"] == 3 and config["strategy"] == "fedavg"
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    train = [r for r in rounds if r["phase"] == "train"]
    evaluate = [r for r in rounds if r["phase"] == "evaluate"]
    assert [r["round"] for r in train] == [1, 2, 3] and [r["round"] for r in evaluate] == [1, 2, 3]
    assert all(r["replies"] == 3 and r["rejected"] == 0 for r in train)
    assert evaluate[-1]["mse"] < evaluate[0]["mse"], evaluate  # the held-out loss went down
    clients = pd.read_csv(folder / "clients.csv")
    assert sorted(clients["partition-id"]) == [0, 1, 2, 3]
    assert clients["mae-litres"].gt(0).all() and clients["num-examples"].gt(0).all()
    pool = pd.read_csv(folder / "pool.csv")
    assert set(clients["household"]) <= set(pool.loc[pool["status"] == "pool", "household"])
    predictions = pd.read_csv(folder / "predictions.csv")
    assert sorted(predictions["partition-id"].unique()) == [0, 1, 2, 3]
    per_client = predictions.assign(err=(predictions["predicted-litres"] - predictions["actual-litres"]).abs())
    np.testing.assert_allclose(per_client.groupby("partition-id")["err"].mean().to_numpy(),
                               clients.sort_values("partition-id")["mae-litres"].to_numpy(), rtol=1e-6)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["clients-evaluated"] == 4
    assert summary["mae-litres-mean"] == pytest.approx(clients["mae-litres"].mean())


def test_same_seed_gives_the_same_run(tmp_path):
    """Flower draws new node ids every run; sampling (training and evaluation) and aggregation follow partition
    ids, so two runs match."""
    config = ('strategy="fedavg" num-server-rounds=2 clients-per-round=2 fraction-evaluate=0.5 local-epochs=1 '
              'seed=3 synthetic-households=200 active-factor=0.5')
    runs = [run_app(tmp_path / f"run{i}", config, supernodes=6)[0] for i in (1, 2)]
    trained = [pd.read_csv(folder / "train_clients.csv").sort_values(["round", "partition-id"]) for folder in runs]
    assert trained[0]["node_id"].tolist() != trained[1]["node_id"].tolist()  # new node ids ...
    for column in ("round", "partition-id", "train-loss"):  # ... same clients, same training
        assert trained[0][column].tolist() == trained[1][column].tolist(), column
    evaluated = [pd.read_csv(folder / "evaluate_clients.csv").sort_values(["round", "partition-id"])
                 for folder in runs]
    assert evaluated[0].groupby("round").size().tolist() == [3, 3]  # half of the 6 nodes each round
    for column in ("round", "partition-id", "mse"):  # the same seeded draw of evaluators, the same scores
        assert evaluated[0][column].tolist() == evaluated[1][column].tolist(), column
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in runs]
    assert summaries[0]["mae-litres-mean"] == summaries[1]["mae-litres-mean"]
    predictions = [(folder / "predictions.csv").read_text() for folder in runs]
    assert predictions[0] == predictions[1]  # the same file, row for row


def test_bad_run_config_value_stops_with_a_clear_message(tmp_path):
    with local_superlink(tmp_path / "link") as link:
        done = link.flwr_run(ROOT, run_config='strategy="fedavgx"', federation_config="num-supernodes=2")
    assert "unknown strategy 'fedavgx'" in done.stdout + done.stderr


def test_hk_water_run_writes_coalitions(tmp_path):
    folder, stdout = run_app(tmp_path, 'strategy="hk-euclidean" hk-tau=0.5 num-server-rounds=2 clients-per-round=4 '
                                       "local-epochs=1 synthetic-households=200 active-factor=0.5 "
                                       "hk-record-trajectories=true", supernodes=5)
    assert "HK euclidean tau=0.5 -> K=" in stdout
    coalitions = pd.read_csv(folder / "coalitions.csv")
    assert sorted(coalitions["round"].unique()) == [1, 2]
    assert coalitions.groupby("round").size().tolist() == [4, 4]
    train = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    train = [r for r in train if r["phase"] == "train"]
    for record in train:
        members = coalitions[coalitions["round"] == record["round"]]
        assert record["coalitions"] == members["coalition"].nunique()
        assert sorted(record["coalition-sizes"], reverse=True) == sorted(
            members.groupby("coalition").size().tolist(), reverse=True)
    assert json.loads((folder / "summary.json").read_text())["strategy"] == "hk-euclidean"
    with np.load(folder / "trajectories" / "round-002.npz") as stored:
        projection, labels = stored["projection"], stored["labels"]
    assert projection.shape[1:] == (4, 2) and projection.shape[0] == train[1]["hk-steps"] + 1
    assert len(set(labels.tolist())) == train[1]["coalitions"]


def test_hk_strategy_drops_into_a_foreign_flower_app(tmp_path):
    """A numpy linear-regression app that is not ours swaps FedAvg for HKFedAvg in one line."""
    with local_superlink(tmp_path / "link") as link:
        done = link.flwr_run(ROOT / "tests" / "foreign_app", federation_config="num-supernodes=4")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Starting HKFedAvg strategy" in output and "HK cosine tau=0.5 -> K=2" in output
    final = output.split("FOREIGN-APP-FINAL", 1)[1].split("]", 1)[0].strip(" [")
    weights = [float(v) for v in final.split(",")]
    assert len(weights) == 3 and all(np.isfinite(weights))


@pytest.mark.parametrize("strategy", ["fedprox", "perfedavg-hf", "fixed-k-cosine"])
def test_baseline_strategies_run_end_to_end(tmp_path, strategy):
    folder, stdout = run_app(tmp_path, f'strategy="{strategy}" num-server-rounds=2 clients-per-round=3 '
                                       "local-epochs=1 synthetic-households=150 active-factor=0.5", supernodes=3)
    assert f"bouquet summary: {strategy}, 2 rounds, 3 clients" in stdout
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert [r["replies"] for r in rounds if r["phase"] == "train"] == [3, 3]
    if strategy.startswith("fixed-k"):
        assert all(r["coalitions"] == 2 for r in rounds if r["phase"] == "train")


def _rounds(folder):
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


def test_vision_sckm_cluster_with_hk_aggregation_on_digit_shards(tmp_path):
    """SCKM-Cluster chooses, HK cosine aggregates: one run-config change on the vision task."""
    folder, stdout = run_app(tmp_path, 'task="vision" selection="sckm-cluster" strategy="hk-cosine" '
                                       "num-server-rounds=2 clients-per-round=3 shards-per-client=1", supernodes=6)
    assert "sckm-cluster selected 3 of 6 candidates" in stdout and "HK cosine tau=0.75 -> K=" in stdout
    rounds = _rounds(folder)
    select = [r for r in rounds if r["phase"] == "select"]
    train = [r for r in rounds if r["phase"] == "train"]
    central = [r for r in rounds if r["phase"] == "central"]
    assert [r["round"] for r in select] == [1, 2] and all(r["candidates"] == 6 for r in select)
    assert all(r["query-failed"] == [] and 0 < r["sketch-over-model"] < 0.02 for r in select)
    assert all(sum(r["cluster-budgets"]) == 3 and 1 <= r["clusters"] <= 3 for r in select)
    for sel, tr in zip(select, train):
        assert tr["replies"] == 3 and tr["rejected"] == 0
    assert [r["round"] for r in central] == [0, 1, 2] and all(0 <= r["accuracy"] <= 1 for r in central)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["clusters-per-round"] == [r["clusters"] for r in select]
    assert summary["c-star"] == int(np.floor(np.mean(summary["clusters-per-round"])))
    assert len(summary["accuracy-per-round"]) == 3
    curve = summary["accuracy-per-round"]
    best = int(np.argmax(curve))
    assert (f"rounds: final test accuracy {100 * curve[-1]:.2f} % (best {100 * curve[best]:.2f} % at round {best})"
            in stdout)
    selection = pd.read_csv(folder / "selection.csv")
    assert len(selection) == 12 and selection.groupby("round")["selected"].sum().tolist() == [3, 3]
    coalitions = pd.read_csv(folder / "coalitions.csv")
    for r in (1, 2):  # HK aggregated exactly the nodes SCKM-Cluster selected
        chosen = set(selection[(selection["round"] == r) & selection["selected"]]["node_id"].astype("uint64"))
        assert set(coalitions[coalitions["round"] == r]["node_id"].astype("uint64")) == chosen


def test_vision_piggyback_selection_explores_then_reuses_sketches(tmp_path):
    folder, _stdout = run_app(tmp_path, 'task="vision" selection="sckm-select" selection-mode="piggyback" '
                                        'strategy="fedavg" num-server-rounds=3 clients-per-round=2', supernodes=4)
    select = [r for r in _rounds(folder) if r["phase"] == "select"]
    assert [r["explored"] for r in select[:2]] == [2, 2]  # 4 unseen nodes: two rounds of exploration
    assert select[2]["explored"] == 0 and len(select[2]["selected"]) == 2
    assert "query-seconds" not in select[2]  # no extra round trip


def test_sckm_selection_drops_into_a_foreign_torch_app(tmp_path):
    """A torch app that is not ours adopts SCKM-Select: one strategy line + one client registration."""
    with local_superlink(tmp_path / "link") as link:
        done = link.flwr_run(ROOT / "tests" / "foreign_sketch_app", federation_config="num-supernodes=4")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    lines = [line.split("FOREIGN-SKETCH-ROUND", 1)[1].split() for line in output.splitlines()
             if "FOREIGN-SKETCH-ROUND" in line]
    assert [int(parts[0]) for parts in lines] == [1, 2]
    assert all(int(parts[1]) == 2 and int(parts[2]) == 4 * 2 * 4 for parts in lines)  # 4 nodes x 2 layers x 4 B
    assert "FOREIGN-SKETCH-FINAL True" in output


def test_simulation_joins_an_existing_ray_cluster(tmp_path):
    """Scale-out on one machine: a Ray head started separately; the simulation connects to it as a driver."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from bouquet.launch import free_port

    port = free_port()
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    with open(tmp_path / "ray-head.log", "w") as log:  # the child keeps its own copy
        head = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                                 "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
                                 "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(ray_dir)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(ray_dir.glob("session_*/logs/raylet.out")):
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "ray-head.log").read_text()
            time.sleep(0.5)
        time.sleep(3)
        results = tmp_path / "results"
        with local_superlink(tmp_path / "link", env={"RAY_ADDRESS": f"127.0.0.1:{port}"}) as link:
            done = link.flwr_run(ROOT, run_config='strategy="fedavg" num-server-rounds=1 clients-per-round=2 '
                                                  "local-epochs=1 synthetic-households=150 active-factor=0.5 "
                                                  f'results-dir="{results}" run-name="ray"',
                                 federation_config="num-supernodes=2 client-resources-num-cpus=1")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "bouquet summary: fedavg, 1 rounds, 2 clients" in done.stdout
        # the simulation ran as a driver of OUR head: its driver and worker logs are in the head's session
        logs = [p.name for p in ray_dir.glob("session_*/logs/*")]
        assert any(name.startswith("python-core-driver-") for name in logs), sorted(logs)[:20]
        assert head.poll() is None  # the cluster outlives the run
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait()
        shutil.rmtree(ray_dir, ignore_errors=True)
