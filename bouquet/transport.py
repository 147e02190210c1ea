"""How a phase's messages reach the nodes and their replies come back: the transport part.

The strategy, its samplers' queries (identity, sketches, IFCA's losses) and the final evaluation send every
message through a :class:`Transport`: ``exchange(grid, messages, timeout) -> replies``, the contract of
Flower's ``Grid.send_and_receive``.  :class:`FlowerTransport` is that call (the default, for other people's
apps); :class:`PollingTransport` (bouquet's app) looks for replies soon and often at first, then less often.

Flower's Grid in a deployment (``flwr.superlink.grid.http_grid``) pushes the messages, pulls the replies,
and sleeps 3 s between pulls until every reply is in, so each phase of a round (identity query, sketch
query, train, evaluate) costs at least 3 s when the nodes are not done at the first pull, however fast
they are; the simulation's in-memory Grid polls every 0.1 s. :class:`PollingTransport` does the same
exchange with any Grid through the Grid's public ``push_messages`` / ``pull_messages``: it pulls right after the
push and then every 0.1 s while replies come in; each pull that brings nothing makes the next wait 1.5
times longer, up to 2 s, and a reply brings it back to 0.1 s.
Quick phases stay quick; a long wait on slow nodes costs the SuperLink a pull every 2 s instead of every
0.1 s. That matters: with 20 households on one machine, pulls every 0.1 s added to a SuperLink whose
SQLite state was already contended ("database is locked", HTTP 500), and one such error ended the
ServerApp. A pull that fails is now logged and tried again at the next interval, up to ``retries``
failures in a row, after which the error is raised.

``max-in-flight`` (run config; default 0: no limit, Flower's behaviour) keeps at most that many of a
phase's messages pushed and not yet answered: the first ``max_in_flight`` are pushed, and each reply
pulled lets one more be pushed.  It is for big simulations: Flower's simulation engine
(``vce_api.add_messages_to_queue``) walks, every 0.1 s and for each node, every stored message, so a phase
that pushes all 1,099 evaluations of a 1,099-node federation at once costs nodes x messages per sweep
(``docs/PERFORMANCE.md``).  The same replies come back (replies are ordered by node before use, so their
arrival order does not matter); a message still unsent at the timeout is never sent, and is lost like an
unanswered one.  In a deployment a window only delays nodes, which fetch their messages themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from bouquet.params import RunConfigKeys, require

if TYPE_CHECKING:  # importing this module (its TransportParams, for bouquet.config) loads no flwr
    from flwr.app import Message
    from flwr.serverapp import Grid

__all__ = ["DEFAULT_POLL_SECONDS", "FLOWER_TRANSPORT", "MAX_POLL_SECONDS", "FlowerTransport", "PollingTransport",
           "Transport", "TransportParams"]

log = logging.getLogger(__name__)

#: Seconds between pulls while replies come in (the in-memory Grid's own interval).
DEFAULT_POLL_SECONDS = 0.1
#: The longest wait between two pulls (Flower's deployed Grid waits 3 s).
MAX_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class TransportParams:
    """How :class:`PollingTransport` exchanges a phase's messages (run-config key ``max-in-flight``).

    Parameters
    ----------
    poll : float, default 0.1
        Seconds to the next pull after a pull that brought a reply (the first pull follows the push at once).
    max_poll : float, default 2.0
        The longest wait between pulls; an empty pull multiplies the wait by ``backoff`` up to it.
    backoff : float, default 1.5
        Growth of the wait after an empty pull (1 keeps it at ``poll``).
    retries : int, default 10
        Failed pulls in a row that are logged and tried again before the error is raised.
    max_in_flight : int, default 0
        At most this many messages pushed and not yet answered (0: push them all at once, as Flower does).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"max_in_flight": "max-in-flight"},
        skip=("poll", "max_poll", "backoff", "retries"),
    )

    poll: float = DEFAULT_POLL_SECONDS
    max_poll: float = MAX_POLL_SECONDS
    backoff: float = 1.5
    retries: int = 10
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        require(self.poll > 0, "poll", f"poll must be > 0 seconds, got {self.poll}")
        require(self.max_poll >= self.poll, "max_poll", f"max_poll must be >= poll ({self.poll}), got {self.max_poll}")
        require(self.backoff >= 1, "backoff", f"backoff must be >= 1, got {self.backoff}")
        require(self.retries >= 0, "retries", f"retries must be >= 0, got {self.retries}")
        require(self.max_in_flight >= 0, "max_in_flight",
                f"max-in-flight must be >= 0 (0: no limit), got {self.max_in_flight}")


class Transport(Protocol):
    """Sends a phase's messages through ``grid`` and returns the replies that came back within ``timeout``."""

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]: ...


class FlowerTransport:
    """Flower's own exchange: ``grid.send_and_receive`` (the default of a strategy built outside the app)."""

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
        return list(grid.send_and_receive(messages, timeout=timeout))


#: The default transport everywhere one can be given (it holds no state, so one instance serves all).
FLOWER_TRANSPORT = FlowerTransport()


class PollingTransport:
    """Pushes ``messages``, then pulls their replies after ``poll`` seconds, backing off to ``max_poll``.

    Parameters
    ----------
    params : TransportParams, default TransportParams()
        The pull intervals, the retries and the window (``max_in_flight``).
    clock, sleep : callables, default ``time.monotonic``, ``time.sleep``
        For tests.
    """

    def __init__(self, params: TransportParams = TransportParams(), clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not isinstance(params, TransportParams):
            raise TypeError(f"params must be a TransportParams, got {type(params).__name__}")
        self.params = params
        self._clock = clock
        self._sleep = sleep

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
        """Push ``messages`` (at most ``max_in_flight`` unanswered at a time), then pull their replies until all
        are in or ``timeout`` seconds have passed.

        Same contract as ``Grid.send_and_receive``: replies that arrive later are not returned, and neither
        are replies to messages the window had not sent by then.
        """
        params = self.params
        queue = list(messages)
        window = params.max_in_flight or len(queue)
        deadline = None if timeout is None else self._clock() + timeout
        waiting: set[str] = set()
        replies: list[Message] = []
        sent = 0

        def push() -> None:
            nonlocal sent
            batch = queue[sent:sent + window - len(waiting)]
            if batch:
                sent += len(batch)
                waiting.update(grid.push_messages(batch))

        push()
        interval, failures = params.poll, 0
        while waiting:
            try:
                pulled = list(grid.pull_messages(waiting))
                failures = 0
            except Exception as error:  # the SuperLink's answer to a pull can be a transient server error
                failures += 1
                if failures > params.retries:
                    raise
                log.warning("pulling %d replies failed (%s: %s); trying again (%d of %d failures in a row)",
                            len(waiting), type(error).__name__, (str(error).splitlines() or [""])[0],
                            failures, params.retries)
                pulled = []
            replies.extend(pulled)
            waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
            left = None if deadline is None else deadline - self._clock()
            if left is None or left > 0:
                push()
            if not waiting:
                break
            if left is not None and left <= 0:
                break
            interval = params.poll if pulled else min(interval * params.backoff, params.max_poll)
            self._sleep(interval if left is None else min(interval, left))
        if sent < len(queue):
            log.warning("%d of %d messages were not sent: the timeout (%s s) came first with %d in flight "
                        "(max-in-flight = %d)", len(queue) - sent, len(queue), timeout, len(waiting),
                        params.max_in_flight)
        return replies
