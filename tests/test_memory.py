"""Coalition memory (bouquet.algorithms.memory): hand cases, a slow reference path, properties, bad input."""

import itertools

import numpy as np
import pytest

from bouquet.algorithms.memory import (
    MEMORY_FORMS,
    VALIDATED_FORM,
    MemoryParams,
    MemoryState,
    PairEvidence,
    carry_keys,
    evidence_opinions,
    linkage_at_otsu,
    memory_form,
    otsu_threshold,
    together_evidence,
)


def cosines(values: dict[tuple[int, int], float], nodes: list[int]) -> np.ndarray:
    matrix = np.eye(len(nodes))
    for (a, b), value in values.items():
        i, j = nodes.index(a), nodes.index(b)
        matrix[i, j] = matrix[j, i] = value
    return matrix


def test_a_pair_seen_once_holds_that_cosine_and_a_pair_seen_often_its_decayed_mean():
    once = PairEvidence().update([1, 2], cosines({(1, 2): 0.2}, [1, 2]), decay=0.5)
    assert once.nodes == (1, 2) and once.mean()[0, 1] == pytest.approx(0.2)  # seen once: the cosine, any decay
    often = PairEvidence()
    for value in (0.2, 0.5, 0.8):
        often = often.update([1, 2], cosines({(1, 2): value}, [1, 2]), decay=1.0)
    assert often.mean()[0, 1] == pytest.approx(0.5) and often.weight[0, 1] == 3  # decay 1: the plain mean
    decayed = PairEvidence()
    for value in (0.2, 0.5, 0.8):
        decayed = decayed.update([1, 2], cosines({(1, 2): value}, [1, 2]), decay=0.5)
    # s = (0.2 * 0.5 + 0.5) * 0.5 + 0.8 = 1.1, n = (0.5 + 1) * 0.5 + 1 = 1.75
    assert decayed.mean()[0, 1] == pytest.approx(1.1 / 1.75) and decayed.weight[0, 1] == pytest.approx(1.75)


def test_only_pairs_sampled_together_change_and_new_nodes_are_appended():
    evidence = PairEvidence().update([1, 2], cosines({(1, 2): 0.5}, [1, 2]), decay=1.0)
    evidence = evidence.update([3, 2], cosines({(3, 2): 0.3}, [3, 2]), decay=1.0)
    assert evidence.nodes == (1, 2, 3)
    mean = evidence.mean()
    assert mean[0, 1] == pytest.approx(0.5) and mean[1, 2] == pytest.approx(0.3)
    assert mean[0, 2] == 0 and evidence.weight[0, 2] == 0  # 1 and 3 never took part together
    assert np.diag(mean).tolist() == [1.0, 1.0, 1.0] and evidence.weight[1, 1] == 2
    assert np.array_equal(mean, mean.T)


def test_update_equals_a_slow_pair_by_pair_reference_over_random_rounds():
    rng = np.random.default_rng(3)
    fast = PairEvidence()
    slow_total: dict[tuple[int, int], float] = {}
    slow_weight: dict[tuple[int, int], float] = {}
    decay = 0.7
    for _ in range(12):
        nodes = [int(n) for n in rng.choice(15, size=rng.integers(2, 9), replace=False)]
        vectors = rng.standard_normal((len(nodes), 6))
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        round_cosines = unit @ unit.T
        fast = fast.update(nodes, round_cosines, decay)
        for (i, a), (j, b) in itertools.product(enumerate(nodes), repeat=2):
            slow_total[a, b] = decay * slow_total.get((a, b), 0.0) + round_cosines[i, j]
            slow_weight[a, b] = decay * slow_weight.get((a, b), 0.0) + 1.0
    for (i, a), (j, b) in itertools.product(enumerate(fast.nodes), repeat=2):
        assert fast.total[i, j] == pytest.approx(slow_total.get((a, b), 0.0), abs=1e-12)
        assert fast.weight[i, j] == pytest.approx(slow_weight.get((a, b), 0.0), abs=1e-12)


def test_evidence_opinions_reproduce_a_positive_semidefinite_evidence_and_project_the_rest():
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((6, 3))
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    evidence = unit @ unit.T
    opinions = evidence_opinions(evidence)
    np.testing.assert_allclose(opinions @ opinions.T, evidence, atol=1e-12)
    indefinite = np.array([[1.0, 0.9, -0.9], [0.9, 1.0, 0.9], [-0.9, 0.9, 1.0]])
    projected = evidence_opinions(indefinite) @ evidence_opinions(indefinite).T
    assert np.linalg.eigvalsh(projected).min() > -1e-12


