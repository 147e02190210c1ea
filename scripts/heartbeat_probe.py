"""Probe: how close Flower's task heartbeat comes to ending a run, under load or a stopped process.

    python scripts/heartbeat_probe.py --runs 5 --hog 4                  # the soak: 5 default jobs, 4 busy processes
    python scripts/heartbeat_probe.py --runs 1 --stop-at 40 --stop-for 70   # SIGSTOP the simulation 70 s at 40 s
    python scripts/heartbeat_probe.py --runs 1 --state-database --lock-db-at 10 --lock-db-for 25 \
        --supernodes 20 --run-config 'forecaster="paper" num-server-rounds=60 clients-per-round=10'   # the cause

Flower 1.42's SuperLink ends a RUNNING task whose ``active_until`` passes ("No heartbeat received from the
task"); each heartbeat of the simulation process (a thread, every 17.5-22.5 s) sets it to now + 60 s.  This
script runs jobs of ``python -m bouquet.launch`` on one warm runtime (:mod:`bouquet.runtime`) and, with
``--state-database`` (the SuperLink's state in SQLite, Flower's ``--database``, instead of in memory as
bouquet's local runs keep it), every 0.5 s reads the state database (read-only) for the running task's
``active_until``: the *headroom*
(``active_until`` - now) falls from ~60 s towards 0 between two heartbeats, and a run dies when it reaches 0.
With ``--hog N`` it keeps N busy-looping processes (nice 0, as a loaded machine) running the whole time; with
``--stop-at T --stop-for S`` it sends SIGSTOP to the run's ``flwr-simulation`` process T s after the run starts
and SIGCONT S s later; with ``--lock-db-at T --lock-db-for S`` it holds the state database's write lock for S s
(as a long write of the SuperLink itself would).

Prints one line per run (status, the smallest headroom seen and when, the final MAE) and writes the headroom
trace as CSV under ``--out``.  The runs' numbers must be identical (checked): the last line says how many of
the runs completed, e.g. ``heartbeat soak: 5 of 5 completed, identical numbers``.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from bouquet.launch import failed_runs, run_ids
from bouquet.processes import command_line, descendants, flwr, hold_write_lock
from bouquet.runtime import WarmRuntime

ROOT = Path(__file__).resolve().parents[1]


def _busy() -> None:  # a CPU hog: one busy core
    while True:
        pass


def running_headroom(database: Path) -> float | None:
    """Seconds until the running task's ``active_until`` (None when no task runs)."""
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1) as connection:
            rows = connection.execute("select active_until from task where active_until is not null and "
                                      "running_at is not null and finished_at is null").fetchall()
    except sqlite3.Error:
        return None
    if not rows:
        return None
    until = min(datetime.fromisoformat(row[0]).timestamp() for row in rows)
    return until - time.time()


class Monitor(threading.Thread):
    """Samples the headroom every ``interval`` s; SIGSTOPs the simulation process when asked."""

    def __init__(self, database: Path, superlink_pid: int, stop_at: float | None, stop_for: float,
                 lock_at: float | None = None, lock_for: float = 10.0, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.database, self.superlink_pid = database, superlink_pid
        self.stop_at, self.stop_for, self.interval = stop_at, stop_for, interval
        self.lock_at, self.lock_for, self.locked = lock_at, lock_for, False
        self.trace: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.started = time.monotonic()
        self.stopped_pid: int | None = None

    def run(self) -> None:
        while not self.done.is_set():
            elapsed = time.monotonic() - self.started
            headroom = running_headroom(self.database)
            if headroom is not None:
                self.trace.append((elapsed, headroom))
            if self.stop_at is not None and self.stopped_pid is None and elapsed >= self.stop_at:
                simulations = [pid for pid in descendants(self.superlink_pid)
                               if "flwr-simulation" in command_line(pid)]
                if simulations:
                    self.stopped_pid = simulations[0]
                    os.kill(self.stopped_pid, signal.SIGSTOP)
                    print(f"  SIGSTOP to flwr-simulation (pid {self.stopped_pid}) at {elapsed:.0f} s", flush=True)
                    threading.Timer(self.stop_for, self._resume).start()
            if self.lock_at is not None and not self.locked and elapsed >= self.lock_at:
                self.locked = True
                threading.Thread(target=self._hold_write_lock, daemon=True).start()
            self.done.wait(self.interval)

    def _hold_write_lock(self) -> None:
        """Hold the state database's write lock ``lock_for`` s, as a busy writer does (Flower's own SuperLink waits
        for it up to SQLite's busy timeout, 5 s in Flower 1.42, then fails the write; bouquet.superlink 120 s)."""
        held = threading.Event()
        holder = threading.Thread(target=hold_write_lock, args=(self.database, self.lock_for, held), daemon=True)
        holder.start()
        if held.wait(60):
            print(f"  write lock on the state database for {self.lock_for:g} s", flush=True)
        holder.join()
        print("  write lock released", flush=True)

    def _resume(self) -> None:
        try:
            os.kill(self.stopped_pid, signal.SIGCONT)
            print(f"  SIGCONT to pid {self.stopped_pid}", flush=True)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hog", type=int, default=0, help="busy-looping processes kept running throughout")
    parser.add_argument("--stop-at", type=float, default=None, help="SIGSTOP the simulation this many s into a run")
    parser.add_argument("--stop-for", type=float, default=70.0)
    parser.add_argument("--lock-db-at", type=float, default=None,
                        help="hold the SuperLink's state database's write lock this many s into a run")
    parser.add_argument("--lock-db-for", type=float, default=10.0)
    parser.add_argument("--state-database", action="store_true",
                        help="the SuperLink keeps its state in SQLite (Flower's --database) instead of in memory, as "
                             "bouquet's local runs do; needed for --lock-db-at and the headroom trace")
    parser.add_argument("--run-config", default="", help="overrides of the default job")
    parser.add_argument("--supernodes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "heartbeat")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hog < 0:
        parser.error("--runs must be >= 1 and --hog >= 0")
    if args.lock_db_at is not None and not args.state_database:
        parser.error("--lock-db-at needs --state-database (the in-memory state has no database to lock)")
    args.out.mkdir(parents=True, exist_ok=True)
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.hog)]
    for hog in hogs:
        hog.start()
    print(f"# heartbeat_probe: {os.cpu_count()} CPUs, {args.hog} busy processes, {args.runs} runs, SuperLink state "
          f"{'in SQLite' if args.state_database else 'in memory (no headroom trace)'}", flush=True)
    outcomes = []
    try:
        with tempfile.TemporaryDirectory(prefix="heartbeat-") as folder:
            runtime = WarmRuntime(Path(folder) / "runtime")
            state, _ = runtime.up(state_database=args.state_database)
            try:
                for index in range(1, args.runs + 1):
                    outcomes.append(_one(index, args, runtime.folder, state, Path(folder)))
            finally:
                log = runtime.folder / "superlink" / "superlink.log"
                if log.exists():  # the SuperLink's own log (its HTTP answers, failed writes), kept
                    (args.out / "superlink.log").write_text(log.read_text(errors="replace"))
                runtime.down()
    finally:
        for hog in hogs:
            hog.kill()
    completed = [o for o in outcomes if o["status"] == "finished:completed"]
    numbers = {json.dumps(o["numbers"], sort_keys=True) for o in completed}
    same = "identical numbers" if len(numbers) <= 1 else f"{len(numbers)} different results"
    print(f"heartbeat soak: {len(completed)} of {len(outcomes)} completed, {same}", flush=True)
    return 0 if len(completed) == len(outcomes) and len(numbers) <= 1 else 1


