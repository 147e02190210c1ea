"""The study runner under the honest protocol: a smoke study tunes on validation (no test number in the choice),
runs the chosen candidates on every seed and writes the paired table; resumable."""

import json

import pandas as pd
import pytest

from bouquet.studies import ROOT, run_forecaster_study

pytestmark = pytest.mark.e2e


@pytest.mark.tier2  # second tier: the study runner is first-tier in test_sckm_experiments.py; validation numbers in test_e2e_personal.py
def test_smoke_study_chooses_on_validation_and_reports_paired_intervals(tmp_path, capsys, ray_head):
    runner = run_forecaster_study
    args = ["--study", "hk-paper", "--data", "daiad", "--profile", "smoke", "--arms", "fedavg,fedprox",
            "--tune-seeds", "0", "--seeds", "0", "1", "--supernodes", "4", "--out", str(tmp_path),
            "--ray-address", ray_head.address]
    assert runner.main(args) == 0
    base = tmp_path / "daiad-smoke"
    choices = pd.read_csv(base / "choices.csv")
    assert not any("test" in column for column in choices.columns)  # the choice never sees a test number
    assert choices.groupby("arm")["chosen"].sum().to_dict() == {"fedavg": 1, "fedprox": 1}
    fedprox = choices[choices["arm"] == "fedprox"]
    assert len(fedprox) == 3 and fedprox.loc[fedprox["chosen"], "val-mae-mean"].iloc[0] == fedprox["val-mae-mean"].min()
    chosen = fedprox.loc[fedprox["chosen"], "candidate"].iloc[0]
    table = pd.read_csv(base / "table.csv").set_index("arm")
    assert table.loc["fedprox", "candidate"] == chosen and table.loc["fedprox", "seeds"] == 2
    assert "[" in table.loc["fedprox", "vs fedavg [95 % CI]"]
    assert (base / "table.png").stat().st_size > 5000
    runs = pd.read_csv(base / "runs.csv")
    mean = runs[runs["arm"] == "fedprox"]["test-mae"].mean()
    assert table.loc["fedprox", "test MAE"] == pytest.approx(mean)
    summary = json.loads(next(base.glob("fedprox/*/seed-1/summary.json")).read_text())
    assert summary["best-naive-chosen-on"] == "validation"
    assert runner.main(args) == 0  # resumable: nothing left to run
    out = capsys.readouterr().out
    assert out.count("4 runs, 4 already done") == 2  # the tuning runs, then the chosen candidates on both seeds


