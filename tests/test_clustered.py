"""Per-coalition models, IFCA, CFL and local training: the math by hand, the parts with real Messages."""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from flwr.app.error import Error

from bouquet.algorithms.clustered import (
    CFLParams,
    IFCAParams,
    cfl_bipartition,
    cfl_bipartition_exact,
    cfl_split_criterion,
    cosine_similarities,
    ifca_assign,
)
from bouquet.algorithms.groups import agreement, stability
from bouquet.algorithms.hk import HKParams
from bouquet.losses import loss_reply
from bouquet.strategies import (
    AssignedModels,
    BouquetStrategy,
    CFLClusters,
    ClusterMeans,
    Coalitions,
    HKRule,
    IFCASampler,
    LocalModels,
    RecorderObserver,
    SamplingParams,
    ServerState,
    UniformSampler,
)
from bouquet.strategies.arrays import to_numpy, to_record
from bouquet.strategies.clustered import cluster_keys, ifca_models
from bouquet.strategies.rounds import Aggregate, ClientUpdates, TrainRound
from tests.flower_fakes import FakeGrid, ListHook, ListRecorder, make_message, reply_to
from tests.test_hk_strategy import model


def vec(*values):
    return {"w": np.asarray(values, dtype=np.float32)}


# ------------------------------------------------------------------ ARI
def test_agreement_is_one_for_the_same_partition_under_other_names_and_stability_uses_common_clients():
    assert agreement(["a", "a", "b", "b"], [7, 7, 3, 3]) == 1.0
    assert agreement(["a", "a", "b", "b"], [1, 2, 1, 2]) < 0
    assert stability({1: "x", 2: "x", 3: "y"}, {2: "p", 3: "q", 4: "q"}) == 1.0  # clients 2 and 3 only
    assert stability({1: "x"}, {2: "y"}) is None
    with pytest.raises(ValueError, match="3 true groups for 2 labels"):
        agreement([1, 2, 3], [1, 2])


# ------------------------------------------------------------------ the store
def test_assigned_models_serve_each_node_its_group_and_keep_absent_nodes_assignment():
    store = AssignedModels()
    store.adopt(to_record(vec(0.0)))
    assert store.key_for(5) == "shared" and float(to_numpy(store.arrays_for(5))["w"][0]) == 0.0
    first = Aggregate(model=vec(9.0), groups={"a": vec(1.0), "b": vec(2.0)}, assignment={1: "a", 2: "b", 3: "a"})
    store.keep(first, 1)
    assert [store.key_for(n) for n in (1, 2, 3, 5)] == ["a", "b", "a", "shared"]
    assert float(to_numpy(store.arrays_for(2))["w"][0]) == 2.0 and float(to_numpy(store.shared)["w"][0]) == 9.0
    # round 2: only node 1 and 2 took part, both joined "c"; node 3 dropped out and keeps "a"; "b" is unused
    store.keep(Aggregate(model=vec(5.0), groups={"c": vec(3.0)}, assignment={1: "c", 2: "c"}), 2)
    assert [store.key_for(n) for n in (1, 2, 3)] == ["c", "c", "a"] and set(store.models) == {"a", "c"}
    with pytest.raises(KeyError, match="no kept model"):
        store.assign({4: "zzz"})
    # the whole store survives a checkpoint
    copy = AssignedModels()
    copy.load_state(dict(store.state_records()), json.loads(json.dumps(store.state_dict())))
    assert copy.assignment == store.assignment
    np.testing.assert_array_equal(to_numpy(copy.arrays_for(3))["w"], to_numpy(store.arrays_for(3))["w"])


def _updates(rows, node_ids=None, examples=None, references=None, keys=(), groups=None, server_round=1):
    node_ids = tuple(node_ids or range(1, len(rows) + 1))
    models = tuple(vec(*r) for r in rows)
    identities = tuple({"partition-id": n, "household": "", "group": "" if groups is None else groups[i]}
                       for i, n in enumerate(node_ids))
    refs = tuple(references or [vec(*([0.0] * len(rows[0])))] * len(rows))
    return ClientUpdates(server_round, 0, node_ids, models, tuple(examples or [1] * len(rows)), refs, identities,
                         tuple(keys))


