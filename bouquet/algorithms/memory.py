"""Coalition memory: evidence about which clients belong together, accumulated across rounds.

The HK paper forms each round's coalitions (eq. 10-14) from that round's models alone.  With small local
training, one round's update cosines separate groups only on average (rotated digits: median 0.25 within a
group, 0.05 between, widely overlapping), and once a group's model has converged its clients' updates are
mostly noise, so per-round coalitions form late and later dissolve (docs/results/groups.md, "Known groups").

:class:`PairEvidence` keeps, for every pair of clients ever sampled together, a decayed running mean of the
cosine of their opinions (updates or weights), updated only in the rounds where *both* took part::

    s_ij <- lambda s_ij + c_ij,    n_ij <- lambda n_ij + 1,    E_ij = s_ij / n_ij

(``lambda`` = ``decay`` in (0, 1]; 1 is the plain mean over the rounds the pair was seen, smaller values weigh
recent rounds more; a pair seen once has ``E_ij = c_ij`` whatever ``lambda``).  Coalitions are then formed
over *every* client with evidence from an opinion matrix whose Gram matrix is ``E``
(:func:`evidence_opinions`), so a client keeps its coalition in rounds it is not sampled, and
:func:`carry_keys` gives each new coalition the key of the previous one most of its members held, so
coalitions (and their models) keep their names from round to round.

With ``evidence = "together"`` the value a round adds for a pair is not a cosine but whether the
aggregator's own rule put the two in one coalition that round (:func:`together_evidence`), and only the pairs
with at least one of the two in a coalition are updated: ``E_ij`` is then the share of the informative rounds
the pair spent together (a co-association matrix, Fred and Jain 2005), and average linkage at the majority
(0.5) forms the coalitions.  The first round's coalitions are the rule's own, and a group the rule stops
finding once its model has converged (every member alone) keeps the evidence it had.

With ``evidence = "stacked"`` the two are stacked: the cosine evidence (first level, decay ``lambda``) is
joined by average linkage at Otsu's threshold each round, and the coalitions that gives the round's clients
are counted as ``together`` evidence (second level), joined by average linkage at the majority.  The first
level finds groups whose opinions separate at once (the image models' feature extractors: the groups in round
1-3); the second keeps a group together through the rounds where the first level briefly merges or splits it
(converged models' updates are mostly noise): a majority vote over every round so far.

No Flower import: the strategy adapter is :class:`bouquet.strategies.aggregation.Coalitions`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from bouquet.algorithms.hk import gram_embedding
from bouquet.params import RunConfigKeys, require

__all__ = ["MAJORITY", "MEMORY_FORMS", "VALIDATED_FORM", "MemoryParams", "MemoryState", "PairEvidence",
           "average_linkage", "carry_keys", "evidence_opinions", "linkage_at_otsu", "memory_form", "otsu_threshold",
           "together_evidence"]

#: How the confidence bound with memory is set.
MEMORY_TAU = ("given", "otsu", "majority")
#: How coalitions are formed from the evidence.
MEMORY_FORMATION = ("rule", "linkage")
#: What a round adds to the evidence of a pair.
MEMORY_EVIDENCE = ("cosine", "together", "stacked")
#: The ``majority`` threshold: linked when together in more than half of the rounds that informed the pair.
MAJORITY = 0.5


@dataclass(frozen=True)
class MemoryParams:
    """Coalition memory (off by default: each round's coalitions from that round alone, as in the paper).

    Parameters
    ----------
    active : bool, default False
        Accumulate pair evidence across rounds and form coalitions over every client seen.
    decay : float, default 1.0
        ``lambda`` in (0, 1]: the weight of the evidence already held each time a pair is seen again.
    tau : {"given", "otsu"}, default "given"
        The similarity a coalition needs: the aggregator's (``hk-tau``), or each round the threshold that
        best splits the evidence values into two groups (:func:`otsu_threshold`; needs no test error and no
        validation run).
        ``"majority"`` is 0.5 on the ``together`` evidence (Fred and Jain's majority vote on a co-association
        matrix): linked when together in more than half of the rounds that informed the pair.
    formation : {"rule", "linkage"}, default "rule"
        Coalitions from the evidence by the aggregator's own rule on :func:`evidence_opinions` (HK, or
        fixed-K's k-means), or by :func:`average_linkage` at ``tau``.
    evidence : {"cosine", "together"}, default "cosine"
        What a round adds for a pair: the cosine of the two opinions, or whether the aggregator's rule put the
        two in one coalition that round (:func:`together_evidence`: 1 together, 0 apart with at least one of
        them in a coalition of two or more, nothing when both were alone: a round with no evidence either
        way).  ``together`` accumulates the rule's own per-round coalitions (evidence accumulation, Fred and
        Jain 2005) and needs ``formation = "linkage"``.  ``stacked``: the coalitions of the cosine evidence
        (decayed by ``decay``, joined by linkage at Otsu's threshold, :func:`linkage_at_otsu`) counted as
        ``together`` evidence; needs ``formation = "linkage"`` and ``tau = "majority"``.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        prefix="coalition-memory-",
        rename={"active": "coalition-memory"},
    )

    active: bool = False
    decay: float = 1.0
    tau: str = "given"
    formation: str = "rule"
    evidence: str = "cosine"

    def __post_init__(self) -> None:
        require(isinstance(self.decay, int | float) and math.isfinite(self.decay) and 0.0 < self.decay <= 1.0,
                "decay", f"coalition-memory-decay must be in (0, 1], got {self.decay!r}")
        require(self.tau in MEMORY_TAU, "tau", f"coalition-memory-tau must be one of {MEMORY_TAU}, got {self.tau!r}")
        require(self.formation in MEMORY_FORMATION, "formation",
                f"coalition-memory-formation must be one of {MEMORY_FORMATION}, got {self.formation!r}")
        require(self.evidence in MEMORY_EVIDENCE, "evidence",
                f"coalition-memory-evidence must be one of {MEMORY_EVIDENCE}, got {self.evidence!r}")
        require(self.evidence == "cosine" or self.formation == "linkage", "formation",
                f"coalition-memory-evidence {self.evidence!r} needs coalition-memory-formation = 'linkage' (the "
                "round's coalitions the evidence counts are already made)")
        require(self.tau != "majority" or self.evidence in ("together", "stacked"), "tau",
                "coalition-memory-tau 'majority' is a share of rounds together: it needs "
                "coalition-memory-evidence = 'together' or 'stacked'")
        require(self.evidence != "stacked" or self.tau == "majority", "tau",
                "coalition-memory-evidence 'stacked' joins its second level at the majority: it needs "
                "coalition-memory-tau = 'majority' (its first level always uses Otsu's threshold)")

    def rule_conflict(self, rule_label: str, has_tau: bool, sets_tau: bool) -> str | None:
        """Why this memory cannot run with a coalition rule, or None when it can.

        ``has_tau``: the rule has a threshold of its own (HK's ``tau``; fixed-K has K instead), which
        ``tau = "given"`` takes for linkage; ``sets_tau``: the rule can run at another threshold, which
        ``tau = "otsu"`` with ``formation = "rule"`` sets each round.
        """
        if not self.active:
            return None
        if self.tau == "given" and self.formation == "linkage" and not has_tau:
            return (f"coalition-memory-tau 'given' takes the rule's tau, and {rule_label} has none; with "
                    "coalition-memory-formation = 'linkage' use 'otsu'")
        if self.tau == "otsu" and self.formation == "rule" and not sets_tau:
            return (f"coalition-memory-tau 'otsu' sets a confidence bound, and {rule_label} has none; "
                    "'otsu' needs coalition-memory-formation = 'linkage'")
        return None


