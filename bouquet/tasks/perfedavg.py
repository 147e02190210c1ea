"""Per-FedAvg client steps (Fallah, Mokhtari, Ozdaglar 2020), first-order and Hessian-free.

Per-FedAvg trains the global model ``w`` so that one local gradient step
personalises it well.  One local iteration on batches ``D, D', D''``::

    w_tmp = w - alpha * grad f(w; D)
    FO:  w <- w - beta * grad f(w_tmp; D')
    HF:  w <- w - beta * (I - alpha * H(w; D'')) grad f(w_tmp; D')

with the Hessian-vector product ``H v`` approximated by the central finite
difference ``(grad f(w + delta v) - grad f(w - delta v)) / (2 delta)`` (the
paper's Hessian-free variant).  Evaluation personalises the received model
with one step ``w - alpha * grad f(w; D_train)`` before testing
(:func:`personalize`).  Steps are plain gradient steps as in the paper; the meta step can instead go
through Adam (``meta_optimizer = "adam"``, learning rate beta).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from bouquet.tasks.params import PerFedAvgParams

__all__ = ["PerFedAvgParams", "perfedavg_step", "personalize", "train_perfedavg"]

Loss = Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]


def _grads(model: nn.Module, loss_fn: Loss, batch: Batch) -> list[torch.Tensor]:
    model.zero_grad()
    loss_fn(model, batch).backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _set(model: nn.Module, values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(model.parameters(), values):
            p.copy_(v)


def perfedavg_step(model: nn.Module, loss_fn: Loss, batches: tuple[Batch, Batch, Batch],
                   settings: PerFedAvgParams, optimizer: torch.optim.Optimizer | None = None) -> None:
    """One Per-FedAvg local iteration on ``(D, D', D'')``, in place.

    ``optimizer`` (over ``model``'s parameters) takes the meta step from ``w`` with the meta gradient as
    the gradient; without one the step is ``w - beta * meta``.
    """
    first, second, third = batches
    w = [p.detach().clone() for p in model.parameters()]
    g = _grads(model, loss_fn, first)
    _set(model, [wi - settings.alpha * gi for wi, gi in zip(w, g)])  # w_tmp
    meta = _grads(model, loss_fn, second)  # grad f(w_tmp; D')
    if settings.variant == "hf":
        _set(model, [wi + settings.delta * mi for wi, mi in zip(w, meta)])
        plus = _grads(model, loss_fn, third)
        _set(model, [wi - settings.delta * mi for wi, mi in zip(w, meta)])
        minus = _grads(model, loss_fn, third)
        hvp = [(a - b) / (2 * settings.delta) for a, b in zip(plus, minus)]
        meta = [mi - settings.alpha * hi for mi, hi in zip(meta, hvp)]
    if optimizer is None:
        _set(model, [wi - settings.beta * mi for wi, mi in zip(w, meta)])
        return
    _set(model, w)
    for p, mi in zip(model.parameters(), meta):
        p.grad = mi
    optimizer.step()


def _batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, rng: np.random.Generator) -> Iterator[Batch]:
    while True:
        order = torch.from_numpy(rng.permutation(len(y)))
        for start in range(0, len(y), batch_size):
            index = order[start : start + batch_size]
            yield x[index], y[index]


def mse_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean squared error of ``model`` on ``(x, y)``."""
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def train_perfedavg(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int,
                    settings: PerFedAvgParams, rng: np.random.Generator, loss_fn: Loss = mse_loss) -> float:
    """``epochs`` passes of Per-FedAvg iterations (each consumes three batches); returns the loss on all of
    ``(x, y)`` after them.  The meta step is plain (``settings.meta_optimizer = "sgd"``) or Adam's, with a
    fresh Adam each call."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    stream = _batches(xt, yt, batch_size, rng)
    steps = max(1, epochs * int(np.ceil(len(y) / batch_size)) // 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.beta) if settings.meta_optimizer == "adam" else None
    model.train()
    for _ in range(steps):
        perfedavg_step(model, loss_fn, (next(stream), next(stream), next(stream)), settings, optimizer)
    with torch.no_grad():
        return float(loss_fn(model, (xt, yt)))


def personalize(model: nn.Module, x: np.ndarray, y: np.ndarray, alpha: float, batch_size: int,
                rng: np.random.Generator, loss_fn: Loss = mse_loss) -> None:
    """One gradient step of size ``alpha`` on a training batch (Per-FedAvg's evaluation protocol), in place."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    batch = next(_batches(xt, yt, batch_size, rng))
    g = _grads(model, loss_fn, batch)
    _set(model, [p.detach() - alpha * gi for p, gi in zip(model.parameters(), g)])
