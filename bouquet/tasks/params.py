"""Frozen params classes of the client tasks (no torch import: the app's config reads them).

Water (the HK paper's LSTM): :class:`LSTMParams`, :class:`WaterTrainParams`, :class:`PerFedAvgParams`.
Vision (the SCKM paper's image classifiers): :class:`VisionModelParams`, :class:`VisionTrainParams`,
:class:`CentralEvalParams` (the server's test-set scoring).  The batch size is one run-config key for
both tasks, so both classes take their default from :data:`DEFAULT_BATCH_SIZE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from bouquet.forecasting.naive import BLEND_WEIGHTS
from bouquet.params import RunConfigKeys, require

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEVICES",
    "EVALUATIONS",
    "FORECAST_BASELINES",
    "FORECAST_LOSSES",
    "FORECAST_MODELS",
    "HOUSEHOLD_BLENDS",
    "MODELS",
    "PERFEDAVG_VARIANTS",
    "PERSONAL_LAYERS",
    "PROFILE_BASELINES",
    "CentralEvalParams",
    "ForecastModelParams",
    "LSTMParams",
    "PerFedAvgParams",
    "PersonalParams",
    "VisionModelParams",
    "VisionTrainParams",
    "WaterTrainParams",
]

#: Mini-batch size of local training (the HK paper's Table 3; the ``batch-size`` key of both tasks).
DEFAULT_BATCH_SIZE = 32
#: Image classifiers of the vision task.
MODELS = ("cnn", "cnn-gn", "vgg16", "vgg16-bn")
#: Where the vision task's models compute (``vision-device``; also ``cuda:N``).
DEVICES = ("cpu", "cuda", "auto")
#: What the water forecaster's output is added to (``LSTMParams.baseline``).
FORECAST_BASELINES = ("none", "window-mean", "window-median", "weekday-mean", "household")
#: Baselines that read the household profile inputs (``household-inputs = "profile"``).
PROFILE_BASELINES = ("weekday-mean", "household")
#: The blends of window median (0) and weekday mean (1) ``forecast-baseline = "household"`` chooses from.
HOUSEHOLD_BLENDS = BLEND_WEIGHTS
#: Layers a node keeps to itself (``personal-layers``): none, or the output layer.
PERSONAL_LAYERS = ("none", "head")
#: Training losses of the water forecaster (``WaterTrainParams.loss``); the paper's is ``mse``.
FORECAST_LOSSES = ("mse", "l1", "huber")
#: The water task's forecasters (``forecast-model``).
FORECAST_MODELS = ("lstm", "trees")
#: Per-FedAvg's two variants: first-order and Hessian-free.
PERFEDAVG_VARIANTS = ("fo", "hf")


@dataclass(frozen=True)
class LSTMParams:
    """Size of the water forecaster (the paper gives none; one layer of 32 units has 4,513 parameters).

    Parameters
    ----------
    hidden_size : int, default 32
        The LSTM's hidden units (the paper: 32).
    num_layers : int, default 1
        Stacked LSTM layers (the paper: 1).
    baseline : {"none", "window-mean", "window-median", "weekday-mean", "household"}, default "none"
        What the network's output is added to (``forecast-baseline``).  ``none`` is the paper's: the
        output is the forecast.  ``window-mean`` / ``window-median``: the output is the deviation from
        the mean / median of the look-back window's use, and the output layer starts at zero, so an
        untrained model is that naive forecaster and training can only learn what it misses.
        ``weekday-mean``: the deviation from the household's mean use on the target's weekday over its
        fit days (the last profile input, so it needs ``household-inputs = "profile"``).  ``household``:
        from the blend of window median and weekday mean (:data:`HOUSEHOLD_BLENDS`: either one, or their
        average) that has the lowest MAE on the household's own validation windows (it needs
        ``validation-fraction`` > 0 and the profile inputs); each node makes that choice itself, and the
        blend is not a weight of the model, so it never travels.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"baseline": "forecast-baseline"})

    hidden_size: int = 32
    num_layers: int = 1
    baseline: str = "none"

    def __post_init__(self) -> None:
        require(self.hidden_size >= 1, "hidden_size", f"hidden-size must be >= 1, got {self.hidden_size}")
        require(self.num_layers >= 1, "num_layers", f"num-layers must be >= 1, got {self.num_layers}")
        require(self.baseline in FORECAST_BASELINES, "baseline",
                f"forecast-baseline must be one of {', '.join(FORECAST_BASELINES)}, got {self.baseline!r}")


