"""The federated trees over Flower: the ClientApp's query.trees handler and the server's FlowerSource with real
Messages (every node's sums added = the pooled fit, tree for tree), the node's evaluation and forecasts ahead,
bad input, and one real `flwr run` whose ensemble equals the in-process pooled fit on the same bins."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.app.error import Error

from bouquet import forecast
from bouquet.algorithms.trees import Ensemble, PartiesSource, TreeParams, fit
from bouquet.client_app import evaluate, node_task, trees
from bouquet.config import AppConfig
from bouquet.results import RunFolder
from bouquet.tasks.trees import TreeWaterTask, household_rows
from bouquet.tree_messages import FlowerSource, TreeFitError
from tests.flower_fakes import FakeGrid, make_message, reply_to

ROOT = Path(__file__).resolve().parents[1]
METERS = ROOT / "examples" / "meters_daily.csv"
SMALL = {"forecast-model": "trees", "synthetic-households": 30, "active-factor": 0.0, "split": "origins",
         "origin": 2, "validation-days": 28, "tree-count": 6, "tree-max-depth": 3, "tree-max-bins": 15,
         "tree-min-child-samples": 10, "fallback": "combine"}


def contexts(run_config, count):
    return {node: Context(run_id=1, node_id=node, node_config={"partition-id": node - 1}, state=RecordDict(),
                          run_config=run_config) for node in range(1, count + 1)}


def answering_grid(run_config, count):
    """A grid whose nodes answer query.trees with bouquet's own ClientApp handler, each keeping its Context."""
    nodes = contexts(run_config, count)

    def handler(msg):
        answer = trees if msg.metadata.message_type == "query.trees" else evaluate
        return answer(msg, nodes[msg.metadata.dst_node_id])

    return FakeGrid(list(nodes), keys={n: n - 1 for n in nodes}, handler=handler), nodes


@pytest.mark.parametrize("objective", ["l1", "huber"])
def test_the_fit_over_messages_is_the_pooled_fit(objective):
    """Four households answering real query.trees messages, their sums added by the server: the trees of the pooled
    fit over the same rows with the same bins (splits, and leaves to 1e-9)."""
    run_config = {**SMALL, "tree-objective": objective, "tree-huber-delta": 0.3}
    config = AppConfig.from_run_config(run_config)
    grid, nodes = answering_grid(run_config, 4)
    source = FlowerSource(grid, list(nodes), timeout=60, new_message=make_message)
    federated, log = fit(source, config.trees)
    tasks = [node_task(config, context) for context in nodes.values()]
    assert all(isinstance(t, TreeWaterTask) for t in tasks)
    pooled, _ = fit(PartiesSource([t.rows for t in tasks], config.trees), config.trees, edges=federated.edges)
    for a, b in zip(federated.trees, pooled.trees, strict=True):
        np.testing.assert_array_equal(a.feature, b.feature)
        np.testing.assert_array_equal(a.threshold, b.threshold)
        np.testing.assert_allclose(a.value, b.value, atol=1e-9)
    x = np.concatenate([t.rows.x for t in tasks])
    np.testing.assert_allclose(federated.predict(x), pooled.predict(x), atol=1e-9)
    described = source.describe()
    assert described["nodes"] == 4 and described["bytes-from-nodes"] > described["bytes-to-nodes"] > 0
    assert log.exchanges == 1 + 1 + config.trees.trees * (config.trees.max_depth + config.trees.renews) + 1
    # each node keeps its predictions in its Flower state between requests
    assert all("trees" in c.state.array_records for c in nodes.values())


