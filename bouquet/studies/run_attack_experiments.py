"""Run the attack study: every arm x attack x attacker fraction x seed on one task, resumable.

    python scripts/run_attack_experiments.py --data digits --profile quick --attacks sign-flip,scale,alie \\
        --fractions 0 0.1 0.2 0.3 --seeds 0 1 2
    python scripts/run_attack_experiments.py --data water --arms fedavg,hk-paper,hk-robust --attacks ipm

Tasks (``experiments/attacks/data``): ``digits`` (20 image clients, IID, every client every round) and
``water`` (60 synthetic households, 20 a round).  Arms (``experiments/attacks/arms``): FedAvg, HK as in the
paper, HK with its robust options, and Flower's Krum, MultiKrum, Bulyan, FedMedian and FedTrimmedAvg.  A
fraction of 0 is the arm's run without attackers (one per arm and seed, whatever the attacks).  Layers merge
data < profile < arm < attack < seed.  Every run is a real ``flwr run`` of this app against one private
SuperLink on 127.0.0.1, into ``<out>/<data>-<profile>/<arm>/<attack>-<fraction>/seed-<k>``; a run whose
folder holds ``summary.json`` is skipped.  Table and figures: ``scripts/attack_figures.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bouquet.algorithms.attacks import ATTACKS
from bouquet.experiments import Job, arm_names, layered_run_config, pop_supernodes, run_jobs, study_parser
from bouquet.studies import ROOT

EXPERIMENTS = ROOT / "experiments" / "attacks"


def condition(attack: str, fraction: float) -> str:
    """The folder name of an attack at a fraction (``none-0`` without attackers)."""
    return "none-0" if fraction == 0 else f"{attack}-{fraction:g}"


def job(data: str, profile: str, arm: str, attack: str, fraction: float, seed: int, base: Path) -> Job:
    """One run of ``arm`` under ``attack`` with ``fraction`` attackers (none when 0)."""
    layers = layered_run_config(EXPERIMENTS, [("data", data), ("profiles", profile), ("arms", arm)], ROOT)
    if fraction > 0:
        layers |= {"attack": attack, "attack-fraction": fraction}
    supernodes = pop_supernodes(layers, ROOT)
    name = condition(attack, fraction)
    return Job(f"{arm} {name} seed {seed}", {**layers, "seed": seed}, base / arm / name / f"seed-{seed}", supernodes)


def describe(summary: dict) -> str:
    """The progress line's result: the honest clients' mean error (all clients when nobody attacks)."""
    if summary.get("task") == "vision":
        value = summary.get("accuracy-honest-mean", summary.get("client-accuracy-mean"))
        return f"honest clients' accuracy {100 * value:.2f} %"
    value = summary.get("mae-litres-honest-mean", summary.get("mae-litres-mean"))
    return f"honest households' MAE {value:.2f} L/day"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(__doc__, EXPERIMENTS, data="digits", profile="quick", out="results/attacks")
    parser.add_argument("--attacks", default="sign-flip,scale,alie", help="comma-separated attacks")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    return parser


def plan(args: argparse.Namespace) -> list[Job]:
    """Every run of the study, in order (arm, then condition, then seed); each no-attack run once."""
    arms = arm_names(EXPERIMENTS, args.arms)
    attacks = args.attacks.split(",")
    bad = [a for a in attacks if a not in ATTACKS or a == "none"]
    if bad:
        raise SystemExit(f"unknown attack(s) {', '.join(bad)}; choose among {', '.join(ATTACKS[1:])}")
    if any(not 0 <= f < 1 for f in args.fractions):
        raise SystemExit(f"fractions must be in [0, 1), got {args.fractions}")
    conditions = [("none", 0.0)] if 0 in args.fractions else []
    conditions += [(a, f) for a in attacks for f in sorted(set(args.fractions)) if f > 0]
    base = Path(args.out).resolve() / f"{args.data}-{args.profile}"
    return [job(args.data, args.profile, arm, attack, fraction, seed, base)
            for arm in arms for attack, fraction in conditions for seed in args.seeds]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    jobs = plan(args)
    base = Path(args.out).resolve() / f"{args.data}-{args.profile}"
    print(f"{args.data}: {len(jobs)} runs; {jobs[0].supernodes} SuperNodes; results in {base}", flush=True)
    return 1 if run_jobs(ROOT, jobs, base / ".superlink", describe, ray_address=args.ray_address) else 0


if __name__ == "__main__":
    sys.exit(main())
