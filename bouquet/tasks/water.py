"""LSTM forecaster of daily household water use: model, local training, evaluation.

Matches the paper's protocol (Section 6): Adam (lr 1e-3), batch 32, MSE loss,
E local epochs on the household's training windows.  The paper does not give
the LSTM size; ``hidden_size`` and ``num_layers`` are parameters (default one
layer of 32 units, 4,513 parameters).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bouquet.data.water import ClientWindows

__all__ = ["LSTMForecaster", "TrainSettings", "evaluate_windows", "predict", "proximal_penalty", "train_windows"]


class LSTMForecaster(nn.Module):
    """LSTM over a (batch, lookback, 1) window -> next-day value (batch,)."""

    def __init__(self, hidden_size: int = 32, num_layers: int = 1) -> None:
        super().__init__()
        if hidden_size < 1 or num_layers < 1:
            raise ValueError(f"hidden_size and num_layers must be >= 1, got {hidden_size}, {num_layers}")
        self.lstm = nn.LSTM(input_size=1, hidden_size=hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1, :]).squeeze(-1)


@dataclass(frozen=True)
class TrainSettings:
    """Local training hyper-parameters (paper Table 3 defaults)."""

    epochs: int = 5
    learning_rate: float = 1e-3
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.learning_rate > 0:
            raise ValueError(f"invalid training settings {self}")


#: Extra loss term ``penalty(model)`` added to the batch loss (e.g. FedProx's proximal term).
Penalty = Callable[[nn.Module], torch.Tensor]


def train_windows(model: nn.Module, windows: ClientWindows, settings: TrainSettings,
                  rng: np.random.Generator, penalty: Penalty | None = None) -> float:
    """Run ``settings.epochs`` epochs of Adam on the training windows, in place.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the shuffling order of every epoch.
    penalty : callable, optional
        Added to each batch's MSE before the backward pass.

    Returns
    -------
    float
        Mean training MSE (scaled units) over the last epoch's batches,
        weighted by batch size.
    """
    x = torch.from_numpy(windows.x_train)
    y = torch.from_numpy(windows.y_train)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    loss_fn = nn.MSELoss()
    model.train()
    last = 0.0
    for _ in range(settings.epochs):
        order = torch.from_numpy(rng.permutation(len(y)))
        total = 0.0
        for start in range(0, len(y), settings.batch_size):
            batch = order[start : start + settings.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            objective = loss if penalty is None else loss + penalty(model)
            objective.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        last = total / len(y)
    return last


def proximal_penalty(model: nn.Module, mu: float) -> Penalty:
    """FedProx's term ``(mu / 2) * ||w - w_global||^2`` with ``w_global`` = the model's weights now.

    Call it right after loading the global model, before local training; its
    gradient is ``mu * (w - w_global)``.
    """
    if mu < 0:
        raise ValueError(f"proximal mu must be >= 0, got {mu}")
    anchors = [p.detach().clone() for p in model.parameters()]

    def penalty(current: nn.Module) -> torch.Tensor:
        return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(current.parameters(), anchors))

    return penalty


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """Scaled one-step-ahead predictions for windows ``x`` (n, lookback, 1)."""
    model.eval()
    return model(torch.from_numpy(x)).numpy().astype(np.float64)


def evaluate_windows(model: nn.Module, windows: ClientWindows) -> dict[str, float]:
    """Held-out errors on the test windows.

    Returns
    -------
    dict
        ``mse`` and ``mae`` on the scaled targets, ``mse-litres`` and
        ``mae-litres`` in litres/day, and ``wape`` (sum |error| / sum actual,
        in litres).
    """
    scaled = predict(model, windows.x_test)
    target = windows.y_test.astype(np.float64)
    litres_hat, litres = windows.to_litres(scaled), windows.to_litres(target)
    err = litres_hat - litres
    total = float(np.abs(litres).sum())
    return {
        "mse": float(np.mean((scaled - target) ** 2)),
        "mae": float(np.mean(np.abs(scaled - target))),
        "mse-litres": float(np.mean(err**2)),
        "mae-litres": float(np.mean(np.abs(err))),
        "wape": float(np.abs(err).sum() / total) if total > 0 else float("nan"),
    }
