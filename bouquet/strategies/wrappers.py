"""The drop-in names: thin constructors over :class:`bouquet.strategies.BouquetStrategy`.

Each is one line to swap into a Flower app (``strategy = HKFedAvg(tau=0.75, fraction_train=0.5)``
where it said ``FedAvg(fraction_train=0.5)``) and composes the parts for you: a
:class:`~bouquet.strategies.sampling.UniformSampler` (or
:class:`~bouquet.strategies.selection.SketchSelection` for :func:`selection_strategy`), an aggregator,
a :class:`~bouquet.strategies.models.SharedModel`, console lines and, with ``recorder``, the run
recorder.  Defaults are read from the parts' params classes, so they live in one place.
"""

from __future__ import annotations

from flwr.app import ArrayRecord

from bouquet.algorithms.clustered import CFLParams, IFCAParams
from bouquet.algorithms.coalitions_fixed_k import FixedKParams
from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.selection import Selector
from bouquet.strategies.aggregation import Aggregator, Coalitions, FixedKRule, HKRule, WeightedMean
from bouquet.strategies.clustered import CFLClusters, ClusterMeans, IFCASampler, LocalModels, ifca_models
from bouquet.strategies.entries import ProximalTerm
from bouquet.strategies.models import AssignedModels, SharedModel
from bouquet.strategies.observers import ConsoleLines, Observer, Recorder, RecorderObserver
from bouquet.strategies.params import (
    CoalitionParams,
    ModelStoreParams,
    ProximalParams,
    RobustRuleParams,
    SamplingParams,
    SelectionParams,
)
from bouquet.strategies.robust import FlowerRobustRule
from bouquet.strategies.sampling import UniformSampler
from bouquet.strategies.selection import SketchSelection
from bouquet.strategies.strategy import BouquetStrategy

__all__ = ["FixedKFedAvg", "HKFedAvg", "SeededFedAvg", "SeededFedProx", "cfl_strategy", "ifca_strategy",
           "local_strategy", "robust_strategy", "selection_strategy"]

_S = SamplingParams  # the defaults of the sampling arguments below


def _observers(recorder: Recorder | None) -> tuple[Observer, ...]:
    return (ConsoleLines(),) if recorder is None else (ConsoleLines(), RecorderObserver(recorder))


def _store(coalition_models: str) -> SharedModel | AssignedModels:
    personal = ModelStoreParams(coalition_models).coalition_models == "personal"  # validates
    return AssignedModels() if personal else SharedModel()


class SeededFedAvg(BouquetStrategy):
    """FedAvg with seeded sampling, per-client reply screening and records (drop-in for Flower's ``FedAvg``).

    Parameters
    ----------
    clients_per_round : int, optional
        S, the nodes trained per round; ``None``: ``fraction_train`` of the connected nodes.
    fraction_train, fraction_evaluate : float, default 1.0
    min_train_nodes, min_evaluate_nodes, min_available_nodes : int, default 2
    seed : int, default 0
        Round ``t`` trains ``default_rng([seed, t])``'s draw, evaluates ``default_rng([seed, t, 1])``'s.
    node_wait_seconds : float, default 30
    recorder : Recorder, optional
        Receives per-round records and per-client rows (``bouquet.results.RunRecorder``).

    See :class:`bouquet.strategies.params.SamplingParams` for the sampling rules.
    """

    def __init__(self, *, clients_per_round: int | None = _S.clients_per_round,
                 fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, recorder: Recorder | None = None) -> None:
        sampling = SamplingParams(clients_per_round, fraction_train, fraction_evaluate, min_train_nodes,
                                  min_evaluate_nodes, min_available_nodes, seed, node_wait_seconds)
        super().__init__(sampler=UniformSampler(sampling), aggregator=WeightedMean(), observers=_observers(recorder))


class SeededFedProx(BouquetStrategy):
    """FedProx (Li et al. 2020): FedAvg that sends ``proximal-mu`` to the clients, seeded as :class:`SeededFedAvg`.

    Parameters
    ----------
    proximal_mu : float, default 0.01
        The clients add ``(mu / 2) ||w - w_global||^2`` to their loss.
    clients_per_round, fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, seed, node_wait_seconds, recorder
        As in :class:`SeededFedAvg`.
    """

    def __init__(self, *, proximal_mu: float = ProximalParams.mu, clients_per_round: int | None = _S.clients_per_round,
                 fraction_train: float = _S.fraction_train, fraction_evaluate: float = _S.fraction_evaluate,
                 min_train_nodes: int = _S.min_train_nodes, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                 min_available_nodes: int = _S.min_available_nodes, seed: int = _S.seed,
                 node_wait_seconds: float = _S.node_wait_seconds, recorder: Recorder | None = None) -> None:
        sampling = SamplingParams(clients_per_round, fraction_train, fraction_evaluate, min_train_nodes,
                                  min_evaluate_nodes, min_available_nodes, seed, node_wait_seconds)
        super().__init__(sampler=UniformSampler(sampling), aggregator=WeightedMean(),
                         train_config=(ProximalTerm(ProximalParams(proximal_mu)),), observers=_observers(recorder))


