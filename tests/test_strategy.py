"""BouquetStrategy with real Flower Message objects: screening, sampling, the round records, state, start()."""

import inspect

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.app.error import Error
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from bouquet.algorithms.hk import HKParams
from bouquet.params import ParamError
from bouquet.strategies import (
    BouquetStrategy,
    Coalitions,
    FixedKFedAvg,
    HKFedAvg,
    HKRule,
    RecorderObserver,
    SamplingParams,
    SeededBulyan,
    SeededFedAvg,
    SeededFedMedian,
    SeededFedProx,
    SeededFedTrimmedAvg,
    SeededKrum,
    SeededMultiKrum,
    ServerState,
    UniformSampler,
    WeightedMean,
    cfl_strategy,
    ifca_strategy,
    local_strategy,
    robust_strategy,
    screen_replies,
    selection_strategy,
)
from bouquet.strategies.arrays import to_numpy
from bouquet.strategies.rounds import ClientUpdates, TrainRound
from tests.flower_fakes import FakeGrid, ListHook, ListRecorder, arrays, make_message, reply, reply_to


def strategy(recorder=None, **sampling):
    """A strategy whose nodes report their identity (as bouquet's app), unless told ``identify_nodes=False``."""
    hooks = [RecorderObserver(recorder)] if recorder is not None else []
    sampling.setdefault("identify_nodes", True)
    return BouquetStrategy(sampler=UniformSampler(SamplingParams(**sampling)), hooks=hooks,
                           message_factory=make_message)


def configured(node_ids, sent=None, server_round=1):
    """The record ``configure`` would have made for ``node_ids`` (all sent ``sent``)."""
    sent = sent if sent is not None else arrays(0.0)
    return TrainRound(server_round, tuple(node_ids), {n: sent for n in node_ids}, ConfigRecord(), ())


def test_screening_rejects_nan_shape_and_error_replies():
    replies = [reply(1, arrays(1.0)), reply(2, arrays(np.nan)), reply(3, arrays(1.0, shape=(3, 2))),
               reply(4, error=Error(code=1, reason="boom"))]
    usable, rejected = screen_replies(replies, arrays(0.0))
    assert [m.metadata.src_node_id for m in usable] == [1]
    reasons = dict(rejected)
    assert "non-finite" in reasons[2] and "shapes" in reasons[3] and "boom" in reasons[4]


def test_replies_of_another_round_unasked_twice_or_oversized_are_counted_named_and_never_aggregated(caplog):
    """A reply to round 2 in round 1, a node that answers twice, a node that was sent nothing and a reply
    100x the others' update norm: each is excluded with its reason, and the round goes on with the rest."""
    recorder = ListRecorder()
    s = strategy(recorder, clients_per_round=5)
    replies = [reply(1, arrays(1.0), examples=10), reply(2, arrays(3.0), examples=30),
               reply(3, arrays(1.0), server_round=2), reply(4, arrays(1.0)), reply(4, arrays(5.0)),
               reply(5, arrays(1.0)), reply(6, arrays(300.0))]
    with caplog.at_level("WARNING"):
        result, _metrics = s.aggregate_train_round(configured([1, 2, 3, 4, 6]), replies)  # node 5 not sent
    np.testing.assert_allclose(result["w"].numpy(), 2.5)  # (1*10 + 3*30) / 40: nodes 1 and 2 only
    (_, _phase, logged), = recorder.rounds
    assert logged["replies"] == 2 and logged["rejected"] == 5 and logged["lost-nodes"] == []
    assert sorted(logged["rejected-nodes"]) == [3, 4, 4, 5, 6]
    for node, reason in [(3, "reply for round '2', this is round 1"), (4, "answered 2 times this round"),
                         (5, "was sent no training message this round"), (6, "update norm 100.0 times")]:
        assert f"node {node} excluded" in caplog.text and reason in caplog.text