@dataclass(frozen=True)
class PairEvidence:
    """Decayed running sums of pair cosines over the clients seen so far (rows and columns in ``nodes`` order).

    Attributes
    ----------
    nodes : tuple of int
        The clients seen, in the order they were first seen.
    total : numpy.ndarray, shape (N, N)
        ``s_ij``: decayed sums of the cosines (float64, symmetric, zero where never seen together).
    weight : numpy.ndarray, shape (N, N)
        ``n_ij``: decayed counts of the rounds seen together (zero: never).
    """

    nodes: tuple[int, ...] = ()
    total: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    weight: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def __post_init__(self) -> None:
        n = len(self.nodes)
        if len(set(self.nodes)) != n:
            raise ValueError("PairEvidence: a node appears twice")
        if np.shape(self.total) != (n, n) or np.shape(self.weight) != (n, n):
            raise ValueError(f"PairEvidence: total and weight must be {n} x {n}, got {np.shape(self.total)} "
                             f"and {np.shape(self.weight)}")

    def update(self, node_ids: Sequence[int], cosines: np.ndarray, decay: float,
               observed: np.ndarray | None = None) -> PairEvidence:
        """The evidence after a round where ``node_ids`` took part with pairwise ``cosines`` (S x S).

        New nodes are appended; only the pairs among ``node_ids`` change (``s <- decay s + c``,
        ``n <- decay n + 1``), the diagonal included, and of those only the ones ``observed`` (S x S
        booleans, symmetric; all when None) marks: the others keep their evidence, undecayed.
        """
        node_ids = [int(node) for node in node_ids]
        cosines = np.asarray(cosines, dtype=np.float64)
        if cosines.shape != (len(node_ids), len(node_ids)) or len(set(node_ids)) != len(node_ids):
            raise ValueError(f"cosines must be {len(node_ids)} x {len(node_ids)} for distinct nodes, "
                             f"got {cosines.shape}")
        if not np.isfinite(cosines).all():
            raise ValueError("cosines must be finite")
        known = {node: i for i, node in enumerate(self.nodes)}
        nodes = self.nodes + tuple(node for node in node_ids if node not in known)
        n = len(nodes)
        total = np.zeros((n, n))
        weight = np.zeros((n, n))
        old = len(self.nodes)
        total[:old, :old] = self.total
        weight[:old, :old] = self.weight
        index = {node: i for i, node in enumerate(nodes)}
        at = np.array([index[node] for node in node_ids], dtype=int)
        block = np.ix_(at, at)
        if observed is None:
            total[block] = decay * total[block] + cosines
            weight[block] = decay * weight[block] + 1.0
        else:
            observed = np.asarray(observed, dtype=bool)
            if observed.shape != cosines.shape or not (observed == observed.T).all():
                raise ValueError(f"observed must be a symmetric {cosines.shape} boolean mask")
            total[block] = np.where(observed, decay * total[block] + cosines, total[block])
            weight[block] = np.where(observed, decay * weight[block] + 1.0, weight[block])
        return PairEvidence(nodes, total, weight)

    def mean(self) -> np.ndarray:
        """``E`` (N x N): the running mean cosine of each pair, 0 for pairs never seen together, 1 on the diagonal."""
        seen = self.weight > 0
        mean = np.divide(self.total, self.weight, out=np.zeros_like(self.total), where=seen)
        np.fill_diagonal(mean, 1.0)
        return mean


