"""The side jobs of a run, as hooks: one protocol with do-nothing defaults (:class:`Hook`).

A hook overrides what it needs: :meth:`Hook.on_event` receives one
:class:`bouquet.strategies.rounds.RoundEvent` per phase (``select``, ``train``, ``evaluate``, ``central``)
and round; :meth:`Hook.evaluate` scores the model on the server (central evaluation) before the first round
and after each; :meth:`Hook.on_round_end` runs when every record of a round is written (a checkpoint);
:meth:`Hook.should_stop` ends a run early.  The strategy takes its hooks once, when it is built
(``BouquetStrategy(hooks=...)``); Flower's ``evaluate_fn`` argument of ``start`` becomes a
:class:`CentralEvaluation` hook for that run.  Shipped: :class:`ConsoleLines`, :class:`RecorderObserver`,
:class:`CentralEvaluation`, :class:`StopWhen`, :class:`bouquet.strategies.checkpoints.Checkpointing` and
HK's :class:`bouquet.strategies.aggregation.TrajectoryWriter`.  A hook sees what a round produced (its
events, the shared model, the :class:`~bouquet.strategies.state.ServerState`, the ``Result``), never the
strategy.  Only ``evaluate`` and ``should_stop`` can change what
a run does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from bouquet.strategies.rounds import RoundEvent
from bouquet.strategies.state import ServerState

__all__ = ["CentralEvaluation", "ConsoleLines", "Hook", "Recorder", "RecorderObserver", "StopWhen"]

log = logging.getLogger(__name__)


class Hook:
    """A side job of a run; every method does nothing until a subclass overrides it (after pfl-research's
    callbacks)."""

    def on_event(self, event: RoundEvent) -> None:
        """What happened in one phase of one round."""
        return

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Score the shared model on the server: round 0 (the initial model) and after each round."""
        return None

    def on_round_end(self, server_round: int, state: ServerState, result: Result) -> None:
        """A round is complete and every record of it written: the strategy's whole state after it (what a
        checkpoint saves) and the run's metrics until now.  The strategy calls only the hooks that override
        this and are :meth:`due` this round, so the state is built only on a round when one reads it."""
        return

    def due(self, server_round: int) -> bool:
        """Whether :meth:`on_round_end` is called after ``server_round`` (every round unless overridden)."""
        return True

    def should_stop(self, server_round: int, result: Result) -> bool:
        """True ends the run after this round."""
        return False


class CentralEvaluation(Hook):
    """Flower's ``evaluate_fn(server_round, arrays) -> MetricRecord | None`` as a hook.

    Parameters
    ----------
    evaluate_fn : callable
    """

    def __init__(self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None]) -> None:
        self.evaluate_fn = evaluate_fn

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        return self.evaluate_fn(server_round, arrays)


class StopWhen(Hook):
    """Ends the run after the first round for which ``predicate(server_round, result)`` is true.

    Parameters
    ----------
    predicate : callable
    """

    def __init__(self, predicate: Callable[[int, Result], bool]) -> None:
        self.predicate = predicate

    def should_stop(self, server_round: int, result: Result) -> bool:
        return bool(self.predicate(server_round, result))


class Recorder(Protocol):
    """Where round records and table rows go (``bouquet.results.RunRecorder`` fits)."""

    def log_round(self, server_round: int, phase: str, metrics: Mapping[str, Any]) -> None: ...

    def append_rows(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None: ...


class ConsoleLines(Hook):
    """Logs each part's one-line summary of its round (``round 3: HK cosine tau=0.75 -> K=2 ...``)."""

    def on_event(self, event: RoundEvent) -> None:
        if event.summary:
            log.info("round %d: %s", event.server_round, event.summary)


class RecorderObserver(Hook):
    """Writes each event's table rows, then its round record, through a :class:`Recorder`.

    Parameters
    ----------
    recorder : Recorder
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def on_event(self, event: RoundEvent) -> None:
        for table, rows in event.tables.items():
            self.recorder.append_rows(table, rows)
        self.recorder.log_round(event.server_round, event.phase, event.metrics)
