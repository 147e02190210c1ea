"""Who takes part in a round: the stable node order and the seeded uniform sampler.

Flower gives each SuperNode a random 64-bit node id, new in every simulation run, so a draw over node
ids would pick different clients each run with the same seed.  :class:`NodeOrder` asks every node it has
not seen yet, once, for its stable key (``query.identify``, :mod:`bouquet.node_identity`) and orders
nodes by it; nodes that report none come last, by node id, with a warning.  Replies are aggregated in
that order too (float sums are not associative).

:class:`UniformSampler` draws ``clients_per_round`` nodes with ``default_rng([seed, round])`` (or
``fraction_train`` of them when no count is given) and the evaluators with ``default_rng([seed, round,
1])``; Flower's FedAvg uses the unseeded global ``random``.  Any object with the :class:`Sampler` methods
can take its place (:mod:`bouquet.strategies.selection` is the other one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from bouquet.messages import MessageFactory
from bouquet.node_identity import identify_nodes
from bouquet.strategies.params import SamplingParams
from bouquet.strategies.rounds import RoundContext, Sample

__all__ = ["NodeOrder", "Sampler", "UniformSampler", "draw_nodes", "evaluation_count", "training_count"]

log = logging.getLogger(__name__)


def draw_nodes(nodes: list[int], count: int, rng: np.random.Generator) -> list[int]:
    """``min(count, len(nodes))`` of ``nodes`` drawn uniformly without replacement, in ``nodes`` order."""
    picked = rng.choice(len(nodes), size=min(count, len(nodes)), replace=False)  # ids are uint64: draw positions
    return [nodes[int(k)] for k in sorted(picked)]


def training_count(params: SamplingParams, connected: int) -> int:
    """Nodes to train: ``clients_per_round``, or ``max(int(n * fraction_train), min_train_nodes)`` (0 if off)."""
    if params.clients_per_round is not None:
        return params.clients_per_round
    if params.fraction_train == 0:
        return 0
    return max(int(connected * params.fraction_train), params.min_train_nodes)


def evaluation_count(params: SamplingParams, connected: int) -> int:
    """Nodes to evaluate: ``max(int(n * fraction_evaluate), min_evaluate_nodes)``, at most n (0 if off)."""
    if params.fraction_evaluate == 0:
        return 0
    return min(connected, max(int(connected * params.fraction_evaluate), params.min_evaluate_nodes))


class NodeOrder:
    """Stable order of the connected nodes, by the key each reports once (see the module docstring).

    Parameters
    ----------
    wait_seconds : float
        How long to wait for nodes to connect and for identity replies.
    new_message : MessageFactory
        Builds the ``query.identify`` messages.
    """

    def __init__(self, wait_seconds: float, new_message: MessageFactory) -> None:
        self.wait_seconds = wait_seconds
        self.new_message = new_message
        self.keys: dict[int, int | None] = {}  # node id -> stable key (None: the node reported none)

    def state_dict(self) -> dict[str, Any]:
        return {"keys": {str(node): key for node, key in self.keys.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.keys = {int(node): key for node, key in state["keys"].items()}

    def rank(self, node: int) -> tuple[bool, int, int]:
        key = self.keys.get(node)
        return key is None, key if key is not None else 0, node

    def order(self, grid: Grid, nodes: Iterable[int]) -> list[int]:
        """``nodes`` by their stable key (asked once per node), keyless ones last by node id."""
        nodes = list(nodes)
        new = [n for n in nodes if n not in self.keys]
        if new:
            keys = identify_nodes(grid, new, self.wait_seconds, self.new_message)
            self.keys.update({n: keys.get(n) for n in new})
            keyless = [n for n in new if keys.get(n) is None]
            if keyless:
                silent = sum(n not in keys for n in new)
                why = f"; {silent} of them did not answer at all" if silent else ""
                log.warning("%d of %d nodes report no stable identity (no query.identify handler, see "
                            "bouquet.node_identity%s): they are ordered by node id, which Flower draws at random, "
                            "so their sampling differs from run to run", len(keyless), len(new), why)
            known = [self.keys[n] for n in nodes if self.keys[n] is not None]
            if len(set(known)) < len(known):
                log.warning("two connected nodes report the same identity key; they are ordered by node id")
        return sorted(nodes, key=self.rank)

    def sorted_replies(self, replies: Iterable[Message]) -> list[Message]:
        """Replies in the stable node order, not the (run-dependent) order they arrived in."""
        return sorted(replies, key=lambda msg: self.rank(msg.metadata.src_node_id))

    def connected(self, grid: Grid, server_round: int, count: int) -> list[int]:
        """Connected nodes in stable order, after waiting up to ``wait_seconds`` for ``count`` of them."""
        deadline = time.monotonic() + self.wait_seconds
        while len(nodes := list(grid.get_node_ids())) < count and time.monotonic() < deadline:
            time.sleep(0.5)
        if len(nodes) < count:
            log.warning("round %d: only %d nodes connected, %d requested; using all of them",
                        server_round, len(nodes), count)
        return self.order(grid, nodes)


class Sampler(Protocol):
    """Who trains and who evaluates each round (a part of :class:`bouquet.strategies.BouquetStrategy`)."""

    sampling: SamplingParams

    def sample_train(self, context: RoundContext) -> Sample: ...

    def sample_evaluate(self, context: RoundContext) -> Sample: ...

    def train_config(self, server_round: int) -> dict[str, Any]: ...

    def observe_train(self, server_round: int, replies: list[Message]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> list[str]: ...


class UniformSampler:
    """Seeded uniform sampling without replacement (module docstring).

    Parameters
    ----------
    sampling : SamplingParams
    """

    def __init__(self, sampling: SamplingParams | None = None) -> None:
        self.sampling = sampling if sampling is not None else SamplingParams()

    def sample_train(self, context: RoundContext) -> Sample:
        p = self.sampling
        if p.clients_per_round is not None:
            nodes = context.nodes.connected(context.grid, context.server_round, p.clients_per_round)
        else:
            nodes = context.nodes.connected(context.grid, context.server_round, p.min_available_nodes)
        count = training_count(p, len(nodes))
        picked = draw_nodes(nodes, count, np.random.default_rng([p.seed, context.server_round]))
        log.info("configure_train: sampled %d nodes (seed %d, round %d)", len(picked), p.seed, context.server_round)
        return Sample(tuple(picked))

    def sample_evaluate(self, context: RoundContext) -> Sample:
        p = self.sampling
        if p.fraction_evaluate == 0:
            return Sample(())
        nodes = context.nodes.connected(context.grid, context.server_round, p.min_available_nodes)
        count = evaluation_count(p, len(nodes))
        if count >= len(nodes):
            return Sample(tuple(nodes))
        picked = draw_nodes(nodes, count, np.random.default_rng([p.seed, context.server_round, 1]))
        log.info("configure_evaluate: sampled %d of %d nodes (seed %d, round %d)", len(picked), len(nodes), p.seed,
                 context.server_round)
        return Sample(tuple(picked))

    def train_config(self, server_round: int) -> dict[str, Any]:
        return {}

    def observe_train(self, server_round: int, replies: list[Message]) -> None:
        """Uniform sampling learns nothing from replies."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: every draw follows from the seed and the round."""

    def describe(self) -> list[str]:
        p = self.sampling
        count = p.clients_per_round if p.clients_per_round is not None else f"fraction {p.fraction_train:.2f}"
        return [f"Sampling: {count} per round, seed {p.seed}, evaluate fraction {p.fraction_evaluate:.2f}"]