def test_secure_sums_show_the_server_only_sums_and_grow_the_same_trees():
    """tree-secure-sums: every reply the server receives after the key exchange is masked (a node's histogram,
    unmasked alone, is noise), their sum is the plain sum, and the trees are the plain fit's (the same splits,
    leaves within the fixed point's 2^-24)."""
    from bouquet.algorithms.masking import unmask
    from bouquet.forecasting.features import feature_grid

    run_config = {**SMALL, "tree-bins": "grid"}
    plain_config = AppConfig.from_run_config(run_config)
    grid, nodes = answering_grid(run_config, 4)
    fine = feature_grid(plain_config.tree_features)
    plain, _ = fit(FlowerSource(grid, list(nodes), timeout=60, new_message=make_message), plain_config.trees, grid=fine)
    secure_config = {**run_config, "tree-secure-sums": True}
    config = AppConfig.from_run_config(secure_config)
    grid, nodes = answering_grid(secure_config, 4)
    seen = []
    handler = grid.handler

    def watching(msg):
        reply = handler(msg)
        seen.append((msg, reply))
        return reply

    grid.handler = watching
    source = FlowerSource(grid, list(nodes), timeout=60, new_message=make_message, secure=True)
    secure, _ = fit(source, config.trees, grid=fine)
    kinds = [dict(msg.content["config"])["kind"] for msg, _ in seen]
    assert kinds[:4] == ["keys"] * 4 and kinds[4:8] == ["grid"] * 4
    for msg, reply in seen[4:]:  # every reply after the keys: masked words, never the node's own sums
        for name, array in reply.content["reply"].items():
            assert array.numpy().dtype == np.uint64, name
    # a node's histogram, unmasked alone, is noise: not counts and sums of a few hundred rows
    _, reply = next((m, r) for m, r in seen if dict(m.content["config"])["kind"] == "histograms")
    alone = unmask({"h": reply.content["reply"]["histograms"].numpy()})["h"]
    assert np.abs(alone).max() > 1e6
    assert source.describe()["secure-sums"] is True
    for a, b in zip(secure.trees, plain.trees, strict=True):
        np.testing.assert_array_equal(a.feature, b.feature)
        np.testing.assert_array_equal(a.threshold, b.threshold)
        np.testing.assert_allclose(a.value, b.value, atol=1e-6)
    np.testing.assert_array_equal(secure.edges, plain.edges)
    with pytest.raises(TreeFitError, match="sketch"):
        FlowerSource(grid, list(nodes), timeout=60, new_message=make_message, secure=True).sketches(8)


def test_a_node_that_fails_or_stays_silent_stops_the_fit_with_its_name():
    run_config = dict(SMALL)
    config = AppConfig.from_run_config(run_config)
    nodes = contexts(run_config, 3)

    def handler(msg):
        node = msg.metadata.dst_node_id
        if node == 2:
            return reply_to(msg, error=Error(code=1, reason="disk full"))
        if node == 3:
            return None
        return trees(msg, nodes[node])

    source = FlowerSource(FakeGrid(list(nodes), handler=handler), list(nodes), timeout=5, new_message=make_message)
    with pytest.raises(TreeFitError, match=r"2 of 3 nodes.*node 2: disk full.*node 3: no reply within 5 s"):
        fit(source, config.trees)
    with pytest.raises(TreeFitError, match="no node"):
        FlowerSource(FakeGrid([]), [], timeout=5)


def test_an_lstm_node_refuses_tree_queries_and_a_tree_node_refuses_training():
    lstm = contexts({**SMALL, "forecast-model": "lstm"}, 1)[1]
    content = RecordDict({"config": ConfigRecord({"kind": "sketch", "points": 8}), "request": ArrayRecord()})
    with pytest.raises(TypeError, match='forecast-model = "trees"'):
        trees(make_message(content, "query.trees", 1, "trees-sketch"), lstm)
    task = node_task(AppConfig.from_run_config(SMALL), contexts(SMALL, 1)[1])
    with pytest.raises(TypeError, match="query.trees"):
        task.train(None, np.random.default_rng(0), 0.0)
    with pytest.raises(TypeError, match="attack"):
        task.poisoned("target-shift", 1.0)


