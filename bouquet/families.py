"""The strategy families: one table that says what each ``strategy`` name builds and allows.

A ``strategy`` name is a family and, for some families, a variant (``hk-cosine`` is family ``hk``,
variant ``cosine``).  Each :class:`Family` declares, in one row of :data:`FAMILIES`:

* its variants and, where the variant is a geometry, the config section it sets (``geometry_section``);
* its traits, which the run config's cross-section checks read instead of comparing names (it forms
  coalitions; it serves clusters; it draws its own clients; ...);
* its own checks (``check``: IFCA's ``ifca-k`` against the clients per round, a robust rule's number of
  replies, ...);
* how it builds its parts: the aggregator, the model store, its own sampler, its train-config entries and
  its initial cluster models (``aggregator``, ``models``, ``sampler``, ``train_entries``,
  ``initial_models``).

This module is the only place that names a family: the config, the ServerApp and the ClientApp ask the
:class:`Family` of the parsed strategy (``AppConfig.family``).  The builders import the Flower parts when
they are called, so that reading a config still loads neither torch nor flwr.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from bouquet.algorithms.clustered import CFLParams, IFCAParams, ifca_budget_problem
from bouquet.algorithms.coalitions_fixed_k import FIXED_K_GEOMETRIES, FixedKParams
from bouquet.algorithms.hk import GEOMETRIES as HK_GEOMETRIES
from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.memory import MemoryParams
from bouquet.params import ParamError
from bouquet.strategies.params import (
    ROBUST_RULES,
    CoalitionParams,
    ModelStoreParams,
    ProximalParams,
    RobustRuleParams,
    SamplingParams,
    SelectionParams,
)
from bouquet.tasks.params import PERFEDAVG_VARIANTS

if TYPE_CHECKING:  # the parts import flwr; the builders import them when called
    from flwr.app import ArrayRecord

    from bouquet.strategies.aggregation import Aggregator
    from bouquet.strategies.models import ModelStore
    from bouquet.strategies.sampling import Sampler

__all__ = ["FAMILIES", "STRATEGIES", "Family", "FamilyConfig", "FamilyError", "StrategySpec", "family_names"]


class FamilyConfig(Protocol):
    """What a family's checks and builders read of a run config: its sections for the strategies
    (:class:`bouquet.config.AppConfig` has them; the config reads this table, so the table does not read the
    config's module)."""

    hk: HKParams | None
    coalitions: CoalitionParams
    memory: MemoryParams
    fixed_k: FixedKParams
    store: ModelStoreParams
    sampling: SamplingParams
    selection: SelectionParams
    ifca: IFCAParams
    cfl: CFLParams
    robust: RobustRuleParams
    proximal: ProximalParams


class FamilyError(ValueError):
    """A run config that a strategy family cannot run (raised by a family's check; the config re-raises it
    as a ``ConfigError``)."""


def _no_check(config: FamilyConfig) -> None:
    return None


def _weighted_mean(config: FamilyConfig) -> Aggregator:
    from bouquet.strategies.aggregation import WeightedMean

    return WeightedMean()


def _shared_or_assigned(config: FamilyConfig, cluster_models: list[ArrayRecord] | None) -> ModelStore:
    """One shared model, or each node the model of its coalition (``coalition-models = "personal"``)."""
    from bouquet.strategies.models import model_store

    return model_store(config.store)


def _assigned(config: FamilyConfig, cluster_models: list[ArrayRecord] | None) -> ModelStore:
    from bouquet.strategies.models import AssignedModels

    return AssignedModels()


def _no_initial_models(config: FamilyConfig, new_model: Callable[[], Any]) -> list[ArrayRecord] | None:
    return None


def _no_entries(config: FamilyConfig) -> tuple[Any, ...]:
    return ()


@dataclass(frozen=True)
class Family:
    """One strategy family: its names, traits, checks and builders (see the module's docstring).

    Parameters
    ----------
    name : str
        The family, the ``strategy`` name's first part.
    label : str
        How messages name it.
    variants : tuple of str
        The names after ``name-`` (empty: the family's name alone is the strategy).
    geometry_section : str
        The config section whose ``geometry`` the variant sets (``""``: none).
    exclusive_section : bool
        ``geometry_section`` is built only for this family (HK's tau is validated by its geometry).
    coalitions : bool
        Its aggregation forms coalitions: ``coalition-models``, coalition memory and the robust coalition
        options apply.
    opinions : bool
        It reads HK's opinions: ``hk-opinion-arrays`` and recorded trajectories apply.
    clusters : bool
        It serves each client its cluster's (or its own) model whatever ``coalition-models`` says, so it has
        no shared model for a server optimiser.
    all_personal : bool
        Every client keeps its own model (stateful personalisation has nothing to add).
    draws_own_clients : bool
        It samples the clients itself (``selection`` must be ``random``).
    robust : bool
        One of Flower's robust rules (the ``robust-*`` keys apply).
    meta_learning : bool
        It personalises the served model on the clients itself (Per-FedAvg's client step): it runs on the
        tasks whose row has ``meta_learning`` (:mod:`bouquet.tasks.registry`).
    check, aggregator, models, sampler, train_entries, initial_models : callable
        Its own checks (raise :class:`FamilyError` naming the key) and its builders.
    """

    name: str
    label: str
    variants: tuple[str, ...] = ()
    geometry_section: str = ""
    exclusive_section: bool = False
    coalitions: bool = False
    opinions: bool = False
    clusters: bool = False
    all_personal: bool = False
    draws_own_clients: bool = False
    robust: bool = False
    meta_learning: bool = False
    check: Callable[[FamilyConfig], None] = _no_check
    aggregator: Callable[[FamilyConfig], Aggregator] = _weighted_mean
    models: Callable[[FamilyConfig, list[ArrayRecord] | None], ModelStore] = _shared_or_assigned
    sampler: Callable[[FamilyConfig, SamplingParams], Sampler] | None = None
    train_entries: Callable[[FamilyConfig], tuple[Any, ...]] = _no_entries
    initial_models: Callable[[FamilyConfig, Callable[[], Any]], list[ArrayRecord] | None] = _no_initial_models

    @property
    def strategies(self) -> tuple[str, ...]:
        """The ``strategy`` names of this family."""
        return tuple(f"{self.name}-{v}" for v in self.variants) if self.variants else (self.name,)

    @property
    def pattern(self) -> str:
        """How messages write the family's names (``hk-*``, ``fedavg``)."""
        return f"{self.name}-*" if self.variants else self.name


# ---------------------------------------------------------------- HK and fixed-K
def _hk_aggregator(config: FamilyConfig) -> Aggregator:
    from bouquet.strategies.aggregation import hk_aggregator

    return hk_aggregator(config.hk, config.coalitions, config.memory)


def _fixed_k_aggregator(config: FamilyConfig) -> Aggregator:
    from bouquet.strategies.aggregation import fixed_k_aggregator

    return fixed_k_aggregator(config.fixed_k, config.coalitions, config.memory)


def _fixed_k_check(config: FamilyConfig) -> None:
    conflict = config.memory.rule_conflict("fixed-K", has_tau=False, sets_tau=False)
    if conflict:
        raise FamilyError(f"run-config 'coalition-memory-tau': {conflict}")


# ---------------------------------------------------------------- clustered
def _ifca_check(config: FamilyConfig) -> None:
    problem = ifca_budget_problem(config.ifca.k, config.sampling.clients_per_round)
    if problem:
        raise FamilyError(f"run-config 'ifca-k': {problem} (clients-per-round)")


def _ifca_sampler(config: FamilyConfig, sampling: SamplingParams) -> Sampler:
    from bouquet.strategies.clustered import IFCASampler

    return IFCASampler(config.ifca, sampling, config.selection.query_timeout)


def _ifca_aggregator(config: FamilyConfig) -> Aggregator:
    from bouquet.strategies.clustered import ClusterMeans

    return ClusterMeans()


def _ifca_models(config: FamilyConfig, cluster_models: list[ArrayRecord] | None) -> ModelStore:
    from bouquet.strategies.clustered import ifca_models

    return ifca_models(config.ifca, config.sampling.seed, cluster_models)


def _ifca_initial_models(config: FamilyConfig, new_model: Callable[[], Any]) -> list[ArrayRecord]:
    """IFCA's K initial models, each from its own torch seed ``[seed, cluster]``."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord

    models = []
    for cluster in range(int(config.ifca.k)):
        torch.manual_seed(int(np.random.default_rng([config.sampling.seed, cluster, 11]).integers(2**31)))
        models.append(ArrayRecord(new_model().state_dict()))
    return models


def _cfl_aggregator(config: FamilyConfig) -> Aggregator:
    from bouquet.strategies.clustered import CFLClusters

    return CFLClusters(config.cfl)


def _local_aggregator(config: FamilyConfig) -> Aggregator:
    from bouquet.strategies.clustered import LocalModels

    return LocalModels()


# ---------------------------------------------------------------- FedProx, robust rules
def _proximal_entries(config: FamilyConfig) -> tuple[Any, ...]:
    from bouquet.strategies.entries import ProximalTerm

    return (ProximalTerm(config.proximal),)


def _robust_family(rule: str) -> Family:
    def check(config: FamilyConfig) -> None:
        needed = config.robust.replies_needed(rule)
        if needed > config.sampling.clients_per_round:
            by_m = rule == "multikrum" and needed > 2 * config.robust.num_malicious_nodes + 3
            key = "robust-num-nodes-to-select" if by_m else "robust-num-malicious-nodes"
            raise FamilyError(f"run-config {key!r}: {rule} with num-malicious-nodes="
                              f"{config.robust.num_malicious_nodes} needs at least {needed} clients per round, "
                              f"got clients-per-round={config.sampling.clients_per_round}")

    def aggregator(config: FamilyConfig) -> Aggregator:
        from bouquet.strategies.robust import FlowerRobustRule

        return FlowerRobustRule(rule, config.robust)

    return Family(rule, label=rule, robust=True, check=check, aggregator=aggregator)


#: Every HK geometry is a strategy, the default one (the app's ``hk-cosine``) listed first.
_HK_VARIANTS = (HKParams.geometry, *(g for g in HK_GEOMETRIES if g != HKParams.geometry))

#: Every strategy family, in the order ``strategy`` names are listed.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("fedavg", label="FedAvg"),
    Family("fedprox", label="FedProx", train_entries=_proximal_entries),
    Family("hk", label="HK", variants=_HK_VARIANTS, geometry_section="hk",
           exclusive_section=True, coalitions=True, opinions=True, aggregator=_hk_aggregator),
    Family("fixed-k", label="fixed-K", variants=FIXED_K_GEOMETRIES, geometry_section="fixed_k", coalitions=True,
           check=_fixed_k_check, aggregator=_fixed_k_aggregator),
    Family("perfedavg", label="Per-FedAvg", variants=PERFEDAVG_VARIANTS, meta_learning=True),
    Family("ifca", label="IFCA", clusters=True, draws_own_clients=True, check=_ifca_check,
           aggregator=_ifca_aggregator, models=_ifca_models, sampler=_ifca_sampler,
           initial_models=_ifca_initial_models),
    Family("cfl", label="CFL", clusters=True, aggregator=_cfl_aggregator, models=_assigned),
    Family("local", label="local", clusters=True, all_personal=True, aggregator=_local_aggregator,
           models=_assigned),
    *(_robust_family(rule) for rule in ROBUST_RULES),
)}

#: Strategy names accepted by the ``strategy`` key.
STRATEGIES: tuple[str, ...] = tuple(name for f in FAMILIES.values() for name in f.strategies)
_BY_STRATEGY: dict[str, tuple[Family, str]] = {
    name: (f, variant) for f in FAMILIES.values() for name, variant in zip(f.strategies, f.variants or ("",))}


def family_names(where: Callable[[Family], bool], last: str = " or ") -> str:
    """The families with a trait, as messages write them (``hk-* or fixed-k-*``; ``last`` joins the last two)."""
    names = [f.pattern for f in FAMILIES.values() if where(f)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])}{last}{names[-1]}"


@dataclass(frozen=True)
class StrategySpec:
    """A ``strategy`` name parsed once: its family and variant (``hk-cosine`` -> ``hk``, ``cosine``)."""

    name: str
    family: str
    variant: str = ""

    @classmethod
    def parse(cls, name: str) -> StrategySpec:
        if name not in _BY_STRATEGY:
            raise ParamError("strategy", f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
        family, variant = _BY_STRATEGY[name]
        return cls(name, family.name, variant)

    @property
    def kind(self) -> Family:
        """The family's row of :data:`FAMILIES`."""
        return FAMILIES[self.family]
