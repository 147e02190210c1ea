"""Soak in deployment mode: runs on a real SuperLink (state database, TLS, SuperNode auth) whose state
database is locked mid-run, on a machine kept busy by CPU hogs; optionally a SuperLink killed mid-run.

    python scripts/deploy_soak.py --runs 5 --hog 2 --lock-for 25 --out results/deploy-soak        # bouquet's SuperLink
    python scripts/deploy_soak.py --runs 1 --hog 2 --lock-for 25 --flower --out results/deploy-soak-flower  # Flower's
    python scripts/deploy_soak.py --runs 1 --restart-after-round 3 --out results/deploy-soak-restart

One deployment for all runs, as a utility keeps one (``bouquet.deploy``: a SuperLink with ``--database`` on
127.0.0.1 and ``--nodes`` SuperNodes (partition K: household K of the synthetic pool), TLS and SuperNode authentication unless
``--insecure``).  Each run is the app's job with ``--run-config`` (the same seed every run); after its round
``--lock-after-round`` has been checkpointed, the state database's write lock is held ``--lock-for`` s (as a
backup, a long write or a stalled SD card does), longer than one heartbeat period of the ServerApp (17.5-22.5 s).
``--hog N`` keeps N busy-looping processes running throughout.  ``--flower`` starts Flower's own
``flower-superlink`` instead of ``python -m bouquet.superlink`` (its state waits 5 s for a lock, then answers
HTTP 500 and the run dies 60 s later: docs/RELIABILITY.md).  ``--restart-after-round K`` kills the SuperLink
(SIGKILL, with its ServerApp) after round K's checkpoint, starts it again on the same database, stops the
dead run and resumes it from its checkpoint (``resume-from``), as docs/DEPLOY.md tells an operator to.  A run
not finished within ``--run-timeout`` s is stopped (``flwr stop``) and counted as failed.

Prints one line per run (Flower's status, wall time, MAE) and appends it to ``<out>/runs.csv``; a run whose
folder already holds ``summary.json`` is not run again (resumable).  The last line says how many runs
completed and whether their numbers are identical (``summary.json`` less its wall time and resume mark, and
``predictions.csv`` byte for byte), e.g. ``deployment soak: 5 of 5 completed, identical numbers``.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import subprocess
import sys
import threading
import time
from pathlib import Path

from bouquet.checkpoint import wait_for_checkpoint
from bouquet.deploy import deployment, make_node_key, start_supernode, wait_for_nodes
from bouquet.launch import resume_overrides
from bouquet.processes import hold_write_lock

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ("num-server-rounds=12 clients-per-round=3 fraction-evaluate=0 synthetic-households=100 "
                  "active-factor=0.5 local-epochs=1 seed=5")
VOLATILE = ("wall-seconds", "resumed-after-round")


def _busy() -> None:  # a CPU hog: one busy core
    while True:
        pass


def _numbers(folder: Path) -> tuple[dict, bytes] | None:
    if not (folder / "summary.json").exists():
        return None
    summary = {k: v for k, v in json.loads((folder / "summary.json").read_text()).items() if k not in VOLATILE}
    predictions = folder / "predictions.csv"
    return summary, predictions.read_bytes() if predictions.exists() else b""


def _one(deploy, index: int, args: argparse.Namespace, results: Path) -> dict:
    name = f"run{index}"
    folder = results / name
    config = f'{args.run_config} results-dir="{results}" run-name="{name}"'
    before = {int(r["run-id"]) for r in deploy.runs()}
    started = time.monotonic()
    outcome: dict = {}
    def go() -> None:
        try:
            outcome["done"] = deploy.run(ROOT, run_config=config, timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            outcome["timed-out"] = True

    runner = threading.Thread(target=go)
    runner.start()
    events = []
    if args.lock_for > 0 and wait_for_checkpoint(folder, args.lock_after_round, runner.is_alive, timeout=1800):
        at = time.monotonic() - started
        hold_write_lock(args.workdir / "state.db", args.lock_for)
        events.append(f"write lock {at:.0f}-{time.monotonic() - started:.0f} s")
        print(f"  {events[-1]}", flush=True)
    if args.restart_after_round and wait_for_checkpoint(folder, args.restart_after_round, runner.is_alive, timeout=1800):
        deploy.restart_superlink(crash=True)
        events.append(f"SuperLink killed and restarted at {time.monotonic() - started:.0f} s")
        print(f"  {events[-1]}", flush=True)
        runner.join(timeout=600)
        for stale in deploy.unfinished_runs():  # the dead run is still "running" in the state database
            deploy.stop_run(stale)
        wait_for_nodes(deploy, args.nodes, timeout=300)
        outcome["resumed"] = deploy.run(ROOT, run_config=resume_overrides(folder), timeout=3600)
    runner.join()
    runs = [r for r in deploy.wait_for_runs(args.run_timeout) if int(r["run-id"]) not in before]
    for run in runs:  # never started or never ended within the time: stop it, so that the next run can go
        if not str(run["status"]).startswith("finished"):
            deploy.stop_run(int(run["run-id"]))
            events.append(f"run {run['run-id']} still {run['status']} after {args.run_timeout:g} s: stopped")
    wall = time.monotonic() - started
    statuses = "; ".join(f"{r['status']} {r.get('status-details', '')}".replace(" N/A", "").strip() for r in runs)
    numbers = _numbers(folder)
    summary = numbers[0] if numbers else {}
    # a resumed run is two Flower runs: the one that died with its SuperLink (stopped) and the one that finished
    completed = numbers is not None and any(r["status"] == "finished:completed" for r in runs)
    row = {"run": name, "completed": completed, "flower-status": statuses, "wall-seconds": round(wall, 1),
           "mae-litres-mean": summary.get("mae-litres-mean", ""), "events": " | ".join(events),
           "superlink": "flower-superlink" if args.flower else "bouquet.superlink", "hogs": args.hog}
    print(f"{name}: {'completed' if completed else 'FAILED'} ({statuses}); {wall:.0f} s; "
          f"MAE {summary.get('mae-litres-mean', float('nan')):.4f}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hog", type=int, default=2, help="busy-looping processes kept running throughout")
    parser.add_argument("--lock-for", type=float, default=25.0, help="seconds the state database stays locked; 0: never")
    parser.add_argument("--lock-after-round", type=int, default=1)
    parser.add_argument("--restart-after-round", type=int, default=0, help="kill and restart the SuperLink then")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--insecure", action="store_true", help="no TLS, no SuperNode authentication")
    parser.add_argument("--flower", action="store_true", help="Flower's own flower-superlink (5 s busy timeout)")
    parser.add_argument("--run-config", default=DEFAULT_CONFIG)
    parser.add_argument("--run-timeout", type=float, default=1800,
                        help="seconds a run may take before it is stopped and counted as failed")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "deploy-soak")
    args = parser.parse_args(argv)
    for key in ("runs", "nodes"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be at least 1")
    if args.hog < 0 or args.lock_for < 0 or args.lock_after_round < 1 or args.restart_after_round < 0:
        parser.error("--hog, --lock-for and --restart-after-round must be >= 0, --lock-after-round >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir = args.out / "deployment"
    results = args.out / "results"
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.hog)]
    rows = []
    try:
        for hog in hogs:
            hog.start()
        with deployment(args.workdir, secure=not args.insecure,
                        state_busy_timeout=None if args.flower else 120.0) as deploy:
            for partition in range(args.nodes):
                private = None
                if deploy.secure:
                    private, public = make_node_key(args.workdir / "keys", f"node{partition}")
                    deploy.register(public)
                start_supernode(deploy, partition, private_key=private)
            online = wait_for_nodes(deploy, args.nodes, timeout=300)
            print(f"deployment: SuperLink {'flower-superlink' if args.flower else 'bouquet.superlink'} on "
                  f"127.0.0.1:{deploy.port} ({'TLS + SuperNode auth' if deploy.secure else 'insecure'}), "
                  f"{online} of {args.nodes} SuperNodes online, {args.hog} hogs", flush=True)
            for index in range(args.runs):
                if (results / f"run{index}" / "summary.json").exists():
                    print(f"run{index}: done before, kept", flush=True)
                    continue
                rows.append(_one(deploy, index, args, results))
                with open(args.out / "runs.csv", "a", newline="") as handle:
                    writer = csv.DictWriter(handle, fieldnames=list(rows[-1]))
                    if handle.tell() == 0:
                        writer.writeheader()
                    writer.writerow(rows[-1])
    finally:
        for hog in hogs:
            hog.terminate()
    found = [_numbers(results / f"run{index}") for index in range(args.runs)]
    done = [n for n in found if n is not None]
    same = all(n == done[0] for n in done)
    print(f"deployment soak: {len(done)} of {args.runs} completed, "
          f"{'identical numbers' if same else 'NUMBERS DIFFER'}", flush=True)
    return 0 if len(done) == args.runs and same else 1


if __name__ == "__main__":
    sys.exit(main())