def test_the_node_evaluates_serves_and_forecasts_with_the_ensemble():
    """The final evaluation message carries the ensemble; the node answers with the same metrics, served forecast,
    forecasts ahead and model arrays as the LSTM's node."""
    config = AppConfig.from_run_config(SMALL)
    grid, nodes = answering_grid(SMALL, 3)
    ensemble, _ = fit(FlowerSource(grid, list(nodes), timeout=60, new_message=make_message), config.trees)
    record = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in ensemble.to_arrays().items()})
    content = RecordDict({"arrays": record, "config": ConfigRecord({"final": True})})
    answer = evaluate(make_message(content, "evaluate", 1, "final"), nodes[1])
    metrics, info = answer.content["metrics"], answer.content["info"]
    assert {"mae-litres", "model-mae-litres", "val-mae-litres", "naive-val-blend", "served-model-share"} <= set(metrics)
    assert info["served"] in ("model", "combined", "baseline")
    arrays = answer.content.array_records
    ahead = {k: v.numpy() for k, v in arrays["ahead"].items()}
    assert list(ahead["horizon"]) == list(range(1, 8)) and (ahead["forecast-litres"] >= 0).all()
    assert np.isfinite(ahead["model-litres"]).all()  # trees read missing inputs: every day has a model forecast
    assert Ensemble.from_arrays({k: v.numpy() for k, v in arrays["model"].items()}).trees[0].feature.size
    task = node_task(config, nodes[1])
    forecasts = task.forecasts(ensemble)
    w = task.windows
    assert metrics["model-mae-litres"] == pytest.approx(np.mean(np.abs(forecasts("test") - w.to_litres(w.y_test))))
    # an ensemble over other inputs is refused with the reason
    other = Ensemble(ensemble.init, ensemble.trees, ensemble.edges[:3])
    with pytest.raises(ValueError, match="reads 3 inputs"):
        task.load(other.to_arrays())


def test_the_pooled_rule_serves_every_household_the_pools_share(tmp_path):
    """fallback = "pooled": the server asks every node for its shares' validation MAE, picks the share with the
    lowest sum, and every node serves it (told in the final evaluation's config)."""
    from bouquet.forecasting.combine import COMBINATION_WEIGHTS, pooled_weight
    from bouquet.results import RunRecorder
    from bouquet.serving.task import final_evaluation, pooled_share

    run_config = {**SMALL, "fallback": "pooled"}
    config = AppConfig.from_run_config(run_config)
    grid, nodes = answering_grid(run_config, 4)
    ensemble, _ = fit(FlowerSource(grid, list(nodes), timeout=60, new_message=make_message), config.trees)
    record = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in ensemble.to_arrays().items()})
    served = dict.fromkeys(nodes, ("trees", record))
    share = pooled_share(grid, served, 60, new_message=make_message)
    tasks = [node_task(config, c) for c in nodes.values()]
    expected = pooled_weight([[t.share_errors(ensemble)[f"val-share-mae-{i}"] for i in range(5)] for t in tasks])
    assert share == expected and share in COMBINATION_WEIGHTS

    recorder = RunRecorder.create(str(tmp_path), "pooled")
    rows = final_evaluation(grid, config, served, recorder, new_message=make_message)
    assert {r["served-model-share"] for r in rows} == {share} and len(rows) == 4
    assert len(RunFolder(recorder.folder).table("val-predictions")) == sum(len(t.windows.val_days) for t in tasks)


def test_a_households_training_rows_stop_before_its_validation_days():
    config = AppConfig.from_run_config(SMALL)
    task = node_task(config, contexts(SMALL, 1)[1])
    rows, days = household_rows(task.windows, config.tree_features)
    w = task.windows
    assert days.max() < w.day_index(w.val_days[:1])[0]
    assert len(rows.val_y) == len(w.val_days) and len(rows.y) == len(days)
    litres = w.to_litres(w.series)
    np.testing.assert_allclose(rows.val_y * rows.val_weight, w.to_litres(w.y_val))
    assert np.isfinite(litres[days]).all()