def _one(index: int, args: argparse.Namespace, runtime_dir: Path, state, folder: Path) -> dict:
    database = Path(state.flwr_home).parent / "state.db"
    earlier = run_ids(flwr(["ls", "bouquet-local", "--format", "json"], Path(state.flwr_home), timeout=60).stdout)
    monitor = Monitor(database, state.superlink_pid, args.stop_at, args.stop_for, args.lock_db_at, args.lock_db_for)
    results = folder / "results"
    command = [sys.executable, "-m", "bouquet.launch", str(ROOT), "--runtime-dir", str(runtime_dir),
               "--run-config", f'{args.run_config} results-dir="{results}" run-name="run{index}"'.strip()]
    if args.supernodes:
        command += ["--supernodes", str(args.supernodes)]
    started = time.monotonic()
    monitor.start()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    # `flwr run --stream` may return while the run goes on (its log stream ended): wait for Flower's verdict
    deadline = time.monotonic() + 1800
    while True:
        listing = flwr(["ls", "bouquet-local", "--format", "json"], Path(state.flwr_home), timeout=60).stdout
        try:
            mine = [r for r in json.loads(listing)["runs"] if str(r.get("run-id")) not in earlier]
        except (ValueError, KeyError, TypeError):  # flwr ls itself failed (e.g. the database was locked)
            mine = []
        finished = bool(mine) and all(str(r.get("status", "")).startswith("finished") for r in mine)
        if finished or time.monotonic() > deadline:
            break
        time.sleep(2)
    monitor.done.set()
    monitor.join()
    wall = time.monotonic() - started
    failed = failed_runs(listing, earlier)
    stream_cut = bool(mine) and done.returncode == 0 and not (results / f"run{index}" / "summary.json").exists() \
        and not failed
    if stream_cut:
        print("  flwr run returned before the run ended (its log stream was cut)", flush=True)
    for run in mine:
        print(f"  Flower: run {run.get('run-id')} {run.get('status')} {run.get('status-details', '')}".rstrip(),
              flush=True)
        # the run's whole log as the SuperLink keeps it (the simulation process's stderr included)
        log = flwr(["log", str(run.get("run-id")), "bouquet-local", "--show"], Path(state.flwr_home), timeout=120)
        (args.out / f"flower-log-run{index}.txt").write_text(log.stdout + log.stderr)
        dead = [line for line in log.stdout.splitlines() if "Exception in thread" in line or "HTTPStatusError" in line]
        if dead:
            print(f"  in the run's log: {dead[0].strip()[:200]}", flush=True)
    summary_file = results / f"run{index}" / "summary.json"
    numbers = {}
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        numbers = {k: summary[k] for k in ("mae-litres-mean", "mae-litres-std", "mse-mean") if k in summary}
    status = "finished:completed" if not failed and done.returncode == 0 and numbers else (
        "; ".join(failed) or f"exit {done.returncode}, no summary")
    low = min(monitor.trace, key=lambda t: t[1]) if monitor.trace else (float("nan"), float("nan"))  # SQLite only
    with open(args.out / f"headroom-run{index}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["seconds", "headroom-s"])
        writer.writerows((round(t, 2), round(h, 2)) for t, h in monitor.trace)
    print(f"run {index}: {status}; {wall:.0f} s; smallest headroom {low[1]:.1f} s at {low[0]:.0f} s; "
          f"MAE {numbers.get('mae-litres-mean', float('nan')):.4f}", flush=True)
    if status != "finished:completed":
        (args.out / f"run{index}.log").write_text(done.stdout + done.stderr)
    return {"status": status, "numbers": numbers, "low": low[1], "wall": wall}


if __name__ == "__main__":
    raise SystemExit(main())
