"""One writer and one reader of run folders, so that every run (simulation or deployment) has one layout.

A run folder holds::

    config.json        the resolved run config
    rounds.jsonl       one JSON object per round and phase ("select", "train", "evaluate", "central")
    <table>.csv        tables appended row by row (per-client metrics, coalitions, ...)
    trajectories/      round-NNN.npz of HK opinion trajectories (when recorded)
    summary.json       final summary, written last

:class:`RunRecorder` writes a folder; rows are appended and flushed as they arrive, so an interrupted
run keeps every finished round.  :class:`RunFolder` reads one back, and :func:`find_runs` lists the
finished runs under a results folder: every figure script reads through them.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["RunFolder", "RunRecorder", "find_runs", "markdown_table"]


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


class RunRecorder:
    """Append-only writer of one run folder.

    Parameters
    ----------
    folder : Path
        Created if missing.  An existing ``summary.json`` there means a
        finished run, and any other file an interrupted one: both refused (unless ``resume``), so that no
        run writes over another run's results.
    resume : bool, default False
        Go on appending to the existing folder of an interrupted run (tables keep the columns of their
        header line); see :meth:`reopen`.
    """

    def __init__(self, folder: str | Path, resume: bool = False) -> None:
        self.folder = Path(folder)
        if (self.folder / "summary.json").exists():
            raise FileExistsError(f"{self.folder} already holds a finished run; choose another run-name")
        if resume and not self.folder.is_dir():
            raise FileNotFoundError(f"no run folder {self.folder} to resume")
        if not resume and self.folder.is_dir() and any(self.folder.iterdir()):
            raise FileExistsError(f"{self.folder} holds another (interrupted) run: resume it with resume-from, or "
                                  f"choose another run-name; no run writes over another run's folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.resumed = resume
        self._columns: dict[str, list[str]] = {}

    @classmethod
    def reopen(cls, folder: str | Path) -> RunRecorder:
        """The recorder of an interrupted run's folder, appending where it stopped."""
        return cls(Path(folder).expanduser().resolve(), resume=True)

    @classmethod
    def create(cls, results_dir: str | Path, run_name: str = "", label: str = "run") -> RunRecorder:
        """A new folder ``results_dir/run_name`` (default ``YYYYmmdd-HHMMSS-label``)."""
        base = Path(results_dir).expanduser().resolve()
        if run_name:
            return cls(base / run_name)
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
        folder, n = base / name, 1
        while folder.exists():  # two runs started in the same second: each its own folder
            n += 1
            folder = base / f"{name}-{n}"
        return cls(folder)

    def write_json(self, name: str, payload: Mapping[str, Any]) -> Path:
        path = self.folder / name
        path.write_text(json.dumps({k: _plain(v) for k, v in payload.items()}, indent=2, sort_keys=True) + "\n")
        return path

    def log_round(self, server_round: int, phase: str, metrics: Mapping[str, Any]) -> None:
        """Append one line to ``rounds.jsonl``."""
        line = {"round": server_round, "phase": phase, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.folder / "rounds.jsonl", "a") as handle:
            handle.write(json.dumps(line) + "\n")

    def append_rows(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append rows to ``table.csv``; the first row fixes the columns."""
        rows = list(rows)
        if not rows:
            return
        path = self.folder / f"{table}.csv"
        columns = self._columns.get(table)
        if columns is None and self.resumed and path.exists() and path.stat().st_size:
            with open(path, newline="") as handle:
                columns = next(csv.reader(handle))
            self._columns[table] = columns
        if columns is None:
            columns = list(rows[0])
            self._columns[table] = columns
            with open(path, "w", newline="") as handle:
                csv.writer(handle).writerow(columns)
        with open(path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="raise")
            writer.writerows({k: _plain(v) for k, v in row.items()} for row in rows)

    def rounds(self) -> list[dict[str, Any]]:
        """Read back ``rounds.jsonl``."""
        return RunFolder(self.folder).rounds()


class RunFolder:
    """Reads one run folder (the layout :class:`RunRecorder` writes).

    Parameters
    ----------
    path : str or Path
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def finished(self) -> bool:
        """Whether the run wrote its summary (its last act)."""
        return (self.path / "summary.json").exists()

    def config(self) -> dict[str, Any]:
        """The resolved run config (kebab-case keys)."""
        return json.loads((self.path / "config.json").read_text())

    def app_config(self) -> Any:
        """The run config as :class:`bouquet.config.AppConfig`."""
        from bouquet.config import AppConfig

        return AppConfig.from_run_config(self.config())

    def summary(self) -> dict[str, Any]:
        return json.loads((self.path / "summary.json").read_text())

    def rounds(self, phase: str | None = None) -> list[dict[str, Any]]:
        """The round records, in order; only ``phase``'s when given."""
        path = self.path / "rounds.jsonl"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line]
        return [line for line in lines if phase is None or line["phase"] == phase]

    def series(self, phase: str, key: str) -> list[Any]:
        """``key`` of every ``phase`` record that has it, in round order."""
        return [line[key] for line in self.rounds(phase) if key in line]

    def has(self, table: str) -> bool:
        return (self.path / f"{table}.csv").exists()

    def table(self, name: str) -> Any:
        """``<name>.csv`` as a pandas DataFrame."""
        import pandas as pd

        return pd.read_csv(self.path / f"{name}.csv")

    def trajectory_files(self) -> list[Path]:
        """The recorded HK trajectories, by round."""
        return sorted((self.path / "trajectories").glob("round-*.npz"))


def find_runs(base: str | Path, pattern: str = "*/seed-*") -> list[RunFolder]:
    """The finished runs in the folders under ``base`` that match ``pattern``, sorted by path."""
    return [RunFolder(path) for path in sorted(Path(base).glob(pattern)) if (path / "summary.json").exists()]


def markdown_table(frame: Any) -> str:
    """A pandas DataFrame as a pipe table (no tabulate dependency): "-" for missing values, integers as such,
    other numbers with 2 decimals (3 below 1)."""

    def cell(value: object) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"
