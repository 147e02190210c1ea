"""Fixed-K coalitions (FL + Coalition baseline): hand cases, K=1, geometry, adapter."""

import numpy as np
import pytest

from bouquet.algorithms.coalitions_fixed_k import (
    fixed_k_aggregate,
    fixed_k_coalitions,
    relabel_by_first_appearance,
)
from bouquet.strategies import FixedKFedAvg
from tests.flower_fakes import ListRecorder, arrays, reply
from tests.test_hk_strategy import aggregate, model


def test_two_obvious_groups_hand_case():
    w = np.array([[0.0, 0.0], [0.2, 0.0], [0.0, 0.2], [10.0, 10.0], [10.2, 10.0]])
    aggregate, labels = fixed_k_aggregate(w, k=2, geometry="euclidean", seed=0)
    np.testing.assert_array_equal(labels, [0, 0, 0, 1, 1])
    # barycenters (0.0667, 0.0667) and (10.1, 10); their uniform mean
    np.testing.assert_allclose(aggregate, [(0.2 / 3 + 10.1) / 2, (0.2 / 3 + 10.0) / 2])


def test_cosine_groups_by_direction_not_size():
    w = np.array([[1.0, 0.0], [100.0, 1.0], [0.0, 1.0], [1.0, 50.0]])
    np.testing.assert_array_equal(fixed_k_coalitions(w, 2, "cosine"), [0, 0, 1, 1])
    # Euclidean k-means splits by magnitude instead
    np.testing.assert_array_equal(fixed_k_coalitions(w, 2, "euclidean"), [0, 1, 0, 0])


@pytest.mark.parametrize("geometry", ["euclidean", "cosine"])
def test_k_one_is_the_uniform_mean(geometry):
    w = np.random.default_rng(0).normal(size=(7, 5))
    aggregate, labels = fixed_k_aggregate(w, 1, geometry)
    assert set(labels) == {0}
    np.testing.assert_allclose(aggregate, w.mean(axis=0))


def test_k_at_least_clients_gives_singletons():
    w = np.random.default_rng(1).normal(size=(3, 4))
    np.testing.assert_array_equal(fixed_k_coalitions(w, 5), [0, 1, 2])


def test_same_seed_same_partition():
    w = np.random.default_rng(2).normal(size=(20, 6))
    np.testing.assert_array_equal(fixed_k_coalitions(w, 4, seed=3), fixed_k_coalitions(w, 4, seed=3))


def test_relabel():
    np.testing.assert_array_equal(relabel_by_first_appearance(np.array([5, 5, 2, 9, 2])), [0, 0, 1, 2, 1])


@pytest.mark.parametrize("kwargs, message", [({"k": 0}, "positive integer"), ({"k": 1.5}, "positive integer"),
                                             ({"geometry": "manhattan"}, "geometry")])
def test_bad_parameters(kwargs, message):
    w = np.ones((3, 2))
    with pytest.raises(ValueError, match=message):
        fixed_k_coalitions(w, **{"k": 2, **kwargs})
    with pytest.raises(ValueError, match=message):
        FixedKFedAvg(**kwargs)


def test_cosine_rejects_zero_vectors():
    with pytest.raises(ValueError, match="zero weight vector"):
        fixed_k_coalitions(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]), 2, "cosine")


def test_strategy_hand_case_through_messages():
    rows = [[1.0, 1.0], [1.2, 1.0], [1.0, 1.2], [11.0, 11.0], [11.2, 11.0]]  # no all-zero model: those are excluded
    replies = [reply(i + 1, model([r[0]], [r[1]])) for i, r in enumerate(rows)]
    recorder = ListRecorder()
    strategy = FixedKFedAvg(k=2, geometry="euclidean", recorder=recorder)
    result, _ = aggregate(strategy, replies, model([0.0], [0.0]))
    np.testing.assert_allclose(result["w"].numpy(), [(3.2 / 3 + 11.1) / 2], rtol=1e-6)
    (_, _, logged), = recorder.rounds
    assert logged["coalitions"] == 2 and logged["coalition-sizes"] == [3, 2]
    assert [row["coalition"] for row in recorder.rows["coalitions"]] == [0, 0, 0, 1, 1]


def test_strategy_excludes_nan_reply():
    replies = [reply(1, arrays(1.0)), reply(2, arrays(3.0)), reply(3, arrays(np.nan))]
    strategy = FixedKFedAvg(k=1)
    result, _ = aggregate(strategy, replies, arrays(0.0))
    np.testing.assert_allclose(result["w"].numpy(), 2.0)
