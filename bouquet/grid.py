"""A Grid adapter whose ``send_and_receive`` looks for replies every ``poll`` seconds instead of every 3.

Flower's gRPC Grid (the one a ServerApp gets in a deployment, ``flwr.superlink.grid.http_grid``) pushes
the messages, pulls the replies, and sleeps 3 s between pulls until every reply is in, so each phase of a
round (identity query, sketch query, train, evaluate) costs at least 3 s when the nodes are not done at
the first pull, however fast they are; the simulation's in-memory Grid polls every 0.1 s.
:class:`PollingGrid` wraps any Grid and does the same exchange through the Grid's public
``push_messages`` / ``pull_messages`` with a shorter interval; everything else is the wrapped Grid's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

__all__ = ["DEFAULT_POLL_SECONDS", "PollingGrid"]

#: Seconds between two pulls for replies (the in-memory Grid's own interval).
DEFAULT_POLL_SECONDS = 0.1


class PollingGrid:
    """``grid`` with a ``send_and_receive`` that pulls replies every ``poll`` seconds.

    Parameters
    ----------
    grid : Grid
        The Grid the ServerApp was given; every other attribute is read from it.
    poll : float, default 0.1
        Seconds between pulls.
    clock, sleep : callables, default ``time.monotonic``, ``time.sleep``
        For tests.
    """

    def __init__(self, grid: Grid, poll: float = DEFAULT_POLL_SECONDS, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if poll <= 0:
            raise ValueError(f"poll must be > 0 seconds, got {poll}")
        self._grid = grid
        self.poll = poll
        self._clock = clock
        self._sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Push ``messages``, then pull their replies until all are in or ``timeout`` seconds have passed.

        Same contract as ``Grid.send_and_receive``: replies that arrive later are not returned.
        """
        waiting = set(self._grid.push_messages(messages))
        deadline = None if timeout is None else self._clock() + timeout
        replies: list[Message] = []
        while waiting:
            pulled = list(self._grid.pull_messages(waiting))
            replies.extend(pulled)
            waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not waiting:
                break
            left = None if deadline is None else deadline - self._clock()
            if left is not None and left <= 0:
                break
            self._sleep(self.poll if left is None else min(self.poll, left))
        return replies
