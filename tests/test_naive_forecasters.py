"""The naive forecasters of bouquet.forecasting.naive: hand cases, properties, and statsforecast's models as the
oracle (each fitted on every day before the forecast day, asked for one step)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bouquet.forecasting.naive import NAIVE_FORECASTERS, NaiveParams, blend_weight, naive_forecasts, weekday_history


def test_hand_case():
    y = np.arange(1.0, 22.0)  # days 0..20 hold 1..21
    f = naive_forecasts(y, [14, 21], NaiveParams(window=3, season_windows=2), blend=0.5)
    assert list(f) == list(NAIVE_FORECASTERS)
    np.testing.assert_allclose(f["last value"], [14, 21])
    np.testing.assert_allclose(f["seasonal naive"], [8, 15])
    np.testing.assert_allclose(f["window average"], [13, 20])  # days t-3..t-1
    np.testing.assert_allclose(f["window median"], [13, 20])
    np.testing.assert_allclose(f["seasonal window average"], [(8 + 1) / 2, (15 + 8) / 2])
    np.testing.assert_allclose(f["historic average"], [np.mean(y[:14]), np.mean(y)])
    np.testing.assert_allclose(f["weekday average"], [(1 + 8) / 2, (1 + 8 + 15) / 3])
    np.testing.assert_allclose(f["blend"], 0.5 * f["window median"] + 0.5 * f["weekday average"])


def test_missing_days_are_skipped_and_fall_back():
    y = np.array([10.0, np.nan, 30.0, np.nan, np.nan, np.nan, np.nan, 70.0, 80.0])
    f = naive_forecasts(y, [3, 7, 9], NaiveParams(window=2, season_windows=1))
    np.testing.assert_allclose(f["window average"], [30, 10, 75])  # t=7: no valid day in 5..6: the weekday average (day 0)
    # t=3: no earlier day of its weekday -> the historic average (20); t=7: day 0; t=9: day 2
    np.testing.assert_allclose(f["weekday average"], [20, 10, 30])
    np.testing.assert_allclose(f["historic average"], [20, 20, np.mean([10, 30, 70, 80])])
    assert f["last value"][1] == 10  # day 6 missing -> weekday average
    assert np.isfinite(f["seasonal naive"]).all()  # t=9: day 2 (30)
    assert f["seasonal naive"][2] == 30


def test_bad_input():
    with pytest.raises(ValueError, match="targets must index days 1 .. 5"):
        naive_forecasts(np.ones(5), [0])
    with pytest.raises(ValueError, match="one-dimensional"):
        naive_forecasts(np.ones((2, 3)), [1])
    with pytest.raises(ValueError, match="blend must be in"):
        naive_forecasts(np.ones(5), [3], blend=2)
    with pytest.raises(ValueError, match="window must be >= 1"):
        NaiveParams(window=0)
    with pytest.raises(ValueError, match="no validation day"):
        blend_weight(np.full(10, np.nan), [5, 6])


def test_blend_weight_picks_the_better_half():
    week = np.array([100.0, 100, 100, 100, 100, 300, 300])  # weekends high: the weekday average knows
    y = np.tile(week, 8)
    assert blend_weight(y, np.arange(35, 56)) == 1.0
    flat = np.concatenate([np.full(28, 100.0), np.full(28, 200.0)])  # a level shift: the window median follows
    assert blend_weight(flat, np.arange(42, 56)) == 0.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1000, allow_nan=False), min_size=30, max_size=60), st.floats(0.1, 10), st.floats(-50, 50))
def test_every_forecaster_commutes_with_an_increasing_affine_map(values, scale, offset):
    y = np.asarray(values)
    targets = np.arange(15, len(y) + 1)
    raw = naive_forecasts(y, targets, blend=0.5)
    mapped = naive_forecasts(y * scale + offset, targets, blend=0.5)
    for name in raw:
        np.testing.assert_allclose(mapped[name], raw[name] * scale + offset, rtol=1e-9, atol=1e-6)


def test_weekday_history_equals_the_loop():
    rng = np.random.default_rng(0)
    y = rng.normal(100, 20, 60)
    y[rng.random(60) < 0.2] = np.nan
    targets = np.arange(1, 61)
    historic, weekday = weekday_history(y, targets)
    for i, t in enumerate(targets):
        before = y[:t]
        same = y[t - 7::-7] if t >= 7 else np.array([])
        assert np.isclose(historic[i], np.nanmean(before), equal_nan=True) or not np.isfinite(before).any()
        if np.isfinite(same).any():
            assert weekday[i] == pytest.approx(np.nanmean(same))
        else:
            assert np.isnan(weekday[i])


statsforecast = pytest.importorskip("statsforecast", reason="the oracle is the forecasting extra: "
                                    "pip install 'bouquet-fl[forecasting]'")


@pytest.mark.parametrize("seed", [0, 1])
def test_equal_to_statsforecast(seed):
    """Each forecaster equals statsforecast's model of the same name fitted on ``y[:t]`` with h = 1, to 1e-9."""
    from statsforecast.models import HistoricAverage, Naive, SeasonalNaive, SeasonalWindowAverage, WindowAverage

    rng = np.random.default_rng(seed)
    y = 200 + 60 * np.sin(np.arange(90) * 2 * np.pi / 7) + rng.normal(0, 25, 90)
    params = NaiveParams(window=12, season_windows=4)
    targets = np.arange(40, 91)
    ours = naive_forecasts(y, targets, params)
    oracle = {"last value": lambda: Naive(), "seasonal naive": lambda: SeasonalNaive(7),
              "window average": lambda: WindowAverage(12), "seasonal window average": lambda: SeasonalWindowAverage(7, 4),
              "historic average": lambda: HistoricAverage()}
    for name, make in oracle.items():
        theirs = [make().forecast(y=y[:t], h=1)["mean"][0] for t in targets]
        np.testing.assert_allclose(ours[name], theirs, rtol=1e-9, atol=1e-9, err_msg=name)
    # the weekday average is the seasonal window average over every past week (when t is a multiple of 7, all
    # of them fit in y[:t])
    for t in (42, 49, 84):
        theirs = SeasonalWindowAverage(7, t // 7).forecast(y=y[:t], h=1)["mean"][0]
        assert naive_forecasts(y, [t], params)["weekday average"][0] == pytest.approx(theirs, rel=1e-9)
