"""The side jobs of a run, as hooks: one protocol with do-nothing defaults (:class:`Hook`).

A hook overrides what it needs: :meth:`Hook.on_event` receives one
:class:`bouquet.strategies.rounds.RoundEvent` per phase (``select``, ``train``, ``evaluate``, ``central``)
and round; :meth:`Hook.evaluate` scores the model on the server (central evaluation) before the first round
and after each; :meth:`Hook.on_round_end` runs when every record of a round is written (a checkpoint);
:meth:`Hook.should_stop` ends a run early.  The strategy takes its hooks once, when it is built
(``BouquetStrategy(hooks=...)``); Flower's ``evaluate_fn`` argument of ``start`` becomes a
:class:`CentralEvaluation` hook for that run.  Shipped: :class:`ConsoleLines`, :class:`RecorderObserver`,
:class:`TrajectoryWriter`, :class:`CentralEvaluation`, :class:`StopWhen`, and
:class:`bouquet.strategies.checkpoints.Checkpointing`.  Only ``evaluate`` and ``should_stop`` can change what
a run does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from bouquet.algorithms.hk import opinion_trajectory_2d
from bouquet.strategies.rounds import RoundEvent

if TYPE_CHECKING:
    from bouquet.strategies.strategy import BouquetStrategy

__all__ = ["CentralEvaluation", "ConsoleLines", "Hook", "Recorder", "RecorderObserver", "StopWhen",
           "TrajectoryWriter"]

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

    def on_round_end(self, strategy: BouquetStrategy, server_round: int, result: Result) -> None:
        """A round is complete and every record of it written."""
        return

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


class TrajectoryWriter(Hook):
    """One ``round-NNN.npz`` per round in ``folder``: HK's opinions projected to 2-D per inner step.

    Needs an HK aggregation that records trajectories (``CoalitionParams(record_trajectories=True)``);
    each file holds ``projection`` (steps + 1, S, 2), ``labels`` and ``node_ids``.

    Parameters
    ----------
    folder : str or Path
        Created on the first trajectory.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def on_event(self, event: RoundEvent) -> None:
        trajectory = event.artifacts.get("hk-trajectory")
        if trajectory is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        projection = opinion_trajectory_2d(trajectory["history"], trajectory["gram"], trajectory["params"])
        np.savez(self.folder / f"round-{event.server_round:03d}.npz", projection=projection,
                 labels=trajectory["labels"], node_ids=np.array(trajectory["node_ids"], dtype=np.uint64))
