"""The attack harness: who attacks, what attackers send (math), the server side with real Messages, the client side."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from bouquet.algorithms.attacks import DEFAULT_SCALES, AttackParams, alie, attacker_share, attackers, ipm, poison_update
from bouquet.config import AppConfig, ConfigError
from bouquet.params import ParamError
from bouquet.server_app import build_strategy
from bouquet.strategies import BouquetStrategy, SamplingParams, UniformSampler, WeightedMean
from bouquet.strategies.attacks import AttackHarness
from bouquet.strategies.hooks import RecorderObserver
from bouquet.strategies.rounds import TrainRound
from tests.flower_fakes import ListRecorder, make_message, reply

# ------------------------------------------------------------------ math


def test_attackers_are_a_seeded_exact_share():
    drawn = attackers(20, 0.2, seed=0)
    assert len(drawn) == 4 and drawn <= set(range(20))
    assert attackers(20, 0.2, seed=0) == drawn  # every node and the server agree
    assert attackers(20, 0.2, seed=1) != drawn
    assert attackers(20, 0.0, seed=0) == frozenset() and len(attackers(7, 0.3, seed=3)) == 2
    assert attackers(20, 0.1, seed=0) <= attackers(20, 0.3, seed=0)  # a prefix of one permutation
    with pytest.raises(ValueError, match="fraction"):
        attackers(10, 1.0, seed=0)
    with pytest.raises(ValueError, match="num_partitions"):
        attackers(0, 0.1, seed=0)


def test_model_attacks_hand_cases():
    u = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(poison_update(u, "sign-flip", 1.0, rng), -u)
    np.testing.assert_array_equal(poison_update(u, "sign-flip", 5.0, rng), -5 * u)
    np.testing.assert_array_equal(poison_update(u, "scale", 10.0, rng), 10 * u)
    np.testing.assert_array_equal(poison_update(u, "same-value", 2.0, rng), [2.0, 2.0, 2.0])
    assert poison_update(u, "scale", 3.0, rng).dtype == np.float32
    with pytest.raises(ValueError, match="not a model attack"):
        poison_update(u, "alie", 1.0, rng)


def test_gaussian_noise_has_s_times_the_updates_size_and_is_seeded():
    u = np.random.default_rng(1).normal(0, 0.3, size=20_000)
    noise = poison_update(u, "gaussian", 2.0, np.random.default_rng(5))
    assert np.sqrt(np.mean(noise ** 2)) == pytest.approx(2.0 * np.sqrt(np.mean(u ** 2)), rel=0.03)
    np.testing.assert_array_equal(noise, poison_update(u, "gaussian", 2.0, np.random.default_rng(5)))
    assert abs(np.corrcoef(noise, u)[0, 1]) < 0.05  # it carries nothing of the update


def test_alie_and_ipm_hand_cases():
    honest = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    np.testing.assert_allclose(alie(honest, 1.5), [8.5, 9.5, 10.5])  # mean 4..6 + 1.5 x std 3 (ddof 1)
    np.testing.assert_allclose(ipm(honest, 2.0), [-8.0, -10.0, -12.0])
    with pytest.raises(ValueError, match="at least 2"):
        alie(honest[:1], 1.5)
    with pytest.raises(ValueError, match="at least 1"):
        ipm(np.zeros((0, 3)), 1.0)


def test_attacker_share_hand_cases():
    models = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 4.0]])
    flags = np.array([False, False, True])
    weights = np.array([1.0, 3.0, 1.0])
    # honest mean (weights 1, 3): [1.5, 0]; attackers' mean [10, 4]
    assert attacker_share(models, weights, flags, [1.5, 0.0]) == pytest.approx(0.0)
    assert attacker_share(models, weights, flags, [10.0, 4.0]) == pytest.approx(1.0)
    assert attacker_share(models, weights, flags, weights @ models / 5) == pytest.approx(0.2)  # FedAvg: 1 of 5
    # the paper's eq. 16 with the attacker a coalition of its own: 1/K = 1/2 (uniform barycenters, equal weights)
    assert attacker_share(models, np.ones(3), flags, (models[:2].mean(0) + models[2]) / 2) == pytest.approx(0.5)
    # the orthogonal part of the aggregate does not count
    assert attacker_share(models, weights, flags, [1.5 + 0.5 * 8.5 - 4, 0.5 * 4 + 8.5]) == pytest.approx(0.5)
    assert np.isnan(attacker_share(models, weights, np.zeros(3, bool), [0.0, 0.0]))
    assert np.isnan(attacker_share(np.ones((3, 2)), weights, flags, [1.0, 1.0]))  # the means coincide
    with pytest.raises(ValueError, match="do not match"):
        attacker_share(models, weights[:2], flags, [0.0, 0.0])
    with pytest.raises(ValueError, match="non-negative"):
        attacker_share(models, -weights, flags, [0.0, 0.0])


def test_attacker_share_of_any_weighted_mean_is_the_attackers_weight():
    rng = np.random.default_rng(3)
    for _ in range(20):
        s, d = rng.integers(3, 12), rng.integers(2, 50)
        models, weights = rng.normal(size=(s, d)), rng.uniform(0.1, 5, size=s)
        flags = np.zeros(s, bool)
        flags[rng.choice(s, rng.integers(1, s), replace=False)] = True
        mixing = rng.uniform(0, 1, size=s)  # any non-negative weights, uniform within each group's weighting
        mixing[flags] = weights[flags] * mixing[flags].mean()
        mixing[~flags] = weights[~flags] * mixing[~flags].mean()
        mixing /= mixing.sum()
        assert attacker_share(models, weights, flags, mixing @ models) == pytest.approx(mixing[flags].sum())


@pytest.mark.parametrize("kwargs, field, message", [
    ({"attack": "nuke"}, "attack", "must be one of"),
    ({"attack": "scale", "fraction": 1.0}, "fraction", r"in \[0, 1\)"),
    ({"attack": "none", "fraction": 0.2}, "fraction", "name the attack"),
    ({"attack": "scale", "scale": -1.0}, "scale", "finite number > 0"),
])
def test_attack_params_name_the_field(kwargs, field, message):
    with pytest.raises(ParamError, match=message) as error:
        AttackParams(**kwargs)
    assert error.value.field == field


def test_strength_defaults_per_attack():
    assert AttackParams("alie", 0.2).strength == DEFAULT_SCALES["alie"] == 1.5
    assert AttackParams("scale", 0.2, scale=3.0).strength == 3.0
    assert not AttackParams().active and AttackParams("ipm", 0.1).active

# ------------------------------------------------------------------ server side, real Messages


def _vector(values):
    return ArrayRecord({"w": Array(np.asarray(values, dtype=np.float32))})


def _round(inner, attack, flags, updates, sent):
    replies = [reply(i + 1, _vector(np.asarray(sent) + u), info={"partition-id": i, "household": "",
                                                              **({"attacker": True} if f else {})})
               for i, (u, f) in enumerate(zip(updates, flags))]
    recorder = ListRecorder()
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams()), aggregator=AttackHarness(inner, attack),
                               hooks=[RecorderObserver(recorder)])
    nodes = tuple(r.metadata.src_node_id for r in replies)
    arrays, _ = strategy.aggregate_train_round(
        TrainRound(1, nodes, {n: _vector(sent) for n in nodes}, ConfigRecord(), ()), replies)
    return arrays["w"].numpy(), recorder.rounds[-1][2]


def test_alie_forges_every_attackers_model_from_the_honest_updates():
    honest = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    updates = [*honest, [50.0, 50.0], [-9.0, 3.0]]  # what the attackers trained does not matter
    sent = [10.0, 20.0]
    result, logged = _round(WeightedMean(), AttackParams("alie", 0.4), [0, 0, 0, 1, 1], updates, sent)
    forged = alie(honest, 1.5)
    expected = np.asarray(sent) + (honest.sum(axis=0) + 2 * forged) / 5  # equal num-examples: plain mean
    np.testing.assert_allclose(result, expected, rtol=1e-6)
    assert logged["attackers"] == 2 and logged["attacker-nodes"] == [4, 5]


def test_the_harness_reports_the_attackers_share_and_the_oracle_drops_them():
    updates = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-3.0, 0.0]]
    result, logged = _round(WeightedMean(), AttackParams("sign-flip", 0.25), [0, 0, 0, 1], updates, [0.0, 0.0])
    np.testing.assert_allclose(result, [0.0, 0.0], atol=1e-7)  # (1 + 1 + 1 - 3) / 4
    assert logged["attacker-share"] == pytest.approx(0.25) and "oracle-dropped" not in logged
    result, logged = _round(WeightedMean(), AttackParams("sign-flip", 0.25, oracle=True), [0, 0, 0, 1], updates,
                            [0.0, 0.0])
    np.testing.assert_allclose(result, [1.0, 0.0], rtol=1e-6)
    assert logged["attacker-share"] == pytest.approx(0.0, abs=1e-9) and logged["oracle-dropped"] == 1
    _, logged = _round(WeightedMean(), AttackParams("sign-flip", 0.25), [0, 0, 0, 0], updates, [0.0, 0.0])
    assert logged["attacker-share"] is None and logged["attackers"] == 0  # no attacker this round


def test_ipm_turns_the_mean_against_the_honest_direction():
    honest = np.tile([1.0, 0.5], (6, 1)) + np.random.default_rng(0).normal(0, 0.01, size=(6, 2))
    result, _ = _round(WeightedMean(), AttackParams("ipm", 0.4, scale=8.0), [0] * 6 + [1] * 4,
                       [*honest, *np.zeros((4, 2))], [0.0, 0.0])
    assert result @ honest.mean(axis=0) < 0  # 4 of 10 at -8 x mean outweigh 6 honest


def test_client_side_attacks_are_only_counted():
    updates = [[1.0, 1.0], [1.0, 1.0], [-5.0, -5.0]]
    result, logged = _round(WeightedMean(), AttackParams("sign-flip", 0.3), [0, 0, 1], updates, [0.0, 0.0])
    np.testing.assert_allclose(result, [-1.0, -1.0], rtol=1e-6)  # the replies as sent: (1 + 1 - 5) / 3
    assert logged["attackers"] == 1


def test_the_app_wraps_its_aggregator_only_in_attacked_runs():
    assert not isinstance(build_strategy(AppConfig()).aggregator, AttackHarness)
    config = AppConfig.from_run_config({"strategy": "krum", "attack": "alie", "attack-fraction": 0.2,
                                        "robust-num-malicious-nodes": 2})
    harness = build_strategy(config).aggregator
    assert isinstance(harness, AttackHarness) and harness.inner.rule == "krum"
    assert "Attack: alie, 20% of the partitions, s=1.5" in harness.describe()[-1]


@pytest.mark.parametrize("run_config, key, message", [
    ({"attack": "label-flip", "attack-fraction": 0.2}, "attack", "poisons the vision task's data"),
    ({"task": "vision", "attack": "target-shift", "attack-fraction": 0.2}, "attack", "poisons the water task"),
    ({"attack": "scale", "attack-fraction": 1.0}, "attack-fraction", "must be in"),
    ({"attack-fraction": 0.3}, "attack-fraction", "name the attack"),
])
def test_bad_attack_keys_name_the_key(run_config, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        AppConfig.from_run_config(run_config)
    assert f"run-config {key!r}" in str(error.value)

# ------------------------------------------------------------------ client side (the ClientApp's handler)

SMALL = {"synthetic-households": 4, "active-factor": 0.0, "local-epochs": 1}


def _train(run_config, partition):
    from bouquet.client_app import train
    from bouquet.tasks.water import LSTMForecaster

    torch.manual_seed(0)
    sent = ArrayRecord(LSTMForecaster(8, 1).state_dict())
    content = RecordDict({"arrays": sent, "config": ConfigRecord({"server-round": 1})})
    context = Context(run_id=1, node_id=partition + 1, node_config={"partition-id": partition, "num-partitions": 4},
                      state=RecordDict(), run_config={**SMALL, "hidden-size": 8, **run_config})
    answer = train(make_message(content, "train", partition + 1, "1"), context)
    return sent, answer.content


def test_an_attacking_client_flips_its_update_and_says_so():
    (target,) = attackers(4, 0.25, seed=0)
    sent, honest = _train({}, target)
    _, attacked = _train({"attack": "sign-flip", "attack-fraction": 0.25}, target)
    assert attacked["info"]["attacker"] is True and "attacker" not in honest["info"]  # no column unless attacked
    for name in sent:
        theta = sent[name].numpy()
        np.testing.assert_allclose(attacked["arrays"][name].numpy() - theta, -(honest["arrays"][name].numpy() - theta),
                                   rtol=1e-5, atol=1e-7)
    other = next(p for p in range(4) if p != target)
    _, bystander = _train({"attack": "sign-flip", "attack-fraction": 0.25}, other)
    assert bystander["info"]["attacker"] is False


def test_a_target_shift_attacker_trains_on_moved_targets():
    (target,) = attackers(4, 0.25, seed=0)
    _, honest = _train({}, target)
    _, shifted = _train({"attack": "target-shift", "attack-fraction": 0.25, "attack-scale": 3.0}, target)
    assert shifted["info"]["attacker"] is True
    assert shifted["metrics"]["train-loss"] > 2 * honest["metrics"]["train-loss"]  # targets 3 scaled units away
    assert shifted["arrays"]["head.bias"].numpy()[0] > honest["arrays"]["head.bias"].numpy()[0]  # pulled upwards


def test_attacks_need_the_federations_size_on_the_node():
    from bouquet.client_app import train

    content = RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord({"server-round": 1})})
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                      run_config={**SMALL, "attack": "scale", "attack-fraction": 0.5})
    with pytest.raises(KeyError, match="num-partitions"):
        train(make_message(content, "train", 1, "1"), context)