def test_the_size_screen_is_a_setting_and_zero_turns_it_off():
    """``ScreeningParams(max_update_ratio)`` (run config ``reply-max-update-ratio``): 200x passes a limit of 300,
    and with 0 nothing is refused for its size; a limit of 1 or less would refuse honest replies."""
    from bouquet.config import AppConfig, ConfigError
    from bouquet.strategies.params import ScreeningParams

    def aggregate(screening):
        s = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=3)), screening=screening,
                            message_factory=make_message)
        replies = [reply(1, arrays(1.0)), reply(2, arrays(1.0)), reply(3, arrays(200.0))]
        return s.aggregate_train_round(configured([1, 2, 3]), replies)[0]["w"].numpy()

    np.testing.assert_allclose(aggregate(None), 1.0)  # the default 50x refuses node 3
    np.testing.assert_allclose(aggregate(ScreeningParams(300.0)), (1 + 1 + 200) / 3)
    np.testing.assert_allclose(aggregate(ScreeningParams(0.0)), (1 + 1 + 200) / 3)
    assert AppConfig.from_run_config({"reply-max-update-ratio": 0}).screening.max_update_ratio == 0
    with pytest.raises(ConfigError, match="run-config 'reply-max-update-ratio': .* 0 \\(off\\) or > 1, got 1.0"):
        AppConfig.from_run_config({"reply-max-update-ratio": 1.0})


def test_the_size_screen_compares_with_the_lower_median_and_leaves_honest_spread_alone():
    from bouquet.strategies.replies import OVERSIZED_NORM_RATIO, oversized

    zero = {"w": np.zeros(4, dtype=np.float32), "n": np.zeros(1, dtype=np.int64)}
    models = [{"w": np.full(4, v, dtype=np.float32), "n": np.array([10**9])} for v in (1.0, 40.0, 0.5)]
    assert oversized(models, [zero] * 3) == [None, None, None]  # 80x the smallest, 40x the lower median (1.0)
    assert oversized(models[:2], [zero] * 2) == [None, None]   # two: the lower median is the smaller, 40x < 50x
    two = [models[0], {"w": np.full(4, 100.0, dtype=np.float32), "n": np.array([0])}]
    assert oversized(two, [zero] * 2) == [None, 100.0]           # integer arrays are not part of the update
    assert oversized([models[1]], [zero]) == [None]              # one update: nothing to compare with
    assert oversized(models, [zero] * 3, ratio=30.0) == [None, 40.0, None]
    assert OVERSIZED_NORM_RATIO == 50.0


def test_screening_rejects_other_dtypes_and_replies_without_a_model():
    as_ints = ArrayRecord({"w": Array(np.ones((2, 3), dtype=np.int64)), "b": Array(np.ones(3, dtype=np.float32))})
    metrics_only = reply(3, arrays(1.0))
    del metrics_only.content["arrays"]
    usable, rejected = screen_replies([reply(1, arrays(1.0)), reply(2, as_ints), metrics_only], arrays(0.0))
    assert [m.metadata.src_node_id for m in usable] == [1]
    reasons = dict(rejected)
    assert reasons[2] == "array dtypes differ from the model sent: {'w': 'int64 (sent float32)'}"
    assert reasons[3] == "no ArrayRecord in reply (expected 'arrays')"


def test_nan_reply_is_never_averaged_in(caplog):
    recorder = ListRecorder()
    s = strategy(recorder, clients_per_round=3)
    replies = [reply(1, arrays(1.0), examples=10), reply(2, arrays(3.0), examples=30), reply(3, arrays(np.nan))]
    with caplog.at_level("WARNING"):
        result, _metrics = s.aggregate_train_round(configured([1, 2, 3]), replies)
    np.testing.assert_allclose(result["w"].numpy(), 2.5)  # (1*10 + 3*30) / 40, node 3 excluded
    assert "node 3 excluded" in caplog.text
    (_, phase, logged), = recorder.rounds
    assert phase == "train" and logged["rejected"] == 1 and logged["rejected-nodes"] == [3]
    assert [r["node_id"] for r in recorder.rows["train_clients"]] == [1, 2]


def test_reply_without_the_weight_is_excluded_not_fatal(caplog):
    bad = reply_to(make_message(RecordDict(), "train", 2, "1"),
                   RecordDict({"arrays": arrays(5.0), "metrics": MetricRecord({"loss": 1.0})}))
    with caplog.at_level("WARNING"):
        result, _ = strategy().aggregate_train_round(configured([1, 2]), [reply(1, arrays(1.0)), bad])
    np.testing.assert_allclose(result["w"].numpy(), 1.0)
    assert "node 2 excluded: no 'num-examples' value in its MetricRecord" in caplog.text


