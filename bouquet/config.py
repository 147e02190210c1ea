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
from bouquet.data.daiad import CleaningRules
from bouquet.data.synthetic import SyntheticConfig
from bouquet.data.water import WaterDataConfig
from bouquet.tasks.perfedavg import PerFedAvgSettings
from bouquet.tasks.water import TrainSettings

__all__ = ["AppConfig", "ConfigError", "STRATEGIES"]

#: Strategy names accepted by the ``strategy`` key.
STRATEGIES = ("fedavg", "fedprox", "hk-cosine", "hk-euclidean", "hk-cosine-bounded", "fixed-k-euclidean",
              "fixed-k-cosine", "perfedavg-fo", "perfedavg-hf")


class ConfigError(ValueError):
    """An unknown run-config key or an invalid value."""


@dataclass(frozen=True)
class AppConfig:
    """All run-config keys of the bouquet water app (kebab-case in TOML).

    Server: ``num-server-rounds`` (T), ``clients-per-round`` (S),
    ``fraction-evaluate``, ``strategy``, ``seed``, ``results-dir``,
    ``run-name``, ``node-wait-seconds``.
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
    """

    num_server_rounds: int = 20
    clients_per_round: int = 50
    fraction_evaluate: float = 1.0
    strategy: str = "hk-cosine"
    seed: int = 0
    results_dir: str = "results"
    run_name: str = ""
    node_wait_seconds: float = 30.0
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
