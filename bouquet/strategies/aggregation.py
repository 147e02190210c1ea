"""What a round's replies become: the aggregator parts (numpy in, numpy out; no Flower records).

An aggregator takes the round's :class:`bouquet.strategies.rounds.ClientUpdates` and returns an
:class:`bouquet.strategies.rounds.Aggregate`:

:class:`WeightedMean`
    FedAvg's sample-weighted mean, with exactly the arithmetic of Flower's ``aggregate_arrayrecords``
    (factors ``n_i / sum n`` as Python floats, accumulated array by array in reply order), so that a
    bouquet FedAvg gives Flower's FedAvg's model bit for bit on the same replies.
:class:`Coalitions`
    The HK paper's eq. 15-16: a :class:`CoalitionRule` partitions the round's models (or their updates)
    into coalitions and the next model is the uniform mean of the coalition barycenters.  Rules:
    :class:`HKRule` (Hegselmann-Krause bounded-confidence dynamics, :mod:`bouquet.algorithms.hk`) and
    :class:`FixedKRule` (k-means into K coalitions, the paper's "FL + Coalition" baseline).

Any object with ``label``, ``aggregate(updates)`` and ``describe()`` is an aggregator (a robust rule is
one more part).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bouquet.algorithms.coalitions_fixed_k import FixedKParams, fixed_k_coalitions
from bouquet.algorithms.groups import agreement
from bouquet.algorithms.hk import HKParams, gram_cosines, gram_matrix, hk_coalitions, opinion_trajectory_2d
from bouquet.algorithms.memory import (
    MAJORITY,
    MemoryParams,
    MemoryState,
    average_linkage,
    carry_keys,
    evidence_opinions,
    linkage_at_otsu,
    otsu_threshold,
    together_evidence,
)
from bouquet.algorithms.robust import clip_updates, direction_screen, robust_coalition_weights
from bouquet.strategies.hooks import Hook
from bouquet.strategies.params import CoalitionParams
from bouquet.strategies.rounds import Aggregate, ClientUpdates, RoundEvent

__all__ = ["Aggregator", "AggregatorDefaults", "CoalitionRule", "Coalitions", "FixedKRule", "HKRule", "Partition",
           "TrajectoryWriter", "WeightedMean", "fixed_k_aggregator", "hk_aggregator"]

log = logging.getLogger(__name__)


def _row_squares(matrix: np.ndarray) -> np.ndarray:
    """Each row's sum of squares (zero exactly where ``np.linalg.norm(row)`` is), without an S x d temporary."""
    return np.einsum("ij,ij->i", matrix, matrix)


def opinion_columns(prefixes: tuple[str, ...], layout: Any) -> np.ndarray | None:
    """The columns of a flat model (``layout``: :class:`bouquet.strategies.arrays.FlatLayout`) holding the
    arrays whose names start with one of ``prefixes``, in model order; None (every column) for no prefixes.

    Raises ValueError naming the model's arrays when a prefix matches none of them.
    """
    if not prefixes:
        return None
    unmatched = [prefix for prefix in prefixes if not any(name.startswith(prefix) for name in layout.names)]
    if unmatched:
        raise ValueError(f"hk-opinion-arrays: no model array starts with {', '.join(map(repr, unmatched))}; "
                         f"the model's arrays are {', '.join(layout.names)}")
    bounds = layout.bounds
    return np.concatenate([np.arange(start, stop) for name, start, stop in zip(layout.names, bounds, bounds[1:])
                           if name.startswith(prefixes)])


def _has_direction(matrix: np.ndarray, prefix: int = 1024) -> np.ndarray:
    """Per row: ``_row_squares(matrix) > 0``, mostly without reading the row.

    A row with a value of magnitude >= 1e-18 among its first ``prefix`` columns has a positive sum of
    squares (that value's square is a normal number even in float32, and adding squares never cancels it);
    only the other rows (a trained model's rarely) are summed whole.
    """
    settled = np.any(np.abs(matrix[:, :prefix]) >= 1e-18, axis=1)
    rest = np.flatnonzero(~settled)
    if rest.size:
        settled[rest] = _row_squares(matrix[rest]) > 0
    return settled


