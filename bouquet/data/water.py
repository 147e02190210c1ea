"""The HK paper's water-data preprocessing (Section 5), as parameters.

Pipeline: households (real DAIAD file or synthetic) -> daily litres (24-hour
non-overlapping sums; missing days stay NaN) -> active-client filter
(mean >= ``active_factor`` x the mean over all households, eq. 17) ->
minimum-history filter -> look-back windows of ``lookback`` days with a
one-step-ahead target -> chronological train/test split of the windows ->
scaler fitted on the training days only.

The federated pool is the households that pass every filter, sorted by
household id (a DAIAD pool with a non-zero ``data-seed``: in that seed's shuffled order);
``partition-id`` ``k`` is the ``k``-th household of the pool, in simulation and in deployment alike.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from bouquet.data.daiad import CleaningParams, clean_to_daily, read_daiad
from bouquet.data.meters import read_meters
from bouquet.data.synthetic import SyntheticParams, generate_population
from bouquet.params import RunConfigKeys, require

__all__ = [
    "ClientWindows",
    "HouseholdDaily",
    "InsufficientDataError",
    "Layout",
    "TestPeriodLocked",
    "WaterDataParams",
    "WaterPool",
    "build_pool",
    "fit_scaler",
    "forget_pools",
    "global_scaler",
    "history_profile",
    "layout_problem",
    "load_pool",
    "make_windows",
    "select_pool",
    "split_layout",
    "weekday_inputs",
    "weekday_of",
    "weekday_profile",
    "window_inputs",
]

log = logging.getLogger(__name__)
SCALERS = ("minmax", "zscore", "robust")
#: Inputs besides the day's use in each look-back step (``WaterDataParams.calendar``).
CALENDAR_INPUTS = ("none", "weekday")
#: What each look-back step may carry about the household's own training days (``WaterDataParams.household``).
HOUSEHOLD_INPUTS = ("none", "profile")
SOURCES = ("synthetic", "daiad", "csv")
#: How a household's days are split into fit, validation and test days (``WaterDataParams.split``).
SPLITS = ("fraction", "origins")
#: What the ``y`` column of a ``data-source = "csv"`` file holds (``WaterDataParams.csv_values``).
CSV_VALUES = ("volume", "reading")
#: The fewest validation and test windows a household needs at every origin of ``split = "origins"``.
MIN_HELD_WINDOWS = 7
#: Whose training days the scaler is fitted on (``WaterDataParams.scaling``).
SCALINGS = ("household", "global")


class InsufficientDataError(ValueError):
    """A household has too little usable data for the requested windows."""


@dataclass(frozen=True)
class HouseholdDaily:
    """Daily litres of one household; ``litres[k]`` is day ``first_day + k`` (NaN = missing).

    ``group`` is the household's known type in a benchmark with known groups (else empty).
    """

    household_id: str
    first_day: np.datetime64
    litres: np.ndarray
    group: str = ""

    @property
    def valid_days(self) -> int:
        return int(np.isfinite(self.litres).sum())

    @property
    def history_days(self) -> int:
        """Days from the first to the last valid day, inclusive."""
        valid = np.flatnonzero(np.isfinite(self.litres))
        return int(valid[-1] - valid[0] + 1) if valid.size else 0


@dataclass(frozen=True)
class WaterDataParams:
    """Everything that determines the federated water pool.

    Parameters
    ----------
    source : {"synthetic", "daiad", "csv"}
        ``synthetic`` needs no file; ``daiad`` reads ``path``, a DAIAD trial file; ``csv`` reads ``path`` in the
        forecasting field's long format (``unique_id, ds, y``: :mod:`bouquet.data.meters`).
    path : str
        DAIAD ``.csv`` or ``.zip`` (``source = "daiad"``), or a long-format ``.csv`` (``source = "csv"``).
    csv_values : {"volume", "reading"}, default "volume"
        ``csv-values``: what ``y`` holds in a ``csv`` file: the litres used in the period that ends at ``ds``
        (one row a day: the day's use), or the meter's cumulative reading at ``ds``.
    synthetic : SyntheticParams
        The generator of ``source = "synthetic"``; its ``seed`` (``data-seed``) also orders a DAIAD pool:
        0 keeps the households in id order, another value shuffles which household is which partition id
        (a study's data seed on a fixed file).
    cleaning : CleaningParams
    active_factor : float, default 1.6
        Keep households whose mean consumption is at least this multiple of
        the mean over all households (paper eq. 17: "exceeds the global
        average by at least 60%").  0 disables the filter.
    min_history_days : int, default 730
        Keep households whose valid days span at least this many days (paper:
        two years).  The 92-household DAIAD file spans one year: use <= 365.
    lookback : int, default 12
        Look-back window L in days.
    split : {"fraction", "origins"}, default "fraction"
        How a household's windows are split.  ``fraction`` is the paper's: the first ``train_fraction`` of its
        windows train (the last ``validation_fraction`` of those validate), the rest test.  ``origins`` is the
        forecasting field's rolling origin: the last ``origins x origin_days`` days of each household's series
        are ``origins`` consecutive test blocks; a run forecasts block ``origin`` (0: the earliest) one day at a
        time from the actuals before each day, trained on every day before the block (an expanding window)
        but the last ``validation_days``, which validate (:func:`split_layout`).
    origins : int, default 3
        Test blocks at the end of each household's series (``split = "origins"``).
    origin : int, default 0
        The block this run forecasts, 0 .. ``origins - 1`` (0: the earliest; every choice of a study is made on
        the validation days before it, the design period).
    origin_days : int, default 28
        Days in each test block.
    validation_days : int, default 56
        Days before the block's first day whose windows validate (``split = "origins"``).
    score_test : bool, default True
        ``score-test``.  False locks the test period: the windows hold no test window and the household's
        series ends before the first test day, so nothing of the test days reaches the node (a study's tuning
        runs and every probe; :class:`TestPeriodLocked`).
    train_fraction : float, default 0.8
        Chronological share of each household's windows used for training; the rest are the test windows
        (``split = "fraction"``).
    validation_fraction : float, default 0.0
        ``validation-fraction``: the share of each household's training windows, the last ones in time, held
        out as validation windows (at least one when > 0).  The test windows do not change.  Every choice of
        a study (hyper-parameters, presets, which naive forecaster to beat) is made on them; the scaler and
        the household profile inputs are fitted on the remaining (fit) days only, so nothing of the
        validation or test days reaches the model's inputs.  0 is the paper's: training uses every training
        window.  At most 0.5.
    min_windows : int, default 10
        Households with fewer complete windows are left out of the pool (the
        log names each one with its count).
    scaler : {"minmax", "zscore", "robust"}, default "minmax"
        Per-household normalisation fitted on the training days only: ``minmax`` (the paper's; one spiky
        day sets the scale), ``zscore`` (mean / standard deviation) or ``robust`` (median /
        interquartile range, which a few spikes do not move).
    calendar : {"none", "weekday"}, default "none"
        ``calendar-inputs``.  ``none`` is the paper's: each look-back step is the day's scaled use.
        ``weekday`` adds two inputs to each step, the sine and cosine of ``2 pi w / 7`` where ``w``
        (Monday 0 ... Sunday 6) is the weekday of the day after that step, so the last step carries
        the target's weekday (:func:`weekday_inputs`).
    scaling : {"household", "global"}, default "household"
        Whose training days the scaler is fitted on.  ``household`` is the paper's: each household's own,
        so every series spans [0, 1] (min-max) and the level differences between households are gone.
        ``global``: one scaler fitted on the training days of every household in the pool, so a
        household's level stays in its inputs and targets, which coalitions could group by.  It needs
        the pool: a node holding one household cannot fit it (refused).  In a deployment the same
        numbers would take one federated query (min and max, or sums and sums of squares; the robust
        scaler's percentiles do not decompose); the simulation reads them from the pool.
    household : {"none", "profile"}, default "none"
        ``household-inputs``.  ``none`` is the paper's.  ``profile`` adds two inputs to each step, both
        from the household's training targets only (scaled): their mean, and their mean on the weekday of
        the day after that step (:func:`weekday_profile`).  A model shared by every household then knows
        each one's usual level and week, which a 12-day window shows only noisily.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"source": "data-source", "path": "data-path", "calendar": "calendar-inputs",
                "household": "household-inputs"},
        skip=("synthetic", "cleaning"),
        nested={"synthetic-households": ("synthetic", "n_households"),
                "synthetic-types": ("synthetic", "household_types"), "data-seed": ("synthetic", "seed"),
                "max-flow-litres-per-hour": ("cleaning", "max_flow_litres_per_hour"),
                "max-spread-hours": ("cleaning", "max_spread_hours"),
                "min-hours-per-day": ("cleaning", "min_hours_per_day")},
    )

    source: str = "synthetic"
    path: str = ""
    csv_values: str = "volume"
    synthetic: SyntheticParams = field(default_factory=SyntheticParams)
    cleaning: CleaningParams = field(default_factory=CleaningParams)
    active_factor: float = 1.6
    min_history_days: int = 730
    lookback: int = 12
    split: str = "fraction"
    origins: int = 3
    origin: int = 0
    origin_days: int = 28
    validation_days: int = 56
    score_test: bool = True
    train_fraction: float = 0.8
    validation_fraction: float = 0.0
    min_windows: int = 10
    scaler: str = "minmax"
    calendar: str = "none"
    household: str = "none"
    scaling: str = "household"

    def __post_init__(self) -> None:
        require(self.source in SOURCES, "source", f"data source must be one of {SOURCES}, got {self.source!r}")
        require(self.csv_values in CSV_VALUES, "csv_values",
                f"csv-values must be one of {', '.join(CSV_VALUES)}, got {self.csv_values!r}")
        require(self.split in SPLITS, "split", f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        require(self.origins >= 1, "origins", f"origins must be >= 1, got {self.origins}")
        require(0 <= self.origin < self.origins, "origin",
                f"origin must be in 0 .. origins - 1 = {self.origins - 1}, got {self.origin}")
        require(self.origin_days >= 1, "origin_days", f"origin-days must be >= 1, got {self.origin_days}")
        require(self.validation_days >= 0, "validation_days", f"validation-days must be >= 0, got {self.validation_days}")
        require(self.scaler in SCALERS, "scaler", f"scaler must be one of {SCALERS}, got {self.scaler!r}")
        require(self.scaling in SCALINGS, "scaling", f"scaling must be one of {SCALINGS}, got {self.scaling!r}")
        require(self.calendar in CALENDAR_INPUTS, "calendar",
                f"calendar-inputs must be one of {', '.join(CALENDAR_INPUTS)}, got {self.calendar!r}")
        require(self.household in HOUSEHOLD_INPUTS, "household",
                f"household-inputs must be one of {', '.join(HOUSEHOLD_INPUTS)}, got {self.household!r}")
        require(self.lookback >= 1, "lookback", f"lookback must be >= 1, got {self.lookback}")
        require(0 < self.train_fraction < 1, "train_fraction",
                f"train_fraction must be in (0, 1), got {self.train_fraction}")
        require(0 <= self.validation_fraction <= 0.5, "validation_fraction",
                f"validation-fraction must be in [0, 0.5], got {self.validation_fraction}")
        require(self.active_factor >= 0, "active_factor", f"active_factor must be >= 0, got {self.active_factor}")
        require(self.min_history_days >= 0, "min_history_days",
                f"min_history_days must be >= 0, got {self.min_history_days}")
        require(self.min_windows >= 2, "min_windows",
                f"min_windows must be >= 2 (one train and one test window), got {self.min_windows}")

    @property
    def input_channels(self) -> int:
        """Inputs per look-back step of the windows this config makes (the forecaster's input size)."""
        return 1 + (2 if self.calendar == "weekday" else 0) + (2 if self.household == "profile" else 0)

    @property
    def has_validation(self) -> bool:
        """Whether the windows this config makes hold validation windows."""
        return self.validation_fraction > 0 if self.split == "fraction" else self.validation_days > 0

    def require_path(self) -> None:
        """Raise ValueError when the source needs a file and none is named (deployment names one per node)."""
        if self.source != "synthetic" and not self.path:
            raise ValueError(f"data source {self.source!r} needs a data path (run config 'data-path' or node config)")

    def cache_key(self) -> str:
        """Stable hash of every field, of the pipeline's source code, and of the data file's size and mtime.

        Hashing the source of the data modules means a cached pool is never
        served after the generator or the cleaning rules changed.
        """
        payload = asdict(self)
        payload["code"] = _pipeline_source_hash()
        if self.source != "synthetic":
            stat = Path(self.path).stat()
            payload["file"] = [str(Path(self.path).resolve()), stat.st_size, stat.st_mtime_ns]
        else:
            payload["path"] = ""
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _pipeline_source_hash() -> str:
    from bouquet.data import daiad, meters, synthetic

    digest = hashlib.sha256()
    for module_file in (daiad.__file__, synthetic.__file__, meters.__file__, __file__):
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()


class TestPeriodLocked(RuntimeError):
    """The test period was asked for where it is locked (``score-test = false``: a study's tuning, a probe)."""

    __test__ = False  # not a pytest test class, whatever its name


@dataclass(frozen=True)
class ClientWindows:
    """Supervised windows of one household, scaled, and the household's daily series they come from.

    Attributes
    ----------
    x_train, x_test : numpy.ndarray, shape (n, lookback, channels), float32
        Channel 0 is the scaled use of each look-back day; calendar and household inputs follow
        (:attr:`WaterDataParams.input_channels`).  With a validation split, ``x_train`` holds the fit
        windows only (the training windows before the validation ones).
    y_train, y_test : numpy.ndarray, shape (n,), float32
    test_days : numpy.ndarray of datetime64[D], shape (n_test,)
        Calendar day of each test target.
    offset, scale : float
        ``litres = scaled * scale + offset``.
    train_days : numpy.ndarray of datetime64[D], shape (n_train,), optional
        Calendar day of each training target.
    x_val, y_val, val_days : numpy.ndarray, optional
        The validation windows, between the fit and the test windows in time; ``None`` without a validation
        split.
    series : numpy.ndarray, shape (days,), float64, optional
        The household's scaled daily use from ``first_day`` to the last day this node may see (NaN where a
        day is missing): the test block's last day, or, with the test period locked, the day before its first.
        The naive forecasters read it (every valid day before the day they forecast).
    first_day : numpy.datetime64, optional
    test_locked : bool
        The test period is locked (``score-test = false``): the test arrays are empty and reading them raises
        :class:`TestPeriodLocked`.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    test_days: np.ndarray
    offset: float
    scale: float
    train_days: np.ndarray | None = None
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    val_days: np.ndarray | None = None
    series: np.ndarray | None = None
    first_day: np.datetime64 | None = None
    test_locked: bool = False

    @property
    def has_validation(self) -> bool:
        """Whether the windows hold a validation split."""
        return self.y_val is not None and len(self.y_val) > 0

    def to_litres(self, scaled: np.ndarray) -> np.ndarray:
        """Invert the scaler."""
        return np.asarray(scaled, dtype=np.float64) * self.scale + self.offset

    def to_scaled(self, litres: np.ndarray) -> np.ndarray:
        """Apply the scaler."""
        return (np.asarray(litres, dtype=np.float64) - self.offset) / self.scale

    def day_index(self, days: np.ndarray) -> np.ndarray:
        """Positions of ``days`` in :attr:`series`."""
        if self.first_day is None:
            raise ValueError("these windows carry no daily series (built without first_day)")
        return (np.asarray(days).astype("datetime64[D]") - np.datetime64(self.first_day, "D")).astype(np.int64)

    def require_test(self) -> None:
        """Raise :class:`TestPeriodLocked` when the test period is locked."""
        if self.test_locked:
            raise TestPeriodLocked("the test period is locked (score-test = false): this run scores validation "
                                   "days only; a study scores test days once, through its final evaluation")


def _complete_windows(litres: np.ndarray, lookback: int) -> np.ndarray:
    """Indices ``t`` such that days ``t - lookback .. t`` are all valid (``t`` = target day)."""
    valid = np.isfinite(litres).astype(np.int64)
    if len(litres) <= lookback:
        return np.empty(0, dtype=np.int64)
    run = np.convolve(valid, np.ones(lookback + 1, dtype=np.int64), mode="valid")
    return np.flatnonzero(run == lookback + 1) + lookback


def weekday_of(days: np.ndarray) -> np.ndarray:
    """Weekday of each day, Monday 0 ... Sunday 6 (``days``: ``datetime64[D]``, or day numbers since
    1970-01-01, a Thursday)."""
    return (np.asarray(days).astype("datetime64[D]").astype(np.int64) + 3) % 7


def weekday_inputs(days: np.ndarray) -> np.ndarray:
    """``(sin, cos)`` of ``2 pi w / 7`` for each day (``w``: :func:`weekday_of`), shape ``days.shape + (2,)``."""
    angle = 2 * np.pi * weekday_of(days) / 7
    return np.stack([np.sin(angle), np.cos(angle)], axis=-1)


def weekday_profile(values: np.ndarray, days: np.ndarray) -> np.ndarray:
    """Mean of ``values`` per weekday of ``days`` (Monday 0 ... Sunday 6), shape (7,); a weekday with no
    value gets the mean of all of them."""
    values = np.asarray(values, dtype=np.float64)
    weekday = weekday_of(days)
    counts = np.bincount(weekday, minlength=7)
    sums = np.bincount(weekday, weights=values, minlength=7)
    overall = float(values.mean()) if len(values) else 0.0
    return np.where(counts > 0, sums / np.maximum(counts, 1), overall)


def history_profile(series: np.ndarray, first_day: np.datetime64, targets: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The household inputs as known the morning of each target day ``t``: the mean of every valid day before
    ``t`` (shape (n,)), and the mean of every valid day before ``t`` on each weekday (shape (n, 7), Monday 0;
    a weekday with no such day gets the first mean).  Prefix sums: O(days + targets)."""
    series = np.asarray(series, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    valid = np.isfinite(series)
    values = np.where(valid, series, 0.0)
    weekday = weekday_of(np.datetime64(first_day, "D") + np.arange(len(series)))
    onehot = (weekday[:, None] == np.arange(7)[None, :])
    sums = np.vstack([np.zeros((1, 7)), np.cumsum(onehot * values[:, None], axis=0)])  # row i: days < i
    counts = np.vstack([np.zeros((1, 7)), np.cumsum(onehot & valid[:, None], axis=0)])
    total, count = sums[targets].sum(axis=1), counts[targets].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        level = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        profile = np.where(counts[targets] > 0, sums[targets] / np.maximum(counts[targets], 1), level[:, None])
    return level, profile


def _train_windows(n_windows: int, train_fraction: float) -> int:
    return min(max(int(np.floor(train_fraction * n_windows)), 1), n_windows - 1)


def validation_windows(n_train: int, validation_fraction: float) -> int:
    """How many of ``n_train`` training windows (the last ones) are held out for validation: the rounded
    share, at least one when ``validation_fraction`` > 0, none when it is 0."""
    if validation_fraction <= 0:
        return 0
    return max(round(validation_fraction * n_train), 1)


@dataclass(frozen=True)
class Layout:
    """Which of a household's complete windows fit, validate and test (positions in its target list), and the
    day its visible series ends before (``visible``: the test block's end + 1, or its first day when locked)."""

    fit: slice
    validation: slice
    test: slice
    visible: int
    test_start: int

    @property
    def counts(self) -> tuple[int, int, int]:
        return tuple(s.stop - s.start for s in (self.fit, self.validation, self.test))  # type: ignore[return-value]


def split_layout(litres: np.ndarray, targets: np.ndarray, config: WaterDataParams, origin: int | None = None
                 ) -> Layout:
    """The fit / validation / test windows of a household whose complete windows have the target days
    ``targets`` (:func:`_complete_windows`), under ``config.split``, at ``origin`` (default ``config.origin``).

    ``fraction``: the first ``floor(train_fraction n)`` windows train (the last ``validation_fraction`` of them
    validate), the rest test.  ``origins``: with ``e`` the household's last valid day and ``D = origin_days``,
    block ``k`` holds the days ``e - (origins - k) D + 1 .. e - (origins - k - 1) D``; its windows test, the
    windows whose target is in the ``validation_days`` days before the block validate, and the earlier ones
    fit; windows after the block do not exist for this run."""
    n = len(targets)
    if config.split == "fraction":
        n_train = _train_windows(n, config.train_fraction) if n >= 2 else n
        n_val = validation_windows(n_train, config.validation_fraction)
        start = int(targets[n_train]) if n_train < n else len(litres)
        return Layout(slice(0, n_train - n_val), slice(n_train - n_val, n_train), slice(n_train, n), len(litres),
                      start)
    origin = config.origin if origin is None else origin
    valid = np.flatnonzero(np.isfinite(litres))
    end = int(valid[-1]) if len(valid) else -1
    start = end - (config.origins - origin) * config.origin_days + 1
    stop = start + config.origin_days  # first day after the block
    val_start = start - config.validation_days
    cut = np.searchsorted(targets, [val_start, start, stop], side="left")
    return Layout(slice(0, int(cut[0])), slice(int(cut[0]), int(cut[1])), slice(int(cut[1]), int(cut[2])),
                  min(stop, len(litres)), start)


def _fit_days(litres: np.ndarray, targets: np.ndarray, n_fit: int) -> np.ndarray:
    """The valid days up to the last fit target: what a scaler may see."""
    days = litres[: targets[n_fit - 1] + 1]
    return days[np.isfinite(days)]


def fit_scaler(days: np.ndarray, scaler: str = "minmax") -> tuple[float, float]:
    """(offset, scale) of ``scaler`` on ``days``: min and range, median and IQR, or mean and std (1 if 0)."""
    if scaler == "minmax":
        offset, scale = float(days.min()), float(days.max() - days.min())
    elif scaler == "robust":
        low, median, high = np.percentile(days, [25, 50, 75])
        offset, scale = float(median), float(high - low)
    elif scaler == "zscore":
        offset, scale = float(days.mean()), float(days.std())
    else:
        raise ValueError(f"scaler must be one of {SCALERS}, got {scaler!r}")
    return offset, scale if scale > 0 else 1.0


def global_scaler(households: list[HouseholdDaily], config: WaterDataParams) -> tuple[float, float]:
    """The scaler of ``scaling = "global"``: fitted on every household's fit days, pooled."""
    pieces = []
    for household in households:
        litres = np.asarray(household.litres, dtype=np.float64)
        targets = _complete_windows(litres, config.lookback)
        if len(targets) >= 2:
            n_fit = split_layout(litres, targets, config).fit.stop
            if n_fit >= 1:
                pieces.append(_fit_days(litres, targets, n_fit))
    if not pieces:
        raise InsufficientDataError("no household has training days to fit a global scaler on")
    return fit_scaler(np.concatenate(pieces), config.scaler)


def layout_problem(household: HouseholdDaily, config: WaterDataParams) -> str | None:
    """Why ``household`` cannot be a pool member under ``config`` (too few windows overall, or too few fit,
    validation or test windows at the run's origin of ``split = "origins"``: each origin has its own pool, and a
    household whose block falls in a gap sits that origin out, named in ``pool.csv``), or None."""
    litres = np.asarray(household.litres, dtype=np.float64)
    targets = _complete_windows(litres, config.lookback)
    if len(targets) < max(config.min_windows, 2):
        return (f"{len(targets)} complete windows from {household.valid_days} valid days; needs at least "
                f"{max(config.min_windows, 2)} windows of {config.lookback} + 1 consecutive valid days")
    origins = [config.origin] if config.split == "origins" else [None]  # each origin has its own pool
    for origin in origins:
        n_fit, n_val, n_test = split_layout(litres, targets, config, origin).counts
        where = f"origin {origin}: " if origin is not None else ""
        if config.split == "origins":
            need = [("fit", n_fit, max(config.min_windows, 1)),
                    ("validation", n_val, MIN_HELD_WINDOWS if config.validation_days else 0),
                    ("test", n_test, MIN_HELD_WINDOWS)]
            short = [f"{n} {name} windows (< {least})" for name, n, least in need if n < least]
            if short:
                return where + ", ".join(short)
        elif n_fit < 1:
            return (f"validation-fraction {config.validation_fraction} holds out {n_val} of its {n_fit + n_val} "
                    f"training windows, which leaves none to train on")
    return None


def window_inputs(series: np.ndarray, first_day: np.datetime64, targets: np.ndarray, config: WaterDataParams
                  ) -> np.ndarray:
    """The inputs of the windows whose targets are the days ``targets`` of ``series`` (scaled, day 0 is
    ``first_day``), shape (n, lookback, :attr:`WaterDataParams.input_channels`), float64.

    Channel 0 is the use of days ``t - L .. t - 1``; ``calendar = "weekday"`` adds the sine and cosine of the
    weekday of the day after each step; ``household = "profile"`` adds what is known the morning of day ``t``:
    the mean of every valid day before ``t``, and the mean of every valid day before ``t`` on the weekday of
    the day after each step (:func:`history_profile`).  ``t`` may be ``len(series)``: the day after the series
    (a forecast of tomorrow)."""
    lookback = config.lookback
    targets = np.asarray(targets, dtype=np.int64)
    x = series[targets[:, None] - lookback + np.arange(lookback)[None, :]][..., None]
    # step j of window t is day t - L + j; calendar and profile inputs describe the day after it
    following = first_day + (targets[:, None] - lookback + 1 + np.arange(lookback)[None, :])
    if config.calendar == "weekday":
        x = np.concatenate([x, weekday_inputs(following)], axis=-1)
    if config.household == "profile":  # as known the morning of each target day
        level, profile = history_profile(series, first_day, targets)
        step_profile = np.take_along_axis(profile, weekday_of(following), axis=1)
        x = np.concatenate([x, np.repeat(level[:, None], lookback, axis=1)[..., None], step_profile[..., None]],
                           axis=-1)
    return x


def make_windows(household: HouseholdDaily, lookback: int = 12, train_fraction: float = 0.8,
                 scaler: str = "minmax", min_windows: int = 2, calendar: str = "none",
                 household_inputs: str = "none", fit: tuple[float, float] | None = None,
                 validation_fraction: float = 0.0, *, config: WaterDataParams | None = None) -> ClientWindows:
    """Look-back windows with one-step-ahead targets, split chronologically.

    Window ``t`` has inputs days ``t-L .. t-1`` and target day ``t``; only windows whose L+1 days are all valid
    exist (gaps are never filled).  With ``config`` its fields say everything (the split, the origin, the
    inputs, ``score_test``); without it the other arguments make a ``split = "fraction"`` config: the first
    ``floor(train_fraction * n)`` windows (by target day) train, the rest test, and with
    ``validation_fraction`` > 0 the last :func:`validation_windows` of the training windows validate.  The
    scaler is fitted on the valid days up to the last fit target, so nothing after it reaches the normaliser.
    ``fit`` = (offset, scale) uses that scaler instead (``scaling = "global"``, :func:`global_scaler`).

    The household inputs (``profile``) of window ``t`` are what is known the morning of day ``t``: the mean of
    every valid day before ``t`` and the mean of every valid day before ``t`` on the weekday of the day after
    each look-back step (:func:`history_profile`), so the profile's last step is the naive ``weekday
    average`` of the target.  With the test period locked (``score_test`` false) no test window is made and
    the series ends before the first test day.

    Raises
    ------
    InsufficientDataError
        Too few windows (names the household, its valid days and the minimum), or a split that leaves no fit
        window, or (``origins``) too few fit, validation or test windows at the run's origin.
    """
    if config is None:
        config = WaterDataParams(lookback=lookback, train_fraction=train_fraction, scaler=scaler,
                                 min_windows=max(min_windows, 2), calendar=calendar, household=household_inputs,
                                 validation_fraction=validation_fraction)
    lookback = config.lookback
    litres = np.asarray(household.litres, dtype=np.float64)
    targets = _complete_windows(litres, lookback)
    if len(targets) < max(config.min_windows, 2):
        raise InsufficientDataError(
            f"household {household.household_id}: {len(targets)} complete windows from "
            f"{household.valid_days} valid days; needs at least {max(config.min_windows, 2)} windows of "
            f"{lookback} + 1 consecutive valid days"
        )
    layout = split_layout(litres, targets, config)
    n_fit, n_val, n_test = layout.counts
    if n_fit < 1:
        raise InsufficientDataError(
            f"household {household.household_id}: " + (
                f"validation-fraction {config.validation_fraction} holds out {n_val} of its {n_fit + n_val} "
                f"training windows, which leaves none to train on" if config.split == "fraction" else
                f"origin {config.origin} leaves no fit window before its {config.validation_days} validation days"))
    if config.split == "origins" and (n_test < 1 or (config.validation_days and n_val < 1)):
        raise InsufficientDataError(
            f"household {household.household_id}: origin {config.origin} has {n_val} validation and {n_test} test "
            f"windows")
    locked = not config.score_test
    visible = layout.test_start if locked else layout.visible
    keep = targets[: layout.validation.stop if locked else layout.test.stop]
    offset, scale = fit if fit is not None else fit_scaler(_fit_days(litres, targets, n_fit), config.scaler)
    scaled = (litres[:visible] - offset) / scale
    x = window_inputs(scaled, household.first_day, keep, config)
    y = scaled[keep]
    target_days = household.first_day + keep
    x = x.astype(np.float32)
    y = y.astype(np.float32)
    fit_part, val_part, test_part = layout.fit, layout.validation, layout.test
    validation = {}
    if n_val:
        validation = {"x_val": x[val_part], "y_val": y[val_part], "val_days": target_days[val_part]}
    if locked:
        empty_x = np.zeros((0, lookback, x.shape[2]), dtype=np.float32)
        test = (empty_x, np.zeros(0, dtype=np.float32), np.zeros(0, dtype="datetime64[D]"))
    else:
        test = (x[test_part], y[test_part], target_days[test_part])
    return ClientWindows(x[fit_part], y[fit_part], test[0], test[1], test[2], offset, scale,
                         train_days=target_days[fit_part], **validation, series=scaled,
                         first_day=np.datetime64(household.first_day, "D"), test_locked=locked)


@dataclass(frozen=True)
class WaterPool:
    """The federated pool: households in partition-id order, and the per-household report.

    ``report`` has one row per household of the source (pool members and the
    excluded alike) with its filter outcome in ``status``.
    """

    households: list[HouseholdDaily]
    report: pd.DataFrame
    #: ``scaling = "global"``'s scalers, once per (scaler, lookback, train and validation fraction): a memo
    global_fits: dict[tuple, tuple[float, float]] = field(
        default_factory=dict, init=False, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.households)

    def group_of(self, partition_id: int) -> str:
        """The known group (household type) of pool member ``partition_id``; empty when not known."""
        if "group" not in self.report.columns:
            return ""
        row = self.report[self.report["partition_id"] == partition_id]
        return "" if row.empty or pd.isna(row["group"].iloc[0]) else str(row["group"].iloc[0])

    def client(self, partition_id: int, config: WaterDataParams) -> ClientWindows:
        """Windows of pool member ``partition_id``."""
        if not 0 <= partition_id < len(self.households):
            raise IndexError(
                f"partition-id {partition_id} is outside the pool of {len(self.households)} households; "
                f"run at most {len(self.households)} supernodes or relax the filters"
            )
        fit = None
        if config.scaling == "global":
            if len(self.households) < 2:
                raise ValueError("scaling = 'global' fits one scaler on every household of the pool; this node "
                                 "holds one household, so it cannot (use scaling = 'household')")
            fit = self._global_fit(config)
        return make_windows(self.households[partition_id], fit=fit, config=config)

    def _global_fit(self, config: WaterDataParams) -> tuple[float, float]:
        key = (config.scaler, config.lookback, config.split, config.train_fraction, config.validation_fraction,
               config.origins, config.origin, config.origin_days, config.validation_days)
        if key not in self.global_fits:
            self.global_fits[key] = global_scaler(self.households, config)
        return self.global_fits[key]


def select_pool(households: list[HouseholdDaily], config: WaterDataParams) -> WaterPool:
    """Apply the active, history and window filters (paper Section 5).

    The active filter compares each household's mean hourly consumption
    (mean of its valid daily totals / 24) with ``active_factor`` times the
    mean of those values over *all* households given.
    """
    if not households:
        raise InsufficientDataError("no households to select from")
    mean_hourly = np.array([np.nanmean(h.litres) / 24 if h.valid_days else 0.0 for h in households])
    threshold = config.active_factor * mean_hourly.mean()
    rows, pool = [], []
    for household, hourly in zip(households, mean_hourly):
        row = {"household": household.household_id, "mean_litres_per_day": hourly * 24,
               "valid_days": household.valid_days, "history_days": household.history_days,
               "train_windows": 0, "test_windows": 0}
        if any(h.group for h in households):
            row["group"] = household.group
        if hourly < threshold:
            row["status"] = f"inactive (mean {hourly:.2f} L/h < {threshold:.2f} L/h)"
        elif household.history_days < config.min_history_days:
            row["status"] = f"short history ({household.history_days} < {config.min_history_days} days)"
        else:
            problem = layout_problem(household, config)
            litres = np.asarray(household.litres, dtype=np.float64)
            targets = _complete_windows(litres, config.lookback)
            if problem is None or (config.split == "fraction" and len(targets) >= max(config.min_windows, 2)):
                n_fit, n_val, n_test = split_layout(litres, targets, config).counts
                row["train_windows"], row["test_windows"] = n_fit, n_test
                if config.has_validation:
                    row["validation_windows"] = n_val
            if problem is None:
                row["status"] = "pool"
                pool.append(household)
            else:
                row["status"] = f"too few windows ({problem})"
                log.warning("left out of the pool: household %s: %s", household.household_id, problem)
        rows.append(row)
    emptied = [r["household"] for r in rows if config.split == "fraction" and "validation-fraction" in r["status"]]
    if emptied:
        raise InsufficientDataError(
            f"run-config 'validation-fraction' = {config.validation_fraction} leaves {len(emptied)} household(s) of "
            f"the pool without a training window ({', '.join(emptied[:5])}{', ...' if len(emptied) > 5 else ''}); "
            f"lower it, or raise min-windows")
    report = pd.DataFrame(rows).sort_values("household", kind="stable").reset_index(drop=True)
    pool.sort(key=lambda h: h.household_id)
    if config.source != "synthetic" and config.synthetic.seed != 0:  # data-seed: another partition order of the file
        pool = [pool[i] for i in np.random.default_rng(config.synthetic.seed).permutation(len(pool))]
    partition = {h.household_id: k for k, h in enumerate(pool)}
    report.insert(1, "partition_id", report["household"].map(partition).astype("Int64"))
    if not pool:
        counts = report["status"].str.split(" ").str[0].value_counts().to_dict()
        raise InsufficientDataError(
            f"no household passes the filters ({len(households)} households: {counts}); "
            f"active-factor={config.active_factor}, min-history-days={config.min_history_days}, "
            f"min-windows={config.min_windows}"
            + (f", split='origins' ({config.origins} x {config.origin_days} test days, {config.validation_days} "
               f"validation days)" if config.split == "origins" else "")
            + ". The 92-household DAIAD file spans one year: set min-history-days <= 365 for it; a utility's own "
              "file: active-factor=0 min-history-days=0."
        )
    return WaterPool(pool, report)


def read_households(config: WaterDataParams) -> tuple[list[HouseholdDaily], pd.DataFrame | None]:
    """Daily series of every household of the source, and the cleaning report (files only)."""
    if config.source == "synthetic":
        typed = bool(config.synthetic.types)
        households = [HouseholdDaily(h.household_id, h.first_day, h.daily, h.archetype if typed else "")
                      for h in generate_population(config.synthetic)]
        return households, None
    if config.source == "csv":
        daily, cleaning = read_meters(config.path, config.csv_values, config.cleaning)
    else:
        daily, cleaning = clean_to_daily(read_daiad(config.path), config.cleaning)
    households = [HouseholdDaily(hid, first, litres) for hid, (first, litres) in daily.items()]
    missing = sorted(set(cleaning.index) - set(daily))
    for hid in missing:
        log.warning("household %s has no valid day after cleaning; left out", hid)
    return households, cleaning


def build_pool(config: WaterDataParams) -> WaterPool:
    """Read the source and select the pool (no cache)."""
    households, cleaning = read_households(config)
    pool = select_pool(households, config)
    if cleaning is not None:
        extra = cleaning.drop(columns=[c for c in cleaning.columns if c in pool.report.columns])
        report = pool.report.merge(extra, left_on="household", right_index=True, how="outer")
        report["status"] = report["status"].fillna("no valid day after cleaning")
        pool = WaterPool(pool.households, report.reset_index(drop=True))
    return pool


def default_cache_dir() -> Path:
    """``$BOUQUET_CACHE_DIR``, else ``~/.cache/bouquet``."""
    return Path(os.environ.get("BOUQUET_CACHE_DIR", Path.home() / ".cache" / "bouquet"))


_MEMORY: dict[str, WaterPool] = {}


def forget_pools() -> None:
    """Drop the pools this process keeps in memory (the disk cache stays)."""
    _MEMORY.clear()


def load_pool(config: WaterDataParams, cache_dir: Path | None = None) -> WaterPool:
    """The pool for ``config``, from memory, the disk cache, or built (then cached).

    The cache holds only the pool's daily series and the report (kilobytes),
    keyed by :meth:`WaterDataParams.cache_key`; it is written atomically so
    that concurrent simulation workers can share it.
    """
    config.require_path()
    key = config.cache_key()
    if key in _MEMORY:
        return _MEMORY[key]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    npz, csv = folder / f"water-{key}.npz", folder / f"water-{key}-report.csv"
    if npz.exists() and csv.exists():
        with np.load(npz, allow_pickle=False) as stored:
            ids, firsts, lengths, values = (stored[k] for k in ("ids", "first_days", "lengths", "values"))
        splits = np.cumsum(lengths)[:-1]
        households = [HouseholdDaily(str(i), f, v) for i, f, v in zip(ids, firsts, np.split(values, splits))]
        pool = WaterPool(households, pd.read_csv(csv, dtype={"partition_id": "Int64"}))
    else:
        pool = build_pool(config)
        folder.mkdir(parents=True, exist_ok=True)
        suffix = f".{os.getpid()}.tmp"
        tmp_npz, tmp_csv = folder / f"water-{key}{suffix}.npz", Path(str(csv) + suffix)
        np.savez(tmp_npz, ids=np.array([h.household_id for h in pool.households]),
                 first_days=np.array([h.first_day for h in pool.households], dtype="datetime64[D]"),
                 lengths=np.array([len(h.litres) for h in pool.households]),
                 values=np.concatenate([h.litres for h in pool.households]))
        pool.report.to_csv(tmp_csv, index=False)
        os.replace(tmp_csv, csv)
        os.replace(tmp_npz, npz)
    _MEMORY[key] = pool
    return pool
