"""Send bouquet's log records to Flower's console handler.

bouquet modules log through ``logging.getLogger(__name__)`` (children of
``bouquet``); Flower configures only its own ``flwr`` logger, so without this
the INFO lines of strategies and apps would be lost in Flower processes.
"""

from __future__ import annotations

import logging


def route_to_flower() -> None:
    """Attach the ``flwr`` logger's handlers to the ``bouquet`` logger (idempotent)."""
    ours = logging.getLogger("bouquet")
    if ours.handlers:
        return
    for handler in logging.getLogger("flwr").handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
