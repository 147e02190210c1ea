"""The forecasting field's baselines for the water studies, through its own libraries (the ``forecasting`` extra).

* statsforecast (Nixtla): ``SeasonalNaive(7)``, ``WindowAverage(k)``, ``SeasonalWindowAverage(7, k)`` and
  ``AutoETS(season_length=7)`` per household;
* mlforecast + LightGBM: a gradient-boosted forecaster from lags 1-14, rolling means of the last 7 and 28 days
  and the weekday, either one model per household (``local``) or one model on every household (``pooled``,
  the centralised reference);
* LightGBM as a forecaster would fit it (:func:`level_lightgbm_forecasts`): the tree forecasters' inputs and
  level-scaled target (:mod:`bouquet.forecasting.features`), the L1 objective, and in the pooled model the
  household as a categorical input.  It reads the same inputs as bouquet's federated trees, so a comparison
  isolates how the trees are trained; mlforecast's lag transforms cover the lags and rolling statistics but not
  the weekday profile or the holidays, so the inputs are built once, here, for both.

Each forecasts every day of a span one step ahead, from every actual before it (``cross_validation`` with
``h = 1`` and a step of one day; statsforecast refits each day, or every ``refit`` days and updates its state
with each new actual in between; LightGBM is fitted once before the span and reads the actual lags).  The
libraries need contiguous series: a missing day is filled with the last valid day before it (a causal fill:
interpolating would hand a forecast the actual after the gap), none before a household's first valid day, and
only days with an actual are scored.

Install: ``pip install "bouquet-fl[forecasting]"`` (statsforecast, mlforecast, utilsforecast, lightgbm).  The
nodes do not need it: their naive forecasters are :mod:`bouquet.forecasting.naive` (equal to statsforecast's).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bouquet.params import require

__all__ = ["EXTRA", "STATS_MODELS", "LevelLightGBMParams", "LightGBMParams", "level_lightgbm_forecasts",
           "lightgbm_forecasts", "long_frame", "require_extra", "stats_forecasts"]

#: How to install the libraries this module drives.
EXTRA = 'pip install "bouquet-fl[forecasting]"'
_MODULES = ("statsforecast", "mlforecast", "utilsforecast", "lightgbm")


def require_extra(*modules: str) -> None:
    """Import ``modules`` (default: every library of the extra) or raise ImportError naming the extra."""
    for name in modules or _MODULES:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ImportError(f"the forecasting baselines need {name}, part of the forecasting extra: {EXTRA}") \
                from error


def long_frame(series: Mapping[str, tuple[np.datetime64, np.ndarray]], until: Mapping[str, int] | None = None
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The households' daily series in the long format (``unique_id, ds, y``), cut before day ``until[h]`` (an
    index into the household's series; default: all of it), each missing day filled with the last valid day before
    it (a causal fill; the days after the last valid one up to the cut too).

    Returns the filled frame (what the libraries read) and the actuals (``unique_id, ds, y`` of the valid days
    only: what is scored)."""
    frames, actual = [], []
    for household, (first_day, litres) in series.items():
        litres = np.asarray(litres, dtype=np.float64)
        stop = len(litres) if until is None else int(until[household])
        litres = litres[:stop]
        valid = np.flatnonzero(np.isfinite(litres))
        if not len(valid):
            continue
        litres = litres[valid[0]:]
        days = pd.date_range(pd.Timestamp(np.datetime64(first_day, "D") + valid[0]), periods=len(litres), freq="D")
        y = pd.Series(litres).ffill().to_numpy()
        frames.append(pd.DataFrame({"unique_id": household, "ds": days, "y": y}))
        keep = np.isfinite(litres)
        actual.append(pd.DataFrame({"unique_id": household, "ds": days[keep], "y": litres[keep]}))
    if not frames:
        raise ValueError("no household has a valid day before its cut")
    return pd.concat(frames, ignore_index=True), pd.concat(actual, ignore_index=True)


#: The statsforecast models by table name (``k``: the window in days, or in weeks for the seasonal one).
STATS_MODELS: dict[str, str] = {
    "seasonal naive": "SeasonalNaive(7)",
    "window average 7": "WindowAverage(7)",
    "window average 14": "WindowAverage(14)",
    "window average 28": "WindowAverage(28)",
    "seasonal window average 2": "SeasonalWindowAverage(7, 2)",
    "seasonal window average 4": "SeasonalWindowAverage(7, 4)",
    "seasonal window average 8": "SeasonalWindowAverage(7, 8)",
    "ETS": "AutoETS(7)",
}


