"""Run the HK paper's comparison (Section 6): every arm x seed, resumable, one results folder per run.

    python scripts/run_hk_experiments.py --data daiad --profile quick --seeds 0 1 2
    python scripts/run_hk_experiments.py --data synthetic --profile paper --arms fedavg,hk-cosine-0.75

Arms are ``experiments/hk/arms/*.toml``, profiles ``experiments/hk/profiles/*.toml``,
datasets ``experiments/hk/data/*.toml`` and forecasters ``experiments/hk/forecasters/*.toml``
(``--forecaster``, default ``paper``; another one's results go to ``<data>-<profile>-<forecaster>``);
each is a set of run-config keys, layered data < profile < forecaster < arm < seed.  Every run is a real ``flwr run`` of this
app in simulation, against one private SuperLink on 127.0.0.1 (started and
stopped here), with one SuperNode per household of the pool.  A run whose
folder holds ``summary.json`` is skipped; an interrupted one goes on from its
last checkpoint (``resume-from``: the same numbers as an uninterrupted run), or
is removed and run again when no checkpoint fits (another config or bouquet
version).  Figures and tables: ``scripts/hk_figures.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bouquet.experiments import (
    Job,
    arm_names,
    layered_run_config,
    load_layer,
    require_data_files,
    run_jobs,
    study_parser,
    toml_value,
)
from bouquet.launch import pool_size
from bouquet.studies import ROOT

EXPERIMENTS = ROOT / "experiments" / "hk"


def run_config(data: str, profile: str, arm: str, seed: int, forecaster: str = "paper") -> dict:
    layers = layered_run_config(EXPERIMENTS, [("data", data), ("profiles", profile), ("forecasters", forecaster),
                                              ("arms", arm)], ROOT)
    return {**layers, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__, EXPERIMENTS, data="daiad", profile="quick", out="results/hk")
    parser.add_argument("--forecaster", default="paper", help="experiments/hk/forecasters/<name>.toml")
    parser.add_argument("--supernodes", type=int, default=None,
                        help="SuperNodes (the first N households of the pool); default: the whole pool")
    args = parser.parse_args(argv)

    arms = arm_names(EXPERIMENTS, args.arms)
    load_layer(EXPERIMENTS, "forecasters", args.forecaster)
    suffix = "" if args.forecaster == "paper" else f"-{args.forecaster}"
    base = Path(args.out).resolve() / f"{args.data}-{args.profile}{suffix}"
    data_layer = run_config(args.data, args.profile, arms[0], 0, args.forecaster)
    require_data_files(data_layer)
    overrides = " ".join(f"{k}={toml_value(v)}" for k, v in data_layer.items() if k not in ("seed", "strategy"))
    supernodes = pool_size(ROOT, overrides) if args.supernodes is None else args.supernodes
    jobs = [Job(f"{arm} seed {seed}", run_config(args.data, args.profile, arm, seed, args.forecaster),
                base / arm / f"seed-{seed}", supernodes) for arm in arms for seed in args.seeds]
    print(f"{len(arms)} arms x {len(args.seeds)} seeds; {supernodes} SuperNodes; results in {base}", flush=True)
    failures = run_jobs(ROOT, jobs, base / ".superlink",
                        lambda s: f"MAE {s['mae-litres-mean']:.2f} +- {s['mae-litres-std']:.2f} L/day",
                        ray_address=args.ray_address)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
