"""The federated trees over Flower's messages: ``query.trees`` and its two ends (no torch).

Server side, :class:`FlowerSource` is a :class:`bouquet.algorithms.trees.Source`: each request of the fit
(:func:`bouquet.algorithms.trees.fit`) goes to every node of the federation as one ``query.trees`` message,
and the replies come back summed array by array in the nodes' stable order (float sums are not associative: the
same order, the same trees), or, for the bins, as each node's sketch.  It counts the bytes each way and the
seconds spent waiting for replies.  A node that answers with an error, or not at all, ends the fit with an
error naming it: every row counts in a sum, so a fit without a node would not be the fit asked for.

Client side, :func:`register_tree_query` answers ``query.trees`` from the node's task (its ``answer``:
:meth:`bouquet.tasks.trees.TreeWaterTask.answer`) and keeps the node's predictions between requests in its
Flower ``Context`` state (``trees``).

Message layout: request ``config`` (ConfigRecord: ``kind``, ``init``, ``first``, ``points``) and ``request``
(ArrayRecord: the trees to apply, the growing tree, the nodes asked for, the bins); reply ``reply`` (ArrayRecord:
the node's sums, or its sketch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from bouquet.algorithms.trees import PartyState, Request, Source, add_replies
from bouquet.messages import MessageFactory, flower_message
from bouquet.transport import FLOWER_TRANSPORT, Transport

__all__ = ["STATE_KEY", "TREES_ACTION", "FlowerSource", "TreeFitError", "register_tree_query"]

log = logging.getLogger(__name__)

#: ``message_type`` of the exchanges is ``f"query.{TREES_ACTION}"``.
TREES_ACTION = "trees"
#: Where a node keeps its predictions between requests (``context.state``).
STATE_KEY = "trees"


class TreeFitError(RuntimeError):
    """A node failed to answer one of the fit's requests (its error, or none within the timeout)."""


def _records(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def _numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def _nbytes(record: ArrayRecord) -> int:
    return sum(len(array.data) for array in record.values())


class FlowerSource(Source):
    """The fit's sums from every node of ``nodes`` (in that order), one ``query.trees`` exchange a request.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    nodes : list of int
        The federation's node ids, in the stable order replies are added in.
    timeout : float
        Seconds to wait for every reply of one exchange.
    transport : Transport, default FLOWER_TRANSPORT
    new_message : MessageFactory, default :func:`bouquet.messages.flower_message`
    """

    def __init__(self, grid: Grid, nodes: Sequence[int], timeout: float, transport: Transport = FLOWER_TRANSPORT,
                 new_message: MessageFactory = flower_message) -> None:
        if not nodes:
            raise TreeFitError("no node is connected to fit the trees with")
        self.grid, self.nodes, self.timeout = grid, list(nodes), timeout
        self.transport, self.new_message = transport, new_message
        self.bytes_sent = 0
        self.bytes_received = 0
        self.wait_seconds = 0.0

    def _exchange(self, request: Request) -> list[dict[str, np.ndarray]]:
        config, arrays = request.to_arrays()
        content = RecordDict({"config": ConfigRecord(config), "request": _records(arrays)})
        size = _nbytes(content.array_records["request"])
        messages = [self.new_message(content, f"query.{TREES_ACTION}", node, f"trees-{request.kind}")
                    for node in self.nodes]
        started = time.monotonic()
        replies = self.transport.exchange(self.grid, messages, self.timeout)
        self.wait_seconds += time.monotonic() - started
        self.bytes_sent += size * len(self.nodes)
        by_node: dict[int, dict[str, np.ndarray]] = {}
        failed = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                failed.append(f"node {node}: {reply.error.reason}")
                continue
            record = reply.content.array_records["reply"]
            self.bytes_received += _nbytes(record)
            by_node[node] = _numpy(record)
        silent = [node for node in self.nodes if node not in by_node and not any(f"node {node}:" in f for f in failed)]
        if failed or silent:
            why = failed + [f"node {node}: no reply within {self.timeout:g} s" for node in silent]
            raise TreeFitError(f"the {request.kind} exchange of the tree fit failed on {len(why)} of "
                               f"{len(self.nodes)} nodes (every household's rows count in the sums, so the fit "
                               f"stops): " + "; ".join(why[:5]) + (" ..." if len(why) > 5 else ""))
        return [by_node[node] for node in self.nodes]

    def sketches(self, points: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(reply["quantiles"], reply["counts"]) for reply in self._exchange(Request("sketch", points=points))]

    def sums(self, request: Request) -> dict[str, np.ndarray]:
        return add_replies(self._exchange(request))

    def describe(self) -> dict[str, Any]:
        """What the fit's messages cost: bytes each way and the seconds spent waiting for replies."""
        return {"nodes": len(self.nodes), "bytes-to-nodes": self.bytes_sent, "bytes-from-nodes": self.bytes_received,
                "wait-seconds": self.wait_seconds}


def register_tree_query(app: ClientApp, task_fn: Callable[[Context], Any]) -> Callable[[Message, Context], Message]:
    """Register the ``query.trees`` handler on ``app`` and return it: ``task_fn(context)`` gives the node's task,
    whose ``answer(request, state) -> (reply, state)`` answers (:meth:`bouquet.tasks.trees.TreeWaterTask.answer`)."""

    @app.query(TREES_ACTION)
    def _trees(msg: Message, context: Context) -> Message:
        task = task_fn(context)
        answer = getattr(task, "answer", None)
        if answer is None:
            raise TypeError("query.trees: this node's forecaster is not the trees; the run config must say "
                            "forecast-model = \"trees\"")
        request = Request.from_arrays(dict(msg.content["config"]), _numpy(msg.content["request"]))
        records = context.state.array_records
        state = PartyState.from_arrays(_numpy(records[STATE_KEY])) if STATE_KEY in records else PartyState.empty()
        reply, state = answer(request, state)
        context.state[STATE_KEY] = _records(state.to_arrays())
        return Message(RecordDict({"reply": _records(reply)}), reply_to=msg)

    return _trees
