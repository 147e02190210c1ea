"""PollingTransport: the exchange through push / pull with a short interval, the timeout, and the window; the
strategy and its queries send through their transport."""

import pytest
from flwr.app import ConfigRecord, RecordDict

from bouquet.config import AppConfig, ConfigError
from bouquet.transport import PollingTransport, TransportParams
from tests.flower_fakes import make_message, reply_to


class PullGrid:
    """Replies to each pushed message after ``delays[node]`` pulls (None: never); counts pulls."""

    def __init__(self, delays):
        self.delays = delays
        self.pending = {}
        self.pulls = 0

    def get_node_ids(self):
        return sorted(self.delays)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            self.pending[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        out = []
        for mid in list(message_ids):
            msg = self.pending[mid]
            delay = self.delays[msg.metadata.dst_node_id]
            if delay is not None and self.pulls >= delay:
                out.append(reply_to(msg, RecordDict({"ok": ConfigRecord({"node": msg.metadata.dst_node_id})})))
                del self.pending[mid]
        return out


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def _messages(nodes):
    return [make_message(RecordDict({"config": ConfigRecord({})}), "query.ping", n, "") for n in nodes]


def test_replies_are_pulled_every_poll_until_all_are_in():
    inner, clock = PullGrid({1: 1, 2: 3, 3: 2}), FakeClock()
    grid, transport = inner, PollingTransport(TransportParams(poll=0.1), clock=clock, sleep=clock.sleep)
    replies = transport.exchange(grid, _messages([1, 2, 3]), 10)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2, 3]
    assert inner.pulls == 3 and clock.sleeps == [0.1, 0.1]  # Flower's gRPC Grid would have slept 3 s twice
    assert grid.get_node_ids() == [1, 2, 3]  # everything else is the wrapped Grid's


def test_a_silent_node_costs_the_timeout_and_no_more():
    inner, clock = PullGrid({1: 1, 2: None}), FakeClock()
    grid, transport = inner, PollingTransport(TransportParams(poll=0.4), clock=clock, sleep=clock.sleep)
    replies = transport.exchange(grid, _messages([1, 2]), 1.0)
    assert [r.metadata.src_node_id for r in replies] == [1]
    assert clock.sleeps == pytest.approx([0.4, 0.6]) and clock.now == pytest.approx(1.0)  # empty pull: x1.5
    for bad, match in [({"poll": 0}, "poll"), ({"poll": 1, "max_poll": 0.5}, "max_poll"),
                       ({"backoff": 0.9}, "backoff"), ({"retries": -1}, "retries"),
                       ({"max_in_flight": -1}, "max-in-flight")]:
        with pytest.raises(ValueError, match=match):
            TransportParams(**bad)
    with pytest.raises(TypeError, match="TransportParams"):
        PollingTransport({"poll": 0.1})


def test_empty_pulls_back_off_to_the_cap_and_a_reply_resets_the_wait():
    inner, clock = PullGrid({1: 2, 2: 12}), FakeClock()
    grid, transport = inner, PollingTransport(TransportParams(poll=0.1, max_poll=0.5, backoff=2.0), clock=clock,
                                              sleep=clock.sleep)
    replies = transport.exchange(grid, _messages([1, 2]), 60)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2] and inner.pulls == 12
    # pull 1 empty -> 0.2; pull 2 brings node 1 -> 0.1; then empty pulls: 0.2, 0.4, 0.5 (the cap), 0.5, ...
    assert clock.sleeps == pytest.approx([0.2, 0.1, 0.2, 0.4] + [0.5] * 7)


class FlakyGrid(PullGrid):
    """A PullGrid whose pulls raise ``failures`` times in a row first (as a SuperLink answering HTTP 500)."""

    def __init__(self, delays, failures):
        super().__init__(delays)
        self.failures = failures

    def pull_messages(self, message_ids):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Server error '500 Internal Server Error' for url '.../pull-messages'")
        return super().pull_messages(message_ids)


def test_failed_pulls_are_retried_and_raised_after_too_many_in_a_row(caplog):
    clock = FakeClock()
    grid, transport = FlakyGrid({1: 1}, failures=3), PollingTransport(TransportParams(retries=3), clock=clock, sleep=clock.sleep)
    with caplog.at_level("WARNING", logger="bouquet.transport"):
        replies = transport.exchange(grid, _messages([1]), 60)
    assert [r.metadata.src_node_id for r in replies] == [1]
    assert "pulling 1 replies failed (RuntimeError: Server error '500" in caplog.text and "3 of 3" in caplog.text
    grid, transport = FlakyGrid({1: 1}, failures=4), PollingTransport(TransportParams(retries=3), clock=clock, sleep=clock.sleep)
    with pytest.raises(RuntimeError, match="500"):
        transport.exchange(grid, _messages([1]), 60)


class WindowGrid:
    """Replies to a message ``delays[node]`` pulls after it was pushed (None: never); records what was pushed."""

    def __init__(self, delays):
        self.delays = delays
        self.pending = {}  # message id -> (message, pull count at its push)
        self.pulls = 0
        self.batches = []
        self.most_pending = 0

    def push_messages(self, messages):
        self.batches.append([m.metadata.dst_node_id for m in messages])
        for msg in messages:
            self.pending[msg.metadata.message_id] = (msg, self.pulls)
        self.most_pending = max(self.most_pending, len(self.pending))
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids):
        self.pulls += 1
        out = []
        for mid in list(message_ids):
            msg, pushed_at = self.pending[mid]
            delay = self.delays[msg.metadata.dst_node_id]
            if delay is not None and self.pulls - pushed_at >= delay:
                out.append(reply_to(msg, RecordDict({"ok": ConfigRecord({"node": msg.metadata.dst_node_id})})))
                del self.pending[mid]
        return out


