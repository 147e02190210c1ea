"""sketch-source = "local-update": every candidate trains, a selector picks whose updates are aggregated."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from bouquet.algorithms.sckm import sckm_eta, sketch_indices
from bouquet.algorithms.selection import PowerOfChoiceSelector, RandomSelector, SCKMSelectSelector
from bouquet.config import AppConfig, ConfigError
from bouquet.server_app import build_strategy
from bouquet.strategies.aggregation import WeightedMean
from bouquet.strategies.hooks import RecorderObserver
from bouquet.strategies.params import SamplingParams
from bouquet.strategies.rounds import ClientUpdates, TrainRound
from bouquet.strategies.sampling import UniformSampler
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.strategies.update_selection import UpdateSelection, update_sketches
from tests.flower_fakes import ListRecorder, reply


def _model(a, b):
    return {"a": np.asarray(a, dtype=np.float32), "b": np.asarray(b, dtype=np.float32)}


def test_update_sketches_are_the_deltas_on_the_shared_coordinates():
    sent = _model(np.arange(400.0).reshape(20, 20), [1.0, 2.0])
    rng = np.random.default_rng(0)
    models = tuple(_model(sent["a"] + rng.normal(size=(20, 20)), sent["b"] + rng.normal(size=2)) for _ in range(3))
    updates = ClientUpdates(4, 7, (1, 2, 3), models, (1.0, 1.0, 1.0), (sent,) * 3)
    sketches, sizes = update_sketches(updates, 0.05)
    a_pick, b_pick = sketch_indices([400, 2], 0.05, [7, 4])  # the clients' coordinates for round 4, seed 7
    assert sizes == [20, 1] == [len(a_pick), len(b_pick)]
    for row, model in enumerate(models):
        delta = np.concatenate([(model["a"] - sent["a"]).ravel()[a_pick], (model["b"] - sent["b"])[b_pick]])
        np.testing.assert_allclose(sketches[row], delta, rtol=1e-5, atol=1e-5)


def _round(selector, budget, deltas):
    sent = np.zeros(len(deltas[0]), dtype=np.float32)
    replies = [reply(i + 1, ArrayRecord({"w": Array((sent + np.asarray(d)).astype(np.float32))}),
                     info={"partition-id": i, "household": ""}) for i, d in enumerate(deltas)]
    recorder = ListRecorder()
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams()),
                               aggregator=UpdateSelection(WeightedMean(), selector, budget, 1.0),
                               hooks=[RecorderObserver(recorder)])
    nodes = tuple(r.metadata.src_node_id for r in replies)
    arrays, _ = strategy.aggregate_train_round(
        TrainRound(1, nodes, {n: ArrayRecord({"w": Array(sent)}) for n in nodes}, ConfigRecord(), ()), replies)
    return arrays["w"].numpy(), recorder.rounds[-1][2]


def test_sckm_keeps_the_top_eta_updates_and_only_they_are_averaged():
    deltas = np.random.default_rng(1).normal(size=(6, 8))
    result, logged = _round(SCKMSelectSelector(layer_combine="concat"), 2, deltas)
    top = np.argsort(-sckm_eta(deltas))[:2]  # one tensor, fraction 1: the sketch is the whole update
    np.testing.assert_allclose(result, deltas[top].mean(axis=0), rtol=1e-5, atol=1e-6)
    assert logged["updates-trained"] == 6 and logged["updates-aggregated"] == 2
    assert logged["update-nodes"] == sorted(int(i) + 1 for i in top)
    assert len(logged["update-eta-selected"]) == 2


def test_with_no_more_updates_than_the_budget_all_are_aggregated():
    deltas = np.array([[1.0, 0.0], [0.0, 1.0]])
    result, logged = _round(RandomSelector(), 3, deltas)
    np.testing.assert_allclose(result, [0.5, 0.5], rtol=1e-6)
    assert logged["updates-aggregated"] == 2


def test_update_selection_refuses_what_replies_do_not_carry():
    with pytest.raises(ValueError, match="needs losses"):
        UpdateSelection(WeightedMean(), PowerOfChoiceSelector(), 2, 0.005)
    with pytest.raises(ValueError, match="budget"):
        UpdateSelection(WeightedMean(), RandomSelector(), 0, 0.005)


def test_the_app_trains_every_candidate_and_selects_updates():
    config = AppConfig.from_run_config({"sketch-source": "local-update", "selection": "sckm-select",
                                        "clients-per-round": 5, "candidates-per-round": 8})
    strategy = build_strategy(config)
    assert isinstance(strategy.aggregator, UpdateSelection) and strategy.aggregator.budget == 5
    assert strategy.sampler.sampling.clients_per_round == 8  # the candidates train
    assert not isinstance(build_strategy(AppConfig()).aggregator, UpdateSelection)


@pytest.mark.parametrize("run_config, key", [
    ({"selection": "power-of-choice"}, "selection"),
    ({"selection": "sckm-select", "selection-mode": "piggyback"}, "selection-mode"),
    ({"candidates-per-round": 3, "clients-per-round": 5}, "candidates-per-round"),
    ({"strategy": "ifca"}, "strategy"),
    ({"sketch-source": "gradient"}, "sketch-source"),
])
def test_bad_local_update_configs_name_the_key(run_config, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        AppConfig.from_run_config({"sketch-source": "local-update", **run_config})