class Aggregator(Protocol):
    """Turns a round's updates into the next model (a part of :class:`bouquet.strategies.BouquetStrategy`).

    ``inner`` is the aggregator a wrapping part wraps (a server optimiser, an attack harness; None for the
    innermost); ``state_dict`` / ``load_state_dict`` are what the part learns across rounds (empty for most).
    :class:`AggregatorDefaults` gives the last three their do-nothing values.
    """

    label: str
    inner: Aggregator | None

    def aggregate(self, updates: ClientUpdates) -> Aggregate: ...

    def describe(self) -> list[str]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


class AggregatorDefaults:
    """The do-nothing half of the :class:`Aggregator` protocol: wraps no other aggregator, keeps no state."""

    inner: Aggregator | None = None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        return None


class WeightedMean(AggregatorDefaults):
    """FedAvg (McMahan et al. 2017): the mean of the models weighted by ``num-examples``."""

    label = "weighted mean"

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        total = sum(updates.num_examples)
        factors = [n / total for n in updates.num_examples]
        mean: dict[str, np.ndarray] = {}
        for model, factor in zip(updates.models, factors, strict=True):
            for name, value in model.items():
                if name not in mean:
                    mean[name] = value * factor
                else:
                    mean[name] += value * factor
        return Aggregate(model={name: np.asarray(value) for name, value in mean.items()},
                         node_ids=updates.node_ids)

    def describe(self) -> list[str]:
        return ["Aggregation: sample-weighted mean (FedAvg)"]


@dataclass(frozen=True)
class Partition:
    """A rule's answer: coalition id per row, facts for the round record, an optional trajectory."""

    labels: np.ndarray
    report: dict[str, Any]
    trajectory: dict[str, Any] | None = None


class CoalitionRule(Protocol):
    """Partitions the rows of an (S x d) opinion matrix into coalitions (ids 0..K-1).

    ``tau`` is the rule's own confidence bound (None: it has none, as fixed-K); ``tau_settable`` says whether
    :meth:`with_tau` gives the same rule at another bound (what coalition memory's Otsu threshold needs).
    """

    label: str
    tau: float | None
    tau_settable: bool

    def with_tau(self, tau: float) -> CoalitionRule: ...

    def partition(self, opinions: np.ndarray, node_ids: tuple[int, ...], updates: ClientUpdates) -> Partition: ...

    def describe(self) -> str: ...


class HKRule:
    """Hegselmann-Krause coalitions (HK paper eq. 10-14) on the Gram-space embedding.

    Parameters
    ----------
    params : HKParams
        Geometry, confidence bound and stopping rule (``barycenter_weighting`` is the aggregator's).
    record_trajectories : bool, default False
        Return each round's mixing matrices and Gram matrix (for Figure-3-style plots).
    """

    def __init__(self, params: HKParams | None = None, record_trajectories: bool = False) -> None:
        self.params = params if params is not None else HKParams()
        self.record_trajectories = record_trajectories
        self.label = f"HK {self.params.geometry} tau={self.params.tau}"

    tau_settable = True

    @property
    def tau(self) -> float | None:
        """The confidence bound the rule runs at (``params.tau``)."""
        return self.params.tau

    def partition(self, opinions: np.ndarray, node_ids: tuple[int, ...], updates: ClientUpdates) -> Partition:
        result = hk_coalitions(opinions, self.params, record=self.record_trajectories)
        if not result.converged:
            log.warning("round %d: HK stopped at s_max=%d before converging", updates.server_round, self.params.s_max)
        trajectory = None
        if self.record_trajectories:
            trajectory = {"node_ids": list(node_ids), "labels": result.labels, "history": result.history,
                          "gram": result.gram, "params": self.params}
        return Partition(result.labels, {"hk-steps": result.steps, "hk-converged": result.converged}, trajectory)

    def with_tau(self, tau: float) -> HKRule:
        """The same rule with confidence bound ``tau`` (coalition memory's Otsu threshold)."""
        return HKRule(dataclasses.replace(self.params, tau=tau), self.record_trajectories)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.params).items() if k != "barycenter_weighting")


