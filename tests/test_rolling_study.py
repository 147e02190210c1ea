"""The rolling-origin study's tables (bouquet.analysis.rolling_study): hand cases, and utilsforecast's metrics as
the oracle of the per-household errors."""

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis.rolling_study import (
    chosen_forecasts,
    common_days,
    household_errors,
    per_household_choice,
    study_table,
    wilson_interval,
)


def rows(forecaster, household, origin, days, actual, forecast, seed=0):
    return pd.DataFrame({"forecaster": forecaster, "seed": seed, "household": household, "origin": origin,
                         "day": pd.to_datetime(days), "actual": actual, "forecast": forecast})


def test_common_days_keep_what_every_forecaster_forecast():
    days = ["2024-01-01", "2024-01-02", "2024-01-03"]
    frame = pd.concat([rows("a", "h", 0, days, [1.0, 2, 3], [1.0, 2, 3]),
                       rows("b", "h", 0, days[1:], [2.0, 3], [2.0, np.nan]),
                       rows("c", "h", 0, days, [1.0, 2, 3], [1.0, 2, 3], seed=0),
                       rows("c", "h", 0, days[:2], [1.0, 2], [1.0, 2], seed=1)])  # seed 1 lacks day 3
    kept = common_days(frame)
    assert sorted(kept["day"].dt.strftime("%m-%d").unique()) == ["01-02"]  # b's day 3 is NaN, c's seed 1 lacks it


def test_household_errors_average_seeds_and_equal_utilsforecast():
    from utilsforecast.losses import mae, rmse

    frame = pd.concat([rows("a", "h", 0, ["2024-01-01", "2024-01-02"], [10.0, 20], [12.0, 16], seed=0),
                       rows("a", "h", 0, ["2024-01-01", "2024-01-02"], [10.0, 20], [10.0, 22], seed=1)])
    errors = household_errors(frame, pd.DataFrame({"household": ["h"], "origin": [0], "scale": [2.0]}))
    row = errors.iloc[0]
    assert row["mae"] == pytest.approx(((2 + 4) / 2 + (0 + 2) / 2) / 2)
    assert row["rmse"] == pytest.approx((np.sqrt((4 + 16) / 2) + np.sqrt(4 / 2)) / 2)
    assert row["mase"] == pytest.approx(row["mae"] / 2.0) and row["seeds"] == 2 and row["days"] == 2
    one = frame[frame["seed"] == 0].rename(columns={"household": "unique_id", "day": "ds", "actual": "y"})
    ours = household_errors(frame[frame["seed"] == 0]).iloc[0]
    assert ours["mae"] == pytest.approx(mae(one, models=["forecast"])["forecast"].iloc[0])
    assert ours["rmse"] == pytest.approx(rmse(one, models=["forecast"])["forecast"].iloc[0])


def test_per_household_choice_and_its_forecasts():
    validation = pd.DataFrame({"forecaster": ["a", "b", "a", "b", "b"], "household": ["x", "x", "y", "y", "z"],
                               "mae": [5.0, 6.0, 7.0, 7.0, 1.0]})
    choice = per_household_choice(validation, ["a", "b"])
    assert choice == {"x": "a", "y": "a", "z": "b"}  # y: a tie goes to the first; z: a has no validation
    frame = pd.concat([rows("a", "x", 0, ["2024-01-01"], [1.0], [2.0]), rows("b", "x", 0, ["2024-01-01"], [1.0], [3.0])])
    picked = chosen_forecasts(frame, choice, "own")
    assert picked["forecaster"].tolist() == ["own"] and picked["forecast"].tolist() == [2.0]


def test_study_table_by_hand():
    days = pd.date_range("2024-01-01", periods=10).strftime("%Y-%m-%d").tolist()
    rng = np.random.default_rng(0)
    frames = []
    for household, level in (("x", 100.0), ("y", 200.0)):
        actual = level + rng.normal(0, 10, 10)
        noise = rng.choice([-1.0, 1.0], 10) * level * 0.1
        frames += [rows("own", household, 0, days, actual, actual + noise),           # off by 10 % of the level
                   rows("model", household, 0, days, actual, actual + 0.9 * noise),   # off by 9 %
                   rows("pooled", household, 0, days, actual, actual + 0.95 * noise)]
    forecasts = common_days(pd.concat(frames, ignore_index=True))
    errors = household_errors(forecasts)
    table = study_table(forecasts, errors, best_baseline="pooled", own_baseline="own", pooled="pooled",
                        resamples=200).set_index("forecaster")
    assert list(table.index) == ["model", "pooled", "own"]  # by MAE
    assert table.loc["model", "MAE"] == pytest.approx(0.9 * table.loc["own", "MAE"])
    assert table.loc["model", "rMAE"] == pytest.approx(0.9 / 0.95)
    assert table.loc["model", "vs own best baseline"] == "+10.0 % [+10.0, +10.0]"  # every household gains 10 %
    assert table.loc["model", "vs pooled LightGBM"].startswith("+5.3 %")
    assert table.loc["model", "beats own best baseline"] == 1.0
    assert table.loc["model", "DM better / worse"] == "100 % / 0 %"
    assert table.loc["own", "vs own best baseline"] == "" and np.isnan(table.loc["own", "beats own best baseline"])


def test_one_skill_definition_and_the_honest_columns():
    """Households with different numbers of origins: the MAE column is the mean over household-origin units, so the
    skill column is 1 - MAE / own MAE; the share beating their own baseline carries Wilson's interval; the skill
    without the households that gain most; the MAE on holidays and on the other days."""
    days = pd.date_range("2024-01-01", periods=6).strftime("%Y-%m-%d").tolist()
    frames = []
    for household, origins, own_err, model_err in (("a", 1, 10.0, 1.0), ("b", 3, 10.0, 9.0), ("c", 3, 10.0, 11.0),
                                                   ("d", 2, 10.0, 9.5)):
        for origin in range(origins):
            actual = np.full(6, 100.0)
            frames += [rows("own", household, origin, days, actual, actual + own_err),
                       rows("model", household, origin, days, actual, actual + model_err)]
    forecasts = common_days(pd.concat(frames, ignore_index=True))
    errors = household_errors(forecasts)
    table = study_table(forecasts, errors, best_baseline="own", own_baseline="own", resamples=200, top=1,
                        holidays=[np.datetime64("2024-01-01")]).set_index("forecaster")
    units = {"a": 1, "b": 3, "c": 3, "d": 2}
    model = sum(n * e for n, e in zip(units.values(), (1.0, 9.0, 11.0, 9.5))) / 9
    assert table.loc["model", "MAE"] == pytest.approx(model)  # over the 9 units, not the 4 households
    assert table.loc["model", "vs own best baseline"].startswith(f"{100 * (1 - model / 10.0):+.1f} %")
    assert table.loc["model", "beats own best baseline"] == pytest.approx(0.75)
    assert table.loc["model", "beats [95 % CI]"] == "[30, 95] %"  # Wilson, 3 of 4
    # without the one household that gains most (a: 9 L/day a unit): (3 * 9 + 3 * 11 + 2 * 9.5) / 8 against 10
    without = 1 - (3 * 9.0 + 3 * 11.0 + 2 * 9.5) / 8 / 10.0
    assert table.loc["model", "vs own best baseline without top 1"].startswith(f"{100 * without:+.1f} %")
    assert table.loc["model", "MAE holidays"] == pytest.approx(model)  # every error is the same on each day
    assert table.loc["own", "MAE other days"] == pytest.approx(10.0)
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0, abs=1e-12) and 0.27 < high < 0.29
