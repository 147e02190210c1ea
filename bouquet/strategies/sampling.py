"""Who takes part in a round: the stable node order and the seeded uniform sampler.

Flower gives each SuperNode a random 64-bit node id, new in every simulation run, so a draw over node
ids would pick different clients each run with the same seed.  With ``identify_nodes`` on (an app whose
ClientApp registers :func:`bouquet.node_identity.register_identity_query`; bouquet's app does),
:class:`NodeOrder` asks every node it has not seen yet, once, for its stable key (``query.identify``) and
orders nodes by it; nodes that report none come last, by node id, with a warning.  Off (the default, for
any other app): no query is sent, nodes are ordered by node id, and one log line says so.  Replies are
aggregated in that order too (float sums are not associative).

:class:`UniformSampler` follows Flower's FedAvg sampling rule (``max(int(n * fraction_train),
min_train_nodes)`` nodes, after waiting for ``max(min_available_nodes, min_train_nodes)`` to connect;
the same for evaluation) or trains ``clients_per_round`` nodes, drawn with ``default_rng([seed, round])``
and the evaluators with ``default_rng([seed, round, 1])``; Flower's FedAvg uses the unseeded global
``random``.  Any object with the :class:`Sampler` methods can take its place
(:mod:`bouquet.strategies.selection` is the other one).
"""

from __future__ import annotations

import logging
import math
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
from bouquet.transport import FLOWER_TRANSPORT, Transport

__all__ = ["NodeOrder", "Sampler", "UniformSampler", "draw_nodes", "evaluation_count", "evaluation_wait",
           "training_count", "training_wait"]

log = logging.getLogger(__name__)


def draw_nodes(nodes: list[int], count: int, rng: np.random.Generator) -> list[int]:
    """``min(count, len(nodes))`` of ``nodes`` drawn uniformly without replacement, in ``nodes`` order."""
    picked = rng.choice(len(nodes), size=min(count, len(nodes)), replace=False)  # ids are uint64: draw positions
    return [nodes[int(k)] for k in sorted(picked)]


def training_count(params: SamplingParams, connected: int) -> int:
    """Nodes to train: ``clients_per_round``, or ``max(int(n * fraction_train), min_train_nodes)`` (0 if off),
    at most n (when the wait for more ran out)."""
    if params.clients_per_round is not None:
        return min(connected, params.clients_per_round)
    if params.fraction_train == 0:
        return 0
    return min(connected, max(int(connected * params.fraction_train), params.min_train_nodes))


def evaluation_count(params: SamplingParams, connected: int) -> int:
    """Nodes to evaluate: ``max(int(n * fraction_evaluate), min_evaluate_nodes)``, at most n (0 if off)."""
    if params.fraction_evaluate == 0:
        return 0
    return min(connected, max(int(connected * params.fraction_evaluate), params.min_evaluate_nodes))


def training_wait(params: SamplingParams) -> int:
    """Connected nodes to wait for before drawing trainers: the count asked for, or Flower's
    ``max(min_available_nodes, min_train_nodes)``."""
    if params.clients_per_round is not None:
        return params.clients_per_round
    return max(params.min_available_nodes, params.min_train_nodes) if params.fraction_train > 0 else 0


def evaluation_wait(params: SamplingParams) -> int:
    """Connected nodes to wait for before drawing evaluators: ``max(min_available_nodes, min_evaluate_nodes)``."""
    return max(params.min_available_nodes, params.min_evaluate_nodes) if params.fraction_evaluate > 0 else 0


