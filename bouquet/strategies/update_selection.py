"""Selection of whose updates are aggregated (``sketch-source = "local-update"``), as an aggregator part.

The SCKM paper's experiments (Section 6.1) have every client train its local mini-batches each round, and
its sketch is of "the gradient that is then aggregated" (Section 3, eqs. 1-2): selection may decide whose
*updates* enter the aggregate rather than who trains.  :class:`UpdateSelection` wraps any aggregator and
does that: the sampler trains every candidate, and of the round's usable replies it keeps the budget B
chosen by a selector over sketches of the updates ``w_i - w`` (each node's model minus the one it was
sent), on the same coordinates the clients' gradient sketches use (:func:`bouquet.algorithms.sckm.sketch_indices`
with the round seed ``[seed, round]``, a ``sketch-fraction`` of every floating tensor).  The server has the
whole updates, so it takes the sketches itself; no client code changes.  An update is about ``-lr`` times
the sum of the local gradients, so ``sckm-sign = 1`` here ranks by the deltas, which is ``-1`` on gradients.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bouquet.algorithms.sckm import sketch_indices
from bouquet.algorithms.selection import Candidates, Selector
from bouquet.strategies.aggregation import Aggregator, AggregatorDefaults
from bouquet.strategies.params import UPDATE_SELECTOR_NEEDS
from bouquet.strategies.rounds import Aggregate, ClientUpdates

__all__ = ["UpdateSelection", "update_sketches"]


def update_sketches(updates: ClientUpdates, fraction: float) -> tuple[np.ndarray, list[int]]:
    """Sketches of the round's updates ``w_i - w`` on the shared coordinates: ``(S x d')``, per-tensor sizes.

    Coordinates: ``sketch_indices(sizes of the floating tensors, fraction, [seed, server_round])``.
    """
    matrix, layout = updates.stacked
    sizes = [int(np.prod(shape)) for shape in layout.shapes]
    picks = sketch_indices(sizes, fraction, [updates.seed, updates.server_round])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    columns = np.concatenate([offset + pick for offset, pick in zip(offsets, picks)])
    deltas = matrix[:, columns].astype(np.float64) - updates.reference_matrix(layout, np.float64, columns)
    return deltas, [len(pick) for pick in picks]


class UpdateSelection(AggregatorDefaults):
    """An aggregator that lets ``selector`` choose which ``budget`` of the round's updates ``inner`` aggregates.

    Parameters
    ----------
    inner : Aggregator
        What aggregates the chosen updates.
    selector : Selector
        Any selector that needs at most sketches and example counts (:data:`UPDATE_SELECTOR_NEEDS`):
        ``random``, ``sckm-select``, ``sckm-cluster``, ``kmeans``, ``cosine``, ``divfl``.  Ties are broken
        by the round seed (no participation ages are kept).
    budget : int
        B; a round with fewer usable updates aggregates all of them.
    fraction : float
        Share of every tensor in a sketch (``sketch-fraction``).

    Raises
    ------
    ValueError
        A selector that needs what updates do not carry (losses).
    """

    def __init__(self, inner: Aggregator, selector: Selector, budget: int, fraction: float) -> None:
        missing = [need for need in selector.needs if need not in UPDATE_SELECTOR_NEEDS]
        if missing:
            raise ValueError(f"selection {selector.name!r} needs {', '.join(missing)}, which training replies do "
                             f"not carry; with sketch-source 'local-update' use one that reads sketches only")
        if budget < 1:
            raise ValueError(f"the budget must be >= 1, got {budget}")
        self.inner = inner
        self.selector = selector
        self.budget = budget
        self.fraction = fraction
        self.label = inner.label

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        if len(updates) <= self.budget:
            aggregate = self.inner.aggregate(updates)
            chosen = list(updates.node_ids)
            report = {}
        else:
            sketches, sizes = update_sketches(updates, self.fraction)
            candidates = Candidates(ids=list(updates.node_ids), sketches=sketches, layer_sizes=sizes,
                                    num_examples=np.asarray(updates.num_examples, dtype=np.float64))
            rng = np.random.default_rng([updates.seed, updates.server_round, 1])
            choice = self.selector.select(candidates, self.budget, rng)
            keep = np.zeros(len(updates), dtype=bool)
            keep[choice.indices] = True
            aggregate = self.inner.aggregate(updates.subset(keep))
            chosen = [int(updates.node_ids[i]) for i in choice.indices]
            report = {f"update-{key}": value for key, value in choice.report.items()
                      if key not in ("cluster-labels",)}
        report = {**aggregate.report, **report, "updates-trained": len(updates), "updates-aggregated": len(chosen),
                  "update-nodes": sorted(chosen)}
        return dataclasses.replace(aggregate, report=report)

    def describe(self) -> list[str]:
        return [*self.inner.describe(),
                (f"Selection of updates: {self.selector.name} keeps {self.budget} of the trained updates "
                f"(sketch-source local-update, {self.fraction:.2%} sketches of w_i - w)")]