def _stats_model(name: str) -> Any:
    from statsforecast.models import AutoETS, SeasonalNaive, SeasonalWindowAverage, WindowAverage

    spec = STATS_MODELS[name]
    if spec.startswith("SeasonalNaive"):
        return SeasonalNaive(season_length=7, alias=name)
    if spec.startswith("WindowAverage"):
        return WindowAverage(window_size=int(spec[len("WindowAverage("):-1]), alias=name)
    if spec.startswith("SeasonalWindowAverage"):
        return SeasonalWindowAverage(season_length=7, window_size=int(spec.split(", ")[1][:-1]), alias=name)
    return AutoETS(season_length=7, alias=name)


def stats_forecasts(frame: pd.DataFrame, days: int, models: Sequence[str] = tuple(STATS_MODELS), refit: int = 1,
                    n_jobs: int = 1) -> pd.DataFrame:
    """One-step forecasts of each household's last ``days`` days of ``frame`` by each statsforecast model.

    Parameters
    ----------
    frame : DataFrame
        ``unique_id, ds, y`` (:func:`long_frame`), each household cut after the last day to forecast.
    days : int
        The days forecast, each from every day before it.
    models : names of :data:`STATS_MODELS`
    refit : int, default 1
        Refit the models every ``refit`` days (1: every day); in between each reads the new actuals.
    n_jobs : int, default 1

    Returns
    -------
    DataFrame
        ``unique_id, ds`` and one column per model.
    """
    require_extra("statsforecast")
    unknown = [m for m in models if m not in STATS_MODELS]
    if unknown:
        raise ValueError(f"unknown statsforecast baseline(s) {unknown}; choose among {', '.join(STATS_MODELS)}")
    if days < 1 or refit < 1:
        raise ValueError(f"days and refit must be >= 1, got {days} and {refit}")
    from statsforecast import StatsForecast

    long_enough = frame.groupby("unique_id")["y"].transform("size") > days + 2 * 7
    built = [_stats_model(m) for m in models]
    # an integer refit needs the model's forward (statsforecast): AutoETS has it; the window models have no
    # parameters to refit and are refitted every day
    groups = [[m for m in built if hasattr(m, "forward")], [m for m in built if not hasattr(m, "forward")]] \
        if refit > 1 else [built]
    out = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group, step in zip(groups, (refit, True)):
            if not group:
                continue
            forecaster = StatsForecast(models=group, freq="D", n_jobs=n_jobs)
            part = forecaster.cross_validation(df=frame[long_enough], h=1, n_windows=days, step_size=1,
                                               refit=True if step == 1 else step)
            part = part.drop(columns=["cutoff", "y"]).reset_index(drop=True)
            out = part if out is None else out.merge(part, on=["unique_id", "ds"])
    for name in models:
        out[name] = out[name].clip(lower=0)
    return out


@dataclass(frozen=True)
class LightGBMParams:
    """A LightGBM forecaster through mlforecast.

    Parameters
    ----------
    num_leaves : int, default 31
    learning_rate : float, default 0.05
    n_estimators : int, default 200
    min_child_samples : int, default 20
    lags : int, default 14
        Lags 1 .. ``lags`` of the day's use.
    seed : int, default 0
    """

    num_leaves: int = 31
    learning_rate: float = 0.05
    n_estimators: int = 200
    min_child_samples: int = 20
    lags: int = 14
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.num_leaves >= 2, "num_leaves", f"num_leaves must be >= 2, got {self.num_leaves}")
        require(self.learning_rate > 0, "learning_rate", f"learning_rate must be > 0, got {self.learning_rate}")
        require(self.n_estimators >= 1, "n_estimators", f"n_estimators must be >= 1, got {self.n_estimators}")
        require(self.lags >= 1, "lags", f"lags must be >= 1, got {self.lags}")

    def name(self) -> str:
        return f"leaves={self.num_leaves},lr={self.learning_rate},trees={self.n_estimators}"


def _mlforecast(params: LightGBMParams) -> Any:
    import lightgbm as lgb
    from mlforecast import MLForecast
    from mlforecast.lag_transforms import RollingMean

    model = lgb.LGBMRegressor(num_leaves=params.num_leaves, learning_rate=params.learning_rate,
                              n_estimators=params.n_estimators, min_child_samples=params.min_child_samples,
                              random_state=params.seed, n_jobs=1, verbose=-1, deterministic=True,
                              force_row_wise=True)
    return MLForecast(models={"lightgbm": model}, freq="D", lags=list(range(1, params.lags + 1)),
                      lag_transforms={1: [RollingMean(window_size=7), RollingMean(window_size=28)]},
                      date_features=["dayofweek"])