def test_all_replies_rejected_keeps_previous_model():
    s = strategy(clients_per_round=1)
    s.models.adopt(arrays(7.0))
    assert s.aggregate_train_round(configured([1]), [reply(1, arrays(np.inf))]) == (None, None)
    np.testing.assert_allclose(s.models.shared["w"].numpy(), 7.0)


def test_lost_nodes_are_named(caplog):
    recorder = ListRecorder()
    with caplog.at_level("WARNING"):
        strategy(recorder).aggregate_train_round(configured([1, 2, 3]), [reply(1, arrays(1.0))])
    assert "node 2 was sent a training message but never replied" in caplog.text
    assert recorder.rounds[0][2]["lost-nodes"] == [2, 3]


def _trained(s, grid, server_round, config=None):
    return list(s.configure_train_round(server_round, config or ConfigRecord(), grid).node_ids)


def test_sampling_is_seeded_and_sized():
    grid = FakeGrid(range(100, 150))
    first = _trained(strategy(clients_per_round=7, seed=3), grid, 1)
    assert first == _trained(strategy(clients_per_round=7, seed=3), FakeGrid(reversed(range(100, 150))), 1)
    assert len(set(first)) == 7 and set(first) <= set(range(100, 150))
    assert first != _trained(strategy(clients_per_round=7, seed=3), grid, 2)


def test_fraction_sampling_is_seeded_too():
    grid = FakeGrid(range(1, 21))
    a = _trained(strategy(fraction_train=0.5, seed=1), grid, 1)
    assert len(a) == 10 and a == _trained(strategy(fraction_train=0.5, seed=1), FakeGrid(range(1, 21)), 1)
    assert len(_trained(strategy(fraction_train=0.01, min_train_nodes=3), grid, 1)) == 3
    assert _trained(strategy(fraction_train=0.0), grid, 1) == []


def test_evaluation_sampling_is_seeded_sized_and_separate_from_training():
    def evaluated(seed, server_round, grid, fraction=0.2, minimum=1):
        # no wait for nodes that never come (the bounded wait has its own tests in test_dropin.py)
        s = strategy(clients_per_round=5, seed=seed, fraction_evaluate=fraction, min_evaluate_nodes=minimum,
                     node_wait_seconds=0)
        plan = s.configure_evaluate_round(server_round, ConfigRecord({}), grid)
        assert all(m.content["config"]["server-round"] == server_round for m in plan.messages)
        assert all(m.metadata.message_type == "evaluate" for m in plan.messages)
        return sorted(m.metadata.dst_node_id for m in plan.messages)

    nodes = range(100, 150)
    first = evaluated(3, 1, FakeGrid(nodes))
    assert len(set(first)) == 10  # int(50 * 0.2)
    assert first == evaluated(3, 1, FakeGrid(reversed(nodes)))
    assert first != evaluated(3, 2, FakeGrid(nodes)) and first != evaluated(4, 1, FakeGrid(nodes))
    assert first != sorted(_trained(strategy(clients_per_round=10, seed=3), FakeGrid(nodes), 1))
    assert len(evaluated(3, 1, FakeGrid(nodes), fraction=0.01, minimum=4)) == 4  # min_evaluate_nodes wins
    assert len(evaluated(3, 1, FakeGrid([7, 8]), fraction=0.5, minimum=4)) == 2  # never more than connected
    assert evaluated(3, 1, FakeGrid(nodes), fraction=1.0) == list(nodes)
    assert evaluated(3, 1, FakeGrid(nodes), fraction=0.0) == []


def test_sampling_handles_huge_node_ids_and_too_few_nodes(caplog):
    huge = [2**63 + 5, 2**64 - 1, 17]
    with caplog.at_level("WARNING"):
        picked = _trained(strategy(clients_per_round=5, node_wait_seconds=0), FakeGrid(huge), 1)
    assert sorted(picked) == sorted(huge)
    assert "only 3 nodes connected after 0 s, 5 needed" in caplog.text


