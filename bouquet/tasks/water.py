"""LSTM forecaster of daily household water use: model, local training, evaluation.

Matches the paper's protocol (Section 6): Adam (lr 1e-3), batch 32, MSE loss,
E local epochs on the household's training windows.  The paper does not give
the LSTM size; ``hidden_size`` and ``num_layers`` are parameters (default one
layer of 32 units, 4,513 parameters).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bouquet.data.water import ClientWindows, WaterDataParams, load_pool, window_inputs
from bouquet.forecasting.combine import FallbackParams, best_baseline, choose_weight, combine, share_errors
from bouquet.forecasting.evaluation import mase_scale
from bouquet.forecasting.naive import NAIVE_FORECASTERS, NaiveParams, blend_weight, naive_forecasts
from bouquet.tasks.base import Penalty, batch_indices, proximal_penalty
from bouquet.tasks.params import HOUSEHOLD_BLENDS, LSTMParams, PerFedAvgParams, PersonalParams, WaterTrainParams
from bouquet.tasks.perfedavg import personalize, train_perfedavg

__all__ = [
    "NAIVE_FORECASTS",
    "Household",
    "LSTMForecaster",
    "Serving",
    "WaterTask",
    "WaterTrainParams",
    "choose_blend",
    "choose_serving",
    "errors",
    "evaluate_windows",
    "forecast_ahead",
    "household_blend",
    "lstm_step",
    "naive_errors",
    "naive_litres",
    "naive_metric",
    "node_windows",
    "part_days",
    "predict",
    "predict_litres",
    "proximal_penalty",
    "served_ahead",
    "split_windows",
    "train_pooled",
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
    the last channel (the profile inputs: every valid day before the target on its weekday).  Scaled or
    litres give the same choice (the scaler is affine and increasing), so it is the blend of the naive
    forecaster ``blend`` too (:func:`bouquet.forecasting.naive.blend_weight` on the same days)."""
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
    """The ``(x, y)`` windows of ``part``: ``"test"`` (:class:`TestPeriodLocked` where the test period is locked),
    or ``"validation"`` (a ValueError without a validation split)."""
    if part == "test":
        windows.require_test()
        return windows.x_test, windows.y_test
    if part != "validation":
        raise ValueError(f"part must be 'test' or 'validation', got {part!r}")
    if not windows.has_validation:
        raise ValueError("these windows have no validation split (validation-fraction = 0)")
    return windows.x_val, windows.y_val


def part_days(windows: ClientWindows, part: str) -> np.ndarray:
    """The target days of ``part``'s windows (``test`` or ``validation``)."""
    split_windows(windows, part)  # the same checks
    return windows.test_days if part == "test" else windows.val_days


def train_windows(model: nn.Module, windows: ClientWindows, settings: WaterTrainParams,
                  rng: np.random.Generator, penalty: Penalty | None = None,
                  after_epoch: Callable[[int], None] | None = None) -> float:
    """Run ``settings.epochs`` epochs of Adam on the training windows, in place, minimising ``settings.loss``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the shuffling order of every epoch.
    penalty : callable, optional
        Added to each batch's loss before the backward pass.
    after_epoch : callable, optional
        Called with the epoch's number (1, 2, ...) after each epoch (the fine-tuning's early stop reads the
        validation windows there).

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
    for epoch in range(settings.epochs):
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
        if after_epoch is not None:
            after_epoch(epoch + 1)
            model.train()
    return last


def train_pooled(model: nn.Module, tasks: list[WaterTask], settings: WaterTrainParams, rng: np.random.Generator
                 ) -> float:
    """The centralised reference: ``settings.epochs`` epochs of Adam on every household's fit windows shuffled
    together, each batch's windows read with their own household's blend (``forecast-baseline = "household"``),
    in place.  Returns the last epoch's mean loss."""
    x = torch.from_numpy(np.concatenate([t.windows.x_train for t in tasks]))
    y = torch.from_numpy(np.concatenate([t.windows.y_train for t in tasks]))
    blends = torch.from_numpy(np.concatenate([np.full(t.num_examples, t.blend, dtype=np.float32) for t in tasks]))
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    loss_fn = training_loss(settings)
    model.train()
    last = 0.0
    for _ in range(settings.epochs):
        order = torch.from_numpy(rng.permutation(len(y)))
        total = 0.0
        for start in range(0, len(y), settings.batch_size):
            batch = order[start:start + settings.batch_size]
            model.blend = blends[batch]  # a per-window blend: the pooled windows come from many households
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        last = total / len(y)
    model.blend = 0.0
    return last


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """Scaled one-step-ahead predictions for windows ``x`` (n, lookback, channels)."""
    model.eval()
    return model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy().astype(np.float64)