def lightgbm_forecasts(frame: pd.DataFrame, days: int, params: LightGBMParams = LightGBMParams(),
                       pooled: bool = True) -> pd.DataFrame:
    """One-step forecasts of each household's last ``days`` days of ``frame`` by LightGBM (mlforecast), fitted once
    on the days before them: one model on every household (``pooled``) or one per household.

    Returns ``unique_id, ds, lightgbm`` (forecasts below 0 clipped at 0)."""
    require_extra("mlforecast", "lightgbm")
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    minimum = days + params.lags + 28 + 7
    frame = frame[frame.groupby("unique_id")["y"].transform("size") > minimum]
    groups = [frame] if pooled else [g for _, g in frame.groupby("unique_id", sort=True)]
    pieces = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group in groups:
            out = _mlforecast(params).cross_validation(group, h=1, n_windows=days, step_size=1, refit=False)
            pieces.append(out[["unique_id", "ds", "lightgbm"]])
    out = pd.concat(pieces, ignore_index=True)
    out["lightgbm"] = out["lightgbm"].clip(lower=0)
    return out


@dataclass(frozen=True)
class LevelLightGBMParams:
    """LightGBM on the tree forecasters' inputs and level-scaled target (:func:`level_lightgbm_forecasts`).

    Parameters
    ----------
    objective : {"l1", "l2", "huber"}, default "l1"
        LightGBM's ``regression_l1`` (leaves renewed to the median residual), ``regression`` or ``huber``.
    num_leaves : int, default 31
    max_depth : int, default -1
        -1: no limit (leaf-wise growth up to ``num_leaves``).
    learning_rate : float, default 0.05
    n_estimators : int, default 300
    min_child_samples : int, default 20
    subsample : float, default 1.0
        Bagging: the share of rows each tree sees (every tree when < 1).
    huber_delta : float, default 1.0
    household_id : bool, default True
        The pooled model reads the household as a categorical input.
    seed : int, default 0
    """

    objective: str = "l1"
    num_leaves: int = 31
    max_depth: int = -1
    learning_rate: float = 0.05
    n_estimators: int = 300
    min_child_samples: int = 20
    subsample: float = 1.0
    huber_delta: float = 1.0
    household_id: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.objective in ("l1", "l2", "huber"), "objective",
                f"objective must be l1, l2 or huber, got {self.objective!r}")
        require(self.num_leaves >= 2, "num_leaves", f"num_leaves must be >= 2, got {self.num_leaves}")
        require(self.learning_rate > 0, "learning_rate", f"learning_rate must be > 0, got {self.learning_rate}")
        require(self.n_estimators >= 1, "n_estimators", f"n_estimators must be >= 1, got {self.n_estimators}")
        require(0 < self.subsample <= 1, "subsample", f"subsample must be in (0, 1], got {self.subsample}")


def level_lightgbm_forecasts(train: Mapping[str, tuple[np.ndarray, np.ndarray]], predict: Mapping[str, np.ndarray],
                             params: LevelLightGBMParams = LevelLightGBMParams(), pooled: bool = True
                             ) -> dict[str, np.ndarray]:
    """LightGBM's predictions (in the target's units: ratios to the level) of each household's rows ``predict``,
    fitted on ``train`` (household -> (inputs, targets)): one model on every household's rows (``pooled``, the
    household a categorical input when ``params.household_id``) or one per household."""
    require_extra("lightgbm")
    import lightgbm as lgb

    objective = {"l1": "regression_l1", "l2": "regression", "huber": "huber"}[params.objective]
    names = sorted(train)
    code = {h: float(i) for i, h in enumerate(names)}

    def model() -> Any:
        return lgb.LGBMRegressor(objective=objective, num_leaves=params.num_leaves, max_depth=params.max_depth,
                                 learning_rate=params.learning_rate, n_estimators=params.n_estimators,
                                 min_child_samples=params.min_child_samples, subsample=params.subsample,
                                 subsample_freq=1 if params.subsample < 1 else 0, alpha=params.huber_delta,
                                 random_state=params.seed, n_jobs=1, verbose=-1, deterministic=True,
                                 force_row_wise=True)

    def with_id(household: str, x: np.ndarray) -> np.ndarray:
        if not (pooled and params.household_id):
            return x
        return np.column_stack([x, np.full(len(x), code.get(household, np.nan))])

    out: dict[str, np.ndarray] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if pooled:
            x = np.concatenate([with_id(h, train[h][0]) for h in names])
            y = np.concatenate([train[h][1] for h in names])
            fitted = model()
            extra = {"categorical_feature": [x.shape[1] - 1]} if params.household_id else {}
            fitted.fit(x, y, **extra)
            for household, rows in predict.items():
                out[household] = fitted.predict(with_id(household, rows)) if len(rows) else np.zeros(0)
            return out
        for household, rows in predict.items():
            if household not in train or not len(train[household][1]) or not len(rows):
                out[household] = np.full(len(rows), np.nan)
                continue
            fitted = model()
            fitted.fit(*train[household])
            out[household] = fitted.predict(rows)
    return out
