"""One writer for run folders, so that every run (simulation or deployment) has the same layout.

A run folder holds::

    config.json        the resolved run config
    rounds.jsonl       one JSON object per round and phase ("train", "evaluate")
    <table>.csv        tables appended row by row (per-client metrics, coalitions, ...)
    summary.json       final summary, written last

Rows are appended and flushed as they arrive, so an interrupted run keeps
every finished round.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["RunRecorder"]


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
        finished run: refused, so that no result is overwritten.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if (self.folder / "summary.json").exists():
            raise FileExistsError(f"{self.folder} already holds a finished run; choose another run-name")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._columns: dict[str, list[str]] = {}

    @classmethod
    def create(cls, results_dir: str | Path, run_name: str = "", label: str = "run") -> RunRecorder:
        """A new folder ``results_dir/run_name`` (default ``YYYYmmdd-HHMMSS-label``)."""
        name = run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
        return cls(Path(results_dir).expanduser().resolve() / name)

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
        path = self.folder / "rounds.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]
