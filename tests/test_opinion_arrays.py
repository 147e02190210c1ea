"""HK on some of the model's arrays (``hk-opinion-arrays``): which columns, the coalitions they give, whole
models still averaged, through Flower Messages, and bad input named."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.memory import MemoryParams
from bouquet.config import AppConfig, ConfigError
from bouquet.strategies import HKFedAvg
from bouquet.strategies.aggregation import Coalitions, HKRule, opinion_columns
from bouquet.strategies.arrays import FlatLayout
from bouquet.strategies.params import CoalitionParams
from bouquet.strategies.rounds import ClientUpdates
from tests.flower_fakes import reply

LAYOUT = FlatLayout(("features.0.weight", "features.0.bias", "head.weight"), ((2, 2), (2,), (3,)),
                    (np.dtype("float32"),) * 3)
# clients 1, 2 and 3, 4 differ in their features; a large head they share makes every whole model alike
FEATURES = {1: [1.0, 0.0], 2: [0.9, 0.1], 3: [0.0, 1.0], 4: [0.1, 0.9]}
HEAD = 10.0


def model(node):
    return {"features.w": np.asarray(FEATURES[node]), "head.w": np.full(6, HEAD + 0.01 * node)}


def test_columns_of_the_named_arrays_by_hand():
    assert opinion_columns((), LAYOUT) is None
    assert opinion_columns(("features.",), LAYOUT).tolist() == [0, 1, 2, 3, 4, 5]
    assert opinion_columns(("head",), LAYOUT).tolist() == [6, 7, 8]
    assert opinion_columns(("features.0.bias", "head"), LAYOUT).tolist() == [4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="hk-opinion-arrays: no model array starts with 'classifier'.*"
                                         "features.0.weight, features.0.bias, head.weight"):
        opinion_columns(("features.", "classifier"), LAYOUT)


def test_params_read_the_prefixes_and_name_a_bad_list():
    assert CoalitionParams().opinion_prefixes == ()
    assert CoalitionParams(opinion_arrays=" features. , head ").opinion_prefixes == ("features.", "head")
    with pytest.raises(ValueError, match="opinion_arrays must be comma-separated"):
        CoalitionParams(opinion_arrays="features.,,head")


def weights_round(nodes=(1, 2, 3, 4)):
    return ClientUpdates(1, 0, tuple(nodes), tuple(model(n) for n in nodes), tuple(10.0 for _ in nodes), ())


def test_hk_on_the_features_finds_the_groups_the_whole_model_hides_and_averages_whole_models():
    rule = HKRule(HKParams(geometry="cosine", tau=0.5))
    whole = Coalitions(rule).aggregate(weights_round())
    assert whole.report["coalitions"] == 1  # the shared head makes every model alike
    features = Coalitions(rule, CoalitionParams(opinion_arrays="features.")).aggregate(weights_round())
    labels = features.labels.tolist()
    assert labels[0] == labels[1] != labels[2] == labels[3]
    # eq. 16 over whole models: the head is averaged too, not only the arrays HK read
    np.testing.assert_allclose(features.model["head.w"], np.full(6, HEAD + 0.025))
    np.testing.assert_allclose(features.model["features.w"], [0.5, 0.5])


def test_updates_and_memory_read_the_same_columns():
    sent = {"features.w": np.zeros(2), "head.w": np.full(6, HEAD)}
    nodes = (1, 2, 3, 4)
    round_ = ClientUpdates(1, 0, nodes, tuple(model(n) for n in nodes), tuple(10.0 for _ in nodes),
                           tuple(sent for _ in nodes))
    params = CoalitionParams(opinion_space="updates", opinion_arrays="features.")
    for memory in (MemoryParams(), MemoryParams(active=True, tau="otsu", formation="linkage")):
        result = Coalitions(HKRule(HKParams(geometry="cosine", tau=0.5)), params, memory).aggregate(round_)
        assert result.assignment[1] == result.assignment[2] != result.assignment[3] == result.assignment[4]


def test_hkfedavg_takes_the_arrays_through_flower_messages_and_names_an_unknown_one():
    features = {1: [1.0, 0.0], 2: [0.9, 0.1], 3: [0.8, 0.0], 4: [0.0, 1.0]}  # three and one: eq. 16 tells
    replies = [reply(n, ArrayRecord({"features.w": Array(np.asarray(f)), "head.w": Array(np.full(6, HEAD))}))
               for n, f in features.items()]
    split, _ = HKFedAvg(geometry="cosine", tau=0.5, opinion_arrays="features.").aggregate_train(1, replies)
    np.testing.assert_allclose(split["features.w"].numpy(), (np.mean([features[n] for n in (1, 2, 3)], axis=0)
                                                             + features[4]) / 2)
    one, _ = HKFedAvg(geometry="cosine", tau=0.5).aggregate_train(1, replies)
    np.testing.assert_allclose(one["features.w"].numpy(), np.mean(list(features.values()), axis=0))
    with pytest.raises(ValueError, match="no model array starts with 'classifier'"):
        HKFedAvg(geometry="cosine", tau=0.5, opinion_arrays="classifier").aggregate_train(1, replies)


def test_the_key_is_refused_where_no_hk_reads_it():
    config = AppConfig.from_run_config({"strategy": "hk-cosine", "hk-opinion-arrays": "features."})
    assert config.coalitions.opinion_prefixes == ("features.",)
    with pytest.raises(ConfigError, match="'hk-opinion-arrays'.*not HK"):
        AppConfig.from_run_config({"strategy": "fixed-k-cosine", "hk-opinion-arrays": "features."})
    with pytest.raises(ConfigError, match="hk-opinion-arrays"):
        AppConfig.from_run_config({"strategy": "hk-cosine", "hk-opinion-arrays": ",features."})
