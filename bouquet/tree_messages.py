"""The federated trees over Flower's messages: ``query.trees`` and its two ends (no torch).

Server side, :class:`FlowerSource` is a :class:`bouquet.algorithms.trees.Source`: each request of the fit
(:func:`bouquet.algorithms.trees.fit`) goes to every node of the federation as one ``query.trees`` message,
and the replies come back summed array by array in the nodes' stable order (float sums are not associative: the
same order, the same trees), or, for the bins, as each node's sketch.  It counts the bytes each way and the
seconds spent waiting for replies.  A node that answers with an error, or not at all, ends the fit with an
error naming it: every row counts in a sum, so a fit without a node would not be the fit asked for.

Client side, :func:`register_tree_query` answers ``query.trees`` from the node's task (its ``answer``:
:meth:`bouquet.tasks.trees.TreeWaterTask.answer`) and keeps the node's predictions between requests in its
Flower ``Context`` state (``trees``).  A node sends its histograms sparse (their non-zero bins only,
:func:`bouquet.algorithms.trees.to_sparse`): a household of a few hundred days fills few bins of a deep level,
and the dense histograms of a depth-8 fit over 57 DAIAD households were 7 GB of replies.  Secure sums send them
dense (a mask fills every bin).

With ``tree-secure-sums`` (:mod:`bouquet.algorithms.masking`) the first summed exchange is preceded by one that
asks every node for a fresh X25519 public key; the server hands every node the list, and from then on each node
masks every array it sends with pairwise masks that cancel in the sum: the server adds the masked arrays
modulo 2**64 and sees the sums only.

Message layout: request ``config`` (ConfigRecord: ``kind``, ``init``, ``first``, ``points``, the lists; with
secure sums ``secure-step`` and ``parties``) and ``request`` (ArrayRecord: the trees to apply, the growing tree,
the bins or the fine grid; with secure sums once ``public-keys``); reply ``reply`` (ArrayRecord: the node's sums,
masked with secure sums, or its sketch, or its public key).
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

from bouquet.algorithms.masking import add_masked, mask, new_private_key, pair_seeds, public_key, unmask
from bouquet.algorithms.trees import PartyState, Request, Source, add_replies, to_dense, to_sparse
from bouquet.messages import MessageFactory, flower_message
from bouquet.transport import FLOWER_TRANSPORT, Transport

__all__ = ["KEYS_KIND", "SECURE_KEY", "STATE_KEY", "TREES_ACTION", "FlowerSource", "TreeFitError",
           "register_tree_query"]

log = logging.getLogger(__name__)

#: ``message_type`` of the exchanges is ``f"query.{TREES_ACTION}"``.
TREES_ACTION = "trees"
#: Where a node keeps its predictions between requests (``context.state``).
STATE_KEY = "trees"
#: Where a node keeps its secure-sum key and pair seeds (``tree-secure-sums``).
SECURE_KEY = "trees-secure"
#: The request kind that asks every node for a fresh public key (secure sums).
KEYS_KIND = "keys"


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
    secure : bool, default False
        Secure sums (``tree-secure-sums``): a key exchange first, then every node's replies masked
        (:mod:`bouquet.algorithms.masking`); the server adds them modulo 2**64 and sees the sums only.
    """

    def __init__(self, grid: Grid, nodes: Sequence[int], timeout: float, transport: Transport = FLOWER_TRANSPORT,
                 new_message: MessageFactory = flower_message, secure: bool = False) -> None:
        if not nodes:
            raise TreeFitError("no node is connected to fit the trees with")
        self.grid, self.nodes, self.timeout = grid, list(nodes), timeout
        self.transport, self.new_message = transport, new_message
        self.secure = secure
        self.public_keys: np.ndarray | None = None  # secure sums: the nodes' X25519 public keys, in node order
        self.step = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.wait_seconds = 0.0

    def _exchange(self, request: Request, extra: dict[str, Any] | None = None,
                  extra_arrays: dict[str, np.ndarray] | None = None) -> list[dict[str, np.ndarray]]:
        config, arrays = request.to_arrays()
        content = RecordDict({"config": ConfigRecord({**config, **(extra or {})}),
                              "request": _records({**arrays, **(extra_arrays or {})})})
        size = _nbytes(content.array_records["request"])
        messages = [self.new_message(content, f"query.{TREES_ACTION}", node, f"trees-{request.kind}")
                    for node in self.nodes]
        started = time.monotonic()
        replies = self.transport.exchange(self.grid, messages, self.timeout)
        self.wait_seconds += time.monotonic() - started
        self.bytes_sent += size * len(self.nodes)
        by_node: dict[int, dict[str, np.ndarray]] = {}
        failed: dict[int, str] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                failed[node] = f"node {node}: {reply.error.reason}"
                continue
            record = reply.content.array_records["reply"]
            self.bytes_received += _nbytes(record)
            by_node[node] = to_dense(_numpy(record))
        silent = [node for node in self.nodes if node not in by_node and node not in failed]
        if failed or silent:
            why = [*failed.values(), *(f"node {node}: no reply within {self.timeout:g} s" for node in silent)]
            raise TreeFitError(f"the {request.kind} exchange of the tree fit failed on {len(why)} of "
                               f"{len(self.nodes)} nodes (every household's rows count in the sums, so the fit "
                               f"stops): " + "; ".join(why[:5]) + (" ..." if len(why) > 5 else ""))
        return [by_node[node] for node in self.nodes]

    def sketches(self, points: int) -> list[tuple[np.ndarray, np.ndarray]]:
        if self.secure:
            raise TreeFitError("secure sums send no sketch (each household's quantiles): use tree-bins = \"grid\"")
        return [(reply["quantiles"], reply["counts"]) for reply in self._exchange(Request("sketch", points=points))]

    def sums(self, request: Request) -> dict[str, np.ndarray]:
        if not self.secure:
            return add_replies(self._exchange(request))
        extra_arrays = {}
        if self.public_keys is None:  # the first sum: every node's public key first, then the list to every node
            replies = self._exchange(Request("apply"), {"kind": KEYS_KIND})
            self.public_keys = np.stack([reply["public-key"].astype(np.uint8) for reply in replies])
            extra_arrays["public-keys"] = self.public_keys
        self.step += 1
        replies = self._exchange(request, {"secure-step": self.step, "parties": [int(n) for n in self.nodes]},
                                 extra_arrays)
        return {**unmask(add_masked(replies)), "parties": np.array([float(len(replies))])}

    def describe(self) -> dict[str, Any]:
        """What the fit's messages cost: bytes each way and the seconds spent waiting for replies."""
        return {"nodes": len(self.nodes), "bytes-to-nodes": self.bytes_sent, "bytes-from-nodes": self.bytes_received,
                "wait-seconds": self.wait_seconds, "secure-sums": self.secure}


