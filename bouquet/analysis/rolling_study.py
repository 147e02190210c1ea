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
* :func:`study_table`: one row per forecaster, households as the replicate: mean MAE, RMSE and MASE, relative
  MAE against the best baseline, the gain against the per-household best baseline and against pooled LightGBM
  with 95 % paired bootstrap intervals over households, the share of households whose MAE is below their own
  best baseline's, and the Diebold-Mariano shares (significantly better / worse at 5 %).

Pure numpy and pandas (bouquet.forecasting.evaluation); utilsforecast's ``mae`` / ``rmse`` give the same numbers
(``tests/test_rolling_study.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from bouquet.forecasting.evaluation import diebold_mariano, dm_shares, household_bootstrap

__all__ = ["chosen_forecasts", "common_days", "household_errors", "per_household_choice", "study_table"]

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


def study_table(forecasts: pd.DataFrame, errors: pd.DataFrame, best_baseline: str, own_baseline: str,
                pooled: str | None = None, order: Sequence[str] | None = None, resamples: int = 2000) -> pd.DataFrame:
    """One row per forecaster (households as the replicate).

    Parameters
    ----------
    forecasts : DataFrame
        :func:`common_days` rows (every forecaster on the same days).
    errors : DataFrame
        :func:`household_errors` of ``forecasts``.
    best_baseline : str
        The baseline with the lowest mean validation MAE (relative MAE is against it).
    own_baseline : str
        The per-household best baseline chosen on validation (:func:`chosen_forecasts`): the gain, the share of
        households beating it and the Diebold-Mariano tests are against it.
    pooled : str, optional
        The centralised reference (pooled LightGBM): a second gain with its interval.
    order : forecaster names, optional
        The rows' order (default: by MAE).
    """
    per_household = errors.groupby(["forecaster", "household"])[["mae", "rmse"]].mean().reset_index()
    if "mase" in errors.columns:
        per_household["mase"] = errors.groupby(["forecaster", "household"])["mase"].mean().to_numpy()
    table = per_household.groupby("forecaster")[["mae", "rmse", *(["mase"] if "mase" in errors else [])]].mean()
    names = list(order) if order is not None else list(table.sort_values("mae").index)
    wide = per_household.pivot(index="household", columns="forecaster", values="mae")
    daily = {name: _mean_daily(forecasts, name) for name in names}
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
            pair = errors[errors["forecaster"].isin([name, other])].pivot_table(
                index=["household", "origin"], columns="forecaster", values="mae").dropna()
            interval = household_bootstrap(pair[name], pair[other], pair.index.get_level_values("household"),
                                           resamples=resamples)
            row[label] = interval.text()
        if name == own_baseline:
            row["beats own best baseline"], row["DM better / worse"] = np.nan, ""
        else:
            row["beats own best baseline"] = float((wide[name] < wide[own_baseline]).mean())
            tests = []
            for household in wide.index:
                a = daily[name].xs(household, level="household")
                b = daily[own_baseline].xs(household, level="household").reindex(a.index)
                tests.append(diebold_mariano(a.to_numpy(), b.to_numpy()))
            shares = dm_shares(tests)
            row["DM better / worse"] = f"{100 * shares['better']:.0f} % / {100 * shares['worse']:.0f} %"
        rows.append(row)
    return pd.DataFrame(rows)
