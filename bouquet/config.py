"""The app's run configuration: one typed, validated object built in one place.

Every field of :class:`AppConfig` is a run-config key: the field name with
``_`` replaced by ``-`` (``num_server_rounds`` <-> ``num-server-rounds``).
Defaults here equal those in ``pyproject.toml``'s ``[tool.flwr.app.config]``
(a test checks it), so ``run_simulation()`` with an empty run config and
``flwr run .`` behave alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.sckm import LAYER_COMBINE
from bouquet.algorithms.selection import SELECTORS, Selector, make_selector
from bouquet.data.daiad import CleaningRules
from bouquet.data.images import VisionDataConfig
from bouquet.data.synthetic import SyntheticConfig
from bouquet.data.water import WaterDataConfig
from bouquet.strategies.selection import MODES
from bouquet.tasks.perfedavg import PerFedAvgSettings
from bouquet.tasks.vision import MODELS, VisionTrainSettings
from bouquet.tasks.water import TrainSettings

__all__ = ["STRATEGIES", "TASKS", "AppConfig", "ConfigError"]

#: Use cases: household water forecasting (HK paper) or image classification (SCKM paper).
TASKS = ("water", "vision")

#: Strategy names accepted by the ``strategy`` key.
STRATEGIES = ("fedavg", "fedprox", "hk-cosine", "hk-euclidean", "hk-cosine-bounded", "fixed-k-euclidean",
              "fixed-k-cosine", "perfedavg-fo", "perfedavg-hf")


class ConfigError(ValueError):
    """An unknown run-config key or an invalid value."""


@dataclass(frozen=True)
class AppConfig:
    """All run-config keys of the bouquet water app (kebab-case in TOML).

    Server: ``num-server-rounds`` (T), ``clients-per-round`` (S),
    ``fraction-evaluate`` (share of the nodes evaluated each round, a seeded
    draw), ``strategy``, ``seed``, ``results-dir``,
    ``run-name``, ``node-wait-seconds``, ``round-timeout`` (seconds the server
    waits for a round's replies; a node that has not answered by then is
    reported lost and the round goes on without it).
    Client training: ``local-epochs`` (E), ``learning-rate``, ``batch-size``,
    ``hidden-size``, ``num-layers``.
    Data: ``data-source``, ``data-path``, ``data-seed``,
    ``synthetic-households``, ``active-factor``, ``min-history-days``,
    ``lookback`` (L), ``train-fraction``, ``min-windows``, ``scaler``,
    ``max-flow-litres-per-hour``, ``max-spread-hours``, ``min-hours-per-day``.
    HK (``strategy = "hk-<geometry>"``): ``hk-tau``, ``hk-eps-l``, ``hk-eps-r``,
    ``hk-delta``, ``hk-s-max``, ``hk-coalition-tol``, ``hk-opinions``,
    ``hk-barycenter-weighting`` (see :class:`bouquet.algorithms.hk.HKParams`),
    ``hk-record-trajectories`` (write each round's opinion trajectories),
    ``hk-opinion-space`` (``weights`` as the paper, or ``updates``).
    Fixed-K (``strategy = "fixed-k-<geometry>"``): ``fixed-k`` (K).
    FedProx (``strategy = "fedprox"``): ``proximal-mu``.
    Per-FedAvg (``strategy = "perfedavg-fo" | "perfedavg-hf"``): ``perfedavg-alpha``,
    ``perfedavg-beta``, ``perfedavg-delta``.
    Task: ``task`` (``water`` or ``vision``).  Vision: ``vision-dataset``,
    ``vision-data-path``, ``vision-model``, ``vision-partitioner``,
    ``shards-per-client``, ``dirichlet-alpha``, ``local-batches``,
    ``vision-learning-rate``, ``vision-momentum`` (SGD; ``batch-size`` is shared),
    ``central-eval-size`` (test images per central evaluation: a seeded subset,
    0 = the whole test set).
    Client selection (any task, any strategy): ``selection`` (a name in
    :data:`bouquet.algorithms.selection.SELECTORS`; ``random`` is the seeded
    uniform draw), ``selection-mode`` (``query``/``piggyback``),
    ``sketch-fraction``, ``sketch-batch-size``, ``candidates-per-round``
    (0 = all connected), ``query-timeout``, ``max-sketch-age``,
    ``sckm-layer-combine``, ``sckm-min-clusters``, ``sckm-sample-size``,
    ``pow-d`` (0 = 2B), ``afl-alpha1``, ``afl-alpha2``, ``afl-alpha3``,
    ``fedcor-warmup``.
    """

    num_server_rounds: int = 20
    clients_per_round: int = 50
    fraction_evaluate: float = 1.0
    strategy: str = "hk-cosine"
    seed: int = 0
    results_dir: str = "results"
    run_name: str = ""
    node_wait_seconds: float = 30.0
    round_timeout: float = 3600.0
    local_epochs: int = 5
    learning_rate: float = 1e-3
    batch_size: int = 32
    hidden_size: int = 32
    num_layers: int = 1
    data_source: str = "synthetic"
    data_path: str = ""
    data_seed: int = 0
    synthetic_households: int = 1099
    active_factor: float = 1.6
    min_history_days: int = 730
    lookback: int = 12
    train_fraction: float = 0.8
    min_windows: int = 10
    scaler: str = "minmax"
    max_flow_litres_per_hour: float = 3125.0
    max_spread_hours: float = 6.0
    min_hours_per_day: int = 22
    hk_tau: float = 0.75
    hk_eps_l: float = -1.0
    hk_eps_r: float = 1.0
    hk_delta: float = 1e-6
    hk_s_max: int = 50
    hk_coalition_tol: float = 1e-6
    hk_opinions: str = "auto"
    hk_barycenter_weighting: str = "uniform"
    hk_record_trajectories: bool = False
    hk_opinion_space: str = "weights"
    fixed_k: int = 2
    proximal_mu: float = 0.01
    perfedavg_alpha: float = 0.01
    perfedavg_beta: float = 0.001
    perfedavg_delta: float = 0.001
    task: str = "water"
    vision_dataset: str = "digits"
    vision_data_path: str = ""
    vision_model: str = "cnn"
    vision_partitioner: str = "shards"
    shards_per_client: int = 2
    dirichlet_alpha: float = 0.5
    local_batches: int = 10
    vision_learning_rate: float = 0.1
    vision_momentum: float = 0.0
    central_eval_size: int = 0
    selection: str = "random"
    selection_mode: str = "query"
    sketch_fraction: float = 0.005
    sketch_batch_size: int = 32
    candidates_per_round: int = 0
    query_timeout: float = 600.0
    max_sketch_age: int = 5
    sckm_layer_combine: str = "normalized"
    sckm_min_clusters: int = 1
    sckm_sample_size: int = 1000
    pow_d: int = 0
    afl_alpha1: float = 0.75
    afl_alpha2: float = 0.01
    afl_alpha3: float = 0.1
    fedcor_warmup: int = 2

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.num_server_rounds < 1:
            raise ConfigError(f"num-server-rounds must be >= 1, got {self.num_server_rounds}")
        if self.clients_per_round < 1:
            raise ConfigError(f"clients-per-round must be >= 1, got {self.clients_per_round}")
        if not 0 <= self.fraction_evaluate <= 1:
            raise ConfigError(f"fraction-evaluate must be in [0, 1], got {self.fraction_evaluate}")
        if self.node_wait_seconds < 0:
            raise ConfigError(f"node-wait-seconds must be >= 0, got {self.node_wait_seconds}")
        if self.round_timeout <= 0:
            raise ConfigError(f"round-timeout must be > 0, got {self.round_timeout}")
        try:  # the nested configs validate their own ranges
            self.water_data(self.data_path or "given-per-node")  # deployment: each node names its file
            self.train_settings()
            if self.strategy.startswith("hk-"):
                self.hk_params()
            if self.strategy.startswith("perfedavg-"):
                self.perfedavg_settings()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if self.hk_opinion_space not in ("weights", "updates"):
            raise ConfigError(f"hk-opinion-space must be 'weights' or 'updates', got {self.hk_opinion_space!r}")
        if self.fixed_k < 1:
            raise ConfigError(f"fixed-k must be >= 1, got {self.fixed_k}")
        if self.proximal_mu < 0:
            raise ConfigError(f"proximal-mu must be >= 0, got {self.proximal_mu}")
        if self.hidden_size < 1 or self.num_layers < 1:
            raise ConfigError(f"hidden-size and num-layers must be >= 1, got {self.hidden_size}, {self.num_layers}")
        self._check_task_and_selection()

    def _check_task_and_selection(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.task == "vision":
            if self.strategy.startswith("perfedavg-"):
                raise ConfigError("Per-FedAvg is implemented for the water task only")
            if self.vision_model not in MODELS:
                raise ConfigError(f"vision-model must be one of {MODELS}, got {self.vision_model!r}")
        if self.selection not in SELECTORS:
            raise ConfigError(f"unknown selection {self.selection!r}; choose one of {', '.join(SELECTORS)}")
        if self.selection_mode not in MODES:
            raise ConfigError(f"selection-mode must be one of {MODES}, got {self.selection_mode!r}")
        if self.sckm_layer_combine not in LAYER_COMBINE:
            raise ConfigError(f"sckm-layer-combine must be one of {LAYER_COMBINE}, got {self.sckm_layer_combine!r}")
        if not 0 < self.sketch_fraction <= 1:
            raise ConfigError(f"sketch-fraction must be in (0, 1], got {self.sketch_fraction}")
        for key in ("sketch-batch-size", "sckm-min-clusters", "sckm-sample-size"):
            if getattr(self, key.replace("-", "_")) < 1:
                raise ConfigError(f"{key} must be >= 1")
        for key in ("candidates-per-round", "max-sketch-age", "pow-d", "fedcor-warmup", "central-eval-size"):
            if getattr(self, key.replace("-", "_")) < 0:
                raise ConfigError(f"{key} must be >= 0")
        if self.query_timeout <= 0:
            raise ConfigError(f"query-timeout must be > 0, got {self.query_timeout}")
        try:
            self.selector()
            if self.task == "vision":
                self.vision_data()
                self.vision_train_settings()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    @classmethod
    def keys(cls) -> list[str]:
        """All run-config keys, kebab-case."""
        return [f.name.replace("_", "-") for f in fields(cls)]

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], **overrides: Any) -> AppConfig:
        """Build from a Flower run config (kebab-case keys); missing keys take defaults.

        Raises
        ------
        ConfigError
            A key that is not a field, or a value of the wrong type or range.
        """
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in {**dict(run_config), **overrides}.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(f"unknown run-config key {key!r}; known keys: {', '.join(cls.keys())}")
            values[name] = _coerce(key, value, type(known[name].default))
        return cls(**values)

    def to_run_config(self) -> dict[str, Any]:
        """Kebab-case mapping (what the results folder records)."""
        return {k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items()}

    def water_data(self, data_path: str | None = None) -> WaterDataConfig:
        """The data pipeline's config; ``data_path`` (a node's own file) overrides ``data-path``."""
        return WaterDataConfig(
            source=self.data_source,
            path=self.data_path if data_path is None else data_path,
            synthetic=SyntheticConfig(n_households=self.synthetic_households, seed=self.data_seed),
            cleaning=CleaningRules(self.max_flow_litres_per_hour, self.max_spread_hours, self.min_hours_per_day),
            active_factor=self.active_factor,
            min_history_days=self.min_history_days,
            lookback=self.lookback,
            train_fraction=self.train_fraction,
            min_windows=self.min_windows,
            scaler=self.scaler,
        )

    def hk_params(self) -> HKParams:
        """HK parameters; the geometry is the part of ``strategy`` after ``hk-``."""
        return HKParams(geometry=self.strategy.removeprefix("hk-"), tau=self.hk_tau, eps_l=self.hk_eps_l,
                        eps_r=self.hk_eps_r, delta=self.hk_delta, s_max=self.hk_s_max,
                        coalition_tol=self.hk_coalition_tol, opinions=self.hk_opinions,
                        barycenter_weighting=self.hk_barycenter_weighting)

    def perfedavg_settings(self) -> PerFedAvgSettings:
        """Per-FedAvg settings; the variant is the part of ``strategy`` after ``perfedavg-``."""
        return PerFedAvgSettings(self.strategy.removeprefix("perfedavg-"), self.perfedavg_alpha,
                                 self.perfedavg_beta, self.perfedavg_delta)

    def vision_data(self) -> VisionDataConfig:
        """Image source and partition (``data-seed`` seeds the split)."""
        return VisionDataConfig(dataset=self.vision_dataset, path=self.vision_data_path,
                                partitioner=self.vision_partitioner, shards_per_client=self.shards_per_client,
                                dirichlet_alpha=self.dirichlet_alpha, seed=self.data_seed)

    def vision_train_settings(self) -> VisionTrainSettings:
        return VisionTrainSettings(self.local_batches, self.batch_size, self.vision_learning_rate,
                                   self.vision_momentum)

    def selector(self) -> Selector:
        """The client selector named by ``selection`` with its parameters."""
        params: dict[str, dict[str, Any]] = {
            "sckm-select": {"layer_combine": self.sckm_layer_combine},
            "sckm-cluster": {"layer_combine": self.sckm_layer_combine, "min_clusters": self.sckm_min_clusters,
                             "sample_size": self.sckm_sample_size},
            "power-of-choice": {"d": self.pow_d},
            "afl": {"alpha1": self.afl_alpha1, "alpha2": self.afl_alpha2, "alpha3": self.afl_alpha3},
            "fedcor": {"warmup": self.fedcor_warmup},
        }
        return make_selector(self.selection, **params.get(self.selection, {}))

    def train_settings(self) -> TrainSettings:
        return TrainSettings(self.local_epochs, self.learning_rate, self.batch_size)


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"run-config {key!r} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ConfigError(f"run-config {key!r} must be an integer, got {value!r}")
        return int(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"run-config {key!r} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"run-config {key!r} must be a string, got {value!r}")
    return value
