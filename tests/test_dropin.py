"""Drop-ins against Flower's own strategies on the same Messages (differential tests).

The aggregation and sampling cases of Flower's strategy tests (``strategy_utils_test.py``,
``fedavgm_test.py``, ``multikrum_test.py``, ``fedmedian_test.py``, ``fedtrimmedavg_test.py``, Flower
1.42), rewritten as comparisons: a bouquet drop-in and the Flower strategy it replaces get the same
replies and must give the same model to Flower's own tolerance (``np.allclose``; bit for bit where
bouquet promises it).  Every difference ``docs/USAGE.md`` lists ("Where bouquet differs from FedAvg")
is asserted here as that difference.
"""

import inspect
import logging
import threading
import time

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import Bulyan, FedAvg, FedMedian, FedProx, FedTrimmedAvg, Krum, MultiKrum

from bouquet.algorithms.clustered import CFLParams, IFCAParams
from bouquet.algorithms.selection import SCKMSelectSelector
from bouquet.params import ParamError
from bouquet.strategies import (
    FixedKFedAvg,
    HKFedAvg,
    SamplingParams,
    SeededBulyan,
    SeededFedAvg,
    SeededFedMedian,
    SeededFedProx,
    SeededFedTrimmedAvg,
    SeededKrum,
    SeededMultiKrum,
    cfl_strategy,
    ifca_strategy,
    local_strategy,
    robust_strategy,
    selection_strategy,
)
from bouquet.strategies.params import RobustRuleParams
from tests.flower_fakes import FakeGrid, reply_to

PAIRS = [(SeededFedAvg, FedAvg), (HKFedAvg, FedAvg), (FixedKFedAvg, FedAvg), (SeededFedProx, FedProx),
         (SeededKrum, Krum), (SeededMultiKrum, MultiKrum), (SeededBulyan, Bulyan), (SeededFedMedian, FedMedian),
         (SeededFedTrimmedAvg, FedTrimmedAvg)]

#: Each wrapper configured to be FedAvg, and whether it promises Flower's bits (else Flower's tolerance).
AS_FEDAVG = {
    "SeededFedAvg": (lambda **kw: SeededFedAvg(**kw), True),
    "SeededFedProx": (lambda **kw: SeededFedProx(**kw), True),
    "HKFedAvg": (lambda **kw: HKFedAvg(geometry="cosine", tau=-1.0, barycenter_weighting="samples", **kw), False),
    "FixedKFedAvg": (lambda **kw: FixedKFedAvg(k=1, barycenter_weighting="samples", **kw), False),
}


@pytest.fixture(autouse=True)
def flower_task(monkeypatch):
    """Flower's Message constructor (Flower's strategies and the drop-ins build messages with it) needs the
    current run: give it one (test only)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _metadata(node, message_type="train"):
    return Metadata(run_id=1, message_id=f"m{node}", src_node_id=node, dst_node_id=0, reply_to_message_id=f"i{node}",
                    group_id="1", created_at=0.0, ttl=60.0, message_type=message_type)


def flower_reply(node, arrays, weight, key="arrays", weight_key="num-examples", metrics_name="metrics", extra=None):
    """A training reply as Flower's tests build them (``create_mock_reply``), as a real Message from ``node``."""
    content = RecordDict({key: arrays, metrics_name: MetricRecord({weight_key: weight, **(extra or {})})})
    return Message(content=content, metadata=_metadata(node))


def replies_of(models, weights, **kw):
    return [flower_reply(i + 1, ArrayRecord([np.asarray(a) for a in m]), w, **kw)
            for i, (m, w) in enumerate(zip(models, weights, strict=True))]


def arrays_of(record):
    return [np.asarray(a) for a in record.to_numpy_ndarrays()]


# ----------------------------------------------------------------------------- constructors
@pytest.mark.parametrize(("ours", "flowers"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_constructor_takes_flowers_arguments_in_flowers_order_with_flowers_defaults(ours, flowers):
    theirs = list(inspect.signature(flowers).parameters.values())
    mine = list(inspect.signature(ours).parameters.values())
    assert [p.name for p in mine[: len(theirs)]] == [p.name for p in theirs]  # positional, same order
    for p, q in zip(mine, theirs):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default == q.default, p.name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in mine[len(theirs):])  # bouquet's own after
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in mine)
    ours(*[q.default for q in theirs])  # Flower's defaults, passed by position, are accepted


