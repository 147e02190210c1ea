"""A server optimiser around any aggregator: FedAdam, FedYogi or FedAdagrad on the shared model.

:class:`ServerOptimizer` wraps an aggregator part (FedAvg's mean, HK or fixed-K coalitions, a robust rule):
the inner aggregate minus the shared model the clients were sent is the pseudo-gradient, and
:func:`bouquet.algorithms.fedopt.fedopt_step` moves the shared model (Reddi et al. 2021).  Coalition models
served per group (``coalition-models = "personal"``) are kept as the inner aggregator made them; only the
shared model takes the server step.  The moments are the part's state, saved in checkpoints
(:meth:`ServerOptimizer.state_dict`, as every part with state).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from bouquet.algorithms.fedopt import ServerOptParams, fedopt_step
from bouquet.strategies.aggregation import Aggregator, AggregatorDefaults
from bouquet.strategies.models import SHARED
from bouquet.strategies.rounds import Aggregate, ClientUpdates

__all__ = ["ServerOptimizer"]

log = logging.getLogger(__name__)


class ServerOptimizer(AggregatorDefaults):
    """``inner``'s aggregate, then a FedOpt step of the shared model.

    Parameters
    ----------
    inner : Aggregator
        What the replies become before the server step.
    params : ServerOptParams
        The optimiser (not ``"none"``) and its settings.
    """

    def __init__(self, inner: Aggregator, params: ServerOptParams) -> None:
        if not params.active:
            raise ValueError("ServerOptimizer needs server-optimizer adam, yogi or adagrad")
        self.inner = inner
        self.params = params
        self.label = inner.label
        self._m: dict[str, np.ndarray] | None = None
        self._v: dict[str, np.ndarray] | None = None

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        aggregate = self.inner.aggregate(updates)
        if aggregate.model is None:
            return aggregate
        updates.require_references("a server optimizer steps from the model the clients were sent")
        shared = [ref for ref, key in zip(updates.references, updates.keys()) if key == SHARED]
        if not shared:
            log.warning("round %d: no client was sent the shared model; the server optimizer skips the round",
                        updates.server_round)
            return aggregate
        model, self._m, self._v = fedopt_step(shared[0], aggregate.model, self._m, self._v, self.params,
                                              updates.server_round)
        step = float(np.sqrt(sum(float(np.sum((model[k].astype(np.float64) - shared[0][k]) ** 2)) for k in self._m)))
        summary = "; ".join(s for s in (aggregate.summary, f"server {self.params.optimizer} step {step:.3g}") if s)
        return dataclasses.replace(aggregate, model=model, summary=summary,
                                   report={**aggregate.report, "server-step-norm": step})

    def state_dict(self) -> dict[str, dict[str, np.ndarray]]:
        """The moments, as named arrays per moment (empty before the first step): what a checkpoint keeps
        (numpy arrays travel as arrays, their dtype kept)."""
        if self._m is None or self._v is None:
            return {}
        return {"m": dict(self._m), "v": dict(self._v)}

    def load_state_dict(self, state: dict[str, dict[str, np.ndarray]] | None) -> None:
        """Go on from :meth:`state_dict` (empty or None: from zero moments)."""
        state = state or {}
        self._m = {k: np.asarray(a) for k, a in state["m"].items()} if "m" in state else None
        self._v = {k: np.asarray(a) for k, a in state["v"].items()} if "v" in state else None

    def describe(self) -> list[str]:
        p = self.params
        line = (f"Server optimizer: Fed{p.optimizer.capitalize()} (eta={p.learning_rate:g}, beta_1={p.beta_1:g}, "
                f"beta_2={p.beta_2:g}, tau={p.tau:g})")
        return [*self.inner.describe(), line]
