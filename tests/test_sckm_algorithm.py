"""SCKM math (eq. 8-10, Algorithms 1-2) and k-medoids: hand cases and properties."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from bouquet.algorithms.kmedoids import kmedoids
from bouquet.algorithms.sckm import (
    SketchSums,
    average_cardinality,
    budget_per_cluster,
    elbow_point,
    layer_coordinate_weights,
    sckm_cluster,
    sckm_dissimilarity,
    sckm_eta,
    sckm_matrix,
    sckm_pair,
    sckm_select,
    sketch_indices,
    sketch_size,
)

# 3 clients x 4 coordinates, worked by hand:
# SCKM(g1,g2) = (0 + 0 + (-1+1) + (2-4)) / 4 = -0.5
# SCKM(g1,g3) = ((4+2) + 0 + 0 + (2+4)) / 4 = 3
# SCKM(g2,g3) = (0 + (1-1) + 0 + (-1+1)) / 4 = 0
HAND = np.array([[1.0, 0.0, -1.0, 2.0], [0.0, 1.0, 1.0, -1.0], [2.0, -1.0, 0.0, 1.0]])


def test_sckm_hand_case():
    assert sckm_pair(HAND[0], HAND[1]) == pytest.approx(-0.5)
    assert sckm_pair(HAND[0], HAND[2]) == pytest.approx(3.0)
    assert sckm_pair(HAND[1], HAND[2]) == pytest.approx(0.0)
    m = sckm_matrix(HAND)
    np.testing.assert_allclose(m[[0, 0, 1], [1, 2, 2]], [-0.5, 3.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(np.diag(m), 2 * np.mean(HAND**3, axis=1))
    np.testing.assert_allclose(sckm_eta(HAND), [1.25, -0.25, 1.5])
    chosen = sckm_select(HAND, 2, np.random.default_rng(0))
    assert chosen.tolist() == [2, 0]


finite = st.floats(-10, 10, allow_nan=False, width=64)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 12), st.integers(1, 9)), elements=finite))
def test_eta_linear_form_equals_pairwise_mean(g):
    m = sckm_matrix(g)
    k = len(g)
    expected = (m.sum(axis=1) - np.diag(m)) / (k - 1)
    np.testing.assert_allclose(sckm_eta(g), expected, rtol=1e-9, atol=1e-7)
    np.testing.assert_allclose(m, m.T)
    # blocks of 2 rows on 1 or 3 threads: the same numbers to the bit (column sums added in block order)
    assert np.array_equal(sckm_eta(g, block_rows=2, workers=1), sckm_eta(g, block_rows=2, workers=3))


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 15), st.integers(1, 6)), elements=finite),
       st.integers(0, 2**31), st.data())
def test_select_returns_budget_distinct_clients_deterministically(g, seed, data):
    budget = data.draw(st.integers(1, len(g)))
    a = sckm_select(g, budget, np.random.default_rng(seed))
    b = sckm_select(g, budget, np.random.default_rng(seed))
    assert len(a) == budget == len(set(a.tolist()))
    assert a.tolist() == b.tolist()
    eta = sckm_eta(g)
    assert eta[a].min() >= np.delete(eta, a).max(initial=-np.inf) - 1e-12


def test_select_ties_go_to_the_oldest_participant_then_the_seed():
    g = np.ones((4, 3))  # every eta equal
    last = np.array([5, -1, 2, 7])  # client 1 never trained, then client 2 (round 2), ...
    assert sckm_select(g, 2, np.random.default_rng(0), last_round=last).tolist() == [1, 2]
    picks = {tuple(sckm_select(g, 2, np.random.default_rng(s)).tolist()) for s in range(20)}
    assert len(picks) > 1  # no age given: the seed decides


def test_layer_weights_make_per_layer_scores_combine_as_documented():
    rng = np.random.default_rng(1)
    big, small = rng.normal(size=(5, 6)) * 100.0, rng.normal(size=(5, 2)) * 0.01
    g = np.hstack([big, small])
    w_mean = layer_coordinate_weights(g, [6, 2], "mean")
    expected = (sckm_matrix(big) + sckm_matrix(small)) / 2
    np.testing.assert_allclose(sckm_matrix(g * w_mean), expected, rtol=1e-9)
    w_norm = layer_coordinate_weights(g, [6, 2], "normalized")
    rms_b, rms_s = np.sqrt(np.mean(big**2)), np.sqrt(np.mean(small**2))
    expected = (sckm_matrix(big / rms_b) + sckm_matrix(small / rms_s)) / 2
    np.testing.assert_allclose(sckm_matrix(g * w_norm), expected, rtol=1e-9)
    np.testing.assert_allclose(layer_coordinate_weights(g, [6, 2], "concat"), 1.0)
    with pytest.raises(ValueError, match="partition"):
        layer_coordinate_weights(g, [6, 3])
    with pytest.raises(ValueError, match="combine"):
        layer_coordinate_weights(g, [6, 2], "max")


def test_sketch_indices_are_shared_by_seed_and_sized_per_layer():
    sizes = [1000, 10, 3]
    a = sketch_indices(sizes, 0.005, [7, 3])
    b = sketch_indices(sizes, 0.005, [7, 3])
    assert [len(i) for i in a] == [5, 1, 1]
    for x, y, n in zip(a, b, sizes):
        np.testing.assert_array_equal(x, y)
        assert len(set(x.tolist())) == len(x) and x.max() < n
    c = sketch_indices(sizes, 0.005, [7, 4])
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))
    assert sketch_size(200, 0.005) == 1
    with pytest.raises(ValueError):
        sketch_size(10, 0.0)


def test_dissimilarity_is_non_negative_with_zero_diagonal_and_keeps_order():
    s = sckm_matrix(HAND)
    d = sckm_dissimilarity(s)
    assert (d >= 0).all() and np.all(np.diag(d) == 0)
    iu = np.triu_indices(3, 1)
    assert np.argsort(d[iu]).tolist() == np.argsort(s[iu]).tolist()
    assert d[iu].min() == 0 and d[iu].max() == pytest.approx(1)


def test_elbow_on_a_hand_curve():
    assert elbow_point([100, 20, 15, 12, 10], [1, 2, 3, 4, 5]) == 2
    assert elbow_point([10, 8, 6, 4], [2, 3, 4, 5]) == 2  # straight: no elbow, smallest C
    assert elbow_point([5, 5, 5], [1, 2, 3]) == 1
    assert elbow_point([9, 3], [1, 2]) == 1


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.data())
def test_budget_always_sums_to_b_and_keeps_a_client_per_cluster(sizes, data):
    budget = data.draw(st.integers(len(sizes), sum(sizes)))
    b = budget_per_cluster(sizes, budget)
    assert b.sum() == budget
    assert (b >= 1).all() and (b <= np.array(sizes)).all()


def test_budget_hand_case_and_bad_input():
    # K=10, B=4: exact shares 2.0, 1.2, 0.8 -> ceil 2, 2, 1 = 5; trim the largest excess (0.8, cluster 1)
    assert budget_per_cluster([5, 3, 2], 4).tolist() == [2, 1, 1]
    with pytest.raises(ValueError, match="clusters cannot each"):
        budget_per_cluster([1, 1, 1], 2)
    with pytest.raises(ValueError, match="non-empty"):
        budget_per_cluster([3, 0], 2)


def test_cluster_with_one_cluster_is_sckm_select():
    g = np.random.default_rng(3).normal(size=(30, 8))
    last = np.random.default_rng(4).integers(-1, 5, size=30)
    for budget in (1, 4, 9):
        one = sckm_cluster(g, budget, np.random.default_rng(9), n_clusters=1, last_round=last)
        direct = sckm_select(g, budget, np.random.default_rng(9), last_round=last)
        assert sorted(one.selected.tolist()) == sorted(direct.tolist())


def _blobs(rng, centers, per):
    return np.vstack([c + 0.05 * rng.normal(size=(per, len(c))) for c in centers])


def test_cluster_finds_redundant_groups_and_selects_exactly_b():
    rng = np.random.default_rng(0)
    # Three groups of near-identical gradients with zero skew (sum c^3 = 0), so SCKM within a group is ~0,
    # while any two groups' centers have SCKM (2 + 0 + 0 + 0) / 4 = 0.5: in SCKM's geometry the members of
    # a group are redundant and the groups complementary.  (Skewed groups would not cluster: SCKM(g, g) =
    # 2 mean(g^3) is then large, which is why SCKM is a dissimilarity only after a transform.)
    centers = [np.array([1.0, -1, 0, 0]), np.array([1.0, 0, -1, 0]), np.array([1.0, 0, 0, -1])]
    g = _blobs(rng, centers, 10)
    s = sckm_matrix(g)
    same = np.equal.outer(np.arange(30) // 10, np.arange(30) // 10)
    assert s[same & ~np.eye(30, dtype=bool)].max() < s[~same].min()
    res = sckm_cluster(g, 6, np.random.default_rng(1))
    assert len(res.selected) == 6 == len(set(res.selected.tolist()))
    assert res.budgets.sum() == 6
    assert res.n_clusters == 3 and res.budgets.tolist() == [2, 2, 2]
    # every cluster found holds one group only
    for c in range(res.n_clusters):
        groups = {int(i) // 10 for i in np.flatnonzero(res.labels == c)}
        assert len(groups) == 1


def test_cluster_sampling_keeps_large_pools_linear_and_exact_budget():
    g = np.random.default_rng(5).normal(size=(300, 20))
    res = sckm_cluster(g, 10, np.random.default_rng(2), sample_size=50)
    assert len(set(res.selected.tolist())) == 10 and len(res.labels) == 300
    assert set(res.medoids.tolist()) <= set(range(300))
    for c, m in enumerate(res.medoids):
        assert res.labels[m] == c


def test_average_cardinality_is_eq_10():
    assert average_cardinality([3, 4, 4, 6]) == 4
    with pytest.raises(ValueError):
        average_cardinality([])


def test_bad_sketches_are_refused():
    with pytest.raises(ValueError, match="non-finite"):
        sckm_eta(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="matrix"):
        sckm_matrix(np.ones(3))
    with pytest.raises(ValueError, match="two clients"):
        sckm_eta(np.ones((1, 3)))
    with pytest.raises(ValueError, match="budget"):
        sckm_select(HAND, 4, np.random.default_rng(0))


# ------------------------------------------------------------------ k-medoids
def test_kmedoids_recovers_separated_blobs():
    rng = np.random.default_rng(0)
    x = _blobs(rng, [np.array([0.0, 0]), np.array([10.0, 0]), np.array([0.0, 10])], 15)
    d = np.linalg.norm(x[:, None] - x[None], axis=2)
    res = kmedoids(d, 3)
    truth = np.repeat([0, 1, 2], 15)
    for c in range(3):
        assert len(set(truth[res.labels == c])) == 1
    assert sorted(np.bincount(res.labels).tolist()) == [15, 15, 15]


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 10), st.integers(1, 4), st.integers(0, 10_000))
def test_kmedoids_ends_where_no_single_swap_improves(n, k, seed):
    k = min(k, n)
    x = np.random.default_rng(seed).normal(size=(n, 2))
    d = np.linalg.norm(x[:, None] - x[None], axis=2)
    res = kmedoids(d, k)

    def cost(meds):
        return d[:, list(meds)].min(axis=1).sum()

    assert res.cost == pytest.approx(cost(res.medoids))
    for slot, point in itertools.product(range(k), range(n)):
        if point in res.medoids:
            continue
        trial = list(res.medoids)
        trial[slot] = point
        assert cost(trial) >= res.cost - 1e-9


def test_kmedoids_k1_is_the_most_central_point_and_bad_input():
    d = np.array([[0, 1, 4.0], [1, 0, 2], [4, 2, 0]])
    res = kmedoids(d, 1)
    assert res.medoids.tolist() == [1] and res.cost == pytest.approx(3.0)
    with pytest.raises(ValueError, match="symmetric"):
        kmedoids(np.array([[0, 1.0], [2, 0]]), 1)
    with pytest.raises(ValueError, match="n_clusters"):
        kmedoids(d, 4)
    with pytest.raises(ValueError, match="non-negative"):
        kmedoids(-d, 1)


def test_sketch_sums_hand_case_gives_eq_9():
    # eta from the hand case's pairs: client 1 (-0.5 + 3) / 2, client 2 (-0.5 + 0) / 2, client 3 (3 + 0) / 2
    sums = SketchSums(4, capacity=1)  # grows past its capacity
    for row in HAND:
        sums.add(row)
    np.testing.assert_allclose(sums.eta(), [1.25, -0.25, 1.5], atol=1e-12)
    np.testing.assert_allclose(sums.p, HAND.sum(axis=0))
    np.testing.assert_allclose(sums.q, (HAND**2).sum(axis=0))
    assert sckm_select(sums.sketches, 2, np.random.default_rng(0), eta=sums.eta()).tolist() == [2, 0]


@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 12), st.integers(1, 9)), elements=st.floats(-5, 5)),
       st.integers(1, 5), st.data())
def test_sketch_sums_equal_sckm_eta_however_the_sketches_arrive(g, chunk, data):
    sums = SketchSums(g.shape[1], dtype=np.float64)
    for start in range(0, len(g), chunk):  # one by one or in blocks, in any chunking
        sums.add(g[start:start + chunk] if chunk > 1 else g[start])
    np.testing.assert_allclose(sums.eta(block_rows=data.draw(st.integers(1, 4))), sckm_eta(g), rtol=1e-9,
                               atol=1e-9)
    weights = data.draw(arrays(np.float64, g.shape[1], elements=st.floats(0.1, 3)))
    np.testing.assert_allclose(sums.eta(weights), sckm_eta(g * weights), rtol=1e-9, atol=1e-9)
    assert np.array_equal(sums.eta(workers=1), sums.eta(workers=3))


def test_sketch_sums_layer_rms_gives_the_normalized_weights():
    g = np.random.default_rng(4).standard_normal((30, 9)) * np.repeat([1.0, 10.0, 0.1], 3)
    sums = SketchSums(9)
    sums.add(g)
    sizes = [2, 4, 3]
    expected = layer_coordinate_weights(g, sizes, "normalized")
    rebuilt = np.repeat(np.cbrt(9 / (3 * np.array(sizes, float))) / sums.layer_rms(sizes), sizes)
    np.testing.assert_allclose(rebuilt, expected, rtol=1e-6)  # the rows are kept in float32


def test_sketch_sums_refuse_bad_sketches_and_too_few_clients():
    sums = SketchSums(3)
    with pytest.raises(ValueError, match="3 coordinates"):
        sums.add(np.zeros(4))
    with pytest.raises(ValueError, match="non-finite"):
        sums.add(np.array([1.0, np.nan, 0.0]))
    assert sums.count == 0  # a refused sketch is not counted
    sums.add(np.ones(3))
    with pytest.raises(ValueError, match="at least two"):
        sums.eta()
    sums.add(np.zeros(3))
    with pytest.raises(ValueError, match="3 entries"):
        sums.eta(np.ones(2))
    with pytest.raises(ValueError, match="at least one coordinate"):
        SketchSums(0)
    with pytest.raises(ValueError, match="2 finite scores"):
        sckm_select(sums.sketches, 1, np.random.default_rng(0), eta=np.array([1.0, np.inf]))
