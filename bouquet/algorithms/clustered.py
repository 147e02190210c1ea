"""Clustered FL baselines as pure numpy: IFCA (Ghosh et al. 2020) and CFL (Sattler et al. 2020).

**IFCA** (Iterative Federated Clustering Algorithm, "model averaging" variant): the server keeps K
models; each round a client computes its loss under every one of them, joins the cluster of the
lowest loss (:func:`ifca_assign`), trains that model, and the server averages the returned models
within each cluster (a cluster no client chose keeps its model).  K is given.

**CFL** (Clustered Federated Learning): the federation starts as one cluster trained by FedAvg; after
each round, a cluster whose clients have reached a stationary point of the *joint* objective (the norm
of the mean update is below ``eps1``) while some client is still far from its own (the largest update
norm is above ``eps2``) is split in two by the cosine similarities of the clients' updates
(:func:`cfl_split_criterion`, :func:`cfl_bipartition`).  The bipartition is the complete-linkage
agglomerative clustering of the cosine similarities into two groups, as in the authors' code (their
paper states the goal: two groups with the smallest largest similarity across them; a brute-force
check, :func:`cfl_bipartition_exact`, finds that optimum on small cases).  K is not given.

Parameters follow the papers and their public code: IFCA's K; CFL's ``eps1 = 0.4``, ``eps2 = 1.6``, a
20-round warm-up and clusters of at least 3 clients to split (their MNIST experiment; the thresholds
depend on the model and learning rate, so they are parameters).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["CFLParams", "IFCAParams", "cfl_bipartition", "cfl_bipartition_exact", "cfl_split_criterion",
           "cosine_similarities", "ifca_assign", "ifca_budget_problem", "perturbed"]


@dataclass(frozen=True)
class IFCAParams:
    """IFCA's hyper-parameters.

    Parameters
    ----------
    k : int, default 2
        The number of cluster models (given, as in the paper).
    init_scale : float, default 1.0
        When the K initial models are made from one model: each tensor plus Gaussian noise of this many
        times the tensor's standard deviation (1 where it is 0), seeded by ``[seed, k]``.
    loss_examples : int, default 512
        Examples a client scores each model on (all of them when it has fewer), drawn by the round seed.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="ifca-")

    k: int = 2
    init_scale: float = 1.0
    loss_examples: int = 512

    def __post_init__(self) -> None:
        require(isinstance(self.k, int | float) and int(self.k) == self.k and self.k >= 1, "k",
                f"ifca-k must be a positive integer, got {self.k}")
        require(self.init_scale >= 0, "init_scale", f"ifca-init-scale must be >= 0, got {self.init_scale}")
        require(self.loss_examples >= 1, "loss_examples", f"ifca-loss-examples must be >= 1, got {self.loss_examples}")


def ifca_budget_problem(k: int, clients_per_round: int | None) -> str | None:
    """Why IFCA's ``k`` clusters cannot run with ``clients_per_round`` clients a round (each round must be able to
    reach every cluster), or None."""
    if clients_per_round is not None and k > clients_per_round:
        return f"{k} clusters is more than the {clients_per_round} clients per round"
    return None


