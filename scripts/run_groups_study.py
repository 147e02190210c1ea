"""The confirmatory groups study: the memory form chosen on validation, then the test images scored once.

    python scripts/run_groups_study.py                        # tuning only (test images locked), then the choice
    python scripts/run_groups_study.py --final                # + the confirmatory runs and their tables
    python scripts/run_groups_study.py --design experiments/groups/studies/confirm.toml --benchmarks digits-rotate-8

The design (``experiments/groups/studies/<name>.toml``, :class:`bouquet.analysis.groups_study.StudyDesign`) is
written and committed before the confirmatory runs: benchmarks, candidates, references, tuning and
confirmatory data seeds (disjoint), the ARI rounds and the comparisons.  Every run merges data < profile < arm
layers of ``experiments/groups``, with ``seed`` and ``data-seed`` both the study seed (a data seed redraws the
image split, the partition, which clients share a group and the label permutations), ``clients-per-round``
half of the clients, and, in tuning, ``score-test = false`` (no client reads a test image).

1. *Tuning* (``<out>/<name>/tuning/<benchmark>/<candidate>/seed-<s>``): every candidate on every benchmark and
   tuning seed; the clients' mean validation error over the rounds, averaged over benchmarks and seeds, chooses
   one form (``choices.csv``, per benchmark ``validation.md``; :func:`bouquet.tuning.choose_on_validation`).
2. *Confirmatory* (``--final``; ``final/<benchmark>/<arm>/seed-<s>``): the chosen form and the references on
   every confirmatory seed, scored on the test images each round; each pass appends its commit and time to
   ``test-log.jsonl``.  ``table.md`` / ``table.csv``, ``comparisons.md`` / ``.csv``, ``runs.csv`` (per
   benchmark, arm, seed and round: error, ARI, K) and ``curves.png`` are written to ``<out>/<name>`` and,
   with ``--docs``, copied there.

Every run is a real ``flwr run`` against one private SuperLink on 127.0.0.1, resumable (a run whose folder
holds ``summary.json`` is skipped).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from bouquet.analysis.groups_study import StudyDesign, run_curve, study_table, validation_frame
from bouquet.experiments import Job, layered_run_config, pop_supernodes, run_jobs, source_commit
from bouquet.results import RunFolder, markdown_table
from bouquet.tuning import choose_on_validation

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments" / "groups"


def job(design: StudyDesign, benchmark: str, arm: str, seed: int, folder: Path, locked: bool) -> Job:
    """One run of ``arm`` on ``benchmark`` with data seed ``seed`` (test images locked in tuning)."""
    layers = layered_run_config(EXPERIMENTS, [("data", benchmark), ("profiles", design.profile), ("arms", arm)], ROOT)
    supernodes = pop_supernodes(layers, ROOT)
    if layers.get("vision-num-groups", 1) > supernodes:
        raise SystemExit(f"{benchmark}: vision-num-groups = {layers['vision-num-groups']} needs at least as many "
                         f"clients, num-supernodes = {supernodes}")
    config = {**layers, "seed": seed, "data-seed": seed, "clients-per-round": max(1, supernodes // 2)}
    if locked:
        config["score-test"] = False
    return Job(f"{benchmark} {arm} seed {seed}{' (validation)' if locked else ''}", config, folder, supernodes)


def describe(summary: dict[str, Any]) -> str:
    for key, what in (("client-accuracy-mean", "test"), ("client-val-accuracy-mean", "validation")):
        if summary.get(key) is not None:
            return f"clients' {what} accuracy {100 * summary[key]:.2f} %"
    return "no accuracy"


def plot_curves(runs: pd.DataFrame, chosen: str, path: Path) -> None:
    """Mean test error and ARI per round (over the data seeds), one column per benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks = list(dict.fromkeys(runs["benchmark"]))
    colours = {arm: f"C{i}" for i, arm in enumerate(dict.fromkeys(runs["arm"]))}  # one colour an arm, both rows
    fig, axes = plt.subplots(2, len(benchmarks), figsize=(4.2 * len(benchmarks), 6.5), sharex=True, squeeze=False)
    for column, benchmark in enumerate(benchmarks):
        here = runs[runs["benchmark"] == benchmark]
        for arm, group in here.groupby("arm", sort=False):
            label = f"{arm} (chosen)" if arm == chosen else arm
            mean = group.groupby("round")[["error", "ari"]].mean()
            axes[0, column].plot(mean.index, mean["error"], label=label, color=colours[arm])
            if mean["ari"].notna().any():
                low = group.groupby("round")["ari"].min()
                axes[1, column].plot(mean.index, mean["ari"], label=label, color=colours[arm])
                axes[1, column].fill_between(low.index, low, mean["ari"], alpha=0.2, color=colours[arm])
        axes[0, column].set_title(benchmark)
        axes[0, column].set_ylabel("test error (%), mean of seeds")
        axes[1, column].set_ylabel("ARI (line: mean; band: lowest seed)")
        axes[1, column].axhline(0.9, color="grey", lw=0.8, ls=":")
        axes[1, column].set_xlabel("round")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--design", default=str(EXPERIMENTS / "studies" / "confirm.toml"))
    parser.add_argument("--benchmarks", default="all", help="comma-separated data layers of the design, or 'all'")
    parser.add_argument("--final", action="store_true", help="after the choice, run and score the test images")
    parser.add_argument("--out", default="results/groups-study")
    parser.add_argument("--docs", default=None, help="copy the tables and the design here")
    parser.add_argument("--ray-address", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    design_path = Path(args.design)
    design = StudyDesign.load(design_path)
    benchmarks = list(design.benchmarks) if args.benchmarks == "all" else args.benchmarks.split(",")
    unknown = sorted(set(benchmarks) - set(design.benchmarks))
    if unknown:
        raise SystemExit(f"benchmarks {unknown} are not in the design {design_path} ({list(design.benchmarks)})")
    out = Path(args.out).resolve() / design_path.stem
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(design_path, out / "design.toml")

    tuning = {(b, c, s): out / "tuning" / b / c / f"seed-{s}"
              for b in design.benchmarks for c in design.candidates for s in design.tune_seeds}
    jobs = [job(design, b, c, s, folder, locked=True) for (b, c, s), folder in tuning.items() if b in benchmarks]
    print(f"tuning: {len(design.candidates)} candidates x {len(benchmarks)} benchmarks x {len(design.tune_seeds)} "
          f"seeds; test images locked", flush=True)
    if run_jobs(ROOT, jobs, out / ".superlink", describe, ray_address=args.ray_address):
        return 1
    missing = [key for key, folder in tuning.items() if not RunFolder(folder).finished]
    if missing:
        print(f"the choice waits for {len(missing)} tuning runs (every benchmark of the design): "
              f"{missing[:3]} ...", flush=True)
        return 0
    curves = {key: run_curve(RunFolder(folder), "val-accuracy") for key, folder in tuning.items()}
    frame = validation_frame(curves)
    choices = choose_on_validation(frame, "val-error")
    choices.to_csv(out / "choices.csv", index=False)
    per_benchmark = frame.assign(benchmark=frame["seed"].str.split(":").str[0]).pivot_table(
        index="candidate", columns="benchmark", values="val-error", sort=False)[list(design.benchmarks)]
    (out / "validation.md").write_text(markdown_table(per_benchmark.round(2).reset_index()) + "\n")
    chosen = str(choices.loc[choices["chosen"], "candidate"].iloc[0])
    print(markdown_table(choices), f"\nchosen on validation: {chosen}", sep="\n", flush=True)
    if not args.final:
        return 0

    arms = [chosen, *design.references]
    final = {(b, a, s): out / "final" / b / a / f"seed-{s}" for b in benchmarks for a in arms for s in design.seeds}
    with open(out / "test-log.jsonl", "a") as log:
        log.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **source_commit(ROOT), "chosen": chosen,
                              "benchmarks": benchmarks, "seeds": list(design.seeds)}) + "\n")
    jobs = [job(design, b, a, s, folder, locked=False) for (b, a, s), folder in final.items()]
    if run_jobs(ROOT, jobs, out / ".superlink", describe, ray_address=args.ray_address):
        return 1
    curves = {key: run_curve(RunFolder(folder), "accuracy") for key, folder in final.items()}
    table, comparisons = study_table(curves, design, chosen)
    runs = pd.concat([curve.assign(benchmark=b, arm=a, seed=s) for (b, a, s), curve in curves.items()])
    runs.to_csv(out / "runs.csv", index=False, float_format="%.4f")
    table.to_csv(out / "table.csv", index=False)
    comparisons.to_csv(out / "comparisons.csv", index=False)
    (out / "table.md").write_text(markdown_table(table) + "\n")
    (out / "comparisons.md").write_text(markdown_table(comparisons) + "\n")
    plot_curves(runs, chosen, out / "curves.png")
    print(markdown_table(table), markdown_table(comparisons), sep="\n\n", flush=True)
    if args.docs:
        docs = Path(args.docs)
        docs.mkdir(parents=True, exist_ok=True)
        for name in ("design.toml", "choices.csv", "validation.md", "runs.csv", "table.csv", "table.md", "comparisons.csv",
                     "comparisons.md", "test-log.jsonl", "curves.png"):
            shutil.copyfile(out / name, docs / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
