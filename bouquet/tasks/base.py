"""What every client task offers: a model, training, evaluation and one training batch (torch, no Flower).

A task is built once per node (:class:`bouquet.tasks.water.WaterTask` for a household,
:class:`bouquet.tasks.vision.VisionTask` for an image shard) from the run's config sections and the
node's own data; the ClientApp (:mod:`bouquet.client_app`) turns its results into Flower records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from torch import nn

__all__ = ["Penalty", "Task", "batch_indices", "head_keys", "proximal_penalty", "task_loss"]

#: Extra loss term ``penalty(model)`` added to the batch loss (e.g. FedProx's proximal term).
Penalty = Callable[[nn.Module], torch.Tensor]


class Task(Protocol):
    """One node's side of a use case."""

    partition_id: int
    household: str  # "" where the node is not a household
    group: str  # the node's known group in a benchmark with known groups, else ""

    @property
    def num_examples(self) -> int: ...

    def new_model(self) -> nn.Module: ...

    def training_batch(self, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]: ...

    def train(self, model: nn.Module, rng: np.random.Generator, proximal_mu: float) -> float: ...

    def loss(self, model: nn.Module, examples: int, rng: np.random.Generator) -> tuple[float, int]: ...

    def evaluate(self, model: nn.Module, rng: np.random.Generator, final: bool = False) -> dict[str, float]:
        """The model's metrics; ``final``: the run's last evaluation, the one that may score the test period."""
        ...

    def final_arrays(self, model: nn.Module) -> dict[str, dict[str, np.ndarray]]:
        """Arrays the final evaluation sends back by record name (the water task's forecasts and model)."""
        ...

    def final_info(self, model: nn.Module) -> dict[str, str]:
        """Text entries of the final evaluation's ``info`` record."""
        ...

    def poisoned(self, attack: str, scale: float) -> Task: ...


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of one mini-batch drawn without replacement from ``n`` samples (all when fewer)."""
    return np.sort(rng.choice(n, size=min(batch_size, n), replace=False))


def head_keys(model: nn.Module) -> list[str]:
    """The state-dict keys of the model's output layer (its ``head`` sub-module): the personal layers of
    ``personal-layers = "head"``."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise TypeError(f"{type(model).__name__} has no 'head' layer to keep personal")
    return [f"head.{name}" for name in head.state_dict()]


def task_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for class labels (integer targets), MSE for forecasts (float targets)."""
    if not targets.dtype.is_floating_point:
        return torch.nn.functional.cross_entropy(outputs, targets.long())
    return torch.nn.functional.mse_loss(outputs, targets)


def proximal_penalty(model: nn.Module, mu: float, anchor: nn.Module | None = None) -> Penalty:
    """FedProx's term ``(mu / 2) * ||w - w_global||^2`` with ``w_global`` = the model's weights now.

    Call it right after loading the global model, before local training; its
    gradient is ``mu * (w - w_global)``.  With ``anchor`` (a model of the same shape), ``w_global`` is
    that model's weights instead (Ditto's personal step: the personal model pulled toward the served one).
    """
    if mu < 0:
        raise ValueError(f"proximal mu must be >= 0, got {mu}")
    anchors = [p.detach().clone() for p in (anchor if anchor is not None else model).parameters()]

    def penalty(current: nn.Module) -> torch.Tensor:
        return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(current.parameters(), anchors))

    return penalty
