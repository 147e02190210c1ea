"""Hegselmann-Krause (HK) coalition formation on client models, exact and fast.

Implements Sections 4.1-4.5 of the HK coalition paper
(``shared/seeds/000_d01034763fae9582.txt``).  The S post-training client models
are the rows of ``W`` (S x d).  The opinions start at ``z_i^(0) = w_i`` and
follow the bounded-confidence update (eq. 10)::

    z_i^(s+1) = mean { z_j^(s) : j in N_i(z^(s)) },      i in N_i always,

until ``max_i ||z_i^(s+1) - z_i^(s)|| <= delta`` or ``s_max`` steps.  Clients
whose limiting opinions coincide form a coalition (eq. 11); the next global
model is the uniform mean of the coalition barycenters of the *original*
models (eq. 15-16).

Neighbourhoods (:class:`HKParams`):

* ``"euclidean"`` (eq. 12 on unit-normalised opinions, Sec. 4.2): ``j in N_i``
  iff ``||z_i/||z_i|| - z_j/||z_j|| || <= tau``.
* ``"cosine"`` (eq. 13): ``cos(z_i, z_j) >= tau``.
* ``"cosine-bounded"`` (eq. 14): ``eps_l <= cos(z_i, z_j) <= eps_r``;
  ``eps_r = 1`` is the one-sided rule with ``tau = eps_l``.

What is averaged (``opinions``): the paper says "the Euclidean variant operates
on normalized weight vectors", read here as: its dynamics run on unit vectors
(each step rescales every opinion to unit norm, then averages; ``"normalized"``,
the default for ``"euclidean"``).  The cosine variants average the raw opinions
as eq. 10 is written (``"raw"``, their default).  Either may be chosen for any
geometry.  Two consequences, both tested: (i) with the same ``opinions`` rule,
the Euclidean radius ``tau`` is the cosine threshold ``1 - tau^2 / 2`` (since
``||a^ - b^||^2 = 2 - 2 cos(a, b)``); (ii) the cosine *neighbourhood* is
invariant to rescaling a client, but raw dynamics are not beyond the first step
(a rescaled client pulls averages harder); with ``opinions="normalized"`` the
whole outcome is scale-invariant.

**Exact Gram-space computation.**  Every opinion stays a linear combination
of the initial models, ``z^(s) = P^(s) W``, and HK needs only inner products
of opinions, ``z z^T = P (W W^T) P^T``.  So HK is run on an isometric
embedding of the rows of ``W`` in R^S: ``Y = U sqrt(Lambda)`` from the
eigendecomposition ``W W^T = U Lambda U^T``.  Inner products, norms, cosines,
distances and the stopping test are the same for ``Y`` as for ``W`` (up to
rounding), so the coalitions are the same; the dynamics then cost
``O(s S^3)`` instead of ``O(s S^2 d)``, and ``d`` is touched twice: once for
the Gram matrix (blocked over ``d``, accumulated in float64) and once for the
final weighted sum.  :func:`hk_dynamics` run directly on ``W`` is the
reference implementation (the paper's ``O(s_max S^2 d)``).

Zero vectors: a client model with zero norm has no direction; it is rejected
with a ``ValueError`` (the Flower strategy excludes such a reply with a
warning).  An opinion that becomes zero during the dynamics (possible only
when ``tau <= 0`` lets opposite opinions average out) is treated as having
cosine 0 with every non-zero opinion and 1 with other zero opinions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = [
    "GEOMETRIES",
    "WEIGHTINGS",
    "HKParams",
    "HKResult",
    "coalition_weights",
    "coalitions_from_opinions",
    "gram_cosines",
    "gram_embedding",
    "gram_matrix",
    "hk_aggregate",
    "hk_coalitions",
    "hk_dynamics",
    "member_shares",
    "neighbourhoods",
    "opinion_trajectory_2d",
]

GEOMETRIES = ("euclidean", "cosine", "cosine-bounded")
#: How members count in their coalition's barycenter (eq. 15): equally (the paper) or by their samples.
WEIGHTINGS = ("uniform", "samples")


@dataclass(frozen=True)
class HKParams:
    """Hyper-parameters of HK coalition formation (paper defaults).

    Parameters
    ----------
    geometry : {"euclidean", "cosine", "cosine-bounded"}, default "cosine"
    tau : float, default 0.75
        Euclidean radius on unit vectors, in (0, 2] (larger: coarser
        coalitions), or cosine threshold in [-1, 1] (larger: finer).  Paper
        grid: {0.5, 0.75, 0.9}.  For ``"cosine-bounded"`` it is ignored in
        favour of ``eps_l`` / ``eps_r``.
    eps_l, eps_r : float, default -1.0, 1.0
        Two-sided cosine bound, ``-1 <= eps_l <= eps_r <= 1`` (eq. 14).
    delta : float, default 1e-6
        Stopping tolerance on ``max_i ||z_i^(s+1) - z_i^(s)||`` (absolute, in
        the units of the opinions: weights, or unit vectors for the Euclidean
        variant).
    s_max : int, default 50
        Cap on inner steps (the paper observes <= 10).
    coalition_tol : float, default 1e-6
        Limiting opinions ``i, j`` coincide when ``||z_i - z_j|| <= coalition_tol
        * scale``, scale = the largest initial opinion norm; coalitions are the
        connected components of that relation.
    opinions : {"auto", "normalized", "raw"}, default "auto"
        Average unit-normalised or raw opinions (module docstring); ``"auto"``
        is ``"normalized"`` for ``"euclidean"`` and ``"raw"`` otherwise.
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
        Barycenters as in eq. 15 (uniform), or weighted by each client's number
        of examples (an option the paper does not use).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="hk-", skip=("geometry", "barycenter_weighting"))

    geometry: str = "cosine"
    tau: float = 0.75
    eps_l: float = -1.0
    eps_r: float = 1.0
    delta: float = 1e-6
    s_max: int = 50
    coalition_tol: float = 1e-6
    opinions: str = "auto"
    barycenter_weighting: str = WEIGHTINGS[0]

    def __post_init__(self) -> None:
        require(self.geometry in GEOMETRIES, "geometry", f"geometry must be one of {GEOMETRIES}, got {self.geometry!r}")
        require(self.geometry != "euclidean" or 0 < self.tau <= 2, "tau",
                f"Euclidean radius tau must be in (0, 2] (unit vectors), got {self.tau}")
        require(self.geometry != "cosine" or -1 <= self.tau <= 1, "tau",
                f"cosine threshold tau must be in [-1, 1], got {self.tau}")
        require(self.geometry != "cosine-bounded" or -1 <= self.eps_l <= self.eps_r <= 1, "eps_l",
                f"need -1 <= eps_l <= eps_r <= 1, got eps_l={self.eps_l}, eps_r={self.eps_r}")
        require(self.delta > 0, "delta", f"delta must be > 0, got {self.delta}")
        require(self.s_max >= 1, "s_max", f"s_max must be >= 1, got {self.s_max}")
        require(self.coalition_tol >= 0, "coalition_tol", f"coalition_tol must be >= 0, got {self.coalition_tol}")
        require(self.opinions in ("auto", "normalized", "raw"), "opinions",
                f"opinions must be 'auto', 'normalized' or 'raw', got {self.opinions!r}")
        require(self.barycenter_weighting in WEIGHTINGS, "barycenter_weighting",
                f"barycenter_weighting must be one of {WEIGHTINGS}, got {self.barycenter_weighting!r}")

    @property
    def normalizes_opinions(self) -> bool:
        if self.opinions == "auto":
            return self.geometry == "euclidean"
        return self.opinions == "normalized"


