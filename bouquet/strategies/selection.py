"""Client selection as a sampler part: any selector in front of any aggregator.

:class:`SketchSelection` replaces the uniform draw of who trains with a
:class:`bouquet.algorithms.selection.Selector` (SCKM-Select, SCKM-Cluster,
Power-of-Choice, AFL, FedCor, ...); evaluation sampling stays uniform.  Two
ways to learn about clients (``SelectionParams.mode``):

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
    before training) to the training reply.  The sampler keeps the latest
    sketch of every node with its age.  Staleness rule: a node never seen,
    or whose sketch is older than ``max_sketch_age`` rounds, is
    "unexplored"; unexplored nodes are selected first (seeded order), and
    the rest of the budget goes to the selector over the nodes with fresh
    enough sketches.  Sketches must be comparable across rounds, so
    piggyback sketches use the fixed coordinate seed ``[seed]``.

Per round the sampler reports (phase ``select``) the candidates, the
selected node ids, failures, query time, bytes of sketches received against
the bytes of one full model, and the selector's report (eta, clusters C-hat,
...), and one row per candidate for ``selection.csv``.  What it keeps across
rounds (each node's last training round, the piggybacked sketches, the
selection history, the selector's own state) is one :class:`SelectionState`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from bouquet.algorithms.selection import Candidates, Selector
from bouquet.queries import SKETCH_ACTION, SketchRequest
from bouquet.strategies.params import SamplingParams, SelectionParams
from bouquet.strategies.rounds import RoundContext, Sample
from bouquet.strategies.sampling import UniformSampler, draw_nodes

__all__ = ["SelectionState", "SketchSelection"]

log = logging.getLogger(__name__)


@dataclass
class SelectionState:
    """What selection keeps across rounds (all of it goes into a checkpoint).

    Attributes
    ----------
    last_round : dict
        Node id -> the last round it trained (replied without error).
    known : dict
        Piggyback: node id -> its latest sketch (``values``, ``loss``, ``num-examples``,
        ``layer-sizes``, ``nbytes``) and the ``round`` it arrived.
    history : list of dict
        One record per round (what ``rounds.jsonl`` holds for phase ``select``, plus cluster labels).
    selector : Any
        The selector's own state (:meth:`Selector.initial_state`).
    """

    last_round: dict[int, int] = field(default_factory=dict)
    known: dict[int, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    selector: Any = None


class SketchSelection:
    """A sampler that lets ``selector`` choose ``sampling.clients_per_round`` nodes (the budget B).

    Parameters
    ----------
    selector : bouquet.algorithms.selection.Selector
    sampling : SamplingParams
        ``clients_per_round`` is the budget B (required); the seed, node wait and evaluation fraction
        apply as in :class:`bouquet.strategies.sampling.UniformSampler`.
    selection : SelectionParams, optional
        Mode, sketch size, candidates, timeouts, staleness.
    """

    #: Why aggregation needs the configured round (the selection is made, and recorded, there).
    configure_needed = ("the round's clients are chosen by their sketches in configure_train; aggregating "
                        "replies to messages this strategy did not send would skip the selection")

    def __init__(self, selector: Selector, sampling: SamplingParams, selection: SelectionParams | None = None) -> None:
        if sampling.clients_per_round is None:
            raise ValueError("client selection needs clients_per_round (the budget B)")
        self.selector = selector
        self.sampling = sampling
        self.selection = selection if selection is not None else SelectionParams()
        self.state = SelectionState(selector=selector.initial_state())
        self._uniform = UniformSampler(sampling)

    @property
    def history(self) -> list[dict[str, Any]]:
        """The per-round selection records (the selector's choice, its timings and sizes)."""
        return self.state.history

    def assign_nodes(self, context: RoundContext, nodes: list[int]) -> dict[int, str] | None:
        return None  # the model store serves each node

    # ---------------------------------------------------------------- sampling
    def sample_train(self, context: RoundContext) -> Sample:
        """The selector's choice of the budget B among this round's candidates."""
        started = time.perf_counter()
        budget, server_round = int(self.sampling.clients_per_round), context.server_round
        nodes = context.nodes.connected(context.grid, server_round, budget)
        rng = np.random.default_rng([self.sampling.seed, server_round])
        if 0 < self.selection.candidates_per_round < len(nodes):
            nodes = draw_nodes(nodes, self.selection.candidates_per_round, rng)
        if not self.selector.needs:
            cands, facts = Candidates(ids=nodes, last_round=self._ages(nodes)), {}
        elif self.selection.mode == "query":
            cands, facts = self._query(context, nodes)
        else:
            cands, facts = self._from_piggyback(server_round, nodes)
        unexplored = facts.pop("unexplored", [])
        news = facts.pop("new-positions", None)  # piggyback: only losses measured since the last round
        if cands.losses is not None:
            seen = cands if news is None else cands.subset(news)
            self.state.selector = self.selector.observe(self.state.selector, seen)
        selected, report = self._choose(cands, min(budget, len(cands) + len(unexplored)), unexplored, rng)
        if not selected:
            log.warning("round %d: no candidate is selectable (all queries failed); sampling uniformly instead",
                        server_round)
            selected = draw_nodes(nodes, budget, rng)
        seconds = time.perf_counter() - started
        record = {"candidates": len(nodes), "selected": selected, "selection-seconds": seconds, **facts, **report}
        self.state.history.append({"round": server_round, **record})
        summary = (f"{self.selector.name} selected {len(selected)} of {len(nodes)} candidates in {seconds:.2f} s"
                   + (f", C-hat {report['clusters']}" if "clusters" in report else ""))
        return Sample(tuple(sorted(selected, key=context.nodes.rank)),
                      report={k: v for k, v in record.items() if k != "cluster-labels"},
                      rows=tuple(self._rows(server_round, cands, selected, report)), label=self.selector.name,
                      summary=summary)

    def sample_evaluate(self, context: RoundContext) -> Sample:
        return self._uniform.sample_evaluate(context)

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Piggyback: every training message asks for the sketch of the model it carries."""
        if self.selection.mode == "piggyback" and self.selector.needs:
            return SketchRequest(self.selection.sketch_fraction, [self.sampling.seed],
                                 self.selection.sketch_batch_size).to_config()
        return {}

    def observe_train(self, server_round: int, replies: list[Message]) -> None:
        """Note who trained; in piggyback mode keep the sketches the replies carry."""
        for reply in replies:
            if reply.has_error():
                continue
            node = reply.metadata.src_node_id
            self.state.last_round[node] = server_round
            if self.selection.mode == "piggyback" and "sketch" in reply.content.array_records:
                parsed = _parse_sketch(reply)
                if isinstance(parsed, dict):
                    self.state.known[node] = {**parsed, "round": server_round}

    def _choose(self, cands: Candidates, budget: int, unexplored: list[int],
                rng: np.random.Generator) -> tuple[list[int], dict[str, Any]]:
        explore = [unexplored[int(i)] for i in rng.permutation(len(unexplored))][:budget]
        report: dict[str, Any] = {"explored": len(explore)} if self.selection.mode == "piggyback" else {}
        rest = budget - len(explore)
        if rest <= 0 or len(cands) == 0:
            return explore, report
        if len(cands) <= rest:  # nothing to choose between
            return explore + list(cands.ids), report
        choice = self.selector.select(cands, rest, rng, self.state.selector)
        return explore + [cands.ids[int(i)] for i in choice.indices], {**report, **choice.report}

    def _ages(self, nodes: list[int]) -> np.ndarray:
        return np.array([self.state.last_round.get(n, -1) for n in nodes], dtype=np.int64)

    # ----------------------------------------------------------- query phase
    def _query(self, context: RoundContext, nodes: list[int]) -> tuple[Candidates, dict[str, Any]]:
        server_round, q = context.server_round, self.selection
        request = SketchRequest(q.sketch_fraction, [self.sampling.seed, server_round], q.sketch_batch_size)
        config = ConfigRecord({"server-round": server_round, **request.to_config()})
        content = RecordDict({context.arrayrecord_key: context.arrays, "config": config})
        messages = [context.new_message(content, f"query.{SKETCH_ACTION}", n, str(server_round)) for n in nodes]
        started = time.perf_counter()
        replies = context.exchange(messages, q.query_timeout)
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
                        server_round, node, q.query_timeout)
        ok = [n for n in nodes if n in rows]
        cands = self._candidates(ok, [rows[n] for n in ok])
        model_bytes = _nbytes(context.arrays)
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
        known = self.state.known
        fresh = [n for n in nodes if n in known and server_round - known[n]["round"] <= self.selection.max_sketch_age]
        unexplored = [n for n in nodes if n not in fresh]
        cands = self._candidates(fresh, [known[n] for n in fresh])
        ages = [server_round - known[n]["round"] for n in fresh]
        # a stored sketch is observed once, in the round after it arrived, not again at every later round
        # (a stale loss seen twice would read as "no change" to FedCor's loss-change history)
        new = [i for i, n in enumerate(cands.ids) if known[n]["round"] == server_round - 1]
        return cands, {"unexplored": unexplored, "new-positions": new,
                       "sketch-age-mean": float(np.mean(ages)) if ages else None}

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

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """:class:`SelectionState` as a JSON-able dict (node ids as text: they exceed JSON's integers)."""
        s = self.state
        return {"last-round": {str(n): r for n, r in s.last_round.items()},
                "known": {str(n): {**row, "values": np.asarray(row["values"]).tolist()} for n, row in s.known.items()},
                "history": s.history, "selector": self.selector.state_to_dict(s.selector)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = SelectionState(
            last_round={int(n): int(r) for n, r in state["last-round"].items()},
            known={int(n): {**row, "values": np.asarray(row["values"], dtype=np.float64)}
                   for n, row in state["known"].items()},
            history=list(state["history"]), selector=self.selector.state_from_dict(state["selector"]))

    def describe(self) -> list[str]:
        q = self.selection
        line = (f"Selection: {self.selector.name} ({q.mode}), budget {self.sampling.clients_per_round}, "
                f"sketch {q.sketch_fraction:.3%}, seed {self.sampling.seed}")
        return [line]


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
