"""Scale runs: big simulations of the water app, with wall time and peak memory per process.

    python scripts/scale_run.py                       # every arm below, skipping finished ones
    python scripts/scale_run.py --arms pool-1099 --out results/scale

Arms (synthetic households, every filter off, so the pool is all 1,099 of them, one SuperNode each):

* ``pool-1099``: the default job's method (HK cosine 0.75) for 20 rounds x 100 clients, every node
  evaluated every round;
* ``pool-1099-window``: the same with ``max-in-flight=100`` (at most 100 messages unanswered, so the
  1,099 evaluations of a round go out as replies come back; ``bouquet.transport``);
* ``hk-s1000``: HK cosine 0.75 aggregating S = 1,000 clients a round (3 rounds);
* ``sckm-cluster-s1000``: SCKM-Cluster scoring 1,000 candidates' sketches a round and choosing 100
  (3 rounds).

``--rounds N`` runs every arm for N rounds instead (into ``<out>/<arm>-r<N>``), and when both pool arms
ran, the last line printed is ``window wall ratio: X`` (windowed wall / unwindowed wall) with both
final MAEs, which must be equal (same seed, same numbers).

Each arm is one ``python -m bouquet.launch`` (a private SuperLink and Ray on this machine).  While it runs,
every process below it is read from ``/proc`` once a second: its resident memory now (VmRSS) and its own
peak (VmHWM).  Processes are grouped by what they are (the launcher and ``flwr`` CLI; the SuperLink; the
simulation process, which runs the ServerApp and is Ray's driver; Ray's own daemons; the ClientApp actors).
Per group: the largest single peak, and the peak of the group's summed RSS (sampled; a spike between
samples can be missed).  Writes ``<out>/<arm>/scale.json`` and ``<out>/scale.md``; the run's own folder
is ``<out>/<arm>/<arm>/`` (rounds, summary).  A finished arm (its ``scale.json`` exists) is not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from bouquet import processes
from bouquet.processes import command_line, descendants
from bouquet.results import RunFolder
from bouquet.studies import ROOT

# the paper's forecaster, as when these arms were measured (docs/PERFORMANCE.md); the default job runs the personal one
FILTERS_OFF = 'forecaster="paper" min-history-days=0 active-factor=0'
POOL = f"{FILTERS_OFF} num-server-rounds=20 clients-per-round=100"
ARMS = {
    "pool-1099": POOL,
    "pool-1099-window": f'{POOL} max-in-flight=100',
    "hk-s1000": f'{FILTERS_OFF} num-server-rounds=3 clients-per-round=1000',
    "sckm-cluster-s1000": (f'{FILTERS_OFF} num-server-rounds=3 clients-per-round=100 selection="sckm-cluster" '
                           'candidates-per-round=1000'),
}
GROUPS = ("launcher", "superlink", "simulation", "ray-daemons", "clientapp-actors")


def group_of(command: str) -> str:
    """What a process is, from its command line."""
    if command.startswith("ray::ClientAppActor"):
        return "clientapp-actors"
    if command.startswith("ray::") or any(k in command for k in ("raylet", "gcs_server", "/ray/", "ray.", "ray_")):
        return "ray-daemons"
    if "flower-superlink" in command or "bouquet.superlink" in command:
        return "superlink"
    if "flwr-simulation" in command or "flower-superexec" in command:
        return "simulation"
    return "launcher"


def memory_of(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes; (0, 0) if it is gone or unreadable."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss, hwm


class MemorySampler(threading.Thread):
    """Samples the process tree below ``root`` every ``interval`` seconds until stopped."""

    def __init__(self, root: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.stopped = threading.Event()
        self.peak_single: dict[str, int] = defaultdict(int)
        self.peak_sum: dict[str, int] = defaultdict(int)
        self.peak_total = 0
        self.seen: dict[str, set[int]] = defaultdict(set)

    def run(self) -> None:
        while not self.stopped.is_set():
            sums: dict[str, int] = defaultdict(int)
            for pid in [self.root, *descendants(self.root)]:
                command, (rss, hwm) = command_line(pid).strip(), memory_of(pid)
                if not command:
                    continue  # gone meanwhile
                group = group_of(command)
                self.seen[group].add(pid)
                self.peak_single[group] = max(self.peak_single[group], hwm)
                sums[group] += rss
            for group, total in sums.items():
                self.peak_sum[group] = max(self.peak_sum[group], total)
            self.peak_total = max(self.peak_total, sum(sums.values()))
            self.stopped.wait(self.interval)

    def report(self) -> dict[str, dict[str, float]]:
        mib = 2 ** 20
        return {group: {"processes": len(self.seen[group]), "largest_peak_mib": self.peak_single[group] / mib,
                        "summed_peak_mib": self.peak_sum[group] / mib} for group in GROUPS if self.seen[group]}


def arm_config(arm: str, rounds: int | None) -> str:
    """The arm's run config, with ``num-server-rounds`` replaced when ``rounds`` is given."""
    return ARMS[arm] if rounds is None else re.sub(r"num-server-rounds=\d+", f"num-server-rounds={rounds}", ARMS[arm])


