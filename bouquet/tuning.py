"""The honest protocol's arithmetic: grids of candidates, the choice on validation, paired intervals.

A study arm is a base run config and a grid (key -> candidate values).  :func:`expand_grid` names every
candidate; every candidate runs on the tuning seeds; :func:`choose_on_validation` picks, per arm, the
candidate with the lowest mean validation error over those seeds (no test number is read to choose);
the chosen candidate then runs on every seed and its test numbers are reported once, with
:func:`paired_interval` against a reference of the same seeds (the same data and initial model).
Standard deviations are sample standard deviations (``ddof = 1``) throughout.  Pure numpy / pandas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["Candidate", "PairedInterval", "candidate_name", "choose_on_validation", "expand_grid", "paired_interval",
           "sample_std"]


@dataclass(frozen=True)
class Candidate:
    """One point of an arm's grid: its name (``arm`` or ``arm[key=value,...]``) and its run-config keys."""

    arm: str
    name: str
    run_config: Mapping[str, Any]


def candidate_name(arm: str, values: Mapping[str, Any]) -> str:
    """``arm[k1=v1,k2=v2]`` in the grid's key order (``arm`` for an arm without a grid)."""
    if not values:
        return arm
    return f"{arm}[{','.join(f'{k}={v}' for k, v in values.items())}]"


def expand_grid(arm: str, base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]]) -> list[Candidate]:
    """Every combination of ``grid``'s values over ``base`` (the last key varies fastest).

    Raises
    ------
    ValueError
        A grid key with no values, or one that is also a base key (it would be set twice).
    """
    for key, values in grid.items():
        if isinstance(values, str) or not isinstance(values, Sequence) or len(values) == 0:
            raise ValueError(f"arm {arm!r}: grid key {key!r} needs a non-empty list of values, got {values!r}")
        if key in base:
            raise ValueError(f"arm {arm!r}: {key!r} is both a fixed key and a grid key")
    keys = list(grid)
    out = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        values = dict(zip(keys, combo, strict=True))
        out.append(Candidate(arm, candidate_name(arm, values), {**base, **values}))
    return out


def choose_on_validation(frame: pd.DataFrame, metric: str = "val-mae") -> pd.DataFrame:
    """Per arm, the candidate with the lowest mean ``metric`` over its seeds.

    Parameters
    ----------
    frame : DataFrame
        One row per (arm, candidate, seed) with the validation ``metric``; other columns (test numbers) are
        carried but never read.
    metric : str, default "val-mae"

    Returns
    -------
    DataFrame
        One row per (arm, candidate): ``seeds``, mean and sample std of ``metric``, and ``chosen`` (True
        for each arm's lowest mean; the first candidate in grid order on a tie).  A candidate must have
        run on every tuning seed the arm's others ran on, else ValueError (a partial mean would favour it).
    """
    if frame.empty:
        raise ValueError("no tuning runs to choose from")
    rows = []
    for arm, runs in frame.groupby("arm", sort=False):
        seeds = {c: set(g["seed"]) for c, g in runs.groupby("candidate", sort=False)}
        union = set().union(*seeds.values())
        short = [c for c, s in seeds.items() if s != union]
        if short:
            raise ValueError(f"arm {arm!r}: candidates {short} lack tuning seeds of {sorted(union)}")
        for candidate, group in runs.groupby("candidate", sort=False):
            values = group[metric].to_numpy(dtype=float)
            rows.append({"arm": arm, "candidate": candidate, "seeds": len(values), f"{metric}-mean": values.mean(),
                         f"{metric}-std": sample_std(values)})
    table = pd.DataFrame(rows)
    best = table.groupby("arm", sort=False)[f"{metric}-mean"].transform("min")
    first = table[table[f"{metric}-mean"] == best].groupby("arm", sort=False).head(1).index
    table["chosen"] = table.index.isin(first)
    return table


def sample_std(values: Sequence[float] | np.ndarray) -> float:
    """The sample standard deviation (``ddof = 1``); NaN for fewer than two values."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


@dataclass(frozen=True)
class PairedInterval:
    """The mean of paired differences ``a - b`` and its 95 % t interval (``half_width``), over ``n`` pairs."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def excludes_zero(self) -> bool:
        return self.n > 1 and (self.low > 0 or self.high < 0)

    def text(self, digits: int = 2) -> str:
        if self.n < 2:
            return f"{self.mean:+.{digits}f} (n = {self.n})"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedInterval:
    """Paired differences ``a_i - b_i`` (same seed, same data): mean and the ``level`` Student-t half-width
    ``t_{n-1} s / sqrt(n)`` with the sample std ``s`` (NaN half-width for one pair)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"need two equally long non-empty sequences, got {a.shape} and {b.shape}")
    diff = a - b
    n = len(diff)
    if n < 2:
        return PairedInterval(float(diff.mean()), math.nan, n)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * diff.std(ddof=1) / math.sqrt(n))
    return PairedInterval(float(diff.mean()), half, n)
