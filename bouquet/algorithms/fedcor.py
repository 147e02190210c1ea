"""FedCor's Gaussian process over clients' loss changes, as its official code fits and uses it (pure numpy).

Tang et al., "FedCor: Correlation-Based Active Client Selection Strategy for
Heterogeneous Federated Learning", CVPR 2022.  The loss changes ``Delta L``
of the N clients between two rounds are one draw of a Gaussian process
over clients.  The official code (``src/GPR.py``, ``Kernel_GPR`` with the
order-1 polynomial kernel, its default for CIFAR) gives client ``k`` a point
``p_k`` in a D-dimensional space (a column of ``P``, D x N) and uses

    K = P^T P + sigma_n^2 I                                    (kernel + noise)

with a prior mean ``mu`` (``update_mean``: each client's gamma-weighted mean
change).  ``P`` is fitted by maximising the gamma-weighted log marginal
likelihood of the observed change vectors ``y_e`` (eq. 10 of the paper,
``Log_Marginal_Likelihood``):

    sum_e gamma^(T - e) log N(y_e | mu, K)

with Adam from a random start.  When every client's change is observed in
every fitted round (our query phase reports every candidate's loss each
round), that maximum has a closed form: with ``S`` the weighted scatter
matrix of ``y_e - mu`` and ``U diag(lambda) U^T`` its eigendecomposition,
``K = U diag(max(lambda_i, sigma_n^2)) U^T`` keeping at most D eigenvalues
above the noise (probabilistic PCA with a fixed noise, Tipping & Bishop
1999, Section 3.2).  :func:`fit_gp_covariance` computes it;
:func:`fit_gp_covariance_reference` runs the official code's Adam ascent on
``P`` instead, and the tests prove the two reach the same likelihood.

Selection (``Select_Clients``): greedily the client ``k`` that maximises the
expected fall of the weighted total loss per standard deviation,

    beta_k * sum_i w_i Sigma_ik / sqrt(Sigma_kk)                (eq. 13)

(``w_i``: the clients' data shares; ``beta_k``: FedCor's annealing factor,
multiplied by ``discount`` each time ``k`` is selected and reset when the GP
is refitted), then conditions ``Sigma`` on ``k``:
``Sigma <- Sigma - Sigma[:, k] Sigma[k, :] / Sigma_kk``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fit_gp_covariance", "fit_gp_covariance_reference", "gp_greedy_selection", "gp_log_likelihood",
           "weighted_mean_changes"]


def _check_changes(changes: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(changes, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if y.ndim != 2 or len(y) < 1:
        raise ValueError(f"changes must be a (rounds, clients) array with at least one row, got shape {y.shape}")
    if w.shape != (len(y),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {len(y)} non-negative numbers with a positive sum")
    if not np.isfinite(y).all():
        raise ValueError("changes must be finite (fill a client's missing change before fitting)")
    return y, w


def _mean_and_scatter(changes: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``mu`` (:func:`weighted_mean_changes`) and the weighted scatter matrix of ``y_e - mu``, both fits' data."""
    y, w = _check_changes(changes, weights)
    mu = w @ y / w.sum()
    r = y - mu
    return mu, (r * w[:, None]).T @ r / w.sum()