def run_arm(arm: str, out: Path, ray_address: str | None, rounds: int | None = None) -> dict:
    folder = out / arm_folder(arm, rounds)
    folder.mkdir(parents=True, exist_ok=True)
    config = arm_config(arm, rounds)
    run_config = f'{config} results-dir="{folder}" run-name="{arm}"'
    command = [sys.executable, "-m", "bouquet.launch", str(ROOT), "--run-config", run_config]
    if ray_address:
        command += ["--ray-address", ray_address]
    log_path = folder / "launch.log"
    print(f"[{arm}] {' '.join(command[2:])}\n[{arm}] log: {log_path}", flush=True)
    started = time.monotonic()
    process = processes.start(command, log_path, dict(os.environ))  # its own session: stopped as a group
    sampler = MemorySampler(process.pid)
    sampler.start()
    try:
        last = ""
        while process.poll() is None:
            time.sleep(5)
            marks = [line for line in log_path.read_text(errors="replace").splitlines() if "[ROUND " in line]
            if marks and marks[-1] != last:
                last = marks[-1]
                print(f"[{arm}] {time.monotonic() - started:7.0f} s  {last.split('INFO')[-1].strip(' :')}",
                      flush=True)
    except KeyboardInterrupt:
        processes.stop(process)
        raise
    finally:
        sampler.stopped.set()
        sampler.join()
    wall = time.monotonic() - started
    run = RunFolder(folder / arm)
    if process.returncode != 0 or not run.finished:
        raise SystemExit(f"[{arm}] failed (exit code {process.returncode}); see {log_path}")
    summary = run.summary()
    result = {"arm": arm_folder(arm, rounds), "run_config": config, "wall_s": wall, "memory": sampler.report(),
              "peak_total_mib": sampler.peak_total / 2 ** 20, "mae_litres": summary.get("mae-litres-mean"),
              "clients_evaluated": summary.get("clients-evaluated"), "rounds": summary.get("rounds"),
              "train_phases": len(run.rounds("train"))}
    (folder / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def arm_folder(arm: str, rounds: int | None) -> str:
    return arm if rounds is None else f"{arm}-r{rounds}"


def table(results: list[dict]) -> str:
    lines = ["| arm | wall (s) | MAE (L/day) | clients evaluated | peak RSS, all (MiB) | "
             + " | ".join(f"{g}: largest / summed (MiB)" for g in GROUPS) + " |",
             "|---|--:|--:|--:|--:|" + "--:|" * len(GROUPS)]
    for r in results:
        cells = []
        for group in GROUPS:
            m = r["memory"].get(group)
            cells.append(f"{m['largest_peak_mib']:.0f} / {m['summed_peak_mib']:.0f} ({m['processes']})" if m else "-")
        lines.append(f"| {r['arm']} | {r['wall_s']:.0f} | {r['mae_litres']:.1f} | {r['clients_evaluated']} | "
                     f"{r['peak_total_mib']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--out", default="results/scale")
    parser.add_argument("--ray-address", default=None, help="run on this existing Ray cluster (head:port)")
    parser.add_argument("--rounds", type=int, default=None, help="run every arm for this many rounds instead")
    args = parser.parse_args()
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    out = Path(args.out).resolve()
    results = []
    for arm in arms:
        done = out / arm_folder(arm, args.rounds) / "scale.json"
        if done.exists():
            print(f"[{arm}] already done: {done}", flush=True)
            results.append(json.loads(done.read_text()))
            continue
        results.append(run_arm(arm, out, args.ray_address, args.rounds))
        print(f"[{arm}] wall {results[-1]['wall_s']:.0f} s, peak RSS of the whole tree "
              f"{results[-1]['peak_total_mib']:.0f} MiB", flush=True)
    text = table(results)
    (out / "scale.md").write_text(text + "\n")
    print(text)
    by_arm = {r["arm"]: r for r in results}
    plain, windowed = (by_arm.get(arm_folder(a, args.rounds)) for a in ("pool-1099", "pool-1099-window"))
    if plain and windowed:
        same = "equal" if plain["mae_litres"] == windowed["mae_litres"] else "DIFFERENT"
        print(f"final MAE {plain['mae_litres']!r} without the window, {windowed['mae_litres']!r} with it ({same})")
        print(f"window wall ratio: {windowed['wall_s'] / plain['wall_s']:.3f}")


if __name__ == "__main__":
    main()