def _masked(reply: dict[str, np.ndarray], config: dict[str, Any], arrays: dict[str, np.ndarray],
            context: Context) -> dict[str, np.ndarray]:
    """``reply`` masked for a secure sum: the pair seeds derived once (from the public keys the first secure
    request carries) and kept in the node's state with its position among the parties."""
    records = context.state.array_records
    if SECURE_KEY not in records:
        raise TypeError("query.trees: a secure sum was asked for, but this node sent no public key for this fit")
    secure = _numpy(records[SECURE_KEY])
    if "public-keys" in arrays:
        parties = [int(n) for n in config["parties"]]
        if context.node_id not in parties:
            raise ValueError(f"query.trees: node {context.node_id} is not among the parties of the secure sum")
        me = parties.index(context.node_id)
        keys = [bytes(row) for row in arrays["public-keys"].astype(np.uint8)]
        seeds = pair_seeds(bytes(secure["private"]), me, keys)
        table = np.stack([np.frombuffer(seed, dtype=np.uint8) if seed else np.zeros(32, np.uint8) for seed in seeds])
        secure = {**secure, "seeds": table, "me": np.array([me])}
        context.state[SECURE_KEY] = _records(secure)
    if "seeds" not in secure:
        raise TypeError("query.trees: a secure sum was asked for before this node was told the parties' keys")
    me = int(secure["me"][0])
    seeds = [None if j == me else bytes(row) for j, row in enumerate(secure["seeds"])]
    return mask(reply, seeds, me, int(config["secure-step"]))


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
        config, arrays = dict(msg.content["config"]), _numpy(msg.content["request"])
        records = context.state.array_records
        if config["kind"] == KEYS_KIND:  # secure sums: a fresh key pair for this fit; the public half goes out
            private = new_private_key()
            context.state[SECURE_KEY] = _records({"private": np.frombuffer(private, dtype=np.uint8)})
            return Message(RecordDict({"reply": _records({"public-key": np.frombuffer(public_key(private),
                                                                                       dtype=np.uint8)})}),
                           reply_to=msg)
        request = Request.from_arrays(config, arrays)
        state = PartyState.from_arrays(_numpy(records[STATE_KEY])) if STATE_KEY in records else PartyState.empty()
        reply, state = answer(request, state)
        context.state[STATE_KEY] = _records(state.to_arrays())
        reply = _masked(reply, config, arrays, context) if "secure-step" in config else to_sparse(reply)
        return Message(RecordDict({"reply": _records(reply)}), reply_to=msg)

    return _trees
