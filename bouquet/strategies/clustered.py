"""Clustered FL peers of HK as strategy parts: IFCA, CFL, and local training (no federation).

**IFCA** (Ghosh et al. 2020) is a sampler and an aggregator over an
:class:`~bouquet.strategies.models.AssignedModels` store holding K cluster models
(``cluster-0`` ... ``cluster-<K-1>``): :class:`IFCASampler` draws the round's clients as
:class:`~bouquet.strategies.sampling.UniformSampler` does, sends them the K models in a
``query.losses`` message (:mod:`bouquet.losses`), and assigns each to its lowest-loss cluster before
the training messages go out; :class:`ClusterMeans` averages the returned models within each cluster
(sample-weighted, FedAvg's arithmetic).  Evaluators that never trained are asked the same way, so each
client is scored with the cluster it would pick.

**CFL** (Sattler et al. 2020) is an aggregator, :class:`CFLClusters`: each cluster (at first, every
client under the shared model) is averaged as FedAvg does; a cluster that meets the split criterion is
split in two by the cosine similarities of its clients' updates, the halves keyed ``<cluster>.0`` and
``<cluster>.1`` (the first split's ``cfl-0`` and ``cfl-1``).

**Local** (:class:`LocalModels`): every client keeps the model it trained; nothing is averaged (the
no-federation reference).  All three report the clusters against the clients' true groups (adjusted Rand
index) when the clients report one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from bouquet.algorithms.clustered import (
    CFLParams,
    IFCAParams,
    cfl_bipartition,
    cfl_split_criterion,
    cosine_similarities,
    ifca_assign,
    perturbed,
)
from bouquet.algorithms.groups import agreement
from bouquet.queries import LOSSES_ACTION
from bouquet.strategies.aggregation import AggregatorDefaults, WeightedMean
from bouquet.strategies.arrays import Model, to_numpy, to_record
from bouquet.strategies.models import SHARED, AssignedModels
from bouquet.strategies.params import SamplingParams, SelectionParams
from bouquet.strategies.rounds import Aggregate, ClientUpdates, RoundContext, Sample
from bouquet.strategies.sampling import StatelessSampler, UniformSampler

__all__ = ["CFLClusters", "ClusterMeans", "IFCASampler", "LocalModels", "cluster_keys", "ifca_models"]

log = logging.getLogger(__name__)


def cluster_keys(k: int) -> list[str]:
    """IFCA's model keys in the store: ``cluster-0`` ... ``cluster-<k-1>``."""
    return [f"cluster-{c}" for c in range(int(k))]


def ifca_models(params: IFCAParams, seed: int, initial_models: list[ArrayRecord] | None = None) -> AssignedModels:
    """The store of IFCA's K models: ``initial_models`` if given, else the first adopted model perturbed
    K times (:func:`bouquet.algorithms.clustered.perturbed`, seeded by ``[seed, k]``)."""
    keys = cluster_keys(params.k)
    if initial_models is not None:
        if len(initial_models) != len(keys):
            raise ValueError(f"IFCA with k={params.k} needs {len(keys)} initial models, got {len(initial_models)}")
        return AssignedModels(initial_groups=dict(zip(keys, initial_models)))

    def seed_groups(arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        base = to_numpy(arrays)
        return {key: to_record(perturbed(base, params.init_scale, np.random.default_rng([seed, c])))
                for c, key in enumerate(keys)}

    return AssignedModels(seed_groups=seed_groups)


def _partition_report(updates: ClientUpdates, keys: list[str]) -> tuple[dict[str, Any], list[dict]]:
    """Sizes of the partition ``keys`` (one per update), its agreement with true groups, and member rows."""
    names, counts = np.unique(np.array(keys), return_counts=True)
    sizes = sorted(counts.tolist(), reverse=True)
    report: dict[str, Any] = {"coalitions": len(names), "coalition-sizes": sizes,
                              "singletons": int(sum(1 for s in sizes if s == 1))}
    groups = updates.groups()
    if groups is not None:
        report["ari"] = agreement(groups, keys)
    size = dict(zip(names.tolist(), counts.tolist()))
    rows = [{"round": updates.server_round, "node_id": node, **identity, "coalition": key,
             "coalition_size": size[key]} for node, identity, key in zip(updates.node_ids, updates.identities, keys)]
    return report, rows


def _model_rows(server_round: int, models: dict[str, Model], members: dict[str, list[Any]]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted(models):
        vector = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in models[key].values()])
        rows.append({"round": server_round, "coalition": key, "members": " ".join(str(m) for m in members[key]),
                     "size": len(members[key]), "model-norm": float(np.linalg.norm(vector))})
    return rows


