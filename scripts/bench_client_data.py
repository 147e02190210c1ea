"""Benchmark: a simulation worker looking up client image shards, with and without the decoded-data memo.

A Ray worker serves many SuperNodes in turn, so each message may be for a
partition it has not held lately.  This times, in one run, ``--lookups``
shard lookups cycling over ``--clients`` partitions

* as the ClientApp does them (decoded images and partition kept once per
  worker, ``bouquet.tasks.vision.partitioned_images``), and
* with that memo cleared before every lookup (what each lookup cost before
  it existed: re-reading the decoded-image cache and re-partitioning),

and prints both and their ratio.

    python scripts/bench_client_data.py                              # CIFAR-10 copy in ../shared, 50 clients
    python scripts/bench_client_data.py --data digits --clients 10   # no shared data needed
"""

from __future__ import annotations

import argparse
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

from bouquet import client_app
from bouquet.config import AppConfig
from bouquet.tasks import vision

ROOT = Path(__file__).resolve().parents[1]


def time_lookups(run_config: dict, clients: int, lookups: int, memo: bool) -> float:
    vision.partitioned_images.cache_clear()
    vision.node_shard.cache_clear()
    config = AppConfig.from_run_config(run_config)
    started = time.perf_counter()
    for k in range(lookups):
        if not memo:
            vision.partitioned_images.cache_clear()
        context = SimpleNamespace(node_config={"partition-id": k % clients, "num-partitions": clients})
        client_app.node_task(config, context)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="cifar10", help="experiments/sckm/data/<name>.toml")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--shards-per-client", type=int, default=2)
    parser.add_argument("--lookups", type=int, default=200)
    args = parser.parse_args(argv)
    layer = tomllib.loads((ROOT / "experiments" / "sckm" / "data" / f"{args.data}.toml").read_text())
    run_config = {**layer, "task": "vision", "shards-per-client": args.shards_per_client}
    time_lookups(run_config, args.clients, 1, memo=True)  # decode once into the on-disk cache, untimed
    without = time_lookups(run_config, args.clients, args.lookups, memo=False)
    with_memo = time_lookups(run_config, args.clients, args.lookups, memo=True)
    print(f"{args.lookups} shard lookups over {args.clients} clients ({args.data}): "
          f"without memo {without:.2f} s, with memo {with_memo:.2f} s, ratio {without / with_memo:.1f}x")


if __name__ == "__main__":
    main()