def test_coalitions_give_each_coalition_its_barycenter_and_assign_members():
    # the HK cosine hand case (tau = 0.5): coalitions {1, 2, 5} and {3, 4}
    rows = [[1, 0], [1, 0.1], [0, 1], [0.1, 1], [1, -0.1]]
    agg = Coalitions(HKRule(HKParams(geometry="cosine", tau=0.5))).aggregate(
        _updates(rows, groups=["x", "x", "y", "y", "x"], server_round=3))
    assert agg.assignment == {1: "r3-c0", 2: "r3-c0", 3: "r3-c1", 4: "r3-c1", 5: "r3-c0"}
    np.testing.assert_allclose(agg.groups["r3-c0"]["w"], [1.0, 0.0], atol=1e-7)  # mean of rows 1, 2, 5
    np.testing.assert_allclose(agg.groups["r3-c1"]["w"], [0.05, 1.0], atol=1e-7)
    np.testing.assert_allclose(agg.model["w"], [0.525, 0.5], rtol=1e-6)  # eq. 16: the mean of the two
    assert agg.report["ari"] == 1.0
    rows_out = {r["coalition"]: r for r in agg.tables["coalition_models"]}
    assert rows_out["r3-c0"]["members"] == "1 2 5" and rows_out["r3-c1"]["size"] == 2
    assert rows_out["r3-c1"]["model-norm"] == pytest.approx(np.hypot(0.05, 1.0), rel=1e-6)


def _clients(targets, step=0.5):
    """Nodes 100.. whose training moves the model halfway to their own target; evaluate reports the distance."""
    keys = {100 + k: k for k in range(len(targets))}

    def handler(msg):
        part = keys[msg.metadata.dst_node_id]
        target = np.asarray(targets[part], dtype=np.float32)
        if msg.metadata.message_type == "query.losses":
            names = sorted((n for n in msg.content.array_records if n.startswith("model-")),
                           key=lambda n: int(n.removeprefix("model-")))
            losses = [float(np.sum((msg.content[n]["w"].numpy() - target) ** 2)) for n in names]
            return reply_to(msg, RecordDict({"losses": ConfigRecord({"values": losses, "num-examples": 10})}))
        w = msg.content["arrays"]["w"].numpy()
        info = ConfigRecord({"partition-id": part, "household": "", "group": str(part % 2)})
        if msg.metadata.message_type == "train":
            trained = (w + step * (target - w)).astype(np.float32)
            return reply_to(msg, RecordDict({"arrays": ArrayRecord({"w": Array(trained)}),
                                             "metrics": MetricRecord({"num-examples": 10}), "info": info}))
        return reply_to(msg, RecordDict({"metrics": MetricRecord({"num-examples": 1,
                                                                  "error": float(np.sum((w - target) ** 2))}),
                                         "info": info}))

    return FakeGrid(sorted(keys), keys=keys, handler=handler)


TARGETS = [[4.0, 0.0], [0.0, 4.0], [4.2, 0.0], [0.0, 4.2], [3.8, 0.0], [0.0, 3.8]]  # two groups by direction


def test_hk_personal_models_serve_each_client_its_coalition_model_and_beat_the_shared_one():
    def run(store):
        observer = ListHook()
        strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=6)),
                                   aggregator=Coalitions(HKRule(HKParams(geometry="cosine", tau=0.9))),
                                   models=store, hooks=[observer], message_factory=make_message)
        strategy.start(_clients(TARGETS), to_record(vec(0.1, 0.1)), num_rounds=4)
        return observer, strategy

    personal, strategy = run(AssignedModels())
    shared, _ = run(None)
    last = [e for e in personal.events if e.phase == "evaluate"][-1]
    assert {row["model"] for row in last.tables["evaluate_clients"]} == {
        strategy.models.key_for(n) for n in range(100, 106)} and len({r["model"] for r in last.tables[
            "evaluate_clients"]}) == 2
    assert last.metrics["served-ari"] == 1.0 and last.metrics["models-served"] == 2
    error = lambda events: [e for e in events if e.phase == "evaluate"][-1].metrics["error"]
    assert error(personal.events) < 0.1 * error(shared.events)  # each group's own model vs one shared model
    assert [e for e in shared.events if e.phase == "evaluate"][-1].metrics["models-served"] == 1


def test_ifca_assignment_by_hand_and_cluster_means():
    np.testing.assert_array_equal(ifca_assign(np.array([[3.0, 1.0], [0.5, 0.5], [np.nan, 9.0]])), [1, 0, 1])
    updates = _updates([[1.0, 0.0], [3.0, 0.0], [0.0, 5.0]], examples=[1, 3, 1],
                       keys=["cluster-0", "cluster-0", "cluster-1"], groups=["a", "a", "b"])
    agg = ClusterMeans().aggregate(updates)
    np.testing.assert_allclose(agg.groups["cluster-0"]["w"], [2.5, 0.0])  # (1 x 1 + 3 x 3) / 4
    np.testing.assert_allclose(agg.groups["cluster-1"]["w"], [0.0, 5.0])
    assert agg.assignment == {1: "cluster-0", 2: "cluster-0", 3: "cluster-1"} and agg.report["ari"] == 1.0