@pytest.mark.parametrize("compose", [
    lambda **kw: selection_strategy(SCKMSelectSelector(), clients_per_round=2, **kw),
    lambda **kw: ifca_strategy(IFCAParams(k=2), SamplingParams(clients_per_round=2), **kw),
    lambda **kw: cfl_strategy(CFLParams(), SamplingParams(), **kw),
    lambda **kw: local_strategy(SamplingParams(), **kw),
    lambda **kw: robust_strategy("fedmedian", RobustRuleParams(), SamplingParams(), **kw),
], ids=["selection", "ifca", "cfl", "local", "robust"])
def test_composing_functions_take_flowers_record_arguments(compose):
    fn = lambda records, key: MetricRecord({"custom": 1.0})
    s = compose(weighted_by_key="n", arrayrecord_key="model", configrecord_key="cfg", train_metrics_aggr_fn=fn,
                evaluate_metrics_aggr_fn=fn)
    assert (s.weighted_by_key, s.arrayrecord_key, s.configrecord_key) == ("n", "model", "cfg")
    assert s.train_metrics_aggr_fn is fn and s.evaluate_metrics_aggr_fn is fn


@pytest.mark.parametrize("bad", [{"weighted_by_key": ""}, {"arrayrecord_key": 3}])
def test_bad_record_arguments_name_the_argument(bad):
    with pytest.raises(ParamError, match=next(iter(bad))):
        SeededFedAvg(**bad)


# ----------------------------------------------------------------------------- messages and sampling
def _sent(strategy, grid, server_round=1, config=None, evaluate=False):
    arrays = ArrayRecord([np.zeros(3, dtype=np.float32)])
    configure = strategy.configure_evaluate if evaluate else strategy.configure_train
    return list(configure(server_round, arrays, config if config is not None else ConfigRecord({"lr": 0.1}), grid))


def test_messages_use_the_record_names_given(flower_task):
    kw = {"arrayrecord_key": "model", "configrecord_key": "cfg"}
    for evaluate in (False, True):
        ours = _sent(HKFedAvg(0.5, 0.5, **kw), FakeGrid(range(1, 11)), evaluate=evaluate)
        theirs = _sent(FedAvg(0.5, 0.5, **kw), FakeGrid(range(1, 11)), evaluate=evaluate)
        assert len(ours) == len(theirs) == 5
        for a, b in zip(ours, theirs):
            assert list(a.content.keys()) == list(b.content.keys()) == ["model", "cfg"]
            assert dict(a.content["cfg"]) == dict(b.content["cfg"]) == {"lr": 0.1, "server-round": 1}
            assert a.metadata.message_type == b.metadata.message_type


#: (connected, fraction, min nodes) where Flower does not wait (the waiting cases are tested below).
COUNT_CASES = [(n, f, m) for n in (2, 3, 7, 10) for f, m in ((1.0, 2), (0.5, 2), (0.3, 3), (0.01, 1), (0.0, 2),
                                                             (0.5, 0), (0.05, 0)) if (m if f > 0 else 0) <= n]


@pytest.mark.parametrize(("connected", "fraction", "min_nodes"), COUNT_CASES)
@pytest.mark.parametrize("evaluate", [False, True])
def test_node_counts_equal_flowers(flower_task, connected, fraction, min_nodes, evaluate):
    names = ("fraction_evaluate", "min_evaluate_nodes") if evaluate else ("fraction_train", "min_train_nodes")
    kw = {names[0]: fraction, names[1]: min_nodes}
    for ours, flowers in PAIRS:  # each drop-in against the Flower strategy it replaces
        theirs = _sent(flowers(**kw), FakeGrid(range(1, connected + 1)), evaluate=evaluate)
        mine = _sent(ours(**kw, node_wait_seconds=0), FakeGrid(range(1, connected + 1)), evaluate=evaluate)
        assert len(mine) == len(theirs), ours.__name__


class ArrivingGrid(FakeGrid):
    """``first`` nodes connected now, the rest ``after`` seconds later."""

    def __init__(self, node_ids, first, after):
        super().__init__(node_ids)
        self.first, self.ready = first, time.monotonic() + after

    def get_node_ids(self):
        return list(self.node_ids if time.monotonic() >= self.ready else self.node_ids[: self.first])


