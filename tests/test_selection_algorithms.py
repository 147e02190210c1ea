"""Selection baselines and the selector interface: hand cases, budgets, determinism, bad input."""

import numpy as np
import pytest

from bouquet.algorithms.selection import (
    SELECTORS,
    AFLSelector,
    Candidates,
    CosineSelector,
    DivFLSelector,
    FedCorSelector,
    KMeansSelector,
    PowerOfChoiceSelector,
    RandomSelector,
    SCKMClusterSelector,
    SCKMSelectSelector,
    make_selector,
)


def _candidates(k=12, d=6, seed=0):
    rng = np.random.default_rng(seed)
    return Candidates(ids=list(range(100, 100 + k)), sketches=rng.normal(size=(k, d)), layer_sizes=[d - 2, 2],
                      losses=rng.uniform(0.5, 2.0, size=k), num_examples=rng.integers(10, 100, size=k),
                      last_round=np.full(k, -1))


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_returns_budget_distinct_candidates_and_is_seeded(name):
    cands = _candidates()
    for budget in (1, 3, 7):
        a = make_selector(name).select(cands, budget, np.random.default_rng(4))
        b = make_selector(name).select(cands, budget, np.random.default_rng(4))
        assert len(a.indices) == budget == len(set(a.indices.tolist()))
        assert set(a.indices.tolist()) <= set(range(len(cands)))
        assert a.indices.tolist() == b.indices.tolist()


def test_random_is_uniform_over_many_draws():
    cands = _candidates(k=5)
    counts = np.zeros(5)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        counts[RandomSelector().select(cands, 2, rng).indices] += 1
    np.testing.assert_allclose(counts / 2000, 0.4, atol=0.05)


def test_power_of_choice_takes_the_highest_losses_of_its_pool():
    # d = K: the pool is everyone, so the pick is the top-B losses
    cands = Candidates(ids=[1, 2, 3, 4], losses=np.array([0.1, 3.0, 2.0, 0.5]), num_examples=np.array([5, 5, 5, 5]))
    assert PowerOfChoiceSelector(d=4).select(cands, 2, np.random.default_rng(0)).indices.tolist() == [1, 2]
    # a client with no data is never in the pool when others can fill it
    cands = Candidates(ids=[1, 2, 3], losses=np.array([9.0, 1.0, 2.0]), num_examples=np.array([0, 5, 5]))
    for s in range(10):
        assert 0 not in PowerOfChoiceSelector(d=2).select(cands, 1, np.random.default_rng(s)).indices


def test_afl_excludes_the_lowest_valuations_and_draws_the_rest_by_value():
    k = 8
    losses = np.arange(1, k + 1, dtype=float)  # valuation sqrt(n) * loss grows with the index
    cands = Candidates(ids=list(range(k)), losses=losses, num_examples=np.full(k, 100))
    # alpha1 = 0.75 removes the 6 lowest; alpha3 = 0: both picks are valued draws -> exactly {6, 7}
    afl = AFLSelector(alpha1=0.75, alpha2=0.01, alpha3=0.0)
    for s in range(5):
        assert afl.select(cands, 2, np.random.default_rng(s)).indices.tolist() == [6, 7]
    # alpha3 = 1: everything uniform, any client can come
    seen = set()
    for s in range(60):
        seen |= set(AFLSelector(alpha3=1.0).select(cands, 2, np.random.default_rng(s)).indices.tolist())
    assert seen == set(range(k))
    with pytest.raises(ValueError, match="alpha1"):
        AFLSelector(alpha1=1.0)