def test_unknown_study_or_arm_is_a_clear_error(tmp_path):
    runner = run_forecaster_study
    with pytest.raises(SystemExit, match="unknown study 'nope'"):
        runner.main(["--study", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown arm 'nope'"):
        runner.main(["--study", "hk-paper", "--data", "daiad", "--profile", "smoke", "--arms", "nope",
                     "--out", str(tmp_path)])


@pytest.mark.tier2  # second tier: the Flower side of each piece is first-tier (test_e2e_forecast.py, the runners)
def test_rolling_study_locks_the_test_blocks_until_final_and_scores_them_once(tmp_path, ray_head):
    """The rolling-origin protocol on a tiny study of its own (two arms, two candidates each, 4 households):
    tuning reads validation only; --final scores every origin, logs it, and writes the household tables."""
    import shutil


    study = tmp_path / "study"
    for kind in ("data", "profiles"):
        shutil.copytree(ROOT / "experiments" / "forecaster" / kind, study / kind)
    (study / "arms").mkdir()
    (study / "arms" / "fedavg.toml").write_text('strategy = "fedavg"\nlocal-epochs = 1\n[grid]\n'
                                                "num-server-rounds = [1, 2]\n")
    (study / "arms" / "local.toml").write_text('strategy = "local"\nnum-server-rounds = 1\n[grid]\n'
                                               "local-epochs = [1, 2]\n")
    (study / "arms" / "trees.toml").write_text('forecast-model = "trees"\ntree-max-depth = 2\ntree-max-bins = 15\n'
                                               'tree-min-child-samples = 5\n[grid]\ntree-count = [2, 4]\n')
    runner = run_forecaster_study
    args = ["--study", str(study), "--data", "synthetic", "--profile", "smoke", "--tune-seeds", "0",
            "--supernodes", "4", "--out", str(tmp_path / "out"), "--ray-address", ray_head.address, "--refit", "7"]
    assert runner.main(args) == 0
    out = tmp_path / "out" / "synthetic-smoke"
    choices = pd.read_csv(out / "choices.csv")
    assert not any("test" in column for column in choices.columns)
    assert {"fedavg", "local", "trees", "trees pooled", "ETS", "LightGBM pooled", "LSTM pooled",
            "window average"} <= set(choices["arm"])
    assert choices.groupby("arm")["chosen"].sum().eq(1).all()
    # the trees are tuned in process (no Flower run), and the pooled trees follow the trees arm's choice
    assert not (out / "tuning" / "trees").exists()
    picked = choices[choices["chosen"]].set_index("arm")["candidate"]
    assert picked["trees pooled"] == "trees pooled" + picked["trees"][len("trees"):]
    # each Flower arm's serving rule, by nested validation on the same days
    rules = json.loads((out / "fallback.json").read_text())
    assert set(rules["rules"]) == {"fedavg", "local", "trees", "LSTM pooled"}
    assert all(set(scores) == {"none", "select", "combine", "pooled"} for scores in rules["second-half-mae"].values())
    for summary in (out / "tuning").rglob("summary.json"):  # the tuning runs never saw a test day
        assert json.loads(summary.read_text())["test-period-scored"] is False
    assert not (out / "test-log.jsonl").exists() and not (out / "table.csv").exists()
    assert runner.main([*args, "--seeds", "0", "1", "--final"]) == 0
    log = [json.loads(line) for line in (out / "test-log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and len(log[0]["commit"]) == 40 and log[0]["origins"] == 3
    assert log[0]["fallback"] == rules["rules"]
    for arm, rule in rules["rules"].items():  # the final runs serve with their arm's rule
        for config in (out / "final" / arm).rglob("config.json"):
            assert json.loads(config.read_text())["fallback"] == rule
    households = pd.read_csv(out / "households.csv")
    assert set(households["origin"]) == {0, 1, 2} and {"mae", "rmse", "mase"} <= set(households.columns)
    assert households["household"].str.startswith(("d0:", "d1:")).all()  # the synthetic pool anew per seed
    table = pd.read_csv(out / "table.csv").set_index("forecaster")
    assert {"fedavg", "fedavg (model)", "local", "trees", "trees (model)", "trees pooled",
            "best baseline per household", "ETS", "LightGBM pooled", "LightGBM local", "LSTM pooled",
            "naive: blend"} <= set(table.index)
    mean = households[households["forecaster"] == "fedavg"]["mae"].mean()  # over the household-origin units
    assert table.loc["fedavg", "MAE"] == pytest.approx(mean)
    own = households[households["forecaster"] == "best baseline per household"]["mae"].mean()
    assert table.loc["fedavg", "vs own best baseline"].startswith(f"{100 * (1 - mean / own):+.1f} %")
    served = pd.read_csv(out / "served.csv")
    assert set(served["arm"]) == {"fedavg", "trees", "local"} and served[["model", "combined", "baseline"]].sum().sum()
    assert "[" in table.loc["fedavg", "vs own best baseline"] and "[" in table.loc["fedavg", "vs pooled LightGBM"]
    assert (out / "table.png").stat().st_size > 5000 and (out / "forecasts.csv.gz").exists()
    assert runner.main([*args, "--seeds", "0", "1", "--final"]) == 0  # resumable; the second scoring is logged
    assert len((out / "test-log.jsonl").read_text().splitlines()) == 2
