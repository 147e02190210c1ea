"""What a forecaster of daily household use knows the morning of each day: the inputs of the tree forecasters.

Every input of target day ``t`` reads the household's days before ``t`` only (and the calendar), as a utility
has them each morning.  Values are divided by the household's *level*, the mean of its valid days among the
``level_days`` before ``t`` (the expanding mean where fewer than :data:`MIN_LEVEL_DAYS` of them are valid;
never below ``level_floor`` L/day), and so is the target: a model pooled over households of 80 and 800 L/day
learns one shape of the week, and a forecast is the predicted ratio times the level.  This is the scaled target
and input set of a competent pooled LightGBM on the DAIAD meters (L1 objective, lags, rolling statistics, the
household's weekday profile, holidays).

========================= =====================================================================================
input                     of target day ``t`` (each value divided by the level)
========================= =====================================================================================
``lag-k``                 use on day ``t - k``, k in 1 .. 14, 21, 28 (NaN where missing)
``mean-w``                mean of the valid days among the ``w`` before ``t`` (w = 7, 14)
``median-w``              their median (w = 7, 14, 28)
``std-28``, ``min-7``,    standard deviation of the 28 days before ``t``; minimum and maximum of the 7
``max-7``
``expanding-mean``        mean of every valid day before ``t``
``weekday-mean``          mean of every valid day before ``t`` on ``t``'s weekday
``log-level``             the natural log of the level itself (L/day): the household's size
``valid-28``              the share of the 28 days before ``t`` with a reading
``weekday``               Monday 0 .. Sunday 6
``day-of-month``          1 .. 31
``holiday``,              ``t``, ``t - 1`` and ``t + 1`` are public holidays (``holidays``: the country and
``holiday-before``,       subdivision whose holidays count; Spain's Valencian Community, the DAIAD trial's, by
``holiday-after``         default), read from the ``holidays`` package's offline tables
``christmas``             ``t`` falls between 24 December and 6 January
========================= =====================================================================================

Missing inputs stay NaN: a tree sends them down the branch its training chose for them.  Pure numpy (the
holiday tables come from the ``holidays`` package, imported when a calendar is asked for).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.forecasting.naive import weekday_history
from bouquet.params import RunConfigKeys, require

__all__ = ["FEATURE_NAMES", "GRID_POINTS", "LAGS", "MIN_LEVEL_DAYS", "FeatureParams", "Features", "daily_features",
           "feature_grid", "holiday_days"]

#: The lags of the day's use (days before the target).
LAGS = (*range(1, 15), 21, 28)
#: The fewest valid days among the ``level_days`` before ``t`` for their mean to be the level.
MIN_LEVEL_DAYS = 7
#: The look-back of the rolling statistics and the longest lag (days).
HORIZON_DAYS = 28
#: The inputs, in column order.
FEATURE_NAMES = (
    *[f"lag-{k}" for k in LAGS],
    "mean-7", "mean-14", "median-7", "median-14", "median-28", "std-28", "min-7", "max-7",
    "expanding-mean", "weekday-mean", "log-level", "valid-28",
    "weekday", "day-of-month", "holiday", "holiday-before", "holiday-after", "christmas",
)


@dataclass(frozen=True)
class FeatureParams:
    """The tree forecasters' inputs (``tree-*`` run-config keys).

    Parameters
    ----------
    level_days : int, default 28
        ``tree-level-days``: the days before ``t`` whose mean is the household's level, which scales the
        target and every value input (at least 7, at most 28).
    level_floor : float, default 10.0
        ``tree-level-floor``: the smallest level in L/day (a house left empty has a level near 0, and its
        ratios would explode).
    holidays : str, default "ES-VC"
        ``tree-holidays``: whose public holidays the calendar inputs mark: a country code of the ``holidays``
        package, optionally with a subdivision (``ES-VC``: Spain and the Valencian Community), or ``none``
        (the holiday inputs are then 0).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="tree-")

    level_days: int = 28
    level_floor: float = 10.0
    holidays: str = "ES-VC"

    def __post_init__(self) -> None:
        require(MIN_LEVEL_DAYS <= self.level_days <= HORIZON_DAYS, "level_days",
                f"tree-level-days must be in {MIN_LEVEL_DAYS} .. {HORIZON_DAYS}, got {self.level_days}")
        require(self.level_floor > 0, "level_floor", f"tree-level-floor must be > 0 L/day, got {self.level_floor}")
        spec = self.holidays.strip()
        require(spec == self.holidays and bool(spec), "holidays",
                f"tree-holidays must be 'none' or a country code such as 'ES' or 'ES-VC', got {self.holidays!r}")
        if spec != "none":
            country, _, subdivision = spec.partition("-")
            require(country.isalpha() and country.isupper() and len(country) in (2, 3), "holidays",
                    f"tree-holidays must be 'none' or a country code such as 'ES' or 'ES-VC', got {spec!r}")
            _check_holiday_spec(country, subdivision)


