"""HKFedAvg (coalition aggregation) with real Flower Messages: coalitions, screening, records, trajectories."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from bouquet.strategies import HKFedAvg, TrajectoryWriter
from bouquet.strategies.arrays import FlatLayout, all_finite, array_view, stack_records, to_numpy
from bouquet.strategies.rounds import TrainRound
from tests.flower_fakes import ListHook, ListRecorder, arrays, reply


def aggregate(strategy, replies, sent, server_round=1):
    """What the strategy makes of ``replies`` to a round in which every replying node was sent ``sent``."""
    nodes = tuple(r.metadata.src_node_id for r in replies)
    return strategy.aggregate_train_round(TrainRound(server_round, nodes, {n: sent for n in nodes}, ConfigRecord(), ()),
                                          replies)


def model(w, b, counter=None):
    content = {"w": Array(np.asarray(w, dtype=np.float32)), "b": Array(np.asarray(b, dtype=np.float32))}
    if counter is not None:
        content["steps"] = Array(np.asarray(counter, dtype=np.int64))
    return ArrayRecord(content)


def test_hand_case_through_messages():
    # flattened models are the rows of test_hk_algorithm's cosine hand case: w (1 value) + b (1 value)
    rows = [[1, 0], [1, 0.1], [0, 1], [0.1, 1], [1, -0.1]]
    replies = [reply(10 + i, model([r[0]], [r[1]]), info={"partition-id": i, "household": f"h{i}"},
                     server_round=3) for i, r in enumerate(rows)]
    recorder = ListRecorder()
    strategy = HKFedAvg(geometry="cosine", tau=0.5, recorder=recorder)
    result, _ = aggregate(strategy, replies, model([0.0], [0.0]), server_round=3)
    np.testing.assert_allclose(result["w"].numpy(), [0.525], rtol=1e-6)
    np.testing.assert_allclose(result["b"].numpy(), [0.5], rtol=1e-6)
    (round_, phase, logged), = recorder.rounds
    assert (round_, phase) == (3, "train")
    assert logged["coalitions"] == 2 and logged["coalition-sizes"] == [3, 2] and logged["singletons"] == 0
    assert logged["hk-steps"] == 2 and logged["hk-converged"] is True and logged["aggregation-seconds"] >= 0
    members = {(row["node_id"], row["household"]): row["coalition"] for row in recorder.rows["coalitions"]}
    assert members == {(10, "h0"): 0, (11, "h1"): 0, (12, "h2"): 1, (13, "h3"): 1, (14, "h4"): 0}


def test_nan_and_zero_replies_are_excluded_with_a_named_warning(caplog):
    replies = [reply(1, arrays(1.0)), reply(2, arrays(2.0)), reply(3, arrays(np.nan)), reply(4, arrays(0.0))]
    strategy = HKFedAvg(geometry="euclidean", tau=2.0)  # one coalition: the uniform mean of the kept ones
    with caplog.at_level("WARNING"):
        result, _ = aggregate(strategy, replies, arrays(0.5))
    np.testing.assert_allclose(result["w"].numpy(), 1.5)
    assert "node 3 excluded: non-finite" in caplog.text
    assert "node 4 excluded: all-zero weights" in caplog.text


def test_shape_mismatch_is_excluded(caplog):
    replies = [reply(1, arrays(1.0)), reply(2, arrays(3.0)), reply(3, arrays(5.0, shape=(3, 2)))]
    strategy = HKFedAvg(geometry="cosine", tau=-1.0)
    with caplog.at_level("WARNING"):
        result, _ = aggregate(strategy, replies, arrays(0.0))
    np.testing.assert_allclose(result["b"].numpy(), 2.0)
    assert "node 3 excluded" in caplog.text


def test_integer_arrays_are_carried_not_averaged():
    replies = [reply(1, model([1.0, 0.0], [0.0], counter=7)), reply(2, model([0.0, 1.0], [0.0], counter=9))]
    strategy = HKFedAvg(geometry="cosine", tau=0.5)
    result, _ = aggregate(strategy, replies, model([0.0, 0.0], [0.0], counter=0))
    assert list(result.keys()) == ["w", "b", "steps"]
    np.testing.assert_allclose(result["w"].numpy(), [0.5, 0.5])  # two singletons: uniform mean
    assert int(result["steps"].numpy()) == 7


def test_sample_weighted_barycenters():
    replies = [reply(1, model([1.0], [0.0]), examples=1), reply(2, model([3.0], [0.0]), examples=3)]
    strategy = HKFedAvg(geometry="cosine", tau=0.5, barycenter_weighting="samples")
    result, _ = aggregate(strategy, replies, model([0.0], [0.0]))
    np.testing.assert_allclose(result["w"].numpy(), [2.5])  # one coalition, (1*1 + 3*3) / 4


def test_trajectories_reach_the_hooks_and_the_writer_on_request(tmp_path):
    replies = [reply(i, arrays(float(i)), server_round=5) for i in (1, 2, 3)]
    observer = ListHook()
    strategy = HKFedAvg(record_trajectories=True)
    strategy.hooks = (observer, TrajectoryWriter(tmp_path / "trajectories"))
    aggregate(strategy, replies, arrays(0.0), server_round=5)
    (event,) = observer.events
    kept = event.artifacts["hk-trajectory"]
    assert kept["node_ids"] == [1, 2, 3] and kept["gram"].shape == (3, 3) and len(kept["history"]) >= 2
    with np.load(tmp_path / "trajectories" / "round-005.npz") as stored:
        assert stored["projection"].shape == (len(kept["history"]), 3, 2)
        assert stored["node_ids"].tolist() == [1, 2, 3] and len(stored["labels"]) == 3
    plain = ListHook()
    without = HKFedAvg()
    without.hooks = (plain,)
    aggregate(without, replies, arrays(0.0))
    assert "hk-trajectory" not in plain.events[0].artifacts


def test_invalid_parameters_fail_at_construction():
    with pytest.raises(ValueError, match="cosine threshold"):
        HKFedAvg(geometry="cosine", tau=2.0)


def test_flat_layout_roundtrip():
    record = model([[1.0, 2.0], [3.0, 4.0]], [5.0], counter=3)
    matrix, layout = stack_records([record, record])
    assert matrix.shape == (2, 5) and layout == FlatLayout.of(record)
    back = layout.unflatten(matrix[0], to_numpy(record))
    assert list(back) == list(record)
    for name in record:
        np.testing.assert_array_equal(back[name], record[name].numpy())
    with pytest.raises(ValueError, match="layout needs"):
        layout.unflatten(np.zeros(4), to_numpy(record))


@pytest.mark.parametrize("value", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),  # column-major bytes
    np.array(3.5),  # 0-d
    np.zeros((0, 3), dtype=np.float32),
    np.arange(5, dtype=">i4"),  # big-endian
    np.array([True, False]),
    np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2],  # a non-contiguous source
])
def test_array_view_gives_flowers_values_without_a_copy(value):
    array = Array(value)
    view, decoded = array_view(array), array.numpy()
    assert view.dtype == decoded.dtype and view.shape == decoded.shape
    np.testing.assert_array_equal(view, decoded)
    assert not view.flags.writeable  # a view of the message's bytes: never written through
    if view.size:
        assert np.shares_memory(view, np.frombuffer(array.data, dtype=np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        view[...] = 0


def test_array_view_reads_npy_2_headers_and_leaves_broken_ones_to_flower():
    import io
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.arange(6.0).reshape(2, 3), version=(2, 0))
    v2 = Array(dtype="float64", shape=(2, 3), stype="numpy.ndarray", data=buffer.getvalue())
    np.testing.assert_array_equal(array_view(v2), v2.numpy())
    broken = Array(dtype="float64", shape=(2,), stype="numpy.ndarray", data=b"\x93NUMPY\x01\x00\x10\x00{'descr': 'x")
    with pytest.raises(Exception) as flower_error:
        broken.numpy()
    with pytest.raises(type(flower_error.value)):
        array_view(broken)


def test_array_view_leaves_pickled_and_foreign_arrays_to_flower():
    import io
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    pickled = Array(dtype="object", shape=(1,), stype="numpy.ndarray", data=buffer.getvalue())
    with pytest.raises(ValueError, match="allow_pickle"):  # refused, as Array.numpy() refuses it
        array_view(pickled)
    foreign = Array(dtype="float32", shape=(2,), stype="torch.raw", data=b"\0" * 8)
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        array_view(foreign)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_all_finite_says_what_isfinite_says_for_any_values(dtype):
    rng = np.random.default_rng(5)
    big = np.finfo(dtype).max if np.issubdtype(dtype, np.floating) else 7  # squares overflow: the exact check
    cases = [np.zeros(0), np.zeros(3), rng.standard_normal(1000), np.array([big, -big, 1.0]),
             np.array([1.0, np.nan]), np.array([np.inf, 1.0]), np.array([-np.inf, np.inf]), np.array([1e-30, 0.0]),
             rng.standard_normal((7, 5)).T]  # not contiguous
    for values in cases:
        values = np.asarray(values).astype(dtype) if np.issubdtype(dtype, np.floating) or np.isfinite(values).all() \
            else np.asarray(values)
        assert all_finite(values) == bool(np.isfinite(values).all()), values


def test_has_direction_equals_a_positive_sum_of_squares_row_by_row():
    from bouquet.strategies.aggregation import _has_direction, _row_squares
    rng = np.random.default_rng(6)
    for dtype in (np.float32, np.float64):
        matrix = rng.standard_normal((9, 3000)).astype(dtype)
        matrix[1] = 0.0  # all zero
        matrix[2, :] = 0.0
        matrix[2, 2500] = 0.5  # zero prefix, a value later
        matrix[3] = 1e-30  # squares underflow in float32: no direction there, as the sum of squares says
        matrix[4, :1024] = 1e-20  # small prefix, a normal value later
        matrix[4, 2999] = -2.0
        matrix[5] = np.where(np.arange(3000) % 2, 1e-18, 0.0)  # at the bound
        assert np.array_equal(_has_direction(matrix), _row_squares(matrix) > 0), dtype
        assert np.array_equal(_has_direction(matrix, prefix=5), _row_squares(matrix) > 0), dtype
    assert _has_direction(np.zeros((2, 10))).tolist() == [False, False]


def test_updates_opinion_space_groups_by_direction_of_change():
    # all weights nearly collinear (cos ~ 1: one coalition on weights); updates point two ways
    sent = model([10.0], [10.0])
    rows = [[11.0, 10.0], [11.1, 10.0], [10.0, 11.0], [10.0, 11.1], [10.0, 10.0]]  # last: no update at all
    replies = [reply(i + 1, model([r[0]], [r[1]])) for i, r in enumerate(rows)]
    recorder = ListRecorder()
    aggregate(HKFedAvg(geometry="cosine", tau=0.9, recorder=recorder), replies, sent)
    assert recorder.rounds[-1][2]["coalitions"] == 1
    result, _ = aggregate(HKFedAvg(geometry="cosine", tau=0.9, opinion_space="updates", recorder=recorder), replies,
                          sent)
    logged = recorder.rounds[-1][2]
    assert logged["coalitions"] == 3 and logged["coalition-sizes"] == [2, 2, 1]
    # barycenters (11.05, 10), (10, 11.05), (10, 10) of the weights, averaged
    np.testing.assert_allclose(result["w"].numpy(), [(11.05 + 10 + 10) / 3], rtol=1e-6)
    with pytest.raises(ValueError, match="opinion_space"):
        HKFedAvg(opinion_space="gradients")


@pytest.mark.parametrize("threshold", [0, 2 ** 62])  # several threads for any size / one thread
def test_stacking_writes_each_models_arrays_into_its_row_with_any_number_of_threads(monkeypatch, threshold):
    from bouquet.strategies import arrays

    monkeypatch.setattr(arrays, "_PARALLEL_STACK_BYTES", threshold)
    rng = np.random.default_rng(3)
    models = [{"b": rng.standard_normal(3), "w": rng.standard_normal((2, 4)).astype(np.float32)} for _ in range(11)]
    matrix, layout = arrays.stack_models(models)
    assert matrix.dtype == np.float32 and matrix.shape == (11, 11)
    expected = np.stack([np.concatenate([m["b"].astype(np.float32), m["w"].reshape(-1)]) for m in models])
    assert np.array_equal(matrix, expected)
    assert layout.unflatten(matrix[4], models[0])["w"].tolist() == models[4]["w"].tolist()
