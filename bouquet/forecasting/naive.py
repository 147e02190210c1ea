"""Naive forecasters of a daily series, each seeing every valid day before the day it forecasts.

A household's series is one value per calendar day, NaN where the day is missing.  The forecast of day ``t``
reads ``series[:t]`` only: the actuals up to yesterday, as a utility has them each morning (one step ahead,
from actuals).  Each forecaster is the statsforecast model of the same name fitted on ``series[:t]`` and
asked for ``h = 1`` (``tests/test_naive_forecasters.py`` shows them equal to 1e-9 on series without gaps):

=========================== ======================================= =====================================
name                        forecast of day t                       statsforecast
=========================== ======================================= =====================================
``last value``              ``y[t-1]``                              ``Naive()``
``seasonal naive``          ``y[t-7]``                              ``SeasonalNaive(7)``
``window average``          mean of ``y[t-w .. t-1]``               ``WindowAverage(w)``
``window median``           median of ``y[t-w .. t-1]``             (none; MAE's optimal constant)
``seasonal window average`` mean of ``y[t-7], ..., y[t-7k]``        ``SeasonalWindowAverage(7, k)``
``historic average``        mean of every day before ``t``          ``HistoricAverage()``
``weekday average``         mean of every earlier day of t's        ``SeasonalWindowAverage(7, n)`` with
                            weekday                                 every past week
``blend``                   ``(1 - b)`` window median ``+ b``       (bouquet's; ``b`` chosen per
                            weekday average                         household on validation)
=========================== ======================================= =====================================

Missing days are skipped (a mean over the valid days of its span); where a span holds no valid day the
forecaster falls back to the weekday average, then to the historic average, so that every forecast of a day
with any history is finite.  ``w`` is :attr:`NaiveParams.window` (12 days, the forecaster's look-back),
``k`` :attr:`NaiveParams.season_windows` (4 weeks).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bouquet.params import require

__all__ = ["BLEND_WEIGHTS", "NAIVE_FORECASTERS", "NaiveParams", "blend_weight", "naive_forecasts", "weekday_history"]

#: The naive forecasters, in the order tables list them.
NAIVE_FORECASTERS = ("last value", "seasonal naive", "window average", "window median", "seasonal window average",
                     "historic average", "weekday average", "blend")
#: The weekday average's shares ``b`` the blend chooses from (0: the window median; 1: the weekday average).
BLEND_WEIGHTS = (0.0, 0.5, 1.0)


@dataclass(frozen=True)
class NaiveParams:
    """The spans of the naive forecasters.

    Parameters
    ----------
    window : int, default 12
        Days of the window average and the window median (the forecaster's look-back).
    season : int, default 7
        The season in days (a week).
    season_windows : int, default 4
        Seasons of the seasonal window average (4 weeks: the same weekday of the last four weeks).
    """

    window: int = 12
    season: int = 7
    season_windows: int = 4

    def __post_init__(self) -> None:
        require(self.window >= 1, "window", f"window must be >= 1, got {self.window}")
        require(self.season >= 1, "season", f"season must be >= 1, got {self.season}")
        require(self.season_windows >= 1, "season_windows", f"season_windows must be >= 1, got {self.season_windows}")


def _check(series: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    series = np.asarray(series, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if series.ndim != 1:
        raise ValueError(f"series must be one-dimensional (one value a day), got shape {series.shape}")
    if targets.ndim != 1:
        raise ValueError(f"targets must be one-dimensional day indices, got shape {targets.shape}")
    if len(targets) and (targets.min() < 1 or targets.max() > len(series)):
        raise ValueError(f"targets must index days 1 .. {len(series)} of the series (a forecast needs a day "
                         f"before it), got {targets.min()} .. {targets.max()}")
    return series, targets


def _span_mean(series: np.ndarray, targets: np.ndarray, lags: np.ndarray, median: bool = False) -> np.ndarray:
    """Mean (or median) over the valid days ``t - lag`` (``lag`` in ``lags``, days before the series start
    skipped) for each target ``t``; NaN where none is valid."""
    index = targets[:, None] - lags[None, :]
    inside = index >= 0
    values = np.where(inside, series[np.clip(index, 0, None)], np.nan)
    with warnings.catch_warnings():  # an all-missing span is NaN by design
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, axis=1) if median else np.nanmean(values, axis=1)


def weekday_history(series: np.ndarray, targets: np.ndarray, season: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """``(historic average, seasonal average)`` of each target: the mean of every valid day before ``t``, and
    the mean of every valid day ``t - season j`` (``j >= 1``) before it; NaN where there is none.

    Cumulative sums per phase of the season: O(days + targets)."""
    series, targets = _check(series, targets)
    valid = np.isfinite(series)
    values = np.where(valid, series, 0.0)
    # prefix sums: entry i holds the sum over days < i
    total = np.concatenate([[0.0], np.cumsum(values)])
    count = np.concatenate([[0], np.cumsum(valid)])
    with np.errstate(invalid="ignore", divide="ignore"):
        historic = np.where(count[targets] > 0, total[targets] / np.maximum(count[targets], 1), np.nan)
    seasonal = np.full(len(targets), np.nan)
    phase = np.arange(len(series)) % season
    for p in range(season):
        days = np.flatnonzero(phase == p)
        if not len(days):
            continue
        sums = np.concatenate([[0.0], np.cumsum(values[days])])
        counts = np.concatenate([[0], np.cumsum(valid[days])])
        mine = targets % season == p
        # days of this phase strictly before t: how many of `days` are < t
        before = np.searchsorted(days, targets[mine], side="left")
        with np.errstate(invalid="ignore", divide="ignore"):
            seasonal[mine] = np.where(counts[before] > 0, sums[before] / np.maximum(counts[before], 1), np.nan)
    return historic, seasonal


def naive_forecasts(series: Sequence[float] | np.ndarray, targets: Sequence[int] | np.ndarray,
                    params: NaiveParams = NaiveParams(), blend: float | None = None) -> dict[str, np.ndarray]:
    """Each naive forecaster's forecast of the days ``targets`` of ``series`` (see the module's table).

    Parameters
    ----------
    series : array, shape (days,)
        One value a day, NaN where missing.  Any unit (litres, or scaled: every forecaster here commutes with
        an increasing affine map).
    targets : int array, shape (n,)
        Day indices into ``series`` (``1 <= t <= days``; ``t = days`` forecasts the day after the series).
    params : NaiveParams
    blend : float, optional
        The blend's weekday-average share ``b`` (:func:`blend_weight`); without it there is no ``blend``.

    Returns
    -------
    dict
        name -> forecasts, shape (n,), float64, in :data:`NAIVE_FORECASTS` order.  A forecast whose own span
        has no valid day falls back to the weekday average, then to the historic average; NaN only where no
        day before ``t`` is valid.
    """
    series, targets = _check(series, targets)
    historic, weekday = weekday_history(series, targets, params.season)
    fallback = np.where(np.isfinite(weekday), weekday, historic)
    window = np.arange(1, params.window + 1)
    seasonal = params.season * np.arange(1, params.season_windows + 1)
    raw = {
        "last value": _span_mean(series, targets, np.array([1])),
        "seasonal naive": _span_mean(series, targets, np.array([params.season])),
        "window average": _span_mean(series, targets, window),
        "window median": _span_mean(series, targets, window, median=True),
        "seasonal window average": _span_mean(series, targets, seasonal),
        "historic average": historic,
        "weekday average": weekday,
    }
    out = {name: np.where(np.isfinite(value), value, fallback) if name != "historic average" else value
           for name, value in raw.items()}
    if blend is not None:
        if not 0 <= blend <= 1:
            raise ValueError(f"blend must be in [0, 1], got {blend}")
        out["blend"] = (1 - blend) * out["window median"] + blend * out["weekday average"]
    return out


def blend_weight(series: Sequence[float] | np.ndarray, targets: Sequence[int] | np.ndarray,
                 params: NaiveParams = NaiveParams(), weights: Sequence[float] = BLEND_WEIGHTS) -> float:
    """The blend's share ``b`` of ``weights`` whose forecasts of the days ``targets`` (a household's validation
    days) have the lowest MAE against their actuals (the first of equals).

    Raises
    ------
    ValueError
        No target day with a valid actual.
    """
    series, targets = _check(series, targets)
    actual = series[targets] if len(targets) and targets.max() < len(series) else np.full(len(targets), np.nan)
    forecasts = naive_forecasts(series, targets, params)
    keep = np.isfinite(actual) & np.isfinite(forecasts["window median"]) & np.isfinite(forecasts["weekday average"])
    if not keep.any():
        raise ValueError("no validation day with an actual and a forecast to choose the blend on")
    median, weekday, actual = forecasts["window median"][keep], forecasts["weekday average"][keep], actual[keep]
    errors = [float(np.mean(np.abs((1 - b) * median + b * weekday - actual))) for b in weights]
    return float(weights[int(np.argmin(errors))])
