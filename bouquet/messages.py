"""How bouquet's server side builds outgoing Flower messages: one factory, replaceable in tests.

Flower's ``Message(content, dst_node_id, message_type)`` takes the run's identity from the ServerApp
process it runs in.  Every part that sends (the strategy, the identity and sketch queries, the final
evaluation) builds its messages through a :data:`MessageFactory`, :func:`flower_message` by default, so
that tests can run the same code in-process with a factory that sets the metadata itself (public
``Message(content=..., metadata=...)``).
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Message, RecordDict

__all__ = ["MessageFactory", "flower_message"]

#: ``(content, message_type, dst_node_id, group_id) -> Message``.
MessageFactory = Callable[[RecordDict, str, int, str], Message]


def flower_message(content: RecordDict, message_type: str, dst_node_id: int, group_id: str) -> Message:
    """An instruction message built by Flower (inside a ServerApp process, which sets the run's identity)."""
    return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)
