"""Benchmarks with known groups: rotated / label-permuted image clients, household types."""

import numpy as np
import pytest

from bouquet.data.images import (
    VisionDataParams,
    client_test_rows,
    group_of,
    group_permutation,
    grouped,
    iid_partition,
)
from bouquet.data.synthetic import SyntheticParams, generate_household
from bouquet.data.water import WaterDataParams, load_pool


def test_rotation_turns_each_image_by_its_groups_quarter_turns():
    x = np.arange(2 * 1 * 3 * 3).reshape(2, 1, 3, 3)
    config = VisionDataParams(groups="rotate", num_groups=4)
    assert [group_of(k, config) for k in range(6)] == [0, 1, 2, 3, 0, 1]
    same, _ = grouped(x, np.array([0, 1]), 0, 10, config)
    np.testing.assert_array_equal(same, x)
    turned, labels = grouped(x, np.array([0, 1]), 1, 10, config)
    np.testing.assert_array_equal(turned[0, 0], [[2, 5, 8], [1, 4, 7], [0, 3, 6]])  # by hand: 90 degrees
    np.testing.assert_array_equal(labels, [0, 1])
    back, _ = grouped(grouped(x, labels, 2, 10, config)[0], labels, 2, 10, config)  # 180 + 180 = 360
    np.testing.assert_array_equal(back, x)
    assert group_of(3, VisionDataParams()) is None


def test_label_permutation_is_a_seeded_bijection_per_group_and_identity_for_group_zero():
    config = VisionDataParams(groups="permute", num_groups=3, seed=5)
    y = np.arange(10)
    np.testing.assert_array_equal(grouped(None, y, 0, 10, config)[1], y)
    p1, p2 = group_permutation(1, 10, 5), group_permutation(2, 10, 5)
    assert sorted(p1.tolist()) == list(range(10)) and not np.array_equal(p1, p2)
    np.testing.assert_array_equal(grouped(None, y, 1, 10, config)[1], p1)
    np.testing.assert_array_equal(group_permutation(1, 10, 5), p1)  # the same every time


def test_iid_partition_and_client_test_subsets():
    parts = iid_partition(10, 3, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [4, 3, 3]
    config = VisionDataParams(client_test_size=5, seed=1)
    rows = client_test_rows(100, 2, config)
    assert len(rows) == 5 and np.array_equal(rows, client_test_rows(100, 2, config))
    assert not np.array_equal(rows, client_test_rows(100, 3, config))
    with pytest.raises(ValueError, match="vision-num-groups"):
        VisionDataParams(groups="rotate", num_groups=0)


def test_vision_clients_of_a_rotated_benchmark_train_and_test_on_their_groups_images():
    from bouquet.tasks.params import VisionModelParams, VisionTrainParams
    from bouquet.tasks.vision import VisionTask

    plain = VisionDataParams(partitioner="iid", client_test_size=20)
    rotated = VisionDataParams(partitioner="iid", client_test_size=20, groups="rotate")
    a = VisionTask.for_node(plain, VisionModelParams(), VisionTrainParams(), 1, 8)
    b = VisionTask.for_node(rotated, VisionModelParams(), VisionTrainParams(), 1, 8)
    assert a.group == "" and b.group == "1"
    np.testing.assert_array_equal(np.rot90(a.x, 1, axes=(2, 3)), b.x)
    np.testing.assert_array_equal(np.rot90(a.images.x_test, 1, axes=(2, 3)), b.images.x_test)
    np.testing.assert_array_equal(a.y, b.y)
    assert len(b.images.y_test) == 20


def test_household_types_have_their_own_patterns_and_reach_the_pool_report():
    config = SyntheticParams(n_households=30, household_types="family,holiday,business", seed=2)
    homes = [generate_household(i, config) for i in range(30)]
    assert [h.archetype for h in homes[:4]] == ["family", "holiday", "business", "family"]
    days = (np.datetime64("2014-01-01") + np.arange(config.study_days)).view("int64")
    weekend = ((days + 3) % 7) >= 5
    daily = {kind: np.array([h.daily for h in homes if h.archetype == kind]) for kind in ("family", "holiday",
                                                                                           "business")}
    assert np.median(daily["holiday"]) < 5 < np.median(daily["family"])  # empty most of the year
    assert daily["business"][:, weekend].mean() < 0.1 * daily["business"][:, ~weekend].mean()  # closed weekends
    assert all(len(h.daily) == config.study_days for h in homes)  # a full history for every type
    pool = load_pool(WaterDataParams(synthetic=config, active_factor=0.0))
    assert len(pool) == 30 and sorted(set(pool.report["group"])) == ["business", "family", "holiday"]
    assert [pool.group_of(k) for k in range(3)] == ["family", "holiday", "business"]
    assert load_pool(WaterDataParams(synthetic=SyntheticParams(n_households=20), active_factor=0.0)).group_of(0) == ""
