"""The rolling-origin split (split = "origins"), the locked test period (score-test = false), and what a node
serves (fallback): hand cases, properties and bad input."""

import numpy as np
import pytest

from bouquet.config import AppConfig, ConfigError
from bouquet.data.water import (
    HouseholdDaily,
    TestPeriodLocked,
    WaterDataParams,
    _complete_windows,
    make_windows,
    select_pool,
    split_layout,
)

MONDAY = np.datetime64("2026-01-05")


def origins(**overrides):
    base = {"split": "origins", "origins": 3, "origin_days": 7, "validation_days": 14, "lookback": 3,
            "min_windows": 5, "active_factor": 0.0, "min_history_days": 0}
    return WaterDataParams(**{**base, **overrides})


def household(days=80, hid="h", seed=0):
    return HouseholdDaily(hid, MONDAY, np.random.default_rng(seed).uniform(100, 300, days))


def test_layout_by_hand():
    h = household(80)  # days 0..79; blocks of 7 at the end: 59..65, 66..72, 73..79
    litres = h.litres
    targets = _complete_windows(litres, 3)  # 3..79
    for origin, start in ((0, 59), (1, 66), (2, 73)):
        layout = split_layout(litres, targets, origins(origin=origin))
        fit, val, test = (targets[s] for s in (layout.fit, layout.validation, layout.test))
        assert test.tolist() == list(range(start, start + 7))
        assert val.tolist() == list(range(start - 14, start))
        assert fit.tolist() == list(range(3, start - 14))  # an expanding window
        assert layout.test_start == start and layout.visible == start + 7


def test_windows_at_an_origin_and_the_lock():
    h = household(80)
    open_ = make_windows(h, config=origins(origin=1))
    assert (open_.test_days - MONDAY).astype(int).tolist() == list(range(66, 73))
    assert len(open_.series) == 73  # nothing after the block reaches the node
    np.testing.assert_allclose(open_.to_litres(open_.y_test), h.litres[66:73])
    locked = make_windows(h, config=origins(origin=1, score_test=False))
    assert locked.test_locked and len(locked.y_test) == 0 and len(locked.series) == 66
    np.testing.assert_array_equal(locked.x_train, open_.x_train)
    np.testing.assert_array_equal(locked.x_val, open_.x_val)
    assert locked.offset == open_.offset and locked.scale == open_.scale  # the scaler saw fit days only
    with pytest.raises(TestPeriodLocked, match="score-test = false"):
        locked.require_test()
    # the fraction split locks too: the series ends before the first test target
    plain = make_windows(h, config=WaterDataParams(lookback=3, score_test=False, validation_fraction=0.2))
    assert plain.test_locked and plain.first_day + len(plain.series) - 1 < np.datetime64("2026-03-26")


def test_blocks_follow_each_households_own_end():
    early = HouseholdDaily("early", MONDAY, np.concatenate([np.full(70, 150.0), np.full(10, np.nan)]))
    w = make_windows(early, config=origins(origin=2))
    assert (w.test_days - MONDAY).astype(int).tolist() == list(range(63, 70))  # its last valid day is day 69


def test_a_household_too_short_for_an_origin_is_named_and_counted():
    pool = select_pool([household(80, "long"), household(40, "short")], origins())
    report = pool.report.set_index("household")
    assert [h.household_id for h in pool.households] == ["long"]
    status = report.loc["short", "status"]
    assert status.startswith("too few windows (origin 0: ") and "fit windows (< 5)" in status
    gappy = household(80, "gappy")
    litres = gappy.litres.copy()
    litres[74:78] = np.nan  # block 2 (73..79): 1 complete window left
    homes = [household(80, "long"), HouseholdDaily("gappy", MONDAY, litres)]
    pool = select_pool(homes, origins(origin=2))
    assert pool.report.set_index("household").loc["gappy", "status"] == \
        "too few windows (origin 2: 1 test windows (< 7))"
    assert pool.report.set_index("household").loc["long", "test_windows"] == 7
    # each origin has its own pool: the gap is in block 2 only
    assert [h.household_id for h in select_pool(homes, origins(origin=1)).households] == ["gappy", "long"]


def test_bad_input_names_the_key():
    with pytest.raises(ConfigError, match="'origin'"):
        AppConfig.from_run_config({"split": "origins", "origin": 3})
    with pytest.raises(ConfigError, match="'fallback'.*validation-days > 0"):
        AppConfig.from_run_config({"split": "origins", "validation-days": 0, "fallback": "combine"})
    with pytest.raises(ConfigError, match="'fallback'.*validation-fraction > 0"):
        AppConfig.from_run_config({"fallback": "select"})
    with pytest.raises(ConfigError, match="'personalize-early-stop'"):
        AppConfig.from_run_config({"personalize-early-stop": True})
    with pytest.raises(ConfigError, match="fallback must be one of"):
        AppConfig.from_run_config({"fallback": "always", "validation-fraction": 0.2})


