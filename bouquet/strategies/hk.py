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
from flwr.app import ArrayRecord, RecordDict

from bouquet.algorithms.hk import HKParams, hk_aggregate
from bouquet.strategies.arrays import stack_records
from bouquet.strategies.base import SeededFedAvg

__all__ = ["HKFedAvg"]

log = logging.getLogger(__name__)


class HKFedAvg(SeededFedAvg):
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
    record_trajectories : bool, default False
        Keep each round's ``P^(s)`` matrices in ``self.trajectories`` (for
        Figure-3-style plots).
    **kwargs
        :class:`bouquet.strategies.base.SeededFedAvg` / Flower ``FedAvg``
        arguments (``fraction_train``, ``clients_per_round``, ``seed``, ...).
    """

    def __init__(self, *, geometry: str = "cosine", tau: float = 0.75, eps_l: float = -1.0, eps_r: float = 1.0,
                 delta: float = 1e-6, s_max: int = 50, coalition_tol: float = 1e-6,
                 opinions: str = "auto", barycenter_weighting: str = "uniform",
                 record_trajectories: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.params = HKParams(geometry=geometry, tau=tau, eps_l=eps_l, eps_r=eps_r, delta=delta, s_max=s_max,
                               coalition_tol=coalition_tol, opinions=opinions,
                               barycenter_weighting=barycenter_weighting)
        self.record_trajectories = record_trajectories
        self.trajectories: dict[int, dict[str, Any]] = {}

    def aggregate_arrays(self, server_round: int, replies: list[RecordDict],
                         node_ids: list[int]) -> tuple[ArrayRecord, dict[str, Any]]:
        records = [reply.array_records[self.arrayrecord_key] for reply in replies]
        weights, layout = stack_records(records)
        nonzero = np.linalg.norm(weights, axis=1) > 0
        for node in np.asarray(node_ids)[~nonzero]:
            log.warning("round %d: reply of node %d excluded: all-zero weights have no direction for HK",
                        server_round, int(node))
        weights, kept = weights[nonzero], [n for n, ok in zip(node_ids, nonzero) if ok]
        kept_replies = [r for r, ok in zip(replies, nonzero) if ok]
        examples = None
        if self.params.barycenter_weighting == "samples":
            examples = np.array([float(next(iter(r.metric_records.values()))[self.weighted_by_key])
                                 for r in kept_replies])
        aggregate, result = hk_aggregate(weights, self.params, num_examples=examples,
                                         record=self.record_trajectories)
        sizes = sorted(result.sizes.tolist(), reverse=True)
        report = {"coalitions": result.num_coalitions, "coalition-sizes": sizes,
                  "singletons": int(sum(1 for s in sizes if s == 1)), "hk-steps": result.steps,
                  "hk-converged": result.converged, "excluded-zero": int((~nonzero).sum())}
        log.info("round %d: HK %s tau=%s -> K=%d coalitions, sizes %s, %d singletons, %d inner steps%s",
                 server_round, self.params.geometry, self.params.tau, result.num_coalitions, sizes,
                 report["singletons"], result.steps, "" if result.converged else " (s_max reached)")
        if self.recorder is not None:
            self.recorder.append_rows("coalitions", [
                {"round": server_round, "node_id": node, **self._identity(reply), "coalition": int(label),
                 "coalition_size": int(result.sizes[label])}
                for node, reply, label in zip(kept, kept_replies, result.labels)])
        if self.record_trajectories:
            self.trajectories[server_round] = {"node_ids": kept, "labels": result.labels,
                                               "history": result.history, "gram": result.gram}
        return layout.unflatten(aggregate, records[0]), report

    @staticmethod
    def _identity(reply: RecordDict) -> dict[str, Any]:
        info = reply.config_records.get("info")
        return {"partition-id": info.get("partition-id", ""), "household": info.get("household", "")} if info \
            else {"partition-id": "", "household": ""}

    def summary(self) -> None:
        log.info("\t├──> HK coalition aggregation: %s",
                 ", ".join(f"{k}={v}" for k, v in asdict(self.params).items()))
        super().summary()
