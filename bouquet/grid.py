"""A Grid adapter whose ``send_and_receive`` looks for replies soon and often at first, then less often.

Flower's Grid in a deployment (``flwr.superlink.grid.http_grid``) pushes the messages, pulls the replies,
and sleeps 3 s between pulls until every reply is in, so each phase of a round (identity query, sketch
query, train, evaluate) costs at least 3 s when the nodes are not done at the first pull, however fast
they are; the simulation's in-memory Grid polls every 0.1 s. :class:`PollingGrid` wraps any Grid and does
the same exchange through the Grid's public ``push_messages`` / ``pull_messages``: it pulls right after the
push and then every 0.1 s while replies come in; each pull that brings nothing makes the next wait 1.5
times longer, up to 2 s, and a reply brings it back to 0.1 s.
Quick phases stay quick; a long wait on slow nodes costs the SuperLink a pull every 2 s instead of every
0.1 s. That matters: with 20 households on one machine, pulls every 0.1 s added to a SuperLink whose
SQLite state was already contended ("database is locked", HTTP 500), and one such error ended the
ServerApp. A pull that fails is now logged and tried again at the next interval, up to ``retries``
failures in a row, after which the error is raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

__all__ = ["DEFAULT_POLL_SECONDS", "MAX_POLL_SECONDS", "PollingGrid"]

log = logging.getLogger(__name__)

#: Seconds between pulls while replies come in (the in-memory Grid's own interval).
DEFAULT_POLL_SECONDS = 0.1
#: The longest wait between two pulls (Flower's deployed Grid waits 3 s).
MAX_POLL_SECONDS = 2.0


class PollingGrid:
    """``grid`` with a ``send_and_receive`` that pulls replies after ``poll`` seconds, backing off to ``max_poll``.

    Parameters
    ----------
    grid : Grid
        The Grid the ServerApp was given; every other attribute is read from it.
    poll : float, default 0.1
        Seconds to the next pull after a pull that brought a reply (the first pull follows the push at once).
    max_poll : float, default 2.0
        The longest wait between pulls; an empty pull multiplies the wait by ``backoff`` up to it.
    backoff : float, default 1.5
        Growth of the wait after an empty pull (1 keeps it at ``poll``).
    retries : int, default 10
        Failed pulls in a row that are logged and tried again before the error is raised.
    clock, sleep : callables, default ``time.monotonic``, ``time.sleep``
        For tests.
    """

    def __init__(self, grid: Grid, poll: float = DEFAULT_POLL_SECONDS, max_poll: float = MAX_POLL_SECONDS,
                 backoff: float = 1.5, retries: int = 10, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if poll <= 0:
            raise ValueError(f"poll must be > 0 seconds, got {poll}")
        if max_poll < poll:
            raise ValueError(f"max_poll must be >= poll ({poll}), got {max_poll}")
        if backoff < 1:
            raise ValueError(f"backoff must be >= 1, got {backoff}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self._grid = grid
        self.poll, self.max_poll, self.backoff, self.retries = poll, max_poll, backoff, retries
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
        interval, failures = self.poll, 0
        while waiting:
            try:
                pulled = list(self._grid.pull_messages(waiting))
                failures = 0
            except Exception as error:  # the SuperLink's answer to a pull can be a transient server error
                failures += 1
                if failures > self.retries:
                    raise
                log.warning("pulling %d replies failed (%s: %s); trying again (%d of %d failures in a row)",
                            len(waiting), type(error).__name__, (str(error).splitlines() or [""])[0],
                            failures, self.retries)
                pulled = []
            replies.extend(pulled)
            waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not waiting:
                break
            left = None if deadline is None else deadline - self._clock()
            if left is not None and left <= 0:
                break
            interval = self.poll if pulled else min(interval * self.backoff, self.max_poll)
            self._sleep(interval if left is None else min(interval, left))
        return replies
