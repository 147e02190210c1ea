"""SeededFedAvg with real Flower Message objects: screening, sampling, records."""

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.app.error import Error

from bouquet.strategies.base import SeededFedAvg, screen_replies
from tests.flower_fakes import FakeGrid, ListRecorder, arrays, reply

pytestmark = pytest.mark.usefixtures("server_identity")


def test_screening_rejects_nan_shape_and_error_replies():
    replies = [reply(1, arrays(1.0)), reply(2, arrays(np.nan)), reply(3, arrays(1.0, shape=(3, 2))),
               reply(4, error=Error(code=1, reason="boom"))]
    usable, rejected = screen_replies(replies, arrays(0.0))
    assert [m.metadata.src_node_id for m in usable] == [1]
    reasons = dict(rejected)
    assert "non-finite" in reasons[2] and "shapes" in reasons[3] and "boom" in reasons[4]


def test_nan_reply_is_never_averaged_in(caplog):
    recorder = ListRecorder()
    strategy = SeededFedAvg(clients_per_round=3, recorder=recorder)
    strategy._sent_arrays = arrays(0.0)
    replies = [reply(1, arrays(1.0), examples=10), reply(2, arrays(3.0), examples=30), reply(3, arrays(np.nan))]
    with caplog.at_level("WARNING"):
        result, _metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(result["w"].numpy(), 2.5)  # (1*10 + 3*30) / 40, node 3 excluded
    assert "node 3 excluded" in caplog.text
    (_, phase, logged), = recorder.rounds
    assert phase == "train" and logged["rejected"] == 1 and logged["rejected-nodes"] == [3]
    assert [r["node_id"] for r in recorder.rows["train_clients"]] == [1, 2]


def test_all_replies_rejected_keeps_previous_model():
    strategy = SeededFedAvg(clients_per_round=1)
    strategy._sent_arrays = arrays(0.0)
    assert strategy.aggregate_train(1, [reply(1, arrays(np.inf))]) == (None, None)


def test_sampling_is_seeded_and_sized():
    grid = FakeGrid(range(100, 150))
    a = SeededFedAvg(clients_per_round=7, seed=3)
    b = SeededFedAvg(clients_per_round=7, seed=3)
    first = a.sample_nodes(grid, 1, 7)
    assert first == b.sample_nodes(FakeGrid(reversed(range(100, 150))), 1, 7)
    assert len(set(first)) == 7 and set(first) <= set(range(100, 150))
    assert first != a.sample_nodes(grid, 2, 7)


def test_evaluation_sampling_is_seeded_sized_and_separate_from_training():
    def evaluated(seed, server_round, grid, fraction=0.2, minimum=1):
        strategy = SeededFedAvg(clients_per_round=5, seed=seed, fraction_evaluate=fraction,
                                min_evaluate_nodes=minimum)
        settings = strategy.fraction_evaluate, strategy.min_evaluate_nodes, strategy.min_available_nodes
        messages = strategy.configure_evaluate(server_round, arrays(0.0), ConfigRecord({}), grid)
        assert (strategy.fraction_evaluate, strategy.min_evaluate_nodes, strategy.min_available_nodes) == settings
        assert all(m.content["config"]["server-round"] == server_round for m in messages)
        return sorted(m.metadata.dst_node_id for m in messages)  # Flower shuffles the message order

    nodes = range(100, 150)
    first = evaluated(3, 1, FakeGrid(nodes))
    assert len(set(first)) == 10  # int(50 * 0.2)
    assert first == evaluated(3, 1, FakeGrid(reversed(nodes)))  # Flower's own draw differs almost surely
    assert first != evaluated(3, 2, FakeGrid(nodes)) and first != evaluated(4, 1, FakeGrid(nodes))
    assert first != sorted(SeededFedAvg(clients_per_round=10, seed=3).sample_nodes(FakeGrid(nodes), 1, 10))
    assert len(evaluated(3, 1, FakeGrid(nodes), fraction=0.01, minimum=4)) == 4  # min_evaluate_nodes wins
    assert len(evaluated(3, 1, FakeGrid([7, 8]), fraction=0.5, minimum=4)) == 2  # never more than connected
    assert evaluated(3, 1, FakeGrid(nodes), fraction=1.0) == list(nodes)
    assert evaluated(3, 1, FakeGrid(nodes), fraction=0.0) == []


def test_sampling_handles_huge_node_ids_and_too_few_nodes(caplog):
    huge = [2**63 + 5, 2**64 - 1, 17]
    strategy = SeededFedAvg(clients_per_round=5, node_wait_seconds=0)
    with caplog.at_level("WARNING"):
        picked = strategy.sample_nodes(FakeGrid(huge), 1, 5)
    assert sorted(picked) == sorted(huge)
    assert "only 3 nodes connected, 5 requested" in caplog.text


