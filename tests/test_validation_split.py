"""The honest protocol's data side: the validation split, the household blend baseline, naive forecasters on
validation, and the summary's choice of the best naive forecaster on validation (hand-computed cases)."""

import numpy as np
import pytest
import torch

from bouquet.data.water import (
    HouseholdDaily,
    InsufficientDataError,
    WaterDataParams,
    make_windows,
    select_pool,
    validation_windows,
)
from bouquet.tasks.water import (
    LSTMForecaster,
    choose_blend,
    evaluate_windows,
    household_blend,
    naive_errors,
    naive_litres,
)

MONDAY = np.datetime64("2026-12-07")


def _household(days=60, seed=0, hid="h"):
    rng = np.random.default_rng(seed)
    return HouseholdDaily(hid, MONDAY, 200 + 50 * rng.random(days))


@pytest.mark.parametrize("n_train, fraction, expected", [(40, 0.0, 0), (40, 0.15, 6), (40, 0.5, 20), (8, 0.01, 1),
                                                         (7, 0.15, 1), (13, 0.25, 3)])
def test_validation_windows_by_hand(n_train, fraction, expected):
    assert validation_windows(n_train, fraction) == expected


def test_the_validation_windows_are_the_last_training_windows_and_the_test_windows_do_not_move():
    household = _household()
    plain = make_windows(household, lookback=7)
    split = make_windows(household, lookback=7, validation_fraction=0.25)
    # 53 windows: 42 train (floor 0.8 x 53) and 11 test, as without a split; of the 42, the last 10 validate
    assert (len(plain.y_train), len(plain.y_test)) == (42, 11)
    assert (len(split.y_train), len(split.y_val), len(split.y_test)) == (32, 10, 11)
    np.testing.assert_array_equal(split.test_days, plain.test_days)
    np.testing.assert_array_equal(split.train_days, plain.train_days[:32])
    np.testing.assert_array_equal(split.val_days, plain.train_days[32:])
    assert split.has_validation and not plain.has_validation
    # the scaler saw the fit days only: days 0 .. the last fit target (7 + 31)
    fit = household.litres[: 7 + 32]
    assert split.offset == pytest.approx(fit.min()) and split.scale == pytest.approx(fit.max() - fit.min())
    np.testing.assert_allclose(split.to_litres(split.y_test), household.litres[7 + 42:], rtol=1e-6)
    np.testing.assert_allclose(split.to_litres(split.y_val), household.litres[7 + 32: 7 + 42], rtol=1e-6)


def test_the_profile_inputs_know_only_the_days_before_each_target():
    weekly = np.tile([100.0, 100.0, 100.0, 100.0, 100.0, 300.0, 300.0], 8)
    weekly[40:] += 1000.0  # the later days use far more: a window before day 40 must not know it
    household = HouseholdDaily("h", MONDAY, weekly)
    split = make_windows(household, lookback=7, household_inputs="profile", validation_fraction=0.3)
    for x, day in zip(np.concatenate([split.x_train, split.x_val, split.x_test]),
                      np.concatenate([split.train_days, split.val_days, split.test_days])):
        t = int((day - MONDAY).astype(int))
        before = split.series[:t]
        assert x[0, 1] == pytest.approx(np.mean(before), rel=1e-5)  # the level: every day before the target
        same = before[t - 7::-7]
        assert x[-1, 2] == pytest.approx(np.mean(same), rel=1e-5)  # the target's weekday: its earlier days


def test_a_validation_split_that_leaves_no_fit_window_is_an_error_naming_the_key():
    household = _household(days=9)  # 2 windows of 7 + 1 days: 1 train, 1 test
    with pytest.raises(InsufficientDataError, match="validation-fraction 0.5 holds out 1 of its 1"):
        make_windows(household, lookback=7, min_windows=2, validation_fraction=0.5)
    with pytest.raises(ValueError, match="validation-fraction must be in"):
        WaterDataParams(validation_fraction=0.6)
    config = WaterDataParams(lookback=7, min_windows=2, active_factor=0.0, min_history_days=0,
                             validation_fraction=0.5)
    tiny = HouseholdDaily("tiny", MONDAY, np.full(10, 100.0))  # 3 windows: 2 train -> 1 validates, 1 fits
    pool = select_pool([_household(hid="a"), tiny], config)
    row = pool.report.set_index("household").loc["tiny"]
    assert (row["train_windows"], row["validation_windows"], row["test_windows"]) == (1, 1, 1)
    one = HouseholdDaily("one", MONDAY, np.full(9, 100.0))  # 2 windows: 1 train, which validation would take
    with pytest.raises(InsufficientDataError, match="run-config 'validation-fraction' = 0.5 leaves 1 household"):
        select_pool([_household(hid="a"), one], config)


def test_the_pool_report_names_and_counts_households_left_out():
    config = WaterDataParams(lookback=7, min_windows=10, active_factor=0.0, min_history_days=0,
                             validation_fraction=0.2)
    short = HouseholdDaily("short", MONDAY, np.full(15, 100.0))  # 8 windows < 10
    pool = select_pool([_household(hid="a"), short], config)
    report = pool.report.set_index("household")
    assert report.loc["short", "status"].startswith("too few windows (8 complete windows")
    assert pd_isna(report.loc["short", "partition_id"])
    assert report.loc["a", "validation_windows"] == 8 and report.loc["a", "train_windows"] == 34


