"""Real Flower records and replies for adapter tests, and small stand-ins for Grid and recorder."""

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


def arrays(value, shape=(2, 3)):
    return ArrayRecord({"w": Array(np.full(shape, value, dtype=np.float32)),
                        "b": Array(np.full(3, value, dtype=np.float32))})


def reply(node_id, record=None, examples=10, error=None, info=None):
    """A training reply from ``node_id`` as the Grid hands it to the strategy."""
    metadata = Metadata(run_id=1, message_id=f"m{node_id}", src_node_id=node_id, dst_node_id=0,
                        reply_to_message_id=f"i{node_id}", group_id="1", created_at=0.0, ttl=60.0,
                        message_type="train")
    if error is not None:
        return Message(error=error, metadata=metadata)
    content = RecordDict({"arrays": record, "metrics": MetricRecord({"num-examples": examples, "loss": 1.0})})
    if info is not None:
        content["info"] = ConfigRecord(info)
    return Message(content=content, metadata=metadata)


class FakeGrid:
    """Lists ``node_ids``; answers ``query.identify`` with ``keys[node]`` (no keys: an error reply, as from
    a ClientApp without the handler)."""

    def __init__(self, node_ids, keys=None):
        self.node_ids = list(node_ids)
        self.keys = dict(keys or {})
        self.identify_queries = 0

    def get_node_ids(self):
        return list(self.node_ids)

    def send_and_receive(self, messages, timeout=None):
        return self.identify_replies(messages)

    def identify_replies(self, messages):
        out = []
        for msg in messages:
            if msg.metadata.message_type != "query.identify":
                continue
            self.identify_queries += 1
            node = msg.metadata.dst_node_id
            metadata = Metadata(run_id=1, message_id=f"q{node}", src_node_id=node, dst_node_id=0,
                                reply_to_message_id=msg.metadata.message_id, group_id="", created_at=0.0,
                                ttl=60.0, message_type="query.identify")
            if node in self.keys:
                out.append(Message(content=RecordDict({"identity": ConfigRecord({"key": self.keys[node]})}),
                                   metadata=metadata))
            else:
                out.append(Message(error=Error(code=1, reason="no handler"), metadata=metadata))
        return out


class ListRecorder:
    def __init__(self):
        self.rounds, self.rows = [], {}

    def log_round(self, server_round, phase, metrics):
        self.rounds.append((server_round, phase, dict(metrics)))

    def append_rows(self, table, rows):
        self.rows.setdefault(table, []).extend(rows)