def test_ifca_sends_each_client_the_model_of_its_lowest_loss_cluster():
    initial = [to_record(vec(4.0, 0.0)), to_record(vec(0.0, 4.0))]
    observer = ListHook()
    strategy = BouquetStrategy(sampler=IFCASampler(IFCAParams(k=2), SamplingParams(clients_per_round=4, seed=1)),
                               aggregator=ClusterMeans(), models=ifca_models(IFCAParams(k=2), 1, initial),
                               hooks=[observer], message_factory=make_message)
    grid = _clients(TARGETS)
    strategy.start(grid, to_record(vec(0.0, 0.0)), num_rounds=2)
    for msg in grid.sent:
        if msg.metadata.message_type in ("train", "evaluate"):
            part = grid.keys[msg.metadata.dst_node_id]
            w = msg.content["arrays"]["w"].numpy()
            assert np.argmax(w) == (0 if part % 2 == 0 else 1), (part, w)  # its own direction's cluster
    select = [e for e in observer.events if e.phase == "select"]
    assert [sum(e.metrics["cluster-sizes"]) for e in select] == [4, 4]
    evaluate = [e for e in observer.events if e.phase == "evaluate"]
    assert evaluate[-1].metrics["served-ari"] == 1.0  # evaluators that never trained were asked too
    # a node that cannot answer the loss query is not trained that round
    failing = _clients(TARGETS)
    answer = failing.handler
    failing.handler = lambda m: reply_to(m, error=Error(1, "no")) if (
        m.metadata.message_type == "query.losses" and m.metadata.dst_node_id == 100) else answer(m)
    sampler = IFCASampler(IFCAParams(k=2), SamplingParams(clients_per_round=6))
    strategy = BouquetStrategy(sampler=sampler, aggregator=ClusterMeans(),
                               models=ifca_models(IFCAParams(k=2), 0, initial), message_factory=make_message)
    strategy.models.adopt(to_record(vec(0.0, 0.0)))
    assert 100 not in strategy.configure_train_round(1, ConfigRecord(), failing).node_ids


def test_ifca_models_from_one_initial_model_are_k_distinct_seeded_perturbations():
    store = ifca_models(IFCAParams(k=3, init_scale=0.5), seed=4)
    store.adopt(to_record({"w": np.zeros(5, dtype=np.float32), "steps": np.array(2)}))
    models = [to_numpy(store.model(key)) for key in cluster_keys(3)]
    assert len({m["w"].tobytes() for m in models}) == 3 and all(int(m["steps"]) == 2 for m in models)
    again = ifca_models(IFCAParams(k=3, init_scale=0.5), seed=4)
    again.adopt(to_record({"w": np.zeros(5, dtype=np.float32), "steps": np.array(2)}))
    np.testing.assert_array_equal(to_numpy(again.model("cluster-2"))["w"], models[2]["w"])
    with pytest.raises(ValueError, match="needs 3 initial models"):
        ifca_models(IFCAParams(k=3), 0, [to_record(vec(0.0))])


def test_cfl_split_rule_by_hand_and_the_bipartition():
    params = CFLParams(eps1=0.5, eps2=1.0, warmup=2, min_size=3)
    opposite = np.array([[2.0, 0.0], [2.1, 0.1], [-2.0, 0.0], [-2.1, -0.1]])  # mean ~ 0, each large
    assert cfl_split_criterion(opposite, params, server_round=3)[0]
    assert not cfl_split_criterion(opposite, params, server_round=2)[0]  # still warming up
    assert not cfl_split_criterion(opposite[:2], params, 3)[0]  # too small (and not stalled)
    assert not cfl_split_criterion(opposite * 0.1, params, 3)[0]  # every client converged too
    _, mean_norm, max_norm = cfl_split_criterion(opposite, params, 3)
    assert mean_norm == pytest.approx(0.0, abs=1e-12) and max_norm == pytest.approx(np.hypot(2.1, 0.1))
    similarity = cosine_similarities(opposite)
    labels = cfl_bipartition(similarity)
    exact, value = cfl_bipartition_exact(similarity)
    np.testing.assert_array_equal(labels, [0, 0, 1, 1])
    np.testing.assert_array_equal(labels, exact)
    assert value == pytest.approx(similarity[0, 2:].max())
    with pytest.raises(ValueError, match="cfl-eps1"):
        CFLParams(eps1=0)


