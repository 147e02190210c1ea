"""Fixed-K coalitions (El Hanjri et al. 2024, the HK paper's "FL + Coalition" baseline).

The round's S client models are partitioned into exactly K coalitions by
k-means, either on the models (``geometry="euclidean"``) or on the unit-
normalised models (``geometry="cosine"``: squared distance between unit
vectors is ``2 - 2 cos``); the next global model is the uniform mean of the
coalition barycenters, as for HK (eq. 15-16 of the HK paper).

k-means depends on the models only through their pairwise distances, so it is
run on the same isometric S x S Gram embedding that HK uses
(:func:`bouquet.algorithms.hk.gram_embedding`): identical clusters at
``O(S^2 d)`` for the Gram matrix instead of ``O(iterations K S d)``.  The
clustering itself is scikit-learn's ``KMeans`` (k-means++ initialisation,
``n_init`` restarts, seeded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.algorithms.hk import coalition_weights, gram_embedding, gram_matrix
from bouquet.params import RunConfigKeys, require

__all__ = ["FIXED_K_GEOMETRIES", "FixedKParams", "fixed_k_aggregate", "fixed_k_coalitions",
           "relabel_by_first_appearance"]

FIXED_K_GEOMETRIES = ("euclidean", "cosine")


@dataclass(frozen=True)
class FixedKParams:
    """The fixed-K baseline's hyper-parameters.

    Parameters
    ----------
    k : int, default 2
        Number of coalitions per round (fewer when fewer clients reply).
    geometry : {"euclidean", "cosine"}, default "euclidean"
        k-means on the models or on the unit-normalised models.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="fixed-", skip=("geometry",))

    k: int = 2
    geometry: str = "euclidean"

    def __post_init__(self) -> None:
        require(self.geometry in FIXED_K_GEOMETRIES, "geometry",
                f"geometry must be one of {FIXED_K_GEOMETRIES}, got {self.geometry!r}")
        require(isinstance(self.k, int | float) and int(self.k) == self.k and self.k >= 1, "k",
                f"k must be a positive integer, got {self.k}")


def relabel_by_first_appearance(labels: np.ndarray) -> np.ndarray:
    """Renumber cluster ids 0, 1, ... in order of first appearance (deterministic ids)."""
    labels = np.asarray(labels)
    _, first = np.unique(labels, return_index=True)
    order = labels[np.sort(first)]
    mapping = {old: new for new, old in enumerate(order)}
    return np.array([mapping[v] for v in labels])


def fixed_k_coalitions(weights: np.ndarray, k: int, geometry: str = "euclidean", seed: int = 0,
                       n_init: int = 10, gram: np.ndarray | None = None) -> np.ndarray:
    """Partition the rows of ``weights`` (S x d) into ``min(k, S)`` coalitions by k-means.

    Parameters
    ----------
    weights : array, shape (S, d)
    k : int
        Number of coalitions (>= 1); more than S gives one coalition per client.
    geometry : {"euclidean", "cosine"}
    seed : int
        k-means++ seed (the strategy passes a per-round seed).
    n_init : int, default 10
    gram : array, shape (S, S), optional
        ``W W^T`` if already computed.

    Returns
    -------
    numpy.ndarray of int, shape (S,)
        Coalition ids numbered by first appearance.
    """
    FixedKParams(k, geometry)  # validates
    if gram is None:
        gram = gram_matrix(weights)
    gram = np.asarray(gram, dtype=np.float64)
    n = gram.shape[0]
    if geometry == "cosine":
        norms = np.sqrt(np.diag(gram))
        if np.any(norms == 0):
            raise ValueError(f"client(s) {np.flatnonzero(norms == 0).tolist()} have a zero weight vector: "
                             "no direction for cosine coalitions")
        gram = gram / norms[:, None] / norms[None, :]
    if k >= n:
        return np.arange(n)
    if k == 1:
        return np.zeros(n, dtype=int)
    from sklearn.cluster import KMeans  # here: importing scikit-learn costs ~1 s that config readers need not pay

    embedding = gram_embedding(gram)
    model = KMeans(n_clusters=int(k), n_init=n_init, random_state=seed).fit(embedding)
    return relabel_by_first_appearance(model.labels_)


def fixed_k_aggregate(weights: np.ndarray, k: int, geometry: str = "euclidean",
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Uniform mean of the K coalition barycenters, and the labels."""
    weights = np.asarray(weights)
    labels = fixed_k_coalitions(weights, k, geometry, seed)
    return coalition_weights(labels).astype(weights.dtype) @ weights, labels