def together_evidence(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What one round's coalitions say about each pair: ``(values, observed)``, both S x S.

    ``values[i, j]`` is 1 when ``labels`` put ``i`` and ``j`` in one coalition, else 0; ``observed[i, j]``
    is false only when both were alone (a singleton each): with no coalition to join or leave, the round
    says nothing about the pair (a converged model's updates are mostly noise, and then every client is
    alone; counting that as "apart" would dissolve every coalition).  The diagonal is observed, 1.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one coalition id per client, got shape {labels.shape}")
    together = labels[:, None] == labels[None, :]
    coalition = np.unique(labels, return_inverse=True)[1]
    joined = np.bincount(coalition)[coalition] > 1  # in a coalition of two or more
    observed = joined[:, None] | joined[None, :]
    np.fill_diagonal(observed, True)
    return together.astype(np.float64), observed


def evidence_opinions(evidence: np.ndarray) -> np.ndarray:
    """Rows ``Y`` with ``Y Y^T`` the nearest positive semi-definite matrix to ``evidence``: the clients as
    opinions whose cosines are (up to that projection) the evidence, for HK or k-means.

    A running mean of cosines taken over different rounds for different pairs need not be positive
    semi-definite; its negative eigenvalues are set to zero (:func:`bouquet.algorithms.hk.gram_embedding`).
    """
    return gram_embedding(np.asarray(evidence, dtype=np.float64))


def average_linkage(similarity: np.ndarray, tau: float) -> np.ndarray:
    """Coalitions by average linkage: merge the two coalitions whose pairs have the highest mean similarity
    while that mean exceeds ``tau`` (UPGMA on ``1 - similarity``, scikit-learn's agglomerative clustering).

    Parameters
    ----------
    similarity : array, shape (N, N)
        Symmetric pair similarities (cosines or their running means), 1 on the diagonal.
    tau : float
        The mean similarity a merge needs.

    Returns
    -------
    numpy.ndarray of int, shape (N,)
        Coalition ids 0..K-1, numbered by each coalition's first member.
    """
    from sklearn.cluster import AgglomerativeClustering

    similarity = np.asarray(similarity, dtype=np.float64)
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1] or not np.isfinite(similarity).all():
        raise ValueError(f"similarity must be a finite square matrix, got shape {similarity.shape}")
    n = len(similarity)
    if n == 1:
        return np.zeros(1, dtype=int)
    distance = np.clip(1.0 - (similarity + similarity.T) / 2, 0.0, None)
    np.fill_diagonal(distance, 0.0)
    raw = AgglomerativeClustering(n_clusters=None, metric="precomputed", linkage="average",
                                  distance_threshold=1.0 - tau).fit(distance).labels_
    _, first = np.unique(raw, return_index=True)
    order = {int(raw[i]): rank for rank, i in enumerate(sorted(first))}
    return np.array([order[int(label)] for label in raw], dtype=int)


