"""Benchmarks with known groups: rotated / label-permuted image clients, household types."""

import numpy as np
import pytest

from bouquet.data.images import (
    VisionDataParams,
    client_test_rows,
    group_assignment,
    group_of,
    group_permutation,
    grouped,
    iid_partition,
    validation_rows,
)
from bouquet.data.synthetic import SyntheticParams, generate_household
from bouquet.data.water import WaterDataParams, load_pool


def test_rotation_turns_each_image_by_its_groups_quarter_turns():
    x = np.arange(2 * 1 * 3 * 3).reshape(2, 1, 3, 3)
    config = VisionDataParams(groups="rotate", num_groups=4)
    same, _ = grouped(x, np.array([0, 1]), 0, 10, config)
    np.testing.assert_array_equal(same, x)
    turned, labels = grouped(x, np.array([0, 1]), 1, 10, config)
    np.testing.assert_array_equal(turned[0, 0], [[2, 5, 8], [1, 4, 7], [0, 3, 6]])  # by hand: 90 degrees
    np.testing.assert_array_equal(labels, [0, 1])
    back, _ = grouped(grouped(x, labels, 2, 10, config)[0], labels, 2, 10, config)  # 180 + 180 = 360
    np.testing.assert_array_equal(back, x)
    assert group_of(3, VisionDataParams(), 6) is None


def test_eight_rotation_groups_are_the_eight_symmetries_of_the_square():
    x = np.arange(9).reshape(1, 1, 3, 3)
    config = VisionDataParams(groups="rotate", num_groups=8)
    forms = [grouped(x, np.zeros(1), g, 10, config)[0] for g in range(8)]
    assert len({f.tobytes() for f in forms}) == 8  # all distinct
    np.testing.assert_array_equal(forms[4][0, 0], [[2, 1, 0], [5, 4, 3], [8, 7, 6]])  # by hand: the mirror
    np.testing.assert_array_equal(forms[5][0, 0], np.rot90(x[0, 0], 1)[:, ::-1])
    np.testing.assert_array_equal(forms[:4][1], grouped(x, np.zeros(1), 1, 10,
                                                        VisionDataParams(groups="rotate", num_groups=4))[0])
    with pytest.raises(ValueError, match="vision-num-groups must be <= 8"):
        VisionDataParams(groups="rotate", num_groups=9)
    VisionDataParams(groups="permute", num_groups=9)  # labels have 10! permutations


def test_the_data_seed_redraws_which_clients_share_a_group_in_equal_numbers():
    for seed in range(6):
        groups = group_assignment(20, VisionDataParams(groups="permute", num_groups=8, seed=seed))
        assert sorted(np.bincount(groups).tolist()) == [2, 2, 2, 2, 3, 3, 3, 3]
    draws = {group_assignment(20, VisionDataParams(groups="rotate", seed=seed)).tobytes() for seed in range(5)}
    assert len(draws) == 5  # every data seed another assignment
    config = VisionDataParams(groups="rotate", seed=3)
    assert [group_of(k, config, 20) for k in range(20)] == group_assignment(20, config).tolist()
    with pytest.raises(ValueError, match=r"vision-num-groups = 8 needs at least as many clients \(num-supernodes\), "
                                         r"got 6"):
        group_assignment(6, VisionDataParams(groups="rotate", num_groups=8))


def test_validation_rows_are_seeded_at_least_one_and_never_the_whole_shard():
    config = VisionDataParams(validation_fraction=0.2, seed=4)
    rows = validation_rows(50, 3, config)
    assert len(rows) == 10 and np.array_equal(rows, validation_rows(50, 3, config))
    assert not np.array_equal(rows, validation_rows(50, 3, VisionDataParams(validation_fraction=0.2, seed=5)))
    assert len(validation_rows(3, 0, VisionDataParams(validation_fraction=0.1))) == 1  # at least one
    assert validation_rows(50, 3, VisionDataParams()).size == 0
    with pytest.raises(ValueError, match="validation-fraction = 0.5 leaves client 7 no training image"):
        validation_rows(1, 7, VisionDataParams(validation_fraction=0.5))
    with pytest.raises(ValueError, match=r"validation-fraction must be in \[0, 0.5\]"):
        VisionDataParams(validation_fraction=0.6)


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
    client = int(np.flatnonzero(group_assignment(8, rotated) == 1)[0])  # a client of the 90-degree group
    a = VisionTask.for_node(plain, VisionModelParams(), VisionTrainParams(), client, 8)
    b = VisionTask.for_node(rotated, VisionModelParams(), VisionTrainParams(), client, 8)
    assert a.group == "" and b.group == "1"
    np.testing.assert_array_equal(np.rot90(a.x, 1, axes=(2, 3)), b.x)
    np.testing.assert_array_equal(np.rot90(a.images.x_test, 1, axes=(2, 3)), b.images.x_test)
    np.testing.assert_array_equal(a.y, b.y)
    assert len(b.images.y_test) == 20


def test_a_client_with_validation_scores_it_and_with_the_test_locked_never_reads_a_test_image():
    from bouquet.tasks.params import VisionModelParams, VisionTrainParams
    from bouquet.tasks.vision import VisionTask

    whole = VisionTask.for_node(VisionDataParams(partitioner="iid", client_test_size=20), VisionModelParams(),
                                VisionTrainParams(), 2, 8)
    split = VisionDataParams(partitioner="iid", client_test_size=20, validation_fraction=0.25)
    held = VisionTask.for_node(split, VisionModelParams(), VisionTrainParams(), 2, 8)
    assert len(held.y) + len(held.images.y_val) == len(whole.y) and len(held.images.y_val) == round(0.25 * len(whole.y))
    rows = np.concatenate([held.images.x_val, held.x]).reshape(len(whole.y), -1)
    assert {r.tobytes() for r in rows} == {r.tobytes() for r in whole.x.reshape(len(whole.y), -1)}  # a split
    model = held.new_model()
    metrics = held.evaluate(model, np.random.default_rng(0))
    assert {"val-accuracy", "val-loss", "accuracy", "loss"} <= set(metrics) and metrics["num-examples"] == 20
    locked = VisionTask.for_node(VisionDataParams(partitioner="iid", client_test_size=20, validation_fraction=0.25,
                                                  score_test=False), VisionModelParams(), VisionTrainParams(), 2, 8)
    assert len(locked.images.y_test) == 0 and locked.images.test_locked
    scored = locked.evaluate(model, np.random.default_rng(0))
    assert "accuracy" not in scored and scored["val-accuracy"] == metrics["val-accuracy"]
    assert scored["num-examples"] == len(locked.images.y_val)
    with pytest.raises(ValueError, match="score-test = false locks the test images, and validation-fraction = 0"):
        VisionTask.for_node(VisionDataParams(partitioner="iid", score_test=False), VisionModelParams(),
                            VisionTrainParams(), 0, 8)


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