@dataclass(frozen=True)
class ForecastModelParams:
    """Which forecaster the water task trains.

    Parameters
    ----------
    model : {"lstm", "trees"}, default "lstm"
        ``forecast-model``.  ``lstm`` is the HK paper's: an LSTM trained in rounds by the ``strategy``
        (``local-epochs``, ``learning-rate``, ...).  ``trees``: gradient-boosted trees grown from the
        households' summed gradient histograms, one level of every open tree node per message exchange, the
        same trees a fit on the pooled rows grows (``tree-*`` keys; the strategy's keys do not apply).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"model": "forecast-model"})

    model: str = "lstm"

    def __post_init__(self) -> None:
        require(self.model in FORECAST_MODELS, "model",
                f"forecast-model must be one of {', '.join(FORECAST_MODELS)}, got {self.model!r}")

    @property
    def trees(self) -> bool:
        """Whether the forecaster is the federated trees (trained by their own exchanges, not by rounds)."""
        return self.model == "trees"


@dataclass(frozen=True)
class WaterTrainParams:
    """Local training of the water task (paper Table 3): E epochs of Adam on the household's windows.

    Parameters
    ----------
    epochs : int, default 5
        E, the local epochs per round.
    learning_rate : float, default 1e-3
        Adam's step size (the paper: 1e-3).
    batch_size : int, default 32
        Windows per mini-batch (the paper: 32).
    loss : {"mse", "l1", "huber"}, default "mse"
        The training loss on scaled targets (``forecast-loss``).  ``mse`` is the paper's; ``l1`` fits the
        conditional median, which is what the reported MAE rewards; ``huber`` is quadratic within
        ``huber_delta`` of the target and linear beyond.
    huber_delta : float, default 0.1
        Huber's threshold in scaled units (``forecast-huber-delta``; min-max scaling puts a household's
        training range in [0, 1]).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"epochs": "local-epochs", "loss": "forecast-loss", "huber_delta": "forecast-huber-delta"},
    )

    epochs: int = 5
    learning_rate: float = 1e-3
    batch_size: int = DEFAULT_BATCH_SIZE
    loss: str = "mse"
    huber_delta: float = 0.1

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "epochs", f"local epochs must be >= 1, got {self.epochs}")
        require(self.learning_rate > 0, "learning_rate", f"learning rate must be > 0, got {self.learning_rate}")
        require(self.batch_size >= 1, "batch_size", f"batch size must be >= 1, got {self.batch_size}")
        require(self.loss in FORECAST_LOSSES, "loss",
                f"forecast-loss must be one of {', '.join(FORECAST_LOSSES)}, got {self.loss!r}")
        require(self.huber_delta > 0, "huber_delta", f"forecast-huber-delta must be > 0, got {self.huber_delta}")


