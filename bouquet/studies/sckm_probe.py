"""The SCKM paper's pair-wise feature probe (Section 4, Tables 3-4) from our own training runs.

    python scripts/sckm_probe.py --data digits --shards 1 2 5 --rounds 1 3 5 10 --seeds 0 1 2
    python scripts/sckm_probe.py --data cifar10 --shards 1 2 5 --rounds 1 5 10 --seeds 0 1 2 --val-size 1000

For each shard setting S and seed: 10 clients on label-sorted shards
(``bouquet.data.images``) train a global model with FedAvg over all clients
(the trajectory along which pairs are probed). At each probed round t, every
client computes its gradient sketch at the global model (0.5 % of every
layer, the same coordinates for all, :func:`bouquet.tasks.vision.gradient_sketch`)
and its locally trained model (``local-batches`` SGD steps); for every pair
(k, k') the global model is replaced by the mean of the two trained models and
scored on a held-out validation split of the training set: that accuracy,
min-max normalised within the slice (round, S, seed), is the pair's label
(eq. 5). Features are Table 2's, computed on the pair's sketches
(:mod:`bouquet.algorithms.probe`). One-feature logistic probes then give
rank (eq. 6) and Rel.A (eq. 7) per shard setting and per round (pooled over
seeds and the other axis), in the layout of Tables 3 and 4.

Per client and probed round it also records what SCKM-Select ranks by, eta
(eq. 9, on the layer-weighted sketches the selector uses), beside the
client's sketch norm, loss at the global model, number of classes, and
partner accuracy (mean validation accuracy of its 9 pairs): does eta pick
good partners, or does it track the gradient's scale?  Spearman correlations
per (shards, round), mean +- std over seeds, go to ``probe_clients.md``.

This is an analysis, not a federated run, so it calls the task functions
directly instead of going through Flower. Writes ``probe_pairs.csv`` (every
pair with its features and label), ``probe_rank.csv``/``.md``,
``probe_rel_a.csv``/``.md`` and ``probe_clients.csv``/``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bouquet.algorithms.probe import (
    minmax_labels,
    pair_features,
)
from bouquet.analysis.feature_probe import client_rows, client_table, tables
from bouquet.data.images import VisionDataParams, load_images, shard_partition
from bouquet.studies import ROOT
from bouquet.tasks.vision import (
    VisionTrainParams,
    accuracy,
    batch_at,
    gradient_sketch,
    make_model,
    train_batches,
)

CIFAR = ROOT / ".." / "shared" / "data" / "cifar10" / "cifar10-jpeg.tar.gz"


def average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: sum(s[k] for s in states) / len(states) for k in states[0]}


def collect(data, shards: int, seed: int, rounds: list[int], args) -> tuple[list[dict], list[dict]]:
    """Pairs with features and labels, and per-client rows, for one (shards, seed) trajectory."""
    rng = np.random.default_rng([seed, shards])
    holdout = rng.permutation(len(data.y_train))
    n_val = len(holdout) // 10
    val, train = holdout[:n_val], holdout[n_val:]
    if args.val_size:
        val = val[:args.val_size]  # score pairs on part of the held-out split (CIFAR: 45 pairs x 5,000 images)
    parts = [train[p] for p in shard_partition(data.y_train[train], args.clients, shards, rng)]
    settings = VisionTrainParams(args.local_batches, args.batch_size, args.learning_rate)
    torch.manual_seed(seed)
    model = make_model(args.model, data.shape, len(data.classes))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [len(np.unique(data.y_train[idx])) for idx in parts]
    rows, clients = [], []
    for t in range(1, max(rounds) + 1):
        trained, sketches, losses = [], [], []
        for k, idx in enumerate(parts):
            client_rng = np.random.default_rng([seed, shards, t, k])
            model.load_state_dict(state)
            if t in rounds:
                batch = batch_at(data.x_train[idx], data.y_train[idx], args.batch_size, client_rng)
                sketch, loss, layer_sizes = gradient_sketch(model, batch, args.sketch_fraction, [seed, t])
                sketches.append(sketch.astype(np.float64))
                losses.append(loss)
            train_batches(model, data.x_train[idx], data.y_train[idx], settings, client_rng)
            trained.append({key: v.clone() for key, v in model.state_dict().items()})
        if t in rounds:
            scores, pair_rows = [], []
            for i, j in itertools.combinations(range(args.clients), 2):
                model.load_state_dict(average([trained[i], trained[j]]))
                acc, _ = accuracy(model, data.x_train[val], data.y_train[val])
                scores.append(acc)
                pair_rows.append({"shards": shards, "seed": seed, "round": t, "i": i, "j": j, "val-accuracy": acc,
                                  **pair_features(sketches[i], sketches[j])})
            for row, label in zip(pair_rows, minmax_labels(np.array(scores))):
                row["label"] = float(label)
            rows += pair_rows
            pairs = [(r["i"], r["j"]) for r in pair_rows]
            clients += [{"shards": shards, "seed": seed, "round": t, **row}
                        for row in client_rows(np.stack(sketches), layer_sizes, losses, classes, pairs, scores)]
            print(f"  S={shards} seed {seed} round {t}: {len(pair_rows)} pairs, val accuracy "
                  f"{min(scores):.3f}-{max(scores):.3f}", flush=True)
        state = average(trained)  # FedAvg over all clients moves the trajectory on
    return rows, clients


def build_parser() -> argparse.ArgumentParser:
    """The command line (also checked by the one-command reproduction's tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=["digits", "cifar10"], default="digits")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 5])
    parser.add_argument("--rounds", type=int, nargs="+", default=[1, 3, 5, 10])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--local-batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--sketch-fraction", type=float, default=0.005)
    parser.add_argument("--val-size", type=int, default=0,
                        help="score each pair on this many of the held-out images (0 = all of the 10%% split)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/sckm/probe-<data>")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    out = args.out or ROOT / "results" / "sckm" / f"probe-{args.data}"
    out.mkdir(parents=True, exist_ok=True)
    config = VisionDataParams() if args.data == "digits" else VisionDataParams("imagefolder", str(CIFAR))
    data = load_images(config)
    started = time.time()
    rows, clients = [], []
    for shards in args.shards:
        for seed in args.seeds:
            trajectory_pairs, trajectory_clients = collect(data, shards, seed, sorted(args.rounds), args)
            rows += trajectory_pairs
            clients += trajectory_clients
    pairs = pd.DataFrame(rows)
    pairs.to_csv(out / "probe_pairs.csv", index=False)
    tables(pairs, out)
    client_table(pd.DataFrame(clients), pairs, out)
    for name in ("probe_rank", "probe_rel_a", "probe_clients"):
        print((out / f"{name}.md").read_text())
    print(f"{len(pairs)} pairs in {time.time() - started:.0f} s; tables in {out}")


if __name__ == "__main__":
    main()