def test_configure_sends_the_record_to_the_sampled_nodes_without_mutating_config():
    s = strategy(clients_per_round=4, seed=0)
    config = ConfigRecord({"lr": 0.1})
    plan = s.configure_train_round(2, config, FakeGrid(range(1, 11)))
    assert len(plan.messages) == 4 and {m.metadata.dst_node_id for m in plan.messages} == set(plan.node_ids)
    assert dict(config) == {"lr": 0.1}
    assert dict(plan.config) == {"lr": 0.1, "server-round": 2}
    assert all(m.content["config"]["server-round"] == 2 and m.metadata.message_type == "train" for m in plan.messages)
    assert set(plan.sent) == set(plan.node_ids)


def test_invalid_sampling_parameters_name_the_field():
    with pytest.raises(ParamError, match="clients_per_round") as error:
        SeededFedAvg(clients_per_round=0)
    assert error.value.field == "clients_per_round"
    with pytest.raises(ValueError, match="fraction_evaluate"):
        HKFedAvg(fraction_evaluate=1.5)


def _random_arrays(rng):
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
        result, metrics = strategy(recorder).aggregate_train_round(configured(range(1, 9)), order)
        results.append((to_numpy(result), dict(metrics), [r["node_id"] for r in recorder.rows["train_clients"]]))
    for got, metrics, rows in results[1:]:
        for name in got:
            np.testing.assert_array_equal(got[name], results[0][0][name])
        assert metrics == results[0][1] and rows == results[0][2] == list(range(1, 9))


def test_weighted_mean_is_flowers_fedavg_bit_for_bit():
    rng = np.random.default_rng(5)
    records = [ArrayRecord({"w": Array(rng.normal(size=(3, 4)).astype(np.float32)),
                            "d": Array(rng.normal(size=2)),  # float64 stays float64
                            "steps": Array(np.asarray(rng.integers(0, 9), dtype=np.int64))}) for _ in range(5)]
    examples = [3, 17, 1, 250, 9]
    flower = aggregate_arrayrecords([RecordDict({"arrays": r, "metrics": MetricRecord({"num-examples": n})})
                                     for r, n in zip(records, examples)], "num-examples")
    updates = ClientUpdates(1, 0, tuple(range(5)), tuple(to_numpy(r) for r in records), tuple(examples),
                            tuple({} for _ in records))
    ours = WeightedMean().aggregate(updates).model
    assert list(ours) == list(flower.keys())
    for name in ours:
        assert ours[name].dtype == flower[name].numpy().dtype
        np.testing.assert_array_equal(ours[name], flower[name].numpy())


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
        s = strategy(clients_per_round=7, seed=4)
        picked.append([[keys[n] for n in _trained(s, grid, r)] for r in (1, 2)])
        assert grid.identify_queries == len(ids)  # each node asked once, not every round
    assert picked[0] == picked[1] == picked[2]
    assert picked[0][0] == sorted(picked[0][0]) and picked[0][0] != picked[0][1]


def test_nodes_without_identity_come_last_by_node_id(caplog):
    s = strategy(clients_per_round=4)
    grid = FakeGrid([50, 7, 30, 9], keys={50: 0, 30: 1})
    with caplog.at_level("WARNING"):
        assert s.nodes.order(grid, grid.get_node_ids()) == [50, 30, 7, 9]
    assert "2 of 4 nodes report no stable identity" in caplog.text


def test_nodes_slow_to_answer_their_identity_are_waited_for_not_asked_again(caplog):
    # a loaded machine's simulation (or a large one) can take longer than node-wait-seconds to start its
    # ClientApps: each node is asked once and its reply awaited up to 3 x node-wait-seconds
    s = strategy(clients_per_round=4)
    wait = s.nodes.wait_seconds
    grid = FakeGrid([50, 7, 30, 9], keys={50: 0, 30: 1, 7: 2, 9: 3}, slow={7: 1.5 * wait, 9: 2.9 * wait})
    with caplog.at_level("WARNING"):
        assert s.nodes.order(grid, grid.get_node_ids()) == [50, 30, 7, 9]
    assert grid.identify_queries == 4 and grid.timeouts == [3 * wait]  # one message per node, one wait
    assert "no stable identity" not in caplog.text
    grid = FakeGrid([50, 7], keys={50: 0, 7: 1}, slow={7: 3.5 * wait})
    with caplog.at_level("WARNING"):
        assert strategy(clients_per_round=2).nodes.order(grid, grid.get_node_ids()) == [50, 7]
    assert grid.identify_queries == 2  # node 7 answers after the wait: keyless, ordered by node id
    assert "1 of them did not answer at all" in caplog.text


