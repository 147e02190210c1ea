"""The tree forecasters' inputs (bouquet.forecasting.features): hand cases, causality, missing days, holidays."""

import numpy as np
import pytest

from bouquet.forecasting.features import FEATURE_NAMES, LAGS, FeatureParams, daily_features, holiday_days
from bouquet.params import ParamError

FIRST = np.datetime64("2016-11-01")  # a Tuesday


def column(name):
    return FEATURE_NAMES.index(name)


def test_inputs_by_hand():
    """A series 100, 110, ..., over 40 days: day t's level is the mean of the 28 days before it, and each input is
    its value over that level."""
    series = 100.0 + 10 * np.arange(40)
    f = daily_features(series, FIRST, np.array([30, 40]), FeatureParams(holidays="none"))
    level = series[2:30].mean()
    assert f.level[0] == pytest.approx(level)
    assert f.x[0, column("lag-1")] == pytest.approx(series[29] / level)
    assert f.x[0, column("lag-28")] == pytest.approx(series[2] / level)
    assert f.x[0, column("mean-7")] == pytest.approx(series[23:30].mean() / level)
    assert f.x[0, column("median-14")] == pytest.approx(np.median(series[16:30]) / level)
    assert f.x[0, column("min-7")] == pytest.approx(series[23] / level)
    assert f.x[0, column("max-7")] == pytest.approx(series[29] / level)
    assert f.x[0, column("std-28")] == pytest.approx(np.std(series[2:30], ddof=1) / level)
    assert f.x[0, column("expanding-mean")] == pytest.approx(series[:30].mean() / level)
    assert f.x[0, column("weekday-mean")] == pytest.approx(series[[2, 9, 16, 23]].mean() / level)  # Thursdays before
    assert f.x[0, column("weekday")] == 3 and f.x[0, column("day-of-month")] == 1  # 1 December 2016, a Thursday
    assert f.x[0, column("log-level")] == pytest.approx(np.log(level))
    assert f.x[1, column("lag-1")] == pytest.approx(series[39] / f.level[1])  # t = len(series): tomorrow
    assert f.scaled(np.array([level]))[0] == pytest.approx(1.0)
    np.testing.assert_allclose(f.litres(np.array([1.0, -2.0])), [level, 0.0])


def test_a_day_reads_only_the_days_before_it():
    rng = np.random.default_rng(0)
    series = rng.gamma(5, 40, size=120)
    series[rng.random(120) < 0.1] = np.nan
    targets = np.arange(1, 100)
    before = daily_features(series, FIRST, targets)
    changed = series.copy()
    changed[60:] = 5000.0
    after = daily_features(changed, FIRST, targets)
    early = targets <= 60
    np.testing.assert_array_equal(np.isnan(before.x[early]), np.isnan(after.x[early]))
    np.testing.assert_allclose(before.x[early], after.x[early], equal_nan=True)
    assert not np.allclose(before.x[~early], after.x[~early], equal_nan=True)


def test_missing_days_are_missing_inputs_and_the_level_falls_back():
    series = np.full(60, 200.0)
    series[45:59] = np.nan  # 14 missing days before day 59
    f = daily_features(series, FIRST, np.array([59]), FeatureParams(holidays="none"))
    assert np.isnan(f.x[0, column("lag-1")]) and f.x[0, column("lag-21")] == pytest.approx(1.0)
    assert f.x[0, column("valid-28")] == pytest.approx(14 / 28)
    assert np.isnan(f.x[0, column("mean-7")]) and np.isnan(f.x[0, column("min-7")])
    sparse = np.full(60, np.nan)
    sparse[[0, 1, 2]] = [30.0, 60.0, 90.0]  # 3 valid days: fewer than 7 in the 28 before: the expanding mean
    g = daily_features(sparse, FIRST, np.array([20]), FeatureParams(holidays="none", level_floor=1.0))
    assert g.level[0] == pytest.approx(60.0)
    empty = daily_features(np.full(10, np.nan), FIRST, np.array([5]), FeatureParams(holidays="none"))
    assert np.isnan(empty.level[0])
    vacant = daily_features(np.zeros(40), FIRST, np.array([35]), FeatureParams(holidays="none", level_floor=10.0))
    assert vacant.level[0] == 10.0  # an empty house: the floor, not a division by 0
    assert len(LAGS) + 8 + 2 + 8 == len(FEATURE_NAMES) == f.x.shape[1]


def test_holidays_of_the_valencian_community():
    days = np.array(["2016-12-08", "2016-12-09", "2017-01-06", "2016-10-09"], dtype="datetime64[D]")
    np.testing.assert_array_equal(holiday_days("ES-VC", days), [True, False, True, False])
    np.testing.assert_array_equal(holiday_days("none", days), [False] * 4)
    # 7, 8 and 9 December 2016; the 6th and the 8th are holidays
    f = daily_features(np.full(60, 100.0), np.datetime64("2016-11-01"), np.array([36, 37, 38]))
    assert list(f.x[:, column("holiday")]) == [0, 1, 0]
    assert list(f.x[:, column("holiday-before")]) == [1, 0, 1]
    assert list(f.x[:, column("holiday-after")]) == [1, 0, 0]
    christmas = daily_features(np.full(80, 100.0), np.datetime64("2016-11-01"), np.array([52, 53, 70]))
    assert list(christmas.x[:, column("christmas")]) == [0, 1, 0]  # 23 Dec, 24 Dec, 10 Jan


@pytest.mark.parametrize("changes,field", [({"level_days": 6}, "level_days"), ({"level_days": 29}, "level_days"),
                                           ({"level_floor": 0.0}, "level_floor"), ({"holidays": "spain"}, "holidays"),
                                           ({"holidays": "XX"}, "holidays"), ({"holidays": "ES-ZZ"}, "holidays"),
                                           ({"holidays": " ES"}, "holidays")])
def test_bad_feature_params_name_their_field(changes, field):
    with pytest.raises(ParamError) as error:
        FeatureParams(**changes)
    assert error.value.field == field


def test_bad_series_and_targets_are_refused():
    with pytest.raises(ValueError, match="one-dimensional"):
        daily_features(np.zeros((3, 2)), FIRST, np.array([1]))
    with pytest.raises(ValueError, match="1 .. 5"):
        daily_features(np.zeros(5), FIRST, np.array([0]))
    with pytest.raises(ValueError, match="1 .. 5"):
        daily_features(np.zeros(5), FIRST, np.array([6]))