def predict_litres(model: nn.Module, windows: ClientWindows, x: np.ndarray) -> np.ndarray:
    """The model's forecasts of windows ``x`` in litres/day, clipped at 0 (no household uses negative water)."""
    return np.maximum(windows.to_litres(predict(model, x)), 0.0) if len(x) else np.zeros(0)


def errors(forecast: np.ndarray, actual: np.ndarray, windows: ClientWindows) -> dict[str, float]:
    """``mse`` and ``mae`` on the scaled values, ``mse-litres``, ``mae-litres`` and ``wape`` (sum |error| / sum
    actual) of ``forecast`` against ``actual`` (both litres/day)."""
    err = forecast - actual
    scaled = err / windows.scale
    total = float(np.abs(actual).sum())
    return {
        "mse": float(np.mean(scaled**2)),
        "mae": float(np.mean(np.abs(scaled))),
        "mse-litres": float(np.mean(err**2)),
        "mae-litres": float(np.mean(np.abs(err))),
        "wape": float(np.abs(err).sum() / total) if total > 0 else float("nan"),
    }


def evaluate_windows(model: nn.Module, windows: ClientWindows, part: str = "test") -> dict[str, float]:
    """Held-out errors (:func:`errors`) of the model's forecasts, clipped at 0 L/day, on the test windows (or the
    validation windows, ``part = "validation"``)."""
    x, y = split_windows(windows, part)
    return errors(predict_litres(model, windows, x), windows.to_litres(y), windows)


#: The naive forecasters every water result is reported beside (no training, no federation), each seeing
#: every valid day before the day it forecasts (:mod:`bouquet.forecasting.naive`).  ``blend`` exists only
#: with a validation split: per household, the blend of window median and weekday average that is best on its
#: validation days (the ``household`` baseline untrained).
NAIVE_FORECASTS = NAIVE_FORECASTERS


def naive_litres(windows: ClientWindows, part: str = "test") -> dict[str, np.ndarray]:
    """Each naive forecaster's forecasts of ``part``'s target days, in litres/day, from the household's series
    (every valid day before each day; :func:`bouquet.forecasting.naive.naive_forecasts` with the look-back as
    the window); the ``blend`` chosen on the validation days, whichever part is scored."""
    days = part_days(windows, part)
    series = windows.to_litres(windows.series)
    blend = None
    if windows.has_validation:
        blend = blend_weight(series, windows.day_index(windows.val_days), NaiveParams(window=windows.x_train.shape[1]))
    return naive_forecasts(series, windows.day_index(days), NaiveParams(window=windows.x_train.shape[1]), blend)


def naive_errors(windows: ClientWindows, part: str = "test") -> dict[str, float]:
    """Held-out MAE in litres/day of each naive forecaster (:func:`naive_litres`) on the test (or validation)
    windows."""
    litres = windows.to_litres(split_windows(windows, part)[1])
    return {name: float(np.mean(np.abs(forecast - litres))) for name, forecast in naive_litres(windows, part).items()}


def naive_metric(name: str, part: str = "test") -> str:
    """The MetricRecord key of a naive forecaster's MAE (``naive-window-median`` for ``window median``; on the
    validation windows ``naive-val-window-median``)."""
    return ("naive-" if part == "test" else "naive-val-") + name.replace(" ", "-")