@dataclass(frozen=True)
class PersonalParams:
    """Personalisation on the node, on top of any aggregation (the water task).

    Parameters
    ----------
    epochs : int, default 0
        ``personalize-epochs``: before it evaluates and forecasts, a node fine-tunes the model it is served
        (or its personal model) for this many epochs of its training loss on its own fit windows, from a
        fresh Adam; 0 = no fine-tuning (the paper).  The fine-tuned model is used for that evaluation
        only; it is never sent back.
    learning_rate : float, default 1e-3
        ``personalize-learning-rate``: Adam's learning rate of that fine-tuning.
    layers : {"none", "head"}, default "none"
        ``personal-layers``.  ``head`` keeps the output layer on the node (FedPer, Arivazhagan et al.
        2019): the node trains the whole model as usual, keeps the head it trained, and replies with the
        head it was sent, so the aggregate carries the federated body and the initial head; it evaluates
        with its own head (the served one until it has trained once).
    ditto_lambda : float, default 0.0
        ``ditto-lambda``: Ditto (Li et al. 2021).  > 0: besides the federated update, each trained node
        trains a personal model ``v`` for ``local-epochs`` epochs on ``loss(v) + lambda / 2 ||v - w||^2``,
        ``w`` the model it was served (eq. 2 of the paper), and evaluates with ``v``.  0 = off.
    early_stop : bool, default False
        ``personalize-early-stop``: with validation windows, the fine-tuning keeps the epoch (0 to ``epochs``)
        whose model has the lowest MAE on the node's validation windows: ``epochs`` is then a ceiling, and a
        household whose validation days say fine-tuning does not help keeps the served model.
    state_dir : str, default ""
        ``personal-state-dir``: where nodes save their personal state (personal layers, Ditto's model)
        between messages, for a node that restarts and for a resumed run; a SuperNode's own
        ``--node-config "personal-state-dir=..."`` wins.  Empty: ``$BOUQUET_CACHE_DIR/personal``
        (``~/.cache/bouquet/personal``).  See :mod:`bouquet.personal_state`.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"epochs": "personalize-epochs", "learning_rate": "personalize-learning-rate",
                "layers": "personal-layers", "ditto_lambda": "ditto-lambda", "early_stop": "personalize-early-stop",
                "state_dir": "personal-state-dir"},
    )

    epochs: int = 0
    learning_rate: float = 1e-3
    layers: str = "none"
    ditto_lambda: float = 0.0
    early_stop: bool = False
    state_dir: str = ""

    def __post_init__(self) -> None:
        require(self.epochs >= 0, "epochs", f"personalize-epochs must be >= 0, got {self.epochs}")
        require(self.learning_rate > 0, "learning_rate",
                f"personalize-learning-rate must be > 0, got {self.learning_rate}")
        require(self.layers in PERSONAL_LAYERS, "layers",
                f"personal-layers must be one of {', '.join(PERSONAL_LAYERS)}, got {self.layers!r}")
        require(self.ditto_lambda >= 0, "ditto_lambda", f"ditto-lambda must be >= 0, got {self.ditto_lambda}")
        require(not (self.ditto_lambda > 0 and self.layers != "none"), "ditto_lambda",
                "ditto-lambda and personal-layers both make a personal model: choose one")

    @property
    def active(self) -> bool:
        """Whether any personalisation is on."""
        return self.epochs > 0 or self.stateful

    @property
    def stateful(self) -> bool:
        """Whether nodes keep personal state between rounds (personal layers or Ditto's model)."""
        return self.layers != "none" or self.ditto_lambda > 0


@dataclass(frozen=True)
class PerFedAvgParams:
    """Per-FedAvg hyper-parameters (Fallah, Mokhtari, Ozdaglar 2020).

    Parameters
    ----------
    variant : {"fo", "hf"}, default "fo"
        First-order or Hessian-free.
    alpha : float, default 0.01
        Inner (personalisation) step size.
    beta : float, default 0.001
        Outer (meta) step size.
    delta : float, default 0.001
        Finite-difference step of the HF Hessian-vector product.
    meta_optimizer : {"sgd", "adam"}, default "sgd"
        How the meta gradient moves the model (``perfedavg-meta-optimizer``): ``sgd`` is Fallah et al.'s
        plain step ``w - beta g``; ``adam`` feeds ``g`` to Adam with learning rate ``beta`` (fresh each
        round, as the other methods' local Adam), the optimizer the HK paper says all its methods share.
        With ``sgd`` and beta 0.001 the LSTM barely leaves its initialisation in 10 rounds (one DAIAD
        household's mean scaled forecast moves from -0.029 to -0.016 while its targets average 0.23).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="perfedavg-", skip=("variant",))

    variant: str = "fo"
    alpha: float = 0.01
    beta: float = 0.001
    delta: float = 0.001
    meta_optimizer: str = "sgd"

    def __post_init__(self) -> None:
        require(self.variant in PERFEDAVG_VARIANTS, "variant",
                f"Per-FedAvg variant must be 'fo' or 'hf', got {self.variant!r}")
        for name in ("alpha", "beta", "delta"):
            require(getattr(self, name) > 0, name, f"alpha, beta and delta must be > 0, got {self}")
        require(self.meta_optimizer in ("sgd", "adam"), "meta_optimizer",
                f"perfedavg-meta-optimizer must be 'sgd' or 'adam', got {self.meta_optimizer!r}")


@dataclass(frozen=True)
class VisionModelParams:
    """Which image classifier the vision task trains.

    Parameters
    ----------
    name : {"cnn", "cnn-gn", "vgg16", "vgg16-bn"}, default "cnn"
        A small CPU-friendly CNN (two blocks, or three with GroupNorm), or the paper's CIFAR-style VGG-16
        (32 x 32 images), without or with batch norm.
    device : {"cpu", "cuda", "cuda:N", "auto"}, default "cpu"
        Where each node (training, sketches, losses) and the server (central evaluation) run the model
        (``vision-device``); ``auto`` takes CUDA where torch sees a device, else the CPU.  Models travel
        as numpy arrays either way.  In Flower's simulation a node sees a GPU only when its Ray actor
        holds one (``client-resources-num-gpus``; ``python -m bouquet.launch --gpus-per-client``).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"name": "vision-model", "device": "vision-device"})

    name: str = "cnn"
    device: str = "cpu"

    def __post_init__(self) -> None:
        require(self.name in MODELS, "name", f"vision-model must be one of {MODELS}, got {self.name!r}")
        require(self.device in DEVICES or re.fullmatch(r"cuda:\d+", self.device) is not None, "device",
                f"vision-device must be one of {DEVICES} or cuda:N, got {self.device!r}")


