"""The selection mixin with real Flower Messages: query phase, failures, piggyback, composition."""

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.app.error import Error

from bouquet.algorithms.sckm import layer_coordinate_weights, sckm_select
from bouquet.algorithms.selection import (
    RandomSelector,
    SCKMClusterSelector,
    SCKMSelectSelector,
)
from bouquet.strategies.base import SeededFedAvg
from bouquet.strategies.hk import HKFedAvg
from bouquet.strategies.selection import selecting, selection_strategy
from tests.flower_fakes import FakeGrid, ListRecorder, arrays, reply

LAYERS = [3, 2]


pytestmark = pytest.mark.usefixtures("server_identity")


def _metadata(node, kind):
    return Metadata(run_id=1, message_id=f"q{node}", src_node_id=node, dst_node_id=0, reply_to_message_id=f"i{node}",
                    group_id="1", created_at=0.0, ttl=60.0, message_type=kind)


def sketch_reply(node, values, loss=1.0, examples=10, kind="query.sketch"):
    content = RecordDict({"sketch": ArrayRecord({"values": Array(np.asarray(values, dtype=np.float32))}),
                          "sketch-info": ConfigRecord({"loss": loss, "num-examples": examples,
                                                       "layer-sizes": LAYERS})})
    return Message(content=content, metadata=_metadata(node, kind))


class QueryGrid(FakeGrid):
    """Answers query.sketch messages from a table; nodes in ``fail`` error out, in ``silent`` never answer."""

    def __init__(self, sketches, fail=(), silent=()):
        super().__init__(sorted(sketches))
        self.sketches, self.fail, self.silent, self.sent = sketches, set(fail), set(silent), []

    def send_and_receive(self, messages, timeout=None):
        if any(m.metadata.message_type == "query.identify" for m in messages):
            return self.identify_replies(messages)
        out = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            if node in self.silent:
                continue
            if node in self.fail:
                out.append(Message(error=Error(code=1, reason="battery low"), metadata=_metadata(node, "query.sketch")))
            else:
                out.append(sketch_reply(node, self.sketches[node], loss=float(node)))
        return out


def _table(k=8, seed=0):
    g = np.random.default_rng(seed).normal(size=(k, sum(LAYERS))).astype(np.float32)
    return {100 + i: g[i] for i in range(k)}, g.astype(np.float64)


def test_query_phase_selects_what_sckm_select_picks_on_the_same_sketches():
    table, g = _table()
    recorder = ListRecorder()
    strategy = selection_strategy(SCKMSelectSelector(), SeededFedAvg, clients_per_round=3, seed=5, recorder=recorder)
    strategy._sent_arrays = arrays(0.0)
    grid = QueryGrid(table)
    selected = strategy.sample_nodes(grid, 2, 3)
    weighted = g * layer_coordinate_weights(g, LAYERS, "normalized")
    expected = sckm_select(weighted, 3, np.random.default_rng([5, 2]), last_round=np.full(8, -1))
    assert selected == sorted(100 + int(i) for i in expected)
    # every candidate got the global model and the same round seed
    assert {m.metadata.message_type for m in grid.sent} == {"query.sketch"}
    assert {tuple(m.content["config"]["sketch-seed"]) for m in grid.sent} == {(5, 2)}
    assert all("arrays" in m.content.array_records for m in grid.sent)
    (_, phase, logged), = recorder.rounds
    assert phase == "select" and logged["candidates"] == 8 and sorted(logged["selected"]) == selected
    assert logged["sketch-bytes"] == 8 * 5 * 4 and logged["model-bytes"] == 9 * 4
    rows = recorder.rows["selection"]
    assert len(rows) == 8 and sum(r["selected"] for r in rows) == 3


def test_failed_and_silent_nodes_are_never_selected_and_are_named(caplog):
    table, _ = _table()
    strategy = selection_strategy(SCKMSelectSelector(), SeededFedAvg, clients_per_round=6)
    strategy._sent_arrays = arrays(0.0)
    with caplog.at_level("WARNING"):
        selected = strategy.sample_nodes(QueryGrid(table, fail=[101], silent=[102]), 1, 6)
    assert 101 not in selected and 102 not in selected and len(selected) == 6
    assert "node 101 failed: error reply: battery low" in caplog.text
    assert "node 102 did not answer" in caplog.text
    assert strategy.history[-1]["query-failed"] == [101, 102]


def test_configure_train_sends_only_to_the_selected_nodes():
    table, _ = _table()
    strategy = selection_strategy(SCKMClusterSelector(), SeededFedAvg, clients_per_round=4)
    messages = list(strategy.configure_train(1, arrays(0.0), ConfigRecord({"lr": 0.1}), QueryGrid(table)))
    train_targets = {m.metadata.dst_node_id for m in messages}
    assert train_targets == set(strategy.history[-1]["selected"]) and len(train_targets) == 4
    assert all(m.metadata.message_type == "train" for m in messages)
    assert "sketch-seed" not in messages[0].content["config"]  # query mode: no piggyback request


def test_random_selector_needs_no_query():
    table, _ = _table()
    grid = QueryGrid(table)
    strategy = selection_strategy(RandomSelector(), SeededFedAvg, clients_per_round=3)
    strategy._sent_arrays = arrays(0.0)
    assert len(strategy.sample_nodes(grid, 1, 3)) == 3 and grid.sent == []