@dataclass(frozen=True)
class HKResult:
    """Outcome of one HK run.

    Attributes
    ----------
    labels : numpy.ndarray of int, shape (S,)
        Coalition id of each client, numbered by first appearance (0, 1, ...).
    opinions : numpy.ndarray, shape (S, m)
        Limiting opinions (in the space the dynamics ran in).
    steps : int
        Inner steps taken.
    converged : bool
        Whether the stopping test was met before ``s_max``.
    mixing : numpy.ndarray, shape (S, S)
        ``P`` with ``opinions = P @ initial`` (for the Euclidean normalised
        variant, ``initial`` are the unit-normalised rows).
    history : list of numpy.ndarray
        ``P^(s)`` for s = 0..steps when recorded, else empty.
    gram : numpy.ndarray or None
        ``W W^T`` of the client models when computed (Gram-space runs).
    """

    labels: np.ndarray
    opinions: np.ndarray
    steps: int
    converged: bool
    mixing: np.ndarray
    history: list[np.ndarray] = field(default_factory=list)
    gram: np.ndarray | None = None

    @property
    def num_coalitions(self) -> int:
        return int(self.labels.max()) + 1 if self.labels.size else 0

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.labels)


def _as_matrix(weights: np.ndarray) -> np.ndarray:
    matrix = np.asarray(weights)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"expected a non-empty (clients x parameters) matrix, got shape {matrix.shape}")
    if not np.issubdtype(matrix.dtype, np.floating):
        matrix = matrix.astype(np.float64)
    return matrix