def test_cfl_splits_a_stalled_cluster_and_serves_each_half_its_model():
    updates = _updates([[2.0, 0.0], [2.1, 0.1], [-2.0, 0.0], [-2.1, -0.1]], groups=["a", "a", "b", "b"],
                       server_round=5)
    agg = CFLClusters(CFLParams(eps1=0.5, eps2=1.0, warmup=2)).aggregate(updates)
    assert agg.report["cfl-splits"] == ["shared"] and agg.assignment == {1: "cfl-0", 2: "cfl-0", 3: "cfl-1",
                                                                          4: "cfl-1"}
    np.testing.assert_allclose(agg.groups["cfl-0"]["w"], [2.05, 0.05], rtol=1e-6)
    assert agg.report["ari"] == 1.0
    # next round the clients of "0" were sent "0"'s model; they split again only if they stall
    again = _updates([[2.0, 0.0], [2.2, 0.0]], keys=["cfl-0", "cfl-0"], references=[vec(2.05, 0.05)] * 2,
                     server_round=6)
    assert CFLClusters(CFLParams(eps1=0.5, eps2=1.0, warmup=2)).aggregate(again).report["cfl-splits"] == []


def test_local_training_keeps_every_clients_own_model():
    agg = LocalModels().aggregate(_updates([[1.0], [2.0]], node_ids=[7, 9]))
    assert agg.model is None and agg.assignment == {7: "own-7", 9: "own-9"}
    store = AssignedModels(to_record(vec(0.0)))
    store.keep(agg, 1)
    assert float(to_numpy(store.arrays_for(9))["w"][0]) == 2.0 and float(to_numpy(store.shared)["w"][0]) == 0.0


def test_the_server_state_holds_the_assignment():
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=6)),
                               aggregator=Coalitions(HKRule(HKParams(tau=0.9))), models=AssignedModels(),
                               message_factory=make_message)
    strategy.start(_clients(TARGETS), to_record(vec(0.1, 0.1)), num_rounds=2)
    saved = ServerState.from_records(strategy.state().to_records())
    other = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=6)),
                            aggregator=Coalitions(HKRule(HKParams(tau=0.9))), models=AssignedModels(),
                            message_factory=make_message)
    other.load_state(saved)
    assert other.models.assignment == strategy.models.assignment and len(saved.models) == 3  # shared + 2


def test_the_loss_query_scores_every_received_model_on_the_same_examples():
    import torch

    models = [torch.nn.Linear(2, 1) for _ in range(3)]
    content = RecordDict({**{f"model-{k}": ArrayRecord(m.state_dict()) for k, m in enumerate(models)},
                          "config": ConfigRecord({"loss-examples": 4, "loss-seed": [0, 1], "server-round": 1})})
    msg = make_message(content, "query.losses", 5, "1")
    seen = []

    def loss_fn(context, m, examples, rng):
        pick = rng.choice(10, size=examples, replace=False)
        seen.append(sorted(pick.tolist()))
        return float(m.weight.sum()), examples

    context = Context(run_id=1, node_id=5, node_config={"partition-id": 2}, state=RecordDict(), run_config={})
    answer = loss_reply(msg, context, lambda c: torch.nn.Linear(2, 1), loss_fn, lambda c: 2)
    values = answer.content["losses"]["values"]
    assert values == pytest.approx([float(m.weight.sum()) for m in models]) and answer.content["losses"][
        "num-examples"] == 4
    assert seen[0] == seen[1] == seen[2]  # every model on the same examples


def test_coalition_rows_go_to_coalition_models_csv_through_the_recorder():
    recorder = ListRecorder()
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=2)),
                               aggregator=Coalitions(HKRule(HKParams(geometry="cosine", tau=0.5))),
                               models=AssignedModels(), message_factory=make_message,
                               hooks=[RecorderObserver(recorder)])
    replies = [reply_to(make_message(RecordDict(), "train", n, "1"), RecordDict({
        "arrays": model([float(n == 1)], [float(n == 2)]), "metrics": MetricRecord({"num-examples": 1})}))
        for n in (1, 2)]
    sent = model([0.0], [0.0])
    strategy.aggregate_train_round(TrainRound(1, (1, 2), {1: sent, 2: sent}, ConfigRecord(), ()), replies)
    assert [r["size"] for r in recorder.rows["coalition_models"]] == [1, 1]
