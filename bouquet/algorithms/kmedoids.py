"""k-medoids by PAM (BUILD + SWAP) on a precomputed dissimilarity matrix (pure numpy).

Why our own: scikit-learn has no k-medoids; scikit-learn-extra's wheel fails
with numpy 2, and the fast ``kmedoids`` package (FasterPAM) is GPL-3.0, which
an Apache-2.0 package cannot depend on at run time (see docs/METHODS.md).

The algorithm is Kaufman & Rousseeuw's PAM: a greedy BUILD, then
best-improvement SWAP steps until no swap lowers the total dissimilarity.
Each SWAP step evaluates all k (n - k) swaps at once with the
decomposition of Schubert & Rousseeuw (FastPAM1, 2019): with ``d1``/``d2``
each point's dissimilarity to its nearest/second-nearest medoid,

    delta(m_i -> x) = sum_j min(D[x, j] - d1[j], 0)
                    + sum_{j near m_i} [min(D[x, j], d2[j]) - d1[j] - min(D[x, j] - d1[j], 0)],

an (n x n) elementwise pass and one (n x n) @ (n x k) product per step.
The result is deterministic (ties go to the lowest index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["KMedoidsResult", "kmedoids"]


@dataclass(frozen=True)
class KMedoidsResult:
    """Medoid indices (sorted), cluster label per point (medoid order), total cost, SWAP steps."""

    medoids: np.ndarray
    labels: np.ndarray
    cost: float
    swaps: int


def kmedoids(dissimilarity: np.ndarray, n_clusters: int, max_swaps: int = 1000) -> KMedoidsResult:
    """PAM k-medoids.

    Parameters
    ----------
    dissimilarity : (n, n) array
        Symmetric, non-negative, zero diagonal (checked).
    n_clusters : int
        k, 1 <= k <= n.
    max_swaps : int, default 1000
        Cap on SWAP steps (each is one best improvement).

    Returns
    -------
    KMedoidsResult
        Labels index ``medoids`` (label c = ``medoids[c]``'s cluster); the
        cost is ``sum_j D[j, medoid(j)]``.
    """
    d = np.asarray(dissimilarity, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"dissimilarity must be a square matrix, got shape {d.shape}")
    n = len(d)
    if not 1 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be in [1, {n}], got {n_clusters}")
    if not np.isfinite(d).all() or (d < 0).any():
        raise ValueError("dissimilarity must be finite and non-negative")
    if not np.allclose(d, d.T) or np.any(np.diag(d) != 0):
        raise ValueError("dissimilarity must be symmetric with a zero diagonal")
    medoids = _build(d, n_clusters)
    swaps = 0
    while swaps < max_swaps:
        move = _best_swap(d, medoids)
        if move is None:
            break
        slot, point = move
        medoids[slot] = point
        swaps += 1
    medoids = np.sort(medoids)
    labels = np.argmin(d[:, medoids], axis=1)
    labels[medoids] = np.arange(n_clusters)  # a medoid labels itself even when tied with another
    cost = float(d[np.arange(n), medoids[labels]].sum())
    return KMedoidsResult(medoids, labels, cost, swaps)


def _build(d: np.ndarray, k: int) -> np.ndarray:
    """Greedy BUILD: the most central point, then each point that lowers the cost most."""
    medoids = [int(np.argmin(d.sum(axis=1)))]
    nearest = d[medoids[0]].copy()
    for _ in range(1, k):
        gain = np.minimum(d, nearest[None, :]).sum(axis=1)
        gain[medoids] = np.inf
        best = int(np.argmin(gain))
        medoids.append(best)
        nearest = np.minimum(nearest, d[best])
    return np.array(medoids, dtype=np.int64)


def _best_swap(d: np.ndarray, medoids: np.ndarray) -> tuple[int, int] | None:
    """(medoid slot, new point) of the best improving swap, or None at a local optimum."""
    n, k = len(d), len(medoids)
    to_medoids = d[:, medoids]  # n x k
    order = np.argsort(to_medoids, axis=1, kind="stable")
    nearest_slot = order[:, 0]
    d1 = to_medoids[np.arange(n), nearest_slot]
    d2 = to_medoids[np.arange(n), order[:, 1]] if k > 1 else np.full(n, np.inf)
    gain_all = np.minimum(d - d1[None, :], 0.0)  # [x, j]: x as a new medoid, every old one kept
    # correction for the points whose medoid leaves (k == 1: d2 = inf, so they all move to x)
    removal = np.minimum(d, d2[None, :]) - d1[None, :] - gain_all
    members = np.zeros((n, k))
    members[np.arange(n), nearest_slot] = 1.0
    delta = gain_all.sum(axis=1)[:, None] + removal @ members  # [x, slot]
    delta[medoids, :] = np.inf
    x, slot = np.unravel_index(int(np.argmin(delta)), delta.shape)
    scale = max(1.0, float(np.abs(d1).sum()))
    if delta[x, slot] >= -1e-12 * scale:
        return None
    return int(slot), int(x)
