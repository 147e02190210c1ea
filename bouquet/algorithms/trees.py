"""Gradient-boosted regression trees grown from summed histograms: the same trees pooled or federated.

Histogram boosting (LightGBM's and XGBoost's ``hist`` method) reads the training rows only through sums: for
each open tree node, input and bin, the sum of the rows' gradients and their count.  Sums add up across
households, so a server that adds the households' histograms grows exactly the trees a pooled fit grows from
the same bins (XGBoost's and NVFlare's horizontal federated mode).  This module is the arithmetic of both,
pure numpy:

* **Bins** (:func:`quantile_sketch`, :func:`merge_sketches`, :func:`bin_codes`): each party summarises every
  input by ``sketch_points`` quantiles and its count of values; the server merges them into at most
  ``max_bins`` bins per input (the pooled distribution's quantiles, weighting each party's points by its
  count).  A missing value has a bin of its own and goes down the side of each split that its training
  chose (XGBoost's default direction).
* **One level at a time** (:class:`TreeGrower`): the grower asks for the histograms of its open nodes (of the
  smaller child of each split: the sibling is the parent's histogram minus it), picks each node's best split
  by the second-order gain ``G_L^2 / (N_L + lambda) + G_R^2 / (N_R + lambda) - G^2 / (N + lambda)`` (all
  hessians are 1 for the three objectives here, so ``H`` is the count), and opens the children, up to
  ``max_depth`` levels; a child needs ``min_child_samples`` rows.
* **Objectives** (:func:`gradients`): ``l2`` (gradient ``p - y``), ``huber`` (``p - y`` clipped at
  ``huber_delta``, LightGBM's), and ``l1`` (the sign of ``p - y``) whose leaves are then *renewed* to the
  median residual of their rows, as LightGBM does; the median comes from a histogram of the residuals on a
  fixed grid of ``renewal_bins`` bins over ``[-renewal_range, renewal_range]`` (:func:`residual_histogram`,
  :func:`histogram_median`: linear inside the median's bin), because a median, unlike a sum, does not add up
  across parties.  The starting score is the mean (``l2``, ``huber``) or that median of the targets.
* **Parties** (:class:`Rows`, :func:`answer`): a party answers a :class:`Request` (apply the trees finished
  since its last answer, then the sums asked for) from its own rows; :func:`fit` drives the rounds against any
  source of summed answers.  The pooled fit is :func:`fit` over one party holding every row
  (:func:`pooled_source`); the federated fit is the same driver over Flower messages
  (:mod:`bouquet.serving.trees`), whose sums differ from the pooled ones only in the order of additions.

Each request is one message exchange: ``max_depth`` exchanges grow a tree, and ``l1`` adds one for the
renewal (folded with the next tree's first level: a party applies a finished tree when it is asked for the
next one's sums).  The slow reference paths (:func:`slow_histograms`, :func:`slow_best_split`,
:func:`slow_predict`) are plain Python loops, proven equal to the fast ones in the tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = [
    "BIN_SOURCES",
    "COUNTERS",
    "OBJECTIVES",
    "Ensemble",
    "FitLog",
    "OutOfStep",
    "PartiesSource",
    "PartyState",
    "Request",
    "Rows",
    "Source",
    "Split",
    "Tree",
    "TreeGrower",
    "TreeParams",
    "add_replies",
    "answer",
    "best_splits",
    "bin_codes",
    "edges_from_grid",
    "fit",
    "gradients",
    "grid_counts",
    "histogram_median",
    "merge_sketches",
    "node_histograms",
    "pooled_source",
    "quantile_sketch",
    "residual_histogram",
    "route",
    "slow_best_split",
    "slow_histograms",
    "slow_predict",
    "to_dense",
    "to_sparse",
]

#: The objectives (``tree-objective``).
OBJECTIVES = ("l2", "l1", "huber")
#: Where the bins come from (``tree-bins``).
BIN_SOURCES = ("sketch", "grid")
#: Gains within this relative distance of the best are ties, broken by the first input and bin: sums added in
#: another order must not change which of two equally good splits is taken.
GAIN_TIE = 1e-9


@dataclass(frozen=True)
class TreeParams:
    """Gradient-boosted trees from summed histograms (``tree-*`` run-config keys).

    Parameters
    ----------
    objective : {"l1", "l2", "huber"}, default "l1"
        ``tree-objective``: the training loss; ``l1`` renews each leaf to the median residual of its rows.  The
        defaults of the objective, ``trees``, ``learning_rate``, ``max_depth`` and ``huber_delta`` are the
        forecaster study's choice on the DAIAD meters' validation days.
    trees : int, default 50
        ``tree-count``: boosting rounds (trees).
    learning_rate : float, default 0.1
        ``tree-learning-rate``: each tree's leaves are multiplied by it (shrinkage).
    max_depth : int, default 8
        ``tree-max-depth``: levels of splits (a tree has at most ``2 ** max_depth`` leaves); one message
        exchange grows one level.
    max_bins : int, default 63
        ``tree-max-bins``: bins per input (a missing value has one more).
    min_child_samples : int, default 20
        ``tree-min-child-samples``: the fewest rows a leaf may hold (LightGBM's ``min_data_in_leaf``).
    l2_regularisation : float, default 0.0
        ``tree-lambda``: lambda in the gain and in ``-G / (N + lambda)``.
    huber_delta : float, default 0.2
        ``tree-huber-delta``: where the ``huber`` gradient is clipped (target units).
    renewal_bins : int, default 400
        ``tree-renewal-bins``: bins of the residual histogram an ``l1`` leaf's median is read from.
    renewal_range : float, default 4.0
        ``tree-renewal-range``: the residual histogram covers ``[-r, r]`` (target units; residuals beyond it
        count in the end bins).
    sketch_points : int, default 128
        ``tree-sketch-points``: quantiles per input each party sends to place the bins.
    bins : {"sketch", "grid"}, default "sketch"
        ``tree-bins``: where the bins come from.  ``sketch``: each party's quantiles of each input, merged on
        the server (it sees every party's quantiles).  ``grid``: each party's counts of each input on a fixed
        fine grid (the caller's, :func:`bouquet.forecasting.features.feature_grid` for the water forecasters),
        summed like the histograms, so the server sees only the pool's counts; the bins are the pool's
        quantiles read off the summed grid.
    secure_sums : bool, default False
        ``tree-secure-sums``: the parties mask every array they send with pairwise masks that cancel in the
        sum (:mod:`bouquet.algorithms.masking`), so the server learns the sums only.  Needs ``bins = "grid"``
        (a sketch cannot be summed).
    coalitions : str, default "none"
        ``tree-coalitions``: one ensemble for every node (``none``), or one per coalition of a given partition:
        ``groups`` (a benchmark's known household types) or the path of a CSV file with the columns
        ``partition-id`` and ``coalition``; each coalition's ensemble is grown over its own nodes only.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        prefix="tree-", rename={"trees": "tree-count", "l2_regularisation": "tree-lambda"})

    objective: str = "l1"
    trees: int = 50
    learning_rate: float = 0.1
    max_depth: int = 8
    max_bins: int = 63
    min_child_samples: int = 20
    l2_regularisation: float = 0.0
    huber_delta: float = 0.2
    renewal_bins: int = 400
    renewal_range: float = 4.0
    sketch_points: int = 128
    bins: str = "sketch"
    secure_sums: bool = False
    coalitions: str = "none"

    def __post_init__(self) -> None:
        require(self.objective in OBJECTIVES, "objective",
                f"tree-objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        require(self.trees >= 1, "trees", f"tree-count must be >= 1, got {self.trees}")
        require(0 < self.learning_rate <= 1, "learning_rate",
                f"tree-learning-rate must be in (0, 1], got {self.learning_rate}")
        require(1 <= self.max_depth <= 12, "max_depth", f"tree-max-depth must be in 1 .. 12, got {self.max_depth}")
        require(2 <= self.max_bins <= 1024, "max_bins", f"tree-max-bins must be in 2 .. 1024, got {self.max_bins}")
        require(self.min_child_samples >= 1, "min_child_samples",
                f"tree-min-child-samples must be >= 1, got {self.min_child_samples}")
        require(self.l2_regularisation >= 0, "l2_regularisation",
                f"tree-lambda must be >= 0, got {self.l2_regularisation}")
        require(self.huber_delta > 0, "huber_delta", f"tree-huber-delta must be > 0, got {self.huber_delta}")
        require(self.renewal_bins >= 2, "renewal_bins", f"tree-renewal-bins must be >= 2, got {self.renewal_bins}")
        require(self.renewal_range > 0, "renewal_range", f"tree-renewal-range must be > 0, got {self.renewal_range}")
        require(self.sketch_points >= 2, "sketch_points",
                f"tree-sketch-points must be >= 2, got {self.sketch_points}")
        require(self.bins in BIN_SOURCES, "bins", f"tree-bins must be one of {', '.join(BIN_SOURCES)}, got {self.bins!r}")
        require(self.coalitions in ("none", "groups") or self.coalitions.endswith(".csv"), "coalitions",
                f"tree-coalitions must be none, groups or the path of a .csv file, got {self.coalitions!r}")
        require(not self.secure_sums or self.bins == "grid", "secure_sums",
                "tree-secure-sums needs tree-bins = \"grid\": the bins' sketches show each household's quantiles, "
                "and only sums can be masked")

    @property
    def renews(self) -> bool:
        """Whether leaves are renewed to their median residual (one more exchange per tree)."""
        return self.objective == "l1"

    @property
    def renewal_edges(self) -> np.ndarray:
        """The edges of the residual histogram's bins, shape (renewal_bins + 1,)."""
        return np.linspace(-self.renewal_range, self.renewal_range, self.renewal_bins + 1)


# ------------------------------------------------------------------------------------------------------- bins
def quantile_sketch(x: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """A party's summary of each input: ``points`` quantiles of its non-missing values (at probabilities
    ``(i + 0.5) / points``; NaN for an input with none) and their count, shapes (F, points) and (F,)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"need rows x inputs, got shape {x.shape}")
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    probabilities = (np.arange(points) + 0.5) / points
    quantiles = np.full((x.shape[1], points), np.nan)
    counts = np.isfinite(x).sum(axis=0).astype(np.float64)
    for f in np.flatnonzero(counts > 0):
        column = x[:, f]
        quantiles[f] = np.quantile(column[np.isfinite(column)], probabilities, method="inverted_cdf")
    return quantiles, counts


def merge_sketches(sketches: Sequence[tuple[np.ndarray, np.ndarray]], max_bins: int) -> np.ndarray:
    """Bin edges from the parties' sketches: per input, the quantiles at ``k / max_bins`` (k = 1 .. max_bins - 1)
    of the pooled points (each party's weighted by its count over its points), duplicates dropped.

    Returns
    -------
    numpy.ndarray, shape (F, max_bins - 1)
        Each row's edges ascending, padded with +inf; value ``v`` falls in bin ``#(edges < v)``.
    """
    if not sketches:
        raise ValueError("no sketch to merge")
    if max_bins < 2:
        raise ValueError(f"max_bins must be >= 2, got {max_bins}")
    features = sketches[0][0].shape[0]
    if any(q.shape[0] != features or c.shape != (features,) for q, c in sketches):
        raise ValueError("sketches must cover the same inputs")
    edges = np.full((features, max_bins - 1), np.inf)
    targets = np.arange(1, max_bins) / max_bins
    for f in range(features):
        values, weights = [], []
        for quantiles, counts in sketches:
            if counts[f] > 0:
                values.append(quantiles[f])
                weights.append(np.full(quantiles.shape[1], counts[f] / quantiles.shape[1]))
        if not values:
            continue
        v, w = np.concatenate(values), np.concatenate(weights)
        order = np.argsort(v, kind="stable")
        v, cdf = v[order], np.cumsum(w[order]) / w.sum()
        picked = np.unique(v[np.minimum(np.searchsorted(cdf, targets - 1e-12, side="left"), len(v) - 1)])
        edges[f, :len(picked)] = picked
    return edges


def bin_codes(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each value's bin, shape (n, F), uint16: ``#(edges[f] < v)`` (0 .. max_bins - 1), and ``max_bins`` for a
    missing value."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or edges.ndim != 2 or x.shape[1] != edges.shape[0]:
        raise ValueError(f"need rows x {edges.shape[0]} inputs, got shape {x.shape}")
    missing = edges.shape[1] + 1
    codes = np.empty(x.shape, dtype=np.uint16)
    for f in range(x.shape[1]):
        column = x[:, f]
        codes[:, f] = np.where(np.isfinite(column), np.searchsorted(edges[f], column, side="left"), missing)
    return codes


def grid_counts(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Each input's count of values in each bin of its fine ``grid`` row (F, K + 1 edges; values beyond it count
    in its end bins, missing values nowhere), shape (F, K): a party's share of the pool's grid."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or grid.ndim != 2 or x.shape[1] != grid.shape[0]:
        raise ValueError(f"need rows x {grid.shape[0]} inputs, got shape {x.shape}")
    bins = grid.shape[1] - 1
    out = np.zeros((grid.shape[0], bins))
    for f in range(grid.shape[0]):
        column = x[:, f][np.isfinite(x[:, f])]
        which = np.clip(np.searchsorted(grid[f], column, side="right") - 1, 0, bins - 1)
        out[f] = np.bincount(which, minlength=bins)
    return out


def edges_from_grid(counts: np.ndarray, grid: np.ndarray, max_bins: int) -> np.ndarray:
    """Bin edges from the pool's counts on the fine grid: per input, the right edge of the grid bin where the
    pooled distribution reaches ``k / max_bins`` (k = 1 .. max_bins - 1), duplicates dropped (the layout of
    :func:`merge_sketches`)."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape != (grid.shape[0], grid.shape[1] - 1):
        raise ValueError(f"need counts of shape {(grid.shape[0], grid.shape[1] - 1)}, got {counts.shape}")
    edges = np.full((grid.shape[0], max_bins - 1), np.inf)
    targets = np.arange(1, max_bins) / max_bins
    for f in range(grid.shape[0]):
        total = counts[f].sum()
        if total <= 0:
            continue
        cdf = np.cumsum(counts[f]) / total
        picked = np.unique(grid[f, 1:][np.minimum(np.searchsorted(cdf, targets - 1e-12, side="left"),
                                                   counts.shape[1] - 1)])
        picked = picked[picked < grid[f, -1]]  # the grid's top edge splits nothing off
        edges[f, :len(picked)] = picked
    return edges


# --------------------------------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class Tree:
    """A regression tree over bin codes, its nodes in the order they were opened (level by level).

    ``feature[k]`` is -1 at a leaf; an internal node sends a row left where its code is ``<= threshold[k]``,
    and a missing value left where ``missing_left[k]``; ``value[k]`` is a leaf's output (shrinkage included).
    """

    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray

    ARRAYS: ClassVar[tuple[str, ...]] = ("feature", "threshold", "missing_left", "left", "right", "value")

    @classmethod
    def from_array(cls, packed: np.ndarray) -> Tree:
        """The tree of :meth:`to_array`'s (nodes, 6) array (one array: a message carries few, large ones)."""
        packed = np.asarray(packed, dtype=np.float64)
        if packed.ndim != 2 or packed.shape[1] != len(cls.ARRAYS) or not len(packed):
            raise ValueError(f"a tree is a non-empty (nodes, {len(cls.ARRAYS)}) array, got shape {packed.shape}")
        tree = cls(packed[:, 0].astype(np.int32), packed[:, 1].astype(np.int32), packed[:, 2] != 0,
                   packed[:, 3].astype(np.int32), packed[:, 4].astype(np.int32), packed[:, 5].copy())
        n = len(tree.feature)
        inner = tree.feature >= 0
        if (inner & ((tree.left <= np.arange(n)) | (tree.right <= np.arange(n)) | (tree.right >= n))).any():
            raise ValueError("a tree's children must come after their parent and exist")
        return tree

    def to_array(self) -> np.ndarray:
        """The tree as one (nodes, 6) float64 array: feature, threshold, missing_left, left, right, value."""
        return np.stack([getattr(self, name).astype(np.float64) for name in self.ARRAYS], axis=1)

    @property
    def leaves(self) -> np.ndarray:
        return np.flatnonzero(self.feature < 0)

    def predict_codes(self, codes: np.ndarray, missing: int) -> np.ndarray:
        """Each binned row's leaf value (``missing``: the missing value's code, ``max_bins``)."""
        return self.value[route(self, codes, missing)]


def route(tree: Tree, codes: np.ndarray, missing: int) -> np.ndarray:
    """The node each row of ``codes`` reaches: a leaf, or an open node of a tree still growing (``missing``: the
    missing value's code, ``max_bins``)."""
    node = np.zeros(len(codes), dtype=np.int64)
    while True:
        moving = np.flatnonzero(tree.feature[node] >= 0)
        if not len(moving):
            return node
        at = node[moving]
        code = codes[moving, tree.feature[at]].astype(np.int64)
        go_left = np.where(code == missing, tree.missing_left[at], code <= tree.threshold[at])
        node[moving] = np.where(go_left, tree.left[at], tree.right[at])


def slow_predict(tree: Tree, codes: np.ndarray, missing: int) -> np.ndarray:
    """:meth:`Tree.predict` row by row (the reference)."""
    out = np.empty(len(codes))
    for i, row in enumerate(codes):
        k = 0
        while tree.feature[k] >= 0:
            code = int(row[tree.feature[k]])
            left = bool(tree.missing_left[k]) if code == missing else code <= tree.threshold[k]
            k = int(tree.left[k] if left else tree.right[k])
        out[i] = tree.value[k]
    return out


def _stack_trees(trees: Sequence[Tree]) -> tuple[np.ndarray, list[int]]:
    """Trees as one (nodes, 6) array, end to end, and each tree's node count."""
    if not trees:
        return np.zeros((0, len(Tree.ARRAYS))), []
    return np.concatenate([t.to_array() for t in trees]), [len(t.feature) for t in trees]


def _unstack_trees(packed: np.ndarray, sizes: Sequence[int]) -> tuple[Tree, ...]:
    sizes = [int(n) for n in sizes]
    if any(n < 1 for n in sizes) or sum(sizes) != len(packed):
        raise ValueError(f"tree sizes {sizes} do not cover the {len(packed)} nodes sent")
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return tuple(Tree.from_array(packed[a:b]) for a, b in itertools.pairwise(bounds))


@dataclass(frozen=True)
class Ensemble:
    """A fitted forecaster: the start score, the trees and the bins they read.

    Predictions are in the target's units (for the water forecasters: the ratio to the household's level).
    """

    init: float
    trees: tuple[Tree, ...]
    edges: np.ndarray

    @property
    def missing(self) -> int:
        """The missing value's code (``max_bins``)."""
        return self.edges.shape[1] + 1

    def predict_codes(self, codes: np.ndarray, trees: int | None = None) -> np.ndarray:
        """The start score plus the first ``trees`` trees' outputs (default all) for binned rows."""
        out = np.full(len(codes), self.init)
        for tree in self.trees[:trees]:
            out += tree.predict_codes(codes, self.missing)
        return out

    def predict(self, x: np.ndarray, trees: int | None = None) -> np.ndarray:
        """Predictions for raw inputs ``x`` (n, F), NaN where missing."""
        return self.predict_codes(bin_codes(x, self.edges), trees)

    def to_arrays(self) -> dict[str, np.ndarray]:
        packed, sizes = _stack_trees(self.trees)
        return {"init": np.array([self.init]), "edges": self.edges, "trees": packed,
                "tree-sizes": np.array(sizes, dtype=np.int64)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Ensemble:
        missing = [k for k in ("init", "edges", "trees", "tree-sizes") if k not in arrays]
        if missing:
            raise ValueError(f"a tree ensemble needs the arrays init, edges, trees and tree-sizes; missing "
                             f"{', '.join(missing)}")
        edges = np.asarray(arrays["edges"], dtype=np.float64)
        if edges.ndim != 2:
            raise ValueError(f"edges must be inputs x (max_bins - 1), got shape {edges.shape}")
        return cls(float(np.asarray(arrays["init"]).ravel()[0]),
                   _unstack_trees(np.asarray(arrays["trees"]).reshape(-1, len(Tree.ARRAYS)), arrays["tree-sizes"]),
                   edges)


# ------------------------------------------------------------------------------------------------ the sums
def gradients(objective: str, y: np.ndarray, pred: np.ndarray, huber_delta: float = 1.0) -> np.ndarray:
    """The gradient of each row's loss at its prediction (every hessian is 1): ``p - y`` (``l2``), its sign
    (``l1``), or ``p - y`` clipped to ``[-delta, delta]`` (``huber``, LightGBM's)."""
    diff = np.asarray(pred, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    if objective == "l2":
        return diff
    if objective == "l1":
        return np.sign(diff)
    if objective == "huber":
        return np.clip(diff, -huber_delta, huber_delta)
    raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")


def node_histograms(codes: np.ndarray, g: np.ndarray, position: np.ndarray, nodes: int, max_bins: int
                    ) -> np.ndarray:
    """Per tree node, input and bin: the sum of the rows' gradients and their count.

    Parameters
    ----------
    codes : (n, F) uint16
        :func:`bin_codes` (``max_bins`` is the missing bin).
    g : (n,) float
    position : (n,) int
        Each row's node, as a position ``0 .. nodes - 1`` among the nodes asked for; -1 leaves the row out.
    nodes, max_bins : int

    Returns
    -------
    numpy.ndarray, shape (nodes, F, max_bins + 1, 2)
        ``[..., 0]`` the gradient sums, ``[..., 1]`` the counts.
    """
    features = codes.shape[1]
    keep = position >= 0
    width = max_bins + 1
    flat = (position[keep, None] * features + np.arange(features)[None, :]) * width + codes[keep].astype(np.int64)
    size = nodes * features * width
    sums = np.bincount(flat.ravel(), weights=np.repeat(g[keep], features), minlength=size)
    counts = np.bincount(flat.ravel(), minlength=size).astype(np.float64)
    return np.stack([sums, counts], axis=-1).reshape(nodes, features, width, 2)


def slow_histograms(codes: np.ndarray, g: np.ndarray, position: np.ndarray, nodes: int, max_bins: int
                    ) -> np.ndarray:
    """:func:`node_histograms` row by row (the reference)."""
    out = np.zeros((nodes, codes.shape[1], max_bins + 1, 2))
    for i in range(len(codes)):
        if position[i] < 0:
            continue
        for f in range(codes.shape[1]):
            out[position[i], f, codes[i, f], 0] += g[i]
            out[position[i], f, codes[i, f], 1] += 1
    return out


def residual_histogram(residual: np.ndarray, position: np.ndarray, leaves: int, edges: np.ndarray) -> np.ndarray:
    """Per leaf (``position``: 0 .. leaves - 1, -1 leaves a row out), the count of residuals in each bin of
    ``edges`` (values beyond the grid count in its end bins); shape (leaves, len(edges) - 1)."""
    bins = len(edges) - 1
    keep = position >= 0
    which = np.clip(np.searchsorted(edges, residual[keep], side="right") - 1, 0, bins - 1)
    return np.bincount(position[keep] * bins + which, minlength=leaves * bins).astype(np.float64).reshape(leaves, bins)


def histogram_median(counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each row's median from its histogram over ``edges``: linear inside the bin where half the count is
    reached (0 for an empty row)."""
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    total = counts.sum(axis=1)
    cum = np.cumsum(counts, axis=1)
    half = total / 2
    bin_ = np.minimum((cum < half[:, None]).sum(axis=1), counts.shape[1] - 1)
    before = np.where(bin_ > 0, np.take_along_axis(cum, np.maximum(bin_ - 1, 0)[:, None], axis=1)[:, 0], 0.0)
    inside = np.take_along_axis(counts, bin_[:, None], axis=1)[:, 0]
    width = np.diff(edges)[bin_]
    fraction = np.where(inside > 0, (half - before) / np.maximum(inside, 1e-300), 0.5)
    return np.where(total > 0, edges[bin_] + fraction * width, 0.0)


# ---------------------------------------------------------------------------------------------- the splits
@dataclass(frozen=True)
class Split:
    """The best split of each node (``feature`` -1 where none is allowed): the input, the last bin on the left,
    where a missing value goes, the gain, and each child's gradient sum and count."""

    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    gain: np.ndarray
    left_g: np.ndarray
    left_n: np.ndarray
    right_g: np.ndarray
    right_n: np.ndarray


def _score(g: np.ndarray, n: np.ndarray, lam: float) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n + lam > 0, g * g / (n + lam), 0.0)


def best_splits(hist: np.ndarray, params: TreeParams) -> Split:
    """Each node's best split from its histogram (nodes, F, max_bins + 1, 2), by the gain of the module's
    docstring; a split needs ``min_child_samples`` rows each side and a gain above 0.  Ties (within
    :data:`GAIN_TIE`) go to the first input, then the first bin, then a missing value on the left (so where no
    row of a node is missing at the chosen input, a missing value goes left, as in LightGBM)."""
    nodes, width = hist.shape[0], hist.shape[2]
    bins = width - 1
    lam = params.l2_regularisation
    g_total = hist[:, 0, :, 0].sum(axis=1)
    n_total = hist[:, 0, :, 1].sum(axis=1)
    cum = np.cumsum(hist[:, :, :bins - 1, :], axis=2)  # left = bins 0 .. b, b = 0 .. bins - 2
    miss = hist[:, :, bins, :]
    left = np.stack([cum + miss[:, :, None, :], cum], axis=3)  # [..., direction, stat]: 0 missing left, 1 right
    gl, nl = left[..., 0], left[..., 1]
    gr, nr = g_total[:, None, None, None] - gl, n_total[:, None, None, None] - nl
    gain = _score(gl, nl, lam) + _score(gr, nr, lam) - _score(g_total, n_total, lam)[:, None, None, None]
    allowed = (nl >= params.min_child_samples) & (nr >= params.min_child_samples)
    gain = np.where(allowed, gain, -np.inf)
    flat = gain.reshape(nodes, -1)
    best = flat.max(axis=1)
    tie = flat >= (best - GAIN_TIE * np.maximum(np.abs(best), 1.0))[:, None]
    pick = np.argmax(tie, axis=1)
    f, b, d = np.unravel_index(pick, gain.shape[1:])
    rows = np.arange(nodes)
    ok = np.isfinite(best) & (best > 0)
    left_n, right_n = nl[rows, f, b, d], nr[rows, f, b, d]
    missing_left = d == 0
    return Split(np.where(ok, f, -1).astype(np.int32), np.where(ok, b, -1).astype(np.int32),
                 np.where(ok, missing_left, False), np.where(ok, best, 0.0), gl[rows, f, b, d], left_n,
                 gr[rows, f, b, d], right_n)


def slow_best_split(hist: np.ndarray, params: TreeParams) -> tuple[int, int, bool, float]:
    """One node's ``(feature, threshold, missing_left, gain)`` by loops over every input, bin and direction
    (the reference of :func:`best_splits`; ``(-1, -1, False, 0.0)`` where no split is allowed)."""
    features, width, _ = hist.shape
    bins = width - 1
    lam = params.l2_regularisation

    def score(g: float, n: float) -> float:
        return g * g / (n + lam) if n + lam > 0 else 0.0

    g_total, n_total = float(hist[0, :, 0].sum()), float(hist[0, :, 1].sum())
    candidates = []
    for f in range(features):
        for b in range(bins - 1):
            for d in (0, 1):  # 0: a missing value goes left
                gl = float(hist[f, :b + 1, 0].sum()) + (0.0 if d else float(hist[f, bins, 0]))
                nl = float(hist[f, :b + 1, 1].sum()) + (0.0 if d else float(hist[f, bins, 1]))
                gr, nr = g_total - gl, n_total - nl
                if nl < params.min_child_samples or nr < params.min_child_samples:
                    continue
                candidates.append((score(gl, nl) + score(gr, nr) - score(g_total, n_total), f, b, d))
    if not candidates:
        return -1, -1, False, 0.0
    best = max(c[0] for c in candidates)
    if best <= 0:
        return -1, -1, False, 0.0
    _, f, b, d = next(c for c in candidates if c[0] >= best - GAIN_TIE * max(abs(best), 1.0))
    return f, b, d == 0, best


# --------------------------------------------------------------------------------------------- the grower
class TreeGrower:
    """One tree, grown a level per exchange from the histograms of its open nodes (server side).

    :attr:`wanted` names the nodes whose histograms the next exchange must bring (the root, then the smaller
    child of each split: its sibling's is the parent's minus it); :meth:`grow` takes them, in that order, and
    splits the level; with ``l1``, :meth:`renew` then sets every leaf to ``learning_rate`` times its median
    residual (:attr:`leaves` names them, in order).  :meth:`tree` is the tree so far (its open nodes are
    leaves of value 0 until they are split or closed)."""

    def __init__(self, params: TreeParams) -> None:
        self.params = params
        self._nodes: list[dict] = [{"feature": -1, "threshold": -1, "missing_left": False, "left": -1, "right": -1,
                                    "value": 0.0, "depth": 0, "g": 0.0, "n": 0.0}]
        self._open = [0]
        self.wanted: list[int] = [0]
        self._parent_hist: dict[int, np.ndarray] = {}  # open node -> its parent's histogram
        self.renewed = not params.renews

    @property
    def done(self) -> bool:
        """Every node is split or closed (the leaves' values may still await :meth:`renew`)."""
        return not self._open

    @property
    def leaves(self) -> list[int]:
        return [k for k, node in enumerate(self._nodes) if node["feature"] < 0]

    def tree(self) -> Tree:
        return Tree(*(np.array([node[name] for node in self._nodes], dtype=kind) for name, kind in (
            ("feature", np.int32), ("threshold", np.int32), ("missing_left", bool), ("left", np.int32),
            ("right", np.int32), ("value", np.float64))))

    def _close(self, k: int) -> None:
        node = self._nodes[k]
        lam, rate = self.params.l2_regularisation, self.params.learning_rate
        node["value"] = -node["g"] / (node["n"] + lam) * rate if node["n"] + lam > 0 else 0.0

    def grow(self, hists: np.ndarray) -> None:
        """Split the open level from the histograms of :attr:`wanted` (shape (len(wanted), F, bins + 1, 2))."""
        if self.done:
            raise RuntimeError("the tree has no open node left")
        if len(hists) != len(self.wanted):
            raise ValueError(f"need {len(self.wanted)} histograms (one per wanted node), got {len(hists)}")
        given = dict(zip(self.wanted, hists))
        level = []
        for k in self._open:
            if k in given:
                level.append(given[k])
            else:
                sibling = self._sibling(k)
                level.append(self._parent_hist[k] - given[sibling])
        level_hist = np.stack(level)
        if self._open == [0]:
            root = self._nodes[0]
            root["g"], root["n"] = float(level_hist[0, 0, :, 0].sum()), float(level_hist[0, 0, :, 1].sum())
        splits = best_splits(level_hist, self.params)
        opened, wanted, parents = [], [], {}
        for i, k in enumerate(self._open):
            node = self._nodes[k]
            if splits.feature[i] < 0 or node["depth"] >= self.params.max_depth:
                self._close(k)
                continue
            children = []
            for g, n in ((splits.left_g[i], splits.left_n[i]), (splits.right_g[i], splits.right_n[i])):
                self._nodes.append({"feature": -1, "threshold": -1, "missing_left": False, "left": -1, "right": -1,
                                    "value": 0.0, "depth": node["depth"] + 1, "g": float(g), "n": float(n)})
                children.append(len(self._nodes) - 1)
            node.update(feature=int(splits.feature[i]), threshold=int(splits.threshold[i]),
                        missing_left=bool(splits.missing_left[i]), left=children[0], right=children[1])
            if node["depth"] + 1 >= self.params.max_depth:  # the children are leaves: their sums are known
                for child in children:
                    self._close(child)
                continue
            opened += children
            left, right = children
            wanted.append(left if splits.left_n[i] <= splits.right_n[i] else right)
            parents[left] = parents[right] = level_hist[i]
        self._open, self.wanted, self._parent_hist = opened, wanted, parents

    def _sibling(self, k: int) -> int:
        for node in self._nodes:
            if node["left"] == k:
                return node["right"]
            if node["right"] == k:
                return node["left"]
        raise KeyError(k)

    def renew(self, medians: np.ndarray) -> None:
        """``l1``: each leaf of :attr:`leaves` (in order) becomes ``learning_rate`` times its median residual."""
        leaves = self.leaves
        if len(medians) != len(leaves):
            raise ValueError(f"need {len(leaves)} medians (one per leaf), got {len(medians)}")
        for k, m in zip(leaves, medians):
            self._nodes[k]["value"] = float(m) * self.params.learning_rate
        self.renewed = True


# ----------------------------------------------------------------------------------------- the parties
#: What the ``counters`` array of a reply counts, in order (summed over parties like every other array).
COUNTERS = ("applied", "validation-mae", "validation-parties")
#: The kinds of :class:`Request`, in the order a fit sends them (``sketch`` or ``grid`` for the bins).
REQUESTS = ("sketch", "grid", "start", "histograms", "residuals", "apply")


@dataclass(frozen=True)
class Request:
    """What the server asks every party for in one exchange.

    ``kind``: ``sketch`` (each input's quantiles), ``start`` (take the bins ``edges``; the targets' sum, count
    and residual histogram, for the start score), ``histograms`` (of the open ``nodes`` of the growing
    ``tree``), ``residuals`` (the residual histograms of the ``tree``'s leaves ``nodes``), ``apply`` (nothing
    but the applying).  Before answering, a party adds the trees ``apply`` (the ensemble's trees ``first``,
    ``first + 1``, ...) to its predictions, which start at ``init``.
    """

    kind: str
    init: float = float("nan")
    first: int = 0
    apply: tuple[Tree, ...] = ()
    tree: Tree | None = None
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    edges: np.ndarray | None = None
    points: int = 0

    def __post_init__(self) -> None:
        if self.kind not in REQUESTS:
            raise ValueError(f"request kind must be one of {', '.join(REQUESTS)}, got {self.kind!r}")

    def to_arrays(self) -> tuple[dict[str, object], dict[str, np.ndarray]]:
        """``(config, arrays)``: the scalars and lists, and at most three arrays (the trees to apply, the growing
        tree, the bins): what a message carries."""
        packed, sizes = _stack_trees(self.apply)
        config = {"kind": self.kind, "init": float(self.init), "first": int(self.first), "points": int(self.points),
                  "apply-sizes": sizes, "nodes": [int(k) for k in self.nodes]}
        arrays = {"apply": packed}
        if self.tree is not None:
            arrays["tree"] = self.tree.to_array()
        if self.edges is not None:
            arrays["edges"] = self.edges
        return config, arrays

    @classmethod
    def from_arrays(cls, config: dict[str, object], arrays: dict[str, np.ndarray]) -> Request:
        packed = np.asarray(arrays.get("apply", np.zeros((0, len(Tree.ARRAYS))))).reshape(-1, len(Tree.ARRAYS))
        return cls(str(config["kind"]), float(config.get("init", float("nan"))), int(config.get("first", 0)),
                   _unstack_trees(packed, list(config.get("apply-sizes", []))),
                   Tree.from_array(arrays["tree"]) if "tree" in arrays else None,
                   np.asarray(config.get("nodes", []), dtype=np.int64), arrays.get("edges"),
                   int(config.get("points", 0)))


@dataclass
class Rows:
    """A party's rows: the training inputs ``x`` (n, F) and targets ``y``, and optionally rows that validate
    (``val_x``, ``val_y``, with ``val_weight`` turning a target-unit error into the unit reported: the level,
    for litres).  The bins' codes are computed once per set of edges."""

    x: np.ndarray
    y: np.ndarray
    val_x: np.ndarray | None = None
    val_y: np.ndarray | None = None
    val_weight: np.ndarray | None = None
    _codes: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.float64)
        self.y = np.asarray(self.y, dtype=np.float64)
        if self.x.ndim != 2 or self.y.shape != (len(self.x),):
            raise ValueError(f"need rows x inputs and one target per row, got {self.x.shape} and {self.y.shape}")
        if not np.isfinite(self.y).all():
            raise ValueError("every training target must be finite")
        if self.val_x is not None:
            self.val_x = np.asarray(self.val_x, dtype=np.float64)
            self.val_y = np.asarray(self.val_y, dtype=np.float64)
            self.val_weight = (np.ones(len(self.val_x)) if self.val_weight is None
                               else np.asarray(self.val_weight, dtype=np.float64))
            if self.val_x.shape[1:] != self.x.shape[1:] or not len(self.val_y) == len(self.val_weight) == len(self.val_x):
                raise ValueError("validation rows must have the training rows' inputs, one target and weight each")

    def codes(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        key = edges.tobytes()
        if key not in self._codes:
            self._codes = {key: (bin_codes(self.x, edges),
                                 None if self.val_x is None else bin_codes(self.val_x, edges))}
        return self._codes[key]


@dataclass(frozen=True)
class PartyState:
    """What a party keeps between exchanges: the bins, the start score, how many trees it has applied and its
    predictions (training and validation rows)."""

    edges: np.ndarray
    init: float
    applied: int
    pred: np.ndarray
    val_pred: np.ndarray

    @classmethod
    def empty(cls) -> PartyState:
        return cls(np.zeros((0, 0)), float("nan"), 0, np.zeros(0), np.zeros(0))

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Two arrays: the bins, and ``[init, applied, n, pred (n), val_pred]``."""
        head = np.array([self.init, float(self.applied), float(len(self.pred))])
        return {"edges": self.edges, "state": np.concatenate([head, self.pred, self.val_pred])}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> PartyState:
        state = np.asarray(arrays["state"], dtype=np.float64)
        n = int(state[2])
        return cls(np.asarray(arrays["edges"], dtype=np.float64), float(state[0]), int(state[1]),
                   state[3:3 + n].copy(), state[3 + n:].copy())


class OutOfStep(RuntimeError):
    """A party was asked to apply trees it cannot (it missed earlier ones, or the run's bins differ)."""


def answer(request: Request, rows: Rows, state: PartyState, params: TreeParams) -> tuple[dict[str, np.ndarray],
                                                                                       PartyState]:
    """A party's reply to ``request`` from its own ``rows`` and ``state``, and its next state.

    Every array of the reply but a ``sketch``'s is a sum over the party's rows: the server adds the parties'
    replies up.  Replies after the start also carry ``counters`` (:data:`COUNTERS`): the trees applied (the
    server checks every party is in step), the party's mean absolute error on its validation rows (weighted by
    ``val_weight``: litres for the water forecasters) and 1 where it has any, so that the sums give the mean
    over parties.
    """
    if request.kind == "sketch":
        quantiles, counts = quantile_sketch(rows.x, request.points)
        return {"quantiles": quantiles, "counts": counts}, state
    if request.kind == "grid":
        if request.edges is None:
            raise ValueError("a grid request carries the fine grid")
        return {"grid": grid_counts(rows.x, request.edges)}, state
    if request.kind == "start":
        if request.edges is None:
            raise ValueError("a start request carries the bins' edges")
        if request.edges.shape[0] != rows.x.shape[1]:
            raise ValueError(f"the bins cover {request.edges.shape[0]} inputs; this party has {rows.x.shape[1]}")
        val_n = 0 if rows.val_x is None else len(rows.val_x)
        state = PartyState(request.edges, float("nan"), 0, np.zeros(len(rows.y)), np.zeros(val_n))
        start = residual_histogram(rows.y, np.zeros(len(rows.y), dtype=np.int64), 1, params.renewal_edges)
        return {"sum": np.array([rows.y.sum()]), "count": np.array([float(len(rows.y))]), "residuals": start}, state
    if not state.edges.size:
        raise OutOfStep("this party has no bins yet: it missed the fit's start")
    codes, val_codes = rows.codes(state.edges)
    missing = state.edges.shape[1] + 1
    pred, val_pred, applied = state.pred, state.val_pred, state.applied
    if not np.isfinite(state.init):
        if not np.isfinite(request.init):
            raise OutOfStep("the request carries no start score")
        pred, val_pred = pred + request.init, val_pred + request.init
    if request.first > applied:
        raise OutOfStep(f"asked to apply trees from {request.first}; this party has applied {applied}")
    for k, tree in enumerate(request.apply, start=request.first):
        if k < applied:
            continue  # applied already (a request delivered twice)
        pred = pred + tree.predict_codes(codes, missing)
        if val_codes is not None:
            val_pred = val_pred + tree.predict_codes(val_codes, missing)
        applied = k + 1
    state = PartyState(state.edges, request.init if np.isfinite(request.init) else state.init, applied, pred, val_pred)
    counters = np.zeros(len(COUNTERS))
    counters[0] = applied
    if rows.val_x is not None and len(rows.val_x):
        counters[1] = float(np.mean(np.abs(val_pred - rows.val_y) * rows.val_weight))
        counters[2] = 1.0
    reply: dict[str, np.ndarray] = {"counters": counters}
    if request.kind in ("histograms", "residuals"):
        if request.tree is None:
            raise ValueError(f"a {request.kind} request carries the growing tree")
        node = route(request.tree, codes, missing)
        wanted = np.asarray(request.nodes, dtype=np.int64)
        lookup = np.full(len(request.tree.feature), -1, dtype=np.int64)
        lookup[wanted] = np.arange(len(wanted))
        position = lookup[node]
        if request.kind == "histograms":
            g = gradients(params.objective, rows.y, pred, params.huber_delta)
            reply["histograms"] = node_histograms(codes, g, position, len(wanted), missing)
        else:
            reply["residuals"] = residual_histogram(rows.y - pred, position, len(wanted), params.renewal_edges)
    return reply, state


#: The reply arrays a node may send sparse (their non-zero entries only): a household of a few hundred days fills
#: few of the bins of a deep level's histograms.
SPARSE = ("histograms", "residuals", "grid")


def to_sparse(reply: dict[str, np.ndarray], names: Sequence[str] = SPARSE) -> dict[str, np.ndarray]:
    """``reply`` with each array of ``names`` as its non-zero entries: ``<name>@index`` (uint32 positions in the
    flattened array), ``<name>@values`` and ``<name>@shape`` (:func:`to_dense` restores it exactly)."""
    out = {}
    for name, values in reply.items():
        if name not in names or values.size >= 2 ** 32:
            out[name] = values
            continue
        flat = np.asarray(values).ravel()
        index = np.flatnonzero(flat)
        out |= {f"{name}@index": index.astype(np.uint32), f"{name}@values": flat[index],
                f"{name}@shape": np.asarray(values.shape, dtype=np.int64)}
    return out


def to_dense(reply: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays :func:`to_sparse` sent sparse, whole again (zeros where nothing was sent)."""
    out = {k: v for k, v in reply.items() if "@" not in k}
    for key, shape in reply.items():
        if key.endswith("@shape"):
            name = key[:-len("@shape")]
            dense = np.zeros(int(np.prod(shape)), dtype=reply[f"{name}@values"].dtype)
            dense[reply[f"{name}@index"].astype(np.int64)] = reply[f"{name}@values"]
            out[name] = dense.reshape(tuple(int(n) for n in shape))
    return out


class Source:
    """Where a fit's sums come from (the protocol of :func:`fit`)."""

    def sketches(self, points: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every party's :func:`quantile_sketch`."""
        raise NotImplementedError

    def sums(self, request: Request) -> dict[str, np.ndarray]:
        """The parties' replies to ``request``, added up array by array."""
        raise NotImplementedError


class PartiesSource(Source):
    """Parties answered in process, their replies added in party order: one party holding every row is the
    pooled fit (:func:`pooled_source`); several are the federation without the messages (the tests' twin of
    the Flower fit)."""

    def __init__(self, parties: Sequence[Rows], params: TreeParams) -> None:
        if not parties:
            raise ValueError("no party")
        self.parties = list(parties)
        self.params = params
        self.states = [PartyState.empty() for _ in parties]

    def sketches(self, points: int) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for rows in self.parties:
            reply, _ = answer(Request("sketch", points=points), rows, PartyState.empty(), self.params)
            out.append((reply["quantiles"], reply["counts"]))
        return out

    def sums(self, request: Request) -> dict[str, np.ndarray]:
        replies = []
        for i, rows in enumerate(self.parties):
            reply, self.states[i] = answer(request, rows, self.states[i], self.params)
            replies.append(reply)
        return add_replies(replies)


def add_replies(replies: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The parties' replies added up, array by array, in the order given (an array some lack counts as 0), and
    ``parties``, how many there were."""
    out: dict[str, np.ndarray] = {"parties": np.array([float(len(replies))])}
    for reply in replies:
        for name, value in reply.items():
            out[name] = out[name] + value if name in out else np.array(value, dtype=np.float64)
    return out


def pooled_source(x: np.ndarray, y: np.ndarray, params: TreeParams, val_x: np.ndarray | None = None,
                  val_y: np.ndarray | None = None, val_weight: np.ndarray | None = None) -> PartiesSource:
    """Every row in one party: :func:`fit` over it is the pooled fit."""
    return PartiesSource([Rows(x, y, val_x, val_y, val_weight)], params)


@dataclass
class FitLog:
    """What a fit did: the exchanges it made, and the validation error after each number of trees (index k: k
    trees; the mean over the parties that have validation rows of each one's mean absolute error; NaN without
    any)."""

    exchanges: int = 0
    validation: list[float] = field(default_factory=list)

    def record(self, reply: dict[str, np.ndarray]) -> None:
        _, mae, parties = reply["counters"]
        self.validation.append(float(mae / parties) if parties else float("nan"))


def fit(source: Source, params: TreeParams, edges: np.ndarray | None = None,
        progress: Callable[[int, FitLog], None] | None = None, grid: np.ndarray | None = None
        ) -> tuple[Ensemble, FitLog]:
    """Boost ``params.trees`` trees from ``source``'s sums (the module docstring's rounds).

    Parameters
    ----------
    source : Source
    params : TreeParams
    edges : array, optional
        The bins (default: one exchange: merged from the parties' sketches, or with ``params.bins = "grid"``
        read off their summed counts on ``grid``).
    grid : array (F, K + 1), optional
        The fine grid of ``params.bins = "grid"``.
    progress : callable(trees done, log), optional
        Called after each tree.

    Returns
    -------
    (Ensemble, FitLog)

    Raises
    ------
    OutOfStep
        The parties do not all report the trees applied that the server sent (one missed a message).
    """
    log = FitLog()
    if edges is None and params.bins == "grid":
        if grid is None:
            raise ValueError("tree-bins = \"grid\" needs the fine grid of every input")
        edges = edges_from_grid(source.sums(Request("grid", edges=grid))["grid"], grid, params.max_bins)
        log.exchanges += 1
    elif edges is None:
        edges = merge_sketches(source.sketches(params.sketch_points), params.max_bins)
        log.exchanges += 1

    def exchange(request: Request) -> dict[str, np.ndarray]:
        reply = source.sums(request)
        log.exchanges += 1
        expected = request.first + len(request.apply)
        applied = float(reply["counters"][0]) if request.kind != "start" else 0.0
        if request.kind != "start" and applied != float(reply["parties"][0]) * expected:
            raise OutOfStep(f"{reply['parties'][0]:g} parties report {applied:g} trees applied in all, "
                            f"not {expected} each")
        return reply

    start = exchange(Request("start", edges=edges))
    total = float(start["count"][0])
    if total <= 0:
        raise ValueError("the parties hold no training row")
    init = (float(histogram_median(start["residuals"], params.renewal_edges)[0]) if params.renews
            else float(start["sum"][0]) / total)
    trees: list[Tree] = []
    pending: list[Tree] = []
    for _ in range(params.trees):
        grower = TreeGrower(params)
        first_level = True
        while not grower.done:
            request = Request("histograms", init=init, first=len(trees) - len(pending), apply=tuple(pending),
                              tree=grower.tree(), nodes=np.array(grower.wanted))
            reply = exchange(request)
            if first_level:
                log.record(reply)
                first_level = False
            pending = []
            grower.grow(reply["histograms"])
        if params.renews:
            leaves = grower.leaves
            reply = exchange(Request("residuals", init=init, first=len(trees), tree=grower.tree(),
                                     nodes=np.array(leaves)))
            grower.renew(histogram_median(reply["residuals"], params.renewal_edges))
        tree = grower.tree()
        trees.append(tree)
        pending = [tree]
        if progress is not None:
            progress(len(trees), log)
    log.record(exchange(Request("apply", init=init, first=len(trees) - 1, apply=tuple(pending))))
    return Ensemble(init, tuple(trees), edges), log

