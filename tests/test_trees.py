"""Gradient-boosted trees from summed histograms (bouquet.algorithms.trees): hand cases, the slow references,
properties, the pooled fit against LightGBM on the same bins, the federated twin against the pooled fit, and bad
input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bouquet.algorithms.trees import (
    Ensemble,
    OutOfStep,
    PartiesSource,
    PartyState,
    Request,
    Rows,
    Tree,
    TreeGrower,
    TreeParams,
    answer,
    best_splits,
    bin_codes,
    fit,
    gradients,
    histogram_median,
    merge_sketches,
    node_histograms,
    pooled_source,
    quantile_sketch,
    residual_histogram,
    route,
    slow_best_split,
    slow_histograms,
    slow_predict,
)
from bouquet.params import ParamError


def regression_data(n=1500, features=6, seed=0, missing=0.05):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features))
    x[rng.random(x.shape) < missing] = np.nan
    clean = np.nan_to_num(x)
    y = 2 * clean[:, 0] + np.sin(2 * clean[:, 1]) + 0.5 * rng.standard_t(3, size=n) + 3
    return x, y


# ------------------------------------------------------------------------------------------------ hand cases
def test_a_split_by_hand():
    """One input, codes 0 0 1 1, gradients -1 -1 +1 +1: the split after bin 0 has gain 2^2/2 + 2^2/2 - 0 = 4, and the
    leaves are -G / N times the rate: +0.1 and -0.1 at rate 0.1."""
    params = TreeParams(objective="l2", max_depth=1, max_bins=3, min_child_samples=1, learning_rate=0.1)
    codes = np.array([[0], [0], [1], [1]], dtype=np.uint16)
    g = np.array([-1.0, -1.0, 1.0, 1.0])
    hist = node_histograms(codes, g, np.zeros(4, dtype=np.int64), 1, params.max_bins)
    np.testing.assert_array_equal(hist[0, 0, :, 0], [-2, 2, 0, 0])
    np.testing.assert_array_equal(hist[0, 0, :, 1], [2, 2, 0, 0])
    split = best_splits(hist, params)
    assert (split.feature[0], split.threshold[0], split.gain[0]) == (0, 0, pytest.approx(4.0))
    grower = TreeGrower(params)
    grower.grow(hist)
    tree = grower.tree()
    assert grower.done and list(tree.feature) == [0, -1, -1]
    np.testing.assert_allclose(tree.value[1:], [0.1, -0.1])
    np.testing.assert_allclose(tree.predict_codes(codes, params.max_bins), [0.1, 0.1, -0.1, -0.1])


def test_a_split_needs_min_child_samples_rows_each_side_and_a_positive_gain():
    params = TreeParams(objective="l2", max_depth=2, max_bins=3, min_child_samples=3)
    codes = np.array([[0], [0], [1], [1]], dtype=np.uint16)
    hist = node_histograms(codes, np.array([-1.0, -1, 1, 1]), np.zeros(4, dtype=np.int64), 1, 3)
    assert best_splits(hist, params).feature[0] == -1  # 2 rows each side < 3
    flat = node_histograms(codes, np.zeros(4), np.zeros(4, dtype=np.int64), 1, 3)
    assert best_splits(flat, TreeParams(max_bins=3, min_child_samples=1)).feature[0] == -1  # no gain


def test_missing_values_go_where_their_gradients_belong():
    """Missing rows (code = max_bins) with the left rows' gradients are sent left."""
    params = TreeParams(objective="l2", max_depth=1, max_bins=4, min_child_samples=1)
    codes = np.array([[0], [0], [3], [3], [4], [4]], dtype=np.uint16)  # 4 = missing
    g = np.array([-1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    split = best_splits(node_histograms(codes, g, np.zeros(6, dtype=np.int64), 1, 4), params)
    assert split.missing_left[0] and split.threshold[0] == 0
    g[4:] = 1.0
    split = best_splits(node_histograms(codes, g, np.zeros(6, dtype=np.int64), 1, 4), params)
    assert not split.missing_left[0]


def test_gradients_of_the_three_objectives():
    y, p = np.array([1.0, 1.0, 1.0]), np.array([0.0, 1.0, 4.0])
    np.testing.assert_array_equal(gradients("l2", y, p), [-1, 0, 3])
    np.testing.assert_array_equal(gradients("l1", y, p), [-1, 0, 1])
    np.testing.assert_array_equal(gradients("huber", y, p, huber_delta=2.0), [-1, 0, 2])
    with pytest.raises(ValueError, match="objective"):
        gradients("l3", y, p)


def test_the_median_of_a_histogram_by_hand():
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    # 4 values, two in [1, 2), two in [2, 3): the median is the edge between them
    assert histogram_median(np.array([[0, 2, 2, 0]]), edges)[0] == pytest.approx(2.0)
    # 3 values in [1, 2): half of 3 is 1.5 of them, so the median sits half way in
    assert histogram_median(np.array([[0, 3, 0, 0]]), edges)[0] == pytest.approx(1.5)
    assert histogram_median(np.zeros((1, 4)), edges)[0] == 0.0  # an empty leaf


def test_residuals_beyond_the_grid_count_in_its_end_bins():
    edges = np.linspace(-1, 1, 5)
    counts = residual_histogram(np.array([-9.0, 0.1, 9.0, 0.9]), np.zeros(4, dtype=np.int64), 1, edges)
    np.testing.assert_array_equal(counts[0], [1, 0, 1, 2])


def test_a_discrete_input_gets_a_bin_per_value():
    x = np.tile(np.arange(7.0), 30)[:, None]  # a weekday
    edges = merge_sketches([quantile_sketch(x, 32)], max_bins=63)
    codes = bin_codes(x, edges)
    assert len(np.unique(codes)) == 7
    assert (np.diff(edges[0][np.isfinite(edges[0])]) > 0).all()


def test_merged_sketches_place_the_pooled_quantiles():
    rng = np.random.default_rng(1)
    parts = [rng.normal(loc, 1, size=(n, 1)) for loc, n in ((0, 400), (3, 1200), (-2, 200))]
    edges = merge_sketches([quantile_sketch(p, 256) for p in parts], max_bins=16)[0]
    exact = np.quantile(np.concatenate(parts)[:, 0], np.arange(1, 16) / 16)
    np.testing.assert_allclose(edges, exact, atol=0.05)


# ------------------------------------------------------------------------------ slow references = fast paths
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 60), st.integers(1, 4), st.integers(2, 9), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_histograms_equal_the_slow_reference(n, features, bins, nodes, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, bins + 1, size=(n, features)).astype(np.uint16)
    g = rng.normal(size=n)
    position = rng.integers(-1, nodes, size=n)
    np.testing.assert_allclose(node_histograms(codes, g, position, nodes, bins),
                               slow_histograms(codes, g, position, nodes, bins), atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 8), st.integers(1, 5), st.floats(0, 2), st.integers(0, 2**31 - 1))
