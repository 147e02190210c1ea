"""Client selectors: SCKM and the SCKM paper's baselines, one interface (pure numpy).

A selector sees the round's candidates as a :class:`Candidates` (node ids,
and whatever the query phase returned: gradient sketches, losses, example
counts, plus the round each client last trained) and returns a
:class:`Choice`: exactly ``budget`` distinct candidate positions and scalar
facts to report.  Selectors are frozen (their fields are their parameters);
one that learns across rounds (FedCor) keeps what it learned in an explicit
state that the caller holds: :meth:`Selector.initial_state`,
``state = selector.observe(state, candidates)`` and
``selector.select(candidates, budget, rng, state)``, and that turns into a
JSON-able dict and back (:meth:`Selector.state_to_dict`), so that a
checkpoint can save it.  No Flower import: the
strategy adapter (:mod:`bouquet.strategies.selection`) builds the candidates
from replies.

Selectors (``name`` = run-config value):

``random``
    Uniform without replacement (FedAvg's sampling).
``sckm-select`` / ``sckm-cluster``
    SCKM paper Algorithms 1 / 2 (:mod:`bouquet.algorithms.sckm`).
``power-of-choice``
    Cho, Wang & Joshi (AISTATS 2022): ``d`` candidates drawn without
    replacement with probability proportional to data size, then the
    ``budget`` of them with the highest current local loss.
``afl``
    Goetz et al. (2019) Active Federated Learning: valuation
    ``v_k = sqrt(n_k) * loss_k``; the ``alpha1`` fraction with the lowest
    valuation is excluded; ``(1 - alpha3) B`` clients are drawn with
    probability proportional to ``exp(alpha2 * v_k)``, the remaining ones
    uniformly from those not yet drawn.  Defaults alpha1=0.75, alpha2=0.01,
    alpha3=0.1 (as in the FedCor paper's comparison).
``fedcor``
    Tang et al. (CVPR 2022): a Gaussian-process model of the clients' loss
    changes with a warm-up of random rounds, then greedy selection;
    ``fedcor-covariance`` ``empirical`` (ours) or ``gp`` (as their code,
    :mod:`bouquet.algorithms.fedcor`); both in :class:`FedCorSelector`.
``kmeans``
    k-means (L2, scikit-learn) with ``budget`` clusters on the sketches;
    from each cluster the member nearest its centroid.
``cosine``
    Greedy diversity: start with the client least cosine-similar on average
    to the others, then repeatedly add the one whose largest cosine
    similarity to those chosen is smallest.
``divfl``
    Balakrishnan et al. (ICLR 2022) DivFL: greedy facility location,
    minimising ``sum_k min_{i in S} ||g_k - g_i||`` over the sketches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from bouquet.algorithms.fedcor import fit_gp_covariance, gp_greedy_selection
from bouquet.algorithms.sckm import (
    LAYER_COMBINE,
    layer_coordinate_weights,
    sckm_cluster,
    sckm_eta,
    sckm_select,
)
from bouquet.params import RunConfigKeys, require

__all__ = [
    "DEFAULT_LAYER_COMBINE",
    "FEDCOR_COVARIANCES",
    "SELECTORS",
    "AFLSelector",
    "Candidates",
    "Choice",
    "CosineSelector",
    "DivFLSelector",
    "FedCorSelector",
    "FedCorState",
    "KMeansSelector",
    "PowerOfChoiceSelector",
    "RandomSelector",
    "SCKMClusterSelector",
    "SCKMSelectSelector",
    "Selector",
    "make_selector",
]


#: How the SCKM selectors weight each layer's coordinates (one default for both).
DEFAULT_LAYER_COMBINE = "normalized"


@dataclass
class Candidates:
    """What the server knows about this round's candidate clients (one row each).

    Attributes
    ----------
    ids : list of int
        Node ids (opaque to selectors; reported back).
    sketches : (K, d') array, optional
        Gradient sketches at the current global model.
    layer_sizes : list of int, optional
        Sketched coordinates per layer (sums to d').
    losses : (K,) array, optional
        Local loss at the current global model.
    num_examples : (K,) array, optional
    last_round : (K,) array, optional
        Round each client last trained (-1: never).
    """

    ids: list[int]
    sketches: np.ndarray | None = None
    layer_sizes: list[int] | None = None
    losses: np.ndarray | None = None
    num_examples: np.ndarray | None = None
    last_round: np.ndarray | None = None

    def __post_init__(self) -> None:
        k = len(self.ids)
        for name in ("sketches", "losses", "num_examples", "last_round"):
            value = getattr(self, name)
            if value is not None and len(value) != k:
                raise ValueError(f"{name} has {len(value)} rows for {k} candidates")

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, positions: Sequence[int]) -> Candidates:
        """The candidates at ``positions``, every attribute restricted to them."""
        rows = np.asarray(positions, dtype=np.int64)
        take = lambda value: None if value is None else np.asarray(value)[rows]
        return Candidates(ids=[self.ids[int(i)] for i in rows], sketches=take(self.sketches),
                          layer_sizes=self.layer_sizes, losses=take(self.losses),
                          num_examples=take(self.num_examples), last_round=take(self.last_round))

    def require(self, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"this selector needs {', '.join(missing)} from the query phase")


@dataclass
class Choice:
    """Selected candidate positions (``budget`` distinct) and scalar facts to report."""

    indices: np.ndarray
    report: dict[str, Any] = field(default_factory=dict)


class Selector:
    """Base class: ``needs`` names what the query phase must return.

    A stateless selector ignores the ``state`` arguments; one that learns (FedCor) overrides
    :meth:`initial_state`, :meth:`observe` and the two dict conversions.
    """

    name: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ()

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        raise NotImplementedError

    def initial_state(self) -> Any:
        """What the selector knows before the first round (``None``: it learns nothing)."""
        return None

    def observe(self, state: Any, candidates: Candidates) -> Any:
        """The state after seeing a round's query results (called before :meth:`select`); inputs unchanged."""
        return state

    def state_to_dict(self, state: Any) -> dict[str, Any]:
        """``state`` as a JSON-able dict."""
        return {}

    def state_from_dict(self, data: dict[str, Any]) -> Any:
        """The inverse of :meth:`state_to_dict`."""
        return self.initial_state()

    def _checked(self, candidates: Candidates, budget: int) -> None:
        if not 1 <= budget <= len(candidates):
            raise ValueError(f"budget must be in [1, {len(candidates)}] (the candidates), got {budget}")
        candidates.require(*self.needs)


# --------------------------------------------------------------------- simple
@dataclass(frozen=True)
class RandomSelector(Selector):
    name: ClassVar[str] = "random"

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        return Choice(np.sort(rng.choice(len(candidates), size=budget, replace=False)))


def _weighted_sketches(candidates: Candidates, combine: str, sign: int = 1) -> np.ndarray:
    """``sign`` x the sketches, layer-weighted by ``combine``.  eta is odd (eq. 8 is cubic), so ``sign = -1``
    ranks by -eta: top-B on gradients is bottom-B on the model deltas ``-lr g`` they step along."""
    g = np.asarray(candidates.sketches, dtype=np.float64)
    sizes = candidates.layer_sizes or [g.shape[1]]
    weights = layer_coordinate_weights(g, sizes, combine)
    return g * (weights if sign == 1 else -weights)


def _check_sign(sign: int) -> None:
    require(sign in (1, -1), "sign", f"sckm-sign must be 1 or -1, got {sign}")


@dataclass(frozen=True)
class SCKMSelectSelector(Selector):
    """SCKM-Select (Algorithm 1) with layer combination ``layer_combine`` on ``sign`` x the sketches.

    ``sign`` (``sckm-sign``, 1 or -1; default 1) is the sign the sketches are scored with; the paper does not
    say whether its top-B is on gradients (1) or on model deltas (-1), and eta(-G) = -eta(G).

    Parameters
    ----------
    layer_combine : {"normalized", "mean", "concat", "classifier"}, default "normalized"
        How the per-layer scores of eq. (8) combine into one
        (:func:`bouquet.algorithms.sckm.layer_coordinate_weights`).
    sign : {1, -1}, default 1
        The sign the sketches are scored with (above).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"layer_combine": "sckm-layer-combine", "sign": "sckm-sign"},
    )

    layer_combine: str = DEFAULT_LAYER_COMBINE
    sign: int = 1
    name: ClassVar[str] = "sckm-select"
    needs: ClassVar[tuple[str, ...]] = ("sketches",)

    def __post_init__(self) -> None:
        require(self.layer_combine in LAYER_COMBINE, "layer_combine",
                f"sckm-layer-combine must be one of {LAYER_COMBINE}, got {self.layer_combine!r}")
        _check_sign(self.sign)

    def scores(self, candidates: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """The layer-weighted sketches and each candidate's eta (eq. 9), what :meth:`select` ranks by."""
        g = _weighted_sketches(candidates, self.layer_combine, self.sign)
        return g, (sckm_eta(g) if len(g) > 1 else np.zeros(1))

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        g, eta = self.scores(candidates)
        picked = sckm_select(g, budget, rng, last_round=candidates.last_round, eta=eta)
        return Choice(picked, {"eta-selected": [float(eta[i]) for i in picked],
                               "eta-mean": float(eta.mean())})


@dataclass(frozen=True)
class SCKMClusterSelector(Selector):
    """SCKM-Cluster (Algorithm 2): elbow over C in [min_clusters, B], k-medoids, SCKM-Select per cluster.

    ``sign`` as :class:`SCKMSelectSelector`'s.  Eq. (8) is odd, so ``sign = -1`` reverses the order of the
    pair scores too: the clusters change with it, not only the picks within them.

    Parameters
    ----------
    layer_combine : {"normalized", "mean", "concat", "classifier"}, default "normalized"
        As :class:`SCKMSelectSelector`'s (one key, ``sckm-layer-combine``, sets both).
    sign : {1, -1}, default 1
        As :class:`SCKMSelectSelector`'s.
    min_clusters : int, default 1
        The smallest number of clusters the elbow considers.
    sample_size : int, default 1000
        Above this many candidates, k-medoids runs on a seeded sample of this size and every other
        candidate joins its nearest medoid.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="sckm-")

    layer_combine: str = DEFAULT_LAYER_COMBINE
    sign: int = 1
    min_clusters: int = 1
    sample_size: int = 1000
    name: ClassVar[str] = "sckm-cluster"
    needs: ClassVar[tuple[str, ...]] = ("sketches",)

    def __post_init__(self) -> None:
        require(self.layer_combine in LAYER_COMBINE, "layer_combine",
                f"sckm-layer-combine must be one of {LAYER_COMBINE}, got {self.layer_combine!r}")
        _check_sign(self.sign)
        require(self.min_clusters >= 1, "min_clusters", f"sckm-min-clusters must be >= 1, got {self.min_clusters}")
        require(self.sample_size >= 1, "sample_size", f"sckm-sample-size must be >= 1, got {self.sample_size}")

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        g = _weighted_sketches(candidates, self.layer_combine, self.sign)
        result = sckm_cluster(g, budget, rng, min_clusters=self.min_clusters, last_round=candidates.last_round,
                              sample_size=self.sample_size)
        return Choice(result.selected, {"clusters": result.n_clusters, "cluster-budgets": result.budgets.tolist(),
                                        "cluster-sizes": np.bincount(result.labels).tolist(),
                                        "cluster-labels": result.labels.tolist()})


@dataclass(frozen=True)
class PowerOfChoiceSelector(Selector):
    """Power-of-Choice: ``d`` by data size, then the highest-loss ``budget`` (``d`` < budget means d = budget).

    Parameters
    ----------
    d : int, default 0
        Candidates drawn in proportion to their data size before the highest losses are kept (0, or any
        value below the budget: the budget).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="pow-")

    d: int = 0
    name: ClassVar[str] = "power-of-choice"
    needs: ClassVar[tuple[str, ...]] = ("losses", "num_examples")

    def __post_init__(self) -> None:
        require(self.d >= 0, "d", f"pow-d must be >= 0 (0: twice the budget), got {self.d}")

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        k = len(candidates)
        d = min(k, max(budget, self.d if self.d > 0 else 2 * budget))
        sizes = np.asarray(candidates.num_examples, dtype=np.float64)
        p = sizes / sizes.sum() if sizes.sum() > 0 else None
        pool = rng.choice(k, size=d, replace=False, p=_full_support(p, d))
        losses = np.asarray(candidates.losses, dtype=np.float64)[pool]
        order = np.lexsort((pool, -losses))
        return Choice(np.sort(pool[order[:budget]]), {"pool-size": d})


def _full_support(p: np.ndarray | None, draws: int) -> np.ndarray | None:
    """numpy cannot draw more items without replacement than have non-zero probability: floor them."""
    if p is None or np.count_nonzero(p) >= draws:
        return p
    q = np.maximum(p, 1e-12)
    return q / q.sum()


@dataclass(frozen=True)
class AFLSelector(Selector):
    """Active Federated Learning valuation sampling (Goetz et al. 2019).

    Parameters
    ----------
    alpha1 : float, default 0.75
        The fraction of candidates with the lowest valuation ``sqrt(n_k) * loss_k`` left out.
    alpha2 : float, default 0.01
        The softmax temperature of the draw: probability proportional to ``exp(alpha2 * v_k)``.
    alpha3 : float, default 0.1
        The fraction of the budget drawn uniformly from the candidates not yet drawn.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="afl-")

    alpha1: float = 0.75
    alpha2: float = 0.01
    alpha3: float = 0.1
    name: ClassVar[str] = "afl"
    needs: ClassVar[tuple[str, ...]] = ("losses", "num_examples")

    def __post_init__(self) -> None:
        require(0 <= self.alpha1 < 1, "alpha1", f"AFL needs 0 <= alpha1 < 1, got {self.alpha1}")
        require(self.alpha2 >= 0, "alpha2", f"AFL needs alpha2 >= 0, got {self.alpha2}")
        require(0 <= self.alpha3 <= 1, "alpha3", f"AFL needs 0 <= alpha3 <= 1, got {self.alpha3}")

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        k = len(candidates)
        value = np.sqrt(np.asarray(candidates.num_examples, dtype=np.float64)) * np.asarray(candidates.losses)
        logits = self.alpha2 * value
        excluded = np.argsort(value, kind="stable")[:int(self.alpha1 * k)]
        # never exclude so many that the valued draw cannot be filled
        n_valued = int((1 - self.alpha3) * budget)
        excluded = excluded[:max(0, k - max(n_valued, 1))]
        weights = np.exp(logits - logits.max())
        weights[excluded] = 0.0
        valued = rng.choice(k, size=n_valued, replace=False, p=_full_support(weights / weights.sum(), n_valued))
        rest = np.setdiff1d(np.arange(k), valued)
        uniform = rng.choice(rest, size=budget - n_valued, replace=False)
        return Choice(np.sort(np.concatenate([valued, uniform])), {"afl-excluded": len(excluded)})


@dataclass(frozen=True)
class KMeansSelector(Selector):
    """k-means (L2) with ``budget`` clusters on the sketches; the member nearest each centroid."""

    name: ClassVar[str] = "kmeans"
    needs: ClassVar[tuple[str, ...]] = ("sketches",)

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        from sklearn.cluster import KMeans

        self._checked(candidates, budget)
        g = np.asarray(candidates.sketches, dtype=np.float64)
        model = KMeans(n_clusters=budget, n_init=3, random_state=int(rng.integers(2**31))).fit(g)
        dist = np.linalg.norm(g - model.cluster_centers_[model.labels_], axis=1)
        picked = []
        for c in range(budget):
            members = np.flatnonzero(model.labels_ == c)
            if members.size:
                picked.append(int(members[np.argmin(dist[members])]))
        # k-means can leave a cluster empty when sketches coincide: fill with the farthest unpicked
        rest = [i for i in np.argsort(-dist, kind="stable") if i not in picked]
        picked += [int(i) for i in rest[:budget - len(picked)]]
        return Choice(np.sort(np.array(picked, dtype=np.int64)))


@dataclass(frozen=True)
class CosineSelector(Selector):
    """Greedy cosine-diversity selection (farthest-first in cosine similarity)."""

    name: ClassVar[str] = "cosine"
    needs: ClassVar[tuple[str, ...]] = ("sketches",)

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        g = np.asarray(candidates.sketches, dtype=np.float64)
        norms = np.linalg.norm(g, axis=1)
        unit = g / np.where(norms > 0, norms, 1.0)[:, None]
        cos = unit @ unit.T
        first = int(np.argmin(cos.sum(axis=1)))
        picked = [first]
        closest = cos[first].copy()
        for _ in range(1, budget):
            closest[picked] = np.inf
            nxt = int(np.argmin(closest))
            picked.append(nxt)
            closest = np.maximum(closest, cos[nxt])
        return Choice(np.sort(np.array(picked, dtype=np.int64)))


@dataclass(frozen=True)
class DivFLSelector(Selector):
    """DivFL: greedy facility location on sketch distances."""

    name: ClassVar[str] = "divfl"
    needs: ClassVar[tuple[str, ...]] = ("sketches",)

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator, state: Any = None) -> Choice:
        self._checked(candidates, budget)
        g = np.asarray(candidates.sketches, dtype=np.float64)
        sq = np.square(g).sum(axis=1)
        dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * g @ g.T, 0.0))
        nearest = np.full(len(g), np.inf)
        picked: list[int] = []
        for _ in range(budget):
            cost = np.minimum(dist, nearest[None, :]).sum(axis=1)  # [i]: total cost if i joins
            cost[picked] = np.inf
            best = int(np.argmin(cost))
            picked.append(best)
            nearest = np.minimum(nearest, dist[best])
        return Choice(np.sort(np.array(picked, dtype=np.int64)), {"divfl-cost": float(nearest.sum())})


# --------------------------------------------------------------------- FedCor
#: How FedCor models the covariance of the clients' loss changes (``fedcor-covariance``).
FEDCOR_COVARIANCES = ("empirical", "gp")


@dataclass(frozen=True)
class FedCorState:
    """What FedCor has learned.  Keys are node ids.  Immutable: :meth:`FedCorSelector.observe` returns a new one.

    Attributes
    ----------
    previous : mapping
        Each client's last loss.
    changes : tuple of mappings
        The recent loss-change vectors (oldest first).
    rounds : int
        Rounds observed.
    fit_ids, fit_covariance, fit_round
        ``gp`` only: the clients and the covariance of the last GP fit, and ``rounds`` when it was made
        (-1: never).
    discount : mapping
        ``gp`` only: each client's annealing factor beta_k (1 when absent).
    trained : mapping
        ``gp`` only: the round each client last trained, as last seen (a later one means it was selected).
    """

    previous: Mapping[int, float] = field(default_factory=dict)
    changes: tuple[Mapping[int, float], ...] = ()
    rounds: int = 0
    fit_ids: tuple[int, ...] = ()
    fit_covariance: tuple[tuple[float, ...], ...] = ()
    fit_round: int = -1
    discount: Mapping[int, float] = field(default_factory=dict)
    trained: Mapping[int, int] = field(default_factory=dict)


def _change_matrix(changes: Sequence[Mapping[int, float]], ids: Sequence[int]) -> np.ndarray | None:
    """The change vectors as a (rounds, len(ids)) array; a client missing in a round takes its mean change."""
    if len(changes) < 2:
        return None
    x = np.array([[c.get(int(i), np.nan) for i in ids] for c in changes])
    seen = ~np.isnan(x)
    means = np.where(seen, x, 0.0).sum(axis=0) / np.maximum(seen.sum(axis=0), 1)
    return np.where(seen, x, means)


@dataclass(frozen=True)
class FedCorSelector(Selector):
    """FedCor's Gaussian-process selection (Tang et al., CVPR 2022) with two covariance models.

    The loss changes ``Delta L`` of the clients between consecutive rounds
    are a Gaussian process over clients.  For the first ``warmup`` rounds
    (or while fewer than two change vectors are known) selection is
    uniform; afterwards it is greedy, conditioning the covariance on each
    client picked (a rank-one update).

    ``covariance = "empirical"`` (the default, our first formulation): the
    covariance is the empirical covariance of the last ``history`` change
    vectors, shrunk towards its diagonal (``shrinkage``) plus ``noise`` on
    the diagonal, recomputed every round; each step picks the client ``i``
    that maximises the loss-weighted covariance it explains,
    ``sum_j L_j Cov(j, i | S) / sqrt(Var(i | S))``.

    ``covariance = "gp"``: as FedCor's official code (``Kernel_GPR``, order-1
    polynomial kernel, ``update_mean``): ``K = P^T P + gp_noise^2 I`` with P of
    ``dimension`` rows, fitted by maximum likelihood on the last ``history``
    change vectors weighted ``gamma^age`` (:func:`bouquet.algorithms.fedcor.fit_gp_covariance`),
    when the warm-up ends and then every ``interval`` rounds; between fits the
    covariance is fixed.  Each step maximises ``beta_k sum_i w_i Cov(i, k | S)
    / sqrt(Var(k | S))`` with ``w_i`` the clients' data shares (eq. 13), and
    each time client k is selected its ``beta_k`` is multiplied by
    ``discount`` (reset to 1 at every fit).  Needs the clients' losses each
    round (query phase).  What it learned is a :class:`FedCorState` held by
    the caller.

    Parameters
    ----------
    warmup : int, default 2
        Rounds of uniform selection before the GP is used (the official CIFAR command: 20).
    shrinkage : float, default 0.1
        ``empirical``: weight of the diagonal in the shrunk covariance, in [0, 1].
    noise : float, default 1e-3
        ``empirical``: added to the covariance diagonal.
    history : int, default 20
        Loss-change vectors kept (the official ``--group_size``; its CIFAR command: 500).
    covariance : {"empirical", "gp"}, default "empirical"
        The clients' loss-change covariance: shrunk empirical, or the official code's Gaussian process.
    dimension : int, default 15
        ``gp``: D, the clients' embedding dimension (the official ``--dimension``).
    gp_noise : float, default 0.01
        ``gp``: sigma_n, the kernel's fixed noise standard deviation (the official ``init_noise``).
    gamma : float, default 0.99
        ``gp``: weight ``gamma^age`` of an old change vector in the fit (the official CIFAR ``--GPR_gamma``).
    interval : int, default 50
        ``gp``: rounds between fits (the official CIFAR ``--GPR_interval``).
    discount : float, default 0.9
        ``gp``: beta's factor per selection (the official ``--discount``).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="fedcor-", skip=("shrinkage", "noise"))

    warmup: int = 2
    shrinkage: float = 0.1
    noise: float = 1e-3
    history: int = 20
    covariance: str = "empirical"
    dimension: int = 15
    gp_noise: float = 0.01
    gamma: float = 0.99
    interval: int = 50
    discount: float = 0.9
    name: ClassVar[str] = "fedcor"
    needs: ClassVar[tuple[str, ...]] = ("losses",)

    def __post_init__(self) -> None:
        require(self.warmup >= 0, "warmup", f"fedcor-warmup must be >= 0, got {self.warmup}")
        require(0 <= self.shrinkage <= 1, "shrinkage", f"shrinkage must be in [0, 1], got {self.shrinkage}")
        require(self.noise >= 0, "noise", f"noise must be >= 0, got {self.noise}")
        require(self.history >= 2, "history", f"fedcor-history must be >= 2, got {self.history}")
        require(self.covariance in FEDCOR_COVARIANCES, "covariance",
                f"fedcor-covariance must be one of {FEDCOR_COVARIANCES}, got {self.covariance!r}")
        require(self.dimension >= 1, "dimension", f"fedcor-dimension must be >= 1, got {self.dimension}")
        require(self.gp_noise > 0, "gp_noise", f"fedcor-gp-noise must be > 0, got {self.gp_noise}")
        require(0 < self.gamma <= 1, "gamma", f"fedcor-gamma must be in (0, 1], got {self.gamma}")
        require(self.interval >= 1, "interval", f"fedcor-interval must be >= 1, got {self.interval}")
        require(0 < self.discount <= 1, "discount", f"fedcor-discount must be in (0, 1], got {self.discount}")

    def initial_state(self) -> FedCorState:
        return FedCorState()

    def observe(self, state: FedCorState | None, candidates: Candidates) -> FedCorState:
        state = state if state is not None else self.initial_state()
        candidates.require("losses")
        losses = {int(i): float(v) for i, v in zip(candidates.ids, candidates.losses)}
        changes = state.changes
        if state.previous:
            change = {i: v - state.previous[i] for i, v in losses.items() if i in state.previous}
            if change:
                changes = (*changes, change)[-self.history:]
        new = replace(state, previous={**state.previous, **losses}, changes=changes, rounds=state.rounds + 1)
        return self._gp_observe(new, candidates) if self.covariance == "gp" else new

    def _gp_observe(self, state: FedCorState, candidates: Candidates) -> FedCorState:
        """Anneal the clients selected since the last look; refit when the warm-up ends and every interval."""
        discount, trained = dict(state.discount), dict(state.trained)
        if candidates.last_round is not None:
            for i, last in zip(candidates.ids, candidates.last_round):
                i, last = int(i), int(last)
                if i in trained and last > trained[i]:
                    discount[i] = discount.get(i, 1.0) * self.discount
                trained[i] = last
        state = replace(state, discount=discount, trained=trained)
        due = state.fit_round < 0 or state.rounds - state.fit_round >= self.interval
        if state.rounds <= self.warmup or not due:
            return state
        ids = sorted({i for c in state.changes for i in c})
        x = _change_matrix(state.changes, ids)
        if x is None:
            return state
        ages = np.arange(len(x))[::-1]
        _, cov = fit_gp_covariance(x, self.gamma ** ages, self.dimension, self.gp_noise)
        return replace(state, fit_ids=tuple(ids), fit_covariance=tuple(map(tuple, cov.tolist())),
                       fit_round=state.rounds, discount={})

    def state_to_dict(self, state: FedCorState) -> dict[str, Any]:
        text_keys = lambda mapping: {str(k): v for k, v in mapping.items()}  # node ids exceed JSON's int range
        return {"previous": text_keys(state.previous), "changes": [text_keys(c) for c in state.changes],
                "rounds": state.rounds, "fit-ids": [str(i) for i in state.fit_ids],
                "fit-covariance": [list(row) for row in state.fit_covariance], "fit-round": state.fit_round,
                "discount": text_keys(state.discount), "trained": text_keys(state.trained)}

    def state_from_dict(self, data: dict[str, Any]) -> FedCorState:
        int_keys = lambda mapping: {int(k): float(v) for k, v in mapping.items()}
        return FedCorState(previous=int_keys(data["previous"]), changes=tuple(int_keys(c) for c in data["changes"]),
                           rounds=int(data["rounds"]), fit_ids=tuple(int(i) for i in data.get("fit-ids", ())),
                           fit_covariance=tuple(tuple(float(v) for v in row) for row in data.get("fit-covariance", ())),
                           fit_round=int(data.get("fit-round", -1)), discount=int_keys(data.get("discount", {})),
                           trained={int(k): int(v) for k, v in data.get("trained", {}).items()})

    def covariance_matrix(self, state: FedCorState, ids: Sequence[int]) -> np.ndarray | None:
        """``empirical``: the shrunk empirical covariance of the loss changes of ``ids`` (None: not enough history).
        ``gp``: the last fit's covariance restricted to ``ids`` (None: no fit yet); a client the fit did not know
        gets the fit's mean variance and no covariance."""
        if self.covariance == "gp":
            if state.fit_round < 0:
                return None
            fitted = np.array(state.fit_covariance)
            where = {i: k for k, i in enumerate(state.fit_ids)}
            known = [where.get(int(i), -1) for i in ids]
            cov = np.diag(np.full(len(ids), float(np.mean(np.diag(fitted)))))
            rows = [a for a, k in enumerate(known) if k >= 0]
            cov[np.ix_(rows, rows)] = fitted[np.ix_([known[a] for a in rows], [known[a] for a in rows])]
            return cov
        x = _change_matrix(state.changes, ids)
        if x is None:
            return None
        x = x - x.mean(axis=0)
        cov = x.T @ x / max(len(x) - 1, 1)
        cov = (1 - self.shrinkage) * cov + self.shrinkage * np.diag(np.diag(cov))
        return cov + self.noise * np.eye(len(ids))

    def select(self, candidates: Candidates, budget: int, rng: np.random.Generator,
               state: FedCorState | None = None) -> Choice:
        self._checked(candidates, budget)
        state = state if state is not None else self.initial_state()
        cov = None if state.rounds <= self.warmup else self.covariance_matrix(state, candidates.ids)
        if cov is None:
            return Choice(np.sort(rng.choice(len(candidates), size=budget, replace=False)), {"fedcor-warmup": True})
        if self.covariance == "gp":
            sizes = (np.ones(len(candidates)) if candidates.num_examples is None
                     else np.asarray(candidates.num_examples, dtype=np.float64))
            beta = np.array([state.discount.get(int(i), 1.0) for i in candidates.ids])
            picked = gp_greedy_selection(cov, sizes / sizes.sum(), budget, beta)
            return Choice(np.sort(np.array(picked, dtype=np.int64)), {"fedcor-warmup": False})
        losses = np.asarray(candidates.losses, dtype=np.float64)
        picked = []
        for _ in range(budget):
            var = np.clip(np.diag(cov), 1e-15, None)
            score = (losses @ cov) / np.sqrt(var)
            score[picked] = -np.inf
            best = int(np.argmax(score))
            picked.append(best)
            column = cov[:, best].copy()
            cov = cov - np.outer(column, column) / max(column[best], 1e-15)  # condition on client best
        return Choice(np.sort(np.array(picked, dtype=np.int64)), {"fedcor-warmup": False})


#: Run-config name -> selector class.
SELECTORS: dict[str, type[Selector]] = {cls.name: cls for cls in (
    RandomSelector, SCKMSelectSelector, SCKMClusterSelector, PowerOfChoiceSelector, AFLSelector, FedCorSelector,
    KMeansSelector, CosineSelector, DivFLSelector)}


def make_selector(name: str, **params: Any) -> Selector:
    """The selector called ``name`` with its parameters (unknown names/parameters raise ValueError)."""
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; choose one of {', '.join(SELECTORS)}")
    try:
        return SELECTORS[name](**params)
    except TypeError as exc:
        raise ValueError(f"selector {name!r}: {exc}") from exc
