"""Never worse than naive on the evidence a node has: serve the model, its baseline, or a combination of both.

Each household holds its model's forecasts and its best naive forecaster's (chosen on its validation days) for
the same validation days.  The node serves ``w * model + (1 - w) * baseline`` with the share ``w`` that the
rule (``fallback``) allows and its validation days favour:

* ``none``: ``w = 1``, the model alone (every result before this rule existed);
* ``select``: ``w`` in {0, 1}: the model where its validation MAE is lower than the baseline's, else the
  baseline (a forecast of the household's own naive forecaster);
* ``combine``: ``w`` in :data:`COMBINATION_WEIGHTS` (0, 1/4, ..., 1), the share with the lowest validation MAE;
  ties go to the smaller share (toward the baseline).  Combining forecasts is the field's oldest robust gain
  (Bates and Granger 1969; the M4 competition's combinations), and it shrinks toward the baseline where
  the evidence for the model is weak;
* ``pooled``: one share of :data:`COMBINATION_WEIGHTS` for every household, the one with the lowest sum of the
  households' validation MAE (each household with its own best baseline): 56 days of one household choose a
  share noisily, the pool's days much less so.  The share is the federation's (:func:`pooled_weight` over every
  node's :func:`share_errors`); a node is told it (``share``).

Which rule serves is itself a choice: :func:`choose_rule` makes it by nested validation, each household's
validation days split in two, every rule fitted on the first half and scored on the second.

The share is chosen on validation days and the served forecast is clipped at 0 (no household uses negative
water).  Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["COMBINATION_WEIGHTS", "FALLBACKS", "FallbackParams", "best_baseline", "choose_rule", "choose_weight",
           "combine", "pooled_weight", "share_errors"]

#: The rules (``fallback``), the simplest first (a tie in :func:`choose_rule` goes to the earlier).
FALLBACKS = ("none", "select", "combine", "pooled")
#: The model's shares ``combine`` chooses from, the baseline's end first (ties go there).
COMBINATION_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class FallbackParams:
    """How a node serves its forecasts (``fallback``).

    Parameters
    ----------
    rule : {"none", "select", "combine", "pooled"}, default "none"
        ``none`` is the model alone (the paper's and every earlier result's); ``select`` the model or the
        household's best naive forecaster, whichever has the lower validation MAE; ``combine`` the share
        of the model in :data:`COMBINATION_WEIGHTS` with the lowest validation MAE; ``pooled`` one such share
        for every household, the one with the lowest sum of the households' validation MAE (the server
        asks every node before the final evaluation).  All but ``none`` need validation days.
    share : float, default nan
        ``pooled``: the pool's share, as the server tells a node (no run-config key); NaN until it does, and
        a node that is not told serves its own ``combine`` share.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"rule": "fallback"}, skip=("share",))

    rule: str = "none"
    share: float = float("nan")

    def __post_init__(self) -> None:
        require(self.rule in FALLBACKS, "rule", f"fallback must be one of {', '.join(FALLBACKS)}, got {self.rule!r}")
        require(np.isnan(self.share) or self.share in COMBINATION_WEIGHTS, "share",
                f"the pooled share must be one of {COMBINATION_WEIGHTS}, got {self.share}")

    @property
    def weights(self) -> tuple[float, ...]:
        """The model's shares the rule chooses from (``pooled`` with its share told: that share alone)."""
        if self.rule == "pooled":
            return COMBINATION_WEIGHTS if np.isnan(self.share) else (float(self.share),)
        return {"none": (1.0,), "select": (0.0, 1.0), "combine": COMBINATION_WEIGHTS}[self.rule]


def _mae(forecast: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(forecast - actual)))


def best_baseline(forecasts: Mapping[str, np.ndarray], actual: Sequence[float] | np.ndarray) -> str:
    """The name of the forecaster in ``forecasts`` with the lowest MAE against ``actual`` (the first of equals,
    in ``forecasts``' order); days where any forecast or the actual is missing are not counted."""
    actual = np.asarray(actual, dtype=np.float64)
    if not forecasts:
        raise ValueError("no forecasters to choose from")
    keep = np.isfinite(actual)
    for values in forecasts.values():
        keep &= np.isfinite(np.asarray(values, dtype=np.float64))
    if not keep.any():
        raise ValueError("no day with an actual and every forecast to choose a baseline on")
    errors = {name: _mae(np.asarray(values, dtype=np.float64)[keep], actual[keep]) for name, values in forecasts.items()}
    return min(errors, key=errors.get)


