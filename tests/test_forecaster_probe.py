"""The forecaster probe: local-only variants beside the naive forecasters, resumable, with clear errors."""

import pandas as pd
import pytest

from bouquet.data.water import TestPeriodLocked
from bouquet.forecasting.naive import NAIVE_FORECASTERS
from bouquet.studies import forecaster_probe


def test_probe_scores_each_variant_beside_the_naive_forecasters_and_resumes(tmp_path, capsys):
    probe = forecaster_probe
    args = ["--data", "synthetic", "--households", "2", "--epochs", "1", "--out", str(tmp_path),
            "--variants", "paper,window-mean,window-median,improved"]
    assert probe.main(args) == 0
    frame = pd.read_csv(tmp_path / "synthetic-2" / "probe.csv")
    assert set(frame["variant"]) == {"paper", "window-mean", "window-median", "improved",
                                     *(f"naive: {name}" for name in NAIVE_FORECASTERS)}
    assert len(frame[frame["variant"] == "paper"]) == 2 and (frame["mae"] > 0).all()
    # an untrained-then-briefly-trained residual model stays near the window mean it starts from
    residual = frame[frame["variant"] == "window-mean"]["mae"].mean()
    window = frame[frame["variant"] == "naive: window average"]["mae"].mean()
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


def test_the_probe_cannot_score_the_test_period():
    """Every window the probe reads is the design period's: whatever a variant sets, the test period is locked,
    the windows hold no test day, and scoring them on test raises."""
    import torch

    from bouquet.data.water import load_pool
    from bouquet.tasks.water import LSTMForecaster, evaluate_windows, naive_errors

    probe = forecaster_probe
    for variant in ("paper", "improved"):
        config = probe.app_config("synthetic", None, {**probe.VARIANTS[variant], "score-test": True, "origin": 2})
        assert not config.water_data.score_test and config.water_data.origin == 0
        windows = load_pool(config.water_data).client(0, config.water_data)
        assert windows.test_locked and len(windows.y_test) == 0 and windows.has_validation
        last_seen = windows.first_day + len(windows.series) - 1
        assert last_seen <= windows.val_days[-1]  # no day after the design period reaches the probe
        model = LSTMForecaster.from_params(config.water_model, config.water_data.input_channels)
        torch.manual_seed(0)
        with pytest.raises(TestPeriodLocked, match="the test period is locked"):
            evaluate_windows(model, windows)
        with pytest.raises(TestPeriodLocked):
            naive_errors(windows, "test")
        assert evaluate_windows(model, windows, "validation")["mae-litres"] > 0
