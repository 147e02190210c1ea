"""The rolling-origin forecaster study's tables, from every forecaster's daily forecasts.

The study (``scripts/run_forecaster_study.py``) gathers one long frame, ``forecasts``: a row per forecaster,
seed, household, origin and day with the actual litres and the forecast.  Everything here reads it:

* :func:`common_days` keeps the days every forecaster forecast (the federated LSTM's test days are the days with
  a complete look-back, so every forecaster is scored on the same days);
* :func:`household_errors`: per forecaster, household and origin, MAE and RMSE (each the mean over seeds:
  training noise is averaged, not counted as replication) and MASE (the MAE over the seasonal naive
  forecaster's in-sample MAE before the origin); written as ``households.csv`` with every study;
* :func:`per_household_choice`: the best of a set of forecasters for each household on its validation days (a
  choice made once, on the design period), and :func:`chosen_forecasts` the forecasts it makes;
* :func:`study_table`: one row per forecaster, households as the replicate: MAE, RMSE and MASE (means over the
  household-origin units), relative MAE against the best baseline, the skill against the per-household best
  baseline and against pooled LightGBM (``1 - sum MAE / sum of the comparator's MAE`` over the same units) with
  95 % paired bootstrap intervals over households, the skill without the three households that gain most,
  the share of households whose MAE is below their own best baseline's with Wilson's interval, the
  Diebold-Mariano shares (significantly better / worse at 5 %), and the MAE on public holidays and on the
  other days.

Pure numpy and pandas (bouquet.forecasting.evaluation); utilsforecast's ``mae`` / ``rmse`` give the same numbers
(``tests/test_rolling_study.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from bouquet.forecasting.evaluation import diebold_mariano, dm_shares, household_bootstrap

__all__ = ["chosen_forecasts", "common_days", "household_errors", "per_household_choice", "study_table",
           "wilson_interval"]

KEYS = ["household", "origin", "day"]


def common_days(forecasts: pd.DataFrame) -> pd.DataFrame:
    """The rows of the (household, origin, day) triples that every forecaster forecast, with an actual and a finite
    forecast (a forecaster with several seeds needs every seed's)."""
    frame = forecasts[np.isfinite(forecasts["forecast"]) & np.isfinite(forecasts["actual"])]
    seeds = forecasts.groupby("forecaster")["seed"].nunique()
    count = frame.groupby(["forecaster", *KEYS]).size().rename("n").reset_index()
    count = count[count["n"] == count["forecaster"].map(seeds)]
    per_day = count.groupby(KEYS)["forecaster"].nunique()
    keep = per_day[per_day == forecasts["forecaster"].nunique()].index
    return frame.set_index(KEYS).loc[lambda f: f.index.isin(keep)].reset_index()


def household_errors(forecasts: pd.DataFrame, scales: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per forecaster, household and origin: ``days``, ``mae`` and ``rmse`` (means over seeds) and, with
    ``scales`` (``household, origin, scale``: the seasonal naive in-sample MAE), ``mase``."""
    err = forecasts.assign(abs=(forecasts["forecast"] - forecasts["actual"]).abs(),
                           sq=(forecasts["forecast"] - forecasts["actual"]) ** 2)
    per_seed = err.groupby(["forecaster", "seed", "household", "origin"]).agg(
        days=("abs", "size"), mae=("abs", "mean"), mse=("sq", "mean")).reset_index()
    per_seed["rmse"] = np.sqrt(per_seed["mse"])
    out = per_seed.groupby(["forecaster", "household", "origin"]).agg(
        days=("days", "first"), mae=("mae", "mean"), rmse=("rmse", "mean"), seeds=("seed", "nunique")).reset_index()
    if scales is not None:
        out = out.merge(scales[["household", "origin", "scale"]], on=["household", "origin"], how="left")
        out["mase"] = out["mae"] / out["scale"]
        out = out.drop(columns="scale")
    return out


def per_household_choice(validation: pd.DataFrame, candidates: Sequence[str]) -> dict[str, str]:
    """``household -> forecaster``: of ``candidates``, the one with the lowest validation MAE (``validation``: rows
    of ``forecaster, household, mae``, one per pair; the first of equals in ``candidates``' order).  A household
    that some candidate has no validation MAE for chooses among the others."""
    frame = validation[validation["forecaster"].isin(candidates)].dropna(subset=["mae"])
    order = {name: i for i, name in enumerate(candidates)}
    frame = frame.assign(order=frame["forecaster"].map(order)).sort_values(["household", "mae", "order"])
    return dict(frame.groupby("household", sort=True)["forecaster"].first())


def chosen_forecasts(forecasts: pd.DataFrame, choice: Mapping[str, str], name: str) -> pd.DataFrame:
    """The forecasts of the forecaster each household chose (``choice``), as the forecaster ``name`` (seed 0;
    a chosen forecaster with several seeds enters with each seed's forecast averaged over seeds' errors by
    :func:`household_errors`, so its seeds are kept)."""
    picked = forecasts[forecasts["household"].map(choice) == forecasts["forecaster"]]
    return picked.assign(forecaster=name)


def _mean_daily(forecasts: pd.DataFrame, forecaster: str) -> pd.Series:
    """Absolute error per (household, origin, day), averaged over seeds."""
    rows = forecasts[forecasts["forecaster"] == forecaster]
    return (rows["forecast"] - rows["actual"]).abs().groupby([rows[k] for k in KEYS]).mean()


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95 % score interval of a share ``successes / n`` (a share of households is binomial)."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def _unit_pair(errors: pd.DataFrame, name: str, other: str) -> pd.DataFrame:
    """Both forecasters' MAE on every household-origin unit where both have one."""
    return errors[errors["forecaster"].isin([name, other])].pivot_table(
        index=["household", "origin"], columns="forecaster", values="mae").dropna()


def study_table(forecasts: pd.DataFrame, errors: pd.DataFrame, best_baseline: str, own_baseline: str,
                pooled: str | None = None, order: Sequence[str] | None = None, resamples: int = 2000,
                holidays: Sequence[np.datetime64] | None = None, top: int = 3) -> pd.DataFrame:
    """One row per forecaster (households as the replicate).

    Every average is over the same household-origin units (a household's MAE at one origin), so that one skill
    definition holds everywhere: skill against a comparator is ``1 - sum of MAE / sum of the comparator's MAE``
    over the units both forecast, that is ``1 - MAE / MAE of the comparator`` in the table's columns.

    Parameters
    ----------
    forecasts : DataFrame
        :func:`common_days` rows (every forecaster on the same days).
    errors : DataFrame
        :func:`household_errors` of ``forecasts``.
    best_baseline : str
        The baseline with the lowest mean validation MAE (relative MAE is against it).
    own_baseline : str
        The per-household best baseline chosen on validation (:func:`chosen_forecasts`): the skill (with its 95 %
        paired bootstrap interval over households), the skill without the ``top`` households that gain most,
        the share of households beating it (with Wilson's interval) and the Diebold-Mariano tests are against it.
    pooled : str, optional
        The centralised reference (pooled LightGBM): a second skill with its interval.
    order : forecaster names, optional
        The rows' order (default: by MAE).
    holidays : days, optional
        Public holidays: the MAE on them and on the other days (means over days).
    """
    table = errors.groupby("forecaster")[["mae", "rmse", *(["mase"] if "mase" in errors else [])]].mean()
    names = list(order) if order is not None else list(table.sort_values("mae").index)
    per_household = errors.groupby(["forecaster", "household"])["mae"].mean().reset_index()
    wide = per_household.pivot(index="household", columns="forecaster", values="mae")
    daily = {name: _mean_daily(forecasts, name) for name in names}
    is_holiday = None
    if holidays is not None:
        is_holiday = pd.to_datetime(forecasts["day"]).isin(pd.to_datetime(pd.Series(list(holidays))))
    rows = []
    for name in names:
        row = {"forecaster": name, "households": int(wide[name].notna().sum()), "MAE": table.loc[name, "mae"],
               "RMSE": table.loc[name, "rmse"]}
        if "mase" in table.columns:
            row["MASE"] = table.loc[name, "mase"]
        row["rMAE"] = table.loc[name, "mae"] / table.loc[best_baseline, "mae"]
        for label, other in (("vs own best baseline", own_baseline), ("vs pooled LightGBM", pooled)):
            if other is None or other == name:
                row[label] = ""
                continue
            pair = _unit_pair(errors, name, other)
            interval = household_bootstrap(pair[name], pair[other], pair.index.get_level_values("household"),
                                           resamples=resamples)
            row[label] = interval.text()
        if name == own_baseline:
            row[f"vs own best baseline without top {top}"] = ""
            row["beats own best baseline"], row["DM better / worse"] = np.nan, ""
        else:
            pair = _unit_pair(errors, name, own_baseline)
            gain = (pair[own_baseline] - pair[name]).groupby(level="household").sum()
            kept = pair[~pair.index.get_level_values("household").isin(gain.nlargest(top).index)]
            row[f"vs own best baseline without top {top}"] = (
                household_bootstrap(kept[name], kept[own_baseline], kept.index.get_level_values("household"),
                                    resamples=resamples).text() if len(kept) else "")
            beats = wide[name] < wide[own_baseline]
            both = wide[[name, own_baseline]].notna().all(axis=1)
            low, high = wilson_interval(int(beats[both].sum()), int(both.sum()))
            row["beats own best baseline"] = float(beats[both].mean())
            row["beats [95 % CI]"] = f"[{100 * low:.0f}, {100 * high:.0f}] %"
            tests = []
            for household in wide.index:
                a = daily[name].xs(household, level="household")
                b = daily[own_baseline].xs(household, level="household").reindex(a.index)
                tests.append(diebold_mariano(a.to_numpy(), b.to_numpy()))
            shares = dm_shares(tests)
            row["DM better / worse"] = f"{100 * shares['better']:.0f} % / {100 * shares['worse']:.0f} %"
        if is_holiday is not None:
            mine = forecasts["forecaster"] == name
            err = (forecasts["forecast"] - forecasts["actual"]).abs()
            row["MAE holidays"] = float(err[mine & is_holiday].mean()) if (mine & is_holiday).any() else np.nan
            row["MAE other days"] = float(err[mine & ~is_holiday].mean())
        rows.append(row)
    return pd.DataFrame(rows)
