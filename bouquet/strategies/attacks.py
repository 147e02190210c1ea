"""The server's side of the attack harness: count the attackers in each round, apply ALIE / IPM in simulation.

Attacking ClientApps flag themselves (``attacker = true`` in their reply's ``info`` record;
:mod:`bouquet.client_app`).  :class:`AttackHarness` wraps any aggregator: it reports how many of the
round's usable replies came from attackers and their share of the new shared model
(:func:`bouquet.algorithms.attacks.attacker_share`), and, for the attacks that need every honest update of
the round (``alie``, ``ipm``), replaces each attacker's model with ``theta_i + attack(honest updates)``
before the wrapped aggregator sees the round.  This is a simulation device (an omniscient attacker); in a
deployment the attackers are whatever the nodes send.  With ``attack-oracle`` it drops the attackers'
replies instead (the reference a perfect defence would reach).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bouquet.algorithms.attacks import SERVER_ATTACKS, AttackParams, alie, attacker_share, ipm
from bouquet.strategies.aggregation import Aggregator, AggregatorDefaults
from bouquet.strategies.rounds import Aggregate, ClientUpdates

__all__ = ["AttackHarness"]


class AttackHarness(AggregatorDefaults):
    """An aggregator that reports the round's attackers and, for ALIE / IPM, forges their models.

    Parameters
    ----------
    inner : Aggregator
        What aggregates the (possibly forged) round.
    params : AttackParams
        The run's attack; ``alie`` and ``ipm`` are applied here, the others only counted.
    """

    def __init__(self, inner: Aggregator, params: AttackParams) -> None:
        self.inner = inner
        self.params = params
        self.label = inner.label

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        flags = np.array([bool(identity.get("attacker", False)) for identity in updates.identities] or
                         [False] * len(updates), dtype=bool)
        forged = self.params.attack in SERVER_ATTACKS and flags.any() and (~flags).sum() >= 2
        if forged:
            updates = self._forge(updates, flags)
        dropped = self.params.oracle and flags.any() and not flags.all()
        aggregate = self.inner.aggregate(updates.subset(~flags) if dropped else updates)
        nodes = [int(n) for n, f in zip(updates.node_ids, flags) if f]
        report = {**aggregate.report, "attackers": len(nodes), "attacker-nodes": nodes,
                  "attacker-share": self._share(updates, flags, aggregate)}
        if self.params.oracle:
            report["oracle-dropped"] = len(nodes) if dropped else 0
        return dataclasses.replace(aggregate, report=report)

    @staticmethod
    def _share(updates: ClientUpdates, flags: np.ndarray, aggregate: Aggregate) -> float | None:
        """The attackers' share of the new shared model (None: no model, or no attackers or no honest reply)."""
        if aggregate.model is None or not flags.any() or flags.all():
            return None
        matrix, layout = updates.stacked
        share = attacker_share(matrix, np.asarray(updates.num_examples, dtype=np.float64), flags,
                               layout.flatten(aggregate.model, np.float64))
        return round(share, 6) if np.isfinite(share) else None

    def _forge(self, updates: ClientUpdates, flags: np.ndarray) -> ClientUpdates:
        matrix, layout = updates.stacked
        references = updates.reference_matrix(layout, np.float64)
        deltas = matrix.astype(np.float64) - references
        rule = alie if self.params.attack == "alie" else ipm
        bad = rule(deltas[~flags], self.params.strength)
        models = list(updates.models)
        for row in np.flatnonzero(flags):
            models[row] = layout.unflatten((references[row] + bad).astype(matrix.dtype), updates.models[row])
        return dataclasses.replace(updates, models=tuple(models))

    def describe(self) -> list[str]:
        p = self.params
        where = "forged by the server from the honest updates" if p.attack in SERVER_ATTACKS else "sent by the clients"
        oracle = "; the oracle drops their replies" if p.oracle else ""
        return [*self.inner.describe(),
                f"Attack: {p.attack}, {p.fraction:.0%} of the partitions, s={p.strength:g} ({where}{oracle})"]