def test_kmeans_picks_one_client_per_obvious_group():
    rng = np.random.default_rng(0)
    g = np.vstack([c + 0.01 * rng.normal(size=(5, 2)) for c in ([0, 0], [10, 0], [0, 10])])
    picked = KMeansSelector().select(Candidates(ids=list(range(15)), sketches=g), 3, rng).indices
    assert sorted(int(i) // 5 for i in picked) == [0, 1, 2]


def test_cosine_diversity_picks_opposite_directions():
    g = np.array([[1.0, 0], [0.99, 0.1], [-1.0, 0.05], [0.0, 1.0]])
    picked = CosineSelector().select(Candidates(ids=[0, 1, 2, 3], sketches=g), 2, np.random.default_rng(0))
    assert 2 in picked.indices and (0 in picked.indices or 1 in picked.indices)


def test_divfl_greedy_facility_location_hand_case():
    # points on a line at 0, 1, 10, 11: one facility -> a middle point (cost 1 + 9 + 10 = 20 either way);
    # two facilities -> one in each pair (cost 2)
    g = np.array([[0.0], [1.0], [10.0], [11.0]])
    cands = Candidates(ids=[0, 1, 2, 3], sketches=g)
    two = DivFLSelector().select(cands, 2, np.random.default_rng(0))
    assert sorted(int(i) // 2 for i in two.indices) == [0, 1]
    assert two.report["divfl-cost"] == pytest.approx(2.0)


def test_fedcor_warms_up_then_favours_clients_correlated_with_high_losses():
    sel = FedCorSelector(warmup=2, shrinkage=0.0, noise=1e-6)
    ids = [0, 1, 2, 3]
    rng = np.random.default_rng(0)
    # clients 0 and 1 move together, 2 and 3 together, the two pairs independently; 2 and 3 carry the
    # high losses
    base = np.array([1.0, 1.0, 3.0, 3.0])
    pair_a, pair_b = [0.0, 0.3, -0.2, 0.4, 0.1, -0.3], [0.0, -0.1, -0.1, 0.5, -0.4, 0.2]
    state = sel.initial_state()
    for t in range(6):
        shift = np.array([pair_a[t], pair_a[t], pair_b[t], pair_b[t]])
        cands = Candidates(ids=ids, losses=base + shift)
        before = state
        state = sel.observe(state, cands)
        assert before.rounds == t  # observe returns a new state, the old one is unchanged
        choice = sel.select(cands, 1, rng, state)
        if t < 2:
            assert choice.report["fedcor-warmup"]
    assert not choice.report["fedcor-warmup"]
    assert int(choice.indices[0]) in (2, 3)
    # after choosing one of a correlated pair, the other adds little: the second pick crosses groups
    both = sel.select(cands, 2, rng, state).indices.tolist()
    assert sorted(i // 2 for i in both) == [0, 1]
    # what it learned survives a trip through a JSON-able dict (a checkpoint), huge node ids included
    import json
    big = sel.observe(state, Candidates(ids=[2**64 - 1, 0, 1, 2], losses=base))
    again = sel.state_from_dict(json.loads(json.dumps(sel.state_to_dict(big))))
    assert again == big
    np.testing.assert_array_equal(sel.select(cands, 2, np.random.default_rng(1), again).indices,
                                  sel.select(cands, 2, np.random.default_rng(1), big).indices)


@pytest.mark.parametrize("selector, field", [
    (lambda: FedCorSelector(warmup=-1), "warmup"), (lambda: SCKMClusterSelector(min_clusters=0), "min_clusters"),
    (lambda: SCKMSelectSelector(layer_combine="sum"), "layer_combine"), (lambda: AFLSelector(alpha1=1.0), "alpha1"),
    (lambda: PowerOfChoiceSelector(d=-2), "d"), (lambda: SCKMSelectSelector(sign=0), "sign"),
    (lambda: SCKMClusterSelector(sign=2), "sign")])
def test_bad_selector_parameters_name_their_field(selector, field):
    from bouquet.params import ParamError

    with pytest.raises(ParamError) as error:
        selector()
    assert error.value.field == field


def test_sckm_selectors_report_scores_and_clusters():
    cands = _candidates(k=20)
    out = SCKMSelectSelector().select(cands, 4, np.random.default_rng(0))
    assert len(out.report["eta-selected"]) == 4
    out = SCKMClusterSelector(min_clusters=2).select(cands, 4, np.random.default_rng(0))
    assert 2 <= out.report["clusters"] <= 4 and sum(out.report["cluster-budgets"]) == 4


def test_selectors_say_what_they_miss_and_refuse_bad_budgets():
    bare = Candidates(ids=[1, 2, 3])
    with pytest.raises(ValueError, match="sketches"):
        SCKMSelectSelector().select(bare, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="losses"):
        AFLSelector().select(bare, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="budget"):
        RandomSelector().select(bare, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="unknown selector"):
        make_selector("oort")
    with pytest.raises(ValueError, match="selector 'afl'"):
        make_selector("afl", beta=1)
    with pytest.raises(ValueError, match="rows"):
        Candidates(ids=[1, 2], losses=np.ones(3))


def test_candidates_subset_keeps_every_row_attribute_of_the_chosen_positions():
    from bouquet.algorithms.selection import Candidates

    cands = Candidates(ids=[7, 8, 9], sketches=np.arange(6.0).reshape(3, 2), layer_sizes=[2],
                       losses=np.array([0.1, 0.2, 0.3]), num_examples=np.array([5.0, 6.0, 7.0]),
                       last_round=np.array([-1, 2, 3]))
    sub = cands.subset([2, 0])
    assert sub.ids == [9, 7] and sub.layer_sizes == [2]
    np.testing.assert_array_equal(sub.sketches, [[4.0, 5.0], [0.0, 1.0]])
    np.testing.assert_array_equal(sub.losses, [0.3, 0.1])
    np.testing.assert_array_equal(sub.num_examples, [7.0, 5.0])
    np.testing.assert_array_equal(sub.last_round, [3, -1])
    assert len(cands.subset([])) == 0 and Candidates(ids=[1]).subset([0]).losses is None


def test_sckm_sign_minus_one_ranks_by_minus_eta_the_bottom_of_sign_one():
    # eta is odd in G (eq. 8 is cubic): scoring -G is ranking by -eta; without ties, top-B of -1 = bottom-B of 1
    cands = _candidates(k=10, d=8, seed=3)
    up, down = SCKMSelectSelector(), SCKMSelectSelector(sign=-1)
    _, eta_up = up.scores(cands)
    _, eta_down = down.scores(cands)
    np.testing.assert_allclose(eta_down, -eta_up, rtol=1e-12)
    picked = down.select(cands, 3, np.random.default_rng(0)).indices
    assert sorted(picked.tolist()) == sorted(np.argsort(eta_up)[:3].tolist())
    assert SCKMClusterSelector(sign=-1).select(cands, 3, np.random.default_rng(0)).indices.size == 3


def test_classifier_combine_scores_the_output_layer_alone():
    from bouquet.algorithms.sckm import layer_coordinate_weights, sckm_eta

    cands = _candidates(k=8, d=9, seed=4)
    cands = Candidates(ids=cands.ids, sketches=cands.sketches, layer_sizes=[4, 3, 2], losses=cands.losses,
                       num_examples=cands.num_examples, last_round=cands.last_round)
    weights = layer_coordinate_weights(cands.sketches, [4, 3, 2], "classifier")
    assert weights.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]  # the last two tensors: the output weight and bias
    _, eta = SCKMSelectSelector(layer_combine="classifier").scores(cands)
    last = cands.sketches[:, 4:]
    np.testing.assert_allclose(eta * 9 / 5, sckm_eta(last), rtol=1e-9)  # eq. 8's mean over the 5 coordinates
    assert layer_coordinate_weights(cands.sketches, [9], "classifier").tolist() == [1.0] * 9
