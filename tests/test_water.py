"""Water preprocessing: window/target alignment, no leakage, split sizes, filters, cache."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from bouquet.data.synthetic import SyntheticParams
from bouquet.data.water import (
    HouseholdDaily,
    InsufficientDataError,
    WaterDataParams,
    WaterPool,
    fit_scaler,
    global_scaler,
    load_pool,
    make_windows,
    select_pool,
)


def household(values, hid="h"):
    return HouseholdDaily(hid, np.datetime64("2016-01-01"), np.asarray(values, dtype=float))


def test_windows_align_inputs_and_next_day_target():
    series = np.arange(20, dtype=float)  # day k has value k
    w = make_windows(household(series), lookback=3, train_fraction=0.8, scaler="minmax", min_windows=2)
    # 17 windows (targets days 3..19): 13 train, 4 test
    assert len(w.y_train) == 13 and len(w.y_test) == 4
    x_litres = w.to_litres(w.x_train[..., 0])
    y_litres = w.to_litres(w.y_train)
    np.testing.assert_allclose(x_litres[0], [0, 1, 2], atol=1e-5)
    np.testing.assert_allclose(y_litres[0], 3, atol=1e-5)
    np.testing.assert_allclose(w.to_litres(w.x_test[-1, :, 0]), [16, 17, 18], atol=1e-5)
    np.testing.assert_allclose(w.to_litres(w.y_test), [16, 17, 18, 19], atol=1e-5)
    assert w.test_days[0] == np.datetime64("2016-01-17")


def test_scaler_sees_no_test_target():
    base = np.arange(20, dtype=float)
    spiked = base.copy()
    spiked[-1] = 1e6  # a test target
    a = make_windows(household(base), lookback=3)
    b = make_windows(household(spiked), lookback=3)
    assert (a.offset, a.scale) == (b.offset, b.scale)
    # minmax fitted on days 0..15 (up to the last training target)
    assert a.offset == 0.0 and a.scale == 15.0
    np.testing.assert_array_equal(a.x_train, b.x_train)


def test_zscore_scaler():
    w = make_windows(household(np.arange(20.0)), lookback=3, scaler="zscore")
    fit = np.arange(16.0)
    assert w.offset == pytest.approx(fit.mean()) and w.scale == pytest.approx(fit.std())


def test_windows_skip_gaps():
    series = np.arange(30, dtype=float)
    series[10] = np.nan
    w = make_windows(household(series), lookback=3, train_fraction=0.5)
    targets = np.concatenate([w.to_litres(w.y_train), w.to_litres(w.y_test)])
    # no window may use day 10 as input or target
    assert not np.any((targets >= 10) & (targets <= 13))
    assert len(targets) == (10 - 3) + (30 - 14)


def test_too_few_windows_names_household_and_minimum():
    with pytest.raises(InsufficientDataError, match=r"household tiny: 2 complete windows from 14 valid days; "
                                                    r"needs at least 10 windows of 12 \+ 1"):
        make_windows(household(np.ones(14), "tiny"), lookback=12, min_windows=10)


def test_split_sizes_follow_fraction():
    w = make_windows(household(np.random.default_rng(0).random(112)), lookback=12, train_fraction=0.8)
    assert (len(w.y_train), len(w.y_test)) == (80, 20)
    assert w.x_train.shape == (80, 12, 1) and w.x_train.dtype == np.float32


def test_pool_filters_active_history_and_windows():
    rng = np.random.default_rng(1)
    homes = [household(rng.uniform(90, 110, 800), f"low{i}") for i in range(8)]
    homes.append(household(rng.uniform(900, 1100, 800), "big"))
    homes.append(household(rng.uniform(900, 1100, 400), "bigshort"))
    gappy = rng.uniform(900, 1100, 800)
    gappy[::10] = np.nan  # never 13 consecutive valid days
    homes.append(household(gappy, "biggappy"))
    pool = select_pool(homes, WaterDataParams(min_history_days=730))
    assert [h.household_id for h in pool.households] == ["big"]
    status = dict(zip(pool.report["household"], pool.report["status"]))
    assert status["big"] == "pool"
    assert status["bigshort"].startswith("short history (400 < 730 days)")
    assert status["biggappy"].startswith("too few windows (0 complete windows")
    assert status["low0"].startswith("inactive")
    assert pool.report.set_index("household").loc["big", "partition_id"] == 0


def test_empty_pool_explains_filters():
    homes = [household(np.full(100, 100.0), "a"), household(np.full(100, 100.0), "b")]
    with pytest.raises(InsufficientDataError, match="no household passes the filters.*min-history-days"):
        select_pool(homes, WaterDataParams(min_history_days=730))


def test_partition_out_of_range_is_clear():
    config = WaterDataParams(synthetic=SyntheticParams(n_households=60), active_factor=0.0)
    pool = load_pool(config)
    with pytest.raises(IndexError, match=f"partition-id 999 is outside the pool of {len(pool)} households"):
        pool.client(999, config)


def test_cache_roundtrip_gives_the_same_pool(tmp_path):
    from bouquet.data import water

    config = WaterDataParams(synthetic=SyntheticParams(n_households=40, seed=3), active_factor=0.5)
    built = load_pool(config, cache_dir=tmp_path)
    water.forget_pools()
    loaded = load_pool(config, cache_dir=tmp_path)
    assert [h.household_id for h in built.households] == [h.household_id for h in loaded.households]
    for a, b in zip(built.households, loaded.households):
        np.testing.assert_array_equal(a.litres, b.litres)
        assert a.first_day == b.first_day
    assert list(built.report["status"]) == list(loaded.report["status"])


@pytest.mark.parametrize("kwargs, message", [
    ({"source": "parquet"}, "data source must be one of"),
    ({"split": "random"}, "split must be one of"),
    ({"split": "origins", "origin": 3}, "origin must be in 0 .. origins - 1 = 2"),
    ({"origin_days": 0}, "origin-days must be >= 1"),
    ({"csv_values": "cumulative"}, "csv-values must be one of"),
    ({"scaler": "quantile"}, "scaler must be one of"),
    ({"train_fraction": 1.0}, "train_fraction"),
    ({"min_windows": 1}, "min_windows"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WaterDataParams(**kwargs)


def test_a_daiad_source_needs_its_file_when_the_pool_is_loaded_not_before():
    # deployment: the run config names no file, each node its own (bouquet.tasks.water.node_windows)
    config = WaterDataParams(source="daiad")
    with pytest.raises(ValueError, match="needs a data path"):
        load_pool(config)


def test_the_node_naive_forecasters_read_the_household_series_through_the_scaler():
    """Each naive forecaster of a node's windows is bouquet.forecasting.naive's on the household's litres: every
    valid day before the forecast day, not the look-back window alone."""
    from bouquet.data.water import HouseholdDaily, make_windows
    from bouquet.forecasting.naive import NaiveParams, naive_forecasts
    from bouquet.tasks.water import naive_errors, naive_litres

    litres = np.random.default_rng(0).uniform(50, 400, 120)
    litres[[30, 31, 70]] = np.nan
    windows = make_windows(HouseholdDaily("h", np.datetime64("2024-01-01"), litres), lookback=12)
    days = (windows.test_days - np.datetime64("2024-01-01")).astype(np.int64)
    expected = naive_forecasts(litres, days, NaiveParams(window=12))
    node = naive_litres(windows)
    assert list(node) == list(expected)  # no blend without a validation split
    for name in expected:
        np.testing.assert_allclose(node[name], expected[name], rtol=1e-9, err_msg=name)
    actual = litres[days]
    assert naive_errors(windows)["weekday average"] == pytest.approx(np.mean(np.abs(expected["weekday average"] -
                                                                                   actual)))


def test_the_summary_puts_the_naive_forecasters_beside_the_model():
    from bouquet.serving.water import naive_summary, naive_text

    rows = [{"mae-litres": 10.0, "naive-last-value": 12.0, "naive-window-average": 8.0},
            {"mae-litres": 20.0, "naive-last-value": 30.0, "naive-window-average": 25.0}]
    summary = naive_summary(rows)
    assert summary["naive-mae-litres"] == {"last value": 21.0, "window average": 16.5}
    assert summary["best-naive"] == "window average" and summary["best-naive-mae-litres"] == 16.5
    assert summary["skill-vs-best-naive"] == pytest.approx(1 - 15.0 / 16.5)
    assert summary["households-beating-own-best-naive"] == 0.5  # 10 > 8, 20 < 25
    assert naive_text(summary).startswith(" (window average: 16.50 L/day, the best naive forecast; skill +9.1 %")
    assert naive_summary([{"mae-litres": 1.0}]) == {} and naive_text({}) == ""


def test_window_mean_baseline_starts_as_the_naive_forecaster_and_learns_the_rest():
    import torch

    from bouquet.config import AppConfig, ConfigError
    from bouquet.tasks.water import LSTMForecaster, predict

    x = np.random.default_rng(0).uniform(0, 1, size=(5, 12, 1)).astype(np.float32)
    window_mean = x[:, :, 0].mean(axis=1)
    torch.manual_seed(3)
    paper = LSTMForecaster(8, 1)
    torch.manual_seed(3)
    residual = LSTMForecaster(8, 1, baseline="window-mean")
    for name, value in paper.state_dict().items():  # the same draws: only the output layer is zeroed
        if not name.startswith("head."):
            assert torch.equal(value, residual.state_dict()[name])
    np.testing.assert_allclose(predict(residual, x), window_mean, rtol=1e-6)
    with torch.no_grad():
        residual.head.bias.fill_(0.25)  # whatever the network adds, on top of the window mean
    np.testing.assert_allclose(predict(residual, x), window_mean + 0.25, rtol=1e-6)
    assert list(paper.state_dict()) == list(residual.state_dict())  # the same arrays travel
    assert AppConfig.from_run_config({"forecast-baseline": "window-mean"}).water_model.baseline == "window-mean"
    with pytest.raises(ConfigError, match="forecast-baseline"):
        AppConfig.from_run_config({"forecast-baseline": "median"})


def test_window_median_baseline_starts_as_the_naive_window_median_over_calendar_inputs():
    import torch

    from bouquet.tasks.water import LSTMForecaster, predict

    use = np.array([[1.0, 5.0, 2.0, 8.0], [0.0, 0.0, 3.0, 1.0]])  # even look-back: the two middle values' mean
    calendar = np.zeros((2, 4, 2))
    x = np.concatenate([use[..., None], calendar], axis=-1).astype(np.float32)
    assert np.median(use, axis=1).tolist() == [3.5, 0.5]
    model = LSTMForecaster(8, 1, baseline="window-median", input_size=3)
    np.testing.assert_allclose(predict(model, x), [3.5, 0.5], rtol=1e-6)
    assert model.lstm.input_size == 3
    with pytest.raises(ValueError, match="input_size"):
        LSTMForecaster(8, 1, input_size=0)
    assert torch.is_tensor(model(torch.from_numpy(x)))


def test_training_losses_by_hand():
    import torch

    from bouquet.tasks.params import WaterTrainParams
    from bouquet.tasks.water import training_loss

    predicted, target = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.05, -0.3, 1.0])
    assert float(training_loss(WaterTrainParams())(predicted, target)) == pytest.approx((0.0025 + 0.09 + 1) / 3)
    assert float(training_loss(WaterTrainParams(loss="l1"))(predicted, target)) == pytest.approx(1.35 / 3)
    # Huber, delta 0.1: 0.5 e^2 inside, delta (|e| - delta / 2) outside
    huber = (0.5 * 0.0025 + 0.1 * (0.3 - 0.05) + 0.1 * (1.0 - 0.05)) / 3
    assert float(training_loss(WaterTrainParams(loss="huber"))(predicted, target)) == pytest.approx(huber)
    with pytest.raises(ValueError, match="forecast-loss"):
        WaterTrainParams(loss="mape")
    with pytest.raises(ValueError, match="forecast-huber-delta"):
        WaterTrainParams(loss="huber", huber_delta=0)


def test_weekday_inputs_and_robust_scaling_by_hand():
    from bouquet.data.water import HouseholdDaily, make_windows, weekday_inputs

    monday, thursday = np.datetime64("2026-12-07"), np.datetime64("1970-01-01")
    np.testing.assert_allclose(weekday_inputs(np.array([monday, thursday])),
                               [[0.0, 1.0], [np.sin(6 * np.pi / 7), np.cos(6 * np.pi / 7)]], atol=1e-12)
    litres = np.arange(40, dtype=float) * 10 + 100
    household = HouseholdDaily("h", monday, litres)
    plain = make_windows(household, lookback=7, train_fraction=0.5, scaler="robust")
    dated = make_windows(household, lookback=7, train_fraction=0.5, scaler="robust", calendar="weekday")
    assert plain.x_train.shape[2] == 1 and dated.x_train.shape[2] == 3
    np.testing.assert_array_equal(dated.x_train[..., 0], plain.x_train[..., 0])
    np.testing.assert_array_equal(dated.y_test, plain.y_test)
    # window 0 has inputs days 0..6 (Mon..Sun) and target day 7; each step carries the weekday of the next day
    np.testing.assert_allclose(dated.x_train[0, :, 1:], weekday_inputs(monday + np.arange(1, 8)), atol=1e-6)
    np.testing.assert_allclose(dated.x_train[0, -1, 1:], [0.0, 1.0], atol=1e-6)  # target: the next Monday
    # robust: median and IQR of the fitted days (days 0 .. last training target = 7 + 16 - 1 = 22 -> 23 days)
    fit = litres[:23]
    assert plain.offset == pytest.approx(np.median(fit))
    assert plain.scale == pytest.approx(np.percentile(fit, 75) - np.percentile(fit, 25))
    np.testing.assert_allclose(plain.to_litres(plain.y_test), litres[7 + 16:], rtol=1e-6)
    with pytest.raises(ValueError, match="calendar"):
        make_windows(household, lookback=7, calendar="holidays")


def test_household_profile_inputs_and_the_weekday_naive_forecaster_by_hand():
    from bouquet.data.water import HouseholdDaily, history_profile, make_windows, weekday_profile
    from bouquet.tasks.water import naive_errors, naive_litres

    monday = np.datetime64("2026-12-07")
    np.testing.assert_allclose(weekday_profile([1.0, 2.0, 3.0, 5.0], monday + np.array([0, 1, 7, 8])),
                               [2.0, 3.5, 2.75, 2.75, 2.75, 2.75, 2.75])  # Mon, Tue; the rest: overall mean
    # as known the morning of each target: day 9 (a Wednesday) has seen days 0..8
    series = np.array([1.0, 2, 3, 4, 5, 6, 7, 8, np.nan, 10])
    level, profile = history_profile(series, monday, np.array([2, 9]))
    np.testing.assert_allclose(level, [1.5, 36 / 8])
    np.testing.assert_allclose(profile[0], [1, 2, 1.5, 1.5, 1.5, 1.5, 1.5])  # Mon, Tue; others: the level
    np.testing.assert_allclose(profile[1], [(1 + 8) / 2, 2, 3, 4, 5, 6, 7])  # day 8 (Tue) is missing
    weekly = np.tile([100.0, 100.0, 100.0, 100.0, 100.0, 300.0, 300.0], 8)  # weekends use three times more
    household = HouseholdDaily("h", monday, weekly)
    plain = make_windows(household, lookback=7, train_fraction=0.5)
    windows = make_windows(household, lookback=7, train_fraction=0.5, household_inputs="profile")
    assert windows.x_train.shape[2] == 3
    np.testing.assert_array_equal(windows.x_train[..., 0], plain.x_train[..., 0])
    scaled = windows.series
    first = 7 + len(windows.y_train)  # the first test target
    np.testing.assert_allclose(windows.x_test[0, :, 1], np.mean(scaled[:first]), rtol=1e-6)  # every day before it
    # the last step carries the target's weekday mean: exactly the target here (a perfectly weekly household)
    np.testing.assert_allclose(windows.x_test[:, -1, 2], windows.y_test, atol=1e-6)
    np.testing.assert_array_equal(windows.train_days, monday + 7 + np.arange(len(windows.y_train)))
    assert naive_errors(windows)["weekday average"] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(naive_litres(windows)["weekday average"], weekly[first:], rtol=1e-6)
    with pytest.raises(ValueError, match="household-inputs"):
        make_windows(household, lookback=7, household_inputs="history")


def test_forecaster_preset_sets_its_keys_and_a_key_given_otherwise_wins():
    from bouquet.config import FORECASTERS, AppConfig, ConfigError

    improved = AppConfig.from_run_config({"forecaster": "improved"})
    assert improved.water_model.baseline == "window-median" and improved.water_train.loss == "l1"
    assert improved.water_data.calendar == "weekday" and improved.water_data.household == "profile"
    assert improved.water_data.input_channels == 5  # use, weekday sin / cos, train-days mean, weekday mean
    assert AppConfig.from_run_config(improved.to_run_config()) == improved  # what a results folder records
    # the preset's file with a key added (what bouquet.launch sends to flwr run)
    same = {**FORECASTERS["improved"], "forecaster": "improved", "scaler": "robust"}
    assert AppConfig.from_run_config(same).water_data.scaler == "robust"
    # a key given always wins, whether or not its value is the key's default; the preset's other keys stay
    mse = AppConfig.from_run_config({"forecaster": "improved", "forecast-loss": "mse"})
    assert mse.water_train.loss == "mse" and mse.water_model.baseline == "window-median"
    huber = AppConfig.from_run_config({"forecaster": "improved", "forecast-loss": "huber"})
    assert huber.water_train.loss == "huber" and huber.water_model.baseline == "window-median"
    assert AppConfig.from_run_config(huber.to_run_config()) == huber
    with pytest.raises(ConfigError, match="forecaster must be one of improved, paper, personal"):
        AppConfig.from_run_config({"forecaster": "best"})
    paper = AppConfig()
    assert (paper.run.forecaster, paper.water_model.baseline, paper.water_train.loss, paper.water_data.calendar,
            paper.water_data.scaler) == ("paper", "none", "mse", "none", "minmax")


def test_a_water_task_scores_and_trains_with_its_loss_and_calendar_inputs():
    from bouquet.config import AppConfig
    from bouquet.tasks.base import batch_indices
    from bouquet.tasks.water import WaterTask, predict

    config = AppConfig.from_run_config({"forecaster": "improved", "synthetic-households": 40, "active-factor": 0.0})
    task = WaterTask.for_node(config.water_data, config.water_model, config.water_train, None, 0, None)
    model = task.new_model()
    assert model.lstm.input_size == 5
    loss, n = task.loss(model, 16, np.random.default_rng(0))
    rows = batch_indices(len(task.windows.y_train), 16, np.random.default_rng(0))
    assert n == len(rows)
    assert loss == pytest.approx(np.mean(np.abs(predict(model, task.windows.x_train[rows]) - task.windows.y_train[rows])),
                                 rel=1e-5)
    before = task.evaluate(model, np.random.default_rng(0))["mae-litres"]
    assert before == pytest.approx(task.naive()["naive-window-median"], rel=1e-5)  # starts as the window median
    task.train(model, np.random.default_rng(1), proximal_mu=0.0)
    assert task.evaluate(model, np.random.default_rng(0))["mae-litres"] != before


def test_global_scaling_fits_one_scaler_on_every_households_training_days():
    # lookback 2, train fraction 0.5: 4 complete windows each, 2 train; training days are 0..3 (target 3)
    low, high = household([10, 20, 30, 40, 50, 60], "a"), household([100, 200, 300, 400, 500, 600], "b")
    config = WaterDataParams(lookback=2, train_fraction=0.5, min_windows=2, scaling="global", active_factor=0.0,
                             min_history_days=0)
    # pooled training days 10..40 and 100..400: min 10, range 390
    assert global_scaler([low, high], config) == (10.0, 390.0)
    pool = WaterPool([low, high], pd.DataFrame({"household": ["a", "b"]}))
    a, b = pool.client(0, config), pool.client(1, config)
    assert (a.offset, a.scale) == (b.offset, b.scale) == (10.0, 390.0)
    assert a.y_train.tolist() == pytest.approx([(30 - 10) / 390, (40 - 10) / 390])
    assert b.to_litres(b.y_test).tolist() == pytest.approx([500, 600])  # the level survives the round trip
    own = pool.client(1, dataclasses.replace(config, scaling="household"))
    assert (own.offset, own.scale) == (100.0, 300.0) and own.y_train.max() == pytest.approx(1.0)
    assert fit_scaler(np.array([1.0, 2.0, 3.0, 4.0]), "zscore") == pytest.approx((2.5, np.sqrt(1.25)))
    with pytest.raises(ValueError, match="one household"):
        WaterPool([low], pd.DataFrame({"household": ["a"]})).client(0, config)
    with pytest.raises(ValueError, match="scaling"):
        WaterDataParams(scaling="pooled")


def test_the_pool_line_says_what_the_filters_left_out():
    import pandas as pd

    from bouquet.serving.water import pool_text

    report = pd.DataFrame({"status": ["pool"] * 3 + ["inactive (mean 1 < 2)"] * 5 + ["short history (3 < 4)",
                                                                                     "too few windows (x)"]})
    assert pool_text(report, "pool.csv") == (
        "3 of 10 households (left out: 5 inactive, 1 short history, 1 too few windows; per household: pool.csv; "
        "a utility forecasting every household sets active-factor=0 min-history-days=0)")
    assert pool_text(report.iloc[:3], "p.csv") == "3 of 3 households (report: p.csv)"