def _train_reply(node, value, sketch=None):
    msg = reply(node, arrays(value))
    if sketch is None:
        return msg
    content = RecordDict({**dict(msg.content.items()),
                          **dict(sketch_reply(node, sketch, kind="train").content.items())})
    return Message(content=content, metadata=msg.metadata)


def test_piggyback_explores_unseen_nodes_first_then_scores_stored_sketches():
    table, _ = _table(k=6)
    strategy = selection_strategy(SCKMSelectSelector(), SeededFedAvg, clients_per_round=3, mode="piggyback",
                                  max_sketch_age=2)
    grid = FakeGrid(sorted(table))
    messages = list(strategy.configure_train(1, arrays(0.0), ConfigRecord(), grid))
    first = sorted(m.metadata.dst_node_id for m in messages)
    assert tuple(messages[0].content["config"]["sketch-seed"]) == (0,)  # fixed coordinates across rounds
    # the trained nodes piggyback their sketches; the model average ignores the sketch records
    replies = [_train_reply(n, float(i), table[n]) for i, n in enumerate(first)]
    result, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(result["w"].numpy(), 1.0)  # mean of 0, 1, 2 (equal num-examples)
    assert set(strategy.known) == set(first)
    # round 2: the 3 unexplored nodes go first
    second = strategy.sample_nodes(grid, 2, 3)
    assert set(second) == set(table) - set(first)
    strategy.aggregate_train(2, [_train_reply(n, 0.0, table[n]) for n in second])
    # round 3: all explored, so the selector ranks the stored sketches
    third = strategy.sample_nodes(grid, 3, 3)
    assert len(third) == 3 and strategy.history[-1]["explored"] == 0
    # round 6: sketches of round 1 are older than max_sketch_age = 2 -> explored again first
    sixth = strategy.sample_nodes(grid, 6, 3)
    assert set(sixth) <= set(table) and strategy.history[-1]["explored"] == 3


class ObservingSelector(RandomSelector):
    """Random selection that records which candidates' losses it was shown (as FedCor learns from them)."""

    needs = ("losses",)

    def __init__(self):
        self.observed = []

    def observe(self, candidates):
        self.observed.append(sorted(candidates.ids))


def test_piggyback_shows_each_stored_loss_to_the_selector_once():
    table, _ = _table(k=6)
    selector = ObservingSelector()
    strategy = selection_strategy(selector, SeededFedAvg, clients_per_round=3, mode="piggyback", max_sketch_age=5)
    grid = FakeGrid(sorted(table))
    first = sorted(m.metadata.dst_node_id for m in strategy.configure_train(1, arrays(0.0), ConfigRecord(), grid))
    strategy.aggregate_train(1, [_train_reply(n, 0.0, table[n]) for n in first])
    second = strategy.sample_nodes(grid, 2, 3)  # the unexplored three
    strategy.aggregate_train(2, [_train_reply(n, 0.0, table[n]) for n in second])
    strategy.sample_nodes(grid, 3, 3)
    strategy.sample_nodes(grid, 4, 3)  # nobody trained in round 3: nothing new to learn from
    assert selector.observed == [first, sorted(second), []]


def test_composes_with_hk_aggregation_and_validates():
    cls = selecting(HKFedAvg)
    assert cls is selecting(HKFedAvg) and issubclass(cls, HKFedAvg)
    strategy = cls(selector=SCKMSelectSelector(), clients_per_round=2, geometry="cosine", tau=0.5)
    assert strategy.params.tau == 0.5
    with pytest.raises(ValueError, match="mode"):
        selection_strategy(SCKMSelectSelector(), clients_per_round=2, mode="push")
    with pytest.raises(ValueError, match="budget"):
        selection_strategy(SCKMSelectSelector(), clients_per_round=None)
    with pytest.raises(TypeError, match="SeededFedAvg"):
        selecting(dict)


def test_malformed_sketch_reply_is_refused(caplog):
    table, _ = _table(k=4)

    class BadGrid(QueryGrid):
        def send_and_receive(self, messages, timeout=None):
            out = super().send_and_receive(messages, timeout)
            out[0] = sketch_reply(out[0].metadata.src_node_id, [np.nan] * 5)
            out[1] = sketch_reply(out[1].metadata.src_node_id, [1.0] * 4)
            return out

    strategy = selection_strategy(SCKMSelectSelector(), SeededFedAvg, clients_per_round=2)
    strategy._sent_arrays = arrays(0.0)
    with caplog.at_level("WARNING"):
        selected = strategy.sample_nodes(BadGrid(table), 1, 2)
    assert selected == [102, 103]
    assert "non-finite" in caplog.text and "do not add up" in caplog.text


def test_metrics_record_of_a_reply_with_a_sketch_is_still_one():
    # the sketch travels in a ConfigRecord, so Flower's one-MetricRecord rule holds for training replies
    msg = _train_reply(1, 1.0, [0.0] * 5)
    assert len(msg.content.metric_records) == 1 and isinstance(msg.content["metrics"], MetricRecord)
