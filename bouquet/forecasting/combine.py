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
  the evidence for the model is weak.

The share is chosen on validation days and the served forecast is clipped at 0 (no household uses negative
water).  Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["COMBINATION_WEIGHTS", "FALLBACKS", "FallbackParams", "best_baseline", "choose_weight", "combine"]

#: The rules (``fallback``).
FALLBACKS = ("none", "select", "combine")
#: The model's shares ``combine`` chooses from, the baseline's end first (ties go there).
COMBINATION_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class FallbackParams:
    """How a node serves its forecasts (``fallback``).

    Parameters
    ----------
    rule : {"none", "select", "combine"}, default "none"
        ``none`` is the model alone (the paper's and every earlier result's); ``select`` the model or the
        household's best naive forecaster, whichever has the lower validation MAE; ``combine`` the share
        of the model in :data:`COMBINATION_WEIGHTS` with the lowest validation MAE.  ``select`` and
        ``combine`` need validation days.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"rule": "fallback"})

    rule: str = "none"

    def __post_init__(self) -> None:
        require(self.rule in FALLBACKS, "rule", f"fallback must be one of {', '.join(FALLBACKS)}, got {self.rule!r}")

    @property
    def weights(self) -> tuple[float, ...]:
        """The model's shares the rule chooses from."""
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
