"""Run the known-groups study: every arm x seed on one benchmark, resumable, one folder per run.

    python scripts/run_groups_experiments.py --data digits-rotate --profile quick --seeds 0 1 2
    python scripts/run_groups_experiments.py --data water-types --profile quick --arms fedavg,ifca,local
    python scripts/run_groups_experiments.py --data daiad --profile quick --arms fedavg,hk-shared,local

Benchmarks (``experiments/groups/data``): ``digits-rotate`` and ``digits-permute`` (four groups of clients,
images rotated by 0/90/180/270 degrees or labels permuted), ``cifar10-rotate``, ``water-types`` (60
synthetic households of three known types) and ``daiad`` (the real file; no ground truth).  Arms
(``experiments/groups/arms``): FedAvg, HK shared (the paper's eq. 16), HK personal on the weights and on the
updates over a tau grid, fixed-K personal and IFCA told the true K, CFL with its paper's thresholds, and
local training.  Layers merge data < profile < arm < seed; the seed is both ``seed`` and ``data-seed`` (another
seed draws other data: the image split and partition, which clients share a group, the label permutations, the
synthetic household pool); a data layer's ``num-supernodes`` is the number of simulated clients (water: the
households of the pool).  Every run is a real ``flwr run`` of this app against
one private SuperLink on 127.0.0.1; a run whose folder holds ``summary.json`` is skipped.  Figures and the
table: ``scripts/groups_figures.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bouquet.experiments import (
    Job,
    arm_names,
    layered_run_config,
    pop_supernodes,
    require_data_files,
    run_jobs,
    study_parser,
)
from bouquet.studies import ROOT

EXPERIMENTS = ROOT / "experiments" / "groups"


def job(data: str, profile: str, arm: str, seed: int, base: Path) -> Job:
    """One (arm, seed) run of the benchmark ``data`` under ``profile``."""
    layers = layered_run_config(EXPERIMENTS, [("data", data), ("profiles", profile), ("arms", arm)], ROOT)
    supernodes = pop_supernodes(layers, ROOT)
    return Job(f"{arm} seed {seed}", {**layers, "seed": seed, "data-seed": seed}, base / arm / f"seed-{seed}",
               supernodes)


def describe(summary: dict) -> str:
    """The progress line's result: the mean per-client error with the served model."""
    if summary.get("task") == "vision":
        return (f"client accuracy {100 * summary['client-accuracy-mean']:.2f} "
                f"+- {100 * summary['client-accuracy-std']:.2f} %")
    return f"MAE {summary['mae-litres-mean']:.2f} +- {summary['mae-litres-std']:.2f} L/day"


def build_parser() -> argparse.ArgumentParser:
    return study_parser(__doc__, EXPERIMENTS, data="digits-rotate", profile="quick", out="results/groups")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    arms = arm_names(EXPERIMENTS, args.arms)
    base = Path(args.out).resolve() / f"{args.data}-{args.profile}"
    require_data_files(layered_run_config(EXPERIMENTS, [("data", args.data)], ROOT))
    jobs = [job(args.data, args.profile, arm, seed, base) for arm in arms for seed in args.seeds]
    print(f"{args.data}: {len(arms)} arms x {len(args.seeds)} seeds; {jobs[0].supernodes} SuperNodes; "
          f"results in {base}", flush=True)
    return 1 if run_jobs(ROOT, jobs, base / ".superlink", describe, ray_address=args.ray_address) else 0


if __name__ == "__main__":
    sys.exit(main())
