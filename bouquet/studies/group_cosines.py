"""What HK's cosine rule sees on a known-group benchmark: cosines of client updates within and between groups.

    python scripts/group_cosines.py --data digits-rotate [--rounds 10] [--out results/groups/cosines]
    python scripts/group_cosines.py --data water-types --clients 21

Runs FedAvg in-process (no Flower; the same tasks, data and seeds as the app, run config from
``experiments/groups/data/<data>.toml`` and the quick profile) with every one of ``--clients`` clients
training every round, and records per round the pairwise cosines of the updates ``w_i - theta`` and of the
weights ``w_i``: median within the true groups, median between groups, and the share of within-group
pairs above each threshold of HK's tau grid and of between-group pairs below it.  HK with threshold tau
links two clients when their cosine is >= tau, so it can only find the groups while the within-group
cosines sit above tau and the between-group ones below it.  Writes ``<out>/<data>.csv`` and prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bouquet.analysis.probes import clients, cosine_matrix, flat, split_pairs
from bouquet.config import AppConfig
from bouquet.experiments import layered_run_config
from bouquet.studies import ROOT

EXPERIMENTS = ROOT / "experiments" / "groups"
TAUS = (0.3, 0.5, 0.75, 0.9)


def describe(round_: int, space: str, cosines: np.ndarray, groups: np.ndarray) -> dict:
    within, between = split_pairs(cosines, groups)
    row = {"round": round_, "space": space, "within median": float(np.median(within)),
           "between median": float(np.median(between))}
    for tau in TAUS:
        row[f"within >= {tau}"] = float((within >= tau).mean())
        row[f"between < {tau}"] = float((between < tau).mean())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="digits-rotate", help="experiments/groups/data/<name>.toml")
    parser.add_argument("--clients", type=int, default=None, help="default: the benchmark's num-supernodes")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/groups/cosines"))
    args = parser.parse_args(argv)
    layers = layered_run_config(EXPERIMENTS, [("data", args.data), ("profiles", "quick")], ROOT)
    count = args.clients or int(layers.pop("num-supernodes", 20))
    layers.pop("num-supernodes", None)
    config = AppConfig.from_run_config({**layers, "seed": args.seed})
    torch.set_num_threads(1)
    tasks, model = clients(config, count)
    groups = np.array([task.group for task in tasks])
    if len(set(groups)) < 2:
        raise SystemExit(f"{args.data}: the clients have no known groups to compare")
    rows = []
    for round_ in range(1, args.rounds + 1):
        theta = flat(model)
        trained, sizes = [], []
        for index, task in enumerate(tasks):
            local = task.new_model()
            local.load_state_dict(model.state_dict())
            task.train(local, np.random.default_rng([args.seed, round_, index]), 0.0)
            trained.append(local)
            sizes.append(task.num_examples)
        weights = np.array([flat(m) for m in trained])
        rows.append(describe(round_, "updates", cosine_matrix(weights - theta), groups))
        rows.append(describe(round_, "weights", cosine_matrix(weights), groups))
        shares = np.array(sizes, dtype=np.float64) / sum(sizes)
        state = {name: sum(share * m.state_dict()[name].double() for share, m in zip(shares, trained, strict=True))
                 for name in model.state_dict()}
        model.load_state_dict({name: value.to(model.state_dict()[name].dtype) for name, value in state.items()})
        print(f"round {round_}: updates within {rows[-2]['within median']:.3f} "
              f"between {rows[-2]['between median']:.3f}; weights within {rows[-1]['within median']:.5f} "
              f"between {rows[-1]['between median']:.5f}", flush=True)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / f"{args.data}.csv", index=False)
    print(frame[frame["space"] == "updates"].round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
