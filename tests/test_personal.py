"""Personalisation parts: where personal state lives (hand cases of its history rule), the ClientApp with real
Messages (fine-tuning, personal head, Ditto, a node that restarts), and bad input."""

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from bouquet.checkpoint import CheckpointParams
from bouquet.config import AppConfig, ConfigError
from bouquet.personal_state import (
    STATE_ARRAYS,
    PersonalRun,
    Version,
    load_personal,
    personal_dir,
    pick_version,
    save_personal,
    versions_to_keep,
)
from bouquet.tasks.params import PersonalParams
from tests.flower_fakes import make_message

V = Version


def test_pick_version_follows_the_runs_history_by_hand():
    versions = [V(2, 0), V(5, 0), V(7, 0), V(6, 1), V(9, 1)]
    assert pick_version(versions, (), 4) == V(2, 0)
    assert pick_version(versions, (), 1) is None  # nothing trained yet
    # resumed after round 5: attempt 0's round 7 belongs to a history that was repeated
    assert pick_version(versions, (5,), 5) == V(5, 0)
    assert pick_version(versions, (5,), 6) == V(6, 1)
    assert pick_version(versions, (5,), 8) == V(6, 1)
    assert pick_version(versions, (5,), 9) == V(9, 1)
    # resumed again after round 6: attempt 1's round 9 is gone too, and attempt 0 counts up to 5 only
    assert pick_version(versions, (5, 6), 20) == V(6, 1)
    assert pick_version(versions, (5, 4), 20) == V(2, 0)  # the second resume went back before round 5
    assert pick_version([V(3, 0), V(3, 1)], (3,), 3) == V(3, 1)  # the same round: the later attempt


def test_versions_to_keep_are_the_current_one_and_those_a_resume_could_read():
    versions = [V(r, 0) for r in (1, 2, 4, 6, 7)]
    every = CheckpointParams(every=1, keep=2)
    assert versions_to_keep(versions, (), 7, every, 10) == {V(7, 0), V(6, 0)}
    sparse = CheckpointParams(every=3, keep=2)  # checkpoints after rounds 3 and 6 are kept at round 7
    assert versions_to_keep(versions, (), 7, sparse, 10) == {V(7, 0), V(6, 0), V(2, 0)}
    never = CheckpointParams(every=0)
    assert versions_to_keep(versions, (), 7, never, 10) == {V(7, 0)}


def _context(tmp_path, partition=0, state=None, run_config=None):
    return Context(run_id=1, node_id=partition + 1,
                   node_config={"partition-id": partition, "num-partitions": 4,
                                "personal-state-dir": str(tmp_path / "personal")},
                   state=state if state is not None else RecordDict(), run_config=run_config or {})


def test_personal_state_lives_in_the_context_and_survives_a_node_restart(tmp_path):
    run = PersonalRun("abc123")
    context = _context(tmp_path)
    every = CheckpointParams(every=1, keep=1)
    assert load_personal(context, run, 1) is None
    save_personal(context, run, 1, {"w": np.array([1.0, 2.0])}, every, 10)
    save_personal(context, run, 3, {"w": np.array([3.0, 4.0])}, every, 10)
    assert STATE_ARRAYS in context.state.array_records
    np.testing.assert_array_equal(load_personal(context, run, 3)["w"], [3.0, 4.0])
    folder = personal_dir(context, run)
    assert sorted(p.name for p in folder.iterdir()) == ["a0-r00003.npz"]  # keep=1: round 1 is no longer needed
    restarted = _context(tmp_path)  # a new SuperNode process: empty context, the same disk
    np.testing.assert_array_equal(load_personal(restarted, run, 5)["w"], [3.0, 4.0])
    other_run = PersonalRun("zzz")
    assert load_personal(context, other_run, 5) is None  # another run's state is never read
    with pytest.raises(ValueError, match="plain name"):
        PersonalRun("../escape")
    assert PersonalRun.from_config({"personal-run": "k", "personal-lineage": "4,9"}) == PersonalRun("k", (4, 9))
    assert PersonalRun.from_config({}) is None


SMALL = {"synthetic-households": 40, "active-factor": 0.0, "local-epochs": 1, "hidden-size": 8,
         "forecaster": "improved", "validation-fraction": 0.2, "num-server-rounds": 3}


def _send(handler, context, arrays, server_round, extra=None, run="runkey"):
    config = {"server-round": server_round, **({"personal-run": run, "personal-lineage": ""} if run else {}),
              **(extra or {})}
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(config)})
    return handler(make_message(content, handler.__name__, 1, "1"), context).content


def _served(config):
    from bouquet.tasks.water import LSTMForecaster

    torch.manual_seed(0)
    model = LSTMForecaster.from_params(config.water_model, config.water_data.input_channels)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)  # a head away from zero: the personal and served heads differ after training
    return ArrayRecord(model.state_dict())


