"""The toy task: linear regression y = x . w_g + noise, where client ``p`` belongs to group ``p % 2`` and the two
groups' weights point opposite ways.  Importing this module registers the task ``toy``.

Its client half (:class:`ToyTask`) and server half (:class:`ToyServer`) follow bouquet's ``Task`` and
``ServerTask`` protocols; nothing in bouquet names it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, Context

from bouquet.node_identity import partition_id
from bouquet.params import RunConfigKeys, require
from bouquet.serving.task import final_clients, run_summary
from bouquet.tasks.registry import TaskKind, register_task

log = logging.getLogger(__name__)

#: Clients of a toy simulation.
CLIENTS = 6
#: Each group's true weights.
GROUP_WEIGHTS = (np.array([2.0, -1.0]), np.array([-2.0, 1.0]))


@dataclass(frozen=True)
class ToyParams:
    """The toy task's own settings: its section ``toy`` of the run config (keys ``toy-*``).

    Parameters
    ----------
    learning_rate : float, default 0.1
        SGD's step size.
    steps : int, default 20
        SGD steps of 16 examples per round.
    """

    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="toy-")

    learning_rate: float = 0.1
    steps: int = 20

    def __post_init__(self) -> None:
        require(self.learning_rate > 0, "learning_rate", f"toy-learning-rate must be > 0, got {self.learning_rate}")
        require(self.steps >= 1, "steps", f"toy-steps must be >= 1, got {self.steps}")


class ToyTask:
    """One toy client: 64 examples of its group's regression."""

    household = ""

    def __init__(self, partition: int, seed: int, params: ToyParams) -> None:
        self.params = params
        self.partition_id = partition
        self.group = f"g{partition % 2}"
        rng = np.random.default_rng([seed, partition])
        self.x = rng.normal(size=(64, 2)).astype(np.float32)
        self.y = (self.x @ GROUP_WEIGHTS[partition % 2] + 0.05 * rng.normal(size=64)).astype(np.float32)[:, None]

    @property
    def num_examples(self) -> int:
        return len(self.x)

    def new_model(self) -> torch.nn.Module:
        return torch.nn.Linear(2, 1)

    def training_batch(self, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.sort(rng.choice(len(self.x), size=min(batch_size, len(self.x)), replace=False))
        return torch.from_numpy(self.x[rows]), torch.from_numpy(self.y[rows])

    def _mse(self, model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(torch.from_numpy(self.x)), torch.from_numpy(self.y)))

    def train(self, model: torch.nn.Module, rng: np.random.Generator, proximal_mu: float) -> float:
        optimizer = torch.optim.SGD(model.parameters(), lr=self.params.learning_rate)
        for _ in range(self.params.steps):
            x, y = self.training_batch(16, rng)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        return self._mse(model)

    def loss(self, model: torch.nn.Module, examples: int, rng: np.random.Generator) -> tuple[float, int]:
        return self._mse(model), self.num_examples

    def evaluate(self, model: torch.nn.Module, rng: np.random.Generator, final: bool = False) -> dict[str, float]:
        return {"mse": self._mse(model), "num-examples": self.num_examples}

    def final_arrays(self, model: torch.nn.Module) -> dict[str, dict[str, np.ndarray]]:
        return {}

    def final_info(self, model: torch.nn.Module) -> dict[str, str]:
        return {}

    def poisoned(self, attack: str, scale: float) -> ToyTask:
        raise ValueError(f"the toy task has no data attack ({attack!r})")


def toy_node(config: Any, context: Context) -> ToyTask:
    """The client half: client ``partition-id``'s data."""
    return ToyTask(partition_id(context), config.sampling.seed, config.section("toy"))


class ToyServer:
    """The server half: the initial model, no central evaluation, and a summary of the clients' final MSE."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def new_model(self) -> torch.nn.Module:
        return torch.nn.Linear(2, 1)

    def begin(self, recorder: Any, checkpoint: Any) -> tuple[ArrayRecord, None]:
        torch.manual_seed(self.config.sampling.seed)
        return ArrayRecord(self.new_model().state_dict()), None

    def finish(self, grid: Any, strategy: Any, result: Any, recorder: Any, checkpoint: Any, personal: Any,
               started: float) -> dict[str, Any]:
        rows = final_clients(grid, self.config, strategy, recorder, personal)
        mse = [float(r["mse"]) for r in rows]
        summary = {"task": self.config.run.task, "strategy": self.config.run.strategy, "clients-evaluated": len(rows),
                   "mse-mean": float(np.mean(mse)) if mse else None,
                   **run_summary(self.config, strategy, checkpoint, started or time.time())}
        recorder.write_json("summary.json", summary)
        log.info("bouquet summary: toy, %s, %d clients, final MSE %.4f", self.config.run.strategy, len(rows),
                 summary["mse-mean"] if mse else float("nan"))
        return summary


register_task(TaskKind("toy", label="toy regression (a test's own task)", node=toy_node, server=ToyServer,
                       pool_size=lambda config: CLIENTS, params={"toy": ToyParams}))
