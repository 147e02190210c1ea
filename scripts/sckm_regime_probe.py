"""Tune a CPU regime for the selection study: FedAvg with seeded random selection, in-process.

    python scripts/sckm_regime_probe.py --shards 2 5 --rounds 300 --model cnn-gn --local-batches 10 \
        --batch-size 32 --learning-rate 0.01 --momentum 0.9 --seeds 0

The SCKM study asks for a regime in which random selection + FedAvg clearly leaves
chance within the study's round budget (>= 40 % CIFAR-10 test accuracy at
S = 5 shards per client, >= 25 % at S = 2, B = 2 of 10 clients) before any
selector is compared there.  This script only ever runs *random* selection,
so the regime is chosen without looking at a selector's results.

The clients are the app's own (:func:`bouquet.tasks.vision.node_shard`: the
same label-sorted shards as a ``flwr run`` with ``vision-data-seed``), each
round draws B of them with ``default_rng([seed, round])``, each trains
``local-batches`` SGD steps from the global model
(:func:`bouquet.tasks.vision.train_batches`), and the server averages the B
models, weighted by examples as FedAvg does.  ``--server-momentum beta``
and ``--server-lr eta`` apply FedAvgM (Hsu et al. 2019):
``v <- beta v + (w - mean)``, ``w <- w - eta v``; with ``eta = 1 - beta`` the
step is an exponential moving average of the rounds' updates (the same
long-run step as FedAvg, smoothed over about ``1 / (1 - beta)`` rounds).
Every ``--eval-every`` rounds the global model is scored on a seeded subset
of the test set (``--eval-size``; the test set is sorted by class).

``--device cuda`` runs the model on a GPU (the same functions the app's
``vision-device`` uses; no Flower needed, so it runs where only torch is):
``scripts/gpu_vgg_check.sh`` is the VGG-16 check of the SCKM study for a GPU machine.

It is an analysis, not a federated run, so it calls the task functions
directly instead of going through Flower.  One CSV per configuration and
seed in ``--out`` (round, accuracy, loss, seconds); a finished file is
skipped, so the script can be stopped and restarted.  ``--summarise FOLDER``
writes every finished curve's table and figure (``docs/figures/sckm-regime``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bouquet.data.images import VisionDataParams
from bouquet.tasks.base import batch_indices
from bouquet.tasks.vision import (
    VisionTrainParams,
    accuracy,
    make_model,
    node_shard,
    partitioned_images,
    torch_device,
    train_batches,
)

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT / ".." / "shared" / "data" / "cifar10" / "cifar10-jpeg.tar.gz"


def config_name(args: argparse.Namespace, shards: int, seed: int) -> str:
    return (f"{args.model}-s{shards}-b{args.budget}-e{args.local_batches}x{args.batch_size}-lr{args.learning_rate:g}"
            f"-m{args.momentum:g}-sm{args.server_momentum:g}"
            + (f"-slr{args.server_lr:g}" if args.server_lr != 1 else "") + f"-seed{seed}"
            + (f"-{args.device.replace(':', '')}" if args.device != "cpu" else ""))


def run(args: argparse.Namespace, shards: int, seed: int, out: Path) -> pd.DataFrame:
    data = VisionDataParams(dataset="imagefolder", path=str(args.data), shards_per_client=shards,
                            seed=args.data_seed)
    images, _ = partitioned_images(data, args.clients)
    clients = [node_shard(data, k, args.clients) for k in range(args.clients)]
    keep = batch_indices(len(images.y_test), args.eval_size, np.random.default_rng([args.data_seed, 2]))
    x_test, y_test = images.x_test[keep], images.y_test[keep]
    settings = VisionTrainParams(args.local_batches, args.batch_size, args.learning_rate, args.momentum)
    torch.manual_seed(seed)
    model = make_model(args.model, images.shape, len(images.classes)).to(torch_device(args.device))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    velocity = {k: torch.zeros_like(v) for k, v in state.items()}
    rows, start = [], time.perf_counter()
    for t in range(1, args.rounds + 1):
        picked = np.random.default_rng([seed, t]).choice(args.clients, size=args.budget, replace=False)
        trained, weights = [], []
        for k in sorted(picked):
            model.load_state_dict(state)
            shard = clients[k]
            train_batches(model, shard.x, shard.y, settings, np.random.default_rng([seed, t, int(k)]))
            trained.append({key: v.detach().clone() for key, v in model.state_dict().items()})
            weights.append(len(shard.y))
        share = np.asarray(weights, dtype=np.float64) / sum(weights)
        mean = {key: sum(float(w) * s[key] for w, s in zip(share, trained)) for key in state}
        for key, value in list(state.items()):
            velocity[key] = args.server_momentum * velocity[key] + (value - mean[key])
            state[key] = value - args.server_lr * velocity[key]
        if t % args.eval_every == 0 or t == args.rounds:
            model.load_state_dict(state)
            acc, loss = accuracy(model, x_test, y_test)
            seconds = time.perf_counter() - start
            rows.append({"round": t, "accuracy": acc, "loss": loss, "seconds": seconds})
            print(f"  {out.name} round {t}: accuracy {acc:.4f}, loss {loss:.3f}, {seconds:.0f} s", flush=True)
    return pd.DataFrame(rows)


def summarise(folder: Path, out: Path) -> pd.DataFrame:
    """Every finished curve in ``folder``: ``curves.csv`` (all points), ``table.md`` (per configuration, the
    accuracy at a third, two thirds and all of the longest run's rounds, i.e. 100, 200 and 300 for the regime,
    and the mean of the last 5 evaluations) and ``curves.png`` (a panel per shard count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = [pd.read_csv(path).assign(config=path.stem) for path in sorted(folder.glob("*.csv"))
              if path.name != "curves.csv"]
    if not frames:
        raise SystemExit(f"no finished curve in {folder}")
    curves = pd.concat(frames, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    curves.to_csv(out / "curves.csv", index=False)
    last = int(curves["round"].max())
    marks = sorted({round(last / 3), round(2 * last / 3), last})  # 100 / 200 / 300 for the 300-round regime
    lines = ["| configuration | " + " | ".join(f"round {r}" for r in marks) + " | last 5 evaluations |",
             "|---|" + "--:|" * (len(marks) + 1)]
    for name, part in curves.groupby("config", sort=False):
        at = part.set_index("round")["accuracy"]
        cells = [f"{100 * at[r]:.1f}" if r in at.index else "-" for r in marks]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {100 * part['accuracy'].tail(5).mean():.1f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    shard_counts = sorted({int(m) for m in curves["config"].str.extract(r"-s(\d+)-b", expand=False).dropna()})
    fig, axes = plt.subplots(1, len(shard_counts), figsize=(6 * len(shard_counts), 4), sharey=True, squeeze=False)
    for ax, shards in zip(axes[0], (f"s{k}" for k in shard_counts)):
        for name, part in curves[curves["config"].str.contains(f"-{shards}-")].groupby("config"):
            ax.plot(part["round"], 100 * part["accuracy"], label=name.replace(f"-{shards}", ""))
        if shards in ("s2", "s5"):  # the study's targets for the regime
            ax.axhline(25 if shards == "s2" else 40, color="grey", linestyle=":")
        ax.set(title=f"S = {shards[1]}, B = 2, random selection", xlabel="round", ylabel="test accuracy (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    return curves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=CIFAR)
    parser.add_argument("--data-seed", type=int, default=0, help="vision-data-seed: the shards and the test subset")
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 5])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--budget", type=int, default=2, help="clients trained per round (B)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--model", default="cnn-gn")
    parser.add_argument("--local-batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--server-momentum", type=float, default=0.0)
    parser.add_argument("--server-lr", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: run two probes side by side)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (vision-device)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "sckm-regime")
    parser.add_argument("--summarise", type=Path, default=None, metavar="FOLDER",
                        help="only write curves.csv, table.md and curves.png of the curves in --out to FOLDER")
    args = parser.parse_args(argv)
    if args.summarise is not None:
        summarise(args.out, args.summarise)
        return 0
    if not args.data.exists():
        raise SystemExit(f"image data not found: {args.data}")
    if not 0 <= args.server_momentum < 1:
        raise SystemExit(f"--server-momentum must be in [0, 1), got {args.server_momentum}")
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    for shards in args.shards:
        for seed in args.seeds:
            path = args.out / f"{config_name(args, shards, seed)}.csv"
            if path.exists():
                print(f"{path.name}: done, skipped", flush=True)
                continue
            curve = run(args, shards, seed, path.with_suffix(""))
            partial = path.with_suffix(".tmp")
            curve.to_csv(partial, index=False)
            partial.replace(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