class FixedKRule:
    """K coalitions by k-means on the models (or unit models), seeded per round with ``[seed, round]``.

    Parameters
    ----------
    params : FixedKParams
    """

    def __init__(self, params: FixedKParams | None = None) -> None:
        self.params = params if params is not None else FixedKParams()
        self.label = f"fixed-K {self.params.geometry} K={int(self.params.k)}"

    tau: float | None = None  # K coalitions, no confidence bound
    tau_settable = False

    def with_tau(self, tau: float) -> FixedKRule:
        raise ValueError(f"{self.label} has no confidence bound to set")

    def partition(self, opinions: np.ndarray, node_ids: tuple[int, ...], updates: ClientUpdates) -> Partition:
        seed = int(np.random.default_rng([updates.seed, updates.server_round]).integers(2**31))
        return Partition(fixed_k_coalitions(opinions, int(self.params.k), self.params.geometry, seed=seed), {})

    def describe(self) -> str:
        return f"K={int(self.params.k)}, {self.params.geometry}"


class Coalitions(AggregatorDefaults):
    """The uniform mean of coalition barycenters (HK paper eq. 15-16) under any :class:`CoalitionRule`.

    All-zero models are excluded with a warning naming the node (they have no direction, and no trained
    model is all zeros).  With ``opinion_space="updates"`` a client whose update is exactly zero is a
    singleton and the rule partitions the others.  The report holds K^t, the coalition sizes, the
    singletons and the rule's own facts; the ``coalitions`` table one row per member.

    Robust options (``params``; off by default, which is eq. 15-16 bit for bit): ``update_norm_bound``
    clips each update ``w_i - theta_i`` to that multiple of the round's median update norm before the rule
    and before averaging (the report lists the ``clipped-nodes``); ``update_min_cosine`` first leaves out
    of the round the replies whose update points away from the round's median update (``screened-nodes``);
    ``min_coalition_fraction`` leaves the
    coalitions smaller than that fraction of the round out of the shared model (``left-out`` clients; their
    coalition's barycenter is still their personal model).  See :mod:`bouquet.algorithms.robust`.

    Coalition memory (``memory``; off by default, the paper): each round's opinion cosines (or, with
    ``evidence = "together"``, whether the rule put a pair in one coalition this round) are added to a
    running per-pair evidence (:class:`bouquet.algorithms.memory.PairEvidence`, pairs updated only when both
    were sampled); coalitions are formed over every client seen, from the evidence, and keep the name most
    of their members held (:func:`bouquet.algorithms.memory.carry_keys`).  Every client of a coalition with
    a member sampled this round is then served that coalition's fresh barycenter (``assignment``), sampled
    or not; the others keep their model.  The round's shared model is eq. 16 over the round's coalitions.

    Parameters
    ----------
    rule : CoalitionRule
        :class:`HKRule` or :class:`FixedKRule` (or your own).
    params : CoalitionParams
        Barycenter weighting, opinion space, trajectory recording, the robust options.
    memory : MemoryParams, optional
        Coalition memory (off by default).
    """

    def __init__(self, rule: CoalitionRule, params: CoalitionParams | None = None,
                 memory: MemoryParams | None = None) -> None:
        self.rule = rule
        self.params = params if params is not None else CoalitionParams()
        self.memory = memory if memory is not None else MemoryParams()
        self.label = rule.label
        conflict = self.memory.rule_conflict(rule.label, has_tau=rule.tau is not None, sets_tau=rule.tau_settable)
        if conflict:
            raise ValueError(conflict)
        if self.memory.active:
            self.label += " with memory"
        self._state = MemoryState()  # across rounds: what coalition memory knows (empty while it is off)

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        matrix, layout = updates.stacked
        template = updates.models[0]
        nonzero = _has_direction(matrix)
        kept = updates
        if not nonzero.all():  # copy the matrix only when a row must go
            for node in np.asarray(updates.node_ids, dtype=np.uint64)[~nonzero]:
                log.warning("round %d: reply of node %d excluded: all-zero weights", updates.server_round, int(node))
            matrix = matrix[nonzero]
            kept = updates.subset(nonzero)
        robust: dict[str, Any] = {}
        if self.params.update_min_cosine > -1 or self.params.update_relative_cosine > 0:
            keep, screened_nodes = self._screen(matrix, layout, kept)
            robust = {"screened": len(screened_nodes), "screened-nodes": screened_nodes}
            if not keep.all():
                matrix = matrix[keep]
                kept = kept.subset(keep)
        if self.params.update_norm_bound > 0:
            matrix, clipped_nodes = self._clip(matrix, layout, kept)
            robust |= {"clipped": len(clipped_nodes), "clipped-nodes": clipped_nodes}
        if self.memory.active:
            labels, partition, names, served = self._remembered_partition(matrix, layout, kept)
        else:
            labels, partition = self._partition(matrix, layout, kept)
        examples = None
        if self.params.barycenter_weighting == "samples":
            examples = np.array([float(n) for n in kept.num_examples])
        coefficients = robust_coalition_weights(labels, examples, self.params.min_coalition_fraction)
        aggregate = coefficients.astype(matrix.dtype) @ matrix
        if self.params.min_coalition_fraction > 0:
            robust["left-out"] = int((coefficients == 0).sum())
        sizes_by_label = np.bincount(labels)
        sizes = sorted(sizes_by_label.tolist(), reverse=True)
        report = {"coalitions": len(sizes), "coalition-sizes": sizes,
                  "singletons": int(sum(1 for s in sizes if s == 1)), "excluded-zero": int((~nonzero).sum()),
                  **robust, **partition.report}
        groups = kept.groups()
        if groups is not None:
            report["ari"] = agreement(groups, labels.tolist())
        rows = [{"round": updates.server_round, "node_id": node, **identity, "coalition": int(label),
                 "coalition_size": int(sizes_by_label[label])}
                for node, identity, label in zip(kept.node_ids, kept.identities, labels)]
        if self.memory.active:
            keys, assignment = names, served
        else:
            keys = {label: f"r{updates.server_round}-c{label}" for label in range(len(sizes_by_label))}
            assignment = {node: keys[int(label)] for node, label in zip(kept.node_ids, labels)}
        models, model_rows = self._barycenters(matrix, layout, template, labels, examples, kept, keys)
        artifacts = {"hk-trajectory": partition.trajectory} if partition.trajectory is not None else {}
        summary = (f"{self.label} -> K={len(sizes)} coalitions, sizes {sizes}, {report['singletons']} singletons"
                   + "".join(f", {k} {v}" for k, v in partition.report.items())
                   + "".join(f", {k} {v}" for k, v in robust.items() if not k.endswith("-nodes")))
        return Aggregate(model=layout.unflatten(aggregate, template), report=report,
                         tables={"coalitions": rows, "coalition_models": model_rows}, artifacts=artifacts,
                         labels=labels, node_ids=kept.node_ids, summary=summary,
                         groups={keys[label]: model for label, model in enumerate(models)},
                         assignment=assignment)

    def _screen(self, matrix: np.ndarray, layout: Any, kept: ClientUpdates) -> tuple[np.ndarray, list[int]]:
        """Which replies the direction screen keeps (``update_min_cosine``, ``update_relative_cosine``), and the
        nodes it left out."""
        references = kept.reference_matrix(layout, matrix.dtype)
        keep, cosines = direction_screen(matrix - references, self.params.update_min_cosine,
                                         self.params.update_relative_cosine)
        for row in np.flatnonzero(~keep):
            log.info("round %d: reply of node %d left out: its update's cosine with the median update is %.3f",
                     kept.server_round, int(kept.node_ids[row]), cosines[row])
        return keep, [int(kept.node_ids[row]) for row in np.flatnonzero(~keep)]

    def _clip(self, matrix: np.ndarray, layout: Any, kept: ClientUpdates) -> tuple[np.ndarray, list[int]]:
        """The models with each update clipped to ``update_norm_bound`` x the median norm, and who was clipped."""
        references = kept.reference_matrix(layout, matrix.dtype)
        clipped, factors = clip_updates(matrix - references, self.params.update_norm_bound)
        rows = np.flatnonzero(factors < 1.0)
        if not rows.size:
            return matrix, []
        matrix = matrix.copy()  # the stacked replies are shared with the round's other readers
        matrix[rows] = references[rows] + clipped[rows]
        for row in rows:
            log.info("round %d: update of node %d clipped by %.3g", kept.server_round, int(kept.node_ids[row]),
                     factors[row])
        return matrix, [int(kept.node_ids[row]) for row in rows]

    @staticmethod
    def _barycenters(matrix: np.ndarray, layout: Any, template: Any, labels: np.ndarray, examples: np.ndarray | None,
                     kept: ClientUpdates, keys: dict[int, str]) -> tuple[list[Any], list[dict[str, Any]]]:
        """Each coalition's barycenter (eq. 15: the model of a coalition, served with personal models)."""
        count = int(labels.max()) + 1
        within = np.ones(len(labels)) if examples is None else examples
        member = labels[None, :] == np.arange(count)[:, None]
        mixing = member * within[None, :] / (member * within[None, :]).sum(axis=1, keepdims=True)
        barycenters = mixing.astype(matrix.dtype) @ matrix
        names = [identity.get("partition-id", "") if identity else "" for identity in kept.identities]
        names = [name if name != "" else node for name, node in zip(names or [""] * len(labels), kept.node_ids)]
        rows = [{"round": kept.server_round, "coalition": keys[c],
                 "members": " ".join(str(n) for n, m in zip(names, member[c]) if m), "size": int(member[c].sum()),
                 "model-norm": float(np.linalg.norm(barycenters[c].astype(np.float64)))} for c in range(count)]
        return [layout.unflatten(row, template) for row in barycenters], rows

    def _opinions(self, matrix: np.ndarray, layout: Any, kept: ClientUpdates) -> np.ndarray:
        """The rows the rule reads: the models, or their updates ``w_i - theta_i``, at the opinion arrays'
        columns (all unless ``opinion_arrays`` names some)."""
        columns = opinion_columns(self.params.opinion_prefixes, layout)
        chosen = matrix if columns is None else matrix[:, columns]
        if self.params.opinion_space == "weights":
            return chosen
        return chosen - kept.reference_matrix(layout, matrix.dtype, columns)

    def _partition(self, matrix: np.ndarray, layout: Any, kept: ClientUpdates) -> tuple[np.ndarray, Partition]:
        opinions = self._opinions(matrix, layout, kept)
        if self.params.opinion_space == "weights":
            partition = self.rule.partition(opinions, kept.node_ids, kept)
            return partition.labels, partition
        return self._rule_on(opinions, _has_direction(opinions), kept)

    def _rule_on(self, opinions: np.ndarray, direction: np.ndarray, kept: ClientUpdates
                 ) -> tuple[np.ndarray, Partition]:
        """The rule on the opinions that have a ``direction`` (:func:`_has_direction`); an all-zero row (no
        update) is a singleton."""
        still = ~direction
        if not still.any():
            partition = self.rule.partition(opinions, kept.node_ids, kept)
            return partition.labels, partition
        # no update, no direction: a singleton each, the rule on the others
        labels = np.empty(len(opinions), dtype=int)
        moved = np.flatnonzero(~still)
        if not moved.size:
            return np.arange(len(opinions)), Partition(np.arange(len(opinions)), {})
        partition = self.rule.partition(opinions[moved], tuple(kept.node_ids[i] for i in moved), kept)
        labels[moved] = partition.labels
        labels[still] = partition.labels.max() + 1 + np.arange(still.sum())
        return labels, partition

    def _remembered_partition(self, matrix: np.ndarray, layout: Any, kept: ClientUpdates
                              ) -> tuple[np.ndarray, Partition, dict[int, str], dict[int, str]]:
        """Coalitions from the evidence of every round so far: the round's labels (0..K-1) and facts, each
        label's name, and the clients served each named coalition's fresh model."""
        memory = self.memory
        opinions = self._opinions(matrix, layout, kept)
        state = self._state
        facts: dict[str, Any] = {}
        rule_tau = self.rule.tau  # fixed-K has none
        if memory.evidence == "together":  # the rule's own coalitions this round, counted per pair
            direction = _has_direction(opinions)
            round_labels, this_round = self._rule_on(opinions, direction, kept)
            moved = np.flatnonzero(direction)  # a zero update has no direction: no evidence this round
            values, observed = together_evidence(round_labels[moved])
            evidence = state.evidence.update([kept.node_ids[i] for i in moved], values, memory.decay, observed)
            facts = {**this_round.report, "round-coalitions": int(np.unique(round_labels).size)}
        else:
            gram = gram_matrix(opinions)
            moved = np.flatnonzero(np.diag(gram) > 0)  # a zero update has no direction: no evidence this round
            cosines = gram_cosines(gram[np.ix_(moved, moved)])
            ids = [kept.node_ids[i] for i in moved]
            if memory.evidence == "stacked":  # the cosine evidence's coalitions, counted per pair
                first = state.first.update(ids, cosines, memory.decay)
                first_labels, first_tau = linkage_at_otsu(first, MAJORITY if rule_tau is None else rule_tau)
                at = {node: i for i, node in enumerate(first.nodes)}
                round_labels = first_labels[[at[node] for node in ids]]
                values, observed = together_evidence(round_labels)
                evidence = state.evidence.update(ids, values, memory.decay, observed)
                facts = {"first-tau": float(first_tau), "round-coalitions": int(np.unique(round_labels).size)}
                state = dataclasses.replace(state, first=first)
            else:
                evidence = state.evidence.update(ids, cosines, memory.decay)
        mean = evidence.mean()
        nodes = evidence.nodes
        tau = MAJORITY if memory.tau == "majority" else rule_tau
        if memory.tau == "otsu":  # over the pairs seen together
            values = mean[np.triu(evidence.weight > 0, 1)]
            tau = otsu_threshold(values) if np.unique(values).size > 1 else tau
        report: dict[str, Any] = {"memory-clients": len(nodes)}
        if tau is not None:
            report["memory-tau"] = float(tau)
        if memory.formation == "linkage":
            everyone = average_linkage(mean, float(tau))
        else:
            rule = self.rule.with_tau(float(tau)) if memory.tau == "otsu" and tau is not None else self.rule
            ruled = rule.partition(evidence_opinions(mean), nodes, kept)
            everyone, facts = ruled.labels, ruled.report
        report["memory-coalitions"] = int(everyone.max()) + 1
        named, next_id = carry_keys(everyone, nodes, state.names, state.next_id)
        name_of = {node: named[int(label)] for node, label in zip(nodes, everyone)}
        for i in np.setdiff1d(np.arange(len(kept.node_ids)), moved):  # no update and never seen: its own
            if kept.node_ids[i] not in name_of:
                name_of[kept.node_ids[i]] = f"c{next_id}"
                next_id += 1
        round_names = list(dict.fromkeys(name_of[node] for node in kept.node_ids))
        label_of = {name: label for label, name in enumerate(round_names)}
        labels = np.array([label_of[name_of[node]] for node in kept.node_ids], dtype=int)
        fresh = set(round_names)
        served = {node: name for node, name in name_of.items() if name in fresh}
        self._state = MemoryState(evidence, {**state.names, **served}, next_id, state.first)
        return labels, Partition(labels, {**facts, **report}), dict(enumerate(round_names)), served

    def state_dict(self) -> dict[str, Any]:
        """Coalition memory's state, JSON-able (empty while memory is off): what a checkpoint keeps."""
        return {"memory": self._state.to_json()} if self.memory.active else {}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Go on from :meth:`state_dict`; memory on and no memory state is an error naming the key."""
        if not self.memory.active:
            return
        if not state or "memory" not in state:
            raise ValueError("coalition-memory is on, but the state holds no coalition memory (a checkpoint "
                             "written with coalition-memory = false or by an older bouquet): resume with "
                             "coalition-memory = false, or start a new run")
        self._state = MemoryState.from_json(state["memory"])

    def describe(self) -> list[str]:
        p = self.params
        line = (f"Aggregation: {self.rule.label} coalitions ({self.rule.describe()}), barycenters "
                f"{p.barycenter_weighting}, opinions = {p.opinion_space}"
                + (f" of the arrays {', '.join(p.opinion_prefixes)}*" if p.opinion_prefixes else ""))
        if self.memory.active:
            m = self.memory
            line += (f", coalition memory ({m.evidence} evidence, decay {m.decay:g}, tau {m.tau}, formation "
                     f"{m.formation}; coalitions keep "
                     "their names, and every member is served its coalition's fresh model)")
        if p.update_min_cosine > -1:
            line += f", updates with a cosine under {p.update_min_cosine:g} with the median update left out"
        if p.update_relative_cosine > 0:
            line += (f", updates with a cosine under {p.update_relative_cosine:g} x the round's median cosine "
                     "left out")
        if p.update_norm_bound > 0:
            line += f", updates clipped at {p.update_norm_bound:g} x the median norm"
        if p.min_coalition_fraction > 0:
            line += f", coalitions under {p.min_coalition_fraction:g} of the round left out of the shared model"
        return [line]


def hk_aggregator(hk: HKParams, coalitions: CoalitionParams, memory: MemoryParams | None = None) -> Coalitions:
    """HK coalitions (eq. 10-16) as the app's ``hk-*`` strategies and :class:`~bouquet.strategies.HKFedAvg` build
    them: the rule records trajectories when ``coalitions.record_trajectories``."""
    return Coalitions(HKRule(hk, coalitions.record_trajectories), coalitions, memory)


def fixed_k_aggregator(fixed_k: FixedKParams, coalitions: CoalitionParams,
                       memory: MemoryParams | None = None) -> Coalitions:
    """Fixed-K coalitions (the HK paper's baseline) as the app's ``fixed-k-*`` strategies and
    :class:`~bouquet.strategies.FixedKFedAvg` build them: k-means partitions the trained models, so of the
    coalition options only the barycenter weighting and the robust ones apply (no opinion space, no opinion
    arrays, no trajectories)."""
    kept = CoalitionParams(barycenter_weighting=coalitions.barycenter_weighting,
                           min_coalition_fraction=coalitions.min_coalition_fraction,
                           update_norm_bound=coalitions.update_norm_bound,
                           update_min_cosine=coalitions.update_min_cosine,
                           update_relative_cosine=coalitions.update_relative_cosine)
    return Coalitions(FixedKRule(fixed_k), kept, memory)


class TrajectoryWriter(Hook):
    """One ``round-NNN.npz`` per round in ``folder``: HK's opinions projected to 2-D per inner step.

    Needs an HK aggregation that records trajectories (``CoalitionParams(record_trajectories=True)``);
    each file holds ``projection`` (steps + 1, S, 2), ``labels`` and ``node_ids``.

    Parameters
    ----------
    folder : str or Path
        Created on the first trajectory.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def on_event(self, event: RoundEvent) -> None:
        trajectory = event.artifacts.get("hk-trajectory")
        if trajectory is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        projection = opinion_trajectory_2d(trajectory["history"], trajectory["gram"], trajectory["params"])
        np.savez(self.folder / f"round-{event.server_round:03d}.npz", projection=projection,
                 labels=trajectory["labels"], node_ids=np.array(trajectory["node_ids"], dtype=np.uint64))
