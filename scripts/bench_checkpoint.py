"""What a per-round checkpoint costs: file size, write time and read time, for three server states.

    python scripts/bench_checkpoint.py [--repeats 3]

Cases (each a real :class:`bouquet.strategies.BouquetStrategy` whose state :func:`save_checkpoint` writes):

* ``water``: the default job's LSTM, HK, the 179 nodes of the default pool known by key;
* the CIFAR-size CNN with SCKM-Select in piggyback mode holding a 0.5 % sketch of every one of N nodes
  (N = 10, the SCKM paper's setting, and 100);
* a VGG-16 for 32 x 32 images (the SCKM paper's model) as the shared model, 10 nodes, without and with
  SCKM piggyback sketches.

Prints one line per case (size, mean write and read time over ``--repeats``); the time a round takes is in
docs/PERFORMANCE.md, so the overhead per round is the write time over it.  Writes to a temporary folder.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord

from bouquet.algorithms.selection import SCKMSelectSelector
from bouquet.checkpoint import latest_checkpoint
from bouquet.messages import flower_message
from bouquet.strategies import BouquetStrategy, Coalitions, HKRule, SamplingParams, UniformSampler
from bouquet.strategies.checkpoints import save_checkpoint
from bouquet.strategies.params import SelectionParams
from bouquet.strategies.selection import SketchSelection
from bouquet.tasks.vision import make_model
from bouquet.tasks.water import LSTMForecaster


def _nodes(strategy: BouquetStrategy, count: int) -> list[int]:
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(1, 2**63, size=count)]
    strategy.nodes.keys = {node: k for k, node in enumerate(ids)}
    return ids


def water() -> BouquetStrategy:
    torch.manual_seed(0)
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=50)),
                               aggregator=Coalitions(HKRule()), message_factory=flower_message)
    strategy.models.adopt(ArrayRecord(LSTMForecaster(32, 1).state_dict()))
    _nodes(strategy, 179)
    strategy.server_round = 5
    return strategy


def vision_piggyback(nodes: int, name: str = "cnn", shape: tuple[int, int, int] = (3, 32, 32)) -> BouquetStrategy:
    torch.manual_seed(0)
    model = make_model(name, shape, 10)
    sampler = SketchSelection(SCKMSelectSelector(), SamplingParams(clients_per_round=3),
                              SelectionParams(mode="piggyback"))
    strategy = BouquetStrategy(sampler=sampler, message_factory=flower_message)
    strategy.models.adopt(ArrayRecord(model.state_dict()))
    size = sum(p.numel() for p in model.parameters())
    dim = max(1, round(0.005 * size))
    rng = np.random.default_rng(1)
    for node in _nodes(strategy, nodes):
        sampler.state.known[node] = {"values": rng.normal(size=dim), "loss": 1.0, "num-examples": 100,
                                     "layer-sizes": [dim], "nbytes": 8 * dim, "round": 4}
        sampler.state.last_round[node] = 4
    strategy.server_round = 5
    return strategy


def vgg16() -> BouquetStrategy:
    torch.manual_seed(0)
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=10)),
                               message_factory=flower_message)
    strategy.models.adopt(ArrayRecord(make_model("vgg16", (3, 32, 32), 10).state_dict()))
    _nodes(strategy, 10)
    strategy.server_round = 5
    return strategy


def measure(name: str, strategy: BouquetStrategy, repeats: int) -> None:
    writes, reads = [], []
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as folder:
        (Path(folder) / "rounds.jsonl").write_text("{}\n")
        for _ in range(repeats):
            started = time.perf_counter()
            path = save_checkpoint(strategy.state(), _empty_result(), folder, {"config": {}, "version": "bench"})
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            latest_checkpoint(folder)
            reads.append(time.perf_counter() - started)
        size = path.stat().st_size
    print(f"{name:32s} {size / 2**20:8.2f} MiB   write {1000 * np.mean(writes):8.1f} ms   "
          f"read {1000 * np.mean(reads):8.1f} ms", flush=True)


def _empty_result():
    from flwr.serverapp.strategy import Result

    return Result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    measure("water (LSTM, HK, 179 nodes)", water(), args.repeats)
    measure("CNN 32x32, SCKM piggyback, 10 nodes", vision_piggyback(10), args.repeats)
    measure("CNN 32x32, SCKM piggyback, 100 nodes", vision_piggyback(100), args.repeats)
    measure("VGG-16 (32x32), 10 nodes", vgg16(), args.repeats)
    measure("VGG-16, SCKM piggyback, 10 nodes", vision_piggyback(10, "vgg16"), args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
