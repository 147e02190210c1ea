"""The study runner under the honest protocol: a smoke study tunes on validation (no test number in the choice),
runs the chosen candidates on every seed and writes the paired table; resumable."""

import json

import pandas as pd
import pytest

from tests.script_loader import script

pytestmark = pytest.mark.e2e


@pytest.mark.tier2  # second tier: the study runner is first-tier in test_sckm_experiments.py; validation numbers in test_e2e_personal.py
def test_smoke_study_chooses_on_validation_and_reports_paired_intervals(tmp_path, capsys, ray_head):
    runner = script("run_forecaster_study")
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
    runner = script("run_forecaster_study")
    with pytest.raises(SystemExit, match="unknown study 'nope'"):
        runner.main(["--study", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown arm 'nope'"):
        runner.main(["--study", "hk-paper", "--data", "daiad", "--profile", "smoke", "--arms", "nope",
                     "--out", str(tmp_path)])
