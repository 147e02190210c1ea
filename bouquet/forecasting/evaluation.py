"""Comparing forecasters the way the field does: MASE, households as the replicate, and the Diebold-Mariano test.

* :func:`mase_scale`: the in-sample MAE of the seasonal naive forecaster (season 7) over the days before the
  origin, the denominator of MASE (Hyndman and Koehler 2006); utilsforecast's ``mase`` divides by the same
  number.
* :func:`household_bootstrap`: a paired bootstrap over households.  Each household keeps every one of its
  origins together (a household is the unit that would change with other data); the two forecasters'
  errors are resampled together (paired).  Returns the relative difference of mean MAE and its percentile
  interval.
* :func:`diebold_mariano`: the Diebold-Mariano test of equal absolute error for one household's one-step
  forecasts, with the small-sample correction of Harvey, Leybourne and Newbold (1997) and a Student t
  reference (for ``h = 1`` the loss differential's variance has no autocovariance terms).

Pure numpy and scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["BootstrapInterval", "DMResult", "diebold_mariano", "dm_shares", "household_bootstrap", "mase_scale"]


def mase_scale(series: Sequence[float] | np.ndarray, before: int, season: int = 7) -> float:
    """Mean ``|y[t] - y[t - season]|`` over the days ``t < before`` where both are valid (the seasonal naive
    forecaster's in-sample MAE); NaN where no pair is valid."""
    series = np.asarray(series, dtype=np.float64)[:before]
    if len(series) <= season:
        return math.nan
    diff = np.abs(series[season:] - series[:-season])
    diff = diff[np.isfinite(diff)]
    return float(diff.mean()) if len(diff) else math.nan


@dataclass(frozen=True)
class BootstrapInterval:
    """``1 - mean(a) / mean(b)`` (the relative MAE gain of ``a`` over ``b``; positive: ``a`` is better) and the
    difference ``mean(a) - mean(b)``, each with its percentile interval over ``resamples`` resamples of
    ``households`` households."""

    gain: float
    gain_low: float
    gain_high: float
    difference: float
    difference_low: float
    difference_high: float
    households: int
    resamples: int

    @property
    def excludes_zero(self) -> bool:
        return self.gain_low > 0 or self.gain_high < 0

    def text(self) -> str:
        """``+5.1 % [+3.2, +7.0]``."""
        return f"{100 * self.gain:+.1f} % [{100 * self.gain_low:+.1f}, {100 * self.gain_high:+.1f}]"


def household_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                        households: Sequence[object] | np.ndarray, resamples: int = 2000, level: float = 0.95,
                        seed: int = 0) -> BootstrapInterval:
    """Paired bootstrap of two forecasters' errors over households.

    Parameters
    ----------
    a, b : array, shape (n,)
        The two forecasters' MAE per unit (a household at an origin, or a household), the same units in the
        same order.
    households : array, shape (n,)
        The household of each unit: a resample draws households with replacement and takes every unit of each.
    resamples : int, default 2000
    level : float, default 0.95
    seed : int, default 0
        ``numpy.random.default_rng(seed)`` draws the resamples: same inputs, same interval.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    households = np.asarray(households)
    if not a.shape == b.shape == households.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"need equally long non-empty a, b and households, got {a.shape}, {b.shape}, "
                         f"{households.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a and b must be finite (drop the units a forecaster could not score first)")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    names, unit = np.unique(households, return_inverse=True)
    k = len(names)
    sum_a = np.bincount(unit, weights=a, minlength=k)
    sum_b = np.bincount(unit, weights=b, minlength=k)
    count = np.bincount(unit, minlength=k).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, k, size=(resamples, k))
    times = np.stack([np.bincount(row, minlength=k) for row in draws]).astype(np.float64)  # households drawn
    mean_a = times @ sum_a / (times @ count)
    mean_b = times @ sum_b / (times @ count)
    gains = 1 - mean_a / mean_b
    diffs = mean_a - mean_b
    tail = (1 - level) / 2 * 100
    g_low, g_high = np.percentile(gains, [tail, 100 - tail])
    d_low, d_high = np.percentile(diffs, [tail, 100 - tail])
    return BootstrapInterval(float(1 - a.mean() / b.mean()), float(g_low), float(g_high), float(a.mean() - b.mean()),
                             float(d_low), float(d_high), k, resamples)


@dataclass(frozen=True)
class DMResult:
    """The Diebold-Mariano statistic (HLN-corrected), its two-sided p-value, the mean loss differential
    ``mean(|e_a| - |e_b|)`` (negative: ``a`` is better) and the days it rests on."""

    statistic: float
    p_value: float
    mean_difference: float
    days: int


def diebold_mariano(errors_a: Sequence[float] | np.ndarray, errors_b: Sequence[float] | np.ndarray,
                    horizon: int = 1) -> DMResult:
    """The Diebold-Mariano test of equal mean absolute error of two forecasters on the same days.

    ``d_t = |e_a,t| - |e_b,t|``; ``DM = mean(d) / sqrt(V / n)`` with ``V`` the autocovariances of ``d`` up to lag
    ``horizon - 1`` (lag 0 only for one-step forecasts), times the HLN factor
    ``sqrt((n + 1 - 2h + h(h - 1) / n) / n)``, against Student t with ``n - 1`` degrees of freedom.  Days where
    either error is missing are left out.  With fewer than 3 days, or a differential that never varies, the
    p-value is 1 where the mean differential is 0 and 0 otherwise (NaN statistic).
    """
    a, b = np.asarray(errors_a, dtype=np.float64), np.asarray(errors_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need equally long one-dimensional errors, got {a.shape} and {b.shape}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    keep = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a[keep]) - np.abs(b[keep])
    n = len(d)
    mean = float(d.mean()) if n else math.nan
    if n < 3:
        return DMResult(math.nan, 1.0 if n == 0 or mean == 0 else math.nan, mean, n)
    centred = d - mean
    variance = float(centred @ centred / n)
    for lag in range(1, horizon):
        variance += 2 * float(centred[lag:] @ centred[:-lag] / n)
    if variance <= 0:
        return DMResult(math.nan, 1.0 if mean == 0 else 0.0, mean, n)
    statistic = mean / math.sqrt(variance / n)
    statistic *= math.sqrt((n + 1 - 2 * horizon + horizon * (horizon - 1) / n) / n)
    p_value = float(2 * stats.t.sf(abs(statistic), n - 1))
    return DMResult(float(statistic), p_value, mean, n)


def dm_shares(results: Sequence[DMResult], alpha: float = 0.05) -> dict[str, float]:
    """The shares of households whose test says ``a`` is significantly better (``p < alpha`` and a negative mean
    differential), significantly worse, or neither; households with no usable days are left out."""
    usable = [r for r in results if r.days > 0 and not math.isnan(r.p_value)]
    if not usable:
        return {"better": math.nan, "worse": math.nan, "neither": math.nan, "households": 0}
    better = sum(r.p_value < alpha and r.mean_difference < 0 for r in usable)
    worse = sum(r.p_value < alpha and r.mean_difference > 0 for r in usable)
    n = len(usable)
    return {"better": better / n, "worse": worse / n, "neither": (n - better - worse) / n, "households": n}