def test_otsu_splits_two_clear_groups_between_them_and_equals_a_brute_force_search():
    assert otsu_threshold(np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])) == pytest.approx(0.5)
    assert otsu_threshold(np.array([0.9, 0.1, 0.8, 0.2])) == pytest.approx(0.5)
    rng = np.random.default_rng(5)
    for _ in range(20):
        values = np.concatenate([rng.normal(0.05, 0.1, rng.integers(5, 60)), rng.normal(0.4, 0.1, rng.integers(2, 20))])
        ordered = np.sort(values)
        best, best_cut = -1.0, None
        for k in range(1, len(ordered)):
            low, high = ordered[:k], ordered[k:]
            score = len(low) * len(high) * (high.mean() - low.mean()) ** 2
            if score > best:
                best, best_cut = score, (ordered[k - 1] + ordered[k]) / 2
        assert otsu_threshold(values) == pytest.approx(best_cut)
    with pytest.raises(ValueError, match="two distinct"):
        otsu_threshold(np.array([0.3, 0.3]))
    with pytest.raises(ValueError, match="two distinct"):
        otsu_threshold(np.array([0.3, np.nan]))


def test_carry_keys_keeps_names_through_sticky_rounds_splits_and_merges():
    names, next_id = carry_keys(np.array([0, 0, 1, 1]), [1, 2, 3, 4], {1: "c0", 2: "c0", 3: "c1"}, 2)
    assert names == {0: "c0", 1: "c1"} and next_id == 2  # the same coalitions keep their names
    names, next_id = carry_keys(np.array([1, 1, 1, 0]), [1, 2, 3, 4], {n: "c0" for n in (1, 2, 3, 4)}, 5)
    assert names == {1: "c0", 0: "c5"} and next_id == 6  # a split: the larger part keeps the name
    names, _ = carry_keys(np.array([0, 0, 0]), [1, 2, 3], {1: "c3", 2: "c1", 3: "c1"}, 4)
    assert names == {0: "c1"}  # a merge: the name most members held
    names, next_id = carry_keys(np.array([0, 1]), [7, 8], {}, 0)
    assert names == {0: "c0", 1: "c1"} and next_id == 2  # nobody held a name: new ones, largest first
    with pytest.raises(ValueError, match="one label per node"):
        carry_keys(np.array([0]), [1, 2], {}, 0)


