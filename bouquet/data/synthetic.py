"""Synthetic Alicante-like household water consumption (the embedded default).

Every household is generated from its own stream ``default_rng([seed, index])``,
so one household can be regenerated alone (a deployed node needs only its own)
and the whole population of 1,099 households takes a few seconds.

Structure of one household (``docs/DATA.md`` gives the calibration against the
real 92-household DAIAD file):

* a consumption level in litres/day: occupied homes draw it from a lognormal
  (median 215 L/day, sigma 0.42, mean ~236 L/day; real file: ~235);
  a share of meters are near-zero (vacant or second homes, 1-15 L/day), and a
  few are non-residential or very large occupancy (800-2,000 L/day);
* an hourly routine with morning and evening peaks (the real file's mean
  hour-of-day profile); weekends start later and use ~2% more;
  non-residential meters follow business hours instead;
* a mild summer increase (peak in mid July, 0 to +8%; the real file shows
  almost none);
* day-to-day lognormal variation, vacations (days at zero), a leak in a few
  homes (a constant flow of 1-8 L/h for weeks to months), and rare
  800-1,500 L/day spikes (irrigation, pool filling);
* zero-inflated hours: water is drawn in discrete events (compound Poisson:
  Poisson number of draws per hour, gamma volume per draw), so most night
  hours and many day hours are exactly zero;
* integer litres, as a meter reports them (floor of the cumulative reading);
* a history length: most homes cover the whole study period (about two years
  and two months), a few join late.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bouquet.params import require

__all__ = ["ARCHETYPES", "SyntheticConfig", "SyntheticHousehold", "generate_household", "generate_population"]

HOURS_PER_DAY = 24
ARCHETYPES = ("vacant", "single", "couple", "family", "large", "non-residential")
START_DAY = np.datetime64("2014-01-01", "D")

# hourly routine of a residential home on weekdays / weekends (relative weights): the mean
# hour-of-day profile of the real 92-household DAIAD file (scripts/calibrate_synthetic.py)
_WEEKDAY = np.array([0.92, 0.47, 0.27, 0.23, 0.19, 0.17, 0.21, 1.17, 1.72, 1.26, 1.2, 1.29,
                     1.19, 1.09, 1.05, 1.15, 1.04, 0.96, 0.99, 1.2, 1.64, 1.82, 1.51, 1.26])
_WEEKEND = np.array([0.84, 0.54, 0.37, 0.24, 0.18, 0.15, 0.12, 0.26, 0.56, 1.13, 1.58, 1.92,
                     1.97, 1.68, 1.37, 1.31, 1.09, 0.99, 1.04, 1.27, 1.43, 1.59, 1.36, 1.01])
_BUSINESS = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.6, 1.8, 2.6, 2.8, 2.8, 2.7,
                      2.4, 2.2, 2.5, 2.7, 2.6, 2.2, 1.4, 0.6, 0.3, 0.2, 0.1, 0.1])


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic population (defaults calibrated in docs/DATA.md).

    Parameters
    ----------
    n_households : int, default 1099
        Population size (the Alicante release has 1,099 meters).
    seed : int, default 0
    study_days : int, default 790
        Length of the study period in days (2014-01-01 onward).
    vacant_share : float, default 0.26
        Share of near-zero meters (vacant / second homes).
    non_residential_share : float, default 0.015
        Share of non-residential or very large occupancy meters.
    late_start_share : float, default 0.02
        Share of households whose history starts late (fewer than two years).
    leak_share : float, default 0.04
        Share of households with a leak episode.
    spike_rate_per_day : float, default 1/400
        Chance per day of an 800-1,500 L spike.
    median_litres_per_day : float, default 215
    level_sigma : float, default 0.42
        Lognormal median and spread of occupied households' level.
    """

    n_households: int = 1099
    seed: int = 0
    study_days: int = 790
    vacant_share: float = 0.26
    non_residential_share: float = 0.015
    late_start_share: float = 0.02
    leak_share: float = 0.04
    spike_rate_per_day: float = 1 / 400
    median_litres_per_day: float = 215.0
    level_sigma: float = 0.42

    def __post_init__(self) -> None:
        require(self.n_households >= 1, "n_households", f"n_households must be >= 1, got {self.n_households}")
        require(self.study_days >= 30, "study_days", f"study_days must be >= 30, got {self.study_days}")
        shares = (self.vacant_share, self.non_residential_share, self.late_start_share, self.leak_share)
        require(all(0 <= s <= 1 for s in shares) and self.vacant_share + self.non_residential_share <= 1,
                "vacant_share", "shares must lie in [0, 1] and vacant + non-residential must not exceed 1")