def pd_isna(value):
    import pandas as pd

    return bool(pd.isna(value))


def test_choose_blend_by_hand():
    median = np.array([10.0, 10.0, 10.0])
    weekday = np.array([20.0, 20.0, 20.0])
    assert choose_blend(median, weekday, [10.0, 11.0, 9.0]) == 0.0
    assert choose_blend(median, weekday, [20.0, 19.0, 21.0]) == 1.0
    assert choose_blend(median, weekday, [15.0, 15.0, 15.0]) == 0.5
    assert choose_blend(median, median, [1.0, 2.0, 3.0]) == 0.0  # equal errors: the first (the window median)
    with pytest.raises(ValueError, match="as many forecasts as targets"):
        choose_blend(median, weekday, [1.0])


def _profile_windows(validation_fraction=0.25):
    weekly = np.tile([100.0, 100.0, 100.0, 100.0, 100.0, 300.0, 300.0], 10)
    weekly += np.random.default_rng(3).normal(0, 5, len(weekly))
    return make_windows(HouseholdDaily("h", MONDAY, weekly), lookback=7, household_inputs="profile",
                        validation_fraction=validation_fraction)


def test_the_household_baseline_untrained_is_the_naive_blend_and_the_blend_never_travels():
    windows = _profile_windows()
    blend = household_blend(windows.x_val, windows.y_val)
    assert blend == 1.0  # a weekly household: its weekday mean beats its window median on validation
    model = LSTMForecaster(8, 1, "household", input_size=3)
    model.blend = blend
    assert "blend" not in str(list(model.state_dict()))  # not a weight: no aggregation averages it
    naive = naive_errors(windows)
    assert naive["blend"] == pytest.approx(naive["weekday average"])
    assert evaluate_windows(model, windows)["mae-litres"] == pytest.approx(naive["blend"], rel=1e-5)
    assert naive_errors(windows, "validation")["blend"] <= naive_errors(windows, "validation")[
        "window median"]
    model.blend = 0.0
    assert evaluate_windows(model, windows)["mae-litres"] == pytest.approx(naive["window median"], rel=1e-5)


def test_naive_forecasts_on_validation_and_the_blend_only_with_a_split():
    windows = _profile_windows()
    val = naive_litres(windows, "validation")
    assert set(val) >= {"window median", "weekday average", "blend"}
    assert len(val["window median"]) == len(windows.y_val)
    assert "blend" not in naive_litres(_profile_windows(0.0))
    with pytest.raises(ValueError, match="no validation split"):
        naive_litres(_profile_windows(0.0), "validation")
    with pytest.raises(ValueError, match="part must be"):
        naive_errors(windows, "train")


def test_the_summary_chooses_the_best_naive_forecaster_on_validation():
    from bouquet.serving.water import naive_summary, naive_text

    rows = [  # two households; test and validation MAEs of two naive forecasters
        {"mae-litres": 9.0, "naive-window-median": 10.0, "naive-historic-average": 8.0,
         "naive-val-window-median": 5.0, "naive-val-historic-average": 7.0, "served": "model"},
        {"mae-litres": 9.0, "naive-window-median": 12.0, "naive-historic-average": 10.0,
         "naive-val-window-median": 6.0, "naive-val-historic-average": 5.0, "served": "combined"},
    ]
    s = naive_summary(rows)
    # on validation the window median wins the pool (5.5 against 6.0), on test the historic average would (9 < 11)
    assert s["naive-val-mae-litres"] == {"window median": 5.5, "historic average": 6.0}
    assert s["best-naive"] == "window median" and s["best-naive-chosen-on"] == "validation"
    assert s["best-naive-mae-litres"] == 11.0  # its test MAE, though the historic average is better on test (9.0)
    assert s["skill-vs-best-naive"] == pytest.approx(1 - 9.0 / 11.0)
    # own best on validation: household 1 the window median (test 10 > 9: beaten), household 2 the historic
    # average (test 10 > 9: beaten); on test, household 1's best is 8 (not beaten)
    assert s["households-beating-own-best-naive"] == 1.0
    assert s["households-beating-own-best-naive-on-test"] == 0.5
    assert s["served"] == {"model": 1, "combined": 1, "baseline": 0}
    assert naive_text(s) == (" (window median: 11.00 L/day, the best naive forecast on validation; skill +18.2 %; "
                              "100 % of households beat their own best naive forecast on the test days; served: 1 "
                              "model, 1 combined, 0 baseline)")
    plain = naive_summary([{k: v for k, v in r.items() if "-val-" not in k and k != "served"} for r in rows])
    assert plain["best-naive"] == "historic average" and plain["best-naive-chosen-on"] == "test"
    assert plain["households-beating-own-best-naive"] == 0.5
    assert "served" not in plain
    assert naive_summary([{"mae-litres": 1.0, "naive-val-window-median": 2.0}]) == {}  # locked: no test days


def test_lstm_weekday_baseline_reads_the_last_channel():
    model = LSTMForecaster(4, 1, "weekday-mean", input_size=3)
    x = torch.zeros(2, 5, 3)
    x[:, -1, -1] = torch.tensor([0.25, 0.75])
    np.testing.assert_allclose(model(x).detach().numpy(), [0.25, 0.75])  # the zero head adds nothing yet
