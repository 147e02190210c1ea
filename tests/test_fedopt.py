"""Server optimisers: FedOpt's step by hand, equal to Flower's FedAdam / FedYogi / FedAdagrad on the same replies,
and the ServerOptimizer part (state through a checkpoint-style round trip, a resumed strategy = an uninterrupted one)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedYogi

from bouquet.algorithms.fedopt import ServerOptParams, fedopt_step
from bouquet.strategies import BouquetStrategy, SamplingParams, UniformSampler, WeightedMean
from bouquet.strategies.rounds import ClientUpdates
from bouquet.strategies.server_opt import ServerOptimizer
from bouquet.strategies.state import ServerState
from tests.flower_fakes import FakeGrid, make_message, reply


def test_one_adam_step_by_hand():
    params = ServerOptParams("adam", learning_rate=0.1, beta_1=0.9, beta_2=0.99, tau=0.001)
    new, m, v = fedopt_step({"w": np.array([1.0, 2.0])}, {"w": np.array([1.5, 1.0])}, None, None, params, 1)
    delta = np.array([0.5, -1.0])
    np.testing.assert_allclose(m["w"], 0.1 * delta)
    np.testing.assert_allclose(v["w"], 0.01 * delta**2)
    eta = 0.1 * np.sqrt(1 - 0.99**2) / (1 - 0.9**2)  # Flower's bias correction, with round t = 1
    np.testing.assert_allclose(new["w"], [1.0, 2.0] + eta * m["w"] / (np.sqrt(v["w"]) + 0.001))


def test_yogi_and_adagrad_second_moments_by_hand():
    current, aggregate = {"w": np.array([0.0])}, {"w": np.array([2.0])}
    yogi = ServerOptParams("yogi", learning_rate=1.0, beta_1=0.0, beta_2=0.5, tau=1.0)
    _, _, v = fedopt_step(current, aggregate, None, {"w": np.array([1.0])}, yogi, 3)
    assert v["w"][0] == pytest.approx(1.0 - 0.5 * 4.0 * np.sign(1.0 - 4.0))  # 3.0: v grows towards delta^2
    adagrad = ServerOptParams("adagrad", learning_rate=1.0, beta_1=0.0, tau=1.0)
    new, m, v = fedopt_step(current, aggregate, None, {"w": np.array([5.0])}, adagrad, 3)
    assert v["w"][0] == 9.0 and m["w"][0] == 2.0 and new["w"][0] == pytest.approx(2.0 / 4.0)


def test_counters_pass_through_and_bad_input_is_refused():
    params = ServerOptParams("adam")
    new, m, _ = fedopt_step({"w": np.zeros(2, np.float32), "n": np.array([3])},
                            {"w": np.ones(2, np.float32), "n": np.array([4])}, None, None, params, 1)
    assert new["n"][0] == 4 and "n" not in m and new["w"].dtype == np.float32
    with pytest.raises(ValueError, match="differ from the current"):
        fedopt_step({"w": np.zeros(2)}, {"x": np.zeros(2)}, None, None, params, 1)
    with pytest.raises(ValueError, match="shape"):
        fedopt_step({"w": np.zeros(2)}, {"w": np.zeros(3)}, None, None, params, 1)
    with pytest.raises(ValueError, match="needs a server optimizer"):
        fedopt_step({"w": np.zeros(2)}, {"w": np.zeros(2)}, None, None, ServerOptParams(), 1)


def _record(values):
    return ArrayRecord({"w": Array(np.asarray(values, dtype=np.float32)), "b": Array(np.asarray([values[0]], np.float32))})


@pytest.mark.parametrize("flower_cls, name", [(FedAdam, "adam"), (FedYogi, "yogi"), (FedAdagrad, "adagrad")])
def test_the_step_is_flowers_fedopt_on_the_same_replies(flower_cls, name):
    """Three rounds of Flower's strategy and of bouquet's part on the same replies give the same models."""
    rng = np.random.default_rng(0)
    if name == "adagrad":  # Flower's FedAdagrad has no momentum (beta_1 = 0)
        flower = flower_cls(eta=0.05, tau=1e-3)
    else:
        flower = flower_cls(eta=0.05, beta_1=0.9, beta_2=0.99, tau=1e-3)
    params = ServerOptParams(name, learning_rate=0.05, beta_1=0.0 if name == "adagrad" else 0.9, beta_2=0.99,
                             tau=1e-3)
    ours = ServerOptimizer(WeightedMean(), params)
    current = _record([0.1, -0.2, 0.3])
    mine = {k: v.numpy() for k, v in current.items()}
    for server_round in (1, 2, 3):
        # what Flower's configure_train keeps of the arrays it sends (its sampling needs a running SuperLink)
        flower.current_arrays = {k: v.numpy() for k, v in current.items()}
        models = [_record(current["w"].numpy() + rng.normal(0, 0.1, 3)) for _ in range(2)]
        replies = [reply(node, m, examples=n) for node, m, n in zip((1, 2), models, (10, 30))]
        expected, _ = flower.aggregate_train(server_round, replies)
        updates = ClientUpdates(server_round, 0, (1, 2), tuple({k: v.numpy() for k, v in m.items()} for m in models),
                                (10.0, 30.0), (mine, mine))
        got = ours.aggregate(updates).model
        for key in ("w", "b"):
            np.testing.assert_allclose(got[key], expected[key].numpy(), rtol=2e-6, atol=1e-7)
        current = expected
        mine = got
    assert set(ours.state_dict()) == {"m", "v"}


def test_the_optimizer_state_goes_through_a_checkpoint_and_resumes_to_the_same_model():
    params = ServerOptParams("yogi", learning_rate=0.05)

    def strategy():
        return BouquetStrategy(sampler=UniformSampler(SamplingParams(seed=0, min_available_nodes=2)),
                               aggregator=ServerOptimizer(WeightedMean(), params), hooks=(),
                               message_factory=make_message)

    def train_round(s, grid, server_round):
        configured = s.configure_train_round(server_round, ConfigRecord(), grid)
        replies = [reply(m.metadata.dst_node_id, _record(m.content["arrays"]["w"].numpy() + 0.1 * m.metadata.dst_node_id),
                         examples=10) for m in configured.messages]
        s.aggregate_train_round(configured, replies)
        s.server_round = server_round

    grid = FakeGrid([1, 2, 3], keys={1: 0, 2: 1, 3: 2})
    whole = strategy()
    whole.models.adopt(_record([0.0, 0.0, 0.0]))
    for r in (1, 2, 3):
        train_round(whole, grid, r)
    first = strategy()
    first.models.adopt(_record([0.0, 0.0, 0.0]))
    for r in (1, 2):
        train_round(first, grid, r)
    saved = ServerState.from_records(first.state().to_records())  # through Flower records
    moments = saved.parts["ServerOptimizer"]
    assert set(moments) == {"m", "v"}
    kept = first.aggregator.state_dict()
    for moment in ("m", "v"):  # the arrays come back as arrays, bit for bit and in their dtype
        for key, array in kept[moment].items():
            assert moments[moment][key].dtype == array.dtype
            np.testing.assert_array_equal(moments[moment][key], array)
    resumed = strategy()
    resumed.load_state(saved)
    train_round(resumed, grid, 3)
    for key in ("w", "b"):
        np.testing.assert_array_equal(resumed.models.shared[key].numpy(), whole.models.shared[key].numpy())
    plain = BouquetStrategy(aggregator=WeightedMean(), hooks=())
    with pytest.raises(ValueError, match="the state of ServerOptimizer, which this strategy's aggregator does not"):
        plain.load_state(saved)


def test_a_checkpoint_written_when_the_moments_stood_apart_still_resumes(tmp_path):
    """Checkpoints written before the parts' state had one form kept a server optimiser's moments in their own
    ``aggregator:<moment>`` groups; restoring one puts them back where the part now reads them."""
    from flwr.serverapp.strategy import Result

    from bouquet.checkpoint import latest_checkpoint, read_checkpoint, write_checkpoint
    from bouquet.strategies.checkpoints import restore, save_checkpoint

    params = ServerOptParams("adam", learning_rate=0.05)
    grid = FakeGrid([1, 2, 3], keys={1: 0, 2: 1, 3: 2})

    def strategy():
        return BouquetStrategy(sampler=UniformSampler(SamplingParams(seed=0, min_available_nodes=2,
                                                                     identify_nodes=True)),
                               aggregator=ServerOptimizer(WeightedMean(), params), hooks=(),
                               message_factory=make_message)

    first = strategy()
    first.models.adopt(_record([0.0, 0.0, 0.0]))
    first.nodes.order(grid, grid.get_node_ids())
    configured = first.configure_train_round(1, ConfigRecord(), grid)
    first.aggregate_train_round(configured, [reply(m.metadata.dst_node_id, _record([0.1, 0.2, 0.3]), examples=10)
                                             for m in configured.messages])
    first.server_round = 1
    new = read_checkpoint(save_checkpoint(first.state(), Result(), tmp_path / "new", {}))
    moments = first.aggregator.state_dict()
    meta = {**new.meta, "state": {**new.meta["state"], "parts": {}}}  # the old layout: no parts, moments apart
    models = {**new.models, **{f"aggregator:{k}": dict(v) for k, v in moments.items()}}
    write_checkpoint(tmp_path / "old", 1, meta, models)
    resumed = strategy()
    restore(resumed, grid, latest_checkpoint(tmp_path / "old"))
    for moment in ("m", "v"):
        for key, array in moments[moment].items():
            np.testing.assert_array_equal(resumed.aggregator.state_dict()[moment][key], array)