def test_identify_nodes_refuses_no_patience_and_asks_no_one_for_no_nodes():
    from bouquet.node_identity import identify_nodes

    grid = FakeGrid([1], keys={1: 0})
    with pytest.raises(ValueError, match="patience"):
        identify_nodes(grid, [1], 30.0, patience=0)
    assert identify_nodes(grid, [], 30.0) == {} and grid.timeouts == []


def test_aggregation_follows_partition_order_not_node_ids():
    # The same partitions' models under two different node-id draws give a bit-identical global model.
    rng = np.random.default_rng(1)
    models = [_random_arrays(rng) for _ in range(6)]
    results = []
    for run in range(2):
        ids, keys = _federation(seed=run, size=6)
        s = strategy(clients_per_round=6)
        s.nodes.order(FakeGrid(ids, keys=keys), ids)
        replies = [reply(node, models[keys[node]], examples=keys[node] + 1) for node in ids]
        result, _ = s.aggregate_train_round(configured(ids), replies[::-1] if run else replies)
        results.append(to_numpy(result))
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name])


# ------------------------------------------------------------------ whole runs in-process
def _clients(step):
    """A grid whose nodes answer like clients: train adds ``step * (partition + 1)``, evaluate reports the mean."""
    keys = {100 + k: k for k in range(6)}

    def handler(msg):
        part = keys[msg.metadata.dst_node_id]
        model = to_numpy(msg.content["arrays"])
        if msg.metadata.message_type == "train":
            trained = ArrayRecord({k: Array((v + step * (part + 1)).astype(v.dtype)) for k, v in model.items()})
            return reply_to(msg, RecordDict({"arrays": trained,
                                             "metrics": MetricRecord({"num-examples": part + 1, "loss": 1.0 / (part + 1)})}))
        return reply_to(msg, RecordDict({"metrics": MetricRecord({"num-examples": 1, "mean": float(model["w"].mean())})}))

    return FakeGrid(sorted(keys), keys=keys, handler=handler)


def test_start_runs_rounds_and_passes_each_record_from_configure_to_aggregate():
    observer = ListHook()
    s = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=3, seed=2)),
                        hooks=[observer], message_factory=make_message)
    evaluated = []
    result = s.start(_clients(0.5), arrays(0.0), num_rounds=3,
                     evaluate_fn=lambda r, a: evaluated.append((r, float(a["w"].numpy().mean()))) or None)
    assert [e.phase for e in observer.events] == ["train", "evaluate"] * 3
    assert [r for r, _ in evaluated] == [0, 1, 2, 3] and s.server_round == 3
    # by hand: each round the model moves by the sample-weighted mean of 0.5 * (partition + 1) over the sampled
    expected, trained = 0.0, []
    for event in observer.events[::2]:
        parts = [row["node_id"] - 100 for row in event.tables["train_clients"]]
        trained.append(parts)
        weights = np.array(parts) + 1.0
        expected += float(np.sum(weights * 0.5 * weights) / weights.sum())
    np.testing.assert_allclose(result.arrays["w"].numpy(), expected, rtol=1e-6)
    assert all(len(p) == 3 for p in trained)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3] and sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]


