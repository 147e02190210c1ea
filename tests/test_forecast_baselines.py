"""bouquet.forecasting.baselines: the long frame's causal fill, statsforecast's and LightGBM's one-step forecasts
aligned with the days they forecast (the nodes' seasonal naive as the oracle), and clear errors."""

import numpy as np
import pandas as pd
import pytest

from bouquet.forecasting.baselines import LightGBMParams, lightgbm_forecasts, long_frame, require_extra, stats_forecasts
from bouquet.forecasting.naive import naive_forecasts

pytest.importorskip("statsforecast", reason="the forecasting extra: pip install 'bouquet-fl[forecasting]'")
FIRST = np.datetime64("2024-01-01")


def test_long_frame_fills_gaps_with_the_day_before_and_cuts():
    litres = np.array([np.nan, 10.0, np.nan, np.nan, 40.0, 50.0, np.nan])
    frame, actual = long_frame({"h": (FIRST, litres)}, {"h": 6})
    assert frame["ds"].iloc[0] == pd.Timestamp("2024-01-02")  # from the first valid day
    assert frame["y"].tolist() == [10.0, 10.0, 10.0, 40.0, 50.0]  # no day after the cut, no future value
    assert actual["y"].tolist() == [10.0, 40.0, 50.0]
    with pytest.raises(ValueError, match="no household has a valid day"):
        long_frame({"h": (FIRST, np.full(3, np.nan))})


def test_one_step_forecasts_are_aligned_with_their_days():
    rng = np.random.default_rng(0)
    litres = 200 + 60 * np.sin(np.arange(120) * 2 * np.pi / 7) + rng.normal(0, 10, 120)
    frame, _ = long_frame({"h": (FIRST, litres)})
    out = stats_forecasts(frame, 14, ["seasonal naive", "window average 7", "ETS"], refit=7)
    days = (out["ds"].to_numpy().astype("datetime64[D]") - FIRST).astype(int)
    assert days.tolist() == list(range(106, 120))
    ours = naive_forecasts(litres, days)
    np.testing.assert_allclose(out["seasonal naive"], ours["seasonal naive"], rtol=1e-9)
    np.testing.assert_allclose(out["window average 7"], [litres[t - 7:t].mean() for t in days], rtol=1e-9)
    assert np.abs(out["ETS"] - litres[days]).mean() < np.abs(out["seasonal naive"] - litres[days]).mean() * 1.5
    lgbm = lightgbm_forecasts(frame, 14, LightGBMParams(n_estimators=50), pooled=True)
    assert len(lgbm) == 14 and (lgbm["lightgbm"] >= 0).all()
    with pytest.raises(ValueError, match="unknown statsforecast baseline"):
        stats_forecasts(frame, 7, ["prophet"])
    with pytest.raises(ValueError, match="num_leaves"):
        LightGBMParams(num_leaves=1)


def test_a_missing_library_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlforecast", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r'mlforecast, part of the forecasting extra: pip install "bouquet-fl\[forecasting\]"'):
        require_extra("mlforecast")