def choose_weight(model: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray,
                  actual: Sequence[float] | np.ndarray, params: FallbackParams = FallbackParams()) -> float:
    """The model's share ``w`` (of ``params.weights``) whose combination ``w model + (1 - w) baseline``, clipped at
    0, has the lowest MAE against ``actual`` (validation days); ties go to the smaller share.

    Raises
    ------
    ValueError
        Arrays of different lengths, or no day with an actual and both forecasts (a rule other than ``none``
        then has nothing to stand on).
    """
    model, baseline, actual = (np.asarray(a, dtype=np.float64) for a in (model, baseline, actual))
    if not model.shape == baseline.shape == actual.shape or model.ndim != 1:
        raise ValueError(f"need equally long one-dimensional forecasts and actuals, got {model.shape}, "
                         f"{baseline.shape}, {actual.shape}")
    if params.rule == "none":
        return 1.0
    keep = np.isfinite(model) & np.isfinite(baseline) & np.isfinite(actual)
    if not keep.any():
        raise ValueError(f"fallback {params.rule!r} chooses on validation days; none has an actual and both forecasts")
    errors = [_mae(combine(model[keep], baseline[keep], w), actual[keep]) for w in params.weights]
    return float(params.weights[int(np.argmin(errors))])


def combine(model: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray, weight: float) -> np.ndarray:
    """``weight * model + (1 - weight) * baseline``, clipped at 0.  ``weight`` 1 reads the model alone and 0 the
    baseline alone (so a missing forecast on the other side does not matter)."""
    if not 0 <= weight <= 1:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    model, baseline = np.asarray(model, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if weight == 1:
        served = model
    elif weight == 0:
        served = baseline
    else:
        served = weight * model + (1 - weight) * baseline
    return np.maximum(served, 0.0)


def share_errors(model: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray,
                 actual: Sequence[float] | np.ndarray) -> np.ndarray:
    """The MAE of ``w model + (1 - w) baseline`` (clipped at 0) against ``actual`` for each share ``w`` of
    :data:`COMBINATION_WEIGHTS` (days with a missing value left out): what a node tells the server for
    ``pooled``."""
    model, baseline, actual = (np.asarray(a, dtype=np.float64) for a in (model, baseline, actual))
    keep = np.isfinite(model) & np.isfinite(baseline) & np.isfinite(actual)
    if not keep.any():
        raise ValueError("no day with an actual and both forecasts to score the shares on")
    return np.array([_mae(combine(model[keep], baseline[keep], w), actual[keep]) for w in COMBINATION_WEIGHTS])


def pooled_weight(errors: Sequence[Sequence[float]] | np.ndarray) -> float:
    """The share of :data:`COMBINATION_WEIGHTS` with the lowest sum of the households' MAE (``errors``: one row
    per household, :func:`share_errors`); ties go to the smaller share."""
    errors = np.atleast_2d(np.asarray(errors, dtype=np.float64))
    if errors.shape[1] != len(COMBINATION_WEIGHTS) or not len(errors):
        raise ValueError(f"need one row of {len(COMBINATION_WEIGHTS)} MAEs per household, got shape {errors.shape}")
    return float(COMBINATION_WEIGHTS[int(np.argmin(errors.sum(axis=0)))])


def choose_rule(households: Sequence[tuple[np.ndarray, Mapping[str, np.ndarray], np.ndarray]],
                rules: Sequence[str] = FALLBACKS) -> tuple[str, dict[str, float]]:
    """The serving rule by nested validation: each household's validation days (``(model, naive forecasts by
    name, actual)``, in time order) are split in two; on the first half each rule chooses the household's best
    naive forecaster and its share (``pooled``: one share over every household's first half), and it is scored
    on the second half.  Returns the rule with the lowest mean second-half MAE over households (a tie goes to
    the rule listed first) and every rule's score.

    Raises
    ------
    ValueError
        No household with at least two validation days (one for each half).
    """
    halves = []
    for model, naive, actual in households:
        model, actual = np.asarray(model, dtype=np.float64), np.asarray(actual, dtype=np.float64)
        if len(actual) < 2:
            continue
        cut = len(actual) // 2
        first = {name: np.asarray(v, dtype=np.float64)[:cut] for name, v in naive.items()}
        second = {name: np.asarray(v, dtype=np.float64)[cut:] for name, v in naive.items()}
        baseline = best_baseline(first, actual[:cut])
        halves.append((model[:cut], first[baseline], actual[:cut], model[cut:], second[baseline], actual[cut:]))
    if not halves:
        raise ValueError("no household has two validation days to choose a serving rule on")
    share = pooled_weight([share_errors(m, b, a) for m, b, a, *_ in halves])
    scores = {}
    for rule in rules:
        served = []
        for m1, b1, a1, m2, b2, a2 in halves:
            weight = share if rule == "pooled" else choose_weight(m1, b1, a1, FallbackParams(rule))
            keep = np.isfinite(m2) & np.isfinite(b2) & np.isfinite(a2)
            served.append(_mae(combine(m2[keep], b2[keep], weight), a2[keep]) if keep.any() else np.nan)
        scores[rule] = float(np.nanmean(served))
    return min(rules, key=lambda rule: (scores[rule], list(rules).index(rule))), scores