def _names(updates: ClientUpdates) -> list[Any]:
    """Partition ids where the clients report them, else node ids."""
    names = [identity.get("partition-id", "") for identity in updates.identities] or [""] * len(updates)
    return [name if name != "" else node for name, node in zip(names, updates.node_ids)]


class IFCASampler(StatelessSampler):
    """IFCA's client side of a round: uniform draw, then each client joins its lowest-loss cluster.  It learns from
    its loss query, not from the replies, and keeps nothing beyond the store's assignment (the store's state).

    Parameters
    ----------
    params : IFCAParams
    sampling : SamplingParams
        Who is drawn (as :class:`~bouquet.strategies.sampling.UniformSampler`) and evaluated.
    query_timeout : float, default 600
        Seconds to wait for the loss replies; a node that fails or is late is not trained this round.
    """

    #: Why aggregation needs the configured round (each reply's cluster is the one chosen there).
    configure_needed = "each client's cluster is chosen by its losses in configure_train"

    def __init__(self, params: IFCAParams, sampling: SamplingParams,
                 query_timeout: float = SelectionParams.query_timeout) -> None:
        self.params = params
        self.sampling = sampling
        self.query_timeout = query_timeout
        self._uniform = UniformSampler(sampling)
        self.keys = cluster_keys(params.k)

    def _ask(self, context: RoundContext, nodes: list[int], phase: str) -> tuple[dict[int, str], dict[str, Any]]:
        """Assignments of ``nodes`` to their lowest-loss cluster, and facts about the query."""
        if not nodes:
            return {}, {}
        config = ConfigRecord({"server-round": context.server_round, "loss-examples": self.params.loss_examples,
                               "loss-seed": [self.sampling.seed, context.server_round]})
        content = RecordDict({**{f"model-{c}": context.models.model(key) for c, key in enumerate(self.keys)},
                              "config": config})
        messages = [context.new_message(content, f"query.{LOSSES_ACTION}", n, str(context.server_round))
                    for n in nodes]
        started = time.perf_counter()
        replies = {m.metadata.src_node_id: m for m in context.exchange(messages, self.query_timeout)}
        answered, losses = [], []
        for node in nodes:
            reply = replies.get(node)
            values = None
            if reply is not None and not reply.has_error() and "losses" in reply.content.config_records:
                values = [float(v) for v in reply.content.config_records["losses"]["values"]]
            if values is None or len(values) != len(self.keys):
                why = "no reply" if reply is None else reply.error.reason if reply.has_error() else "malformed reply"
                log.warning("round %d: IFCA loss query to node %d failed (%s)", context.server_round, node, why)
                continue
            answered.append(node)
            losses.append(values)
        choice = ifca_assign(np.array(losses)) if losses else np.array([], dtype=int)
        assignment = {node: self.keys[int(c)] for node, c in zip(answered, choice)}
        facts = {f"{phase}-query-seconds": time.perf_counter() - started,
                 f"{phase}-query-failed": sorted(set(nodes) - set(answered))}
        return assignment, facts

    def sample_train(self, context: RoundContext) -> Sample:
        drawn = list(self._uniform.sample_train(context).node_ids)
        assignment, facts = self._ask(context, drawn, "train")
        chosen = [n for n in drawn if n in assignment]
        counts = {key: sum(1 for n in chosen if assignment[n] == key) for key in self.keys}
        report = {"candidates": len(drawn), "selected": chosen, **facts, "cluster-sizes": list(counts.values())}
        summary = f"IFCA K={len(self.keys)}: clusters chosen {list(counts.values())}"
        return Sample(tuple(chosen), report=report, label="ifca", summary=summary, assignment=assignment)

    def sample_evaluate(self, context: RoundContext) -> Sample:
        nodes = list(self._uniform.sample_evaluate(context).node_ids)
        return Sample(tuple(nodes), assignment=self.assign_nodes(context, nodes))

    def assign_nodes(self, context: RoundContext, nodes: list[int]) -> dict[int, str]:
        """Assign the nodes among ``nodes`` that never trained to their lowest-loss cluster (by asking them)."""
        fresh = [n for n in nodes if context.models.key_for(n) == SHARED]
        return self._ask(context, fresh, "evaluate")[0]

    def describe(self) -> list[str]:
        return [f"Sampling: IFCA, K={len(self.keys)} clusters, {self._uniform.describe()[0].removeprefix('Sampling: ')}"]


def _means(updates: ClientUpdates, keys: list[str]) -> dict[str, Model]:
    """FedAvg's sample-weighted mean of the models within each key."""
    out = {}
    mean = WeightedMean()
    for key in dict.fromkeys(keys):
        out[key] = mean.aggregate(updates.subset([k == key for k in keys])).model
    return out


