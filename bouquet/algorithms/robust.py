"""Robust coalition aggregation: update clipping, a direction screen, a minimum coalition size (pure numpy).

The HK paper's eq. 16 gives each of the K coalitions weight 1/K, so a client that forms a coalition of
its own gets 1/K of the next model, far more than the 1/S FedAvg gives it, and both HK rules are
norm-invariant, so a client that scales its model joins a coalition and pulls its barycenter as far as
it likes, and in weight space a sign-flipped update leaves the model within cosine 0.99 of the others, so
it joins the one coalition.  Three options of the coalition aggregator close these holes (``docs/METHODS.md``, "Robust
coalitions"); both are off by default, which leaves eq. 15-16 bit for bit:

:func:`clip_updates`
    Each update ``u_i = w_i - theta_i`` (``theta_i``: the model node i was sent) is scaled down to at
    most ``bound`` times the round's median update norm, before the coalition rule sees it and before
    averaging.  Stops the *scale* attack (and bounds any one client's pull); a client below the cap is
    unchanged.
:func:`direction_screen`
    Each update's cosine with the round's coordinate-wise median update; a client below ``min_cosine`` is
    left out of the round (before the rule).  The median is the honest direction while attackers are
    fewer than half, so a flipped update (``-u``), an inner-product manipulation (``-s mean``) or noise
    that points away from it is dropped whatever its norm.  Against *sign-flip* and *IPM*, as long as the
    honest updates share a direction (not the first noisy steps from a random model, nor a few households
    whose updates disagree: ``docs/METHODS.md``).
:func:`robust_coalition_weights`
    eq. 16 over the coalitions that hold at least ``min_fraction`` of the round's clients; smaller
    coalitions get weight 0 in the shared model (with per-coalition models they still get their own
    barycenter).  Stops a *minority* that splits off (sign flips, noise, a same-value model) from taking
    1/K of the model.  When no coalition is large enough the largest ones are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bouquet.algorithms.hk import coalition_weights, member_shares

__all__ = ["ROBUST_FORM", "RobustForm", "clip_updates", "direction_screen", "robust_coalition_weights"]


@dataclass(frozen=True)
class RobustForm:
    """The values of the three robust options (``coalition-update-norm-bound``, ``coalition-update-min-cosine``,
    ``coalition-min-fraction``) that ``coalition-robust = true`` / ``HKFedAvg(robust=True)`` turns on."""

    update_norm_bound: float
    update_min_cosine: float
    min_coalition_fraction: float


#: The form the attack study chose on validation (``docs/results/attacks.md``, "The study under the
#: protocol"; design ``experiments/attacks/studies/protocol.toml``).
ROBUST_FORM = RobustForm(update_norm_bound=2.0, update_min_cosine=0.0, min_coalition_fraction=0.34)


def direction_screen(updates: np.ndarray, min_cosine: float,
                     relative: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Which rows point along the coordinate-wise median row: ``cos(u_i, median_j u_j) >= t``.

    The reference ``m`` is the coordinate-wise median of the rows (float64); row ``i``'s score is
    ``c_i = u_i . m / (||u_i|| ||m||)``, 0 for a zero row or a zero median (no direction to judge).  The
    threshold is ``t = min_cosine``, or with ``relative > 0``, ``t = max(min_cosine, relative x median_i c_i)``.
    When no row reaches ``t`` every row is kept (the screen has nothing to stand on).  With fewer than half
    of the rows adversarial the median lies inside the honest rows' coordinate ranges, so a flipped honest
    update scores the negative of its honest twin; and the median score is an honest one, so the relative
    threshold follows the honest updates' agreement as it grows over the rounds (a label-flipped update
    keeps a small positive score: ``scripts/probe_label_flip_directions.py``).

    Parameters
    ----------
    updates : array, shape (S, d)
        The round's updates ``w_i - theta_i``, one per row (not modified).
    min_cosine : float
        The threshold, in [-1, 1]; -1 keeps every row.
    relative : float, default 0.0
        In [0, 1]: the threshold rises to this multiple of the median score where that is higher; 0 is off.

    Returns
    -------
    (numpy.ndarray of bool, shape (S,), numpy.ndarray of shape (S,))
        The rows kept, and every row's cosine with the median.
    """
    if not (np.isfinite(min_cosine) and -1.0 <= min_cosine <= 1.0):
        raise ValueError(f"min_cosine must be in [-1, 1], got {min_cosine}")
    if not (np.isfinite(relative) and 0.0 <= relative <= 1.0):
        raise ValueError(f"relative must be in [0, 1], got {relative}")
    updates = np.asarray(updates)
    if updates.ndim != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be a non-empty (S, d) matrix, got shape {updates.shape}")
    rows = updates.astype(np.float64)
    if not np.isfinite(rows).all():
        raise ValueError("updates must be finite")
    median = np.median(rows, axis=0)
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(median)
    cosines = np.divide(rows @ median, norms, out=np.zeros(len(rows)), where=norms > 0)
    cosines = np.clip(cosines, -1.0, 1.0)
    threshold = max(min_cosine, relative * float(np.median(cosines))) if relative > 0 else min_cosine
    keep = cosines >= threshold
    if not keep.any():
        keep[:] = True
    return keep, cosines


