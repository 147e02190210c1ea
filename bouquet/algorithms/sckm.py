"""SCKM client selection: scores, SCKM-Select and SCKM-Cluster (pure numpy).

Implements Sections 5.1-5.3 of the SCKM paper
(``../shared/seeds/001_4d00b0dc771d63e1.txt``) on gradient sketches
``G`` (K clients x d' coordinates):

* :func:`sckm_matrix` -- eq. (8) for every pair, by two matrix products;
* :func:`sckm_eta` -- eq. (9), each client's mean SCKM to the others, in
  O(K d') from column sums, without forming the K x K matrix;
* :func:`sckm_select` -- Algorithm 1 (top-B by eta; ties by age of last
  participation, then by a seeded permutation);
* :func:`sckm_cluster` -- Algorithm 2 (k-medoids on an SCKM dissimilarity,
  elbow rule for the number of clusters, per-cluster budget, SCKM-Select
  inside each cluster);
* :func:`sketch_indices` / :func:`layer_coordinate_weights` -- the sketch
  coordinates drawn from a round seed (identical on every client) and the
  layer-wise treatment of Sec. 3.1.2.

Choices the paper leaves open are parameters; each is stated where it is
made and collected in docs/METHODS.md.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from bouquet.algorithms.kmedoids import kmedoids

__all__ = ["LAYER_COMBINE", "ClusterSelection", "SketchSums", "average_cardinality", "budget_per_cluster", "elbow_point",
           "layer_coordinate_weights", "sckm_cluster", "sckm_dissimilarity", "sckm_eta", "sckm_matrix", "sckm_pair", "sckm_select",
           "sketch_indices", "sketch_size"]

#: How per-layer scores combine (see :func:`layer_coordinate_weights`).
LAYER_COMBINE = ("normalized", "mean", "concat", "classifier")


# ------------------------------------------------------------------ sketches
def sketch_size(layer_size: int, fraction: float) -> int:
    """Coordinates sketched from a layer of ``layer_size`` entries: ``max(1, round(fraction * size))``."""
    if not 0 < fraction <= 1:
        raise ValueError(f"sketch fraction must be in (0, 1], got {fraction}")
    if layer_size < 1:
        raise ValueError(f"layer size must be >= 1, got {layer_size}")
    return max(1, min(layer_size, round(fraction * layer_size)))


def sketch_indices(layer_sizes: Sequence[int], fraction: float, seed: Sequence[int] | int) -> list[np.ndarray]:
    """The coordinates each client sketches, per layer, from a shared seed.

    A fraction ``fraction`` of every layer (paper: 0.5 %, at least one
    coordinate per layer) drawn without replacement with
    ``default_rng(seed)``, sorted.  Server and clients derive the same
    indices from the same seed and layer sizes, so no index list travels.

    Returns
    -------
    list of int64 arrays
        Indices into each flattened layer.
    """
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(int(n), size=sketch_size(int(n), fraction), replace=False)).astype(np.int64)
            for n in layer_sizes]


def layer_coordinate_weights(sketches: np.ndarray, layer_sketch_sizes: Sequence[int],
                             combine: str = "normalized") -> np.ndarray:
    """Per-coordinate factors that turn per-layer SCKM scores into one score.

    SCKM is a mean of cubic terms, so scaling coordinate ``i`` by ``c_i``
    multiplies its term by ``c_i**3``.  Every combination of per-layer scores
    used here is therefore plain eq. (8) on rescaled sketches ``G * c``:

    * ``"concat"``: ``c = 1``; the sketch is one vector and each layer weighs
      by its number of sketched coordinates (large layers dominate);
    * ``"mean"``: each of the L layers' SCKM (its own coordinate mean)
      counts 1/L: ``c_i**3 = d' / (L d'_l)``;
    * ``"normalized"`` (default): as ``"mean"``, and each layer's sketch is
      first divided by its RMS over all clients this round, so a layer's
      score is scale-free (gradient scales differ across layers by orders of
      magnitude, and SCKM is cubic in them).  The paper applies SCKM
      "layer-wise" (Sec. 3.1.2) without saying how layers combine; this
      reading lets every layer count;
    * ``"classifier"``: ``c = 1`` on the last two tensors (the output layer's
      weight and bias in every model here; the only tensor when there is
      one) and 0 elsewhere: eq. (8) on "a designated layer" (Sec. 3.1.2),
      the classifier.

    Parameters
    ----------
    sketches : (K, d') array
    layer_sketch_sizes : sequence of int
        Sketched coordinates per layer, in order; sums to d'.
    combine : {"normalized", "mean", "concat", "classifier"}

    Returns
    -------
    (d',) float64 array
    """
    if combine not in LAYER_COMBINE:
        raise ValueError(f"combine must be one of {LAYER_COMBINE}, got {combine!r}")
    sizes = np.asarray(layer_sketch_sizes, dtype=np.int64)
    d = sketches.shape[1]
    if sizes.sum() != d or (sizes < 1).any():
        raise ValueError(f"layer sketch sizes {sizes.tolist()} do not partition {d} coordinates")
    if combine == "concat":
        return np.ones(d)
    if combine == "classifier":
        last = int(sizes[-2:].sum())
        return np.concatenate([np.zeros(d - last), np.ones(last)])
    per_layer = np.cbrt(d / (len(sizes) * sizes.astype(float)))
    if combine == "normalized":
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        rms = np.array([np.sqrt(np.mean(np.square(sketches[:, a:b], dtype=np.float64)))
                        for a, b in itertools.pairwise(bounds)])
        per_layer = per_layer / np.where(rms > 0, rms, 1.0)
    return np.repeat(per_layer, sizes)


# -------------------------------------------------------------------- scores
def _as_sketches(sketches: np.ndarray) -> np.ndarray:
    g = np.asarray(sketches, dtype=np.float64)
    if g.ndim != 2 or g.shape[1] < 1:
        raise ValueError(f"sketches must be a (clients, coordinates) matrix, got shape {g.shape}")
    if not np.isfinite(g).all():
        raise ValueError("sketches contain non-finite values")
    return g


def sckm_pair(g: np.ndarray, h: np.ndarray) -> float:
    """Eq. (8): ``mean_i(g_i h_i**2 + g_i**2 h_i)`` for two sketches."""
    g, h = np.asarray(g, dtype=np.float64), np.asarray(h, dtype=np.float64)
    if g.shape != h.shape or g.ndim != 1:
        raise ValueError(f"sketches must be vectors of one length, got {g.shape} and {h.shape}")
    return float(np.mean(g * h * h + g * g * h))


def sckm_matrix(sketches: np.ndarray) -> np.ndarray:
    """Eq. (8) for all pairs: ``(G (G**2)^T + G**2 G^T) / d'``, K x K, symmetric.

    O(K^2 d') time and O(K^2) memory; the diagonal holds ``2 mean(g**3)``.
    """
    g = _as_sketches(sketches)
    cross = g @ np.square(g).T
    return (cross + cross.T) / g.shape[1]


def sckm_eta(sketches: np.ndarray, block_rows: int | None = None, workers: int | None = None) -> np.ndarray:
    """Eq. (9): each client's mean SCKM to the other K-1, in O(K d').

    With column sums ``P = sum_k g_k`` and ``Q = sum_k g_k**2``,
    ``sum_{k' != k} SCKM(g_k, g_k') = g_k . Q + sum_i g_ki**2 (P_i - 2 g_ki)``
    (all over d'): the self term ``2 mean(g_k**3)`` is removed instead of
    building the K x K matrix.  Two passes over ``G`` in blocks of
    ``block_rows`` rows (default: about 2 MB of float64 per block, so the
    temporaries stay in cache; float32 sketches are never copied whole).
    The blocks of each pass run on ``workers`` threads (default: the CPU
    count; numpy and BLAS release the GIL); the column sums are added in
    block order, so the result is the same to the bit for any ``workers``.

    Raises
    ------
    ValueError
        Fewer than two clients (the mean over others is undefined), or
        non-finite values.
    """
    g = np.asarray(sketches)
    if g.ndim != 2 or g.shape[1] < 1:
        raise ValueError(f"sketches must be a (clients, coordinates) matrix, got shape {g.shape}")
    k, d = g.shape
    if k < 2:
        raise ValueError("eta needs at least two clients")
    rows = block_rows or max(1, 250_000 // d)
    starts = range(0, k, rows)

    def sums(start: int) -> tuple[np.ndarray, np.ndarray, bool]:
        block = g[start:start + rows].astype(np.float64, copy=False)
        return block.sum(axis=0), np.einsum("ij,ij->j", block, block), bool(np.isfinite(block).all())

    p = np.zeros(d)
    q = np.zeros(d)
    eta = np.empty(k)

    def scores(start: int) -> None:
        block = g[start:start + rows].astype(np.float64, copy=False)
        weighted = p - 2.0 * block
        weighted *= block  # g (P - 2 g)
        eta[start:start + rows] = block @ q + np.einsum("ij,ij->i", weighted, block)

    threads = max(1, min(workers or os.cpu_count() or 1, len(starts)))
    with ThreadPoolExecutor(threads) as pool:
        for block_p, block_q, finite in pool.map(sums, starts):  # in block order: the same sums as one thread
            if not finite:
                raise ValueError("sketches contain non-finite values")
            p += block_p
            q += block_q
        list(pool.map(scores, starts))
    return eta / (d * (k - 1))


class SketchSums:
    """Eq. (9)'s column sums, kept as sketches arrive, so that every client's eta is one pass at the end.

    :func:`sckm_eta` reads the sketch matrix twice: once for the column sums ``P = sum_k g_k`` and
    ``Q = sum_k g_k**2``, once for the scores.  A selector that receives sketches one reply at a time
    can add each to ``P`` and ``Q`` as it comes (:meth:`add`, O(d') per sketch, while the other replies
    are still on their way); :meth:`eta` is then a single pass.  Layer weights (the per-coordinate
    factors ``c`` of :func:`layer_coordinate_weights`) need no weighted copy either: eta on ``G * c``
    is ``sum_i c_i**3 (g_i Q_i + g_i**2 P_i - 2 g_i**3)`` over the raw sums, and the layers' RMS for
    ``"normalized"`` come from ``Q`` (:meth:`layer_rms`).

    Parameters
    ----------
    coordinates : int
        d', the length of every sketch.
    capacity : int, optional
        How many sketches will come (rows are then written into one preallocated matrix); more may be
        added, at the cost of one copy.
    dtype : numpy floating dtype
        How the sketches are kept (float32 halves the memory of float64; the sums are float64 always).
    """

    def __init__(self, coordinates: int, capacity: int | None = None, dtype: type = np.float32) -> None:
        if coordinates < 1:
            raise ValueError(f"sketches need at least one coordinate, got {coordinates}")
        self.p = np.zeros(coordinates)
        self.q = np.zeros(coordinates)
        self._rows = np.empty((max(int(capacity or 0), 1), coordinates), dtype=dtype)
        self.count = 0

    @property
    def sketches(self) -> np.ndarray:
        """The sketches added so far (a view, K x d')."""
        return self._rows[:self.count]

    def add(self, sketches: np.ndarray) -> None:
        """Add one sketch (d',) or a block of them (n, d'); refuses non-finite values and other lengths."""
        block = np.asarray(sketches)
        block = block[None, :] if block.ndim == 1 else block
        if block.ndim != 2 or block.shape[1] != self.p.size:
            raise ValueError(f"a sketch must have {self.p.size} coordinates, got shape {np.shape(sketches)}")
        wide = block.astype(np.float64, copy=False)
        if not np.isfinite(wide).all():
            raise ValueError("sketches contain non-finite values")
        end = self.count + len(block)
        if end > len(self._rows):
            grown = np.empty((max(end, 2 * len(self._rows)), self.p.size), dtype=self._rows.dtype)
            grown[:self.count] = self._rows[:self.count]
            self._rows = grown
        self._rows[self.count:end] = block
        self.count = end
        self.p += wide.sum(axis=0)
        self.q += np.einsum("ij,ij->j", wide, wide)

    def layer_rms(self, layer_sketch_sizes: Sequence[int]) -> np.ndarray:
        """Each layer's RMS over every sketch added (from ``Q``), as ``"normalized"`` weighting divides by."""
        bounds = np.concatenate([[0], np.cumsum(layer_sketch_sizes)]).astype(np.int64)
        return np.array([np.sqrt(self.q[a:b].sum() / (self.count * (b - a))) for a, b in itertools.pairwise(bounds)])

    def eta(self, coordinate_weights: np.ndarray | None = None, block_rows: int | None = None,
            workers: int | None = None) -> np.ndarray:
        """Eq. (9) for every sketch added, on ``G * coordinate_weights`` (default: G), in one pass.

        Equal to :func:`sckm_eta` of the (weighted) matrix up to rounding (the sums are added in
        another order).  Threads and blocks as :func:`sckm_eta`; the result does not depend on
        ``workers``.
        """
        k, d = self.count, self.p.size
        if k < 2:
            raise ValueError("eta needs at least two clients")
        if coordinate_weights is None:
            linear, quadratic, cubic = self.q, self.p, 2.0
        else:
            c3 = np.asarray(coordinate_weights, dtype=np.float64) ** 3
            if c3.shape != (d,):
                raise ValueError(f"coordinate weights must have {d} entries, got shape {c3.shape}")
            linear, quadratic, cubic = c3 * self.q, c3 * self.p, 2.0 * c3
        rows = block_rows or max(1, 250_000 // d)
        g = self._rows
        eta = np.empty(k)

        def scores(start: int) -> None:
            stop = min(start + rows, k)
            block = g[start:stop].astype(np.float64, copy=False)
            inner = block * cubic  # c^3 (P - 2 g) g + c^3 Q, then times g: one pass over the block
            np.subtract(quadratic, inner, out=inner)
            inner *= block
            inner += linear
            eta[start:stop] = np.einsum("ij,ij->i", inner, block)

        starts = range(0, k, rows)
        with ThreadPoolExecutor(max(1, min(workers or os.cpu_count() or 1, len(starts)))) as pool:
            list(pool.map(scores, starts))
        return eta / (d * (k - 1))


def _offdiagonal_range(scores: np.ndarray) -> tuple[float, float]:
    off = scores[~np.eye(len(scores), dtype=bool)]
    return (float(off.min()), float(off.max())) if off.size else (0.0, 1.0)


def sckm_dissimilarity(scores: np.ndarray, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """A dissimilarity for k-medoids from SCKM scores (min-max over the off-diagonal pairs).

    SCKM is neither non-negative nor zero on the diagonal (``SCKM(g, g) =
    2 mean(g**3)`` has either sign), so k-medoids cannot use it as is.  We use
    ``D = (SCKM - low) / (high - low)`` clipped to ``[0, inf)``, where
    ``(low, high)`` are the extreme off-diagonal scores of the square matrix
    ``scores`` (whose diagonal is then set to 0).  An increasing affine map
    keeps SCKM's order of the pairs (the clients a medoid is "closest" to
    are those it is least complementary with, i.e. most redundant) and, for
    a fixed number of clusters, leaves the k-medoids optimum unchanged; the
    scale makes the elbow rule independent of gradient magnitudes.  Scores
    of clients outside a clustered sample (CLARA assignment) pass that
    sample's ``bounds`` and are transformed elementwise.
    """
    s = np.asarray(scores, dtype=np.float64)
    square = bounds is None
    if square:
        if s.ndim != 2 or s.shape[0] != s.shape[1]:
            raise ValueError(f"scores must be a square matrix, got shape {s.shape}")
        bounds = _offdiagonal_range(s)
    low, high = bounds
    d = np.clip((s - low) / (high - low if high > low else 1.0), 0.0, None)
    if square:
        np.fill_diagonal(d, 0.0)
    return d


# ---------------------------------------------------------------- selection
def _ages(last_round: np.ndarray | None, k: int) -> np.ndarray:
    """Round of last participation per client; never participated = -inf (oldest)."""
    if last_round is None:
        return np.full(k, -np.inf)
    last = np.asarray(last_round, dtype=np.float64)
    if last.shape != (k,):
        raise ValueError(f"last_round must have one entry per client ({k}), got shape {last.shape}")
    return np.where(last < 0, -np.inf, last)


def _check_budget(budget: int, k: int) -> None:
    if not 1 <= budget <= k:
        raise ValueError(f"budget must be in [1, {k}] (the number of clients), got {budget}")


def sckm_select(sketches: np.ndarray, budget: int, rng: np.random.Generator,
                last_round: np.ndarray | None = None, eta: np.ndarray | None = None) -> np.ndarray:
    """Algorithm 1: the ``budget`` clients with the largest eta (eq. 9).

    Ties in eta are broken by age of last participation (the client that
    took part longest ago, or never, first; ``last_round[k] < 0`` means
    never), then by a permutation drawn from ``rng``.  With one client its
    eta is undefined and it is returned alone.

    Parameters
    ----------
    sketches : (K, d') array
        Sketches, already layer-weighted (:func:`layer_coordinate_weights`).
    budget : int
        B, 1 <= B <= K.
    rng : numpy Generator
        Only used for the last tie-break.
    last_round : (K,) array, optional
    eta : (K,) array, optional
        Scores already computed from ``sketches`` (:func:`sckm_eta`, or :meth:`SketchSums.eta` when they
        were summed as they arrived); then only their shape is read.

    Returns
    -------
    (B,) int array
        Row indices of the selected clients, best first.
    """
    g = np.asarray(sketches)
    if eta is None and not (g.ndim == 2 and len(g) > 1):
        g = _as_sketches(g)  # else sckm_eta validates G as it reads it, without a whole float64 copy
    elif eta is not None and (g.ndim != 2 or g.shape[1] < 1):
        raise ValueError(f"sketches must be a (clients, coordinates) matrix, got shape {g.shape}")
    k = len(g)
    _check_budget(budget, k)
    if k == 1:
        return np.zeros(1, dtype=np.int64)
    if eta is None:
        scores = sckm_eta(g)
    else:  # computed from these sketches (sckm_eta or SketchSums.eta, which validated them)
        scores = np.asarray(eta, dtype=np.float64)
        if scores.shape != (k,) or not np.isfinite(scores).all():
            raise ValueError(f"eta must hold {k} finite scores, one per sketch, got shape {scores.shape}")
    order = np.lexsort((rng.permutation(k), _ages(last_round, k), -scores))
    return order[:budget].astype(np.int64)


# ----------------------------------------------------------------- clusters
def elbow_point(costs: Sequence[float], candidates: Sequence[int]) -> int:
    """The elbow of a decreasing cost curve: the candidate farthest below the chord.

    Both axes are scaled to [0, 1] over the candidates; the chosen number of
    clusters is the one whose point lies farthest below the straight line
    joining the first and last points (the "kneedle" rule of Satopaa et al.
    2011).  If no point lies below the chord (a straight or concave curve,
    i.e. no diminishing return) or there are fewer than three candidates,
    the smallest candidate is returned: more clusters buy nothing.
    """
    c = np.asarray(costs, dtype=np.float64)
    x = np.asarray(candidates, dtype=np.float64)
    if c.shape != x.shape or c.ndim != 1 or len(c) == 0:
        raise ValueError("costs and candidates must be equal-length non-empty sequences")
    if len(c) < 3 or c[0] == c[-1]:
        return int(x[0])
    xs = (x - x[0]) / (x[-1] - x[0])
    ys = (c - c[-1]) / (c[0] - c[-1])
    below = (1.0 - xs) - ys  # the chord from (0, 1) to (1, 0), minus the curve
    best = int(np.argmax(below))
    return int(x[best]) if below[best] > 1e-12 else int(x[0])


def budget_per_cluster(sizes: Sequence[int], budget: int) -> np.ndarray:
    """Per-cluster budgets ``ceil(B |c| / K)`` trimmed to sum to exactly B.

    Algorithm 2 gives each cluster ``ceil(B |c| / K)``, which can sum to more
    than B (up to B + C - 1).  We remove one at a time from the cluster
    whose budget most exceeds its exact share ``B |c| / K`` (ties: the
    larger cluster, then the lower index), never below one per cluster, so
    every cluster keeps a representative when C <= B.

    Raises
    ------
    ValueError
        More clusters than the budget, an empty cluster, or B > K.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    k = int(sizes.sum())
    if len(sizes) == 0 or (sizes < 1).any():
        raise ValueError(f"clusters must be non-empty, got sizes {sizes.tolist()}")
    if len(sizes) > budget:
        raise ValueError(f"{len(sizes)} clusters cannot each get a client from a budget of {budget}")
    _check_budget(budget, k)
    exact = budget * sizes / k
    out = np.ceil(exact - 1e-9).astype(np.int64)
    while out.sum() > budget:
        excess = np.where(out > 1, out - exact, -np.inf)
        i = np.lexsort((np.arange(len(out)), -sizes, -excess))[0]
        out[i] -= 1
    return out


@dataclass
class ClusterSelection:
    """What :func:`sckm_cluster` decided in one round."""

    selected: np.ndarray
    labels: np.ndarray
    medoids: np.ndarray
    n_clusters: int
    budgets: np.ndarray
    costs: dict[int, float] = field(default_factory=dict)


def sckm_cluster(sketches: np.ndarray, budget: int, rng: np.random.Generator, *, min_clusters: int = 1,
                 max_clusters: int | None = None, last_round: np.ndarray | None = None,
                 sample_size: int = 1000, n_clusters: int | None = None) -> ClusterSelection:
    """Algorithm 2 (SCKM-Cluster) on sketches ``G`` (K x d').

    1. Dissimilarity :func:`sckm_dissimilarity` of the SCKM matrix (eq. 8).
       When K > ``sample_size`` the medoids are found on a seeded random
       sample of ``sample_size`` clients and every client joins its least
       dissimilar medoid (CLARA, Kaufman & Rousseeuw 1990), which keeps the
       cost linear in K (eq. 11); otherwise all K clients are clustered.
    2. For each C in [``min_clusters``, min(B, ``max_clusters``)]:
       k-medoids (PAM, :func:`bouquet.algorithms.kmedoids.kmedoids`) and its
       total dissimilarity; C-hat = :func:`elbow_point` of that curve (or
       ``n_clusters`` when given).
    3. Budgets :func:`budget_per_cluster`; SCKM-Select (:func:`sckm_select`,
       eta computed inside the cluster) in each cluster.

    With C-hat = 1 this is exactly SCKM-Select (Remark 1).

    Returns
    -------
    ClusterSelection
        ``selected`` (B row indices), ``labels`` (K), ``medoids``,
        ``n_clusters`` (C-hat), ``budgets``, ``costs`` (per candidate C).
    """
    g = _as_sketches(sketches)
    k = len(g)
    _check_budget(budget, k)
    if min_clusters < 1:
        raise ValueError(f"min_clusters must be >= 1, got {min_clusters}")
    if sample_size < 2:
        raise ValueError(f"sample_size must be >= 2, got {sample_size}")
    top = min(budget, k if max_clusters is None else max_clusters, k)
    low_c = min(min_clusters, top)
    if n_clusters is not None and not 1 <= n_clusters <= min(budget, k):
        raise ValueError(f"n_clusters must be in [1, {min(budget, k)}], got {n_clusters}")

    sample = np.arange(k) if k <= sample_size else np.sort(rng.choice(k, size=sample_size, replace=False))
    scores = sckm_matrix(g[sample])
    dis = sckm_dissimilarity(scores)
    bounds = _offdiagonal_range(scores)

    candidates = [n_clusters] if n_clusters is not None else list(range(low_c, top + 1))
    fits = {c: kmedoids(dis, c) for c in candidates}
    costs = {c: fit.cost for c, fit in fits.items()}
    chosen = n_clusters if n_clusters is not None else elbow_point([costs[c] for c in candidates], candidates)
    medoids = sample[fits[chosen].medoids]
    if k <= sample_size:
        labels = fits[chosen].labels
    else:  # every client joins its least dissimilar medoid: K x C scores only
        cross = g @ np.square(g[medoids]).T + np.square(g) @ g[medoids].T
        to_medoid = sckm_dissimilarity(cross / g.shape[1], bounds)
        to_medoid[medoids, np.arange(len(medoids))] = -1.0  # a medoid belongs to its own cluster
        labels = np.argmin(to_medoid, axis=1)
    sizes = np.bincount(labels, minlength=chosen)
    budgets = budget_per_cluster(sizes, budget)
    selected = []
    for c in range(chosen):
        members = np.flatnonzero(labels == c)
        own_last = None if last_round is None else np.asarray(last_round)[members]
        picked = sckm_select(g[members], int(budgets[c]), rng, last_round=own_last)
        selected.append(members[picked])
    return ClusterSelection(np.concatenate(selected).astype(np.int64), labels, medoids, chosen, budgets, costs)


def average_cardinality(per_round: Sequence[int]) -> int:
    """Eq. (10): ``C* = floor(mean_t C-hat^(t))``."""
    if len(per_round) == 0:
        raise ValueError("no rounds")
    return math.floor(float(np.mean(per_round)))
