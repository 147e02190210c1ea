"""Fixed-K coalitions as a Flower strategy (the HK paper's "FL + Coalition" baseline)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from bouquet.algorithms.coalitions_fixed_k import FIXED_K_GEOMETRIES, fixed_k_coalitions
from bouquet.strategies.coalitions import CoalitionFedAvg

__all__ = ["FixedKFedAvg"]

log = logging.getLogger(__name__)


class FixedKFedAvg(CoalitionFedAvg):
    """FedAvg whose aggregation partitions the round's models into K coalitions by k-means.

    Parameters
    ----------
    k : int, default 2
        Number of coalitions per round (fewer when fewer clients reply).
    geometry : {"euclidean", "cosine"}, default "euclidean"
        k-means on the models or on the unit-normalised models.
    **kwargs
        :class:`CoalitionFedAvg` / :class:`SeededFedAvg` / Flower ``FedAvg``
        arguments.  k-means is seeded per round with ``[seed, round]``.
    """

    def __init__(self, *, k: int = 2, geometry: str = "euclidean", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if geometry not in FIXED_K_GEOMETRIES:
            raise ValueError(f"geometry must be one of {FIXED_K_GEOMETRIES}, got {geometry!r}")
        if int(k) != k or k < 1:
            raise ValueError(f"k must be a positive integer, got {k}")
        self.k, self.geometry = int(k), geometry
        self.label = f"fixed-K {geometry} K={self.k}"

    def form_coalitions(self, server_round: int, weights: np.ndarray,
                        node_ids: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        seed = int(np.random.default_rng([self.seed, server_round]).integers(2**31))
        return fixed_k_coalitions(weights, self.k, self.geometry, seed=seed), {}

    def summary(self) -> None:
        log.info("\t├──> Fixed-K coalition aggregation: K=%d, %s", self.k, self.geometry)
        super().summary()