@pytest.mark.parametrize("evaluate", [False, True])
def test_sampling_waits_for_min_nodes_as_flower_does(flower_task, caplog, evaluate):
    kw = {"min_evaluate_nodes": 5} if evaluate else {"min_train_nodes": 5}
    theirs = _sent(FedAvg(**kw), ArrivingGrid(range(1, 6), first=3, after=1.2), evaluate=evaluate)
    with caplog.at_level(logging.INFO):
        ours = _sent(HKFedAvg(**kw), ArrivingGrid(range(1, 6), first=3, after=1.2), evaluate=evaluate)
    assert len(theirs) == len(ours) == 5
    assert "waiting for nodes to connect: 3 connected, 5 needed" in caplog.text


def test_sampling_gives_up_after_node_wait_seconds_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        sent = _sent(SeededFedAvg(min_train_nodes=5, node_wait_seconds=0.6), FakeGrid(range(1, 4)))
    assert len(sent) == 3  # (Flower would wait forever: node_wait_seconds=math.inf does the same)
    assert "only 3 nodes connected after 1 s, 5 needed" in caplog.text or "after 0 s, 5 needed" in caplog.text


def test_sampling_is_seeded_unlike_flowers():
    draws = [[m.metadata.dst_node_id for m in _sent(SeededFedAvg(0.3, seed=4), FakeGrid(range(1, 21)))]
             for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0]) == 6


# ----------------------------------------------------------------------------- node identity
def test_a_drop_in_sends_no_identity_query_unless_asked(caplog):
    grid = FakeGrid(range(1, 6), keys={n: 10 - n for n in range(1, 6)})
    with caplog.at_level(logging.INFO):
        plain = [m.metadata.dst_node_id for m in _sent(SeededFedAvg(clients_per_round=5), grid)]
    assert grid.identify_queries == 0 and plain == [1, 2, 3, 4, 5]  # node-id order
    assert caplog.text.count("nodes are ordered by node id") == 1
    grid = FakeGrid(range(1, 6), keys={n: 10 - n for n in range(1, 6)})
    keyed = [m.metadata.dst_node_id for m in _sent(SeededFedAvg(clients_per_round=5, identify_nodes=True), grid)]
    assert grid.identify_queries == 5 and keyed == [5, 4, 3, 2, 1]  # by the key each node reports


# ----------------------------------------------------------------------------- aggregation (Flower's cases)
def _aggregate(strategy, replies, configured=None):
    if configured is not None:
        strategy.configure_train(1, configured, ConfigRecord(), FakeGrid([r.metadata.src_node_id for r in replies]))
    return strategy.aggregate_train(1, replies)


def _random_case(rng, dtype=np.float64, shape=(7, 3)):
    """``strategy_utils_test.test_arrayrecords_aggregation``: 3 replies of 4 arrays, float weights."""
    weights = [0.25, 0.4, 0.35]
    models = [[rng.standard_normal(shape).astype(dtype) for _ in range(4)] for _ in range(3)]
    return models, weights


@pytest.mark.parametrize("name", list(AS_FEDAVG))
@pytest.mark.parametrize("configured", [False, True], ids=["replies-alone", "configured"])
@pytest.mark.parametrize("shape", [(7, 3), ()], ids=["7x3", "0-dim"])
def test_fedavg_equivalents_aggregate_as_flowers_fedavg(name, configured, shape):
    make, exact = AS_FEDAVG[name]
    models, weights = _random_case(np.random.default_rng(0), shape=shape)
    expected = [np.average([m[i] for m in models], axis=0, weights=weights) for i in range(4)]
    flower, _ = FedAvg(weighted_by_key="weight").aggregate_train(
        1, replies_of(models, weights, weight_key="weight"))
    ours, metrics = _aggregate(make(weighted_by_key="weight", node_wait_seconds=0),
                               replies_of(models, weights, weight_key="weight"),
                               ArrayRecord([np.zeros(shape)] * 4) if configured else None)
    got = arrays_of(ours)
    assert all(a.dtype == np.float64 and a.shape == shape for a in got)  # float64 in, float64 out
    assert all(np.allclose(a, b) for a, b in zip(got, expected))  # Flower's own check
    assert all(np.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(got, arrays_of(flower)))
    if exact:
        assert ours.object_id == flower.object_id
    assert dict(metrics) == {}  # only the weight was reported, and it is not averaged


