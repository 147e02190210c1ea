"""Real Flower records and messages for adapter tests, and small stand-ins for a Grid and a recorder.

Outgoing messages are built with :func:`make_message` (explicit metadata, Flower's public ``Message``
constructor), which strategies take as their ``message_factory``: no Flower internals are touched.
"""

import itertools

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.app.error import Error

from bouquet.strategies.hooks import Hook

_ids = itertools.count(1)


def make_message(content, message_type, dst_node_id, group_id):
    """An instruction message as a ServerApp would send it (a :data:`bouquet.messages.MessageFactory`)."""
    metadata = Metadata(run_id=1, message_id=f"out-{next(_ids)}", src_node_id=0, dst_node_id=dst_node_id,
                        reply_to_message_id="", group_id=group_id, created_at=0.0, ttl=60.0,
                        message_type=message_type)
    return Message(content=content, metadata=metadata)


def reply_to(msg, content=None, error=None):
    """The reply of the node ``msg`` was sent to."""
    node = msg.metadata.dst_node_id
    metadata = Metadata(run_id=1, message_id=f"in-{next(_ids)}", src_node_id=node, dst_node_id=0,
                        reply_to_message_id=msg.metadata.message_id, group_id=msg.metadata.group_id,
                        created_at=0.0, ttl=60.0, message_type=msg.metadata.message_type)
    if error is not None:
        return Message(error=error, metadata=metadata)
    return Message(content=content, metadata=metadata)


def arrays(value, shape=(2, 3)):
    return ArrayRecord({"w": Array(np.full(shape, value, dtype=np.float32)),
                        "b": Array(np.full(3, value, dtype=np.float32))})


def reply(node_id, record=None, examples=10, error=None, info=None, server_round=1):
    """A training reply from ``node_id`` to round ``server_round`` as the Grid hands it to the strategy."""
    metadata = Metadata(run_id=1, message_id=f"m{node_id}", src_node_id=node_id, dst_node_id=0,
                        reply_to_message_id=f"i{node_id}", group_id=str(server_round), created_at=0.0, ttl=60.0,
                        message_type="train")
    if error is not None:
        return Message(error=error, metadata=metadata)
    content = RecordDict({"arrays": record, "metrics": MetricRecord({"num-examples": examples, "loss": 1.0})})
    if info is not None:
        content["info"] = ConfigRecord(info)
    return Message(content=content, metadata=metadata)


def identity_reply(msg, keys):
    """What a bouquet ClientApp answers to ``query.identify`` (an error where the node has no key)."""
    node = msg.metadata.dst_node_id
    if node not in keys:
        return reply_to(msg, error=Error(code=1, reason="no handler"))
    return reply_to(msg, RecordDict({"identity": ConfigRecord({"key": keys[node]})}))


class FakeGrid:
    """Lists ``node_ids``; answers ``query.identify`` with ``keys[node]`` (no key: an error reply, as from
    a ClientApp without the handler) and passes other messages to ``handler(msg) -> reply or None``."""

    def __init__(self, node_ids, keys=None, handler=None, slow=None):
        self.node_ids = list(node_ids)
        self.keys = dict(keys or {})
        self.handler = handler
        self.identify_queries = 0
        self.sent = []
        self.slow = dict(slow or {})  # node -> seconds its identity reply takes (a slow start)
        self.timeouts = []  # the timeout of every send_and_receive

    def get_node_ids(self):
        return list(self.node_ids)

    def send_and_receive(self, messages, timeout=None):
        self.timeouts.append(timeout)
        out = []
        for msg in messages:
            if msg.metadata.message_type == "query.identify":
                self.identify_queries += 1
                node = msg.metadata.dst_node_id
                if timeout is not None and self.slow.get(node, 0) > timeout:
                    continue  # answers after the wait is over
                out.append(identity_reply(msg, self.keys))
                continue
            self.sent.append(msg)
            answer = self.handler(msg) if self.handler is not None else None
            if answer is not None:
                out.append(answer)
        return out


class ListRecorder:
    def __init__(self):
        self.rounds, self.rows = [], {}

    def log_round(self, server_round, phase, metrics):
        self.rounds.append((server_round, phase, dict(metrics)))

    def append_rows(self, table, rows):
        self.rows.setdefault(table, []).extend(rows)


class ListHook(Hook):
    """Keeps every round event."""

    def __init__(self):
        self.events = []

    def on_event(self, event):
        self.events.append(event)