def test_best_splits_equal_the_slow_reference(features, bins, min_child, lam, seed):
    rng = np.random.default_rng(seed)
    params = TreeParams(objective="l2", max_bins=bins, min_child_samples=min_child, l2_regularisation=lam)
    hist = np.zeros((3, features, bins + 1, 2))
    hist[..., 1] = rng.integers(0, 6, size=(3, features, bins + 1))
    hist[..., 1] = hist[:, :1, :, 1]  # every input sees the same rows
    hist[..., 0] = hist[..., 1] * rng.normal(size=(3, 1, bins + 1))
    hist[..., 0] = hist[:, :1, :, 0]
    for f in range(1, features):  # other inputs: the same rows in another order of bins
        perm = rng.permutation(bins)
        hist[:, f, :bins] = hist[:, 0, perm]
    fast = best_splits(hist, params)
    for k in range(3):
        f, b, left, gain = slow_best_split(hist[k], params)
        assert (fast.feature[k], fast.threshold[k]) == (f, b)
        if f >= 0:
            assert bool(fast.missing_left[k]) == left
            assert fast.gain[k] == pytest.approx(gain, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_prediction_equals_the_slow_reference(seed):
    x, y = regression_data(300, 4, seed)
    params = TreeParams(objective="l2", trees=3, max_depth=3, max_bins=8, min_child_samples=5)
    ensemble, _ = fit(pooled_source(x, y, params), params)
    codes = bin_codes(x, ensemble.edges)
    for tree in ensemble.trees:
        np.testing.assert_array_equal(tree.predict_codes(codes, ensemble.missing),
                                      slow_predict(tree, codes, ensemble.missing))


# --------------------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("objective", ["l2", "l1", "huber"])
def test_the_federated_twin_grows_the_pooled_trees(objective):
    """Parties holding the rows between them, their sums added: the pooled fit's trees, split for split and leaf
    for leaf (1e-9), with the same bins."""
    x, y = regression_data(1200, 5, seed=3)
    params = TreeParams(objective=objective, trees=25, learning_rate=0.1, max_depth=4, max_bins=31,
                        min_child_samples=10, huber_delta=0.5)
    pooled, pooled_log = fit(pooled_source(x, y, params), params)
    parties = [Rows(x[i], y[i]) for i in np.array_split(np.random.default_rng(0).permutation(len(y)), 7)]
    federated, fed_log = fit(PartiesSource(parties, params), params, edges=pooled.edges)
    assert federated.init == pytest.approx(pooled.init, abs=1e-12)
    for a, b in zip(federated.trees, pooled.trees, strict=True):
        for name in ("feature", "threshold", "missing_left", "left", "right"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        np.testing.assert_allclose(a.value, b.value, rtol=0, atol=1e-9)
    assert fed_log.exchanges == pooled_log.exchanges - 1  # the pooled fit also merged its own sketch


def test_row_order_does_not_change_the_pooled_fit():
    x, y = regression_data(800, 4, seed=5)
    params = TreeParams(objective="l1", trees=10, max_depth=3, max_bins=15)
    a, _ = fit(pooled_source(x, y, params), params)
    perm = np.random.default_rng(2).permutation(len(y))
    b, _ = fit(pooled_source(x[perm], y[perm], params), params, edges=a.edges)
    np.testing.assert_allclose(a.predict(x), b.predict(x), atol=1e-9)


def test_a_tree_takes_max_depth_exchanges_and_l1_one_more():
    x, y = regression_data(600, 3)
    for objective, per_tree in (("l2", 3), ("l1", 4)):
        params = TreeParams(objective=objective, trees=4, max_depth=3, max_bins=15, min_child_samples=5)
        _, log = fit(pooled_source(x, y, params), params)
        assert log.exchanges == 1 + 1 + 4 * per_tree + 1  # sketch, start, trees, the last apply


def test_the_validation_curve_has_one_entry_per_number_of_trees():
    x, y = regression_data(900, 4)
    params = TreeParams(objective="l2", trees=6, max_depth=3, max_bins=15)
    source = pooled_source(x[:700], y[:700], params, x[700:], y[700:])
    ensemble, log = fit(source, params)
    assert len(log.validation) == params.trees + 1
    for k in (0, 3, 6):
        assert log.validation[k] == pytest.approx(np.mean(np.abs(ensemble.predict(x[700:], trees=k) - y[700:])))
    assert log.validation[-1] < log.validation[0]


@pytest.mark.parametrize("objective,lgb_objective", [("l2", "regression"), ("l1", "regression_l1"),
                                                    ("huber", "huber")])
def test_the_pooled_fit_matches_lightgbm_on_the_same_bins(objective, lgb_objective):
    """LightGBM given the bin codes (each code its own bin), leaf-wise with 2^depth leaves and the same depth, rate,
    trees and leaf size: the same trees up to its float32 gradients, so the held-out MAE is within 1 %."""
    lgb = pytest.importorskip("lightgbm")
    x, y = regression_data(3000, 6, seed=11)
    xv, yv = regression_data(1000, 6, seed=12)
    params = TreeParams(objective=objective, trees=80, learning_rate=0.1, max_depth=4, max_bins=31,
                        min_child_samples=20, huber_delta=0.9)
    ensemble, _ = fit(pooled_source(x, y, params), params)

    def as_lightgbm(z):
        codes = bin_codes(z, ensemble.edges).astype(float)
        codes[codes == params.max_bins] = np.nan
        return codes

    model = lgb.LGBMRegressor(objective=lgb_objective, alpha=params.huber_delta, n_estimators=params.trees,
                              learning_rate=params.learning_rate, num_leaves=2 ** params.max_depth,
                              max_depth=params.max_depth, min_child_samples=params.min_child_samples,
                              min_child_weight=0, reg_lambda=0, max_bin=255, min_data_in_bin=1, verbose=-1,
                              deterministic=True, force_row_wise=True, n_jobs=1)
    model.fit(as_lightgbm(x), y)
    ours = np.mean(np.abs(ensemble.predict(xv) - yv))
    theirs = np.mean(np.abs(model.predict(as_lightgbm(xv)) - yv))
    assert abs(ours / theirs - 1) < 0.01
    first = model.booster_.trees_to_dataframe().query("tree_index == 0 and split_feature.notna()")
    ours_first = ensemble.trees[0]
    assert sorted(first["split_feature"].str.removeprefix("Column_").astype(int)) == \
        sorted(ours_first.feature[ours_first.feature >= 0])


# ------------------------------------------------------------------------------------ messages and bad input
def test_requests_and_ensembles_travel_as_arrays():
    x, y = regression_data(400, 3)
    params = TreeParams(objective="l1", trees=3, max_depth=2, max_bins=7)
    ensemble, _ = fit(pooled_source(x, y, params), params)
    again = Ensemble.from_arrays(ensemble.to_arrays())
    np.testing.assert_array_equal(again.predict(x), ensemble.predict(x))
    request = Request("histograms", init=1.5, first=2, apply=ensemble.trees[:2], tree=ensemble.trees[2],
                      nodes=np.array([1, 2]))
    back = Request.from_arrays(*request.to_arrays())
    assert (back.kind, back.init, back.first, len(back.apply)) == ("histograms", 1.5, 2, 2)
    np.testing.assert_array_equal(back.tree.threshold, ensemble.trees[2].threshold)
    with pytest.raises(ValueError, match="kind"):
        Request("gradients")
    broken = ensemble.trees[0].to_array()
    broken[:, 3] = 0  # every left child the root
    with pytest.raises(ValueError, match="children"):
        Tree.from_array(broken)
    with pytest.raises(ValueError, match="tree sizes"):
        Request.from_arrays({**request.to_arrays()[0], "apply-sizes": [1, 1]}, request.to_arrays()[1])


def test_a_party_that_missed_a_tree_is_out_of_step():
    x, y = regression_data(300, 3)
    params = TreeParams(objective="l2", trees=2, max_depth=2, max_bins=7)
    ensemble, _ = fit(pooled_source(x, y, params), params)
    rows = Rows(x, y)
    _, state = answer(Request("start", edges=ensemble.edges), rows, PartyState.empty(), params)
    with pytest.raises(OutOfStep, match="applied 0"):
        answer(Request("apply", init=ensemble.init, first=1, apply=ensemble.trees[1:]), rows, state, params)
    with pytest.raises(OutOfStep, match="no bins"):
        answer(Request("apply", init=1.0), rows, PartyState.empty(), params)
    # a request delivered twice applies its trees once
    _, once = answer(Request("apply", init=ensemble.init, apply=ensemble.trees), rows, state, params)
    _, twice = answer(Request("apply", init=ensemble.init, apply=ensemble.trees), rows, once, params)
    np.testing.assert_array_equal(once.pred, twice.pred)
    np.testing.assert_allclose(once.pred, ensemble.predict(x))


def test_a_source_whose_parties_disagree_on_the_trees_stops_the_fit():
    x, y = regression_data(300, 3)
    params = TreeParams(objective="l2", trees=3, max_depth=2, max_bins=7)

    class Forgetful(PartiesSource):
        def sums(self, request):
            out = super().sums(request)
            if request.kind == "histograms" and request.first == 1:
                out["counters"] = out["counters"] - np.array([1.0, 0.0, 0.0])  # one party has one tree fewer
            return out

    with pytest.raises(OutOfStep, match="applied"):
        fit(Forgetful([Rows(x[:150], y[:150]), Rows(x[150:], y[150:])], params), params)


@pytest.mark.parametrize("changes,field", [({"objective": "l3"}, "objective"), ({"trees": 0}, "trees"),
                                           ({"learning_rate": 0.0}, "learning_rate"), ({"max_depth": 0}, "max_depth"),
                                           ({"max_bins": 1}, "max_bins"), ({"min_child_samples": 0}, "min_child_samples"),
                                           ({"l2_regularisation": -1.0}, "l2_regularisation"),
                                           ({"huber_delta": 0.0}, "huber_delta"), ({"renewal_bins": 1}, "renewal_bins"),
                                           ({"renewal_range": 0.0}, "renewal_range"),
                                           ({"sketch_points": 1}, "sketch_points")])
def test_bad_tree_params_name_their_field(changes, field):
    with pytest.raises(ParamError) as error:
        TreeParams(**changes)
    assert error.value.field == field


def test_bad_rows_and_sketches_are_refused():
    with pytest.raises(ValueError, match="finite"):
        Rows(np.zeros((2, 1)), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="one target per row"):
        Rows(np.zeros((2, 1)), np.zeros(3))
    with pytest.raises(ValueError, match="same inputs"):
        merge_sketches([quantile_sketch(np.zeros((4, 2)), 4), quantile_sketch(np.zeros((4, 3)), 4)], 8)
    with pytest.raises(ValueError, match="no sketch"):
        merge_sketches([], 8)
    with pytest.raises(ValueError, match="inputs"):
        bin_codes(np.zeros((3, 2)), np.zeros((3, 4)))
    params = TreeParams(trees=1, max_depth=1, max_bins=3)
    with pytest.raises(ValueError, match="no training row"):
        fit(PartiesSource([Rows(np.zeros((0, 1)), np.zeros(0))], params), params, edges=np.zeros((1, 2)))


def test_route_stops_at_open_nodes():
    """A growing tree routes rows to the node not split yet (what a party needs to build a level's histograms)."""
    params = TreeParams(objective="l2", max_depth=3, max_bins=3, min_child_samples=1)
    codes = np.array([[0], [0], [1], [1], [2], [2]], dtype=np.uint16)
    g = np.array([-2.0, -2.0, 1.0, 1.0, 3.0, 3.0])
    grower = TreeGrower(params)
    grower.grow(node_histograms(codes, g, np.zeros(6, dtype=np.int64), 1, 3))
    node = route(grower.tree(), codes, 3)
    assert set(node) == {1, 2} and (node[:2] == 1).all()


def test_bins_from_a_fine_grid_by_hand_and_the_grid_fit_is_the_pooled_one():
    """tree-bins = "grid": each party's counts on a fixed grid, summed; the bins are the pool's quantiles there."""
    from bouquet.algorithms.trees import edges_from_grid, grid_counts

    grid = np.array([[0.0, 1.0, 2.0, 3.0, 4.0]])
    counts = grid_counts(np.array([[0.5], [1.5], [1.7], [3.9], [9.0], [np.nan]]), grid)
    np.testing.assert_array_equal(counts, [[1, 2, 0, 2]])  # 9.0 counts in the last bin, NaN nowhere
    # 5 values: the quantiles at 1/3 and 2/3 are reached in the bins [1, 2) and [3, 4): their right edges
    edges = edges_from_grid(counts, grid, max_bins=3)
    np.testing.assert_array_equal(edges, [[2.0, np.inf]])  # the grid's top edge (4.0) splits nothing off
    with pytest.raises(ValueError, match="counts of shape"):
        edges_from_grid(np.zeros((1, 3)), grid, 3)
    x, y = regression_data(900, 4, seed=7)
    x[:, 3] = np.round(x[:, 3])  # a discrete input
    fine = np.stack([np.linspace(-4, 4, 257)] * 4)
    params = TreeParams(objective="l1", trees=8, max_depth=3, max_bins=31, bins="grid")
    pooled, log = fit(pooled_source(x, y, params), params, grid=fine)
    parties = [Rows(x[i], y[i]) for i in np.array_split(np.arange(900), 6)]
    federated, _ = fit(PartiesSource(parties, params), params, grid=fine)
    np.testing.assert_array_equal(federated.edges, pooled.edges)  # summed counts: the same bins without a sketch
    np.testing.assert_allclose(federated.predict(x), pooled.predict(x), atol=1e-9)
    assert log.exchanges == 1 + 1 + 8 * 4 + 1
    with pytest.raises(ValueError, match="fine grid"):
        fit(pooled_source(x, y, params), params)
    with pytest.raises(ParamError, match="tree-bins"):
        TreeParams(secure_sums=True)
    with pytest.raises(ParamError, match="tree-bins must be"):
        TreeParams(bins="quantiles")


def test_sparse_replies_restore_exactly():
    from bouquet.algorithms.trees import to_dense, to_sparse

    rng = np.random.default_rng(3)
    hist = np.zeros((4, 3, 9, 2))
    hist[rng.random(hist.shape[:3]) < 0.1] = [1.5, 2.0]
    reply = {"histograms": hist, "counters": np.array([3.0, 0.0, 1.0])}
    sparse = to_sparse(reply)
    assert set(sparse) == {"counters", "histograms@index", "histograms@values", "histograms@shape"}
    assert sparse["histograms@values"].size == np.count_nonzero(hist) < hist.size / 4
    back = to_dense(sparse)
    np.testing.assert_array_equal(back["histograms"], hist)
    np.testing.assert_array_equal(back["counters"], reply["counters"])
    np.testing.assert_array_equal(to_dense(to_sparse({"residuals": np.zeros((2, 5))}))["residuals"], np.zeros((2, 5)))