@dataclass(frozen=True)
class VisionTrainParams:
    """Local training of the vision task: ``local_batches`` SGD steps of ``batch_size`` at ``learning_rate``.

    Parameters
    ----------
    local_batches : int, default 10
        Mini-batches per round (the SCKM paper: a fixed number of local steps).
    batch_size : int, default 32
        Images per mini-batch.
    learning_rate : float, default 0.1
        SGD's step size.
    momentum : float, default 0.0
        SGD's momentum.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"learning_rate": "vision-learning-rate", "momentum": "vision-momentum"},
    )

    local_batches: int = 10
    batch_size: int = DEFAULT_BATCH_SIZE
    learning_rate: float = 0.1
    momentum: float = 0.0

    def __post_init__(self) -> None:
        require(self.local_batches >= 1, "local_batches", f"local-batches must be >= 1, got {self.local_batches}")
        require(self.batch_size >= 1, "batch_size", f"batch-size must be >= 1, got {self.batch_size}")
        require(self.learning_rate > 0, "learning_rate", f"need learning-rate > 0, got {self.learning_rate}")
        require(0 <= self.momentum < 1, "momentum", f"need 0 <= momentum < 1, got {self.momentum}")


#: Where the vision task's models are scored.
EVALUATIONS = ("central", "clients", "both")


@dataclass(frozen=True)
class CentralEvalParams:
    """Where the vision task's models are scored: on the server's test set, on the clients, or both.

    Parameters
    ----------
    size : int, default 0
        Test images per central evaluation, a seeded subset; 0 scores the whole test set.
    mode : {"central", "clients", "both"}, default "central"
        ``central``: the server scores the global model each round (the SCKM study).  ``clients``: each
        evaluated client scores the model it is served on its own test images
        (``vision-client-test-size``; the clustered-FL benchmarks, where clients hold different models).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"size": "central-eval-size", "mode": "vision-evaluation"},
    )

    size: int = 0
    mode: str = "central"

    def __post_init__(self) -> None:
        require(self.size >= 0, "size", f"central-eval-size must be >= 0, got {self.size}")
        require(self.mode in EVALUATIONS, "mode", f"vision-evaluation must be one of {EVALUATIONS}, got {self.mode!r}")
