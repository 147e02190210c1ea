"""Coalition aggregation as a Flower strategy: the shared adapter of HK and fixed-K.

:class:`CoalitionFedAvg` turns the screened replies into a (clients x
parameters) matrix, asks :meth:`CoalitionFedAvg.form_coalitions` for a
partition, and returns the uniform mean of the coalition barycenters of the
original models (HK paper eq. 15-16).  It logs and records K^t, coalition
sizes, singletons and (with a recorder) each client's coalition in
``coalitions.csv``.  All-zero models are excluded with a warning naming the
node (they have no direction, and no trained model is all zeros).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from bouquet.algorithms.hk import coalition_weights
from bouquet.strategies.arrays import stack_records
from bouquet.strategies.base import SeededFedAvg

__all__ = ["CoalitionFedAvg"]

log = logging.getLogger(__name__)


class CoalitionFedAvg(SeededFedAvg):
    """FedAvg whose aggregation is the uniform mean of coalition barycenters.

    Parameters
    ----------
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
        Members count equally in their barycenter (paper eq. 15) or by
        ``num-examples``; coalitions always count equally (eq. 16).
    **kwargs
        :class:`bouquet.strategies.base.SeededFedAvg` / Flower ``FedAvg`` arguments.
    """

    label = "coalitions"

    def __init__(self, *, barycenter_weighting: str = "uniform", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if barycenter_weighting not in ("uniform", "samples"):
            raise ValueError(f"barycenter_weighting must be 'uniform' or 'samples', got {barycenter_weighting!r}")
        self.barycenter_weighting = barycenter_weighting

    def form_coalitions(self, server_round: int, weights: np.ndarray,
                        node_ids: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        """Coalition id per row of ``weights`` (S x d) and scalar metrics to report (override me)."""
        raise NotImplementedError

    def aggregate_arrays(self, server_round: int, replies: list[RecordDict],
                         node_ids: list[int]) -> tuple[ArrayRecord, dict[str, Any]]:
        records = [reply.array_records[self.arrayrecord_key] for reply in replies]
        weights, layout = stack_records(records)
        nonzero = np.linalg.norm(weights, axis=1) > 0
        kept, kept_replies = list(node_ids), list(replies)
        if not nonzero.all():  # copy the matrix only when a row must go
            for node in np.asarray(node_ids)[~nonzero]:
                log.warning("round %d: reply of node %d excluded: all-zero weights", server_round, int(node))
            weights = weights[nonzero]
            kept = [n for n, ok in zip(node_ids, nonzero) if ok]
            kept_replies = [r for r, ok in zip(replies, nonzero) if ok]
        labels, extra = self.form_coalitions(server_round, weights, kept)
        examples = None
        if self.barycenter_weighting == "samples":
            examples = np.array([float(next(iter(r.metric_records.values()))[self.weighted_by_key])
                                 for r in kept_replies])
        aggregate = coalition_weights(labels, examples).astype(weights.dtype) @ weights
        sizes_by_label = np.bincount(labels)
        sizes = sorted(sizes_by_label.tolist(), reverse=True)
        report = {"coalitions": len(sizes), "coalition-sizes": sizes,
                  "singletons": int(sum(1 for s in sizes if s == 1)), "excluded-zero": int((~nonzero).sum()),
                  **extra}
        log.info("round %d: %s -> K=%d coalitions, sizes %s, %d singletons%s", server_round, self.label,
                 len(sizes), sizes, report["singletons"],
                 "".join(f", {k} {v}" for k, v in extra.items()))
        if self.recorder is not None:
            self.recorder.append_rows("coalitions", [
                {"round": server_round, "node_id": node, **_identity(reply), "coalition": int(label),
                 "coalition_size": int(sizes_by_label[label])}
                for node, reply, label in zip(kept, kept_replies, labels)])
        return layout.unflatten(aggregate, records[0]), report


def _identity(reply: RecordDict) -> dict[str, Any]:
    """Partition id and household of a bouquet client reply (blank for other apps)."""
    info = reply.config_records.get("info")
    if info is None:
        return {"partition-id": "", "household": ""}
    return {"partition-id": info.get("partition-id", ""), "household": info.get("household", "")}