@dataclass(frozen=True)
class Serving:
    """What a node serves (``fallback``): ``weight`` times its model's forecast plus ``1 - weight`` times its best
    naive forecaster's (``baseline``, chosen on its validation days), both clipped at 0 L/day.

    ``validation`` holds the validation MAE of the model, the baseline and the served combination (empty
    without validation days; the weight is then 1)."""

    baseline: str
    weight: float
    validation: dict[str, float]

    @property
    def served(self) -> str:
        """``model``, ``baseline`` or ``combined``: what the household is served."""
        return "model" if self.weight == 1 else "baseline" if self.weight == 0 else "combined"


def choose_serving(model_val: np.ndarray, naive_val: dict[str, np.ndarray], actual_val: np.ndarray,
                   fallback: FallbackParams) -> Serving:
    """The household's best naive forecaster on its validation days and the model's share the rule allows
    (:func:`bouquet.forecasting.combine.choose_weight`)."""
    baseline = best_baseline(naive_val, actual_val)
    weight = choose_weight(model_val, naive_val[baseline], actual_val, fallback)
    served = combine(model_val, naive_val[baseline], weight)
    return Serving(baseline, weight, {"model": float(np.mean(np.abs(model_val - actual_val))),
                                      "baseline": float(np.mean(np.abs(naive_val[baseline] - actual_val))),
                                      "served": float(np.mean(np.abs(served - actual_val)))})


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
    ``fallback`` says what the node serves (:class:`Serving`), ``data`` how its windows were made (the
    forecast of the days after its data rebuilds them).
    """

    partition_id: int
    household: str
    windows: ClientWindows
    model: LSTMParams
    training: WaterTrainParams
    perfedavg: PerFedAvgParams | None = None
    group: str = ""
    personal: PersonalParams = dataclasses.field(default_factory=PersonalParams)
    fallback: FallbackParams = dataclasses.field(default_factory=FallbackParams)
    data: WaterDataParams = dataclasses.field(default_factory=WaterDataParams)

    @classmethod
    def for_node(cls, data: WaterDataParams, model: LSTMParams, training: WaterTrainParams,
                 perfedavg: PerFedAvgParams | None, partition_id: int, data_path: str | None,
                 personal: PersonalParams | None = None, fallback: FallbackParams | None = None) -> WaterTask:
        household, windows, group = node_windows(data, partition_id, data_path)
        return cls(partition_id, household, windows, model, training, perfedavg, group,
                   personal if personal is not None else PersonalParams(),
                   fallback if fallback is not None else FallbackParams(), data)

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

    def fine_tune(self, model: nn.Module, rng: np.random.Generator) -> int:
        """``personalize-epochs`` epochs of the training loss on the fit windows at ``personalize-learning-rate``
        (in place; nothing when 0).  With ``personalize-early-stop`` and validation windows, the model of the
        epoch (0 to ``personalize-epochs``) with the lowest validation MAE is kept.  Returns the epochs kept."""
        p = self.personal
        if p.epochs <= 0:
            return 0
        settings = dataclasses.replace(self.training, epochs=p.epochs, learning_rate=p.learning_rate)
        if not (p.early_stop and self.windows.has_validation):
            train_windows(model, self.windows, settings, rng)
            return p.epochs
        best = {"epoch": 0, "mae": evaluate_windows(model, self.windows, "validation")["mae-litres"],
                "state": {k: v.clone() for k, v in model.state_dict().items()}}

        def keep_best(epoch: int) -> None:
            mae = evaluate_windows(model, self.windows, "validation")["mae-litres"]
            if mae < best["mae"]:
                best.update(epoch=epoch, mae=mae, state={k: v.clone() for k, v in model.state_dict().items()})

        train_windows(model, self.windows, settings, rng, after_epoch=keep_best)
        model.load_state_dict(best["state"])
        return int(best["epoch"])

    def loss(self, model: nn.Module, examples: int, rng: np.random.Generator) -> tuple[float, int]:
        """Training loss (``forecast-loss``, scaled) of ``model`` on up to ``examples`` of the household's
        training windows."""
        w = self.windows
        pick = batch_indices(len(w.y_train), examples, rng)
        predicted, target = predict(model, w.x_train[pick]), w.y_train[pick].astype(np.float64)
        if self.training.loss == "mse":  # numpy, as before the loss was an option: the same numbers to the bit
            return float(np.mean((predicted - target) ** 2)), len(pick)
        return float(training_loss(self.training)(torch.from_numpy(predicted), torch.from_numpy(target))), len(pick)

    def evaluate(self, model: nn.Module, rng: np.random.Generator, final: bool = False) -> dict[str, float]:
        """Held-out errors of ``model`` (Per-FedAvg personalises first with ``rng``'s batch, and
        ``personalize-epochs`` fine-tunes ``model`` first, in place, so :meth:`final_arrays` uses it too);
        :meth:`Household.metrics` says what is scored when."""
        return self.scorer.metrics(self._forecasts(model), final, self._prepare(model, rng))

    def share_errors(self, model: nn.Module, rng: np.random.Generator) -> dict[str, float]:
        """The served validation MAE of each pooled share (:meth:`Household.share_metrics`), after the same
        personalisation as :meth:`evaluate` (the same ``rng``: the same fine-tuned model)."""
        self._prepare(model, rng)
        return self.share_errors_of(model)

    def share_errors_of(self, model: nn.Module) -> dict[str, float]:
        """:meth:`share_errors` of a model already personalised (no second fine-tuning)."""
        return self.scorer.share_metrics(self._forecasts(model))

    def _prepare(self, model: nn.Module, rng: np.random.Generator) -> dict[str, float]:
        """Per-FedAvg's personalising step and the fine-tuning, in place; the final evaluation's extra entry."""
        w = self.windows
        if self.perfedavg is not None:
            personalize(model, w.x_train, w.y_train, self.perfedavg.alpha, self.training.batch_size, rng,
                        loss_fn=self._loss_fn)
        kept = self.fine_tune(model, rng)
        return {"personalize-epochs-kept": kept} if self.personal.epochs > 0 else {}

    @functools.cached_property
    def scorer(self) -> Household:
        """What the node serves and scores, whatever the forecaster (:class:`Household`)."""
        return Household(self.windows, self.fallback, self.data)

    def _forecasts(self, model: nn.Module) -> Callable[[str], np.ndarray]:
        w = self.windows
        return lambda part: predict_litres(model, w, split_windows(w, part)[0])

    def serving(self, model: nn.Module) -> Serving:
        """What this household is served (``fallback``), chosen on its validation days; the model alone where
        there are none (``fallback = "none"`` needs none)."""
        return self.scorer.serving(self._forecasts(model))

    def poisoned(self, attack: str, scale: float) -> WaterTask:
        """This household with every scaled training target moved by ``scale`` (``target-shift``); tests unchanged."""
        if attack != "target-shift":
            raise ValueError(f"the water task's data attack is 'target-shift', got {attack!r}")
        shifted = (self.windows.y_train + scale).astype(self.windows.y_train.dtype)
        return dataclasses.replace(self, windows=dataclasses.replace(self.windows, y_train=shifted))

    def naive(self) -> dict[str, float]:
        """Held-out MAE of each naive forecaster (:meth:`Household.naive`)."""
        return self.scorer.naive()

    def final_arrays(self, model: nn.Module, ahead: int = 7) -> dict[str, dict[str, np.ndarray]]:
        """What the final evaluation sends back beside its metrics (:meth:`Household.final_arrays`): the test
        days' forecasts, the forecast of the ``ahead`` days after the household's data (:func:`forecast_ahead`)
        and ``model``, the weights the node forecasts with, after its fine-tuning, for ``python -m
        bouquet.forecast``."""
        w = self.windows
        state = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        step = lstm_step(model, w.to_litres(w.series), w.first_day, (w.offset, w.scale), self.data)
        return self.scorer.final_arrays(self._forecasts(model), step, state, {"model-blend": self.blend}, ahead)

    @property
    def naive_blend(self) -> float | None:
        """The naive ``blend``'s weekday-average share, chosen on the validation days (None without them)."""
        return self.scorer.naive_blend

    def final_info(self, model: nn.Module) -> dict[str, str]:
        """The final evaluation's text entries: the household's baseline and what it is served."""
        return self.scorer.final_info(self._forecasts(model))


