"""Side jobs of a round, as observers: console lines, the run recorder, the HK trajectory writer.

The strategy hands every observer one :class:`bouquet.strategies.rounds.RoundEvent` per phase
(``select``, ``train``, ``evaluate``) and round; an observer never changes what the strategy does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bouquet.algorithms.hk import opinion_trajectory_2d
from bouquet.strategies.rounds import RoundEvent

__all__ = ["ConsoleLines", "Observer", "Recorder", "RecorderObserver", "TrajectoryWriter"]

log = logging.getLogger(__name__)


class Observer(Protocol):
    """Receives what happened in each phase of each round."""

    def on_event(self, event: RoundEvent) -> None: ...


class Recorder(Protocol):
    """Where round records and table rows go (``bouquet.results.RunRecorder`` fits)."""

    def log_round(self, server_round: int, phase: str, metrics: Mapping[str, Any]) -> None: ...

    def append_rows(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None: ...


class ConsoleLines:
    """Logs each part's one-line summary of its round (``round 3: HK cosine tau=0.75 -> K=2 ...``)."""

    def on_event(self, event: RoundEvent) -> None:
        if event.summary:
            log.info("round %d: %s", event.server_round, event.summary)


class RecorderObserver:
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


class TrajectoryWriter:
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