class NodeOrder:
    """Stable order of the connected nodes, by the key each reports once (see the module docstring).

    Parameters
    ----------
    wait_seconds : float
        How long to wait for nodes to connect and for identity replies.
    new_message : MessageFactory
        Builds the ``query.identify`` messages.
    identify : bool, default False
        Ask new nodes for their key (the app registers the handler); False: order by node id, no query.
    transport : Transport, default FLOWER_TRANSPORT
        How the identity query travels (:class:`bouquet.transport.FlowerTransport`: ``grid.send_and_receive``).
    """

    def __init__(self, wait_seconds: float, new_message: MessageFactory, identify: bool = False,
                 transport: Transport = FLOWER_TRANSPORT) -> None:
        self.wait_seconds = wait_seconds
        self.new_message = new_message
        self.identify = identify
        self.transport = transport
        self.keys: dict[int, int | None] = {}  # node id -> stable key (None: the node reported none)
        self._said = False  # the one line saying nodes go by node id

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
        if new and not self.identify:
            self.keys.update(dict.fromkeys(new))
            if not self._said:
                self._said = True
                log.info("nodes are ordered by node id (identify_nodes is off, so no query.identify is sent); "
                         "Flower draws node ids anew in every simulation run, so the same seed samples other "
                         "clients across runs unless the ClientApp calls "
                         "bouquet.node_identity.register_identity_query and the strategy is given "
                         "identify_nodes=True")
        elif new:
            keys = identify_nodes(grid, new, self.wait_seconds, self.new_message, transport=self.transport)
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
        """Connected nodes in stable order, after waiting up to ``wait_seconds`` for ``count`` of them.

        While it waits it logs, as Flower's sampler does, every 10 s (the first line at once).
        """
        started = time.monotonic()
        deadline = started + self.wait_seconds
        said = -math.inf
        while len(nodes := list(grid.get_node_ids())) < count and (now := time.monotonic()) < deadline:
            if now - said >= 10.0:
                said = now
                left = "" if math.isinf(deadline) else f", going on with those there in {deadline - now:.0f} s"
                log.info("round %d: waiting for nodes to connect: %d connected, %d needed%s", server_round,
                         len(nodes), count, left)
            time.sleep(0.5)
        if len(nodes) < count:
            log.warning("round %d: only %d nodes connected after %.0f s, %d needed; using all of them",
                        server_round, len(nodes), time.monotonic() - started, count)
        return self.order(grid, nodes)


class Sampler(Protocol):
    """Who trains and who evaluates each round (a part of :class:`bouquet.strategies.BouquetStrategy`)."""

    sampling: SamplingParams
    #: Why ``aggregate_train`` needs the round ``configure_train`` made ("": it does not).
    configure_needed: str

    def sample_train(self, context: RoundContext) -> Sample: ...

    def sample_evaluate(self, context: RoundContext) -> Sample: ...

    def train_config(self, server_round: int) -> dict[str, Any]: ...

    def observe_train(self, server_round: int, replies: list[Message]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> list[str]: ...

    @property
    def history(self) -> list[dict[str, Any]]:
        """The per-round selection records (empty where the sampler keeps none)."""
        ...

    def assign_nodes(self, context: RoundContext, nodes: list[int]) -> dict[int, str] | None:
        """The model key of each of ``nodes`` the sampler assigns itself (IFCA: by loss), or None when the
        model store decides (the final evaluation asks)."""
        ...


class StatelessSampler:
    """The do-nothing half of the :class:`Sampler` protocol, for samplers that keep no state across rounds:
    no train-config entries, nothing learnt from replies, nothing to save or restore, no selection records,
    no assignment of their own."""

    @property
    def history(self) -> list[dict[str, Any]]:
        return []

    def assign_nodes(self, context: RoundContext, nodes: list[int]) -> dict[int, str] | None:
        return None

    def train_config(self, server_round: int) -> dict[str, Any]:
        return {}

    def observe_train(self, server_round: int, replies: list[Message]) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class UniformSampler(StatelessSampler):
    """Seeded uniform sampling without replacement (module docstring); every draw follows from the seed and
    the round, so there is no state.

    Parameters
    ----------
    sampling : SamplingParams
    """

    def __init__(self, sampling: SamplingParams | None = None) -> None:
        self.sampling = sampling if sampling is not None else SamplingParams()

    #: Aggregation needs nothing from the configured round (``aggregate_train`` works on replies alone).
    configure_needed = ""

    def sample_train(self, context: RoundContext) -> Sample:
        p = self.sampling
        if p.clients_per_round is None and p.fraction_train == 0:
            return Sample(())
        nodes = context.nodes.connected(context.grid, context.server_round, training_wait(p))
        count = training_count(p, len(nodes))
        picked = draw_nodes(nodes, count, np.random.default_rng([p.seed, context.server_round]))
        log.info("configure_train: sampled %d nodes (seed %d, round %d)", len(picked), p.seed, context.server_round)
        return Sample(tuple(picked))

    def sample_evaluate(self, context: RoundContext) -> Sample:
        p = self.sampling
        if p.fraction_evaluate == 0:
            return Sample(())
        nodes = context.nodes.connected(context.grid, context.server_round, evaluation_wait(p))
        count = evaluation_count(p, len(nodes))
        if count >= len(nodes):
            return Sample(tuple(nodes))
        picked = draw_nodes(nodes, count, np.random.default_rng([p.seed, context.server_round, 1]))
        log.info("configure_evaluate: sampled %d of %d nodes (seed %d, round %d)", len(picked), len(nodes), p.seed,
                 context.server_round)
        return Sample(tuple(picked))

    def describe(self) -> list[str]:
        p = self.sampling
        count = p.clients_per_round if p.clients_per_round is not None else f"fraction {p.fraction_train:.2f}"
        return [f"Sampling: {count} per round, seed {p.seed}, evaluate fraction {p.fraction_evaluate:.2f}"]