def gram_cosines(gram: np.ndarray) -> np.ndarray:
    """Cosine matrix from an opinion Gram matrix; zero opinions follow the module's rule."""
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    zero = norms <= 0
    safe = np.where(zero, 1.0, norms)
    cos = np.clip(gram / safe[:, None] / safe[None, :], -1.0, 1.0)
    cos[zero, :] = 0.0
    cos[:, zero] = 0.0
    cos[np.ix_(zero, zero)] = 1.0
    return cos


def neighbourhoods(opinions: np.ndarray, params: HKParams) -> np.ndarray:
    """Boolean S x S confidence matrix ``N[i, j] = j in N_i`` (diagonal always True)."""
    cos = gram_cosines(opinions @ opinions.T)
    if params.geometry == "euclidean":
        distance = np.sqrt(np.clip(2.0 - 2.0 * cos, 0.0, None))  # ||z^_i - z^_j|| of unit vectors
        linked = distance <= params.tau
    elif params.geometry == "cosine":
        linked = cos >= params.tau
    else:
        linked = (cos >= params.eps_l) & (cos <= params.eps_r)
    np.fill_diagonal(linked, True)
    return linked


def hk_dynamics(initial: np.ndarray, params: HKParams, record: bool = False) -> HKResult:
    """Run HK on the rows of ``initial`` (S x m) and extract coalitions.

    Applied to the client models themselves (m = d) this is the paper's direct
    iteration, ``O(s S^2 d)``; applied to :func:`gram_embedding` output
    (m = S) it is the exact Gram-space computation.

    Parameters
    ----------
    initial : array, shape (S, m)
        Initial opinions; no row may be zero.
    params : HKParams
    record : bool, default False
        Keep ``P^(s)`` of every step in ``history`` (for trajectory plots).

    Returns
    -------
    HKResult
    """
    start = _as_matrix(initial).astype(np.float64, copy=False)
    norms = np.linalg.norm(start, axis=1)
    if np.any(norms == 0):
        raise ValueError(f"client(s) {np.flatnonzero(norms == 0).tolist()} have a zero weight vector: "
                         "no direction for HK; exclude them before aggregation")
    if params.normalizes_opinions:
        start = start / norms[:, None]
    scale = float(np.linalg.norm(start, axis=1).max())
    n = start.shape[0]
    opinions, mixing = start.copy(), np.eye(n)
    history = [mixing.copy()] if record else []
    steps, converged = 0, False
    while steps < params.s_max:
        linked = neighbourhoods(opinions, params)
        averaging = linked / linked.sum(axis=1, keepdims=True)
        new_opinions, new_mixing = averaging @ opinions, averaging @ mixing
        if params.normalizes_opinions:
            row_norms = np.linalg.norm(new_opinions, axis=1, keepdims=True)
            row_norms = np.where(row_norms > 0, row_norms, 1.0)
            new_opinions, new_mixing = new_opinions / row_norms, new_mixing / row_norms
        movement = float(np.linalg.norm(new_opinions - opinions, axis=1).max())
        opinions, mixing = new_opinions, new_mixing
        steps += 1
        if record:
            history.append(mixing.copy())
        if movement <= params.delta:
            converged = True
            break
    labels = coalitions_from_opinions(opinions, params.coalition_tol * scale)
    return HKResult(labels, opinions, steps, converged, mixing, history)


