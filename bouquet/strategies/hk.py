"""HK coalition aggregation as a Flower strategy (Message API).

``HKFedAvg`` is Flower's FedAvg (sampling, evaluation, metric aggregation) with
the aggregation of the training replies replaced by Hegselmann-Krause coalition
formation (:mod:`bouquet.algorithms.hk`).  Swap it in for ``FedAvg`` in any
Flower app::

    strategy = HKFedAvg(geometry="cosine", tau=0.75, fraction_train=0.5)

Per round it logs and records K^t, coalition sizes, singletons, inner steps,
convergence and aggregation time, and (with a recorder) the membership of each
client in ``coalitions.csv``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import numpy as np

from bouquet.algorithms.hk import HKParams, hk_coalitions
from bouquet.strategies.arrays import stack_records
from bouquet.strategies.coalitions import CoalitionFedAvg

__all__ = ["HKFedAvg"]

log = logging.getLogger(__name__)


class HKFedAvg(CoalitionFedAvg):
    """FedAvg whose aggregation is HK coalition formation (paper eq. 10-16).

    Parameters
    ----------
    geometry : {"euclidean", "cosine", "cosine-bounded"}, default "cosine"
    tau : float, default 0.75
        Euclidean radius on unit vectors or cosine threshold (paper grid
        {0.5, 0.75, 0.9}).
    eps_l, eps_r : float, default -1, 1
        Two-sided cosine bound (``geometry="cosine-bounded"``).
    delta : float, default 1e-6
        Inner stopping tolerance.
    s_max : int, default 50
        Inner step cap.
    coalition_tol : float, default 1e-6
        Relative tolerance for "same limiting opinion".
    opinions : {"auto", "normalized", "raw"}, default "auto"
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
        See :class:`bouquet.algorithms.hk.HKParams`.
    opinion_space : {"weights", "updates"}, default "weights"
        HK on the post-training weights (the paper) or on the updates
        ``w_i - theta`` (theta = the global model sent this round; an option of
        ours, see docs/METHODS.md).  Aggregation always averages the weights.
        A client whose update is exactly zero forms a singleton.
    record_trajectories : bool, default False
        Keep each round's ``P^(s)`` matrices and Gram matrix in
        ``self.trajectories`` (for Figure-3-style plots).
    **kwargs
        :class:`bouquet.strategies.base.SeededFedAvg` / Flower ``FedAvg``
        arguments (``fraction_train``, ``clients_per_round``, ``seed``, ...).
    """

    def __init__(self, *, geometry: str = "cosine", tau: float = 0.75, eps_l: float = -1.0, eps_r: float = 1.0,
                 delta: float = 1e-6, s_max: int = 50, coalition_tol: float = 1e-6, opinions: str = "auto",
                 barycenter_weighting: str = "uniform", opinion_space: str = "weights",
                 record_trajectories: bool = False, **kwargs: Any) -> None:
        if opinion_space not in ("weights", "updates"):
            raise ValueError(f"opinion_space must be 'weights' or 'updates', got {opinion_space!r}")
        self.opinion_space = opinion_space
        self.params = HKParams(geometry=geometry, tau=tau, eps_l=eps_l, eps_r=eps_r, delta=delta, s_max=s_max,
                               coalition_tol=coalition_tol, opinions=opinions,
                               barycenter_weighting=barycenter_weighting)
        super().__init__(barycenter_weighting=barycenter_weighting, **kwargs)
        self.label = f"HK {self.params.geometry} tau={self.params.tau}"
        self.record_trajectories = record_trajectories
        self.trajectories: dict[int, dict[str, Any]] = {}

    def form_coalitions(self, server_round: int, weights: np.ndarray,
                        node_ids: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        opinions = weights
        if self.opinion_space == "updates":
            global_row, _ = stack_records([self._sent_arrays], dtype=weights.dtype)
            opinions = weights - global_row
            still = np.linalg.norm(opinions, axis=1) == 0
            if still.any():  # no update, no direction: a singleton each, HK on the others
                labels = np.empty(len(weights), dtype=int)
                moved = np.flatnonzero(~still)
                inner, report = self._hk(server_round, opinions[moved], [node_ids[i] for i in moved])
                labels[moved] = inner
                labels[still] = inner.max() + 1 + np.arange(still.sum()) if moved.size else np.arange(still.sum())
                return labels, report
        return self._hk(server_round, opinions, node_ids)

    def _hk(self, server_round: int, opinions: np.ndarray,
            node_ids: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        result = hk_coalitions(opinions, self.params, record=self.record_trajectories)
        if self.record_trajectories:
            self.trajectories[server_round] = {"node_ids": list(node_ids), "labels": result.labels,
                                               "history": result.history, "gram": result.gram}
        if not result.converged:
            log.warning("round %d: HK stopped at s_max=%d before converging", server_round, self.params.s_max)
        return result.labels, {"hk-steps": result.steps, "hk-converged": result.converged}

    def summary(self) -> None:
        log.info("\t├──> HK coalition aggregation on %s: %s", self.opinion_space,
                 ", ".join(f"{k}={v}" for k, v in asdict(self.params).items()))
        super().summary()