def otsu_threshold(values: np.ndarray) -> float:
    """The threshold that splits ``values`` into a low and a high group with the largest between-group
    variance (Otsu 1979), exactly (every split of the sorted values is tried); the midpoint between the two
    values it falls between.

    Raises ValueError for fewer than two distinct values.
    """
    ordered = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if ordered.size < 2 or ordered[0] == ordered[-1] or not np.isfinite(ordered).all():
        raise ValueError("otsu_threshold needs at least two distinct finite values")
    n = ordered.size
    low_count = np.arange(1, n)
    low_sum = np.cumsum(ordered)[:-1]
    low_mean = low_sum / low_count
    high_mean = (ordered.sum() - low_sum) / (n - low_count)
    between = low_count * (n - low_count) * (high_mean - low_mean) ** 2
    between[ordered[1:] == ordered[:-1]] = -1.0  # a split between equal values is no split
    split = int(np.argmax(between))
    return float((ordered[split] + ordered[split + 1]) / 2)


def linkage_at_otsu(evidence: PairEvidence, fallback: float) -> tuple[np.ndarray, float]:
    """Coalitions of every client in ``evidence`` by :func:`average_linkage` of its running means at
    :func:`otsu_threshold` over the pairs seen together (``fallback`` while those take fewer than two values).

    Returns
    -------
    (labels, tau)
        One coalition id per client of ``evidence.nodes`` and the threshold used.
    """
    mean = evidence.mean()
    values = mean[np.triu(evidence.weight > 0, 1)]
    tau = otsu_threshold(values) if np.unique(values).size > 1 else float(fallback)
    return average_linkage(mean, tau), tau


def carry_keys(labels: np.ndarray, nodes: Sequence[int], previous: Mapping[int, str],
               next_id: int) -> tuple[dict[int, str], int]:
    """Names for this round's coalitions: the previous name most of a coalition's members held.

    Coalitions claim names largest first (ties: lowest label); each name goes to one coalition at most,
    the one with most of its former members (ties: the larger coalition, then the lower label).  A
    coalition whose members held no free name gets ``c<next_id>`` and the counter moves on.

    Parameters
    ----------
    labels : array of int, shape (N,)
        Coalition of each node in ``nodes``.
    nodes : sequence of int
    previous : mapping of node -> name
        Each node's coalition name before this round (nodes not in it had none).
    next_id : int
        The number of the next new name.

    Returns
    -------
    (dict label -> name, the next new name's number)
    """
    labels = np.asarray(labels)
    if labels.shape != (len(nodes),):
        raise ValueError(f"one label per node expected, got {labels.shape} for {len(nodes)} nodes")
    sizes = Counter(int(label) for label in labels)
    votes: list[tuple[int, int, int, str]] = []  # (-former members, -size, label, name)
    for label in sizes:
        held = Counter(previous[node] for node, lab in zip(nodes, labels) if lab == label and node in previous)
        votes += [(-count, -sizes[label], label, name) for name, count in held.items()]
    names: dict[int, str] = {}
    taken: set[str] = set()
    for _, _, label, name in sorted(votes):
        if label not in names and name not in taken:
            names[label] = name
            taken.add(name)
    for label in sorted(sizes, key=lambda lab: (-sizes[lab], lab)):
        if label not in names:
            names[label] = f"c{next_id}"
            next_id += 1
    return names, next_id


