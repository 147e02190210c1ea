"""How well a partition of clients matches their true groups, and how stable partitions are (pure numpy).

Benchmarks with known groups (rotated images, household types) record each client's group; coalitions
(HK, fixed-K), clusters (IFCA, CFL) and served models are partitions of the same clients.  The
agreement is the adjusted Rand index (Hubert & Arabie 1985, scikit-learn's ``adjusted_rand_score``):
1 for the same partition up to names, about 0 for a random one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

__all__ = ["agreement", "stability"]


def agreement(truth: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Adjusted Rand index of ``labels`` against ``truth`` (same clients, same order).

    Raises ValueError for sequences of different length.  With fewer than two clients the index is 1.
    """
    from sklearn.metrics import adjusted_rand_score  # here: scikit-learn takes ~1 s to import

    if len(truth) != len(labels):
        raise ValueError(f"{len(truth)} true groups for {len(labels)} labels")
    if len(truth) < 2:
        return 1.0
    return float(adjusted_rand_score([str(t) for t in truth], [str(label) for label in labels]))


def stability(previous: Mapping[Hashable, Hashable], current: Mapping[Hashable, Hashable]) -> float | None:
    """Adjusted Rand index between two rounds' partitions over the clients in both (None: fewer than two)."""
    common = sorted(set(previous) & set(current), key=str)
    if len(common) < 2:
        return None
    return agreement([previous[c] for c in common], [current[c] for c in common])