def test_a_window_keeps_at_most_max_in_flight_unanswered_and_returns_the_same_replies():
    delays = {1: 1, 2: 3, 3: 1, 4: 2, 5: 1}
    everything = WindowGrid(delays)
    clock = FakeClock()
    everything_replies = PollingTransport(TransportParams(), clock=clock, sleep=clock.sleep).exchange(
        everything, _messages([1, 2, 3, 4, 5]), 60)
    assert everything.batches == [[1, 2, 3, 4, 5]] and everything.most_pending == 5  # max-in-flight = 0: Flower's way
    windowed, clock = WindowGrid(delays), FakeClock()
    replies = PollingTransport(TransportParams(max_in_flight=2), clock=clock, sleep=clock.sleep).exchange(
        windowed, _messages([1, 2, 3, 4, 5]), 60)
    assert windowed.most_pending == 2
    # pull 1: node 1 answers -> 3 is pushed; pull 2: 3 -> 4; pull 3: 2 (its 3rd pull) -> 5; pull 4: 4 and 5
    assert windowed.batches == [[1, 2], [3], [4], [5]] and windowed.pulls == 4
    assert sorted(r.metadata.src_node_id for r in replies) == sorted(r.metadata.src_node_id for r in everything_replies)
    arrived = [r.metadata.src_node_id for r in replies]  # arrival order differs from the push order: users sort
    assert arrived[:3] == [1, 3, 2] and set(arrived[3:]) == {4, 5}  # (4 and 5 come in one pull, in set order)


def test_messages_the_window_had_not_sent_by_the_timeout_are_lost_and_logged(caplog):
    inner, clock = WindowGrid({1: 1, 2: None, 3: 1}), FakeClock()
    grid, transport = inner, PollingTransport(TransportParams(poll=0.5, max_in_flight=1), clock=clock,
                                              sleep=clock.sleep)
    with caplog.at_level("WARNING", logger="bouquet.transport"):
        replies = transport.exchange(grid, _messages([1, 2, 3]), 2.0)
    assert [r.metadata.src_node_id for r in replies] == [1] and inner.batches == [[1], [2]]
    assert clock.now == pytest.approx(2.0)
    assert "1 of 3 messages were not sent" in caplog.text and "max-in-flight = 1" in caplog.text


def test_max_in_flight_is_a_run_config_key_that_resumes_freely():
    from bouquet.checkpoint import RESUME_FREE_KEYS

    assert AppConfig().transport == TransportParams()
    assert AppConfig.from_run_config({"max-in-flight": 64}).transport.max_in_flight == 64
    with pytest.raises(ConfigError, match="max-in-flight"):
        AppConfig.from_run_config({"max-in-flight": -3})
    assert "max-in-flight" in RESUME_FREE_KEYS  # it changes when messages are sent, not what comes back


def test_the_strategy_its_queries_and_the_final_evaluation_send_through_its_transport():
    """Every message of a run goes through the strategy's transport: identity queries, training, evaluation,
    a sampler's sketch queries and the final evaluation on every node (no proxy Grid in between)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, MetricRecord

    from bouquet.algorithms.selection import SCKMSelectSelector
    from bouquet.serving.task import evaluate_every_node
    from bouquet.strategies import BouquetStrategy, SamplingParams, SketchSelection
    from bouquet.transport import FlowerTransport
    from tests.flower_fakes import FakeGrid, arrays

    class Counting(FlowerTransport):
        def __init__(self):
            self.types = []

        def exchange(self, grid, messages, timeout):
            messages = list(messages)
            self.types += sorted({m.metadata.message_type for m in messages})
            return super().exchange(grid, messages, timeout)

    rng = np.random.default_rng(0)

    def handler(msg):
        kind = msg.metadata.message_type
        if kind.startswith("query.sketch"):
            return reply_to(msg, RecordDict({
                "sketch": ArrayRecord({"values": Array(rng.normal(size=8).astype(np.float32))}),
                "sketch-info": ConfigRecord({"loss": 1.0, "num-examples": 1, "layer-sizes": [8]})}))
        if kind == "train":
            return reply_to(msg, RecordDict({"arrays": msg.content["arrays"],
                                             "metrics": MetricRecord({"num-examples": 1})}))
        return reply_to(msg, RecordDict({"metrics": MetricRecord({"num-examples": 1}),
                                         "info": ConfigRecord({"partition-id": msg.metadata.dst_node_id})}))

    keys = {100 + i: i for i in range(4)}
    grid, transport = FakeGrid(sorted(keys), keys=keys, handler=handler), Counting()
    strategy = BouquetStrategy(sampler=SketchSelection(SCKMSelectSelector(), SamplingParams(
        clients_per_round=2, seed=0, identify_nodes=True)), hooks=(), message_factory=make_message,
        transport=transport)
    strategy.start(grid, arrays(0.0), num_rounds=1)
    assert transport.types[0] == "query.identify" and "train" in transport.types and "evaluate" in transport.types
    assert any(t.startswith("query.sketch") for t in transport.types)
    before = len(transport.types)
    rows = evaluate_every_node(grid, strategy.serve(grid), timeout=5, new_message=make_message, transport=transport)
    assert transport.types[before:] == ["evaluate"] and len(rows) == 4