def _check_holiday_spec(country: str, subdivision: str) -> None:
    try:
        import holidays
    except ImportError as error:  # the app extra installs it
        raise ImportError("the tree forecasters' holiday inputs need the holidays package: pip install "
                          "'bouquet-fl[app]' (or tree-holidays = \"none\")") from error
    supported = holidays.list_supported_countries()
    require(country in supported, "holidays", f"tree-holidays: the holidays package knows no country {country!r}")
    if subdivision:
        require(subdivision in supported[country], "holidays",
                f"tree-holidays: {country} has no subdivision {subdivision!r} in the holidays package "
                f"(it has {', '.join(supported[country])})")


@functools.lru_cache(maxsize=32)
def _holiday_numbers(spec: str, first_year: int, last_year: int) -> frozenset[int]:
    import holidays

    country, _, subdivision = spec.partition("-")
    table = holidays.country_holidays(country, subdiv=subdivision or None, years=range(first_year, last_year + 1))
    return frozenset(int(np.datetime64(day, "D").astype(np.int64)) for day in table)


def holiday_days(spec: str, days: np.ndarray) -> np.ndarray:
    """Whether each of ``days`` (``datetime64[D]``) is a public holiday of ``spec`` (``ES-VC``; ``none``: none is).
    """
    days = np.asarray(days).astype("datetime64[D]")
    if spec == "none" or not days.size:
        return np.zeros(days.shape, dtype=bool)
    years = days.astype("datetime64[Y]").astype(np.int64) + 1970
    table = _holiday_numbers(spec, int(years.min()), int(years.max()))
    return np.isin(days.astype(np.int64), np.fromiter(table, dtype=np.int64, count=len(table)))


@dataclass(frozen=True)
class Features:
    """The inputs of a household's target days: ``x`` (n, len(:data:`FEATURE_NAMES`)), float64, NaN where missing,
    and ``level`` (n,) in L/day (target = litres / level; forecast = prediction x level)."""

    x: np.ndarray
    level: np.ndarray

    def scaled(self, litres: np.ndarray) -> np.ndarray:
        """``litres`` as the ratio to each row's level (the trees' target)."""
        return np.asarray(litres, dtype=np.float64) / self.level

    def litres(self, ratio: np.ndarray) -> np.ndarray:
        """Predicted ratios as L/day (clipped at 0: no household uses negative water)."""
        return np.maximum(np.asarray(ratio, dtype=np.float64) * self.level, 0.0)