def test_configure_train_sends_to_sampled_nodes_without_mutating_config():
    strategy = SeededFedAvg(clients_per_round=4, seed=0)
    config = ConfigRecord({"lr": 0.1})
    messages = list(strategy.configure_train(2, arrays(0.0), config, FakeGrid(range(1, 11))))
    assert len(messages) == 4 and len({m.metadata.dst_node_id for m in messages}) == 4
    assert dict(config) == {"lr": 0.1}
    assert messages[0].content["config"]["server-round"] == 2


def test_invalid_clients_per_round():
    with pytest.raises(ValueError, match="clients_per_round"):
        SeededFedAvg(clients_per_round=0)


def _random_arrays(rng):
    from flwr.app import Array, ArrayRecord
    return ArrayRecord({"w": Array(rng.normal(size=(2, 3)).astype(np.float32) * 1e4),
                        "b": Array(rng.normal(size=3).astype(np.float32))})


def test_aggregation_does_not_depend_on_reply_arrival_order():
    # Replies reach the server in whatever order the clients finish; float sums are not associative,
    # so the same seed must give the same model only if the strategy fixes the order itself.
    rng = np.random.default_rng(0)
    replies = [reply(node, _random_arrays(rng), examples=int(rng.integers(1, 50))) for node in range(1, 9)]
    results = []
    for order in (replies, replies[::-1], replies[3:] + replies[:3]):
        recorder = ListRecorder()
        strategy = SeededFedAvg(clients_per_round=8, recorder=recorder)
        strategy._sent_arrays = arrays(0.0)
        strategy._expected = list(range(1, 9))
        result, metrics = strategy.aggregate_train(1, order)
        results.append(({k: v.numpy() for k, v in result.items()}, dict(metrics),
                        [r["node_id"] for r in recorder.rows["train_clients"]]))
    for got, metrics, rows in results[1:]:
        for name in got:
            np.testing.assert_array_equal(got[name], results[0][0][name])
        assert metrics == results[0][1] and rows == results[0][2] == list(range(1, 9))


def _federation(seed, size=30):
    """``size`` nodes with Flower-like random 64-bit ids; node ``i`` of the list holds partition ``i``."""
    ids = [int(i) for i in np.random.default_rng(seed).integers(1, 2**63, size=size, dtype=np.int64)]
    return ids, {node: partition for partition, node in enumerate(ids)}


def test_same_seed_samples_the_same_partitions_whatever_the_node_ids():
    # Flower draws new node ids every simulation run; the sample must follow partition ids instead.
    picked = []
    for run in range(3):
        ids, keys = _federation(seed=run)
        grid = FakeGrid(np.random.default_rng(run + 10).permutation(ids).tolist(), keys=keys)
        strategy = SeededFedAvg(clients_per_round=7, seed=4)
        picked.append([[keys[n] for n in strategy.sample_nodes(grid, r, 7)] for r in (1, 2)])
        assert grid.identify_queries == len(ids)  # each node asked once, not every round
    assert picked[0] == picked[1] == picked[2]
    assert picked[0][0] == sorted(picked[0][0]) and picked[0][0] != picked[0][1]


def test_nodes_without_identity_come_last_by_node_id(caplog):
    strategy = SeededFedAvg(clients_per_round=4)
    grid = FakeGrid([50, 7, 30, 9], keys={50: 0, 30: 1})
    with caplog.at_level("WARNING"):
        assert strategy.stable_order(grid, grid.get_node_ids()) == [50, 30, 7, 9]
    assert "2 of 4 nodes report no stable identity" in caplog.text


def test_aggregation_follows_partition_order_not_node_ids():
    # The same partitions' models under two different node-id draws give a bit-identical global model.
    rng = np.random.default_rng(1)
    models = [_random_arrays(rng) for _ in range(6)]
    results = []
    for run in range(2):
        ids, keys = _federation(seed=run, size=6)
        strategy = SeededFedAvg(clients_per_round=6)
        strategy.stable_order(FakeGrid(ids, keys=keys), ids)
        strategy._sent_arrays = arrays(0.0)
        strategy._expected = ids
        replies = [reply(node, models[keys[node]], examples=keys[node] + 1) for node in ids]
        result, _ = strategy.aggregate_train(1, replies[::-1] if run else replies)
        results.append({k: v.numpy() for k, v in result.items()})
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name])
