"""Coalition memory in the aggregator and the strategy: names kept, unsampled members served the fresh model,
state through a checkpoint to the bit, bad input named."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from bouquet.algorithms.coalitions_fixed_k import FixedKParams
from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.memory import MemoryParams
from bouquet.config import AppConfig, ConfigError
from bouquet.strategies import BouquetStrategy, SamplingParams, UniformSampler
from bouquet.strategies.aggregation import Coalitions, FixedKRule, HKRule
from bouquet.strategies.models import AssignedModels
from bouquet.strategies.params import CoalitionParams
from bouquet.strategies.rounds import ClientUpdates
from bouquet.strategies.state import ServerState
from tests.flower_fakes import FakeGrid, make_message, reply

UPDATES = CoalitionParams(opinion_space="updates")
DIRECTIONS = {1: [1.0, 0.0, 0.1], 2: [1.0, 0.1, 0.0], 3: [0.0, 1.0, 0.1], 4: [0.1, 1.0, 0.0]}


def updates(server_round, moves, reference=(0.0, 0.0, 0.0)):
    """A round where the nodes of ``moves`` (node -> update) replied, all sent ``reference``."""
    nodes = tuple(sorted(moves))
    sent = {"w": np.asarray(reference, dtype=np.float64)}
    models = tuple({"w": sent["w"] + np.asarray(moves[node], dtype=np.float64)} for node in nodes)
    return ClientUpdates(server_round, 0, nodes, models, tuple(10.0 for _ in nodes), tuple(sent for _ in nodes))


def memory_hk(hk_tau=0.5, **memory):
    return Coalitions(HKRule(HKParams(geometry="cosine", tau=hk_tau)), UPDATES, MemoryParams(active=True, **memory))


def test_names_are_kept_and_every_member_of_a_sampled_coalition_is_served_its_fresh_model():
    aggregator = memory_hk(formation="linkage")
    first = aggregator.aggregate(updates(1, DIRECTIONS))
    assert first.assignment == {1: "c0", 2: "c0", 3: "c1", 4: "c1"}
    np.testing.assert_allclose(first.groups["c0"]["w"], [1.0, 0.05, 0.05])
    # round 2: only nodes 1 and 3 are sampled; 2 and 4 keep their coalitions by the evidence of round 1
    second = aggregator.aggregate(updates(2, {1: [2.0, 0.0, 0.0], 3: [0.0, 3.0, 0.0]}))
    assert second.assignment == {1: "c0", 2: "c0", 3: "c1", 4: "c1"}
    np.testing.assert_allclose(second.groups["c0"]["w"], [2.0, 0.0, 0.0])  # node 1's model: served to 2 too
    np.testing.assert_allclose(second.model["w"], [1.0, 1.5, 0.0])  # eq. 16 over the round's coalitions
    assert second.report["memory-clients"] == 4 and second.report["memory-coalitions"] == 2
    # round 3: only node 2; its coalition c0 gets node 2's model, c1 (unsampled) is not served anew
    third = aggregator.aggregate(updates(3, {2: [0.5, 0.0, 0.0]}))
    assert third.assignment == {1: "c0", 2: "c0"} and set(third.groups) == {"c0"}


def test_a_client_unsampled_for_rounds_is_served_its_coalitions_current_model_by_the_store():
    aggregator, store = memory_hk(formation="linkage"), AssignedModels()
    store.keep(aggregator.aggregate(updates(1, DIRECTIONS)), 1)
    for server_round in (2, 3, 4):  # node 2 is never sampled again; node 1 moves on each round
        store.keep(aggregator.aggregate(updates(server_round, {1: [float(server_round), 0.0, 0.0],
                                                               3: [0.0, 1.0, 0.0]})), server_round)
        assert store.arrays_for(2)["w"].numpy().tolist() == [float(server_round), 0.0, 0.0]
    assert store.key_for(2) == store.key_for(1) == "c0" and store.arrays_for(99) is store.shared  # a new client


def test_a_pair_seen_once_and_a_pair_seen_often_weigh_their_evidence():
    # nodes 1 and 2 agree in three rounds and disagree once; with decay 1 they stay together
    aggregator = memory_hk(hk_tau=0.3, formation="linkage")
    for server_round in (1, 2, 3):
        aggregator.aggregate(updates(server_round, {1: [1.0, 0.0], 2: [1.0, 0.1], 3: [0.0, 1.0]}, (0.0, 0.0)))
    odd = aggregator.aggregate(updates(4, {1: [1.0, 0.0], 2: [0.0, 1.0], 3: [0.0, 1.0]}, (0.0, 0.0)))
    assert odd.assignment[1] == odd.assignment[2] != odd.assignment[3]
    # without memory the same round splits them
    plain = Coalitions(HKRule(HKParams(geometry="cosine", tau=0.3)), UPDATES)
    alone = plain.aggregate(updates(4, {1: [1.0, 0.0], 2: [0.0, 1.0], 3: [0.0, 1.0]}, (0.0, 0.0)))
    assert alone.assignment[1] != alone.assignment[2] == alone.assignment[3]


def test_the_rule_on_the_evidence_and_otsu_give_the_same_coalitions_here():
    for aggregator in (memory_hk(), memory_hk(tau="otsu"),
                       Coalitions(FixedKRule(FixedKParams(k=2, geometry="cosine")), UPDATES,
                                  MemoryParams(active=True)),
                       Coalitions(FixedKRule(FixedKParams(k=2, geometry="cosine")), UPDATES,
                                  MemoryParams(active=True, tau="otsu", formation="linkage"))):
        result = aggregator.aggregate(updates(1, DIRECTIONS))
        assert result.assignment[1] == result.assignment[2] != result.assignment[3] == result.assignment[4], \
            aggregator.label


def _record(values):
    return ArrayRecord({"w": Array(np.asarray(values, dtype=np.float64))})


def _strategy():
    return BouquetStrategy(sampler=UniformSampler(SamplingParams(seed=3, clients_per_round=3, min_available_nodes=6)),
                           aggregator=memory_hk(formation="linkage", decay=0.8), models=AssignedModels(),
                           hooks=(), message_factory=make_message)


def _train_round(strategy, grid, server_round):
    configured = strategy.configure_train_round(server_round, ConfigRecord(), grid)
    replies = []
    for message in configured.messages:
        node = message.metadata.dst_node_id
        sent = message.content["arrays"]["w"].numpy()
        direction = np.array([1.0, 0.2 * node, 0.0] if node % 2 else [0.0, 0.2 * node, 1.0])
        replies.append(reply(node, _record(sent + direction * (1 + 0.1 * server_round)), examples=10))
    strategy.aggregate_train_round(configured, replies)
    strategy.server_round = server_round


def test_memory_goes_through_a_checkpoint_and_a_resumed_run_equals_an_uninterrupted_one():
    grid = FakeGrid([1, 2, 3, 4, 5, 6])
    whole = _strategy()
    whole.models.adopt(_record([0.0, 0.0, 0.0]))
    for server_round in (1, 2, 3, 4):
        _train_round(whole, grid, server_round)
    first = _strategy()
    first.models.adopt(_record([0.0, 0.0, 0.0]))
    for server_round in (1, 2):
        _train_round(first, grid, server_round)
    saved = ServerState.from_records(first.state().to_records())  # through Flower records (JSON)
    assert set(saved.parts) == {"Coalitions"}
    resumed = _strategy()
    resumed.load_state(saved)
    memory, kept = resumed.aggregator._state, first.aggregator._state
    assert memory.names == kept.names and memory.next_id == kept.next_id
    assert np.array_equal(memory.evidence.total, kept.evidence.total)  # to the bit
    for server_round in (3, 4):
        _train_round(resumed, grid, server_round)
    for node in grid.node_ids:
        assert resumed.models.key_for(node) == whole.models.key_for(node)
        np.testing.assert_array_equal(resumed.models.arrays_for(node)["w"].numpy(),
                                      whole.models.arrays_for(node)["w"].numpy())
    without = ServerState(server_round=2, seed=saved.seed, models=saved.models, store=saved.store, nodes=saved.nodes,
                          sampler=saved.sampler)
    with pytest.raises(ValueError, match="coalition-memory is on, but the state holds no coalition memory"):
        _strategy().load_state(without)


def test_bad_memory_settings_are_named():
    with pytest.raises(ConfigError, match="coalition-memory-decay"):
        AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-memory": True, "coalition-memory-decay": 0.0})
    with pytest.raises(ConfigError, match="'coalition-memory'.*forms no coalitions"):
        AppConfig.from_run_config({"strategy": "fedavg", "coalition-memory": True})
    with pytest.raises(ConfigError, match="coalition-memory-tau"):
        AppConfig.from_run_config({"strategy": "fixed-k-cosine", "coalition-memory": True,
                                   "coalition-memory-formation": "linkage"})
    with pytest.raises(ConfigError, match="coalition-memory-formation"):
        AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-memory": True,
                                   "coalition-memory-formation": "spectral"})
    config = AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-memory": True,
                                        "coalition-memory-tau": "otsu", "coalition-memory-decay": 0.5})
    assert config.memory == MemoryParams(active=True, decay=0.5, tau="otsu")
    with pytest.raises(ValueError, match="has none"):
        Coalitions(FixedKRule(FixedKParams(k=2)), UPDATES, MemoryParams(active=True, tau="otsu"))


def test_a_client_without_an_update_keeps_its_remembered_coalition_or_stands_alone():
    aggregator = memory_hk(formation="linkage")
    aggregator.aggregate(updates(1, DIRECTIONS))
    # node 2 replies its reference unchanged (no direction, no evidence); node 5 is new and also unchanged
    result = aggregator.aggregate(updates(2, {1: [1.0, 0.0, 0.0], 2: [0.0, 0.0, 0.0], 3: [0.0, 1.0, 0.0],
                                              5: [0.0, 0.0, 0.0]}, reference=(1.0, 1.0, 1.0)))
    assert result.assignment[2] == result.assignment[1] == "c0" and result.assignment[3] == "c1"
    assert result.assignment[5] == "c2" and aggregator._state.evidence.nodes == (1, 2, 3, 4)
    np.testing.assert_allclose(result.groups["c0"]["w"], [1.5, 1.0, 1.0])  # 1's and 2's models, uniform


def test_with_together_evidence_round_one_is_the_rules_own_and_a_group_whose_clients_fall_alone_is_kept():
    plain = Coalitions(HKRule(HKParams(geometry="cosine", tau=0.5)), UPDATES)
    together = memory_hk(evidence="together", formation="linkage", tau="majority")
    first, alone = together.aggregate(updates(1, DIRECTIONS)), plain.aggregate(updates(1, DIRECTIONS))
    assert first.labels.tolist() == alone.labels.tolist() == [0, 0, 1, 1]
    assert first.report["round-coalitions"] == 2 and first.report["memory-tau"] == 0.5
    # round 2: the updates are noise (every cosine below tau): the rule leaves each client alone
    noise = {1: [1.0, 0.0, 0.0], 2: [0.0, 1.0, 0.0], 3: [0.0, 0.0, 1.0], 4: [-1.0, 0.0, 0.0]}
    assert len(set(plain.aggregate(updates(2, noise)).labels.tolist())) == 4
    held = together.aggregate(updates(2, noise))
    assert held.report["round-coalitions"] == 4 and held.assignment == first.assignment  # the groups hold
    # the cosine evidence on the same rounds dissolves them (mean cosine of 1-2 drops below tau)
    cosine = memory_hk(formation="linkage")
    cosine.aggregate(updates(1, DIRECTIONS))
    assert len(set(cosine.aggregate(updates(2, noise)).assignment.values())) == 4
    # round 3: 1 joins 3 in a coalition, twice: 1 is now apart from 2 in the majority of its informative rounds
    swap = {1: [0.0, 1.0, 0.0], 2: [1.0, 0.0, 0.0], 3: [0.0, 1.0, 0.05], 4: [0.0, 0.0, 1.0]}
    together.aggregate(updates(3, swap))
    moved = together.aggregate(updates(4, swap))
    assert moved.assignment[1] == moved.assignment[3] and moved.assignment[1] != moved.assignment[2]


def test_fixed_k_with_together_evidence_starts_from_its_own_coalitions_and_takes_the_majority_threshold():
    params = MemoryParams(active=True, evidence="together", formation="linkage", tau="majority")
    aggregator = Coalitions(FixedKRule(FixedKParams(k=2, geometry="cosine")), UPDATES, params)
    plain = Coalitions(FixedKRule(FixedKParams(k=2, geometry="cosine")), UPDATES)
    first = aggregator.aggregate(updates(1, DIRECTIONS))
    assert first.labels.tolist() == plain.aggregate(updates(1, DIRECTIONS)).labels.tolist() == [0, 0, 1, 1]
    assert first.report["memory-tau"] == 0.5
    config = AppConfig.from_run_config({"strategy": "fixed-k-cosine", "coalition-memory": True,
                                        "coalition-memory-evidence": "together",
                                        "coalition-memory-formation": "linkage", "coalition-memory-tau": "majority"})
    assert config.memory.evidence == "together"
    with pytest.raises(ConfigError, match="coalition-memory-evidence 'together' needs"):
        AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-memory": True,
                                   "coalition-memory-evidence": "together"})


def _stacked_reference(rounds):
    """The stacked memory by its definition, from the pure functions, round by round: the cosine evidence's
    coalitions at Otsu (HK tau 0.5 while it has one value), counted as together evidence, linkage at 0.5."""
    from bouquet.algorithms.hk import gram_cosines, gram_matrix
    from bouquet.algorithms.memory import PairEvidence, average_linkage, linkage_at_otsu, together_evidence

    first, second, partitions = PairEvidence(), PairEvidence(), []
    for moves in rounds:
        nodes = sorted(moves)
        cos = gram_cosines(gram_matrix(np.array([moves[n] for n in nodes], dtype=np.float64)))
        first = first.update(nodes, cos, 1.0)
        labels, _ = linkage_at_otsu(first, 0.5)
        at = {node: i for i, node in enumerate(first.nodes)}
        values, observed = together_evidence(labels[[at[n] for n in nodes]])
        second = second.update(nodes, values, 1.0, observed)
        everyone = average_linkage(second.mean(), 0.5)
        partitions.append(dict(zip(second.nodes, everyone.tolist())))
    return partitions


def _same_partition(a, b):
    keys = sorted(a)
    return all((a[i] == a[j]) == (b[i] == b[j]) for i in keys for j in keys)


def test_stacked_memory_finds_the_pairs_in_round_one_and_equals_its_definition_over_random_rounds():
    stacked = memory_hk(evidence="stacked", formation="linkage", tau="majority")
    first = stacked.aggregate(updates(1, DIRECTIONS))
    assert first.assignment[1] == first.assignment[2] != first.assignment[3] == first.assignment[4]
    assert first.report["round-coalitions"] == 2 and 0.1 < first.report["first-tau"] < 0.99
    assert first.report["memory-tau"] == 0.5
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((3, 6))
    rounds = []
    for _ in range(8):
        nodes = sorted(rng.choice(9, size=5, replace=False).tolist())
        rounds.append({n + 1: (centres[n % 3] + rng.normal(scale=0.9, size=6)).tolist() for n in nodes})
    fast = memory_hk(evidence="stacked", formation="linkage", tau="majority")
    splits = []
    for server_round, (moves, expected) in enumerate(zip(rounds, _stacked_reference(rounds)), start=1):
        result = fast.aggregate(updates(server_round, moves, reference=[0.0] * 6))
        # every client served this round (the sampled and their coalitions' members), grouped as defined
        assert set(moves) <= set(result.assignment), server_round
        assert _same_partition(result.assignment, {n: expected[n] for n in result.assignment}), server_round
        splits.append(len(set(expected.values())))
    assert max(splits) > 1 and min(splits) < len(expected)  # neither all together nor all alone throughout


def test_stacked_memory_goes_through_a_checkpoint_to_the_bit():
    from bouquet.algorithms.memory import MemoryState

    whole = memory_hk(evidence="stacked", formation="linkage", tau="majority")
    split = memory_hk(evidence="stacked", formation="linkage", tau="majority")
    rounds = [DIRECTIONS, {1: [1.0, 0.0, 0.3], 3: [0.2, 1.0, 0.0], 4: [0.0, 1.0, 0.2]},
              {2: [1.0, 0.2, 0.0], 4: [0.1, 1.0, 0.0], 1: [0.9, 0.0, 0.1]}]
    for server_round, moves in enumerate(rounds[:2], start=1):
        whole.aggregate(updates(server_round, moves))
        split.aggregate(updates(server_round, moves))
    resumed = memory_hk(evidence="stacked", formation="linkage", tau="majority")
    resumed.load_state_dict(split.state_dict())
    assert "first" in split.state_dict()["memory"]
    a, b = whole.aggregate(updates(3, rounds[2])), resumed.aggregate(updates(3, rounds[2]))
    assert a.assignment == b.assignment and a.report == b.report
    assert np.array_equal(whole._state.first.total, resumed._state.first.total)
    assert isinstance(resumed._state, MemoryState)


def test_the_drop_ins_take_memory_keyword_only_and_name_a_bad_or_unusable_one():
    import inspect

    from bouquet.algorithms.memory import MEMORY_FORMS, VALIDATED_FORM
    from bouquet.strategies import FixedKFedAvg, HKFedAvg

    for drop_in in (HKFedAvg, FixedKFedAvg):
        parameter = inspect.signature(drop_in).parameters["memory"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is False
        assert not drop_in().aggregator.memory.active  # the paper by default
        assert drop_in(memory=True).aggregator.memory == MEMORY_FORMS[VALIDATED_FORM]
        assert drop_in(memory="together").aggregator.label.endswith("with memory")
    hk = HKFedAvg(0.5, memory="stacked", coalition_models="personal", opinion_space="updates")
    assert hk.aggregator.memory.evidence == "stacked" and isinstance(hk.models, AssignedModels)
    with pytest.raises(ValueError, match=r"FixedKFedAvg\(memory=\.\.\.\): coalition-memory-tau 'given' takes the "
                                         r"rule's tau"):
        FixedKFedAvg(memory=MemoryParams(active=True, formation="linkage"))
    with pytest.raises(ValueError, match=r"HKFedAvg\(memory=\.\.\.\) must be False, True"):
        HKFedAvg(memory="features")
    with pytest.raises(TypeError):
        HKFedAvg(0.5, 0.5, 2, 2, 2, "num-examples", "arrays", "config", None, None, True)  # not positional