def weighted_mean_changes(changes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The prior mean ``mu``: each client's weighted mean change (the official ``MLE_Mean``)."""
    return _mean_and_scatter(changes, weights)[0]


def gp_log_likelihood(covariance: np.ndarray, changes: np.ndarray, weights: np.ndarray,
                      mean: np.ndarray) -> float:
    """``sum_e w_e log N(y_e | mean, covariance)``: the objective both fits maximise."""
    y, w = _check_changes(changes, weights)
    sign, logdet = np.linalg.slogdet(covariance)
    if sign <= 0:
        raise ValueError("covariance must be positive definite")
    r = y - mean
    quad = np.einsum("ej,ej->e", r, np.linalg.solve(covariance, r.T).T)
    n = y.shape[1]
    return float(-0.5 * w @ (quad + logdet + n * np.log(2 * np.pi)))


def fit_gp_covariance(changes: np.ndarray, weights: np.ndarray, dimension: int = 15,
                      noise: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """The maximum-likelihood ``(mu, K)`` of FedCor's GP, in closed form.

    Parameters
    ----------
    changes : (M, N) array
        The M observed loss-change vectors of the N clients.
    weights : (M,) array
        ``gamma^(T - e)`` per vector (the official ``GPR_gamma`` discount of old rounds).
    dimension : int, default 15
        D, the dimension of the clients' embedding: the rank of ``K - noise^2 I`` is at most D
        (the official ``--dimension``).
    noise : float, default 0.01
        sigma_n, the fixed noise standard deviation (the official ``init_noise``; not trained).

    Returns
    -------
    (mu, K)
        The prior mean (:func:`weighted_mean_changes`) and the covariance
        ``U diag(max(lambda_i, noise^2)) U^T`` over the top ``dimension`` eigenvalues of the weighted
        scatter matrix (the rest at ``noise^2``): the maximum of the weighted likelihood over all
        ``K = P^T P + noise^2 I`` with P of D rows.
    """
    mu, scatter = _mean_and_scatter(changes, weights)
    if dimension < 1:
        raise ValueError(f"dimension must be >= 1, got {dimension}")
    if noise <= 0:
        raise ValueError(f"noise must be > 0, got {noise}")
    values, vectors = np.linalg.eigh(scatter)  # ascending
    floor = noise ** 2
    kept = np.full_like(values, floor)
    top = np.argsort(values)[::-1][:dimension]
    kept[top] = np.maximum(values[top], floor)
    covariance = (vectors * kept) @ vectors.T
    return mu, (covariance + covariance.T) / 2


def fit_gp_covariance_reference(changes: np.ndarray, weights: np.ndarray, dimension: int = 15,
                                noise: float = 0.01, steps: int = 3000, learning_rate: float = 0.01,
                                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The official code's fit: Adam ascent of the weighted likelihood on ``P`` (slow; the tests' reference).

    ``P`` starts at ``N(0, 1) / sqrt(D)`` (as ``Index_Projection``); the gradient of the negative
    likelihood in ``K`` is ``G = W/2 (K^-1 - K^-1 S K^-1)`` (``W`` the weights' sum, ``S`` the weighted
    scatter), so the gradient in ``P`` is ``2 P G``.  Returns ``(mu, K)`` like :func:`fit_gp_covariance`.
    """
    mu, scatter = _mean_and_scatter(changes, weights)
    total = float(np.sum(weights))
    n = len(mu)
    p = np.random.default_rng(seed).standard_normal((dimension, n)) / np.sqrt(dimension)
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults
    for t in range(1, steps + 1):
        k = p.T @ p + noise ** 2 * np.eye(n)
        inv = np.linalg.inv(k)
        g = 0.5 * total * (inv - inv @ scatter @ inv)
        grad = 2 * p @ g
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad ** 2
        p -= learning_rate * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return mu, p.T @ p + noise ** 2 * np.eye(n)


def gp_greedy_selection(covariance: np.ndarray, weights: np.ndarray, budget: int,
                        discount: np.ndarray | None = None) -> list[int]:
    """FedCor's greedy choice of ``budget`` clients (eq. 13, the official ``Select_Clients``).

    Parameters
    ----------
    covariance : (N, N) array
        The GP's covariance of the clients' loss changes.
    weights : (N,) array
        ``w_i``, each client's weight in the total loss (the official code: its data share).
    budget : int
    discount : (N,) array, optional
        ``beta_k``, each client's annealing factor (default: all 1).

    Returns
    -------
    list of int
        The chosen positions, in the order they were picked.
    """
    sigma = np.array(covariance, dtype=np.float64)
    n = len(sigma)
    w = np.asarray(weights, dtype=np.float64)
    beta = np.ones(n) if discount is None else np.asarray(discount, dtype=np.float64)
    if sigma.shape != (n, n) or w.shape != (n,) or beta.shape != (n,):
        raise ValueError(f"covariance must be (N, N) and weights, discount (N,); got {sigma.shape}, {w.shape}, "
                         f"{beta.shape}")
    if not 1 <= budget <= n:
        raise ValueError(f"budget must be in [1, {n}], got {budget}")
    picked: list[int] = []
    for _ in range(budget):
        remaining = [i for i in range(n) if i not in picked]
        sub = sigma[np.ix_(remaining, remaining)]
        score = beta[remaining] * (w[remaining] @ sub) / np.sqrt(np.clip(np.diag(sub), 1e-300, None))
        best = remaining[int(np.argmax(score))]
        picked.append(best)
        column = sigma[:, best].copy()
        sigma = sigma - np.outer(column, column) / max(column[best], 1e-300)
    return picked