@pytest.mark.e2e
def test_a_tree_run_in_flower_is_the_pooled_fit_and_forecasts_tomorrow(run_app, tmp_path):
    """A real `flwr run` of the trees on a utility's meter file: the ensemble every node was served equals the
    pooled fit of the same rows on the same bins, the summary says what the fit cost, and `python -m
    bouquet.forecast` forecasts again from the saved ensemble."""
    run_config = (f'forecaster="improved" forecast-model="trees" data-source="csv" data-path="{METERS}" '
                  'active-factor=0 min-history-days=0 split="origins" origin=2 validation-days=28 fallback="pooled" '
                  'tree-count=5 tree-max-depth=3 tree-max-bins=15 tree-min-child-samples=10')
    folder, stdout = run_app(run_config, supernodes=3)
    run = RunFolder(folder)
    summary = run.summary()
    fitted = summary["tree-fit"]
    assert summary["forecast-model"] == "trees" and summary["clients-evaluated"] == 3
    assert fitted["exchanges"] == 1 + 1 + 5 * 4 + 1 and fitted["nodes"] == 3
    assert fitted["bytes-from-nodes"] > 0 and len(fitted["val-mae-litres-by-trees"]) == 6
    assert "trees: fitted in" in stdout and "bouquet summary: 5 trees" in stdout
    # fallback = "pooled": one share for every household, chosen by the server from every node's errors
    assert "fallback pooled: the model's share" in stdout
    assert set(run.table("clients")["served-model-share"]) == {summary["fallback-share"]}
    assert len(run.table("trees")) == 6 and (folder / "report.png").stat().st_size > 10000
    models = sorted((folder / "models").glob("*.npz"))
    assert len(models) == 3
    stored = forecast.load_forecasters(folder)
    ensembles = [Ensemble.from_arrays(entry["model"]) for entry in stored.values()]
    config = AppConfig.from_run_config(RunFolder(folder).config())
    tasks = [TreeWaterTask.for_node(config.water_data, config.trees, config.tree_features, k, None, config.fallback)
             for k in range(3)]
    pooled, _ = fit(PartiesSource([t.rows for t in tasks], config.trees), config.trees, edges=ensembles[0].edges)
    for ensemble in ensembles:
        for a, b in zip(ensemble.trees, pooled.trees, strict=True):
            np.testing.assert_array_equal(a.feature, b.feature)
            np.testing.assert_allclose(a.value, b.value, atol=1e-9)
    ahead = run.table("forecast")
    assert len(ahead) == 21 and (ahead["forecast-litres"] >= 0).all()
    out = tmp_path / "again.csv"
    assert forecast.main([str(folder), "--data", str(METERS), "--out", str(out)]) == 0
    merged = ahead.merge(pd.read_csv(out), on=["household", "day"], suffixes=("", "-again"))
    assert len(merged) == 21
    np.testing.assert_allclose(merged["forecast-litres-again"], merged["forecast-litres"], rtol=1e-9)


def test_tree_params_reach_the_config_and_bad_values_name_their_key():
    from bouquet.config import ConfigError

    config = AppConfig.from_run_config({"forecast-model": "trees", "tree-count": 7, "tree-objective": "huber",
                                        "tree-holidays": "none"})
    assert config.forecast_model.trees and config.trees == TreeParams(objective="huber", trees=7)
    with pytest.raises(ConfigError, match="tree-count"):
        AppConfig.from_run_config({"tree-count": 0})
    with pytest.raises(ConfigError, match="forecast-model"):
        AppConfig.from_run_config({"forecast-model": "forest"})
    with pytest.raises(ConfigError, match="tree-holidays"):
        AppConfig.from_run_config({"tree-holidays": "ES-ZZ"})
    with pytest.raises(ConfigError, match="not checkpointed"):
        AppConfig.from_run_config({"forecast-model": "trees", "resume-from": "results/some-run"})


def test_the_fit_waits_for_the_pool_but_not_for_nodes_that_never_come():
    from bouquet.serving.trees import wait_for_nodes

    class Grid:
        def __init__(self, arrivals):
            self.arrivals, self.t = arrivals, 0.0

        def get_node_ids(self):
            return [n for n, at in self.arrivals.items() if at <= self.t]

    def run(arrivals, expected, wait=30.0):
        grid = Grid(arrivals)

        def sleep(seconds):
            grid.t += seconds

        return wait_for_nodes(grid, expected, wait, settle=5.0, clock=lambda: grid.t, sleep=sleep), grid.t

    assert run({1: 0, 2: 0, 3: 0}, 3) == ([1, 2, 3], 0.0)  # all there: no wait
    nodes, waited = run({1: 0, 2: 0}, 10)  # a simulation with 2 of the pool's 10: 5 s, not the node wait
    assert nodes == [1, 2] and waited == pytest.approx(5.0)
    nodes, waited = run({1: 0, 2: 3, 3: 7}, 3)  # deployed nodes arriving: each arrival restarts the settling
    assert nodes == [1, 2, 3] and waited == pytest.approx(7.0)
    nodes, waited = run({1: 40}, 3, wait=30.0)  # none within the node wait
    assert nodes == [] and waited == pytest.approx(30.0)


