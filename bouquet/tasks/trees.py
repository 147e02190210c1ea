"""The node half of the federated tree forecaster: one household's rows, its answers, its forecasts (no torch).

A household's training rows are its valid days before its validation days (every day whose inputs the morning
before are defined: :func:`bouquet.forecasting.features.daily_features`; unlike the LSTM's windows a day with
gaps in its look-back still trains), its validation rows the validation windows' days (the days the LSTM is
scored on, so the two forecasters are compared on the same days) and the test days likewise.  The target is
the day's use over the household's level.  The node answers the server's requests from these rows
(:func:`bouquet.algorithms.trees.answer`); its predictions between requests live in the node's Flower state
(the ClientApp keeps them).  After the fit it forecasts with the ensemble it is sent, and serves, scores and
forecasts ahead exactly as the LSTM's node does (:class:`bouquet.tasks.water.Household`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bouquet.algorithms.trees import Ensemble, PartyState, Request, Rows, TreeParams, answer
from bouquet.data.water import ClientWindows, WaterDataParams
from bouquet.forecasting.combine import FallbackParams
from bouquet.forecasting.features import FeatureParams, Features, daily_features
from bouquet.tasks.water import Household, Serving, node_windows, split_windows

__all__ = ["TreeWaterTask", "household_rows", "tree_step"]


def household_rows(windows: ClientWindows, params: FeatureParams) -> tuple[Rows, np.ndarray]:
    """A household's training rows (its valid days before its validation days, or before its test days without
    them, whose level is defined) with its validation rows, and the training rows' day indices."""
    litres = windows.to_litres(windows.series)
    held = windows.val_days if windows.has_validation else windows.test_days
    stop = int(windows.day_index(held[:1])[0]) if len(held) else len(litres)
    days = np.arange(1, stop)
    days = days[np.isfinite(litres[days])]
    features = daily_features(litres, windows.first_day, days, params)
    keep = np.isfinite(features.level)
    x, level, days = features.x[keep], features.level[keep], days[keep]
    val = None
    if windows.has_validation:
        v = daily_features(litres, windows.first_day, windows.day_index(windows.val_days), params)
        val = (v.x, windows.to_litres(windows.y_val) / v.level, v.level)
    return Rows(x, litres[days] / level, *(val or (None, None, None))), days


def tree_step(ensemble: Ensemble, first_day: np.datetime64, params: FeatureParams
              ) -> Callable[[np.ndarray, int], float]:
    """The ensemble's forecast of day ``t`` from the litres so far (for
    :func:`bouquet.tasks.water.served_ahead`); NaN where no day before ``t`` is valid."""

    def step(so_far: np.ndarray, t: int) -> float:
        features = daily_features(so_far, first_day, np.array([t]), params)
        if not np.isfinite(features.level[0]):
            return float("nan")
        return float(features.litres(ensemble.predict(features.x))[0])

    return step


_WHY = ("the tree forecaster trains through the server's query.trees exchanges (forecast-model = \"trees\"), "
        "not through {} messages")