@pytest.mark.parametrize("decay", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_a_decay_outside_0_1_is_an_error_naming_the_key(decay):
    with pytest.raises(ValueError, match="coalition-memory-decay must be in"):
        MemoryParams(active=True, decay=decay)


def test_bad_memory_input_is_named():
    with pytest.raises(ValueError, match="coalition-memory-tau"):
        MemoryParams(active=True, tau="median")
    with pytest.raises(ValueError, match="coalition-memory-formation"):
        MemoryParams(active=True, formation="kmeans")
    with pytest.raises(ValueError, match="not a coalition memory state"):
        MemoryState.from_json({"nodes": [1, 2], "total": [[1.0]]})
    with pytest.raises(ValueError, match="2 x 2"):
        PairEvidence().update([1, 2], np.eye(3), 1.0)
    with pytest.raises(ValueError, match="distinct"):
        PairEvidence().update([1, 1], np.eye(2), 1.0)
    with pytest.raises(ValueError, match="finite"):
        PairEvidence().update([1, 2], np.array([[1.0, np.nan], [np.nan, 1.0]]), 1.0)
    with pytest.raises(ValueError, match="appears twice"):
        PairEvidence((1, 1), np.zeros((2, 2)), np.zeros((2, 2)))


def test_average_linkage_merges_while_the_mean_pair_similarity_exceeds_tau_and_equals_a_slow_reference():
    from bouquet.algorithms.memory import average_linkage

    # two tight pairs {0, 1} and {2, 3}; their four cross pairs average (0.5 + 0.1 + 0.1 + 0.1) / 4 = 0.2
    similarity = np.array([[1.0, 0.9, 0.5, 0.1], [0.9, 1.0, 0.1, 0.1], [0.5, 0.1, 1.0, 0.8], [0.1, 0.1, 0.8, 1.0]])
    assert average_linkage(similarity, 0.85).tolist() == [0, 0, 1, 2]
    assert average_linkage(similarity, 0.3).tolist() == [0, 0, 1, 1]  # 0.5 alone would have chained them
    assert average_linkage(similarity, 0.15).tolist() == [0, 0, 0, 0]
    assert average_linkage(np.ones((1, 1)), 0.5).tolist() == [0]

    def slow(matrix, tau):  # merge the pair of clusters with the highest mean similarity while it exceeds tau
        clusters = [[i] for i in range(len(matrix))]
        while len(clusters) > 1:
            best, pair = -np.inf, None
            for a in range(len(clusters)):
                for b in range(a + 1, len(clusters)):
                    mean = matrix[np.ix_(clusters[a], clusters[b])].mean()
                    if mean > best:
                        best, pair = mean, (a, b)
            if best <= tau:
                break
            a, b = pair
            clusters[a] += clusters.pop(b)
        labels = np.empty(len(matrix), dtype=int)
        for members in sorted(clusters, key=min):
            labels[members] = sorted(clusters, key=min).index(members)
        return labels

    rng = np.random.default_rng(5)
    for _ in range(20):
        points = rng.standard_normal((9, 4)) + 2 * rng.integers(0, 3, size=(9, 1))
        unit = points / np.linalg.norm(points, axis=1, keepdims=True)
        cosines = unit @ unit.T
        tau = float(rng.uniform(0.2, 0.9))
        assert average_linkage(cosines, tau).tolist() == slow(cosines, tau).tolist()
    with pytest.raises(ValueError, match="finite square"):
        average_linkage(np.ones((2, 3)), 0.5)


def test_memory_state_survives_json_to_the_bit():
    import json

    rng = np.random.default_rng(2)
    evidence = PairEvidence()
    for _ in range(4):
        nodes = sorted(rng.choice(40, size=6, replace=False).tolist())
        unit = rng.standard_normal((6, 5))
        unit /= np.linalg.norm(unit, axis=1, keepdims=True)
        evidence = evidence.update(nodes, unit @ unit.T, 0.7)
    state = MemoryState(evidence, {node: f"c{node % 3}" for node in evidence.nodes}, 7)
    back = MemoryState.from_json(json.loads(json.dumps(state.to_json())))
    assert back.evidence.nodes == evidence.nodes and back.names == state.names and back.next_id == 7
    assert np.array_equal(back.evidence.total, evidence.total) and np.array_equal(back.evidence.weight, evidence.weight)


def test_together_evidence_counts_a_pair_only_when_one_of_the_two_was_in_a_coalition():
    # coalitions {0, 1}, {2}, {3}: 0-1 together; 0-2, 0-3, 1-2, 1-3 apart (0 or 1 joined); 2-3 both alone
    values, observed = together_evidence(np.array([5, 5, 7, 8]))
    assert values.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert observed.tolist() == [[True, True, True, True], [True, True, True, True],
                                 [True, True, True, False], [True, True, False, True]]
    alone_values, alone = together_evidence(np.arange(3))  # everybody alone: only the diagonal
    assert np.array_equal(alone, np.eye(3, dtype=bool)) and np.array_equal(alone_values, np.eye(3))
    with pytest.raises(ValueError, match="one coalition id per client"):
        together_evidence(np.zeros((2, 2)))


def test_a_masked_update_leaves_unobserved_pairs_undecayed_and_equals_a_pair_by_pair_reference():
    evidence = PairEvidence().update([1, 2, 3], np.ones((3, 3)), decay=0.5)  # all together once
    values, observed = together_evidence(np.array([0, 1, 2]))  # all alone: nothing changes but the diagonal
    held = evidence.update([1, 2, 3], values, 0.5, observed)
    assert np.array_equal(held.total - np.diag(np.diag(held.total)), evidence.total - np.diag(np.diag(evidence.total)))
    assert held.mean().tolist() == np.ones((3, 3)).tolist()
    # 1 joins 3 (2 alone): 1-3 together, 1-2 and 2-3 apart; with decay 0.5, n = 0.5 + 1 = 1.5
    values, observed = together_evidence(np.array([0, 1, 0]))
    moved = held.update([1, 2, 3], values, 0.5, observed)
    assert moved.mean()[0, 2] == 1.0 and moved.mean()[0, 1] == pytest.approx(0.5 / 1.5)
    rng = np.random.default_rng(5)
    fast, slow = PairEvidence(), {}
    for _ in range(10):
        nodes = [int(n) for n in rng.choice(8, size=rng.integers(2, 7), replace=False)]
        values, observed = together_evidence(rng.integers(0, 3, size=len(nodes)))
        fast = fast.update(nodes, values, 0.7, observed)
        for (i, a), (j, b) in itertools.product(enumerate(nodes), repeat=2):
            if observed[i, j]:
                s, n = slow.get((a, b), (0.0, 0.0))
                slow[(a, b)] = (0.7 * s + values[i, j], 0.7 * n + 1.0)
    for (a, b), (s, n) in slow.items():
        i, j = fast.nodes.index(a), fast.nodes.index(b)
        assert fast.total[i, j] == pytest.approx(s) and fast.weight[i, j] == pytest.approx(n)
    assert np.count_nonzero(fast.weight) == len(slow)
    with pytest.raises(ValueError, match="symmetric"):
        fast.update([1, 2], np.eye(2), 1.0, np.array([[True, True], [False, True]]))


def test_together_evidence_needs_linkage_and_majority_needs_together():
    MemoryParams(active=True, evidence="together", formation="linkage", tau="majority")
    with pytest.raises(ValueError, match="coalition-memory-evidence 'together' needs coalition-memory-formation"):
        MemoryParams(active=True, evidence="together")
    with pytest.raises(ValueError, match="'majority' is a share of rounds together"):
        MemoryParams(active=True, tau="majority", formation="linkage")
    with pytest.raises(ValueError, match="coalition-memory-evidence must be one of"):
        MemoryParams(active=True, evidence="distance", formation="linkage")


def test_a_memory_that_a_rule_cannot_run_is_named_once_for_config_and_aggregator():
    # a rule without a threshold (fixed-K) cannot lend linkage its tau, nor run at Otsu's threshold itself
    linkage_given = MemoryParams(active=True, formation="linkage")
    assert "'given' takes the rule's tau, and fixed-K has none" in linkage_given.rule_conflict(
        "fixed-K", has_tau=False, sets_tau=False)
    rule_otsu = MemoryParams(active=True, tau="otsu")
    assert "'otsu' sets a confidence bound" in rule_otsu.rule_conflict("fixed-K", has_tau=False, sets_tau=False)
    # HK has both; linkage at Otsu needs neither; memory off needs nothing
    for params in (linkage_given, rule_otsu):
        assert params.rule_conflict("HK", has_tau=True, sets_tau=True) is None
    assert MemoryParams(active=True, formation="linkage", tau="otsu").rule_conflict(
        "fixed-K", has_tau=False, sets_tau=False) is None
    assert MemoryParams(formation="linkage").rule_conflict("fixed-K", has_tau=False, sets_tau=False) is None


def test_stacked_evidence_needs_linkage_and_the_majority():
    MemoryParams(active=True, evidence="stacked", formation="linkage", tau="majority")
    with pytest.raises(ValueError, match="coalition-memory-evidence 'stacked' needs coalition-memory-formation"):
        MemoryParams(active=True, evidence="stacked", tau="majority")
    with pytest.raises(ValueError, match="'stacked' joins its second level at the majority"):
        MemoryParams(active=True, evidence="stacked", formation="linkage", tau="otsu")


def test_linkage_at_otsu_splits_two_clear_pairs_and_falls_back_while_the_evidence_has_one_value():
    # by hand: 1-2 and 3-4 at 0.9, across at 0.1; Otsu over the six pairs falls at 0.5
    c = np.array([[1.0, 0.9, 0.1, 0.1], [0.9, 1.0, 0.1, 0.1], [0.1, 0.1, 1.0, 0.9], [0.1, 0.1, 0.9, 1.0]])
    labels, tau = linkage_at_otsu(PairEvidence().update([1, 2, 3, 4], c, 1.0), fallback=0.99)
    assert labels.tolist() == [0, 0, 1, 1] and tau == pytest.approx(0.5)
    same = PairEvidence().update([1, 2], np.array([[1.0, 0.3], [0.3, 1.0]]), 1.0)  # one pair: one value
    labels, tau = linkage_at_otsu(same, fallback=0.2)
    assert tau == 0.2 and labels.tolist() == [0, 0]


def test_memory_forms_by_name_true_is_the_validated_form_and_anything_else_is_named():
    assert memory_form(False) == MemoryParams() and not memory_form(False).active
    assert memory_form(True) == MEMORY_FORMS[VALIDATED_FORM] and memory_form(True).active
    assert memory_form("together").evidence == "together" and memory_form("linkage-otsu").tau == "otsu"
    custom = MemoryParams(active=True, decay=0.7)
    assert memory_form(custom) is custom
    for bad in ("stacked-features", 1, None):
        with pytest.raises(ValueError, match=r"HKFedAvg\(memory=\.\.\.\) must be False, True"):
            memory_form(bad, "HKFedAvg(memory=...)")


def test_a_stacked_memory_state_survives_json_and_the_other_forms_states_are_as_before():
    import json

    rng = np.random.default_rng(3)
    unit = rng.standard_normal((4, 3))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    first = PairEvidence().update([5, 6, 7, 8], unit @ unit.T, 1.0)
    second = PairEvidence().update([5, 6, 7, 8], np.eye(4), 1.0)
    state = MemoryState(second, {5: "c0"}, 1, first)
    back = MemoryState.from_json(json.loads(json.dumps(state.to_json())))
    assert back.first.nodes == first.nodes and np.array_equal(back.first.total, first.total)
    assert np.array_equal(back.evidence.weight, second.weight)
    assert "first" not in MemoryState(second, {5: "c0"}, 1).to_json()  # other forms: the old layout
    assert MemoryState.from_json(MemoryState(second, {}, 0).to_json()).first.nodes == ()