def daily_features(series: Sequence[float] | np.ndarray, first_day: np.datetime64, targets: Sequence[int] | np.ndarray,
                   params: FeatureParams = FeatureParams()) -> Features:
    """The inputs (:data:`FEATURE_NAMES`) of the days ``targets`` of a household's daily series.

    Parameters
    ----------
    series : array, shape (days,)
        Litres per day from ``first_day``, NaN where missing.
    first_day : numpy.datetime64
    targets : int array, shape (n,)
        Day indices, ``1 <= t <= days`` (``t = days`` is the day after the series: tomorrow); each row reads
        ``series[:t]`` only.
    params : FeatureParams

    Returns
    -------
    Features
        A row per target; the level is NaN only where no day before ``t`` is valid.
    """
    series = np.asarray(series, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if series.ndim != 1 or targets.ndim != 1:
        raise ValueError(f"need a one-dimensional series and targets, got shapes {series.shape} and {targets.shape}")
    if len(targets) and (targets.min() < 1 or targets.max() > len(series)):
        raise ValueError(f"targets must index days 1 .. {len(series)} of the series (a forecast needs a day "
                         f"before it), got {targets.min()} .. {targets.max()}")
    padded = np.concatenate([np.full(HORIZON_DAYS, np.nan), series])
    # past[:, k - 1] is day t - k
    past = padded[targets[:, None] + HORIZON_DAYS - np.arange(1, HORIZON_DAYS + 1)[None, :]]
    valid = np.isfinite(past)
    historic, weekday_mean = weekday_history(series, targets) if len(targets) else (np.zeros(0), np.zeros(0))
    with warnings.catch_warnings():  # an all-missing span is NaN by design
        warnings.simplefilter("ignore", RuntimeWarning)
        recent = past[:, :params.level_days]
        level = np.where(np.isfinite(recent).sum(axis=1) >= MIN_LEVEL_DAYS, np.nanmean(recent, axis=1), historic)
        level = np.where(np.isfinite(level), np.maximum(level, params.level_floor), np.nan)
        columns = [past[:, k - 1] for k in LAGS]
        columns += [np.nanmean(past[:, :7], axis=1), np.nanmean(past[:, :14], axis=1),
                    np.nanmedian(past[:, :7], axis=1), np.nanmedian(past[:, :14], axis=1),
                    np.nanmedian(past, axis=1), np.nanstd(past, axis=1, ddof=1),
                    np.nanmin(np.where(valid[:, :7], past[:, :7], np.inf), axis=1),
                    np.nanmax(np.where(valid[:, :7], past[:, :7], -np.inf), axis=1),
                    historic, weekday_mean]
    values = np.stack(columns, axis=1) if len(targets) else np.zeros((0, len(columns)))
    values[~np.isfinite(values)] = np.nan  # spans with no valid day (the min / max of nothing is +-inf)
    values = values / level[:, None]
    days = np.datetime64(first_day, "D") + targets
    months = days.astype("datetime64[M]").astype(np.int64) % 12 + 1
    day_of_month = (days - days.astype("datetime64[M]")).astype(np.int64) + 1
    holiday = [holiday_days(params.holidays, days + shift) for shift in (0, -1, 1)]
    christmas = ((months == 12) & (day_of_month >= 24)) | ((months == 1) & (day_of_month <= 6))
    calendar = np.stack([np.log(level), valid.mean(axis=1), (days.astype(np.int64) + 3) % 7, day_of_month,
                         *holiday, christmas], axis=1).astype(np.float64)
    return Features(np.concatenate([values, calendar], axis=1), level)


#: Bins of each input's fine grid (:func:`feature_grid`).
GRID_POINTS = 1024
#: The largest level (L/day) the log-level grid spans.
MAX_LEVEL = 5000.0


def feature_grid(params: FeatureParams = FeatureParams(), points: int = GRID_POINTS) -> np.ndarray:
    """A fixed fine grid for each input (F, points + 1 edges), known to every node and the server before any data:
    ratios to the level over [0, 6], their standard deviation over [0, 4], the log level over [log floor, log
    5000], shares over [0, 1], the weekday over [0, 7), the day of the month over [1, 32), the flags over
    [0, 1]; values beyond count in the end bins.  The tree fit's ``tree-bins = "grid"`` places its bins at the
    pool's quantiles read off the summed counts on it, so no household's own quantiles are sent."""
    ranges = []
    for name in FEATURE_NAMES:
        if name == "std-28":
            ranges.append((0.0, 4.0))
        elif name == "log-level":
            ranges.append((float(np.log(params.level_floor)), float(np.log(MAX_LEVEL))))
        elif name == "valid-28" or name.startswith("holiday") or name == "christmas":
            ranges.append((0.0, 1.0 + 1e-9))
        elif name == "weekday":
            ranges.append((0.0, 7.0))
        elif name == "day-of-month":
            ranges.append((1.0, 32.0))
        else:
            ranges.append((0.0, 6.0))
    return np.stack([np.linspace(low, high, points + 1) for low, high in ranges])
