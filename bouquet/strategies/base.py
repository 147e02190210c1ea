"""Flower FedAvg with seeded sampling, reply screening and per-client records.

:class:`SeededFedAvg` is the base of every bouquet strategy.  It keeps
Flower's FedAvg round structure and changes three things:

* **sampling**: ``clients_per_round`` nodes drawn uniformly without
  replacement with ``numpy.random.default_rng([seed, server_round])`` from the
  connected nodes in their stable order (Flower's FedAvg uses the unseeded
  global ``random``).  The stable order is by the key each node reports to a
  ``query.identify`` message (its ``partition-id``, see
  :mod:`bouquet.node_identity`), because Flower's node ids are random per run;
  nodes that report none come last, by node id.  With
  ``clients_per_round=None`` Flower's ``fraction_train`` sampling is kept
  unchanged.  Evaluation with ``0 < fraction_evaluate < 1`` draws its
  ``max(int(n * fraction_evaluate), min_evaluate_nodes)`` nodes the same way
  from its own stream, ``default_rng([seed, server_round, 1])``;
* **screening**: a training reply whose arrays are not finite or whose array
  names/shapes differ from the model sent is excluded with a warning naming
  the node, never averaged in;
* **one aggregation hook**, :meth:`SeededFedAvg.aggregate_arrays`, that
  subclasses replace (coalition aggregation, ...); the default is Flower's
  sample-weighted mean.  Replies are aggregated in the stable node order,
  not in the order they arrived (float sums are not associative).

An optional ``recorder`` receives per-round and per-client rows (see
:mod:`bouquet.results`); without it the strategy only logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from bouquet.flower_logging import route_to_flower
from bouquet.node_identity import identify_nodes

__all__ = ["Recorder", "SeededFedAvg", "draw_nodes", "screen_replies"]

log = logging.getLogger(__name__)
route_to_flower()


class Recorder(Protocol):
    """Where strategies write what they measured (``bouquet.results.RunRecorder`` fits)."""

    def log_round(self, server_round: int, phase: str, metrics: dict[str, Any]) -> None: ...

    def append_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> None: ...


def screen_replies(replies: Iterable[Message], reference: ArrayRecord | None,
                   arrayrecord_key: str = "arrays") -> tuple[list[Message], list[tuple[int, str]]]:
    """Split training replies into usable ones and rejected ``(node id, reason)``.

    A reply is rejected when it carries an error, lacks ``arrayrecord_key``,
    has array names or shapes other than ``reference`` (the model sent), or
    holds a non-finite value.  Replies are not modified.
    """
    expected = None
    if reference is not None:
        expected = {name: arr.shape for name, arr in reference.items()}
    usable, rejected = [], []
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error():
            rejected.append((node, f"error reply: {msg.error.reason}"))
            continue
        if arrayrecord_key not in msg.content.array_records:
            rejected.append((node, f"no ArrayRecord {arrayrecord_key!r} in reply"))
            continue
        record = msg.content.array_records[arrayrecord_key]
        arrays = {name: arr.numpy() for name, arr in record.items()}
        if expected is not None:
            got = {name: tuple(a.shape) for name, a in arrays.items()}
            if got != {k: tuple(v) for k, v in expected.items()}:
                rejected.append((node, f"array names/shapes {got} differ from the model sent"))
                continue
        bad = [name for name, a in arrays.items() if np.issubdtype(a.dtype, np.number) and not np.isfinite(a).all()]
        if bad:
            rejected.append((node, f"non-finite values in {bad}"))
            continue
        usable.append(msg)
    return usable, rejected


class _NodeSubset:
    """A view of a Grid whose ``get_node_ids`` shows only the sampled nodes."""

    def __init__(self, grid: Grid, node_ids: list[int]) -> None:
        self._grid, self._node_ids = grid, list(node_ids)

    def get_node_ids(self) -> list[int]:
        return list(self._node_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


def draw_nodes(nodes: list[int], count: int, rng: np.random.Generator) -> list[int]:
    """``min(count, len(nodes))`` of ``nodes`` drawn uniformly without replacement, in ``nodes`` order."""
    picked = rng.choice(len(nodes), size=min(count, len(nodes)), replace=False)  # ids are uint64: draw positions
    return [nodes[int(k)] for k in sorted(picked)]


class SeededFedAvg(FedAvg):
    """FedAvg with seeded fixed-size sampling, reply screening and an aggregation hook.

    Parameters
    ----------
    clients_per_round : int, optional
        S, the number of nodes trained per round.  ``None`` keeps Flower's
        ``fraction_train`` sampling.
    seed : int, default 0
        Sampling seed; round ``t`` trains the nodes drawn by
        ``default_rng([seed, t])`` and, when ``0 < fraction_evaluate < 1``,
        evaluates those drawn by ``default_rng([seed, t, 1])``.
    node_wait_seconds : float, default 30
        How long to wait for ``clients_per_round`` nodes to connect before
        sampling from those connected (with a warning) instead of waiting
        forever as Flower's sampler does; also how long to wait for the
        ``query.identify`` replies of newly seen nodes.
    recorder : Recorder, optional
        Receives per-round metrics and per-client rows.
    **fedavg_kwargs
        Passed to :class:`flwr.serverapp.strategy.FedAvg`.
    """

    def __init__(self, *, clients_per_round: int | None = None, seed: int = 0, node_wait_seconds: float = 30.0,
                 recorder: Recorder | None = None, **fedavg_kwargs: Any) -> None:
        super().__init__(**fedavg_kwargs)
        if clients_per_round is not None and clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1 or None, got {clients_per_round}")
        self.clients_per_round = clients_per_round
        if clients_per_round is not None:  # Flower's sampler must then take every node it is shown
            self.fraction_train = 1.0
            self.min_train_nodes = min(self.min_train_nodes, clients_per_round)
            self.min_available_nodes = min(self.min_available_nodes, clients_per_round)
        self.seed = seed
        self.node_wait_seconds = node_wait_seconds
        self.recorder = recorder
        self._sent_arrays: ArrayRecord | None = None
        self._expected: list[int] = []  # nodes sent a training message this round
        self._identity: dict[int, int | None] = {}  # node id -> stable key (None: the node reported none)

    # ------------------------------------------------------------ node order
    def stable_order(self, grid: Grid, nodes: Iterable[int]) -> list[int]:
        """``nodes`` ordered by their stable key (asked once per node), keyless ones last by node id."""
        nodes = list(nodes)
        new = [n for n in nodes if n not in self._identity]
        if new:
            keys = identify_nodes(grid, new, timeout=self.node_wait_seconds)
            self._identity.update({n: keys.get(n) for n in new})
            keyless = [n for n in new if keys.get(n) is None]
            if keyless:
                log.warning("%d of %d nodes report no stable identity (no query.identify handler, see "
                            "bouquet.node_identity): they are ordered by node id, which Flower draws at random, "
                            "so their sampling differs from run to run", len(keyless), len(new))
            keys_now = [self._identity[n] for n in nodes if self._identity[n] is not None]
            if len(set(keys_now)) < len(keys_now):
                log.warning("two connected nodes report the same identity key; they are ordered by node id")
        return sorted(nodes, key=self._rank)

    def _rank(self, node: int) -> tuple[bool, int, int]:
        key = self._identity.get(node)
        return key is None, key if key is not None else 0, node

    def _in_stable_order(self, replies: Iterable[Message]) -> list[Message]:
        """Replies in the stable node order, not the (run-dependent) order they arrived in."""
        return sorted(replies, key=lambda msg: self._rank(msg.metadata.src_node_id))

    # ----------------------------------------------------------------- sampling
    def wait_for_nodes(self, grid: Grid, server_round: int, count: int) -> list[int]:
        """Connected node ids in stable order, after waiting up to ``node_wait_seconds`` for ``count`` of them."""
        deadline = time.monotonic() + self.node_wait_seconds
        while len(nodes := list(grid.get_node_ids())) < count and time.monotonic() < deadline:
            time.sleep(0.5)
        if len(nodes) < count:
            log.warning("round %d: only %d nodes connected, %d requested; using all of them",
                        server_round, len(nodes), count)
        return self.stable_order(grid, nodes)

    def sample_nodes(self, grid: Grid, server_round: int, count: int) -> list[int]:
        """``count`` node ids drawn with ``default_rng([seed, server_round])`` from the nodes in stable order."""
        nodes = self.wait_for_nodes(grid, server_round, count)
        return draw_nodes(nodes, count, np.random.default_rng([self.seed, server_round]))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._sent_arrays = arrays
        if self.clients_per_round is None:
            messages = list(super().configure_train(server_round, arrays, config, grid))
        else:
            node_ids = self.sample_nodes(grid, server_round, self.clients_per_round)
            log.info("configure_train: sampled %d nodes (seed %d, round %d)", len(node_ids), self.seed,
                     server_round)
            # Flower's own configure_train (and that of any FedAvg subclass mixed in after this class, e.g.
            # FedProx adding "proximal-mu") builds the messages; it sees only the sampled nodes and takes all.
            messages = list(super().configure_train(server_round, arrays, ConfigRecord(dict(config)),
                                                    _NodeSubset(grid, node_ids)))
        self._expected = [m.metadata.dst_node_id for m in messages]
        return messages

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if self.clients_per_round is None or self.fraction_evaluate in (0.0, 1.0):
            return super().configure_evaluate(server_round, arrays, config, grid)  # no draw, or Flower's
        nodes = self.stable_order(grid, grid.get_node_ids())
        count = max(int(len(nodes) * self.fraction_evaluate), self.min_evaluate_nodes)
        node_ids = draw_nodes(nodes, count, np.random.default_rng([self.seed, server_round, 1]))
        log.info("configure_evaluate: sampled %d of %d nodes (seed %d, round %d)", len(node_ids), len(nodes),
                 self.seed, server_round)
        # Flower's configure_evaluate builds the messages and must take every node it is shown.
        kept = self.fraction_evaluate, self.min_evaluate_nodes, self.min_available_nodes
        self.fraction_evaluate, self.min_evaluate_nodes, self.min_available_nodes = 1.0, 1, 1
        try:
            return list(super().configure_evaluate(server_round, arrays, config, _NodeSubset(grid, node_ids)))
        finally:
            self.fraction_evaluate, self.min_evaluate_nodes, self.min_available_nodes = kept

    # -------------------------------------------------------------- aggregation
    def aggregate_arrays(self, server_round: int, replies: list[RecordDict],
                         node_ids: list[int]) -> tuple[ArrayRecord, dict[str, Any]]:
        """Combine screened replies into the next global model (override me).

        Parameters
        ----------
        replies : list of RecordDict
            Contents of the usable replies, in ``node_ids`` order.
        node_ids : list of int

        Returns
        -------
        (ArrayRecord, dict)
            The new global arrays and scalar metrics of the aggregation
            (logged and recorded with the round).
        """
        # only the model record is averaged (a reply may carry more, e.g. a gradient sketch)
        models = [RecordDict({self.arrayrecord_key: r.array_records[self.arrayrecord_key],
                              "metrics": next(iter(r.metric_records.values()))}) for r in replies]
        return aggregate_arrayrecords(models, self.weighted_by_key), {}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = self._in_stable_order(replies)
        usable, rejected = screen_replies(replies, self._sent_arrays, self.arrayrecord_key)
        # The SuperLink answers for a node it saw go offline with an error reply whose source is not that
        # node (Flower 1.42 puts its own id there): such a node counts as lost, named by the id it was sent to.
        expected = set(self._expected)
        rejected = [(n, why) for n, why in rejected if n in expected or not expected]
        answered = {m.metadata.src_node_id for m in replies}
        lost = [n for n in self._expected if n not in answered]
        log.info("aggregate_train: %d usable replies, %d rejected, %d lost", len(usable), len(rejected), len(lost))
        for node, reason in rejected:
            log.warning("round %d: reply of node %d excluded: %s", server_round, node, reason)
        for node in lost:
            log.warning("round %d: node %d was sent a training message but never replied (lost, or slower "
                        "than the round timeout); the round goes on with the others", server_round, node)
        if not usable:
            log.warning("round %d: no usable training reply; the global model stays as it was", server_round)
            if self.recorder is not None:
                self.recorder.log_round(server_round, "train", {
                    "replies": 0, "rejected": len(rejected), "rejected-nodes": [n for n, _ in rejected],
                    "lost-nodes": lost})
            return None, None
        contents = [m.content for m in usable]
        node_ids = [m.metadata.src_node_id for m in usable]
        started = time.perf_counter()
        arrays, report = self.aggregate_arrays(server_round, contents, node_ids)
        elapsed = time.perf_counter() - started
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        if self.recorder is not None:
            self.recorder.append_rows("train_clients", self._client_rows(server_round, usable))
            self.recorder.log_round(server_round, "train", {
                **dict(metrics), **report, "replies": len(usable), "rejected": len(rejected),
                "rejected-nodes": [n for n, _ in rejected], "lost-nodes": lost, "aggregation-seconds": elapsed})
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = self._in_stable_order(replies)
        metrics = super().aggregate_evaluate(server_round, replies)
        if self.recorder is not None and metrics is not None:
            usable = [m for m in replies if not m.has_error()]
            self.recorder.append_rows("evaluate_clients", self._client_rows(server_round, usable))
            self.recorder.log_round(server_round, "evaluate", {**dict(metrics), "replies": len(usable)})
        return metrics

    @staticmethod
    def _client_rows(server_round: int, replies: list[Message]) -> list[dict[str, Any]]:
        rows = []
        for msg in replies:
            row: dict[str, Any] = {"round": server_round, "node_id": msg.metadata.src_node_id}
            for name, record in msg.content.config_records.items():
                if not name.startswith("sketch"):  # sketch metadata is reported by the selection strategy
                    row.update(dict(record))
            for record in msg.content.metric_records.values():
                row.update(dict(record))
            rows.append(row)
        return rows

    def summary(self) -> None:
        log.info("\t├──> Sampling: %s per round, seed %d",
                 self.clients_per_round if self.clients_per_round is not None else
                 f"fraction {self.fraction_train:.2f}", self.seed)
        super().summary()
