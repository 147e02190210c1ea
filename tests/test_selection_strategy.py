"""Sketch-based selection as a sampler part, with real Flower Messages: query, failures, piggyback, composition."""

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.error import Error

from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.sckm import layer_coordinate_weights, sckm_select
from bouquet.algorithms.selection import (
    FedCorSelector,
    RandomSelector,
    SCKMClusterSelector,
    SCKMSelectSelector,
)
from bouquet.strategies import (
    BouquetStrategy,
    Coalitions,
    HKRule,
    RecorderObserver,
    SamplingParams,
    SelectionParams,
    SketchSelection,
    selection_strategy,
)
from bouquet.strategies.rounds import RoundContext
from bouquet.strategies.sampling import NodeOrder
from tests.flower_fakes import FakeGrid, ListRecorder, arrays, make_message, reply, reply_to

LAYERS = [3, 2]


def sketch_content(values, loss=1.0, examples=10):
    return RecordDict({"sketch": ArrayRecord({"values": Array(np.asarray(values, dtype=np.float32))}),
                       "sketch-info": ConfigRecord({"loss": loss, "num-examples": examples, "layer-sizes": LAYERS})})


class QueryGrid(FakeGrid):
    """Answers query.sketch messages from a table; nodes in ``fail`` error out, in ``silent`` never answer."""

    def __init__(self, sketches, fail=(), silent=(), tamper=None):
        super().__init__(sorted(sketches), handler=self.answer)
        self.sketches, self.fail, self.silent, self.tamper = sketches, set(fail), set(silent), tamper or {}

    def answer(self, msg):
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type != "query.sketch" or node in self.silent:
            return None
        if node in self.fail:
            return reply_to(msg, error=Error(code=1, reason="battery low"))
        return reply_to(msg, sketch_content(self.tamper.get(node, self.sketches[node]), loss=float(node)))


def _table(k=8, seed=0):
    g = np.random.default_rng(seed).normal(size=(k, sum(LAYERS))).astype(np.float32)
    return {100 + i: g[i] for i in range(k)}, g.astype(np.float64)


def sampler(selector, budget, seed=0, **selection):
    return SketchSelection(selector, SamplingParams(clients_per_round=budget, seed=seed), SelectionParams(**selection))


def context(grid, server_round=1):
    return RoundContext(server_round, grid, NodeOrder(0.0, make_message), arrays(0.0), make_message)


def test_query_phase_selects_what_sckm_select_picks_on_the_same_sketches():
    table, g = _table()
    part = sampler(SCKMSelectSelector(), 3, seed=5)
    grid = QueryGrid(table)
    sample = part.sample_train(context(grid, 2))
    weighted = g * layer_coordinate_weights(g, LAYERS, "normalized")
    expected = sckm_select(weighted, 3, np.random.default_rng([5, 2]), last_round=np.full(8, -1))
    assert list(sample.node_ids) == sorted(100 + int(i) for i in expected)
    # every candidate got the global model and the same round seed
    assert {m.metadata.message_type for m in grid.sent} == {"query.sketch"}
    assert {tuple(m.content["config"]["sketch-seed"]) for m in grid.sent} == {(5, 2)}
    assert all("arrays" in m.content.array_records for m in grid.sent)
    report = sample.report
    assert report["candidates"] == 8 and sorted(report["selected"]) == list(sample.node_ids)
    assert report["sketch-bytes"] == 8 * 5 * 4 and report["model-bytes"] == 9 * 4
    assert len(sample.rows) == 8 and sum(r["selected"] for r in sample.rows) == 3
    assert sample.summary.startswith("sckm-select selected 3 of 8 candidates")


def test_failed_and_silent_nodes_are_never_selected_and_are_named(caplog):
    table, _ = _table()
    part = sampler(SCKMSelectSelector(), 6)
    with caplog.at_level("WARNING"):
        sample = part.sample_train(context(QueryGrid(table, fail=[101], silent=[102])))
    assert 101 not in sample.node_ids and 102 not in sample.node_ids and len(sample.node_ids) == 6
    assert "node 101 failed: error reply: battery low" in caplog.text
    assert "node 102 did not answer" in caplog.text
    assert part.state.history[-1]["query-failed"] == [101, 102]