@pytest.mark.parametrize("name", list(AS_FEDAVG))
def test_fedavgm_case_near_one_learning_rate_is_the_weighted_mean(name):
    """``fedavgm_test``: two float32 replies of two arrays, weights 1 and 2 (FedAvgM at lr 1 = FedAvg)."""
    make, _ = AS_FEDAVG[name]
    w0 = [np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32), np.array([7, 8, 9, 10], dtype=np.float32)]
    w1 = [np.array([[29, 23, 19], [17, 13, 11]], dtype=np.float32), np.array([7, 5, 3, 2], dtype=np.float32)]
    ours, _ = _aggregate(make(node_wait_seconds=0), replies_of([w0, w1], [1, 2]))
    for got, a, b in zip(arrays_of(ours), w0, w1, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_almost_equal(got, (a * 1 + b * 2) / 3, decimal=5)
    scalar, _ = _aggregate(make(node_wait_seconds=0), replies_of([[np.array(1.0)], [np.array(3.0)]], [1, 2]))
    (value,) = arrays_of(scalar)
    assert value.shape == ()
    np.testing.assert_allclose(value, 7.0 / 3.0, rtol=1e-6)


@pytest.mark.parametrize("name", list(AS_FEDAVG))
def test_a_model_under_another_record_name_is_read_as_flower_reads_it(name):
    make, _ = AS_FEDAVG[name]
    models, weights = _random_case(np.random.default_rng(1))
    flower, _ = FedAvg().aggregate_train(1, replies_of(models, weights, key="global-model"))
    ours, _ = _aggregate(make(node_wait_seconds=0), replies_of(models, weights, key="global-model"))
    assert all(np.allclose(a, b) for a, b in zip(arrays_of(ours), arrays_of(flower)))


def test_two_array_records_and_none_named_the_model_exclude_that_client(caplog):
    """Flower refuses the whole round (InconsistentMessageReplies); bouquet leaves out that client."""
    models, weights = _random_case(np.random.default_rng(2))
    replies = replies_of(models, weights)
    odd = replies[2].content
    odd["other"] = odd["arrays"]
    odd["another"] = odd["arrays"]
    del odd["arrays"]
    with pytest.raises(InconsistentMessageReplies):
        FedAvg().aggregate_train(1, replies)
    with caplog.at_level(logging.WARNING):
        ours, _ = SeededFedAvg().aggregate_train(1, replies)
    assert "node 3 excluded: no ArrayRecord 'arrays' in reply, and 2 others (other, another)" in caplog.text
    first_two = [np.average([m[i] for m in models[:2]], axis=0, weights=weights[:2]) for i in range(4)]
    assert all(np.allclose(a, b) for a, b in zip(arrays_of(ours), first_two))


def test_replies_with_other_array_names_are_screened_per_client_not_per_round(caplog):
    models, weights = _random_case(np.random.default_rng(3))
    replies = replies_of(models, weights)
    renamed = replies[1].content["arrays"]
    replies[1].content["arrays"] = ArrayRecord({f"x{k}": v for k, v in renamed.items()})
    with pytest.raises(InconsistentMessageReplies):
        FedAvg().aggregate_train(1, replies)
    with caplog.at_level(logging.WARNING):
        ours, _ = HKFedAvg(geometry="cosine", tau=-1.0, barycenter_weighting="samples").aggregate_train(1, replies)
    assert "node 2 excluded: array names/shapes" in caplog.text
    kept = [models[0], models[2]]
    expected = [np.average([m[i] for m in kept], axis=0, weights=[weights[0], weights[2]]) for i in range(4)]
    assert all(np.allclose(a, b) for a, b in zip(arrays_of(ours), expected))


def test_float64_replies_to_a_float32_model_are_read_in_the_models_dtype():
    """Flower's result takes the first reply's dtype; bouquet keeps the dtype of the model it sent."""
    models, weights = _random_case(np.random.default_rng(4))
    flower, _ = FedAvg().aggregate_train(1, replies_of(models, weights))
    ours, _ = _aggregate(SeededFedAvg(node_wait_seconds=0), replies_of(models, weights),
                         configured=ArrayRecord([np.zeros((7, 3), dtype=np.float32)] * 4))
    assert all(a.dtype == np.float32 for a in arrays_of(ours))
    assert all(a.dtype == np.float64 for a in arrays_of(flower))
    assert all(np.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(arrays_of(ours), arrays_of(flower)))


def test_integer_replies_to_a_float_model_are_refused_with_the_reason(caplog):
    models, weights = _random_case(np.random.default_rng(5))
    replies = replies_of(models, weights)
    replies[0].content["arrays"] = ArrayRecord([np.ones((7, 3), dtype=np.int64)] * 4)
    with caplog.at_level(logging.WARNING):
        _aggregate(SeededFedAvg(node_wait_seconds=0), replies, configured=ArrayRecord([np.zeros((7, 3))] * 4))
    assert "node 1 excluded: array dtypes differ from the model sent: {'0': 'int64 (sent float64)'" in caplog.text


def test_hk_with_its_default_equal_weights_is_not_fedavg():
    """A documented difference: members count equally in their barycenter (HK paper eq. 15)."""
    models, weights = _random_case(np.random.default_rng(6))
    ours, _ = HKFedAvg(geometry="cosine", tau=-1.0).aggregate_train(1, replies_of(models, weights))
    uniform = [np.mean([m[i] for m in models], axis=0) for i in range(4)]
    flower, _ = FedAvg().aggregate_train(1, replies_of(models, weights))
    assert all(np.allclose(a, b) for a, b in zip(arrays_of(ours), uniform))
    assert not all(np.allclose(a, b) for a, b in zip(arrays_of(ours), arrays_of(flower)))


def test_train_metrics_use_the_function_and_weight_given():
    seen = []

    def custom(records, key):
        seen.append((len(records), key))
        return MetricRecord({"n-replies": len(records)})

    models, weights = _random_case(np.random.default_rng(7))
    replies = replies_of(models, weights, weight_key="n", extra={"loss": 2.0})
    _, metrics = SeededFedAvg(weighted_by_key="n", train_metrics_aggr_fn=custom).aggregate_train(1, replies)
    assert dict(metrics) == {"n-replies": 3} and seen == [(3, "n")]
    _, plain = FedAvg(weighted_by_key="n").aggregate_train(1, replies)
    _, ours = SeededFedAvg(weighted_by_key="n").aggregate_train(1, replies)
    assert dict(ours) == pytest.approx(dict(plain))


def test_evaluate_metrics_aggregate_without_configure_as_flowers():
    replies = [Message(content=RecordDict({"metrics": MetricRecord({"num-examples": n, "mse": v})}),
                       metadata=_metadata(i + 1, "evaluate")) for i, (n, v) in enumerate([(10, 1.0), (30, 3.0)])]
    assert dict(SeededFedAvg().aggregate_evaluate(1, replies)) == dict(FedAvg().aggregate_evaluate(1, replies))


def test_a_sampler_that_chooses_in_configure_says_why_it_needs_it():
    models, weights = _random_case(np.random.default_rng(8))
    with pytest.raises(RuntimeError, match="needs configure_train.*chosen by their sketches"):
        selection_strategy(SCKMSelectSelector(), clients_per_round=2).aggregate_train(1, replies_of(models, weights))
    with pytest.raises(RuntimeError, match="chosen by its losses"):
        ifca_strategy(IFCAParams(k=2), SamplingParams(clients_per_round=2)).aggregate_train(
            1, replies_of(models, weights))


def test_hk_on_updates_needs_the_model_sent_and_says_so():
    models, weights = _random_case(np.random.default_rng(9))
    with pytest.raises(ValueError, match="needs the model each client was sent"):
        HKFedAvg(opinion_space="updates").aggregate_train(1, replies_of(models, weights))
    strategy = HKFedAvg(opinion_space="updates")
    strategy.models.adopt(ArrayRecord([np.zeros((7, 3))] * 4))  # the current model, as FedAvgM's test sets it
    arrays, _ = strategy.aggregate_train(1, replies_of(models, weights))
    assert arrays is not None and all(a.dtype == np.float64 for a in arrays_of(arrays))


# ----------------------------------------------------------------------------- Flower's robust rules
def _vector_replies(rows, weights):
    return replies_of([[np.array(r)] for r in rows], weights)


def test_fedmedian_case():
    rows, weights = [[1.0, 0.2, 0.5, 1.0], [0.2, 0.5, 1.0, 0.2], [0.5, 1.0, 0.2, 0.5]], [5, 2, 9]
    ours, _ = SeededFedMedian().aggregate_train(1, _vector_replies(rows, weights))
    theirs, _ = FedMedian().aggregate_train(1, _vector_replies(rows, weights))
    np.testing.assert_equal(arrays_of(ours)[0], np.array([0.5, 0.5, 0.5, 0.5]))
    assert ours.object_id == theirs.object_id


def test_fedtrimmedavg_cases():
    rows, weights = [[0.5] * 4, [1.0, 0.2, 0.5, 1.0], [0.2, 0.5, 1.0, 0.2], [0.5, 1.0, 0.2, 0.5]], [1, 5, 2, 9]
    ours, _ = SeededFedTrimmedAvg(beta=0.25).aggregate_train(1, _vector_replies(rows, weights))
    theirs, _ = FedTrimmedAvg(beta=0.25).aggregate_train(1, _vector_replies(rows, weights))
    np.testing.assert_equal(arrays_of(ours)[0], np.array([0.5, 0.5, 0.5, 0.5]))
    assert ours.object_id == theirs.object_id
    scalars = _vector_replies([0.5, 1.0, 2.0, 100.0], [1, 1, 1, 1])
    (value,) = arrays_of(SeededFedTrimmedAvg(beta=0.25).aggregate_train(1, scalars)[0])
    assert value.shape == () and value == 1.5


def test_krum_needs_2f_plus_3_replies_where_flowers_takes_any():
    """``multikrum_test``'s 3 replies with f = 1: Flower's Krum picks one; bouquet keeps the model (n < 2f + 3)."""
    rows = [[0.2] * 4, [0.7] * 4, [1.0] * 4]
    theirs, _ = Krum(num_malicious_nodes=1).aggregate_train(1, _vector_replies(rows, [5, 5, 5]))
    np.testing.assert_array_equal(arrays_of(theirs)[0], [0.7] * 4)
    kept = ArrayRecord([np.zeros(4)])
    strategy = SeededKrum(num_malicious_nodes=1)
    strategy.models.adopt(kept)
    ours, _ = strategy.aggregate_train(1, _vector_replies(rows, [5, 5, 5]))
    assert ours.object_id == kept.object_id  # the model stays as it was


@pytest.mark.parametrize(("ours", "theirs"), [
    (lambda: SeededKrum(num_malicious_nodes=1), lambda: Krum(num_malicious_nodes=1)),
    (lambda: SeededMultiKrum(num_malicious_nodes=1, num_nodes_to_select=2),
     lambda: MultiKrum(num_malicious_nodes=1, num_nodes_to_select=2)),
    (lambda: SeededBulyan(num_malicious_nodes=1), lambda: Bulyan(num_malicious_nodes=1)),
], ids=["krum", "multikrum", "bulyan"])
def test_krum_family_with_enough_replies_equals_flowers(ours, theirs):
    rows = [[0.2] * 4, [0.5] * 4, [0.55] * 4, [0.6] * 4, [0.65] * 4, [0.7] * 4, [9.0] * 4]
    weights = [5, 5, 5, 5, 5, 5, 5]
    mine, _ = ours().aggregate_train(1, _vector_replies(rows, weights))
    flower, _ = theirs().aggregate_train(1, _vector_replies(rows, weights))
    assert mine.object_id == flower.object_id


def test_krums_train_metrics_average_every_usable_reply_not_only_the_chosen():
    rows = [[0.2] * 4, [0.5] * 4, [0.55] * 4, [0.6] * 4, [9.0] * 4]
    replies = [flower_reply(i + 1, ArrayRecord([np.array(r)]), 5, extra={"loss": float(i)}) for i, r in enumerate(rows)]
    _, mine = SeededKrum(num_malicious_nodes=1).aggregate_train(1, replies)
    _, flower = Krum(num_malicious_nodes=1).aggregate_train(1, replies)
    assert mine["loss"] == pytest.approx(2.0) and flower["loss"] in (0.0, 1.0, 2.0, 3.0)


def test_bulyan_takes_flowers_selection_rule():
    calls = []

    def first_ones(contents, f, theta):
        calls.append((f, theta))
        return contents[:theta]

    rows = [[0.2] * 4, [0.5] * 4, [0.55] * 4, [0.6] * 4, [0.65] * 4, [0.7] * 4, [9.0] * 4]
    mine, _ = SeededBulyan(num_malicious_nodes=1, selection_rule=first_ones).aggregate_train(
        1, _vector_replies(rows, [5] * 7))
    flower, _ = Bulyan(num_malicious_nodes=1, selection_rule=first_ones).aggregate_train(
        1, _vector_replies(rows, [5] * 7))
    assert calls == [(1, 5), (1, 5)] and mine.object_id == flower.object_id


# ----------------------------------------------------------------------------- a threaded smoke of the hooks
def test_configure_then_aggregate_through_the_hooks_from_two_threads_keeps_rounds_apart():
    """Flower's wrappers drive the hooks; rounds configured before being aggregated stay separate."""
    strategy = SeededFedAvg(clients_per_round=2, node_wait_seconds=0)
    grid = FakeGrid([1, 2], handler=lambda msg: reply_to(msg, RecordDict({
        "arrays": ArrayRecord([np.full(3, float(msg.content["config"]["server-round"]))]),
        "metrics": MetricRecord({"num-examples": 1})})))
    out = {}

    def run(server_round):
        messages = strategy.configure_train(server_round, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid)
        out[server_round] = strategy.aggregate_train(server_round, grid.send_and_receive(messages))[0]

    threads = [threading.Thread(target=run, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert arrays_of(out[1])[0].tolist() == [1.0] * 3 and arrays_of(out[2])[0].tolist() == [2.0] * 3


@pytest.mark.parametrize("make", [lambda: SeededFedAvg(), lambda: HKFedAvg(geometry="cosine", tau=-1.0)],
                         ids=["SeededFedAvg", "HKFedAvg"])
def test_flowers_dp_wrapper_drives_a_drop_in_as_it_drives_fedavg(make):
    """Flower's server-side fixed clipping calls configure_train / aggregate_train on the strategy it wraps."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    def handler(msg):
        node = msg.metadata.dst_node_id
        model = ArrayRecord([np.full(3, float(node)), np.full(2, -float(node))])
        return reply_to(msg, RecordDict({"arrays": model, "metrics": MetricRecord({"num-examples": 8})}))

    start = ArrayRecord([np.zeros(3), np.zeros(2)])
    out = []
    for inner in (make(), FedAvg()):
        dp = DifferentialPrivacyServerSideFixedClipping(inner, noise_multiplier=0.0, clipping_norm=2.0,
                                                        num_sampled_clients=4)
        grid = FakeGrid([1, 2, 3, 4], handler=handler)
        messages = dp.configure_train(1, start, ConfigRecord(), grid)
        out.append(dp.aggregate_train(1, grid.send_and_receive(messages))[0])
    assert all(np.allclose(a, b) for a, b in zip(arrays_of(out[0]), arrays_of(out[1])))
    assert np.linalg.norm(np.concatenate(arrays_of(out[0]))) <= 2.0 + 1e-9  # every update was clipped


def test_several_metric_records_are_read_by_the_first_not_refused():
    models, weights = _random_case(np.random.default_rng(10))
    replies = replies_of(models, weights)
    replies[0].content["more-metrics"] = MetricRecord({"loss": 0.3})
    with pytest.raises(InconsistentMessageReplies):
        FedAvg().aggregate_train(1, replies)
    ours, _ = SeededFedAvg().aggregate_train(1, replies)
    expected = [np.average([m[i] for m in models], axis=0, weights=weights) for i in range(4)]
    assert all(np.allclose(a, b) for a, b in zip(arrays_of(ours), expected))


def test_an_evaluation_reply_without_the_weight_is_left_out_not_fatal(caplog):
    replies = [Message(content=RecordDict({"metrics": MetricRecord(metrics)}), metadata=_metadata(i + 1, "evaluate"))
               for i, metrics in enumerate([{"num-examples": 10, "mse": 1.0}, {"mse": 5.0}])]
    with pytest.raises(InconsistentMessageReplies):
        FedAvg().aggregate_evaluate(1, replies)
    with caplog.at_level(logging.WARNING):
        metrics = SeededFedAvg().aggregate_evaluate(1, replies)
    assert dict(metrics) == {"mse": 1.0} and "evaluation reply of node 2 excluded" in caplog.text
