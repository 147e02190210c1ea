"""PollingGrid: the exchange through push / pull with a short interval, and the timeout."""

import pytest
from flwr.app import ConfigRecord, RecordDict

from bouquet.grid import PollingGrid
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
    grid = PollingGrid(inner, poll=0.1, clock=clock, sleep=clock.sleep)
    replies = grid.send_and_receive(_messages([1, 2, 3]), timeout=10)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2, 3]
    assert inner.pulls == 3 and clock.sleeps == [0.1, 0.1]  # Flower's gRPC Grid would have slept 3 s twice
    assert grid.get_node_ids() == [1, 2, 3]  # everything else is the wrapped Grid's


def test_a_silent_node_costs_the_timeout_and_no_more():
    inner, clock = PullGrid({1: 1, 2: None}), FakeClock()
    grid = PollingGrid(inner, poll=0.4, clock=clock, sleep=clock.sleep)
    replies = grid.send_and_receive(_messages([1, 2]), timeout=1.0)
    assert [r.metadata.src_node_id for r in replies] == [1]
    assert clock.sleeps == pytest.approx([0.4, 0.6]) and clock.now == pytest.approx(1.0)  # empty pull: x1.5
    for bad, match in [({"poll": 0}, "poll"), ({"poll": 1, "max_poll": 0.5}, "max_poll"),
                       ({"backoff": 0.9}, "backoff"), ({"retries": -1}, "retries")]:
        with pytest.raises(ValueError, match=match):
            PollingGrid(inner, **bad)


def test_empty_pulls_back_off_to_the_cap_and_a_reply_resets_the_wait():
    inner, clock = PullGrid({1: 2, 2: 12}), FakeClock()
    grid = PollingGrid(inner, poll=0.1, max_poll=0.5, backoff=2.0, clock=clock, sleep=clock.sleep)
    replies = grid.send_and_receive(_messages([1, 2]), timeout=60)
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
    grid = PollingGrid(FlakyGrid({1: 1}, failures=3), retries=3, clock=clock, sleep=clock.sleep)
    with caplog.at_level("WARNING", logger="bouquet.grid"):
        replies = grid.send_and_receive(_messages([1]), timeout=60)
    assert [r.metadata.src_node_id for r in replies] == [1]
    assert "pulling 1 replies failed (RuntimeError: Server error '500" in caplog.text and "3 of 3" in caplog.text
    grid = PollingGrid(FlakyGrid({1: 1}, failures=4), retries=3, clock=clock, sleep=clock.sleep)
    with pytest.raises(RuntimeError, match="500"):
        grid.send_and_receive(_messages([1]), timeout=60)
