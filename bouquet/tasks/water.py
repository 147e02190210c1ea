"""LSTM forecaster of daily household water use: model, local training, evaluation.

Matches the paper's protocol (Section 6): Adam (lr 1e-3), batch 32, MSE loss,
E local epochs on the household's training windows.  The paper does not give
the LSTM size; ``hidden_size`` and ``num_layers`` are parameters (default one
layer of 32 units, 4,513 parameters).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bouquet.data.water import ClientWindows, WaterDataParams, load_pool, weekday_of, weekday_profile
from bouquet.tasks.base import Penalty, batch_indices, proximal_penalty
from bouquet.tasks.params import HOUSEHOLD_BLENDS, LSTMParams, PerFedAvgParams, PersonalParams, WaterTrainParams
from bouquet.tasks.perfedavg import personalize, train_perfedavg

__all__ = [
    "NAIVE_FORECASTS",
    "LSTMForecaster",
    "WaterTask",
    "WaterTrainParams",
    "choose_blend",
    "evaluate_windows",
    "household_blend",
    "naive_errors",
    "naive_forecasts",
    "naive_litres",
    "naive_metric",
    "node_windows",
    "predict",
    "proximal_penalty",
    "split_windows",
    "train_windows",
    "training_loss",
]


class LSTMForecaster(nn.Module):
    """LSTM over a (batch, lookback, input_size) window -> next-day value (batch,).

    Channel 0 of the window is the scaled use; ``baseline`` (``forecast-baseline``) is read from it, and
    ``weekday-mean`` / ``household`` also from the last channel (the household's weekday mean, the last
    profile input).  ``blend`` is the ``household`` baseline's share of the weekday mean (the rest is the
    window median); it is an attribute, not a weight: it is not in the state dict, so it never travels
    and no aggregation touches it (:func:`household_blend` chooses it per node).
    """

    #: ``household`` baseline: the weekday mean's share of the baseline (set per node).
    blend: float = 0.0

    def __init__(self, hidden_size: int = LSTMParams.hidden_size, num_layers: int = LSTMParams.num_layers,
                 baseline: str = LSTMParams.baseline, input_size: int = 1) -> None:
        super().__init__()
        LSTMParams(hidden_size, num_layers, baseline)  # validates
        if input_size < 1:
            raise ValueError(f"input_size must be >= 1, got {input_size}")
        self.baseline = baseline
        self.lstm = nn.LSTM(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, 1)
        if baseline != "none":  # starts as the naive forecaster (drawn first, so the LSTM's init is unchanged)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    @classmethod
    def from_params(cls, params: LSTMParams, input_size: int = 1) -> LSTMForecaster:
        """The forecaster ``params`` describe, over windows of ``input_size`` channels
        (:attr:`bouquet.data.water.WaterDataParams.input_channels`)."""
        return cls(params.hidden_size, params.num_layers, params.baseline, input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        y = self.head(out[:, -1, :]).squeeze(-1)
        if self.baseline == "window-mean":
            y = y + x[:, :, 0].mean(dim=1)
        elif self.baseline == "window-median":  # interpolated, as numpy.median (torch.median takes the lower)
            y = y + torch.quantile(x[:, :, 0], 0.5, dim=1)
        elif self.baseline == "weekday-mean":
            y = y + x[:, -1, -1]
        elif self.baseline == "household":
            y = y + (1 - self.blend) * torch.quantile(x[:, :, 0], 0.5, dim=1) + self.blend * x[:, -1, -1]
        return y


def choose_blend(median: np.ndarray, weekday: np.ndarray, actual: np.ndarray) -> float:
    """Of :data:`HOUSEHOLD_BLENDS` (the weekday mean's share beside the window median), the blend
    ``(1 - b) median + b weekday`` with the lowest MAE against ``actual`` (the first of equals)."""
    median, weekday, actual = (np.asarray(a, dtype=np.float64) for a in (median, weekday, actual))
    if not (len(median) == len(weekday) == len(actual) >= 1):
        raise ValueError(f"need as many forecasts as targets, at least one: {len(median)}, {len(weekday)}, "
                         f"{len(actual)}")
    errors = [float(np.mean(np.abs((1 - b) * median + b * weekday - actual))) for b in HOUSEHOLD_BLENDS]
    return HOUSEHOLD_BLENDS[int(np.argmin(errors))]


def household_blend(x: np.ndarray, y: np.ndarray) -> float:
    """The blend of ``forecast-baseline = "household"`` for one household: :func:`choose_blend` on windows
    ``x`` -> ``y`` (its validation windows), with the window median of channel 0 and the weekday mean of
    the last channel (the profile inputs).  Scaled or litres give the same choice (the scaler is affine and
    increasing), so it is the blend of the naive forecaster ``median-weekday blend`` too."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"need (n, lookback, channels) windows, got shape {x.shape}")
    return choose_blend(np.median(x[:, :, 0], axis=1), x[:, -1, -1], y)


def training_loss(settings: WaterTrainParams) -> nn.Module:
    """The loss ``settings.loss`` names (``forecast-loss``), on scaled targets."""
    if settings.loss == "l1":
        return nn.L1Loss()
    if settings.loss == "huber":
        return nn.HuberLoss(delta=settings.huber_delta)
    return nn.MSELoss()


def split_windows(windows: ClientWindows, part: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``(x, y)`` windows of ``part``: ``"test"``, or ``"validation"`` (a ValueError without a validation
    split)."""
    if part == "test":
        return windows.x_test, windows.y_test
    if part != "validation":
        raise ValueError(f"part must be 'test' or 'validation', got {part!r}")
    if not windows.has_validation:
        raise ValueError("these windows have no validation split (validation-fraction = 0)")
    return windows.x_val, windows.y_val


def train_windows(model: nn.Module, windows: ClientWindows, settings: WaterTrainParams,
                  rng: np.random.Generator, penalty: Penalty | None = None) -> float:
    """Run ``settings.epochs`` epochs of Adam on the training windows, in place, minimising ``settings.loss``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the shuffling order of every epoch.
    penalty : callable, optional
        Added to each batch's loss before the backward pass.

    Returns
    -------
    float
        Mean training loss (scaled units; MSE unless ``settings.loss`` says otherwise) over the last
        epoch's batches, weighted by batch size.
    """
    x = torch.from_numpy(windows.x_train)
    y = torch.from_numpy(windows.y_train)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    loss_fn = training_loss(settings)
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


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """Scaled one-step-ahead predictions for windows ``x`` (n, lookback, 1)."""
    model.eval()
    return model(torch.from_numpy(x)).numpy().astype(np.float64)


def evaluate_windows(model: nn.Module, windows: ClientWindows, part: str = "test") -> dict[str, float]:
    """Held-out errors on the test windows (or the validation windows, ``part = "validation"``).

    Returns
    -------
    dict
        ``mse`` and ``mae`` on the scaled targets, ``mse-litres`` and
        ``mae-litres`` in litres/day, and ``wape`` (sum |error| / sum actual,
        in litres).
    """
    x, y = split_windows(windows, part)
    scaled = predict(model, x)
    target = y.astype(np.float64)
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


#: The naive forecasters every water result is reported beside (no training, no federation).  The last one
#: exists only with a validation split: per household, the blend of window median and train-days weekday
#: mean that is best on its validation windows (:func:`choose_blend`; the ``household`` baseline untrained).
NAIVE_FORECASTS = ("last value", "same day last week", "window mean", "window median", "train-days mean",
                   "train-days weekday mean", "median-weekday blend")


def naive_forecasts(x: np.ndarray, train_mean: float | None = None) -> dict[str, np.ndarray]:
    """Next-day forecasts from the look-back windows alone (scaled units, like the model's).

    ``last value``: yesterday's use; ``same day last week``: the use 7 days before the target (needs a
    look-back of at least 7); ``window mean`` / ``window median``: the mean / median of the look-back
    (12 days by default; the median is the one MAE rewards); ``train-days mean``: the constant
    ``train_mean`` (the household's mean over its training targets), when given.  The scaler is affine
    and increasing, so these are the litre forecasts scaled.  Only channel 0 (the use) is read.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or x.shape[1] < 1:
        raise ValueError(f"windows must be (n, lookback, channels), got shape {x.shape}")
    use = x[:, :, 0]
    out = {"last value": use[:, -1], "window mean": use.mean(axis=1), "window median": np.median(use, axis=1)}
    if x.shape[1] >= 7:
        out["same day last week"] = use[:, -7]
    if train_mean is not None:
        out["train-days mean"] = np.full(len(x), float(train_mean))
    return out


def naive_litres(windows: ClientWindows, part: str = "test") -> dict[str, np.ndarray]:
    """Each :func:`naive_forecasts` of a household's test windows (or validation windows), in litres/day
    (train-days mean included), and, when the windows know their training days, ``train-days weekday
    mean``: the household's mean use over its training (fit) targets on the target's weekday
    (:func:`bouquet.data.water.weekday_profile`)."""
    x, _ = split_windows(windows, part)
    days = windows.test_days if part == "test" else windows.val_days
    train_mean = float(np.mean(windows.y_train, dtype=np.float64)) if len(windows.y_train) else None
    out = {name: windows.to_litres(forecast) for name, forecast in naive_forecasts(x, train_mean).items()}
    if windows.train_days is not None and len(windows.y_train):
        profile = weekday_profile(windows.y_train, windows.train_days)
        out["train-days weekday mean"] = windows.to_litres(profile[weekday_of(days)])
        if windows.has_validation:  # the blend is chosen on the validation windows, whichever part is scored
            chosen = choose_blend(np.median(windows.x_val[:, :, 0], axis=1), profile[weekday_of(windows.val_days)],
                                  windows.y_val)
            out["median-weekday blend"] = ((1 - chosen) * out["window median"]
                                           + chosen * out["train-days weekday mean"])
    return out


def naive_errors(windows: ClientWindows, part: str = "test") -> dict[str, float]:
    """Held-out MAE in litres/day of each :func:`naive_forecasts` on the test (or validation) windows."""
    litres = windows.to_litres(split_windows(windows, part)[1])
    return {name: float(np.mean(np.abs(forecast - litres))) for name, forecast in naive_litres(windows, part).items()}


def naive_metric(name: str, part: str = "test") -> str:
    """The MetricRecord key of a naive forecaster's MAE (``naive-window-mean`` for ``window mean``; on the
    validation windows ``naive-val-window-mean``)."""
    return ("naive-" if part == "test" else "naive-val-") + name.replace(" ", "-")


@functools.lru_cache(maxsize=8)
def node_windows(data: WaterDataParams, partition_id: int,
                 data_path: str | None) -> tuple[str, ClientWindows, str]:
    """Household id, windows and known group (household type, or "") of a node: ``partition_id`` of the
    pool, or the node's own file.

    ``data_path`` (deployment: the node's own file) overrides the run config's path; the active filter
    compares households with each other, which a node holding one household cannot do (the operator
    chose the household), so it is off there, and a file holding a single household is that node's
    household whatever its partition id.
    """
    if data_path is not None:
        data = dataclasses.replace(data, path=data_path, active_factor=0.0)
    pool = load_pool(data)
    index = 0 if data_path is not None and len(pool) == 1 else partition_id
    windows = pool.client(index, data)  # a clear error when index is outside the pool
    return pool.households[index].household_id, windows, pool.group_of(index)


@dataclass(frozen=True)
class WaterTask:
    """One household of the HK paper's task: its LSTM forecaster, trained and evaluated on its windows.

    Build it with :meth:`for_node`.  With ``perfedavg`` set, local training is Per-FedAvg's and
    evaluation first personalises the received model with one step (Fallah et al. 2020).  ``personal``
    adds the node-side personalisation parts (:class:`bouquet.tasks.params.PersonalParams`): fine-tuning
    before evaluation here, and Ditto's personal step (:meth:`train_personal`); the personal layers'
    bookkeeping and where personal state lives are the ClientApp's (:mod:`bouquet.personal_state`).
    """

    partition_id: int
    household: str
    windows: ClientWindows
    model: LSTMParams
    training: WaterTrainParams
    perfedavg: PerFedAvgParams | None = None
    group: str = ""
    personal: PersonalParams = dataclasses.field(default_factory=PersonalParams)

    @classmethod
    def for_node(cls, data: WaterDataParams, model: LSTMParams, training: WaterTrainParams,
                 perfedavg: PerFedAvgParams | None, partition_id: int, data_path: str | None,
                 personal: PersonalParams | None = None) -> WaterTask:
        household, windows, group = node_windows(data, partition_id, data_path)
        return cls(partition_id, household, windows, model, training, perfedavg, group,
                   personal if personal is not None else PersonalParams())

    @property
    def num_examples(self) -> int:
        return len(self.windows.y_train)

    @functools.cached_property
    def blend(self) -> float:
        """This household's ``household`` baseline blend, chosen on its validation windows
        (:func:`household_blend`); 0 (the window median) for the other baselines."""
        if self.model.baseline != "household":
            return 0.0
        x, y = split_windows(self.windows, "validation")  # a clear error without a validation split
        return household_blend(x, y)

    def new_model(self) -> nn.Module:
        model = LSTMForecaster.from_params(self.model, self.windows.x_train.shape[2])
        model.blend = self.blend
        return model

    def _loss_fn(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return training_loss(self.training)(model(batch[0]), batch[1])

    def training_batch(self, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        pick = batch_indices(len(self.windows.y_train), batch_size, rng)
        return torch.from_numpy(self.windows.x_train[pick]), torch.from_numpy(self.windows.y_train[pick])

    def train(self, model: nn.Module, rng: np.random.Generator, proximal_mu: float) -> float:
        w = self.windows
        if self.perfedavg is not None:
            return train_perfedavg(model, w.x_train, w.y_train, self.training.epochs, self.training.batch_size,
                                   self.perfedavg, rng, loss_fn=self._loss_fn)
        penalty = proximal_penalty(model, proximal_mu) if proximal_mu > 0 else None
        return train_windows(model, w, self.training, rng, penalty=penalty)

    def train_personal(self, personal: nn.Module, served: nn.Module, rng: np.random.Generator) -> float:
        """Ditto's personal step (Li et al. 2021, eq. 2): ``local-epochs`` epochs of the training loss plus
        ``ditto_lambda / 2 ||v - w||^2`` on ``personal`` (v, in place), ``w`` the ``served`` model's weights."""
        penalty = proximal_penalty(personal, self.personal.ditto_lambda, anchor=served)
        return train_windows(personal, self.windows, self.training, rng, penalty=penalty)

    def fine_tune(self, model: nn.Module, rng: np.random.Generator) -> None:
        """``personalize-epochs`` epochs of the training loss on the fit windows at
        ``personalize-learning-rate`` (in place; nothing when 0)."""
        p = self.personal
        if p.epochs > 0:
            settings = dataclasses.replace(self.training, epochs=p.epochs, learning_rate=p.learning_rate)
            train_windows(model, self.windows, settings, rng)

    def loss(self, model: nn.Module, examples: int, rng: np.random.Generator) -> tuple[float, int]:
        """Training loss (``forecast-loss``, scaled) of ``model`` on up to ``examples`` of the household's
        training windows."""
        w = self.windows
        pick = batch_indices(len(w.y_train), examples, rng)
        predicted, target = predict(model, w.x_train[pick]), w.y_train[pick].astype(np.float64)
        if self.training.loss == "mse":  # numpy, as before the loss was an option: the same numbers to the bit
            return float(np.mean((predicted - target) ** 2)), len(pick)
        return float(training_loss(self.training)(torch.from_numpy(predicted), torch.from_numpy(target))), len(pick)

    def evaluate(self, model: nn.Module, rng: np.random.Generator) -> dict[str, float]:
        """Held-out errors (:func:`evaluate_windows`) on the test windows, and with a validation split the
        same on the validation windows (``val-*``); Per-FedAvg personalises first with ``rng``'s batch, and
        ``personalize-epochs`` fine-tunes ``model`` first (in place, so :meth:`forecasts` uses it too)."""
        w = self.windows
        if self.perfedavg is not None:
            personalize(model, w.x_train, w.y_train, self.perfedavg.alpha, self.training.batch_size, rng,
                        loss_fn=self._loss_fn)
        self.fine_tune(model, rng)
        metrics = {**evaluate_windows(model, w), "num-examples": len(w.y_test)}
        if w.has_validation:
            metrics |= {f"val-{name}": value for name, value in evaluate_windows(model, w, "validation").items()}
            metrics["val-num-examples"] = len(w.y_val)
        return metrics

    def poisoned(self, attack: str, scale: float) -> WaterTask:
        """This household with every scaled training target moved by ``scale`` (``target-shift``); tests unchanged."""
        if attack != "target-shift":
            raise ValueError(f"the water task's data attack is 'target-shift', got {attack!r}")
        shifted = (self.windows.y_train + scale).astype(self.windows.y_train.dtype)
        return dataclasses.replace(self, windows=dataclasses.replace(self.windows, y_train=shifted))

    def naive(self) -> dict[str, float]:
        """Held-out MAE (litres/day) of each naive forecaster, keyed as metrics (:func:`naive_metric`), on the
        test windows and, with a validation split, on the validation windows."""
        parts = ("test", "validation") if self.windows.has_validation else ("test",)
        return {naive_metric(name, part): mae for part in parts for name, mae in naive_errors(self.windows, part).items()}

    def forecasts(self, model: nn.Module) -> dict[str, np.ndarray]:
        """Every test day's actual and predicted litres (days as int64 day numbers)."""
        w = self.windows
        return {"day": w.test_days.astype("datetime64[D]").astype(np.int64),
                "actual-litres": w.to_litres(w.y_test), "predicted-litres": w.to_litres(predict(model, w.x_test))}
