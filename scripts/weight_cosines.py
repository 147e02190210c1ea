"""Pairwise cosines of client LSTM weights and of their updates after one local round.

    python scripts/weight_cosines.py [--clients 20] [--daiad ../shared/data/daiad/swm_trialA.zip]

Trains the first ``--clients`` households of the pool for one round (E = 5,
Adam 1e-3, batch 32) from the same seeded global model, without Flower, and
prints min / median / max of the pairwise cosines of the weights ``w_i`` and
of the updates ``w_i - theta``: what HK's cosine rule sees in round 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from bouquet.config import AppConfig
from bouquet.data.water import load_pool
from bouquet.tasks.water import LSTMForecaster, train_windows


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def pairwise_cosines(matrix: np.ndarray) -> np.ndarray:
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    return (unit @ unit.T)[np.triu_indices(len(matrix), 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--daiad", default="../shared/data/daiad/swm_trialA.zip")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sources = [("synthetic", {})]
    if Path(args.daiad).exists():
        sources.append(("daiad", {"data-source": "daiad", "data-path": str(Path(args.daiad).resolve()),
                                  "min-history-days": 300, "active-factor": 0.0}))
    for name, overrides in sources:
        config = AppConfig.from_run_config(overrides)
        data = config.water_data
        pool = load_pool(data)
        torch.manual_seed(config.sampling.seed)
        global_model = LSTMForecaster.from_params(config.water_model, config.water_data.input_channels)
        theta = flat(global_model)
        rows = []
        for partition in range(min(args.clients, len(pool))):
            local = LSTMForecaster.from_params(config.water_model, config.water_data.input_channels)
            local.load_state_dict(global_model.state_dict())
            train_windows(local, pool.client(partition, data), config.water_train,
                          np.random.default_rng([config.sampling.seed, 1, partition]))
            rows.append(flat(local))
        weights = np.array(rows)
        for label, matrix in (("weights", weights), ("updates", weights - theta)):
            c = pairwise_cosines(matrix)
            print(f"{name:9s} {label:7s} cosines: min {c.min():.3f}  median {np.median(c):.3f}  max {c.max():.3f}")


if __name__ == "__main__":
    main()
