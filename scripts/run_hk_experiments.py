"""Run the HK paper's comparison (Section 6): every arm x seed, resumable, one results folder per run.

    python scripts/run_hk_experiments.py --data daiad --profile quick --seeds 0 1 2
    python scripts/run_hk_experiments.py --data synthetic --profile paper --arms fedavg,hk-cosine-0.75

Arms are ``experiments/hk/arms/*.toml``, profiles ``experiments/hk/profiles/*.toml``
and datasets ``experiments/hk/data/*.toml``; each is a set of run-config keys,
layered data < profile < arm < seed.  Every run is a real ``flwr run`` of this
app in simulation, against one private SuperLink on 127.0.0.1 (started and
stopped here), with one SuperNode per household of the pool.  A run whose
folder holds ``summary.json`` is skipped; an unfinished folder is removed and
run again.  Figures and tables: ``scripts/hk_figures.py``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import tomllib
from pathlib import Path

from bouquet.launch import local_superlink, pool_size

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments" / "hk"


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def load_layer(kind: str, name: str) -> dict:
    path = EXPERIMENTS / kind / f"{name}.toml"
    if not path.exists():
        known = sorted(p.stem for p in (EXPERIMENTS / kind).glob("*.toml"))
        raise SystemExit(f"unknown {kind[:-1] if kind.endswith('s') else kind} {name!r}; known: {', '.join(known)}")
    return tomllib.loads(path.read_text())


def run_config(data: str, profile: str, arm: str, seed: int, folder: Path) -> dict:
    layers = {**load_layer("data", data), **load_layer("profiles", profile), **load_layer("arms", arm)}
    if layers.get("data-path"):
        layers["data-path"] = str((ROOT / layers["data-path"]).resolve())
    layers.update({"seed": seed, "results-dir": str(folder.parent), "run-name": folder.name})
    return layers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="daiad", help="experiments/hk/data/<name>.toml")
    parser.add_argument("--profile", default="quick", help="experiments/hk/profiles/<name>.toml")
    parser.add_argument("--arms", default="all", help="comma-separated arm names, or 'all'")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="results/hk")
    parser.add_argument("--supernodes", type=int, default=None,
                        help="SuperNodes (the first N households of the pool); default: the whole pool")
    args = parser.parse_args(argv)

    arms = sorted(p.stem for p in (EXPERIMENTS / "arms").glob("*.toml")) if args.arms == "all" \
        else args.arms.split(",")
    for arm in arms:
        load_layer("arms", arm)
    base = Path(args.out).resolve() / f"{args.data}-{args.profile}"
    jobs = [(arm, seed, base / arm / f"seed-{seed}") for arm in arms for seed in args.seeds]
    data_layer = run_config(args.data, args.profile, arms[0], 0, base / "x")
    data_path = data_layer.get("data-path")
    if data_layer.get("data-source") == "daiad" and not Path(data_path).exists():
        raise SystemExit(f"DAIAD data file not found: {data_path}")
    overrides = " ".join(f"{k}={toml_value(v)}" for k, v in data_layer.items()
                         if k not in ("seed", "results-dir", "run-name", "strategy"))
    supernodes = pool_size(ROOT, overrides) if args.supernodes is None else args.supernodes
    todo = [job for job in jobs if not (job[2] / "summary.json").exists()]
    print(f"{len(jobs)} runs ({len(arms)} arms x {len(args.seeds)} seeds), {len(jobs) - len(todo)} already done; "
          f"{supernodes} SuperNodes; results in {base}", flush=True)
    failures = 0
    started_all = time.time()
    with local_superlink(base / ".superlink") as link:
        for index, (arm, seed, folder) in enumerate(todo, start=1):
            if folder.exists():
                shutil.rmtree(folder)  # an interrupted run: start it again
            folder.parent.mkdir(parents=True, exist_ok=True)
            config_file = folder.parent / f"seed-{seed}.run-config.toml"
            config_file.write_text("".join(f"{k} = {toml_value(v)}\n"
                                           for k, v in run_config(args.data, args.profile, arm, seed, folder).items()))
            started = time.time()
            print(f"[{index}/{len(todo)}] {arm} seed {seed} ...", end=" ", flush=True)
            done = link.flwr_run(ROOT, run_config=str(config_file),
                                 federation_config=f"num-supernodes={supernodes} client-resources-num-cpus=1",
                                 timeout=None)
            (folder.parent / f"seed-{seed}.log").write_text(done.stdout + done.stderr)
            summary_path = folder / "summary.json"
            if done.returncode != 0 or not summary_path.exists():
                failures += 1
                print(f"FAILED (exit {done.returncode}; log {folder.parent / f'seed-{seed}.log'})", flush=True)
                continue
            summary = json.loads(summary_path.read_text())
            print(f"done in {time.time() - started:.0f} s: MAE {summary['mae-litres-mean']:.2f} "
                  f"+- {summary['mae-litres-std']:.2f} L/day", flush=True)
    print(f"finished in {time.time() - started_all:.0f} s; {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