@dataclass(frozen=True)
class CFLParams:
    """CFL's hyper-parameters (the authors' MNIST values as defaults).

    Parameters
    ----------
    eps1 : float, default 0.4
        Split a cluster only when the norm of its clients' mean update is below this (the cluster has
        converged on the joint objective).
    eps2 : float, default 1.6
        ... and the largest single update norm is above this (some client has not converged on its own).
    warmup : int, default 20
        No split before this round.
    min_size : int, default 3
        Smallest cluster that may be split.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="cfl-")

    eps1: float = 0.4
    eps2: float = 1.6
    warmup: int = 20
    min_size: int = 3

    def __post_init__(self) -> None:
        require(self.eps1 > 0, "eps1", f"cfl-eps1 must be > 0, got {self.eps1}")
        require(self.eps2 > 0, "eps2", f"cfl-eps2 must be > 0, got {self.eps2}")
        require(self.warmup >= 0, "warmup", f"cfl-warmup must be >= 0, got {self.warmup}")
        require(self.min_size >= 2, "min_size", f"cfl-min-size must be >= 2, got {self.min_size}")


def ifca_assign(losses: np.ndarray) -> np.ndarray:
    """Each client's cluster: the index of its lowest loss (rows: clients, columns: the K models).

    Ties go to the lower index; a non-finite loss never wins over a finite one.
    """
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 2 or losses.shape[1] < 1:
        raise ValueError(f"losses must be (clients, K) with K >= 1, got shape {losses.shape}")
    return np.argmin(np.where(np.isfinite(losses), losses, np.inf), axis=1)


def perturbed(arrays: dict[str, np.ndarray], scale: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``arrays`` with Gaussian noise of ``scale`` x each floating tensor's std (1 where it is 0) added."""
    out = {}
    for name, value in arrays.items():
        if not np.issubdtype(value.dtype, np.floating):
            out[name] = value.copy()
            continue
        std = float(np.std(value))
        noise = rng.standard_normal(value.shape) * scale * (std if std > 0 else 1.0)
        out[name] = (value + noise).astype(value.dtype)
    return out


def cosine_similarities(updates: np.ndarray) -> np.ndarray:
    """(n x n) cosine similarities of the rows (a zero row has similarity 0 with every row, 1 with itself)."""
    updates = np.asarray(updates, dtype=np.float64)
    norms = np.linalg.norm(updates, axis=1)
    unit = updates / np.where(norms > 0, norms, 1.0)[:, None]
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, 1.0)
    return np.clip(similarity, -1.0, 1.0)


def cfl_split_criterion(updates: np.ndarray, params: CFLParams, server_round: int) -> tuple[bool, float, float]:
    """Whether a cluster with these client updates (rows) is split: ``(split, mean norm, max norm)``.

    Split when ``server_round > warmup``, the cluster has at least ``min_size`` clients, the norm of the
    mean update is below ``eps1`` and the largest update norm above ``eps2`` (CFL, Algorithm 1).
    """
    updates = np.asarray(updates, dtype=np.float64)
    mean_norm = float(np.linalg.norm(updates.mean(axis=0))) if len(updates) else 0.0
    max_norm = float(np.linalg.norm(updates, axis=1).max()) if len(updates) else 0.0
    split = (server_round > params.warmup and len(updates) >= params.min_size and mean_norm < params.eps1
             and max_norm > params.eps2)
    return split, mean_norm, max_norm


def cfl_bipartition(similarity: np.ndarray) -> np.ndarray:
    """Labels 0/1 splitting the clients in two by complete-linkage clustering of their similarities.

    The distance is ``1 - similarity`` (the authors cluster ``-similarity``; a constant shift does not
    change complete linkage).  Labels are numbered by first appearance, so client 0 is in group 0.
    """
    from sklearn.cluster import AgglomerativeClustering  # here: scikit-learn takes ~1 s to import

    similarity = np.asarray(similarity, dtype=np.float64)
    if similarity.shape[0] < 2:
        raise ValueError("a bipartition needs at least two clients")
    distance = np.clip(1.0 - similarity, 0.0, None)
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(distance).labels_
    return (labels != labels[0]).astype(int)


def cfl_bipartition_exact(similarity: np.ndarray) -> tuple[np.ndarray, float]:
    """The bipartition with the smallest largest cross-group similarity, by trying them all (small n only).

    Returns ``(labels with client 0 in group 0, that largest cross similarity)``.
    """
    n = similarity.shape[0]
    if not 2 <= n <= 16:
        raise ValueError(f"exact bipartition tries 2^(n-1) splits: n must be in [2, 16], got {n}")
    best, best_value = None, np.inf
    for mask in itertools.product((0, 1), repeat=n - 1):
        labels = np.array((0, *mask))
        if labels.all() or not labels.any():
            continue
        cross = similarity[np.ix_(labels == 0, labels == 1)].max()
        if cross < best_value - 1e-12:
            best, best_value = labels, float(cross)
    return best, best_value