class ClusterMeans(AggregatorDefaults):
    """IFCA's aggregation: within each cluster, the sample-weighted mean of its clients' models.

    A cluster no client chose this round keeps its model (the store keeps it).  The shared model
    (served to nodes never assigned) is the mean over all replies.
    """

    label = "IFCA cluster means"

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        keys = list(updates.keys())
        report, rows = _partition_report(updates, keys)
        groups = _means(updates, keys)
        names = _names(updates)
        members = {key: [n for n, k in zip(names, keys) if k == key] for key in groups}
        summary = f"IFCA -> clusters {dict(sorted(Counter(keys).items()))}"
        return Aggregate(model=WeightedMean().aggregate(updates).model, report=report,
                         tables={"coalitions": rows, "coalition_models": _model_rows(updates.server_round, groups,
                                                                                     members)},
                         node_ids=updates.node_ids, summary=summary, groups=groups,
                         assignment=dict(zip(updates.node_ids, keys)))

    def describe(self) -> list[str]:
        return ["Aggregation: IFCA, the sample-weighted mean within each cluster"]


class CFLClusters(AggregatorDefaults):
    """CFL's aggregation: FedAvg within each cluster, and a split when the cluster has stalled.

    Within each cluster (the key of the model its clients were sent; at first every client is in the
    shared model's cluster): the updates ``w_i - theta`` decide the split
    (:func:`~bouquet.algorithms.clustered.cfl_split_criterion`); a split cluster's halves
    (:func:`~bouquet.algorithms.clustered.cfl_bipartition` of the updates' cosine similarities) are keyed
    ``<key>.0`` and ``<key>.1`` (the shared cluster's halves ``cfl-0`` and ``cfl-1``).  Each (new) cluster's
    model is the uniform mean of its members' models, as in the authors' code.

    Parameters
    ----------
    params : CFLParams
    """

    label = "CFL"

    def __init__(self, params: CFLParams | None = None) -> None:
        self.params = params if params is not None else CFLParams()

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        matrix, layout = updates.stacked
        deltas = matrix.astype(np.float64) - updates.reference_matrix(layout, np.float64)
        sent = list(updates.keys())
        keys = list(sent)
        norms, splits = {}, []
        for key in dict.fromkeys(sent):
            rows = [i for i, k in enumerate(sent) if k == key]
            split, mean_norm, max_norm = cfl_split_criterion(deltas[rows], self.params, updates.server_round)
            norms[key] = (round(mean_norm, 6), round(max_norm, 6))
            if split:
                halves = cfl_bipartition(cosine_similarities(deltas[rows]))
                stem = "cfl-" if key == SHARED else f"{key}."
                for i, half in zip(rows, halves):
                    keys[i] = f"{stem}{int(half)}"
                splits.append(key)
        report, rows_out = _partition_report(updates, keys)
        report |= {"cfl-splits": splits, "cfl-update-norms": {k: list(v) for k, v in norms.items()}}
        uniform = ClientUpdates(updates.server_round, updates.seed, updates.node_ids, updates.models,
                                (1,) * len(updates), updates.references, updates.identities, updates.model_keys)
        groups = _means(uniform, keys)
        names = _names(updates)
        members = {key: [n for n, k in zip(names, keys) if k == key] for key in groups}
        summary = (f"CFL -> {len(groups)} clusters this round {sorted(members, key=str)}"
                   + (f", split {splits}" if splits else ""))
        return Aggregate(model=WeightedMean().aggregate(uniform).model, report=report,
                         tables={"coalitions": rows_out,
                                 "coalition_models": _model_rows(updates.server_round, groups, members)},
                         node_ids=updates.node_ids, summary=summary, groups=groups,
                         assignment=dict(zip(updates.node_ids, keys)))

    def describe(self) -> list[str]:
        p = self.params
        return [(f"Aggregation: CFL (split when mean update norm < {p.eps1} and max > {p.eps2}, after round "
                f"{p.warmup}, clusters of >= {p.min_size})")]


class LocalModels(AggregatorDefaults):
    """Local training: each client keeps the model it trained (no averaging; the shared model stays)."""

    label = "local"

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        keys = [f"own-{node}" for node in updates.node_ids]
        groups = dict(zip(keys, updates.models))
        return Aggregate(model=None, report={"coalitions": len(keys)}, node_ids=updates.node_ids, groups=groups,
                         assignment=dict(zip(updates.node_ids, keys)))

    def describe(self) -> list[str]:
        return ["Aggregation: none, every client keeps its own model (local training)"]