@dataclass(frozen=True)
class TreeWaterTask:
    """One household under the federated tree forecaster (``forecast-model = "trees"``).

    Build it with :meth:`for_node`; the ensemble a method takes is the one the server sends after the fit.
    """

    partition_id: int
    household: str
    windows: ClientWindows
    trees: TreeParams
    features: FeatureParams
    group: str = ""
    fallback: FallbackParams = dataclasses.field(default_factory=FallbackParams)
    data: WaterDataParams = dataclasses.field(default_factory=WaterDataParams)

    @classmethod
    def for_node(cls, data: WaterDataParams, trees: TreeParams, features: FeatureParams, partition_id: int,
                 data_path: str | None, fallback: FallbackParams | None = None) -> TreeWaterTask:
        household, windows, group = node_windows(data, partition_id, data_path)
        return cls(partition_id, household, windows, trees, features, group,
                   fallback if fallback is not None else FallbackParams(), data)

    @functools.cached_property
    def rows(self) -> Rows:
        """The household's training and validation rows (:func:`household_rows`)."""
        return household_rows(self.windows, self.features)[0]

    @functools.cached_property
    def scorer(self) -> Household:
        return Household(self.windows, self.fallback, self.data)

    @property
    def num_examples(self) -> int:
        return len(self.rows.y)

    def answer(self, request: Request, state: PartyState) -> tuple[dict[str, np.ndarray], PartyState]:
        """This household's reply to one of the fit's requests, and its next state."""
        return answer(request, self.rows, state, self.trees)

    def load(self, arrays: dict[str, np.ndarray]) -> Ensemble:
        """The ensemble of the arrays the server sends (:meth:`bouquet.algorithms.trees.Ensemble.to_arrays`)."""
        ensemble = Ensemble.from_arrays(arrays)
        if ensemble.edges.shape[0] != self.rows.x.shape[1]:
            raise ValueError(f"the ensemble reads {ensemble.edges.shape[0]} inputs; this node makes "
                             f"{self.rows.x.shape[1]} (another version of bouquet?)")
        return ensemble

    @functools.cached_property
    def _parts(self) -> dict[str, Features]:
        return {}

    def _features(self, part: str) -> Features:
        """The inputs of the ``validation`` or ``test`` days (computed once)."""
        if part not in self._parts:
            w = self.windows
            split_windows(w, part)  # the checks: a locked test period, no validation split
            days = w.val_days if part == "validation" else w.test_days
            self._parts[part] = daily_features(w.to_litres(w.series), w.first_day, w.day_index(days), self.features)
        return self._parts[part]

    def forecasts(self, ensemble: Ensemble) -> Callable[[str], np.ndarray]:
        """The ensemble's forecasts (litres, clipped at 0) of the ``validation`` or ``test`` days."""
        def litres(part: str) -> np.ndarray:
            features = self._features(part)
            return features.litres(ensemble.predict(features.x)) if len(features.x) else np.zeros(0)
        return litres

    def evaluate(self, ensemble: Ensemble, rng: np.random.Generator | None = None, final: bool = False
                 ) -> dict[str, float]:
        """Held-out errors of the ensemble's forecasts (:meth:`bouquet.tasks.water.Household.metrics`)."""
        return self.scorer.metrics(self.forecasts(ensemble), final)

    def share_errors(self, ensemble: Ensemble, rng: np.random.Generator | None = None) -> dict[str, float]:
        """The served validation MAE of each pooled share (:meth:`bouquet.tasks.water.Household.share_metrics`)."""
        return self.scorer.share_metrics(self.forecasts(ensemble))

    def serving(self, ensemble: Ensemble) -> Serving:
        return self.scorer.serving(self.forecasts(ensemble))

    def final_arrays(self, ensemble: Ensemble, ahead: int = 7) -> dict[str, dict[str, np.ndarray]]:
        """The test days' forecasts, the days after the data, and the ensemble (``model``) for ``python -m
        bouquet.forecast`` (:meth:`bouquet.tasks.water.Household.final_arrays`)."""
        step = tree_step(ensemble, self.windows.first_day, self.features)
        return self.scorer.final_arrays(self.forecasts(ensemble), step, ensemble.to_arrays(),
                                        {"model-blend": float("nan")}, ahead)

    def final_info(self, ensemble: Ensemble) -> dict[str, str]:
        return self.scorer.final_info(self.forecasts(ensemble))

    # what the tree forecaster does not do: a clear error, not a silent substitute
    def new_model(self) -> object:
        raise TypeError(_WHY.format("model-based"))

    def train(self, model: object, rng: np.random.Generator, proximal_mu: float) -> float:
        raise TypeError(_WHY.format("train"))

    def training_batch(self, batch_size: int, rng: np.random.Generator) -> tuple:
        raise TypeError(_WHY.format("sketch"))

    def loss(self, model: object, examples: int, rng: np.random.Generator) -> tuple[float, int]:
        raise TypeError(_WHY.format("query.losses"))

    def poisoned(self, attack: str, scale: float) -> TreeWaterTask:
        raise TypeError(f"attack {attack!r}: the attack harness poisons the LSTM's training rounds; the tree "
                        f"forecaster has none")
