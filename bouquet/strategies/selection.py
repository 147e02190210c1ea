"""Client selection as a composable Flower strategy part: any selector with any aggregator.

:class:`ClientSelection` is a mixin that replaces how a bouquet strategy
(:class:`bouquet.strategies.base.SeededFedAvg` or any subclass, e.g. HK
coalitions) picks its training nodes; aggregation stays the host class's.
:func:`selecting` builds the composed class and :func:`selection_strategy`
an instance::

    from bouquet.algorithms.selection import SCKMClusterSelector
    from bouquet.strategies import HKFedAvg, selection_strategy

    strategy = selection_strategy(SCKMClusterSelector(), HKFedAvg, clients_per_round=6,
                                  geometry="cosine", tau=0.75)

Two ways to learn about clients (``mode``):

``query`` (the SCKM paper)
    Each round, before training, the candidates (all connected nodes, or
    ``candidates_per_round`` of them drawn with the round seed) receive a
    ``query.sketch`` message with the global model and a round seed
    ``[seed, round]``; each answers with its loss, example count and a
    gradient sketch on the same coordinates (:mod:`bouquet.sketching`).
    Nodes that fail or time out (``query_timeout``) are not selected, and
    the log names them.  Selectors that need nothing (``random``) skip the
    query.
``piggyback`` (no extra round trip, for battery- and bandwidth-bound nodes)
    Trained nodes attach their sketch (taken at the model they received,
    before training) to the training reply.  The server keeps the latest
    sketch of every node with its age.  Staleness rule: a node never seen,
    or whose sketch is older than ``max_sketch_age`` rounds, is
    "unexplored"; unexplored nodes are selected first (seeded order), and
    the rest of the budget goes to the selector over the nodes with fresh
    enough sketches.  Sketches must be comparable across rounds, so
    piggyback sketches use the fixed coordinate seed ``[seed]``.

Per round the strategy logs and records (phase ``select``) the candidates,
the selected node ids, failures, query time, bytes of sketches received
against the bytes of one full model, and the selector's report (eta,
clusters C-hat, ...), and one row per candidate in ``selection.csv``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from bouquet.algorithms.selection import Candidates, Selector
from bouquet.sketching import SKETCH_ACTION, SketchRequest
from bouquet.strategies.base import SeededFedAvg, draw_nodes

__all__ = ["MODES", "ClientSelection", "selecting", "selection_strategy"]

log = logging.getLogger(__name__)

MODES = ("query", "piggyback")


class ClientSelection:
    """Mixin: selection before training (see the module docstring).  Put it before the host class.

    Parameters
    ----------
    selector : bouquet.algorithms.selection.Selector
    mode : {"query", "piggyback"}, default "query"
    sketch_fraction : float, default 0.005
        Fraction of each parameter tensor in a sketch (paper: 0.5 %).
    sketch_batch_size : int, default 32
        Mini-batch of the sketch gradient.
    candidates_per_round : int, optional
        Query only this many nodes (seeded draw); default all connected.
    query_timeout : float, default 600
        Seconds to wait for query replies.
    max_sketch_age : int, default 5
        Piggyback staleness limit in rounds.
    **kwargs
        The host strategy's arguments; ``clients_per_round`` is the budget B.
    """

    def __init__(self, *, selector: Selector, mode: str = "query", sketch_fraction: float = 0.005,
                 sketch_batch_size: int = 32, candidates_per_round: int | None = None,
                 query_timeout: float = 600.0, max_sketch_age: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"selection mode must be one of {MODES}, got {mode!r}")
        if not 0 < sketch_fraction <= 1:
            raise ValueError(f"sketch_fraction must be in (0, 1], got {sketch_fraction}")
        if sketch_batch_size < 1 or max_sketch_age < 0 or query_timeout <= 0:
            raise ValueError("need sketch_batch_size >= 1, max_sketch_age >= 0 and query_timeout > 0")
        if candidates_per_round is not None and candidates_per_round < 1:
            raise ValueError(f"candidates_per_round must be >= 1 or None, got {candidates_per_round}")
        if self.clients_per_round is None:
            raise ValueError("client selection needs clients_per_round (the budget B)")
        self.selector, self.mode = selector, mode
        self.sketch_fraction, self.sketch_batch_size = sketch_fraction, sketch_batch_size
        self.candidates_per_round, self.query_timeout = candidates_per_round, query_timeout
        self.max_sketch_age = max_sketch_age
        self.last_round: dict[int, int] = {}
        self.known: dict[int, dict[str, Any]] = {}  # piggyback: node -> latest sketch and its round
        self.history: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- training
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.mode == "piggyback" and self.selector.needs:
            request = SketchRequest(self.sketch_fraction, [self.seed], self.sketch_batch_size)
            config = ConfigRecord({**dict(config), **request.to_config()})
        return super().configure_train(server_round, arrays, config, grid)

    def sample_nodes(self, grid: Grid, server_round: int, count: int) -> list[int]:
        """Select ``count`` nodes (the budget B) with the selector (replaces the seeded uniform draw)."""
        started = time.perf_counter()
        nodes = self.wait_for_nodes(grid, server_round, count)
        rng = np.random.default_rng([self.seed, server_round])
        if self.candidates_per_round is not None and self.candidates_per_round < len(nodes):
            nodes = draw_nodes(nodes, self.candidates_per_round, rng)
        if not self.selector.needs:
            cands, facts = Candidates(ids=nodes, last_round=self._ages(nodes)), {}
        elif self.mode == "query":
            cands, facts = self._query(grid, server_round, nodes)
        else:
            cands, facts = self._from_piggyback(server_round, nodes)
        unexplored = facts.pop("unexplored", [])
        news = facts.pop("new-positions", None)  # piggyback: only losses measured since the last round
        if cands.losses is not None:
            self.selector.observe(cands if news is None else cands.subset(news))
        selected, report = self._choose(cands, min(count, len(cands) + len(unexplored)), unexplored, rng)
        if not selected:
            log.warning("round %d: no candidate is selectable (all queries failed); sampling uniformly instead",
                        server_round)
            selected = draw_nodes(nodes, count, rng)
        seconds = time.perf_counter() - started
        record = {"candidates": len(nodes), "selected": selected, "selection-seconds": seconds, **facts, **report}
        self.history.append({"round": server_round, **record})
        log.info("round %d: %s selected %d of %d candidates in %.2f s%s", server_round, self.selector.name,
                 len(selected), len(nodes), seconds,
                 f", C-hat {report['clusters']}" if "clusters" in report else "")
        if self.recorder is not None:
            self.recorder.log_round(server_round, "select", {k: v for k, v in record.items()
                                                             if k != "cluster-labels"})
            self.recorder.append_rows("selection", self._rows(server_round, cands, selected, report))
        return sorted(selected, key=self._rank)

    def _choose(self, cands: Candidates, budget: int, unexplored: list[int],
                rng: np.random.Generator) -> tuple[list[int], dict[str, Any]]:
        explore = [unexplored[int(i)] for i in rng.permutation(len(unexplored))][:budget]
        report: dict[str, Any] = {"explored": len(explore)} if self.mode == "piggyback" else {}
        rest = budget - len(explore)
        if rest <= 0 or len(cands) == 0:
            return explore, report
        if len(cands) <= rest:  # nothing to choose between
            return explore + list(cands.ids), report
        choice = self.selector.select(cands, rest, rng)
        return explore + [cands.ids[int(i)] for i in choice.indices], {**report, **choice.report}

    def _ages(self, nodes: list[int]) -> np.ndarray:
        return np.array([self.last_round.get(n, -1) for n in nodes], dtype=np.int64)

    # ----------------------------------------------------------- query phase
    def _query(self, grid: Grid, server_round: int, nodes: list[int]) -> tuple[Candidates, dict[str, Any]]:
        request = SketchRequest(self.sketch_fraction, [self.seed, server_round], self.sketch_batch_size)
        config = ConfigRecord({"server-round": server_round, **request.to_config()})
        content = RecordDict({self.arrayrecord_key: self._sent_arrays, "config": config})
        messages = [Message(content=content, message_type=f"query.{SKETCH_ACTION}", dst_node_id=n,
                            group_id=str(server_round)) for n in nodes]
        started = time.perf_counter()
        replies = list(grid.send_and_receive(messages, timeout=self.query_timeout))
        seconds = time.perf_counter() - started
        rows, failed = {}, []
        for reply in replies:
            node = reply.metadata.src_node_id
            parsed = _parse_sketch(reply)
            if isinstance(parsed, str):
                failed.append(node)
                log.warning("round %d: query to node %d failed: %s; not selectable this round",
                            server_round, node, parsed)
            else:
                rows[node] = parsed
        missing = sorted(set(nodes) - set(rows) - set(failed))
        for node in missing:
            log.warning("round %d: node %d did not answer the query within %.0f s; not selectable this round",
                        server_round, node, self.query_timeout)
        ok = [n for n in nodes if n in rows]
        cands = self._candidates(ok, [rows[n] for n in ok])
        model_bytes = _nbytes(self._sent_arrays)
        sketch_bytes = int(sum(r["nbytes"] for r in rows.values()))
        return cands, {"query-seconds": seconds, "query-failed": sorted(failed + missing),
                       "sketch-bytes": sketch_bytes, "model-bytes": model_bytes,
                       "sketch-over-model": sketch_bytes / max(1, len(rows)) / max(1, model_bytes)}

    def _candidates(self, nodes: list[int], rows: list[dict[str, Any]]) -> Candidates:
        if not nodes:
            return Candidates(ids=[])
        sizes = rows[0]["layer-sizes"]
        consistent = [n for n, r in zip(nodes, rows) if r["layer-sizes"] == sizes]
        if len(consistent) < len(nodes):
            log.warning("sketches with other layer sizes ignored for nodes %s",
                        sorted(set(nodes) - set(consistent)))
            rows = [r for n, r in zip(nodes, rows) if n in consistent]
            nodes = consistent
        return Candidates(ids=list(nodes), sketches=np.stack([r["values"] for r in rows]), layer_sizes=list(sizes),
                          losses=np.array([r["loss"] for r in rows]),
                          num_examples=np.array([r["num-examples"] for r in rows], dtype=np.float64),
                          last_round=self._ages(nodes))

    # -------------------------------------------------------------- piggyback
    def _from_piggyback(self, server_round: int, nodes: list[int]) -> tuple[Candidates, dict[str, Any]]:
        fresh = [n for n in nodes if n in self.known
                 and server_round - self.known[n]["round"] <= self.max_sketch_age]
        unexplored = [n for n in nodes if n not in fresh]
        cands = self._candidates(fresh, [self.known[n] for n in fresh])
        ages = [server_round - self.known[n]["round"] for n in fresh]
        # a stored sketch is observed once, in the round after it arrived, not again at every later round
        # (a stale loss seen twice would read as "no change" to FedCor's loss-change history)
        new = [i for i, n in enumerate(cands.ids) if self.known[n]["round"] == server_round - 1]
        return cands, {"unexplored": unexplored, "new-positions": new,
                       "sketch-age-mean": float(np.mean(ages)) if ages else None}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        for reply in replies:
            if reply.has_error():
                continue
            node = reply.metadata.src_node_id
            self.last_round[node] = server_round
            if self.mode == "piggyback" and "sketch" in reply.content.array_records:
                parsed = _parse_sketch(reply)
                if isinstance(parsed, dict):
                    self.known[node] = {**parsed, "round": server_round}
        return super().aggregate_train(server_round, replies)

    def _rows(self, server_round: int, cands: Candidates, selected: list[int],
              report: dict[str, Any]) -> list[dict[str, Any]]:
        """One row per candidate (fixed columns: the CSV keeps one header for every round)."""
        chosen, scored = set(selected), set(cands.ids)
        labels = report.get("cluster-labels")
        rows = []
        for i, node in enumerate(cands.ids):
            rows.append({"round": server_round, "node_id": node, "selected": node in chosen, "explored": False,
                         "loss": "" if cands.losses is None else float(cands.losses[i]),
                         "cluster": "" if labels is None else int(labels[i])})
        rows += [{"round": server_round, "node_id": n, "selected": True, "explored": True, "loss": "", "cluster": ""}
                 for n in selected if n not in scored]
        return rows


def _parse_sketch(reply: Message) -> dict[str, Any] | str:
    """The sketch of a reply as a dict, or why it cannot be used."""
    if reply.has_error():
        return f"error reply: {reply.error.reason}"
    content = reply.content
    if "sketch" not in content.array_records or "sketch-info" not in content.config_records:
        return "reply lacks the 'sketch'/'sketch-info' records (is the sketch handler registered?)"
    array = content.array_records["sketch"]["values"]
    values = array.numpy().astype(np.float64)
    info = content.config_records["sketch-info"]
    if not np.isfinite(values).all() or not np.isfinite(float(info["loss"])):
        return "non-finite sketch or loss"
    sizes = [int(s) for s in info["layer-sizes"]]
    if sum(sizes) != len(values):
        return f"layer sizes {sizes} do not add up to the sketch length {len(values)}"
    return {"values": values, "loss": float(info["loss"]), "num-examples": int(info["num-examples"]),
            "layer-sizes": sizes, "nbytes": _payload(array)}


def _payload(array: Array) -> int:
    """Bytes of an array's values (without the serialisation header)."""
    return int(np.prod(array.shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize


def _nbytes(record: ArrayRecord | None) -> int:
    return 0 if record is None else sum(_payload(a) for a in record.values())


@functools.cache
def selecting(host: type[SeededFedAvg]) -> type:
    """The class ``ClientSelection`` + ``host`` (e.g. ``selecting(HKFedAvg)``), built once per host."""
    if not issubclass(host, SeededFedAvg):
        raise TypeError(f"selection composes with SeededFedAvg subclasses, got {host.__name__}")
    return type(f"Selecting{host.__name__}", (ClientSelection, host), {"__module__": __name__})


def selection_strategy(selector: Selector, host: type[SeededFedAvg] = SeededFedAvg, **kwargs: Any) -> SeededFedAvg:
    """An instance of ``selecting(host)``: ``selector`` picks, ``host`` aggregates."""
    return selecting(host)(selector=selector, **kwargs)