@dataclass(frozen=True)
class SyntheticHousehold:
    """One generated household.

    Attributes
    ----------
    household_id : str
        ``"syn-0000"`` ... (index in the population).
    archetype : str
        One of :data:`ARCHETYPES`.
    first_day : numpy.datetime64
        Calendar day of ``hourly[0]``.
    hourly : numpy.ndarray, shape (days * 24,)
        Integer litres per hour (float64).
    """

    household_id: str
    archetype: str
    first_day: np.datetime64
    hourly: np.ndarray

    @property
    def daily(self) -> np.ndarray:
        """Litres per day, shape (days,)."""
        return self.hourly.reshape(-1, HOURS_PER_DAY).sum(axis=1)


def _draw_profile(config: SyntheticConfig, rng: np.random.Generator) -> tuple[str, float]:
    u = rng.random()
    if u < config.vacant_share:
        return "vacant", float(rng.uniform(1.0, 15.0))
    if u < config.vacant_share + config.non_residential_share:
        return "non-residential", float(rng.uniform(800.0, 2000.0))
    level = float(config.median_litres_per_day * np.exp(config.level_sigma * rng.standard_normal()))
    archetype = "single" if level < 130 else "couple" if level < 250 else "family" if level < 450 else "large"
    return archetype, level


def generate_household(index: int, config: SyntheticConfig = SyntheticConfig()) -> SyntheticHousehold:
    """Generate household ``index`` of the population described by ``config``.

    Deterministic: the same (config, index) always gives the same series.
    """
    if not 0 <= index < config.n_households:
        raise IndexError(f"household index {index} outside [0, {config.n_households})")
    rng = np.random.default_rng([config.seed, index])
    archetype, level = _draw_profile(config, rng)
    first = 0
    if rng.random() < config.late_start_share:
        first = int(rng.integers(config.study_days - 700, config.study_days - 60))
    n_days = config.study_days - first
    first_day = START_DAY + first
    days = np.arange(first, config.study_days)
    weekday = (START_DAY + days).astype("datetime64[D]").view("int64")
    weekend = ((weekday + 3) % 7) >= 5  # 1970-01-01 was a Thursday

    # day-level expected litres
    season = 1.0 + rng.uniform(0.0, 0.08) * np.cos(2 * np.pi * ((days % 365.25) - 196) / 365.25)
    day_level = level * season * np.exp(0.25 * rng.standard_normal(n_days) - 0.25**2 / 2)
    if archetype == "non-residential":
        day_level *= np.where(weekend, 0.25, 1.2)
    else:
        day_level *= np.where(weekend, 1.02, 1.0)
        for _ in range(rng.poisson(1.5 * n_days / 365.0)):  # vacations
            start = int(rng.integers(0, n_days))
            day_level[start : start + int(rng.integers(4, 22))] = 0.0

    if archetype == "non-residential":
        shape = np.broadcast_to(_BUSINESS / _BUSINESS.sum(), (n_days, HOURS_PER_DAY))
    else:
        shape = np.where(weekend[:, None], _WEEKEND / _WEEKEND.sum(), _WEEKDAY / _WEEKDAY.sum())
    expected = (day_level[:, None] * shape).ravel()

    # compound Poisson draws: Poisson count per hour, Gamma(2) volume per draw
    mean_draw = 12.0 if archetype != "non-residential" else 25.0
    draws = rng.poisson(expected / mean_draw)
    hourly = np.zeros(n_days * HOURS_PER_DAY)
    used = draws > 0
    hourly[used] = rng.gamma(2.0 * draws[used], mean_draw / 2.0)

    if rng.random() < config.leak_share:
        start = int(rng.integers(0, n_days)) * HOURS_PER_DAY
        stop = start + int(rng.integers(30, 300)) * HOURS_PER_DAY
        hourly[start:stop] += rng.uniform(1.0, 8.0)
    spike_days = np.flatnonzero(rng.random(n_days) < config.spike_rate_per_day)
    for day in spike_days:
        hours = int(rng.integers(2, 5))
        begin = day * HOURS_PER_DAY + int(rng.integers(6, HOURS_PER_DAY - hours))
        hourly[begin : begin + hours] += rng.uniform(800.0, 1500.0) / hours

    cumulative = np.floor(np.cumsum(hourly))
    hourly = np.diff(cumulative, prepend=0.0)
    return SyntheticHousehold(f"syn-{index:04d}", archetype, first_day, hourly)


def generate_population(config: SyntheticConfig = SyntheticConfig()) -> list[SyntheticHousehold]:
    """Generate all ``config.n_households`` households (a few seconds for 1,099)."""
    return [generate_household(i, config) for i in range(config.n_households)]
