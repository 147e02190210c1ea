"""The SCKM paper's evaluation (Sections 4 and 6) from our own runs, in one command.

    python scripts/reproduce_sckm.py                       # CIFAR-10, cpu profile, seeds 0 1 2
    python scripts/reproduce_sckm.py --print               # the steps, without running them

Steps, each an existing script run as its own process (so one step's failure
is named and the next run of this command continues where it stopped):

1. ``run_sckm_experiments.py --study select``: 10 clients, S = 1, 2, 5, B = 2, 3,
   SCKM-Select vs AFL, FedCor, Power-of-Choice, random (90 ``flwr run``s);
2. ``run_sckm_experiments.py --study cluster``: 50 clients, S = 1, 2, B = 2, 4, 6,
   SCKM-Cluster vs k-means, AFL, FedCor, Power-of-Choice (90 runs);
3. and 4. ``sckm_figures.py`` for each study (accuracy curves, Table 5/6
   layouts, C-hat / C*, rounds to target, runs.csv);
5. and 6. ``sckm_probe.py`` at the early rounds (1, 5, 10) and on the longer
   trajectory (rounds 20, 40, more local work) of ``docs/results/sckm.md``.

The study runners skip finished runs; a probe whose ``probe_rank.csv``
exists is skipped.  Each step's wall time goes to ``<out>/reproduce-times.csv``.
Everything is written under ``--out`` (figures in ``<out>/figures``), never
over the committed ``docs/figures``.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bouquet.studies import ROOT

EARLY_PROBE = ["--shards", "1", "2", "5", "--rounds", "1", "5", "10"]
LONG_PROBE = ["--shards", "2", "5", "--rounds", "20", "40", "--local-batches", "20", "--batch-size", "64",
              "--learning-rate", "0.05"]


@dataclass(frozen=True)
class Step:
    """One script run: ``scripts/<script>.py argv``; ``done_when`` names a file whose presence skips it."""

    name: str
    script: str
    argv: list[str]
    done_when: Path | None = None


def plan(data: str, profile: str, seeds: list[int], out: Path, probe: bool = True) -> list[Step]:
    """The steps of the reproduction, in order."""
    seed_args = ["--seeds", *map(str, seeds)]
    steps = []
    for study in ("select", "cluster"):
        steps.append(Step(f"{study} study", "run_sckm_experiments",
                          ["--study", study, "--data", data, "--profile", profile, *seed_args, "--out", str(out)]))
    for study in ("select", "cluster"):
        base = out / f"{study}-{data}-{profile}"
        steps.append(Step(f"{study} figures", "sckm_figures",
                          [str(base), "--out", str(out / "figures" / f"sckm-{base.name}")]))
    if probe:
        for name, folder, extra in (("probe", out / f"probe-{data}", EARLY_PROBE),
                                    ("probe, longer trajectory", out / f"probe-{data}-long", LONG_PROBE)):
            steps.append(Step(name, "sckm_probe", ["--data", data, *extra, *seed_args, "--val-size", "1000",
                                                   "--out", str(folder)], done_when=folder / "probe_rank.csv"))
    return steps


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="cifar10", help="cifar10 (the paper's setting) or digits (offline, small)")
    parser.add_argument("--profile", default="cpu", help="experiments/sckm/profiles/<name>.toml (full: VGG-16, GPU)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "sckm")
    parser.add_argument("--no-probe", action="store_true", help="leave out the Section 4 probe (steps 5-6)")
    parser.add_argument("--print", action="store_true", help="print the steps and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out.resolve()
    steps = plan(args.data, args.profile, args.seeds, out, probe=not args.no_probe)
    if args.print:
        for step in steps:
            print(" ".join([sys.executable, f"scripts/{step.script}.py", *step.argv]))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    times = out / "reproduce-times.csv"
    started_all = time.time()
    for number, step in enumerate(steps, 1):
        if step.done_when is not None and step.done_when.exists():
            print(f"== step {number}/{len(steps)}: {step.name}: done already ({step.done_when})", flush=True)
            continue
        print(f"== step {number}/{len(steps)}: {step.name}", flush=True)
        started = time.time()
        code = subprocess.call([sys.executable, str(ROOT / "scripts" / f"{step.script}.py"), *step.argv], cwd=ROOT)
        seconds = time.time() - started
        new = not times.exists()
        with times.open("a", newline="") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(["step", "seconds", "exit-code", "finished"])
            writer.writerow([step.name, f"{seconds:.0f}", code, time.strftime("%Y-%m-%d %H:%M:%S")])
        if code != 0:
            print(f"step {number} ({step.name}) failed with exit code {code} after {seconds:.0f} s; "
                  "run this command again to continue", file=sys.stderr)
            return code
    print(f"all {len(steps)} steps done in {time.time() - started_all:.0f} s; results and figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