@dataclass(frozen=True)
class Household:
    """One household's scoring and serving, whatever forecasts it: what both water forecasters (the LSTM of
    :class:`WaterTask`, the trees of :class:`bouquet.tasks.trees.TreeWaterTask`) share.

    A forecaster is given as ``forecasts(part) -> litres`` (its forecasts of the ``validation`` or ``test``
    windows' target days, clipped at 0) and, for the days after the data, ``step(litres, t) -> litres`` (its
    forecast of day ``t`` from the series so far; NaN where it cannot read it).
    """

    windows: ClientWindows
    fallback: FallbackParams
    data: WaterDataParams

    def metrics(self, forecasts: Callable[[str], np.ndarray], final: bool,
                extra_final: dict[str, float] | None = None) -> dict[str, float]:
        """Held-out errors of the forecasts.

        The validation windows are scored every time (``val-*``).  The test windows are scored only in the
        final evaluation, or every time where there is no validation split (the paper's per-round curves), and
        never where the test period is locked.  The final evaluation adds ``extra_final``, the naive
        forecasters' MAE on the same days (``naive-*``, ``naive-val-*``) and what the node serves
        (:meth:`serving`): ``mae-litres`` is then the served forecast's and ``model-mae-litres`` the model's
        alone."""
        w = self.windows
        metrics: dict[str, float] = {}
        if w.has_validation:
            metrics |= {f"val-{name}": value for name, value in
                        errors(forecasts("validation"), w.to_litres(w.y_val), w).items()}
            metrics["val-num-examples"] = len(w.y_val)
        score_test = (final or not w.has_validation) and not w.test_locked
        if score_test:
            metrics |= {**errors(forecasts("test"), w.to_litres(w.y_test), w), "num-examples": len(w.y_test)}
        else:
            metrics["num-examples"] = len(w.y_val)
        if not final:
            return metrics
        metrics |= extra_final or {}
        metrics |= self.naive()
        serving = self.serving(forecasts)
        metrics |= {"served-model-share": serving.weight, "fell-back": float(serving.weight < 1)}
        if serving.validation:
            metrics |= {"val-model-mae-litres": serving.validation["model"],
                        "val-baseline-mae-litres": serving.validation["baseline"],
                        "val-mae-litres": serving.validation["served"]}
        if score_test:
            model_test = forecasts("test")
            actual = w.to_litres(w.y_test)
            metrics |= {f"model-{k}": v for k, v in errors(model_test, actual, w).items()}
            if serving.baseline:  # else (no validation days) the model alone is served: the metrics above
                baseline_test = naive_litres(w)[serving.baseline]
                metrics |= errors(combine(model_test, baseline_test, serving.weight), actual, w)
                metrics["baseline-mae-litres"] = float(np.mean(np.abs(baseline_test - actual)))
            metrics["mase-scale"] = mase_scale(w.series, int(w.day_index(w.test_days[:1])[0])) * w.scale
        return metrics

    def serving(self, forecasts: Callable[[str], np.ndarray]) -> Serving:
        """What this household is served (``fallback``), chosen on its validation days; the model alone where
        there are none (``fallback = "none"`` needs none)."""
        w = self.windows
        if not w.has_validation:
            if self.fallback.rule != "none":
                raise ValueError(f"fallback {self.fallback.rule!r} chooses on validation days; this household has none")
            return Serving("", 1.0, {})
        actual = w.to_litres(w.y_val)
        return choose_serving(forecasts("validation"), naive_litres(w, "validation"), actual, self.fallback)

    def share_metrics(self, forecasts: Callable[[str], np.ndarray]) -> dict[str, float]:
        """``val-share-mae-<i>``: the validation MAE of the model's share ``COMBINATION_WEIGHTS[i]`` with the
        household's best naive forecaster (what the server adds up to choose ``fallback = "pooled"``'s share)."""
        w = self.windows
        actual = w.to_litres(w.y_val)
        naive = naive_litres(w, "validation")
        errors = share_errors(forecasts("validation"), naive[best_baseline(naive, actual)], actual)
        return {f"val-share-mae-{i}": float(e) for i, e in enumerate(errors)}

    def naive(self) -> dict[str, float]:
        """Held-out MAE (litres/day) of each naive forecaster, keyed as metrics (:func:`naive_metric`), on the
        test windows (unless the test period is locked) and, with a validation split, on the validation
        windows."""
        w = self.windows
        parts = (() if w.test_locked else ("test",)) + (("validation",) if w.has_validation else ())
        return {naive_metric(name, part): mae for part in parts for name, mae in naive_errors(w, part).items()}

    def final_arrays(self, forecasts: Callable[[str], np.ndarray], step: Callable[[np.ndarray, int], float],
                     model: dict[str, np.ndarray], forecaster: dict[str, float], ahead: int = 7
                     ) -> dict[str, dict[str, np.ndarray]]:
        """What the final evaluation sends back beside its metrics: ``predictions`` (every test day's actual,
        served, model and baseline litres; none where the test period is locked), ``validation`` (the validation
        days' actual and model litres), ``ahead`` (the forecast of
        the ``ahead`` days after the household's data: :func:`served_ahead`), ``model`` (the forecaster's
        arrays) and ``forecaster`` (the scaler, the blend, the model's share and ``forecaster``'s entries)."""
        w = self.windows
        serving = self.serving(forecasts)
        out: dict[str, dict[str, np.ndarray]] = {}
        if not w.test_locked and len(w.y_test):
            model_test = forecasts("test")
            out["predictions"] = {"day": w.test_days.astype("datetime64[D]").astype(np.int64),
                                  "actual-litres": w.to_litres(w.y_test), "predicted-litres": model_test,
                                  "model-litres": model_test}
            if serving.baseline:
                baseline_test = naive_litres(w)[serving.baseline]
                out["predictions"] |= {"predicted-litres": combine(model_test, baseline_test, serving.weight),
                                       "baseline-litres": baseline_test}
        if w.has_validation:  # the model's validation forecasts: what a study's nested choice of the rule reads
            out["validation"] = {"day": w.val_days.astype("datetime64[D]").astype(np.int64),
                                 "actual-litres": w.to_litres(w.y_val), "model-litres": forecasts("validation")}
        blend = self.naive_blend
        out["ahead"] = served_ahead(step, w.to_litres(w.series), w.first_day, self.data.lookback, serving.baseline,
                                    serving.weight, blend, ahead)
        out["model"] = model
        out["forecaster"] = {"offset": np.array([w.offset]), "scale": np.array([w.scale]),
                             "blend": np.array([np.nan if blend is None else blend]),
                             "model-share": np.array([serving.weight]),
                             **{k: np.array([v]) for k, v in forecaster.items()}}
        return out

    @functools.cached_property
    def naive_blend(self) -> float | None:
        """The naive ``blend``'s weekday-average share, chosen on the validation days (None without them)."""
        w = self.windows
        if not w.has_validation:
            return None
        return blend_weight(w.to_litres(w.series), w.day_index(w.val_days), NaiveParams(window=w.x_train.shape[1]))

    def final_info(self, forecasts: Callable[[str], np.ndarray]) -> dict[str, str]:
        """The final evaluation's text entries: the household's baseline and what it is served."""
        serving = self.serving(forecasts)
        return {"baseline": serving.baseline, "served": serving.served}