class HKFedAvg(BouquetStrategy):
    """FedAvg whose aggregation is Hegselmann-Krause coalition formation (HK paper eq. 10-16).

    Parameters
    ----------
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
        Members count equally in their barycenter (eq. 15) or by ``num-examples``.
    opinion_space : {"weights", "updates"}, default "weights"
        HK on the trained models (the paper) or on their updates (our option).
    record_trajectories : bool, default False
        Hand each round's opinion dynamics to the observers (``TrajectoryWriter``).
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
    clients_per_round, fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, seed, node_wait_seconds, recorder
        As in :class:`SeededFedAvg`.
    """

    def __init__(self, *, geometry: str = HKParams.geometry, tau: float = HKParams.tau,
                 eps_l: float = HKParams.eps_l, eps_r: float = HKParams.eps_r, delta: float = HKParams.delta,
                 s_max: int = HKParams.s_max, coalition_tol: float = HKParams.coalition_tol,
                 opinions: str = HKParams.opinions,
                 barycenter_weighting: str = CoalitionParams.barycenter_weighting,
                 opinion_space: str = CoalitionParams.opinion_space,
                 record_trajectories: bool = CoalitionParams.record_trajectories,
                 coalition_models: str = ModelStoreParams.coalition_models,
                 min_coalition_fraction: float = CoalitionParams.min_coalition_fraction,
                 update_norm_bound: float = CoalitionParams.update_norm_bound,
                 clients_per_round: int | None = _S.clients_per_round, fraction_train: float = _S.fraction_train,
                 fraction_evaluate: float = _S.fraction_evaluate, min_train_nodes: int = _S.min_train_nodes,
                 min_evaluate_nodes: int = _S.min_evaluate_nodes, min_available_nodes: int = _S.min_available_nodes,
                 seed: int = _S.seed, node_wait_seconds: float = _S.node_wait_seconds,
                 recorder: Recorder | None = None) -> None:
        hk = HKParams(geometry=geometry, tau=tau, eps_l=eps_l, eps_r=eps_r, delta=delta, s_max=s_max,
                      coalition_tol=coalition_tol, opinions=opinions, barycenter_weighting=barycenter_weighting)
        coalitions = CoalitionParams(barycenter_weighting, opinion_space, record_trajectories, min_coalition_fraction,
                                     update_norm_bound)
        sampling = SamplingParams(clients_per_round, fraction_train, fraction_evaluate, min_train_nodes,
                                  min_evaluate_nodes, min_available_nodes, seed, node_wait_seconds)
        super().__init__(sampler=UniformSampler(sampling),
                         aggregator=Coalitions(HKRule(hk, record_trajectories), coalitions),
                         models=_store(coalition_models), observers=_observers(recorder))


class FixedKFedAvg(BouquetStrategy):
    """FedAvg whose aggregation partitions the round's models into K coalitions by k-means (the HK paper's baseline).

    Parameters
    ----------
    k : int, default 2
        Coalitions per round (fewer when fewer clients reply).
    geometry : {"euclidean", "cosine"}, default "euclidean"
        k-means on the models or on the unit-normalised models; seeded per round with ``[seed, round]``.
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
    coalition_models : {"shared", "personal"}, default "shared"
    min_coalition_fraction, update_norm_bound : float, default 0.0
        As in :class:`HKFedAvg` (0: the paper's eq. 16, no clipping).
    clients_per_round, fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, seed, node_wait_seconds, recorder
        As in :class:`SeededFedAvg`.
    """

    def __init__(self, *, k: int = FixedKParams.k, geometry: str = FixedKParams.geometry,
                 barycenter_weighting: str = CoalitionParams.barycenter_weighting,
                 coalition_models: str = ModelStoreParams.coalition_models,
                 min_coalition_fraction: float = CoalitionParams.min_coalition_fraction,
                 update_norm_bound: float = CoalitionParams.update_norm_bound,
                 clients_per_round: int | None = _S.clients_per_round, fraction_train: float = _S.fraction_train,
                 fraction_evaluate: float = _S.fraction_evaluate, min_train_nodes: int = _S.min_train_nodes,
                 min_evaluate_nodes: int = _S.min_evaluate_nodes, min_available_nodes: int = _S.min_available_nodes,
                 seed: int = _S.seed, node_wait_seconds: float = _S.node_wait_seconds,
                 recorder: Recorder | None = None) -> None:
        sampling = SamplingParams(clients_per_round, fraction_train, fraction_evaluate, min_train_nodes,
                                  min_evaluate_nodes, min_available_nodes, seed, node_wait_seconds)
        coalitions = CoalitionParams(barycenter_weighting=barycenter_weighting,
                                     min_coalition_fraction=min_coalition_fraction,
                                     update_norm_bound=update_norm_bound)
        super().__init__(sampler=UniformSampler(sampling),
                         aggregator=Coalitions(FixedKRule(FixedKParams(k, geometry)), coalitions),
                         models=_store(coalition_models), observers=_observers(recorder))