@dataclass(frozen=True)
class MemoryState:
    """What coalition memory carries from round to round: the evidence and each client's coalition name.

    Attributes
    ----------
    evidence : PairEvidence
    names : dict of int -> str
        The coalition each client was last placed in (the key of the model it is served).
    next_id : int
        The number of the next new coalition name (``c<next_id>``).
    first : PairEvidence
        ``evidence = "stacked"``: the cosine evidence of the first level (empty otherwise).
    """

    evidence: PairEvidence = field(default_factory=PairEvidence)
    names: Mapping[int, str] = field(default_factory=dict)
    next_id: int = 0
    first: PairEvidence = field(default_factory=PairEvidence)

    def to_json(self) -> dict:
        """JSON-able (node ids as ints and as dict keys, so that a checkpoint can name them by stable key;
        floats as Python floats, which JSON carries to the bit)."""
        state = {"nodes": [int(node) for node in self.evidence.nodes],
                 "total": self.evidence.total.tolist(), "weight": self.evidence.weight.tolist(),
                 "names": {str(node): name for node, name in self.names.items()}, "next": f"c{self.next_id}"}
        if self.first.nodes:  # stacked evidence only: the other forms' states are as before
            state["first"] = {"nodes": [int(node) for node in self.first.nodes], "total": self.first.total.tolist(),
                              "weight": self.first.weight.tolist()}
        return state

    @classmethod
    def from_json(cls, state: Mapping) -> MemoryState:
        """The inverse of :meth:`to_json`."""
        def evidence(part: Mapping) -> PairEvidence:
            nodes = tuple(int(node) for node in part["nodes"])
            n = len(nodes)
            return PairEvidence(nodes, np.asarray(part["total"], dtype=np.float64).reshape(n, n),
                                np.asarray(part["weight"], dtype=np.float64).reshape(n, n))

        try:
            names = {int(node): str(name) for node, name in state["names"].items()}
            next_id = int(str(state["next"]).removeprefix("c"))
            return cls(evidence(state), names, next_id, evidence(state["first"]) if "first" in state else PairEvidence())
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a coalition memory state: {error}") from None


#: Coalition memory's named forms (the drop-ins' ``memory=`` argument; ``docs/METHODS.md``, "Coalition
#: memory"): ``cosine`` the rule on the cosine evidence at its own tau, ``linkage-otsu`` average linkage of
#: the cosine evidence at Otsu's threshold, ``together`` the rule's own coalitions remembered (majority),
#: ``stacked`` the coalitions of ``linkage-otsu`` remembered (majority).  Decay 1 in each.
MEMORY_FORMS: dict[str, MemoryParams] = {
    "cosine": MemoryParams(active=True),
    "linkage-otsu": MemoryParams(active=True, tau="otsu", formation="linkage"),
    "together": MemoryParams(active=True, tau="majority", formation="linkage", evidence="together"),
    "stacked": MemoryParams(active=True, tau="majority", formation="linkage", evidence="stacked"),
}
#: The form ``memory=True`` gives: the one the confirmatory groups study chose among four candidates on the
#: clients' validation error (with ``hk-opinion-arrays = "features."``; docs/results/groups.md, "Confirmed").
VALIDATED_FORM = "linkage-otsu"


def memory_form(memory: bool | str | MemoryParams, argument: str = "memory") -> MemoryParams:
    """The :class:`MemoryParams` that ``memory`` names: False off (the paper), True the validated form
    (:data:`VALIDATED_FORM`), a name of :data:`MEMORY_FORMS`, or the params themselves.

    Raises ValueError naming ``argument`` for anything else.
    """
    if isinstance(memory, MemoryParams):
        return memory
    if memory is False:
        return MemoryParams()
    if memory is True:
        return MEMORY_FORMS[VALIDATED_FORM]
    if isinstance(memory, str) and memory in MEMORY_FORMS:
        return MEMORY_FORMS[memory]
    raise ValueError(f"{argument} must be False, True (the validated form, {VALIDATED_FORM!r}), one of "
                     f"{sorted(MEMORY_FORMS)} or a MemoryParams, got {memory!r}")