def test_hooks_do_nothing_by_default_and_each_job_is_one_hook():
    """Central evaluation, its record, the end of a round and early stop are each one hook; a hook overrides
    only what it needs; Flower's evaluate_fn joins them as one more hook for its run."""
    from bouquet.strategies.hooks import CentralEvaluation, Hook, StopWhen

    class RoundEnds(Hook):
        def __init__(self):
            self.seen = []

        def on_round_end(self, server_round, state, result):
            self.seen.append((state.server_round, server_round, sorted(result.evaluate_metrics_serverapp)))

    events, ends = ListHook(), RoundEnds()
    plain = Hook()
    assert plain.evaluate(1, arrays(0.0)) is None and plain.should_stop(1, None) is False
    mean = CentralEvaluation(lambda r, a: MetricRecord({"mean": float(a["w"].numpy().mean())}))
    rounds = CentralEvaluation(lambda r, a: MetricRecord({"round": r}))
    s = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=3, seed=2)),
                        hooks=[events, plain, mean, rounds, ends, StopWhen(lambda r, _: r == 2)],
                        message_factory=make_message)
    flower = []
    result = s.start(_clients(0.5), arrays(0.0), num_rounds=4, evaluate_fn=lambda r, a: flower.append(r) or None)
    assert s.server_round == 2 and flower == [0, 1, 2]  # stopped after round 2
    assert [e.phase for e in events.events] == ["central", "train", "evaluate", "central", "train", "evaluate",
                                                "central"]
    central = [e for e in events.events if e.phase == "central"]
    assert [(e.server_round, e.metrics["round"]) for e in central] == [(0, 0), (1, 1), (2, 2)]
    assert central[0].metrics["mean"] == 0.0 and dict(result.evaluate_metrics_serverapp[2]) == dict(central[2].metrics)
    # the round's records (its central evaluation included) are in before the round ends
    assert ends.seen == [(1, 1, [0, 1]), (2, 2, [0, 1, 2])]


def test_the_server_state_roundtrips_through_records_and_resumes_to_the_same_model():
    def fresh():
        return BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=4, seed=5)),
                               aggregator=Coalitions(HKRule(HKParams(tau=0.9))), message_factory=make_message)

    final = fresh().start(_clients(0.25), arrays(1.0), num_rounds=3)
    first = fresh()
    first.start(_clients(0.25), arrays(1.0), num_rounds=2)
    saved = ServerState.from_records(first.state().to_records())
    assert saved.server_round == 2 and saved.seed == 5 and set(saved.models) == {"shared"}

    resumed = fresh()
    resumed.load_state(saved)
    again = resumed.start(_clients(0.25), saved.models["shared"], num_rounds=3)
    for name in final.arrays:
        np.testing.assert_array_equal(again.arrays[name].numpy(), final.arrays[name].numpy())
    with pytest.raises(ValueError, match="seed 5"):
        HKFedAvg(seed=6).load_state(saved)


def test_flower_hook_methods_give_the_same_model_as_start():
    by_start = strategy(clients_per_round=3).start(_clients(1.0), arrays(0.0), num_rounds=2)
    s, grid, model = strategy(clients_per_round=3), _clients(1.0), arrays(0.0)
    for r in (1, 2):
        model, _ = s.aggregate_train(r, grid.send_and_receive(s.configure_train(r, model, ConfigRecord(), grid)))
        s.aggregate_evaluate(r, grid.send_and_receive(s.configure_evaluate(r, model, ConfigRecord(), grid)))
    np.testing.assert_array_equal(model["w"].numpy(), by_start.arrays["w"].numpy())


@pytest.mark.parametrize("public", [SeededFedAvg, SeededFedProx, HKFedAvg, FixedKFedAvg, selection_strategy,
                                    BouquetStrategy, SeededKrum, SeededMultiKrum, SeededBulyan, SeededFedMedian,
                                    SeededFedTrimmedAvg, ifca_strategy, cfl_strategy, local_strategy,
                                    robust_strategy])
def test_public_constructors_spell_out_their_parameters(public):
    parameters = inspect.signature(public).parameters.values()
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    assert all(f"{p.name} :" in inspect.getdoc(public) or p.name in inspect.getdoc(public) for p in parameters)


def test_the_state_is_built_only_on_rounds_a_hook_is_due():
    """A checkpoint every 3 rounds of 5 reads the state after rounds 3 and 5 (the last), and the strategy builds
    it on those rounds only (it costs a copy of every model the server holds)."""
    from bouquet.strategies.hooks import Hook

    class EveryThird(Hook):
        def __init__(self):
            self.seen = []

        def due(self, server_round):
            return server_round % 3 == 0 or server_round == 5

        def on_round_end(self, server_round, state, result):
            self.seen.append(server_round)

    class Counting(BouquetStrategy):
        built = 0

        def state(self):
            Counting.built += 1
            return super().state()

    hook = EveryThird()
    s = Counting(sampler=UniformSampler(SamplingParams(clients_per_round=3, seed=2)), hooks=[hook],
                 message_factory=make_message)
    s.start(_clients(0.5), arrays(0.0), num_rounds=5)
    assert hook.seen == [3, 5] and Counting.built == 2
