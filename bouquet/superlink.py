"""bouquet's SuperLink entry: Flower's ``flower-superlink`` whose SQLite state waits out a locked database.

    python -m bouquet.superlink --database state.db [any flower-superlink option] [--state-busy-timeout 120]

Everything but ``--state-busy-timeout`` goes to Flower's own entry point unchanged, so this is
``flower-superlink`` with one difference: each connection to a SQLite state database waits up to
``--state-busy-timeout`` seconds (default :data:`DEFAULT_BUSY_TIMEOUT_S`) for another writer's lock, where
Flower 1.42 waits 5 s (its ``busy_timeout`` pragma) and then answers the request with HTTP 500.

Why: the ServerApp's task heartbeat (a thread, every 17.5-22.5 s) ends at the first HTTP 500 it gets, and the
SuperLink then fails the run 60 s after the last heartbeat ("No heartbeat received from the task"), although
the database was slow for a few seconds only.  A state database on an edge box's SD card, or beside a backup
that holds it for 25 s, meets this.  Waiting longer for the lock turns such a stall into a slow request: the
heartbeat arrives late but arrives, and the run goes on.  docs/RELIABILITY.md has the measurements.

How: a SQLAlchemy ``checkout`` pool event (SQLAlchemy's public API) sets ``PRAGMA busy_timeout`` each time a
SQLite connection leaves a pool, i.e. after Flower's own ``connect`` listener has set its 5 s.  No Flower
module is modified; ``tests/test_superlink.py`` checks on Flower's own state classes that the timeout takes
effect, so a Flower release that changes how it connects shows up as a failing test.
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "main", "patient_sqlite", "superlink_command"]

#: Seconds a write to the SuperLink's SQLite state waits for another writer's lock (Flower 1.42 waits 5 s).
DEFAULT_BUSY_TIMEOUT_S = 120.0


def _check_timeout(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"state-busy-timeout must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def patient_sqlite(busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Callable[[], None]:
    """Make every SQLite connection checked out of a SQLAlchemy pool wait ``busy_timeout_s`` for a lock.

    Applies to every engine of this process, Flower's state included, from the next checkout on; other
    databases than SQLite are left alone.  Returns a function that removes the listener again.

    Parameters
    ----------
    busy_timeout_s : float
        Seconds SQLite retries a locked database before it raises ``database is locked``; positive.
    """
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    milliseconds = round(_check_timeout(busy_timeout_s) * 1000)

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute(f"PRAGMA busy_timeout = {milliseconds}")

    event.listen(Pool, "checkout", on_checkout)
    return lambda: event.remove(Pool, "checkout", on_checkout)


def superlink_command(args: list[str], busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> list[str]:
    """The command line that starts this entry with Flower's ``args`` (this Python, ``-m bouquet.superlink``).

    Parameters
    ----------
    args : list of str
        ``flower-superlink``'s options (``--database``, ``--host``, TLS, ...), passed through unchanged.
    busy_timeout_s : float
        ``--state-busy-timeout``: seconds a state write waits for a lock; positive.
    """
    return [sys.executable, "-m", "bouquet.superlink", "--state-busy-timeout", f"{_check_timeout(busy_timeout_s):g}",
            *args]


def _parse(argv: list[str]) -> tuple[float, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m bouquet.superlink", add_help=False,
        description="flower-superlink whose SQLite state waits out a locked database; every other option is "
                    "flower-superlink's (--help lists them)")
    parser.add_argument("--state-busy-timeout", type=float, default=DEFAULT_BUSY_TIMEOUT_S, metavar="SECONDS",
                        help=f"seconds a state write waits for a lock (default {DEFAULT_BUSY_TIMEOUT_S:g}; Flower: 5)")
    ours, flowers = parser.parse_known_args(argv)
    try:
        return _check_timeout(ours.state_busy_timeout), flowers
    except ValueError as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> None:
    """Run Flower's ``flower-superlink`` with ``argv`` (less ``--state-busy-timeout``) and patient SQLite."""
    seconds, flowers = _parse(sys.argv[1:] if argv is None else argv)
    from flwr.superlink.cli import flower_superlink

    patient_sqlite(seconds)
    sys.argv = ["flower-superlink", *flowers]
    flower_superlink()


if __name__ == "__main__":
    main()
