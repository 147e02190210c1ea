"""Run the SCKM paper's comparison (Section 6): study x setting x arm x seed, resumable, one folder per run.

    python scripts/run_sckm_experiments.py --study select --data cifar10 --profile cpu --seeds 0 1 2
    python scripts/run_sckm_experiments.py --study cluster --data cifar10 --profile cpu --seeds 0 1 2
    python scripts/run_sckm_experiments.py --study select --data digits --profile smoke --settings c10-s2-b2 \
        --arms sckm-select,random --seeds 0

Studies (the paper's two tables):

* ``select``: 10 clients, shards per client S in {1, 2, 5}, budget B in {2, 3}
  (settings ``c10-s<S>-b<B>``); SCKM-Select vs AFL, FedCor, Power-of-Choice,
  random (Table 5, Fig. 4);
* ``cluster``: 50 clients, S in {1, 2}, B in {2, 4, 6} (``c50-s<S>-b<B>``);
  SCKM-Cluster vs k-means, AFL, FedCor, Power-of-Choice (Table 6, Fig. 3, 5);
* ``variants``: the papers' open choices of SCKM-Select, 2 sketch
  sources (``global``: the gradient at the global model; ``update``: every
  candidate trains and selection picks whose updates are averaged) x 2 signs
  (``pos``/``neg``) x 2 layer combinations (``concat``: eq. 8 on all sketched
  coordinates; ``classifier``: the last layer only), against random, FedCor
  as its official code (``fedcor-gp``), Power-of-Choice and AFL; S in {2, 5},
  B = 2; meant for the ``regime`` profile.

Layers are TOML files in ``experiments/sckm/{data,profiles,settings,arms}``,
merged data < profile < setting < arm < seed; a setting's ``num-supernodes``
is the number of simulated clients.  A profile's table named after a study
(``[cluster]``) applies to that study only (the full profile: 60 rounds for
Table 5, 120 for Table 6, as in the paper); ``extends = "<profile>"`` starts
a profile from another one.  Every run is a real ``flwr run`` of this
app (vision task) against one private SuperLink on 127.0.0.1.  Figures and
tables: ``scripts/sckm_figures.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bouquet.experiments import Job, arm_names, layered_run_config, require_data_files, run_jobs, study_parser
from bouquet.studies import ROOT

EXPERIMENTS = ROOT / "experiments" / "sckm"
STUDIES = {
    "select": {"settings": [f"c10-s{s}-b{b}" for s in (1, 2, 5) for b in (2, 3)],
               "arms": ["sckm-select", "afl", "fedcor", "power-of-choice", "random"]},
    "cluster": {"settings": [f"c50-s{s}-b{b}" for s in (1, 2) for b in (2, 4, 6)],
                "arms": ["sckm-cluster", "kmeans", "afl", "fedcor", "power-of-choice"]},
    "variants": {"settings": ["c10-s2-b2", "c10-s5-b2"],
                 "arms": [f"sckm-{source}-{sign}-{combine}" for source in ("global", "update")
                          for sign in ("pos", "neg") for combine in ("concat", "classifier")]
                 + ["random", "fedcor-gp", "power-of-choice", "afl"]},
}


def job(data: str, profile: str, setting: str, arm: str, seed: int, base: Path, study: str) -> Job:
    layers = layered_run_config(EXPERIMENTS, [("data", data), ("profiles", profile), ("settings", setting),
                                              ("arms", arm)], ROOT, study, tuple(STUDIES))
    supernodes = int(layers.pop("num-supernodes"))
    return Job(f"{setting} {arm} seed {seed}", {**layers, "seed": seed}, base / setting / arm / f"seed-{seed}",
               supernodes)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also checked by the one-command reproduction's tests)."""
    parser = study_parser(__doc__, EXPERIMENTS, data="cifar10", profile="cpu", out="results/sckm")
    parser.add_argument("--study", choices=sorted(STUDIES), default="select")
    parser.add_argument("--settings", default="all", help="comma-separated setting names, or 'all' (the study's)")
    parser.add_argument("--gpus-per-client", type=float, default=0.0,
                        help="GPUs each simulated client holds (a profile with vision-device = \"cuda\", e.g. full)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    study = STUDIES[args.study]
    settings = study["settings"] if args.settings == "all" else args.settings.split(",")
    arms = arm_names(EXPERIMENTS, args.arms, study["arms"])
    base = Path(args.out).resolve() / f"{args.study}-{args.data}-{args.profile}"
    jobs = [job(args.data, args.profile, setting, arm, seed, base, args.study)
            for setting in settings for arm in arms for seed in args.seeds]
    require_data_files(jobs[0].run_config)
    print(f"{args.study}: {len(settings)} settings x {len(arms)} arms x {len(args.seeds)} seeds; results in {base}",
          flush=True)

    def describe(summary: dict) -> str:
        text = f"final accuracy {summary['final-accuracy']:.4f}"
        if "c-star" in summary:
            text += f", C* {summary['c-star']}"
        return text

    return 1 if run_jobs(ROOT, jobs, base / ".superlink", describe, ray_address=args.ray_address,
                         gpus_per_client=args.gpus_per_client) else 0


if __name__ == "__main__":
    sys.exit(main())