def test_the_strategy_trains_only_the_selected_nodes_and_records_the_choice():
    table, _ = _table()
    recorder = ListRecorder()
    strategy = BouquetStrategy(sampler=sampler(SCKMClusterSelector(), 4), hooks=[RecorderObserver(recorder)],
                               message_factory=make_message)
    plan = strategy.configure_train_round(1, ConfigRecord({"lr": 0.1}), QueryGrid(table))
    assert set(plan.node_ids) == set(strategy.history[-1]["selected"]) and len(plan.node_ids) == 4
    assert all(m.metadata.message_type == "train" for m in plan.messages)
    assert "sketch-seed" not in plan.config  # query mode: no piggyback request
    (_, phase, logged), = recorder.rounds
    assert phase == "select" and "cluster-labels" not in logged and "cluster-labels" in strategy.history[-1]
    assert len(recorder.rows["selection"]) == 8


def test_random_selector_needs_no_query():
    table, _ = _table()
    grid = QueryGrid(table)
    assert len(sampler(RandomSelector(), 3).sample_train(context(grid)).node_ids) == 3 and grid.sent == []


def _train_reply(node, value, sketch=None):
    msg = reply(node, arrays(value))
    if sketch is None:
        return msg
    content = RecordDict({**dict(msg.content.items()), **dict(sketch_content(sketch).items())})
    return Message(content=content, metadata=msg.metadata)


def _piggyback(selector, budget=3, max_sketch_age=2):
    strategy = BouquetStrategy(sampler=sampler(selector, budget, mode="piggyback", max_sketch_age=max_sketch_age),
                               message_factory=make_message)
    strategy.models.adopt(arrays(0.0))
    return strategy


def _round(strategy, grid, server_round, table, value=0.0):
    plan = strategy.configure_train_round(server_round, ConfigRecord(), grid)
    replies = [_train_reply(n, value + i, table[n]) for i, n in enumerate(plan.node_ids)]
    return plan, strategy.aggregate_train_round(plan, replies)


def test_piggyback_explores_unseen_nodes_first_then_scores_stored_sketches():
    table, _ = _table(k=6)
    strategy = _piggyback(SCKMSelectSelector())
    grid = FakeGrid(sorted(table))
    plan, (result, _) = _round(strategy, grid, 1, table)
    first = set(plan.node_ids)
    assert tuple(plan.config["sketch-seed"]) == (0,)  # fixed coordinates across rounds
    np.testing.assert_allclose(result["w"].numpy(), 1.0)  # mean of 0, 1, 2 (equal num-examples): sketches ignored
    assert set(strategy.sampler.state.known) == first
    plan, _ = _round(strategy, grid, 2, table)  # the 3 unexplored nodes go first
    assert set(plan.node_ids) == set(table) - first
    plan = strategy.configure_train_round(3, ConfigRecord(), grid)  # all explored: the selector ranks the sketches
    assert len(plan.node_ids) == 3 and strategy.history[-1]["explored"] == 0
    strategy.configure_train_round(6, ConfigRecord(), grid)  # round-1 sketches are older than max_sketch_age = 2
    assert strategy.history[-1]["explored"] == 3


@dataclass(frozen=True)
class ObservingSelector(RandomSelector):
    """Random selection whose state is the list of candidates whose losses it was shown (as FedCor learns)."""

    needs: ClassVar[tuple[str, ...]] = ("losses",)

    def initial_state(self):
        return ()

    def observe(self, state, candidates):
        return (*state, sorted(candidates.ids))


def test_piggyback_shows_each_stored_loss_to_the_selector_once():
    table, _ = _table(k=6)
    strategy = _piggyback(ObservingSelector(), max_sketch_age=5)
    grid = FakeGrid(sorted(table))
    first, _ = _round(strategy, grid, 1, table)
    second, _ = _round(strategy, grid, 2, table)  # the unexplored three
    strategy.configure_train_round(3, ConfigRecord(), grid)
    strategy.configure_train_round(4, ConfigRecord(), grid)  # nobody trained in round 3: nothing new to learn from
    assert strategy.sampler.state.selector == (sorted(first.node_ids), sorted(second.node_ids), [])


