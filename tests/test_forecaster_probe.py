"""The forecaster probe: local-only variants beside the naive forecasters, resumable, with clear errors."""

import pandas as pd
import pytest

from tests.script_loader import script


def test_probe_scores_each_variant_beside_the_naive_forecasters_and_resumes(tmp_path, capsys):
    probe = script("forecaster_probe")
    args = ["--data", "synthetic", "--households", "2", "--epochs", "1", "--out", str(tmp_path),
            "--variants", "paper,window-mean,window-median,improved"]
    assert probe.main(args) == 0
    frame = pd.read_csv(tmp_path / "synthetic-2" / "probe.csv")
    assert set(frame["variant"]) == {"paper", "window-mean", "window-median", "improved", "naive: last value",
                                     "naive: same day last week", "naive: window mean", "naive: window median",
                                     "naive: train-days mean", "naive: train-days weekday mean"}
    assert len(frame[frame["variant"] == "paper"]) == 2 and (frame["mae"] > 0).all()
    # an untrained-then-briefly-trained residual model stays near the window mean it starts from
    residual = frame[frame["variant"] == "window-mean"]["mae"].mean()
    window = frame[frame["variant"] == "naive: window mean"]["mae"].mean()
    assert abs(residual / window - 1) < 0.25
    # the improved preset (weekday inputs: a 3-channel LSTM) trains and stays near the window median
    improved = frame[frame["variant"] == "improved"]["mae"].mean()
    median = frame[frame["variant"] == "naive: window median"]["mae"].mean()
    assert abs(improved / median - 1) < 0.25
    table = capsys.readouterr().out
    assert "skill vs naive:" in table and "beats own best naive" in table
    assert probe.main(args) == 0  # resumable: the rows are read back, nothing is trained twice
    assert len(pd.read_csv(tmp_path / "synthetic-2" / "probe.csv")) == len(frame)
    assert probe.main([*args, "--pooled"]) == 0  # one model on both households' windows, scored on each
    pooled = pd.read_csv(tmp_path / "synthetic-2" / "probe.csv")
    assert len(pooled[pooled["variant"] == "improved (pooled)"]) == 2 and (pooled["mae"] > 0).all()
    with pytest.raises(SystemExit, match="unknown variant"):
        probe.main([*args, "--variants", "paper,median"])
