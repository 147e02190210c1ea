"""The drop-in names: thin constructors over :class:`bouquet.strategies.BouquetStrategy`.

Each class is one line to swap into a Flower app (``strategy = HKFedAvg(0.5, tau=0.75)`` where it said
``FedAvg(0.5)``): it takes the Flower strategy's constructor arguments, in Flower's order and with
Flower's defaults, and after them (keyword only) bouquet's own.  It composes the parts for you: a
:class:`~bouquet.strategies.sampling.UniformSampler`, an aggregator, a
:class:`~bouquet.strategies.models.SharedModel` (or per-coalition models), console lines and, with
``recorder``, the run recorder.  Defaults are read from the parts' params classes
(:class:`~bouquet.strategies.params.SamplingParams`, :class:`~bouquet.strategies.params.RecordParams`,
...), so they live in one place.  Where the result differs from Flower's strategy on the same replies,
``docs/USAGE.md`` ("Where bouquet differs from FedAvg") says how, and the differential tests assert it.

The composing functions (:func:`selection_strategy`, :func:`ifca_strategy`, :func:`cfl_strategy`,
:func:`local_strategy`, :func:`robust_strategy`) take the same record arguments and a
:class:`~bouquet.strategies.params.SamplingParams` (every sampling argument of Flower's FedAvg).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from flwr.app import ArrayRecord, MetricRecord, RecordDict

from bouquet.algorithms.clustered import CFLParams, IFCAParams, ifca_budget_problem
from bouquet.algorithms.coalitions_fixed_k import FixedKParams
from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.memory import MemoryParams, memory_form
from bouquet.algorithms.selection import Selector
from bouquet.strategies.aggregation import Aggregator, Coalitions, WeightedMean, fixed_k_aggregator, hk_aggregator
from bouquet.strategies.clustered import CFLClusters, ClusterMeans, IFCASampler, LocalModels, ifca_models
from bouquet.strategies.entries import ProximalTerm, TrainConfigPart
from bouquet.strategies.hooks import ConsoleLines, Hook, Recorder, RecorderObserver
from bouquet.strategies.models import AssignedModels, ModelStore, model_store
from bouquet.strategies.params import (
    CoalitionParams,
    ModelStoreParams,
    ProximalParams,
    RecordParams,
    RobustRuleParams,
    SamplingParams,
    SelectionParams,
)
from bouquet.strategies.robust import FlowerRobustRule, SelectionRule
from bouquet.strategies.sampling import Sampler, UniformSampler
from bouquet.strategies.selection import SketchSelection
from bouquet.strategies.strategy import BouquetStrategy

__all__ = ["FixedKFedAvg", "HKFedAvg", "SeededBulyan", "SeededFedAvg", "SeededFedMedian", "SeededFedProx",
           "SeededFedTrimmedAvg", "SeededKrum", "SeededMultiKrum", "cfl_strategy", "ifca_strategy",
           "local_strategy", "robust_strategy", "selection_strategy"]

_S = SamplingParams  # the defaults of the sampling arguments below
_K = RecordParams  # the defaults of the record arguments below
MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]

def _hooks(recorder: Recorder | None) -> tuple[Hook, ...]:
    return (ConsoleLines(),) if recorder is None else (ConsoleLines(), RecorderObserver(recorder))


def _coalitions(drop_in: str, build: Callable[[MemoryParams], Coalitions], memory: bool | str | MemoryParams
                ) -> Coalitions:
    """The coalition aggregator of a drop-in (``build(memory)``: the app's family builds it the same way), a bad
    or unusable ``memory`` named as its argument."""
    argument = f"{drop_in}(memory=...)"
    try:
        return build(memory_form(memory, argument))
    except ValueError as error:
        raise ValueError(str(error) if str(error).startswith(argument) else f"{argument}: {error}") from None


#: The sampling arguments of the drop-ins (Flower's and bouquet's), as :class:`SamplingParams` names them.
_SAMPLING_ARGS = tuple(f.name for f in dataclasses.fields(SamplingParams))
#: Flower's record arguments, as :class:`RecordParams` names them.
_RECORD_ARGS = tuple(f.name for f in dataclasses.fields(RecordParams))


def _dropin(strategy: BouquetStrategy, args: dict[str, Any], aggregator: Aggregator, models: ModelStore | None = None,
            train_config: tuple[TrainConfigPart, ...] = ()) -> None:
    """Build ``strategy`` (a drop-in) from the arguments of its ``__init__`` (``locals()``): the one place where
    Flower's sampling and record arguments and bouquet's (``clients_per_round``, ``seed``, ``recorder``, ...)
    become the parts, beside the drop-in's own ``aggregator``, ``models`` and ``train_config``."""
    sampling = SamplingParams(**{name: args[name] for name in _SAMPLING_ARGS if name in args})
    keys = RecordParams(**{name: args[name] for name in _RECORD_ARGS})
    BouquetStrategy.__init__(strategy, sampler=UniformSampler(sampling), aggregator=aggregator, models=models,
                             train_config=train_config, hooks=_hooks(args["recorder"]),
                             weighted_by_key=keys.weighted_by_key, arrayrecord_key=keys.arrayrecord_key,
                             configrecord_key=keys.configrecord_key,
                             train_metrics_aggr_fn=args["train_metrics_aggr_fn"],
                             evaluate_metrics_aggr_fn=args["evaluate_metrics_aggr_fn"])


class SeededFedAvg(BouquetStrategy):
    """FedAvg with seeded sampling, per-client reply screening and records (drop-in for Flower's ``FedAvg``).

    Parameters
    ----------
    fraction_train, fraction_evaluate : float, default 1.0
        Flower's sampling: ``max(int(n * fraction), min_*_nodes)`` of the n connected nodes, drawn with a
        seed (0 skips the phase).
    min_train_nodes, min_evaluate_nodes, min_available_nodes : int, default 2
        Flower's floors; sampling waits (up to ``node_wait_seconds``) until that many nodes are connected.
    weighted_by_key, arrayrecord_key, configrecord_key : str
        Flower's record arguments (:class:`bouquet.strategies.params.RecordParams`).
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn : callable, optional
        ``(list[RecordDict], weighted_by_key) -> MetricRecord``; default Flower's weighted average.
    clients_per_round : int, optional
        bouquet: S, the nodes trained per round, instead of ``fraction_train``.
    seed : int, default 0
        bouquet: round ``t`` trains ``default_rng([seed, t])``'s draw, evaluates ``default_rng([seed, t, 1])``'s.
    node_wait_seconds : float, default 30
        bouquet: how long to wait for nodes (``math.inf``: forever, as Flower).
    identify_nodes : bool, default False
        bouquet: order nodes by the key each reports (``query.identify``; the ClientApp must register
        :func:`bouquet.node_identity.register_identity_query`), so that a seed draws the same clients in
        every run.  Off: no query, nodes in node-id order.
    recorder : Recorder, optional
        bouquet: receives per-round records and per-client rows (``bouquet.results.RunRecorder``).
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, *,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        _dropin(self, locals(), WeightedMean())


class SeededFedProx(BouquetStrategy):
    """FedProx (Li et al. 2020): FedAvg that sends ``proximal-mu`` to the clients (drop-in for Flower's ``FedProx``).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    proximal_mu : float, default 0.0
        The clients add ``(mu / 2) ||w - w_global||^2`` to their loss (Flower's default 0: FedAvg).
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, proximal_mu: float = ProximalParams.mu,
                 *, clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        _dropin(self, locals(), WeightedMean(), train_config=(ProximalTerm(ProximalParams(proximal_mu)),))


class HKFedAvg(BouquetStrategy):
    """FedAvg whose aggregation is Hegselmann-Krause coalition formation (HK paper eq. 10-16).

    Configured as FedAvg (``tau=-1`` with ``geometry="cosine"``: one coalition of everyone;
    ``barycenter_weighting="samples"``) it aggregates as Flower's FedAvg does, to Flower's tolerance.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    geometry : {"euclidean", "cosine", "cosine-bounded"}, default "cosine"
    tau : float, default 0.75
        Euclidean radius on unit vectors or cosine threshold (paper grid {0.5, 0.75, 0.9}).
    eps_l, eps_r : float, default -1, 1
        Two-sided cosine bound (``geometry="cosine-bounded"``, eq. 14).
    delta : float, default 1e-6
        Inner stopping tolerance.
    s_max : int, default 50
        Inner step cap.
    coalition_tol : float, default 1e-6
        Relative tolerance for "same limiting opinion".
    opinions : {"auto", "normalized", "raw"}, default "auto"
        See :class:`bouquet.algorithms.hk.HKParams`.
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
        Members count equally in their barycenter (eq. 15) or by ``weighted_by_key``.
    opinion_space : {"weights", "updates"}, default "weights"
        HK on the trained models (the paper) or on their updates (our option).
    record_trajectories : bool, default False
        Hand each round's opinion dynamics to the hooks (``TrajectoryWriter``).
    coalition_models : {"shared", "personal"}, default "shared"
        ``shared``: the paper's one model (eq. 16).  ``personal``: each coalition's barycenter is its
        model; a client is sent the model of the coalition it joined at its last participation
        (:class:`~bouquet.strategies.models.AssignedModels`).
    min_coalition_fraction : float, default 0.0
        Robust option: coalitions with fewer than this fraction of the round's clients get no weight in the
        shared model (0: eq. 16, the paper).
    update_norm_bound : float, default 0.0
        Robust option: clip each update ``w_i - theta`` to this multiple of the round's median update norm
        before HK and before averaging (0: off, the paper).
    opinion_arrays : str, default ""
        Comma-separated prefixes of the array names HK reads (``"features."``); empty: every array (the
        paper).  Aggregation always averages whole models.
    update_min_cosine : float, default -1.0
        Robust option: leave out of the round each client whose update has a cosine below this with the
        round's coordinate-wise median update (-1: off, the paper).
    update_relative_cosine : float, default 0.0
        Robust option: raise that threshold to this multiple of the round's median cosine where that is
        higher (0: off).  Combines with ``robust``.
    robust : bool, default False
        The robust options as the attack study chose them on validation
        (:data:`bouquet.algorithms.robust.ROBUST_FORM`); giving one of them another value too is an error.
    memory : bool or str or MemoryParams, default False
        Coalition memory (``docs/METHODS.md``, "Coalition memory"): False, each round's coalitions from that
        round alone (the paper); True, the form the groups study chose on validation
        (:data:`bouquet.algorithms.memory.VALIDATED_FORM`); or a
        form's name from :data:`bouquet.algorithms.memory.MEMORY_FORMS` (``"cosine"``, ``"linkage-otsu"``,
        ``"together"``, ``"stacked"``), or a :class:`~bouquet.algorithms.memory.MemoryParams`.  Use it
        with ``coalition_models="personal"`` and ``opinion_space="updates"``, as the study does.
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, *,
                 geometry: str = HKParams.geometry, tau: float = HKParams.tau,
                 eps_l: float = HKParams.eps_l, eps_r: float = HKParams.eps_r, delta: float = HKParams.delta,
                 s_max: int = HKParams.s_max, coalition_tol: float = HKParams.coalition_tol,
                 opinions: str = HKParams.opinions,
                 barycenter_weighting: str = CoalitionParams.barycenter_weighting,
                 opinion_space: str = CoalitionParams.opinion_space,
                 record_trajectories: bool = CoalitionParams.record_trajectories,
                 coalition_models: str = ModelStoreParams.coalition_models,
                 min_coalition_fraction: float = CoalitionParams.min_coalition_fraction,
                 update_norm_bound: float = CoalitionParams.update_norm_bound,
                 opinion_arrays: str = CoalitionParams.opinion_arrays,
                 update_min_cosine: float = CoalitionParams.update_min_cosine,
                 update_relative_cosine: float = CoalitionParams.update_relative_cosine,
                 robust: bool = CoalitionParams.robust,
                 memory: bool | str | MemoryParams = False,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        hk = HKParams(geometry=geometry, tau=tau, eps_l=eps_l, eps_r=eps_r, delta=delta, s_max=s_max,
                      coalition_tol=coalition_tol, opinions=opinions, barycenter_weighting=barycenter_weighting)
        coalitions = CoalitionParams(barycenter_weighting, opinion_space, record_trajectories, min_coalition_fraction,
                                     update_norm_bound, opinion_arrays, update_min_cosine,
                                     update_relative_cosine=update_relative_cosine, robust=robust)
        _dropin(self, locals(), _coalitions("HKFedAvg", lambda m: hk_aggregator(hk, coalitions, m), memory),
                models=model_store(ModelStoreParams(coalition_models)))


class FixedKFedAvg(BouquetStrategy):
    """FedAvg whose aggregation partitions the round's models into K coalitions by k-means (the HK paper's baseline).

    Configured as FedAvg (``k=1``, ``barycenter_weighting="samples"``) it aggregates as Flower's FedAvg
    does, to Flower's tolerance.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    k : int, default 2
        Coalitions per round (fewer when fewer clients reply).
    geometry : {"euclidean", "cosine"}, default "euclidean"
        k-means on the models or on the unit-normalised models; seeded per round with ``[seed, round]``.
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
    coalition_models : {"shared", "personal"}, default "shared"
    min_coalition_fraction, update_norm_bound : float, default 0.0
        As in :class:`HKFedAvg` (0: the paper's eq. 16, no clipping).
    update_min_cosine : float, default -1.0
        As in :class:`HKFedAvg` (-1: no direction screen).
    update_relative_cosine : float, default 0.0
        As in :class:`HKFedAvg` (0: no relative threshold).
    robust : bool, default False
        As in :class:`HKFedAvg`.
    memory : bool or str or MemoryParams, default False
        As in :class:`HKFedAvg`; a form that needs the rule's own threshold (``MemoryParams(active=True,
        formation="linkage")``: fixed-K has K, not tau) is an error naming ``memory``.
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, *,
                 k: int = FixedKParams.k, geometry: str = FixedKParams.geometry,
                 barycenter_weighting: str = CoalitionParams.barycenter_weighting,
                 coalition_models: str = ModelStoreParams.coalition_models,
                 min_coalition_fraction: float = CoalitionParams.min_coalition_fraction,
                 update_norm_bound: float = CoalitionParams.update_norm_bound,
                 update_min_cosine: float = CoalitionParams.update_min_cosine,
                 update_relative_cosine: float = CoalitionParams.update_relative_cosine,
                 robust: bool = CoalitionParams.robust,
                 memory: bool | str | MemoryParams = False,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        coalitions = CoalitionParams(barycenter_weighting=barycenter_weighting,
                                     min_coalition_fraction=min_coalition_fraction,
                                     update_norm_bound=update_norm_bound, update_min_cosine=update_min_cosine,
                                     update_relative_cosine=update_relative_cosine, robust=robust)
        _dropin(self, locals(), _coalitions("FixedKFedAvg", lambda m: fixed_k_aggregator(FixedKParams(k, geometry),
                                                                                           coalitions, m), memory),
                models=model_store(ModelStoreParams(coalition_models)))


class SeededKrum(BouquetStrategy):
    """Krum (Blanchard et al. 2017) with seeded sampling (drop-in for Flower's ``Krum``).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    num_malicious_nodes : int, default 0
        f; the rule runs on rounds with at least ``2 f + 3`` usable replies (others keep the model).
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes,
                 num_malicious_nodes: int = RobustRuleParams.num_malicious_nodes,
                 weighted_by_key: str = _K.weighted_by_key, arrayrecord_key: str = _K.arrayrecord_key,
                 configrecord_key: str = _K.configrecord_key, train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, *,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        _dropin(self, locals(), FlowerRobustRule("krum", RobustRuleParams(num_malicious_nodes=num_malicious_nodes)))


class SeededMultiKrum(BouquetStrategy):
    """MultiKrum with seeded sampling (drop-in for Flower's ``MultiKrum``).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    num_malicious_nodes : int, default 0
        f; the rule runs on rounds with at least ``max(2 f + 3, m)`` usable replies.
    num_nodes_to_select : int, default 1
        m, the best-scored models averaged.
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes,
                 num_malicious_nodes: int = RobustRuleParams.num_malicious_nodes,
                 num_nodes_to_select: int = RobustRuleParams.num_nodes_to_select,
                 weighted_by_key: str = _K.weighted_by_key, arrayrecord_key: str = _K.arrayrecord_key,
                 configrecord_key: str = _K.configrecord_key, train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, *,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        params = RobustRuleParams(num_malicious_nodes=num_malicious_nodes, num_nodes_to_select=num_nodes_to_select)
        _dropin(self, locals(), FlowerRobustRule("multikrum", params))


class SeededBulyan(BouquetStrategy):
    """Bulyan (El Mhamdi et al. 2018) with seeded sampling (drop-in for Flower's ``Bulyan``).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    num_malicious_nodes : int, default 0
        f; Bulyan needs at least ``4 f + 3`` usable replies (others keep the model, as Flower's).
    selection_rule : callable(list[RecordDict], f, theta) -> list[RecordDict], optional
        Flower's: the first step's choice of theta models; default MultiKrum's (``select_multikrum``).
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes,
                 num_malicious_nodes: int = RobustRuleParams.num_malicious_nodes,
                 weighted_by_key: str = _K.weighted_by_key, arrayrecord_key: str = _K.arrayrecord_key,
                 configrecord_key: str = _K.configrecord_key, train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                 selection_rule: SelectionRule | None = None, *,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        _dropin(self, locals(),
                FlowerRobustRule("bulyan", RobustRuleParams(num_malicious_nodes=num_malicious_nodes), selection_rule))


class SeededFedMedian(BouquetStrategy):
    """FedMedian (Yin et al. 2018) with seeded sampling (drop-in for Flower's ``FedMedian``).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, *,
                 clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        _dropin(self, locals(), FlowerRobustRule("fedmedian", RobustRuleParams()))


class SeededFedTrimmedAvg(BouquetStrategy):
    """FedTrimmedAvg (Yin et al. 2018) with seeded sampling (drop-in for Flower's ``FedTrimmedAvg``).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's arguments, as in :class:`SeededFedAvg`.
    clients_per_round, seed, node_wait_seconds, identify_nodes, recorder
        bouquet's, as in :class:`SeededFedAvg`.
    beta : float, default 0.2
        Fraction cut from each end of every coordinate.
    """

    def __init__(self, fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, beta: float = RobustRuleParams.trim_beta,
                 *, clients_per_round: int | None = _S.clients_per_round, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                 recorder: Recorder | None = None) -> None:
        _dropin(self, locals(), FlowerRobustRule("fedtrimmedavg", RobustRuleParams(trim_beta=beta)))


def _composed(sampler: Sampler, aggregator: Aggregator, keys: RecordParams,
              train_metrics_aggr_fn: MetricsAggregation | None, evaluate_metrics_aggr_fn: MetricsAggregation | None,
              recorder: Recorder | None, models: ModelStore | None = None) -> BouquetStrategy:
    """A :class:`BouquetStrategy` from its parts and Flower's record arguments (the composing functions)."""
    return BouquetStrategy(sampler=sampler, aggregator=aggregator, models=models, hooks=_hooks(recorder),
                           weighted_by_key=keys.weighted_by_key, arrayrecord_key=keys.arrayrecord_key,
                           configrecord_key=keys.configrecord_key, train_metrics_aggr_fn=train_metrics_aggr_fn,
                           evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)


def selection_strategy(selector: Selector, aggregator: Aggregator | BouquetStrategy | None = None, *,
                       clients_per_round: int, mode: str = SelectionParams.mode,
                       sketch_fraction: float = SelectionParams.sketch_fraction,
                       sketch_batch_size: int = SelectionParams.sketch_batch_size,
                       candidates_per_round: int = SelectionParams.candidates_per_round,
                       query_timeout: float = SelectionParams.query_timeout,
                       max_sketch_age: int = SelectionParams.max_sketch_age,
                       fraction_evaluate: float = _S.fraction_evaluate, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                       min_available_nodes: int = _S.min_available_nodes, seed: int = _S.seed,
                       node_wait_seconds: float = _S.node_wait_seconds, identify_nodes: bool = _S.identify_nodes,
                       weighted_by_key: str = _K.weighted_by_key, arrayrecord_key: str = _K.arrayrecord_key,
                       configrecord_key: str = _K.configrecord_key,
                       train_metrics_aggr_fn: MetricsAggregation | None = None,
                       evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                       recorder: Recorder | None = None) -> BouquetStrategy:
    """``selector`` chooses who trains, ``aggregator`` combines their models (default: FedAvg's mean).

    In place of FedAvg's ``fraction_train`` / ``min_train_nodes`` the selector picks ``clients_per_round``
    nodes; every other argument of Flower's FedAvg is taken.

    ``aggregator`` may also be any drop-in built here (``SeededFedProx(...)``, ``HKFedAvg(...)``,
    ``SeededKrum(...)``, ...): selection goes in front of it, and everything else of it is kept (its
    aggregator, model store, train-config parts such as FedProx's ``proximal-mu``, record keys, metric
    aggregation, hooks, transport, and its sampling settings but the number of clients).  Its settings are
    then set on the drop-in: giving one of the sampling or record arguments here as well is refused.

    Parameters
    ----------
    selector : bouquet.algorithms.selection.Selector
        SCKM-Select, SCKM-Cluster, Power-of-Choice, AFL, FedCor, ...
    aggregator : Aggregator or BouquetStrategy, optional
        E.g. ``Coalitions(HKRule(HKParams(tau=0.75)))`` or ``SeededFedProx(proximal_mu=0.1)``; default
        :class:`WeightedMean`.
    clients_per_round : int
        The budget B.
    mode, sketch_fraction, sketch_batch_size, candidates_per_round, query_timeout, max_sketch_age
        See :class:`bouquet.strategies.params.SelectionParams`.
    fraction_evaluate, min_evaluate_nodes, min_available_nodes, seed, node_wait_seconds, identify_nodes,
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn, recorder
        As in :class:`SeededFedAvg`.
    """
    selection = SelectionParams(mode, sketch_fraction, sketch_batch_size, candidates_per_round, query_timeout,
                                max_sketch_age)
    if isinstance(aggregator, BouquetStrategy):
        args = locals()
        given = {name: args[name] for name, default in _DROP_IN_SETTINGS.items() if args[name] != default}
        return _selection_in_front(aggregator, selector, clients_per_round, selection, given)
    sampling = SamplingParams(clients_per_round=clients_per_round, fraction_evaluate=fraction_evaluate,
                              min_evaluate_nodes=min_evaluate_nodes, min_available_nodes=min_available_nodes,
                              seed=seed, node_wait_seconds=node_wait_seconds, identify_nodes=identify_nodes)
    return _composed(SketchSelection(selector, sampling, selection),
                     aggregator if aggregator is not None else WeightedMean(),
                     RecordParams(weighted_by_key, arrayrecord_key, configrecord_key), train_metrics_aggr_fn,
                     evaluate_metrics_aggr_fn, recorder)


#: The arguments of :func:`selection_strategy` that a drop-in in front of which it goes sets itself (its sampling
#: and record settings), with their defaults: the parameters with a default that are not the selection's own.
_DROP_IN_SETTINGS = {p.name: p.default for p in inspect.signature(selection_strategy).parameters.values()
                     if p.default is not p.empty and p.name != "aggregator"
                     and p.name not in {f.name for f in dataclasses.fields(SelectionParams)}}


def _selection_in_front(strategy: BouquetStrategy, selector: Selector, budget: int, selection: SelectionParams,
                        given: dict[str, Any]) -> BouquetStrategy:
    """``strategy`` (a drop-in) with ``selector`` choosing ``budget`` of its clients; the rest of it kept."""
    if given:
        raise ValueError(f"selection_strategy in front of a {type(strategy).__name__}: set "
                         f"{', '.join(sorted(given))} on the {type(strategy).__name__} (its settings are kept)")
    if not isinstance(strategy.sampler, UniformSampler):
        raise TypeError(f"selection_strategy: the {type(strategy).__name__} chooses its clients itself "
                         f"({type(strategy.sampler).__name__}); selection goes in front of a strategy that draws "
                         f"them uniformly")
    sampling = dataclasses.replace(strategy.sampler.sampling, clients_per_round=budget)
    return BouquetStrategy(sampler=SketchSelection(selector, sampling, selection), aggregator=strategy.aggregator,
                           models=strategy.models, train_config=strategy.train_config, hooks=strategy.hooks,
                           weighted_by_key=strategy.weighted_by_key, arrayrecord_key=strategy.arrayrecord_key,
                           configrecord_key=strategy.configrecord_key,
                           train_metrics_aggr_fn=strategy.train_metrics_aggr_fn,
                           evaluate_metrics_aggr_fn=strategy.evaluate_metrics_aggr_fn,
                           message_factory=strategy.new_message, transport=strategy.transport)


def ifca_strategy(params: IFCAParams, sampling: SamplingParams, initial_models: list[ArrayRecord] | None = None,
                  query_timeout: float = SelectionParams.query_timeout, *, weighted_by_key: str = _K.weighted_by_key,
                  arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                  train_metrics_aggr_fn: MetricsAggregation | None = None,
                  evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                  recorder: Recorder | None = None) -> BouquetStrategy:
    """IFCA (Ghosh et al. 2020): K cluster models, each client trains the one with its lowest loss.

    The ClientApp registers :func:`bouquet.losses.register_loss_query` (its train handler is unchanged).

    Parameters
    ----------
    params : IFCAParams
        K, how the K models are made from one, how many examples a client scores them on.
    sampling : SamplingParams
        Who is drawn each round (``clients_per_round`` >= K) and who evaluates.
    initial_models : list of ArrayRecord, optional
        The K initial models (default: the initial model perturbed K times, seeded by ``sampling.seed``).
    query_timeout : float, default 600
        Seconds to wait for the clients' losses.
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn, recorder
        As in :class:`SeededFedAvg`.
    """
    problem = ifca_budget_problem(params.k, sampling.clients_per_round)
    if problem:
        raise ValueError(f"IFCA: {problem}")
    return _composed(IFCASampler(params, sampling, query_timeout), ClusterMeans(),
                     RecordParams(weighted_by_key, arrayrecord_key, configrecord_key), train_metrics_aggr_fn,
                     evaluate_metrics_aggr_fn, recorder, ifca_models(params, sampling.seed, initial_models))


def cfl_strategy(params: CFLParams, sampling: SamplingParams, *, weighted_by_key: str = _K.weighted_by_key,
                 arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                 recorder: Recorder | None = None) -> BouquetStrategy:
    """CFL (Sattler et al. 2020): one cluster trained by FedAvg, split in two whenever it stalls.

    Parameters
    ----------
    params : CFLParams
        The split thresholds ``eps1`` / ``eps2``, the warm-up, the smallest cluster split.
    sampling : SamplingParams
        The paper trains every client every round (``clients_per_round`` = all of them).
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn, recorder
        As in :class:`SeededFedAvg`.
    """
    return _composed(UniformSampler(sampling), CFLClusters(params),
                     RecordParams(weighted_by_key, arrayrecord_key, configrecord_key), train_metrics_aggr_fn,
                     evaluate_metrics_aggr_fn, recorder, AssignedModels())


def local_strategy(sampling: SamplingParams, *, weighted_by_key: str = _K.weighted_by_key,
                   arrayrecord_key: str = _K.arrayrecord_key, configrecord_key: str = _K.configrecord_key,
                   train_metrics_aggr_fn: MetricsAggregation | None = None,
                   evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                   recorder: Recorder | None = None) -> BouquetStrategy:
    """Local training, the no-federation reference: every client trains and keeps its own model.

    Parameters
    ----------
    sampling : SamplingParams
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn, recorder
        As in :class:`SeededFedAvg`.
    """
    return _composed(UniformSampler(sampling), LocalModels(),
                     RecordParams(weighted_by_key, arrayrecord_key, configrecord_key), train_metrics_aggr_fn,
                     evaluate_metrics_aggr_fn, recorder, AssignedModels())


def robust_strategy(rule: str, params: RobustRuleParams, sampling: SamplingParams, *,
                    weighted_by_key: str = _K.weighted_by_key, arrayrecord_key: str = _K.arrayrecord_key,
                    configrecord_key: str = _K.configrecord_key,
                    train_metrics_aggr_fn: MetricsAggregation | None = None,
                    evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                    recorder: Recorder | None = None) -> BouquetStrategy:
    """One of Flower's robust rules (Krum, MultiKrum, Bulyan, FedMedian, FedTrimmedAvg) behind seeded sampling.

    The classes :class:`SeededKrum` ... :class:`SeededFedTrimmedAvg` are the same with Flower's signatures.

    Parameters
    ----------
    rule : {"krum", "multikrum", "bulyan", "fedmedian", "fedtrimmedavg"}
    params : RobustRuleParams
        f (``num_malicious_nodes``), MultiKrum's m, FedTrimmedAvg's beta; Flower's defaults.
    sampling : SamplingParams
        Who is drawn each round (Krum and MultiKrum need ``2 f + 3`` replies, Bulyan ``4 f + 3``).
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn, recorder
        As in :class:`SeededFedAvg`.
    """
    return _composed(UniformSampler(sampling), FlowerRobustRule(rule, params),
                     RecordParams(weighted_by_key, arrayrecord_key, configrecord_key), train_metrics_aggr_fn,
                     evaluate_metrics_aggr_fn, recorder)
