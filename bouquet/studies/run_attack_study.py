"""The attack study under the protocol: each defence's setting chosen on validation, then the test images scored once.

    python scripts/run_attack_study.py                   # tuning only (test images locked), then the choices
    python scripts/run_attack_study.py --final           # + the confirmatory runs and their tables
    python scripts/run_attack_study.py --final --docs docs/figures/attack-study

The design (``experiments/attacks/studies/<name>.toml``, :class:`bouquet.analysis.attack_study.AttackStudyDesign`)
is written and committed before the confirmatory runs.  Every run merges the data < profile < arm layers of
``experiments/attacks``, the design's keys and the candidate's, with ``seed`` and ``data-seed`` both the study
seed (a data seed redraws the image split, the partition, the attackers and the initial model).

1. *Tuning* (``<out>/<name>/tuning/<candidate>/<condition>/seed-<s>``): every candidate of every tuned arm under
   every tuning condition and seed, with ``score-test = false`` (no client reads a test image).  Per arm, the
   candidate with the lowest honest validation error at the last round, averaged over conditions and seeds, is
   chosen (``choices.csv``).
2. *Confirmatory* (``--final``; ``final/<arm>/<condition>/seed-<s>``): each arm with its chosen setting under
   no attack and every attacked condition, condition by condition in the design's order, on every confirmatory
   seed, scored on the test images; each
   pass appends its commit and time to ``test-log.jsonl``.  ``table.md`` / ``table.csv`` (ByzFL style: an arm a
   row, an attack a column), ``comparisons.md`` / ``.csv``, ``runs.csv`` (every run: its honest error, the
   attackers' share of the model, the screen's catches) and ``defences.md`` (those facts per arm and condition).

Every run is a real ``flwr run`` against one private SuperLink on 127.0.0.1, resumable (a run whose folder
holds ``summary.json`` is skipped).  A follow-up design with ``runs-from = "<study>"`` links that study's
finished confirmatory runs of the same run config (:func:`link_earlier_runs`) instead of rerunning them.
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

from bouquet.analysis.attack_study import (
    METRICS,
    AttackStudyDesign,
    attack_table,
    comparisons,
    condition_name,
    honest_error,
    run_facts,
    tuning_frame,
)
from bouquet.experiments import Job, layered_run_config, pop_supernodes, run_jobs, source_commit
from bouquet.results import RunFolder, markdown_table
from bouquet.studies import ROOT
from bouquet.tuning import Candidate, choose_on_validation

EXPERIMENTS = ROOT / "experiments" / "attacks"


def job(design: AttackStudyDesign, candidate: Candidate, attack: str, fraction: float, seed: int, folder: Path,
        locked: bool) -> Job:
    """One run of ``candidate`` under ``attack`` at ``fraction`` (none at 0), test images locked in tuning."""
    layer = design.arm(candidate.arm).layer
    layers = layered_run_config(EXPERIMENTS, [("data", design.data), ("profiles", design.profile), ("arms", layer)],
                                ROOT)
    supernodes = pop_supernodes(layers, ROOT)
    config = {**layers, **design.keys, **candidate.run_config, "seed": seed, "data-seed": seed}
    if fraction > 0:
        config |= {"attack": attack, "attack-fraction": fraction}
    if locked:
        config["score-test"] = False
    label = f"{candidate.name} {condition_name(attack, fraction)} seed {seed}{' (validation)' if locked else ''}"
    return Job(label, config, folder, supernodes)


def describe(summary: dict[str, Any]) -> str:
    for key, what in (("accuracy-honest-mean", "honest test"), ("client-accuracy-mean", "test"),
                      ("client-val-accuracy-mean", "validation")):
        if summary.get(key) is not None:
            return f"clients' {what} accuracy {100 * summary[key]:.2f} %"
    for key, what in (("mae-litres-honest-mean", "honest test"), ("mae-litres-mean", "test"),
                      ("val-mae-litres-mean", "validation")):
        if summary.get(key) is not None:
            return f"households' {what} MAE {summary[key]:.2f} L/day"
    return "finished"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--design", default=str(EXPERIMENTS / "studies" / "protocol.toml"))
    parser.add_argument("--final", action="store_true", help="after the choice, run and score the test images")
    parser.add_argument("--out", default="results/attack-study")
    parser.add_argument("--docs", default=None, help="copy the tables and the design here")
    parser.add_argument("--report-only", action="store_true",
                        help="with --final: write the tables from the confirmatory runs already finished, start none "
                             "(a study stopped early reports its whole conditions; the others are left out)")
    parser.add_argument("--ray-address", default=None)
    return parser


def tune(design: AttackStudyDesign, out: Path, ray_address: str | None) -> dict[str, Candidate] | None:
    """Run the tuning and choose; the chosen candidate of every arm, or None while tuning runs are missing."""
    candidates = {c.name: c for arm in design.arms if arm.grid for c in arm.candidates()}
    runs = {(name, a, f, s): out / "tuning" / name / condition_name(a, f) / f"seed-{s}"
            for name in candidates for a, f in design.tune_conditions for s in design.tune_seeds}
    print(f"tuning: {len(runs)} runs ({sum(1 for a in design.arms if a.grid)} tuned arms, "
          f"{len(design.tune_conditions)} conditions, {len(design.tune_seeds)} seeds); test images locked", flush=True)
    jobs = [job(design, candidates[n], a, f, s, folder, locked=True) for (n, a, f, s), folder in runs.items()]
    if run_jobs(ROOT, jobs, out / ".superlink", describe, ray_address=ray_address):
        return None
    missing = [folder for folder in runs.values() if not RunFolder(folder).finished]
    if missing:
        print(f"the choice waits for {len(missing)} tuning runs: {missing[:3]} ...", flush=True)
        return None
    metric = METRICS[design.metric]
    errors = {(candidates[n].arm, n, condition_name(a, f), s):
              honest_error(RunFolder(folder), metric.validation, metric.accuracy, metric.table)
              for (n, a, f, s), folder in runs.items()}
    chosen: dict[str, Candidate] = {arm.name: arm.candidates()[0] for arm in design.arms if not arm.grid}
    if errors:
        choices = choose_on_validation(tuning_frame(errors), "val-error")
        choices.to_csv(out / "choices.csv", index=False)
        (out / "validation.md").write_text(markdown_table(choices) + "\n")
        print(markdown_table(choices), flush=True)
        for arm in design.arms:
            if arm.grid:
                name = str(choices.loc[choices["chosen"] & (choices["arm"] == arm.name), "candidate"].iloc[0])
                chosen[arm.name] = next(c for c in arm.candidates() if c.name == name)
    return chosen


def link_earlier_runs(design: AttackStudyDesign, chosen: dict[str, Candidate], final: dict[tuple, Path],
                      out: Path) -> int:
    """Link into ``final`` each finished confirmatory run of the study ``design.runs_from`` (its design as it
    ran, ``<results>/<runs-from>/design.toml``) whose run config equals this design's run of an untuned arm
    (same data, profile, keys, candidate, attack and seed: the same numbers); returns how many were linked."""
    earlier = out.parent / design.runs_from
    other = AttackStudyDesign.load(earlier / "design.toml")
    names = {arm.name for arm in other.arms}
    linked = 0
    for (arm, a, f, s), folder in final.items():
        source = earlier / "final" / arm / condition_name(a, f) / f"seed-{s}"
        if design.arm(arm).grid or arm not in names or folder.exists() or not RunFolder(source).finished:
            continue
        mine = job(design, chosen[arm], a, f, s, folder, locked=False).run_config
        if any(job(other, candidate, a, f, s, source, locked=False).run_config == mine
               for candidate in other.arm(arm).candidates()):
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.symlink_to(source, target_is_directory=True)
            linked += 1
    return linked


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    design_path = Path(args.design)
    design = AttackStudyDesign.load(design_path)
    out = Path(args.out).resolve() / design_path.stem
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(design_path, out / "design.toml")
    chosen = tune(design, out, args.ray_address)
    if chosen is None:
        return 1
    print("chosen on validation: " + ", ".join(c.name for c in chosen.values()), flush=True)
    if not args.final:
        return 0

    order = [arm.name for arm in design.arms]
    # condition by condition (every arm, every seed), in the design's order: an interrupted study has whole
    # conditions, the first ones of the design
    final = {(arm, a, f, s): out / "final" / arm / condition_name(a, f) / f"seed-{s}"
             for a, f in design.conditions() for arm in order if (a, f) in design.conditions_of(arm)
             for s in design.seeds}
    if not args.report_only:
        if design.runs_from:
            print(f"linked {link_earlier_runs(design, chosen, final, out)} finished runs of the study "
                  f"{design.runs_from!r} (the same run config and seed), not rerun", flush=True)
        with open(out / "test-log.jsonl", "a") as log:
            log.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **source_commit(ROOT),
                                  "chosen": {a: c.name for a, c in chosen.items()},
                                  "seeds": list(design.seeds)}) + "\n")
    print(f"confirmatory: {len(final)} runs, scored on the test images", flush=True)
    jobs = [job(design, chosen[arm], a, f, s, folder, locked=False) for (arm, a, f, s), folder in final.items()]
    failed = 0 if args.report_only else run_jobs(ROOT, jobs, out / ".superlink", describe,
                                                   ray_address=args.ray_address)
    finished = {key: RunFolder(folder) for key, folder in final.items() if RunFolder(folder).finished}
    metric = METRICS[design.metric]
    errors = {(arm, condition_name(a, f), s): honest_error(run, metric.test, metric.accuracy, metric.table)
              for (arm, a, f, s), run in finished.items()}
    runs = pd.DataFrame([{"arm": arm, "condition": condition_name(a, f), "seed": s,
                          "error": errors[(arm, condition_name(a, f), s)], **run_facts(run)}
                         for (arm, a, f, s), run in finished.items()])
    runs.to_csv(out / "runs.csv", index=False, float_format="%.4f")
    if not runs.empty:  # what each defence did: the attackers' share of the model, the screen's catches
        facts = runs[runs["condition"] != condition_name("none", 0.0)].groupby(["arm", "condition"], sort=False)[
            ["share", "attackers-out", "honest-out"]].mean().reset_index()
        (out / "defences.md").write_text(markdown_table(facts.round(3)) + "\n")
    table = attack_table(errors, design, order)
    table.to_csv(out / "table.csv", index=False, float_format="%.4f")
    wide = _wide(table, design, chosen)
    (out / "table.md").write_text(markdown_table(wide) + "\n")
    compared = comparisons(errors, design)
    compared.to_csv(out / "comparisons.csv", index=False, float_format="%.4f")
    compared_md = (markdown_table(compared.round(2)) if not compared.empty
                   else "no attacked condition has every seed of robust HK and the oracle yet")
    (out / "comparisons.md").write_text(compared_md + "\n")
    print(markdown_table(wide), compared_md, sep="\n\n", flush=True)
    if args.docs:
        docs = Path(args.docs)
        docs.mkdir(parents=True, exist_ok=True)
        for name in ("design.toml", "choices.csv", "validation.md", "runs.csv", "table.csv", "table.md",
                     "comparisons.csv", "comparisons.md", "defences.md", "test-log.jsonl"):
            if (out / name).exists():
                shutil.copyfile(out / name, docs / name)
    return 1 if failed else 0


def _wide(table: pd.DataFrame, design: AttackStudyDesign, chosen: dict[str, Candidate]) -> pd.DataFrame:
    """The ByzFL-style table: an arm (with its chosen setting) a row, a condition a column, each cell the mean
    honest test error with, in brackets, its paired difference to the oracle +- the 95 % half-width."""
    if table.empty:
        return table
    cell = table.apply(lambda r: f"{r['error']:.2f} ({r['vs-oracle']:+.2f} ± {r['vs-oracle-half']:.2f})"
                       if r["arm"] != design.oracle else f"{r['error']:.2f}", axis=1)
    frame = table.assign(cell=cell, condition=[condition_name(a, f) for a, f in zip(table["attack"],
                                                                                   table["fraction"])])
    wide = frame.pivot(index="arm", columns="condition", values="cell")
    ran = set(frame.loc[frame["arm"] != design.oracle, "condition"])  # not a column the oracle alone stands in
    columns = [condition_name(a, f) for a, f in design.conditions() if condition_name(a, f) in ran]
    rows = [arm.name for arm in design.arms if arm.name in wide.index]
    wide = wide.loc[rows, columns]
    wide.index = [chosen[a].name if a in chosen else a for a in wide.index]
    return wide.reset_index().rename(columns={"index": "arm (chosen setting)"})


if __name__ == "__main__":
    sys.exit(main())