def lstm_step(model: nn.Module, series: np.ndarray, first_day: np.datetime64, scaler: tuple[float, float],
              data: WaterDataParams) -> Callable[[np.ndarray, int], float]:
    """The LSTM's forecast of day ``t`` from the litres so far (:func:`served_ahead`'s ``step``): its inputs
    scaled by ``scaler`` = (offset, scale) and built as ``data`` says (:func:`bouquet.data.water.window_inputs`),
    clipped at 0; NaN (every day) where the last look-back days of ``series`` hold a missing day."""
    offset, scale = scaler
    litres = np.asarray(series, dtype=np.float64)
    end, lookback = len(litres), data.lookback
    readable = end >= lookback and bool(np.isfinite(litres[end - lookback:]).all())
    first = np.datetime64(first_day, "D")

    def step(so_far: np.ndarray, t: int) -> float:
        if not readable:
            return float("nan")
        x = window_inputs((so_far - offset) / scale, first, np.array([t]), data)
        return max(float(predict(model, x)[0]) * scale + offset, 0.0)

    return step


def forecast_ahead(model: nn.Module | None, series: np.ndarray, first_day: np.datetime64, scaler: tuple[float, float],
                   data: WaterDataParams, baseline: str, weight: float, blend: float | None, days: int = 7
                   ) -> dict[str, np.ndarray]:
    """The LSTM's :func:`served_ahead`: ``model`` reads its inputs scaled by ``scaler`` = (offset, scale) and built
    as ``data`` says (:func:`lstm_step`); with no ``model`` the baseline alone is served."""
    step = None if model is None else lstm_step(model, series, first_day, scaler, data)
    return served_ahead(step, series, first_day, data.lookback, baseline, weight, blend, days)