def coalitions_from_opinions(opinions: np.ndarray, tolerance: float) -> np.ndarray:
    """Connected components of ``||z_i - z_j|| <= tolerance``; ids by first appearance.

    Distances come from the opinions' Gram matrix (one BLAS product, also for
    the direct iteration's S x d opinions); their rounding error is about
    1e-8 of the opinion norm, far below the default tolerance (1e-6 of it).
    """
    opinions = np.asarray(opinions, dtype=np.float64)
    gram = opinions @ opinions.T
    squared = np.diag(gram)
    close = np.sqrt(np.clip(squared[:, None] + squared[None, :] - 2 * gram, 0.0, None)) <= tolerance
    n = len(opinions)
    labels = np.full(n, -1)
    next_label = 0
    for i in range(n):
        if labels[i] >= 0:
            continue
        stack, labels[i] = [i], next_label
        while stack:
            j = stack.pop()
            for k in np.flatnonzero(close[j] & (labels < 0)):
                labels[k] = next_label
                stack.append(k)
        next_label += 1
    return labels


def gram_matrix(weights: np.ndarray, block_columns: int = 65_536) -> np.ndarray:
    """``W W^T`` accumulated in float64 over blocks of columns (bounded extra memory).

    Each block product runs in the input's floating dtype (float32 model
    weights stay float32, twice as fast as casting); blocks are summed in
    float64.  Measured relative error for float32 inputs at S=200, d=1e6:
    1.2e-7 of the largest entry, i.e. cosines exact to ~1e-7.
    """
    weights = _as_matrix(weights)
    gram = np.zeros((weights.shape[0], weights.shape[0]))
    for start in range(0, weights.shape[1], block_columns):
        block = weights[:, start : start + block_columns]
        gram += block @ block.T
    return gram


def gram_embedding(gram: np.ndarray) -> np.ndarray:
    """Rows ``Y`` (S x S) with ``Y Y^T = gram``: an isometric image of the client models.

    From ``gram = U Lambda U^T``; eigenvalues below zero (rounding) are set to 0.
    """
    gram = np.asarray(gram, dtype=np.float64)
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be square, got shape {gram.shape}")
    values, vectors = np.linalg.eigh((gram + gram.T) / 2)
    return vectors * np.sqrt(np.clip(values, 0.0, None))[None, :]


def hk_coalitions(weights: np.ndarray, params: HKParams, record: bool = False,
                  gram: np.ndarray | None = None) -> HKResult:
    """HK coalitions of the client models (rows of ``weights``) via the Gram-space embedding.

    Same coalitions as ``hk_dynamics(weights, params)`` at ``O(S^2 d + s S^3)``.
    ``gram`` may be passed when already computed.
    """
    if gram is None:
        gram = gram_matrix(weights)
    zero = np.flatnonzero(np.diag(gram) <= 0)
    if zero.size:
        raise ValueError(f"client(s) {zero.tolist()} have a zero weight vector: no direction for HK; "
                         "exclude them before aggregation")
    return dataclasses.replace(hk_dynamics(gram_embedding(gram), params, record=record), gram=gram)