def clip_updates(updates: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Scale each row to at most ``bound`` times the median row norm.

    Row ``i`` becomes ``u_i * min(1, bound * median_j ||u_j|| / ||u_i||)``; rows at or below the cap
    are returned unchanged (the same float values).  With a median of 0 the cap is 0: every non-zero
    row is clipped to zero (more than half of the round did not move).

    Parameters
    ----------
    updates : array, shape (S, d)
        The round's updates ``w_i - theta_i``, one per row (not modified).
    bound : float
        The cap as a multiple of the median norm, > 0 (1 clips every row above the median).

    Returns
    -------
    (numpy.ndarray of shape (S, d), numpy.ndarray of shape (S,))
        The clipped updates (a new array) and each row's factor (1.0 where nothing was clipped).
    """
    if not np.isfinite(bound) or bound <= 0:
        raise ValueError(f"bound must be a finite number > 0, got {bound}")
    updates = np.asarray(updates)
    if updates.ndim != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be a non-empty (S, d) matrix, got shape {updates.shape}")
    norms = np.linalg.norm(updates.astype(np.float64), axis=1)
    if not np.isfinite(norms).all():
        raise ValueError("updates must be finite")
    cap = bound * float(np.median(norms))
    factors = np.ones(len(norms))
    over = norms > cap
    factors[over] = cap / norms[over]
    clipped = updates.copy()
    clipped[over] = (updates[over] * factors[over, None]).astype(updates.dtype)
    return clipped, factors


def robust_coalition_weights(labels: np.ndarray, num_examples: np.ndarray | None = None,
                             min_fraction: float = 0.0) -> np.ndarray:
    """Per-client coefficients of eq. 16 over the coalitions with at least ``min_fraction`` of the clients.

    Coalition ``k`` is *kept* when ``|C_k| >= min_fraction * S`` (S = ``len(labels)``); if none is, the
    largest coalitions (all of the largest size) are kept.  Each kept coalition counts ``1 / K_kept``
    and its members share it as in :func:`bouquet.algorithms.hk.coalition_weights` (equally, or by
    ``num_examples``); members of the others get 0.  ``min_fraction = 0`` is eq. 16 itself (the same
    float values as :func:`~bouquet.algorithms.hk.coalition_weights`).

    Parameters
    ----------
    labels : array of int, shape (S,)
        Coalition id per client, ids 0..K-1.
    num_examples : array, shape (S,), optional
        Weights members by their example counts inside their coalition.
    min_fraction : float, default 0
        In [0, 1].

    Returns
    -------
    numpy.ndarray of shape (S,)
        Non-negative, summing to 1.
    """
    if not 0.0 <= min_fraction <= 1.0:
        raise ValueError(f"min_fraction must be in [0, 1], got {min_fraction}")
    labels = np.asarray(labels)
    if min_fraction == 0.0:
        return coalition_weights(labels, num_examples)
    sizes = np.bincount(labels)
    kept = (sizes >= min_fraction * len(labels)) & (sizes > 0)
    if not kept.any():
        kept = sizes == sizes.max()
    return np.where(kept[labels], member_shares(labels, num_examples) / int(kept.sum()), 0.0)