def test_selection_state_survives_a_checkpoint_and_the_next_choice_is_the_same():
    table, _ = _table(k=8)
    grid = FakeGrid(sorted(table))
    original = _piggyback(FedCorSelector(warmup=1), budget=3, max_sketch_age=9)
    for server_round in (1, 2, 3, 4):
        _round(original, grid, server_round, table, value=float(server_round))
    saved = json.loads(json.dumps(original.sampler.state_dict()))
    copy = _piggyback(FedCorSelector(warmup=1), budget=3, max_sketch_age=9)
    copy.sampler.load_state_dict(saved)
    copy.nodes.load_state_dict(original.nodes.state_dict())
    assert copy.sampler.state.selector == original.sampler.state.selector
    assert copy.configure_train_round(5, ConfigRecord(), grid).node_ids == \
        original.configure_train_round(5, ConfigRecord(), grid).node_ids


def test_composes_with_hk_aggregation_and_validates():
    strategy = selection_strategy(SCKMSelectSelector(), Coalitions(HKRule(HKParams(tau=0.5))), clients_per_round=2)
    assert strategy.aggregator.rule.params.tau == 0.5 and strategy.sampler.selector == SCKMSelectSelector()
    with pytest.raises(ValueError, match="mode"):
        selection_strategy(SCKMSelectSelector(), clients_per_round=2, mode="push")
    with pytest.raises(ValueError, match="budget"):
        SketchSelection(SCKMSelectSelector(), SamplingParams())


def test_malformed_sketch_reply_is_refused(caplog):
    table, _ = _table(k=4)
    grid = QueryGrid(table, tamper={100: [np.nan] * 5, 101: [1.0] * 4})
    with caplog.at_level("WARNING"):
        sample = sampler(SCKMSelectSelector(), 2).sample_train(context(grid))
    assert list(sample.node_ids) == [102, 103]
    assert "non-finite" in caplog.text and "do not add up" in caplog.text


def test_metrics_record_of_a_reply_with_a_sketch_is_still_one():
    # the sketch travels in a ConfigRecord, so Flower's one-MetricRecord rule holds for training replies
    msg = _train_reply(1, 1.0, [0.0] * 5)
    assert len(msg.content.metric_records) == 1 and isinstance(msg.content["metrics"], MetricRecord)


def test_selection_goes_in_front_of_any_drop_in_and_keeps_the_rest_of_it():
    """``selection_strategy(selector, SeededFedProx(...))``: the selector chooses, FedProx's proximal term, its
    seed and evaluation settings stay; a drop-in that draws its own clients, or a setting given twice, is
    refused."""
    from bouquet.algorithms.clustered import IFCAParams
    from bouquet.strategies import SeededFedProx, ifca_strategy

    table, _ = _table()
    fedprox = SeededFedProx(fraction_evaluate=0.5, proximal_mu=0.1, seed=7)
    strategy = selection_strategy(SCKMClusterSelector(), fedprox, clients_per_round=3)
    strategy.new_message = make_message
    assert isinstance(strategy.sampler, SketchSelection) and strategy.aggregator is fedprox.aggregator
    assert strategy.sampler.sampling.seed == 7 and strategy.sampler.sampling.fraction_evaluate == 0.5
    plan = strategy.configure_train_round(1, ConfigRecord(), QueryGrid(table))
    assert len(plan.node_ids) == 3 and set(plan.node_ids) == set(strategy.history[-1]["selected"])
    assert all(m.content["config"]["proximal-mu"] == 0.1 for m in plan.messages)
    with pytest.raises(ValueError, match="set seed on the SeededFedProx"):
        selection_strategy(SCKMClusterSelector(), fedprox, clients_per_round=3, seed=1)
    ifca = ifca_strategy(IFCAParams(k=2), SamplingParams(clients_per_round=4))
    with pytest.raises(TypeError, match="chooses its clients itself"):
        selection_strategy(SCKMClusterSelector(), ifca, clients_per_round=3)