def member_shares(labels: np.ndarray, num_examples: np.ndarray | None = None) -> np.ndarray:
    """Each client's share of its coalition's barycenter (eq. 15): ``1 / |C(i)|``, or ``n_i / N_C(i)``.

    Parameters
    ----------
    labels : array of int, shape (S,)
        Coalition id per client, ids 0..K-1.
    num_examples : array, shape (S,), optional
        Positive example counts; members then count by them inside their coalition.
    """
    labels = np.asarray(labels)
    k = int(labels.max()) + 1
    if num_examples is None:
        within = np.ones(len(labels))
    else:
        within = np.asarray(num_examples, dtype=np.float64)
        if within.shape != labels.shape or np.any(within <= 0):
            raise ValueError("num_examples must be positive, one per client")
    totals = np.bincount(labels, weights=within, minlength=k)
    return within / totals[labels]


def coalition_weights(labels: np.ndarray, num_examples: np.ndarray | None = None) -> np.ndarray:
    """Per-client coefficients ``c`` such that ``c @ W`` is the uniform mean of barycenters (eq. 15-16).

    Uniform barycenters give ``c_i = 1 / (K |C(i)|)``.  With ``num_examples``
    each barycenter is sample-weighted inside its coalition (coalitions still
    count equally).
    """
    return member_shares(labels, num_examples) / (int(np.asarray(labels).max()) + 1)


def hk_aggregate(weights: np.ndarray, params: HKParams, num_examples: np.ndarray | None = None,
                 record: bool = False) -> tuple[np.ndarray, HKResult]:
    """Next global model (eq. 16) and the HK outcome, Gram-space.

    Parameters
    ----------
    weights : array, shape (S, d)
        Flattened client models (not modified).
    params : HKParams
    num_examples : array, shape (S,), optional
        Used only when ``params.barycenter_weighting == "samples"``.

    Returns
    -------
    (numpy.ndarray of shape (d,), HKResult)
    """
    weights = _as_matrix(weights)
    result = hk_coalitions(weights, params, record=record)
    samples = num_examples if params.barycenter_weighting == "samples" else None
    coefficients = coalition_weights(result.labels, samples).astype(weights.dtype)  # no float64 copy of W
    return coefficients @ weights, result


def opinion_trajectory_2d(history: list[np.ndarray], gram: np.ndarray, params: HKParams) -> np.ndarray:
    """Opinions projected on the first two principal axes of the initial opinions, per step.

    Needs the mixing matrices ``HKResult.history`` (``record=True``) and the Gram matrix ``W W^T`` of
    the client models.  Returns shape (steps + 1, S, 2), exact: with
    ``z^(s) = P^(s) W0`` (``W0`` = the models, or their unit rows for the
    Euclidean normalised variant), the centred projection is
    ``P^(s) W0c V + (P^(s) 1 - 1) mean(W0)^T V``, and both terms follow from
    the Gram matrix of ``W0``.
    """
    if not history:
        raise ValueError("no trajectory recorded: run with record=True")
    gram = np.asarray(gram, dtype=np.float64)
    if params.normalizes_opinions:
        inv = 1.0 / np.sqrt(np.diag(gram))
        gram = gram * inv[:, None] * inv[None, :]
    n = gram.shape[0]
    centering = np.eye(n) - 1.0 / n
    values, vectors = np.linalg.eigh(centering @ gram @ centering)
    top = np.argsort(values)[::-1][: min(2, n)]
    sigma = np.sqrt(np.clip(values[top], 0.0, None))
    scores = vectors[:, top] * sigma  # rows: centred W0 on the principal axes
    safe = np.where(sigma > 0, sigma, 1.0)
    mean_on_axes = (np.ones(n) @ gram @ centering @ vectors[:, top]) / n / safe
    out = []
    for mixing in history:
        offset = mixing.sum(axis=1, keepdims=True) - 1.0
        projected = mixing @ scores + offset * mean_on_axes[None, :]
        if projected.shape[1] < 2:
            projected = np.pad(projected, ((0, 0), (0, 2 - projected.shape[1])))
        out.append(projected)
    return np.stack(out)
