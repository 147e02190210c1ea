"""The SCKM paper's pair-wise feature probe (Section 4, Tables 2-4), pure numpy.

For a pair of client gradients (or sketches) ``g_i, g_j`` the features of
Table 2:

* ``d_p = ||g_i - g_j||_p`` (p = 1..4) and ``d_2^2``;
* ``cos_p = <g_i, g_j>_p / (||g_i||_p ||g_j||_p)`` with the paper's p-inner
  product ``<u, v>_p = (||u + v||_p - ||u - v||_p) / 4`` (as printed; for
  p = 2 the usual polarisation identity has squared norms, see
  :func:`p_inner`);
* marginal moments ``m_k = mean_l(g_il^k + g_jl^k)`` (k = 1..4);
* ``SCKM`` (eq. 8).

A probe fits a one-feature logistic regression by binary cross-entropy
against soft labels ``y`` in [0, 1] (eq. 5; labels are min-max normalised
pair utilities within each slice) and reports its mean loss; features are
ranked by loss (eq. 6, rank 1 = lowest loss) and scored by
``Rel.A = (L_max - L) / L_max`` (eq. 7).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bouquet.algorithms.sckm import sckm_pair

__all__ = ["FEATURES", "fit_logistic_bce", "minmax_labels", "p_inner", "pair_features", "probe_losses",
           "rank_and_relative_accuracy"]

#: Feature names in the order of Table 3.
FEATURES = ("cos1", "cos2", "cos3", "cos4", "d1", "d2", "d3", "d4", "d2sq", "m1", "m2", "m3", "m4", "sckm")


def _norm(x: np.ndarray, p: int) -> float:
    return float(np.sum(np.abs(x) ** p) ** (1.0 / p))


def p_inner(u: np.ndarray, v: np.ndarray, p: int) -> float:
    """The paper's p-inner product ``(||u + v||_p - ||u - v||_p) / 4`` (Table 2, as printed)."""
    return (_norm(u + v, p) - _norm(u - v, p)) / 4.0


def pair_features(g: np.ndarray, h: np.ndarray) -> dict[str, float]:
    """All Table 2 features of one pair of equally long vectors."""
    g, h = np.asarray(g, dtype=np.float64), np.asarray(h, dtype=np.float64)
    if g.shape != h.shape or g.ndim != 1 or g.size == 0:
        raise ValueError(f"need two non-empty vectors of one length, got {g.shape} and {h.shape}")
    out: dict[str, float] = {}
    diff = g - h
    for p in (1, 2, 3, 4):
        scale = _norm(g, p) * _norm(h, p)
        out[f"cos{p}"] = p_inner(g, h, p) / scale if scale > 0 else 0.0
        out[f"d{p}"] = _norm(diff, p)
    out["d2sq"] = float(diff @ diff)
    for k in (1, 2, 3, 4):
        out[f"m{k}"] = float(np.mean(g**k + h**k))
    out["sckm"] = sckm_pair(g, h)
    return out


def minmax_labels(scores: np.ndarray) -> np.ndarray:
    """Min-max normalise utilities within one slice to [0, 1] (all equal -> 0.5)."""
    s = np.asarray(scores, dtype=np.float64)
    span = s.max() - s.min()
    return np.full_like(s, 0.5) if span == 0 else (s - s.min()) / span


def _bce(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(np.mean(-y * np.log(p) - (1 - y) * np.log(1 - p)))


def fit_logistic_bce(x: np.ndarray, y: np.ndarray, iters: int = 100) -> tuple[float, float, float]:
    """Fit ``sigma(w z + b)`` to soft labels ``y`` by BCE (Newton's method), ``z`` = standardised ``x``.

    scikit-learn's LogisticRegression takes only hard labels; with soft
    labels the BCE is still convex in (w, b), so a few Newton steps (with a
    tiny ridge for a constant feature) find the minimum.

    Returns
    -------
    (loss, w, b)
        The mean BCE at the optimum and the fitted weights on the standardised feature.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError("need two equally long vectors with at least two pairs")
    if ((y < 0) | (y > 1)).any() or not np.isfinite(x).all():
        raise ValueError("labels must lie in [0, 1] and features be finite")
    std = x.std()
    z = (x - x.mean()) / std if std > 0 else np.zeros_like(x)
    design = np.column_stack([z, np.ones_like(z)])
    theta = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        grad = design.T @ (p - y) / len(y)
        hess = (design * (p * (1 - p))[:, None]).T @ design / len(y) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    p = 1.0 / (1.0 + np.exp(-(design @ theta)))
    return _bce(p, y), float(theta[0]), float(theta[1])


def probe_losses(features: Mapping[str, np.ndarray], labels: np.ndarray) -> dict[str, float]:
    """One-feature probe loss per feature (eq. 5) on the same pairs and labels."""
    return {name: fit_logistic_bce(np.asarray(values), labels)[0] for name, values in features.items()}


def rank_and_relative_accuracy(losses: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Eq. 6 and 7: rank by loss (1 = best, ties share the mean rank) and ``(L_max - L) / L_max``."""
    names = list(losses)
    values = np.array([losses[n] for n in names])
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):  # ties share their mean rank
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    worst = values.max()
    rel = (worst - values) / worst if worst > 0 else np.zeros_like(values)
    return dict(zip(names, ranks.tolist())), dict(zip(names, rel.tolist()))
