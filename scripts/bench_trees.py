"""Benchmark: a federated tree fit in Flower's simulation against the same fit in process, on one pool.

    python scripts/bench_trees.py [--data daiad] [--run-config 'tree-count=100 tree-max-depth=4'] [--out results/bench_trees]

It runs, in one process and one run:

* ``flower``: ``python -m bouquet.launch`` with ``forecast-model = "trees"`` on the pool (every household a
  SuperNode, 2 CPU cores), the test period locked; from its ``summary.json``: the fit's seconds, exchanges and
  bytes, and the seconds the server waited for replies (the rest is the server's own work: adding the
  replies, choosing the splits, building the messages);
* ``twin``: the same fit in process (:class:`bouquet.algorithms.trees.PartiesSource`: every household a party,
  the same requests and sums, no messages), and the pooled fit (one party), each timed;
* ``levels``: the server's arithmetic of one level alone (adding the households' histograms and choosing the
  splits), timed over every level of the twin's fit.

It checks that the Flower run's validation curve equals the twin's (the same trees) and prints the targets'
numbers: the fit's minutes in Flower (target <= 3 on the DAIAD pool, 2 cores) and the server's work per
exchange and per level (target <= 50 ms), with the ratio of the Flower fit to the twin's.  ``--data daiad``
needs ``../shared/data/daiad/swm_trialA.zip``; ``--data synthetic`` uses the embedded pool.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DAIAD = ROOT.parent / "shared" / "data" / "daiad" / "swm_trialA.zip"
POOL = {"daiad": f'data-source="daiad" data-path="{DAIAD}" min-history-days=300 active-factor=0.0',
        "synthetic": 'data-source="synthetic"'}
PROTOCOL = 'forecaster="improved" split="origins" origins=3 origin=0 validation-days=56 score-test=false'


def overrides(text: str) -> dict:
    from bouquet.launch import parse_overrides

    return parse_overrides(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=sorted(POOL), default="daiad")
    parser.add_argument("--run-config", default="", help="tree-* keys of the fit (default: the app's defaults)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_trees")
    args = parser.parse_args(argv)
    if args.data == "daiad" and not DAIAD.exists():
        print(f"no DAIAD file at {DAIAD}: nothing to measure (--data synthetic uses the embedded pool)")
        return 0
    from bouquet.algorithms.trees import PartiesSource, add_replies, answer, best_splits, fit, pooled_source
    from bouquet.analysis.water_baselines import origin_data
    from bouquet.tasks.trees import household_rows

    text = " ".join(t for t in (PROTOCOL, POOL[args.data], 'forecast-model="trees"', args.run_config) if t)
    run_config = overrides(text)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"trees-{args.data}-{int(time.time())}"
    command = [sys.executable, "-m", "bouquet.launch", "--run-config",
               f'{text} results-dir="{args.out}" run-name="{name}"']
    print("flower:", " ".join(command[2:4]), "...", flush=True)
    started = time.monotonic()
    done = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0 or not (args.out / name / "summary.json").exists():
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        print("the Flower run failed")
        return 1
    summary = json.loads((args.out / name / "summary.json").read_text())
    costs = summary["tree-fit"]

    data = origin_data(run_config, 0, "validation")
    parties = [household_rows(w, data.config.tree_features)[0] for w in data.windows.values()]
    params = data.config.trees
    started = time.perf_counter()
    _, twin_log = fit(PartiesSource(parties, params), params)
    twin = time.perf_counter() - started
    started = time.perf_counter()
    fit(pooled_source(np.concatenate([p.x for p in parties]), np.concatenate([p.y for p in parties]), params),
        params)
    pooled = time.perf_counter() - started

    class Timed(PartiesSource):
        """The twin, timing the server's own arithmetic of each level: adding the replies and the splits."""

        level_seconds: ClassVar[list[float]] = []

        def sums(self, request):
            replies = []
            for i, rows in enumerate(self.parties):
                reply, self.states[i] = answer(request, rows, self.states[i], self.params)
                replies.append(reply)
            started = time.perf_counter()
            out = add_replies(replies)
            if request.kind == "histograms":
                best_splits(out["histograms"], self.params)
            self.level_seconds.append(time.perf_counter() - started)
            return out

    timed = Timed(parties, params)
    fit(timed, params)
    level = float(np.median(Timed.level_seconds))
    same = np.allclose(costs["val-mae-litres-by-trees"], twin_log.validation, rtol=1e-9, atol=1e-9)
    per_exchange = costs["fit-seconds"] / costs["exchanges"] * 1000
    lines = [
        (f"pool: {args.data}, {len(parties)} households, {sum(len(p.y) for p in parties)} training rows; "
         f"{params.trees} trees, depth {params.max_depth}, {params.objective}"),
        (f"flower fit: {costs['fit-seconds']:.1f} s ({costs['fit-seconds'] / 60:.2f} min; the whole run {wall:.0f} s), "
         f"{costs['exchanges']} exchanges, {per_exchange:.0f} ms an exchange, {costs['bytes-to-nodes'] / 1e6:.1f} MB "
         f"to the nodes, {costs['bytes-from-nodes'] / 1e6:.1f} MB back"),
        (f"server's own work: {1000 * costs['server-seconds-per-exchange']:.1f} ms an exchange in Flower "
         f"(target <= 50); adding the replies and choosing the splits alone: {1000 * level:.1f} ms a level (median)"),
        f"twin in process: {twin:.1f} s; pooled in process: {pooled:.1f} s",
        f"flower / twin ratio: {costs['fit-seconds'] / twin:.1f}",
        f"the Flower run's validation curve equals the twin's: {same}",
    ]
    print("\n".join(lines))
    (args.out / f"{name}.md").write_text("\n".join(f"- {line}" for line in lines) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
