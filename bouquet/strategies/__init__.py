"""Flower strategies (Message API) for heterogeneous clients: one composed strategy and its parts.

:class:`BouquetStrategy` is made of a sampler (who trains), an aggregator (what the replies become), a
model store (what each node receives), train-config parts and hooks; any sampler with any
aggregator::

    from bouquet.strategies import BouquetStrategy, Coalitions, HKRule, SketchSelection
    from bouquet.strategies import SamplingParams, SelectionParams
    from bouquet.algorithms.hk import HKParams
    from bouquet.algorithms.selection import SCKMClusterSelector

    strategy = BouquetStrategy(
        sampler=SketchSelection(SCKMClusterSelector(), SamplingParams(clients_per_round=10)),
        aggregator=Coalitions(HKRule(HKParams(geometry="cosine", tau=0.75))))

Drop-in names for a one-line swap with Flower's strategies (same constructor arguments, same order,
same defaults): :class:`HKFedAvg`, :class:`FixedKFedAvg` and :class:`SeededFedAvg` for ``FedAvg``,
:class:`SeededFedProx` for ``FedProx``, :class:`SeededKrum`, :class:`SeededMultiKrum`,
:class:`SeededBulyan`, :class:`SeededFedMedian` and :class:`SeededFedTrimmedAvg` for Flower's robust
rules; :func:`selection_strategy` puts a selector in place of FedAvg's sampling.  Names are imported on
first use, so that ``bouquet.strategies.params`` (read by the app's config) loads no Flower code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names are, for readers and editors; at run time each loads on first use
    from bouquet.strategies.aggregation import Coalitions, FixedKRule, HKRule, TrajectoryWriter, WeightedMean
    from bouquet.strategies.checkpoints import Checkpointing
    from bouquet.strategies.clustered import CFLClusters, ClusterMeans, IFCASampler, LocalModels
    from bouquet.strategies.entries import ProximalTerm
    from bouquet.strategies.hooks import (
        CentralEvaluation,
        ConsoleLines,
        Hook,
        RecorderObserver,
        StopWhen,
    )
    from bouquet.strategies.models import AssignedModels, SharedModel
    from bouquet.strategies.params import (
        CoalitionParams,
        ModelStoreParams,
        ProximalParams,
        RecordParams,
        RobustRuleParams,
        SamplingParams,
        SelectionParams,
    )
    from bouquet.strategies.replies import screen_replies
    from bouquet.strategies.robust import FlowerRobustRule
    from bouquet.strategies.sampling import NodeOrder, UniformSampler
    from bouquet.strategies.selection import SketchSelection
    from bouquet.strategies.server_opt import ServerOptimizer
    from bouquet.strategies.state import ServerState
    from bouquet.strategies.strategy import BouquetStrategy
    from bouquet.strategies.wrappers import (
        FixedKFedAvg,
        HKFedAvg,
        SeededBulyan,
        SeededFedAvg,
        SeededFedMedian,
        SeededFedProx,
        SeededFedTrimmedAvg,
        SeededKrum,
        SeededMultiKrum,
        cfl_strategy,
        ifca_strategy,
        local_strategy,
        robust_strategy,
        selection_strategy,
    )

_EXPORTS = {
    "BouquetStrategy": "strategy",
    "SeededFedAvg": "wrappers", "SeededFedProx": "wrappers", "HKFedAvg": "wrappers", "FixedKFedAvg": "wrappers",
    "selection_strategy": "wrappers",
    "SeededKrum": "wrappers", "SeededMultiKrum": "wrappers", "SeededBulyan": "wrappers", "SeededFedMedian": "wrappers",
    "SeededFedTrimmedAvg": "wrappers",
    "UniformSampler": "sampling", "NodeOrder": "sampling",
    "SketchSelection": "selection",
    "WeightedMean": "aggregation", "Coalitions": "aggregation", "HKRule": "aggregation", "FixedKRule": "aggregation",
    "SharedModel": "models", "AssignedModels": "models",
    "IFCASampler": "clustered", "ClusterMeans": "clustered", "CFLClusters": "clustered", "LocalModels": "clustered",
    "ifca_strategy": "wrappers", "cfl_strategy": "wrappers", "local_strategy": "wrappers",
    "robust_strategy": "wrappers",
    "ProximalTerm": "entries",
    "Hook": "hooks", "ConsoleLines": "hooks", "RecorderObserver": "hooks", "TrajectoryWriter": "aggregation",
    "CentralEvaluation": "hooks", "StopWhen": "hooks", "Checkpointing": "checkpoints",
    "ServerState": "state",
    "screen_replies": "replies",
    "SamplingParams": "params", "SelectionParams": "params", "CoalitionParams": "params", "ProximalParams": "params",
    "ModelStoreParams": "params", "RobustRuleParams": "params", "RecordParams": "params",
    "FlowerRobustRule": "robust",
    "ServerOptimizer": "server_opt",
}

__all__ = ["AssignedModels", "BouquetStrategy", "CFLClusters", "CentralEvaluation", "Checkpointing", "ClusterMeans",
           "CoalitionParams", "Coalitions", "ConsoleLines", "FixedKFedAvg", "FixedKRule", "FlowerRobustRule",
           "HKFedAvg", "HKRule", "Hook", "IFCASampler", "LocalModels", "ModelStoreParams", "NodeOrder",
           "ProximalParams", "ProximalTerm", "RecordParams", "RecorderObserver", "RobustRuleParams",
           "SamplingParams", "SeededBulyan", "SeededFedAvg", "SeededFedMedian", "SeededFedProx",
           "SeededFedTrimmedAvg", "SeededKrum", "SeededMultiKrum", "SelectionParams", "ServerOptimizer",
           "ServerState", "SharedModel", "SketchSelection", "StopWhen", "TrajectoryWriter", "UniformSampler",
           "WeightedMean", "cfl_strategy", "ifca_strategy", "local_strategy", "robust_strategy", "screen_replies",
           "selection_strategy"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bouquet.strategies' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bouquet.strategies.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