def served_ahead(step: Callable[[np.ndarray, int], float] | None, series: np.ndarray, first_day: np.datetime64,
                 window: int, baseline: str, weight: float, blend: float | None, days: int = 7
                 ) -> dict[str, np.ndarray]:
    """The forecasts of the ``days`` days after ``series`` (a household's litres per day from ``first_day``, NaN
    where missing), each from the one before: the first from the actuals (tomorrow's forecast), day ``h``
    reading the forecasts of days 1 .. h - 1 where its inputs reach past the data.

    The served forecast is ``weight`` times the model's (``step(litres so far, t)``, NaN where it cannot read
    them) plus ``1 - weight`` times the ``baseline`` naive forecaster's (``blend``: its blend share; ``window``:
    the naive window), clipped at 0 (:class:`Serving`).  Where the model gives no forecast the baseline alone is
    served; with no ``step`` (or no ``baseline``) the other alone is.

    Returns
    -------
    dict
        ``day`` (int64 day numbers), ``horizon`` (1 .. days), ``forecast-litres`` (served), ``model-litres``,
        ``baseline-litres`` (NaN where not computed), ``model-share`` (the share used for that day).
    """
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    litres = np.asarray(series, dtype=np.float64).copy()
    first = np.datetime64(first_day, "D")
    end = len(litres)
    params = NaiveParams(window=window)
    out: dict[str, list] = {"day": [], "horizon": [], "forecast-litres": [], "model-litres": [],
                            "baseline-litres": [], "model-share": []}
    for h in range(1, days + 1):
        t = end + h - 1
        base = float(naive_forecasts(litres, np.array([t]), params, blend)[baseline][0]) if baseline else float("nan")
        own = float("nan") if step is None else float(step(litres, t))
        readable = bool(np.isfinite(own))
        share = weight if readable and baseline else (1.0 if readable else 0.0)
        served = float(combine([own], [base], share)[0])
        litres = np.append(litres, served)
        out["day"].append(int((first + t).astype(np.int64)))
        out["horizon"].append(h)
        out["forecast-litres"].append(served)
        out["model-litres"].append(own)
        out["baseline-litres"].append(base)
        out["model-share"].append(share)
    return {k: np.asarray(v, dtype=np.int64 if k in ("day", "horizon") else np.float64) for k, v in out.items()}