def _task(**keys):
    from bouquet.tasks.water import WaterTask

    config = AppConfig.from_run_config({"forecaster": "improved", "split": "origins", "origin-days": 14,
                                        "validation-days": 28, "synthetic-households": 120, "active-factor": 0.5,
                                        **keys})
    return WaterTask.for_node(config.water_data, config.water_model, config.water_train, None, 0, None,
                              config.personal, config.fallback), config


def test_the_final_evaluation_serves_the_model_or_its_baseline_and_never_reads_a_locked_test():
    import torch

    torch.manual_seed(0)
    task, _ = _task(fallback="combine")
    model = task.new_model()
    metrics = task.evaluate(model, np.random.default_rng(0), final=True)
    share = metrics["served-model-share"]
    assert share in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert metrics["val-mae-litres"] <= min(metrics["val-model-mae-litres"], metrics["val-baseline-mae-litres"]) + 1e-9
    assert {"mae-litres", "model-mae-litres", "baseline-mae-litres", "mase-scale"} <= set(metrics)
    arrays = task.final_arrays(model)
    p = arrays["predictions"]
    np.testing.assert_allclose(p["predicted-litres"],
                               np.maximum(share * p["model-litres"] + (1 - share) * p["baseline-litres"], 0))
    assert (p["predicted-litres"] >= 0).all()
    assert np.mean(np.abs(p["predicted-litres"] - p["actual-litres"])) == pytest.approx(metrics["mae-litres"])
    assert task.final_info(model)["served"] == {0.0: "baseline", 1.0: "model"}.get(share, "combined")
    # per round (not final): validation only
    per_round = task.evaluate(task.new_model(), np.random.default_rng(0))
    assert "mae-litres" not in per_round and "val-mae-litres" in per_round
    locked, _ = _task(**{"score-test": False, "fallback": "combine"})
    final = locked.evaluate(locked.new_model(), np.random.default_rng(0), final=True)
    assert "mae-litres" not in final and not any(k.startswith("naive-") and "-val-" not in k for k in final)
    assert "predictions" not in locked.final_arrays(locked.new_model())


def test_early_stopped_fine_tuning_keeps_the_best_validation_epoch():
    import torch

    from bouquet.tasks.water import evaluate_windows

    torch.manual_seed(0)
    task, _ = _task(**{"personalize-epochs": 4, "personalize-early-stop": True, "personalize-learning-rate": 0.05})
    model = task.new_model()
    before = evaluate_windows(model, task.windows, "validation")["mae-litres"]
    kept = task.fine_tune(model, np.random.default_rng(1))
    after = evaluate_windows(model, task.windows, "validation")["mae-litres"]
    assert 0 <= kept <= 4 and after <= before + 1e-9


def test_the_forecast_of_the_days_after_the_data():
    import torch

    from bouquet.tasks.water import forecast_ahead

    torch.manual_seed(0)
    task, config = _task(fallback="combine", origin=2)
    model = task.new_model()
    w = task.windows
    ahead = task.final_arrays(model)["ahead"]
    last = w.first_day + len(w.series) - 1
    assert (ahead["day"].astype("datetime64[D]") == last + np.arange(1, 8)).all()
    assert ahead["horizon"].tolist() == list(range(1, 8)) and (ahead["forecast-litres"] >= 0).all()
    # tomorrow (horizon 1) reads the actuals: the same as the model's window for that day
    from bouquet.data.water import window_inputs
    from bouquet.tasks.water import predict

    x = window_inputs(w.series, w.first_day, np.array([len(w.series)]), config.water_data)
    assert ahead["model-litres"][0] == pytest.approx(max(float(w.to_litres(predict(model, x))[0]), 0), rel=1e-6)
    # a missing day in the look-back: the baseline alone
    litres = w.to_litres(w.series)
    litres[-2] = np.nan
    gap = forecast_ahead(model, litres, w.first_day, (w.offset, w.scale), config.water_data, "weekday average",
                         0.5, None, 3)
    assert np.isnan(gap["model-litres"]).all() and (gap["model-share"] == 0).all()
    np.testing.assert_allclose(gap["forecast-litres"], gap["baseline-litres"])
    with pytest.raises(ValueError, match="days must be >= 1"):
        forecast_ahead(model, litres, w.first_day, (w.offset, w.scale), config.water_data, "", 1.0, None, 0)
