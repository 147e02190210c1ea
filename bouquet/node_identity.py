"""Stable node identities, so that the same seed samples the same clients in every run.

Flower gives each SuperNode a random 64-bit node id when it registers, and in
simulation a fresh set every run.  A seeded draw over sorted node ids would
therefore pick different clients (households, image shards) each run, and the
"same seed, same run" promise would not hold.  The server instead orders nodes
by a key each node reports about itself, its ``partition-id``:

* client side, one call on the ClientApp::

      from bouquet.node_identity import register_identity_query

      register_identity_query(app)   # answers query.identify with node_config["partition-id"]

* server side, :func:`identify_nodes` sends ``query.identify`` to the nodes
  it has not seen yet and returns ``{node id: key}``.  A node that answers
  with an error (a ClientApp without the handler) or not at all gets no key;
  :class:`bouquet.strategies.sampling.NodeOrder` orders keyless nodes after
  keyed ones, by node id, and logs that their sampling is not reproducible.

Message layout: request ``config`` (empty ConfigRecord); reply ``identity``
(ConfigRecord ``{"key": int}``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from bouquet.messages import MessageFactory, flower_message
from bouquet.transport import FLOWER_TRANSPORT, Transport

log = logging.getLogger(__name__)

__all__ = ["IDENTIFY_ACTION", "identify_nodes", "node_config_ints", "partition_id", "register_identity_query"]

IDENTIFY_ACTION = "identify"


def node_config_ints(context: Context, *keys: str) -> tuple[int, ...]:
    """The integer values of ``keys`` in the node config, or a KeyError naming every missing key.

    Raises
    ------
    KeyError
        When a key is absent; the message says how a SuperNode is given it.
    """
    missing = [key for key in keys if key not in context.node_config]
    if missing:
        settings = " ".join(f"{key}=..." for key in missing)
        raise KeyError(f"node config lacks {', '.join(map(repr, missing))} "
                       f"(start the SuperNode with --node-config \"{settings}\")")
    return tuple(int(context.node_config[key]) for key in keys)


def partition_id(context: Context) -> int:
    """This node's ``partition-id``: its data partition and its stable identity."""
    return node_config_ints(context, "partition-id")[0]


def register_identity_query(app: ClientApp, key_fn: Callable[[Context], int] = partition_id) -> None:
    """Register the ``query.identify`` handler on ``app``.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    key_fn : callable(Context) -> int, optional
        The node's stable key; default ``node_config["partition-id"]``.  Keys
        must be distinct across the federation.
    """

    @app.query(IDENTIFY_ACTION)
    def _identify(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"identity": ConfigRecord({"key": int(key_fn(context))})}), reply_to=msg)


def identify_nodes(grid: Grid, nodes: list[int], timeout: float, new_message: MessageFactory = flower_message,
                   patience: int = 3, transport: Transport = FLOWER_TRANSPORT) -> dict[int, int | None]:
    """Ask ``nodes`` for their stable key: ``{node id: key}`` for those that answered with one, ``None`` for
    those that answered without one (an error reply: no handler).

    Each node is asked once, and the replies are awaited up to ``patience`` x ``timeout`` seconds: a
    simulation's first messages wait for its ClientApps to start, which a loaded machine or a large
    federation can stretch past ``timeout`` (1,099 simulated nodes on 2 busy cores: over 60 s).  Asking the
    silent ones again, as this function did before, only queued a second message per node behind the
    first and dropped the first one's reply when it came.  Nodes still silent are left out of the result.
    """
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    if not nodes:
        return {}
    wait = patience * timeout
    log.info("asking %d node(s) for their identity (query.identify; waiting up to %.0f s)", len(nodes), wait)
    started = time.monotonic()
    messages = [new_message(RecordDict({"config": ConfigRecord({})}), f"query.{IDENTIFY_ACTION}", n, "")
                for n in nodes]
    keys: dict[int, int | None] = {}
    for reply in transport.exchange(grid, messages, wait):
        node = reply.metadata.src_node_id
        if not reply.has_error() and "identity" in reply.content.config_records:
            keys[node] = int(reply.content.config_records["identity"]["key"])
        else:
            keys[node] = None
    took = time.monotonic() - started
    if took > timeout:
        log.info("%d of %d node(s) answered query.identify in %.0f s (over node-wait-seconds = %.0f s)",
                 len(keys), len(nodes), took, timeout)
    return keys