def test_a_personal_head_never_leaves_the_node_and_is_used_to_evaluate(tmp_path):
    from bouquet.client_app import evaluate, train

    run_config = {**SMALL, "personal-layers": "head", "strategy": "fedavg"}
    context = _context(tmp_path, run_config=run_config)
    served = _served(AppConfig.from_run_config(run_config))
    reply = _send(train, context, served, 1)
    for name in ("head.weight", "head.bias"):  # the reply carries the head it was sent
        np.testing.assert_array_equal(reply["arrays"][name].numpy(), served[name].numpy())
    assert not np.array_equal(reply["arrays"]["lstm.weight_hh_l0"].numpy(), served["lstm.weight_hh_l0"].numpy())
    own = context.state.array_records[STATE_ARRAYS]
    assert sorted(own) == ["head.bias", "head.weight"]
    assert not np.array_equal(own["head.bias"].numpy(), served["head.bias"].numpy())
    # evaluation with the personal head differs from the served model's; a node that never trained uses the served
    with_head = _send(evaluate, context, served, 1)["metrics"]
    fresh = _send(evaluate, _context(tmp_path / "other", run_config=run_config), served, 1)["metrics"]
    assert with_head["val-mae-litres"] != fresh["val-mae-litres"]
    assert "val-mae-litres" in with_head and with_head["val-num-examples"] > 0
    # restarted node: the head comes back from disk and gives the same evaluation
    restarted = _context(tmp_path, run_config=run_config)
    assert _send(evaluate, restarted, served, 1)["metrics"]["val-mae-litres"] == with_head["val-mae-litres"]


def test_ditto_keeps_a_personal_model_pulled_toward_the_served_one(tmp_path):
    from bouquet.client_app import evaluate, train

    def personal_after(ditto_lambda):
        run_config = {**SMALL, "ditto-lambda": ditto_lambda, "strategy": "fedavg", "local-epochs": 5}
        context = _context(tmp_path / str(ditto_lambda), run_config=run_config)
        served = _served(AppConfig.from_run_config(run_config))
        reply = _send(train, context, served, 1)
        own = {k: v.numpy() for k, v in context.state.array_records[STATE_ARRAYS].items()}
        distance = np.sqrt(sum(np.sum((own[k] - served[k].numpy()) ** 2) for k in own))
        return context, served, reply, own, distance

    context, served, reply, own, loose = personal_after(0.001)
    _, _, _, _, tight = personal_after(100.0)
    assert tight < loose  # a larger lambda keeps the personal model closer to the served one
    plain = {k: v.numpy() for k, v in reply["arrays"].items()}
    assert any(not np.array_equal(plain[k], own[k]) for k in own)  # the federated update is another model
    evaluated = _send(evaluate, context, served, 1)["metrics"]
    other = _send(evaluate, _context(tmp_path / "x", run_config=context.run_config), served, 1)["metrics"]
    assert evaluated["val-mae-litres"] != other["val-mae-litres"]  # the personal model, not the served one


def test_fine_tuning_changes_the_evaluated_model_and_is_deterministic(tmp_path):
    from bouquet.client_app import evaluate

    base = {**SMALL, "strategy": "fedavg"}
    served = _served(AppConfig.from_run_config(base))
    plain = _send(evaluate, _context(tmp_path, run_config=base), served, 2, run=None)["metrics"]
    tuned_config = {**base, "personalize-epochs": 3, "personalize-learning-rate": 0.01}
    tuned = _send(evaluate, _context(tmp_path, run_config=tuned_config), served, 2, run=None)["metrics"]
    again = _send(evaluate, _context(tmp_path, run_config=tuned_config), served, 2, run=None)["metrics"]
    assert tuned["val-mae-litres"] != plain["val-mae-litres"] and tuned["val-mae-litres"] == again["val-mae-litres"]


def test_stateful_personalisation_needs_the_run_named_by_the_server(tmp_path):
    from bouquet.client_app import train

    run_config = {**SMALL, "personal-layers": "head", "strategy": "fedavg"}
    with pytest.raises(ValueError, match="names no run"):
        _send(train, _context(tmp_path, run_config=run_config), _served(AppConfig.from_run_config(run_config)), 1,
              run=None)


@pytest.mark.parametrize("overrides, match", [
    ({"ditto-lambda": -0.1}, "ditto-lambda must be >= 0"),
    ({"personal-layers": "body"}, "personal-layers must be one of none, head"),
    ({"personalize-epochs": -1}, "personalize-epochs must be >= 0"),
    ({"personalize-learning-rate": 0.0}, "personalize-learning-rate must be > 0"),
    ({"ditto-lambda": 0.5, "personal-layers": "head"}, "choose one"),
    ({"personalize-epochs": 2, "task": "vision"}, "'personalize-epochs': personalisation is not implemented for the vision task"),
    ({"ditto-lambda": 1.0, "strategy": "perfedavg-fo"}, "'ditto-lambda': Per-FedAvg personalises"),
    ({"personal-layers": "head", "strategy": "local"}, "'personal-layers': with strategy 'local'"),
    ({"server-optimizer": "adam", "strategy": "ifca"}, "'server-optimizer': it steps the shared model"),
    ({"server-optimizer": "sgd"}, "server-optimizer must be one of none, adam, yogi, adagrad"),
    ({"server-beta-1": 1.0}, "server-beta-1 must be in"),
    ({"forecast-baseline": "household", "household-inputs": "profile"}, "set validation-fraction > 0"),
    ({"forecast-baseline": "weekday-mean"}, "'forecast-baseline': 'weekday-mean' reads the household's weekday mean"),
    ({"validation-fraction": 0.7}, "'validation-fraction'"),
])
def test_bad_personalisation_keys_stop_the_run_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        AppConfig.from_run_config(overrides)


def test_personal_params_flags():
    assert not PersonalParams().active
    assert PersonalParams(epochs=2).active and not PersonalParams(epochs=2).stateful
    assert PersonalParams(layers="head").stateful and PersonalParams(ditto_lambda=0.1).stateful
    assert dataclasses.replace(PersonalParams(), state_dir="/x").state_dir == "/x"