def selection_strategy(selector: Selector, aggregator: Aggregator | None = None, *,
                       clients_per_round: int, mode: str = SelectionParams.mode,
                       sketch_fraction: float = SelectionParams.sketch_fraction,
                       sketch_batch_size: int = SelectionParams.sketch_batch_size,
                       candidates_per_round: int = SelectionParams.candidates_per_round,
                       query_timeout: float = SelectionParams.query_timeout,
                       max_sketch_age: int = SelectionParams.max_sketch_age,
                       fraction_evaluate: float = _S.fraction_evaluate, min_evaluate_nodes: int = _S.min_evaluate_nodes,
                       min_available_nodes: int = _S.min_available_nodes, seed: int = _S.seed,
                       node_wait_seconds: float = _S.node_wait_seconds,
                       recorder: Recorder | None = None) -> BouquetStrategy:
    """``selector`` chooses who trains, ``aggregator`` combines their models (default: FedAvg's mean).

    Parameters
    ----------
    selector : bouquet.algorithms.selection.Selector
        SCKM-Select, SCKM-Cluster, Power-of-Choice, AFL, FedCor, ...
    aggregator : Aggregator, optional
        E.g. ``Coalitions(HKRule(HKParams(tau=0.75)))``; default :class:`WeightedMean`.
    clients_per_round : int
        The budget B.
    mode, sketch_fraction, sketch_batch_size, candidates_per_round, query_timeout, max_sketch_age
        See :class:`bouquet.strategies.params.SelectionParams`.
    fraction_evaluate, min_evaluate_nodes, min_available_nodes, seed, node_wait_seconds, recorder
        As in :class:`SeededFedAvg`.
    """
    sampling = SamplingParams(clients_per_round=clients_per_round, fraction_evaluate=fraction_evaluate,
                              min_evaluate_nodes=min_evaluate_nodes, min_available_nodes=min_available_nodes,
                              seed=seed, node_wait_seconds=node_wait_seconds)
    selection = SelectionParams(mode, sketch_fraction, sketch_batch_size, candidates_per_round, query_timeout,
                                max_sketch_age)
    return BouquetStrategy(sampler=SketchSelection(selector, sampling, selection),
                           aggregator=aggregator if aggregator is not None else WeightedMean(),
                           observers=_observers(recorder))


def ifca_strategy(params: IFCAParams, sampling: SamplingParams, initial_models: list[ArrayRecord] | None = None,
                  query_timeout: float = 600.0, recorder: Recorder | None = None) -> BouquetStrategy:
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
    recorder : Recorder, optional
    """
    if sampling.clients_per_round is not None and params.k > sampling.clients_per_round:
        raise ValueError(f"IFCA with k={params.k} clusters needs at least as many clients per round, "
                         f"got {sampling.clients_per_round}")
    return BouquetStrategy(sampler=IFCASampler(params, sampling, query_timeout), aggregator=ClusterMeans(),
                           models=ifca_models(params, sampling.seed, initial_models), observers=_observers(recorder))


def cfl_strategy(params: CFLParams, sampling: SamplingParams, recorder: Recorder | None = None) -> BouquetStrategy:
    """CFL (Sattler et al. 2020): one cluster trained by FedAvg, split in two whenever it stalls.

    Parameters
    ----------
    params : CFLParams
        The split thresholds ``eps1`` / ``eps2``, the warm-up, the smallest cluster split.
    sampling : SamplingParams
        The paper trains every client every round (``clients_per_round`` = all of them).
    recorder : Recorder, optional
    """
    return BouquetStrategy(sampler=UniformSampler(sampling), aggregator=CFLClusters(params), models=AssignedModels(),
                           observers=_observers(recorder))


def local_strategy(sampling: SamplingParams, recorder: Recorder | None = None) -> BouquetStrategy:
    """Local training, the no-federation reference: every client trains and keeps its own model.

    Parameters
    ----------
    sampling : SamplingParams
    recorder : Recorder, optional
    """
    return BouquetStrategy(sampler=UniformSampler(sampling), aggregator=LocalModels(), models=AssignedModels(),
                           observers=_observers(recorder))


def robust_strategy(rule: str, params: RobustRuleParams, sampling: SamplingParams,
                    recorder: Recorder | None = None) -> BouquetStrategy:
    """One of Flower's robust rules (Krum, MultiKrum, Bulyan, FedMedian, FedTrimmedAvg) behind seeded sampling.

    Parameters
    ----------
    rule : {"krum", "multikrum", "bulyan", "fedmedian", "fedtrimmedavg"}
    params : RobustRuleParams
        f (``num_malicious_nodes``), MultiKrum's m, FedTrimmedAvg's beta; Flower's defaults.
    sampling : SamplingParams
        Who is drawn each round (Krum and MultiKrum need ``2 f + 3`` replies, Bulyan ``4 f + 3``).
    recorder : Recorder, optional
    """
    return BouquetStrategy(sampler=UniformSampler(sampling), aggregator=FlowerRobustRule(rule, params),
                           observers=_observers(recorder))