@pytest.mark.e2e
@pytest.mark.tier2
def test_a_secure_tree_run_in_flower_is_the_pooled_fit(run_app):
    """tree-secure-sums in a real `flwr run`: the server adds masked words, and the ensemble is the pooled fit of
    the same rows on the same bins (the same splits; leaves within the fixed point's precision)."""
    from bouquet.forecasting.features import feature_grid

    run_config = (f'forecaster="improved" forecast-model="trees" data-source="csv" data-path="{METERS}" '
                  'active-factor=0 min-history-days=0 split="origins" origin=2 validation-days=28 fallback="none" '
                  'tree-count=4 tree-max-depth=3 tree-max-bins=15 tree-min-child-samples=10 tree-bins="grid" '
                  'tree-secure-sums=true')
    folder, _ = run_app(run_config, supernodes=3)
    summary = RunFolder(folder).summary()
    assert summary["tree-fit"]["secure-sums"] is True
    assert summary["tree-fit"]["exchanges"] == 1 + 1 + 4 * 4 + 1  # the key exchange is not a sum
    ensemble = Ensemble.from_arrays(next(iter(forecast.load_forecasters(folder).values()))["model"])
    config = AppConfig.from_run_config(RunFolder(folder).config())
    tasks = [TreeWaterTask.for_node(config.water_data, config.trees, config.tree_features, k, None, config.fallback)
             for k in range(3)]
    pooled, _ = fit(PartiesSource([t.rows for t in tasks], config.trees), config.trees,
                    grid=feature_grid(config.tree_features))
    np.testing.assert_array_equal(ensemble.edges, pooled.edges)
    for a, b in zip(ensemble.trees, pooled.trees, strict=True):
        np.testing.assert_array_equal(a.feature, b.feature)
        np.testing.assert_allclose(a.value, b.value, atol=1e-6)


def test_one_ensemble_per_coalition_each_grown_over_its_own_nodes(tmp_path):
    """tree-coalitions: the known household types of the benchmark, or a CSV of partition ids: each coalition's
    ensemble is the pooled fit of its own households' rows, and each node is served its coalition's."""
    from bouquet.results import RunRecorder
    from bouquet.serving.trees import coalitions, fit_trees
    from bouquet.transport import FLOWER_TRANSPORT

    run_config = {**SMALL, "synthetic-households": 12, "synthetic-types": "family,business", "min-history-days": 0,
                  "tree-coalitions": "groups", "fallback": "none", "tree-min-child-samples": 5}
    config = AppConfig.from_run_config(run_config)
    from bouquet.data.water import load_pool

    pool = load_pool(config.water_data)
    grid, nodes = answering_grid(run_config, len(pool))
    recorder = RunRecorder.create(str(tmp_path), "coalitions")
    served, costs = fit_trees(grid, config, len(pool), recorder, transport=FLOWER_TRANSPORT, new_message=make_message)
    labels = {node: label for node, (label, _) in served.items()}
    assert set(labels.values()) == {"family", "business"} and set(costs["coalitions"]) == {"family", "business"}
    for label in ("family", "business"):
        members = [n for n in nodes if labels[n] == label]
        assert all(pool.group_of(n - 1) == label for n in members)
        tasks = [node_task(config, nodes[n]) for n in members]
        ensemble = served[members[0]][1]
        pooled, _ = fit(PartiesSource([t.rows for t in tasks], config.trees), config.trees, edges=ensemble.edges)
        for a, b in zip(ensemble.trees, pooled.trees, strict=True):
            np.testing.assert_array_equal(a.feature, b.feature)
            np.testing.assert_allclose(a.value, b.value, atol=1e-9)
    assert costs["exchanges"] == sum(c["exchanges"] for c in costs["coalitions"].values())
    # a CSV partition by partition id; a node it leaves out is an error naming it
    table = tmp_path / "districts.csv"
    table.write_text("partition-id,coalition\n" + "".join(f"{k},{'north' if k < 5 else 'south'}\n" for k in range(12)))
    by_file = coalitions(AppConfig.from_run_config({**run_config, "tree-coalitions": str(table)}),
                         {n: n - 1 for n in nodes})
    assert [len(v) for v in by_file.values()] == [5, len(pool) - 5] and list(by_file) == ["north", "south"]
    table.write_text("partition-id,coalition\n0,north\n")
    with pytest.raises(ValueError, match="no coalition for partition ids"):
        coalitions(AppConfig.from_run_config({**run_config, "tree-coalitions": str(table)}), {n: n - 1 for n in nodes})
    with pytest.raises(Exception, match="tree-coalitions"):
        AppConfig.from_run_config({"tree-coalitions": "districts"})
