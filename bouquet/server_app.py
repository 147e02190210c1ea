"""The bouquet ServerApp: read the run config once, build the strategy, run, write results.

Vision task (``task = "vision"``): the global model is scored centrally on
the test set after every round (``rounds.jsonl`` phase ``central``), and
``summary.json`` holds the accuracy curve, C-hat per round and C* (eq. 10)
for SCKM-Cluster, and the sketch bytes.  Client selection writes
``selection.csv`` (one row per candidate per round).  Water task:

Each run writes ``<results-dir>/<run-name>/`` (see :mod:`bouquet.results`):
``config.json``, ``rounds.jsonl``, ``train_clients.csv``,
``evaluate_clients.csv``, ``pool.csv`` (when the data is readable from the
server, as in simulation), ``clients.csv`` (final per-client metrics of the
final model on every node), ``predictions.csv`` (their test-day forecasts),
``coalitions.csv`` and ``trajectories/`` (coalition strategies) and
``summary.json``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp

from bouquet.algorithms.sckm import average_cardinality
from bouquet.config import AppConfig
from bouquet.data.images import load_images
from bouquet.data.water import load_pool
from bouquet.flower_logging import route_to_flower
from bouquet.messages import MessageFactory, flower_message
from bouquet.results import RunRecorder
from bouquet.strategies.aggregation import Aggregator, Coalitions, FixedKRule, HKRule, WeightedMean
from bouquet.strategies.entries import ProximalTerm
from bouquet.strategies.observers import ConsoleLines, Observer, Recorder, RecorderObserver, TrajectoryWriter
from bouquet.strategies.params import CoalitionParams
from bouquet.strategies.sampling import UniformSampler
from bouquet.strategies.selection import SketchSelection
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.tasks.vision import accuracy, batch_indices, make_model
from bouquet.tasks.water import LSTMForecaster

__all__ = ["app", "build_strategy", "evaluate_every_node"]

log = logging.getLogger(__name__)
route_to_flower()
app = ServerApp()


def _aggregator(config: AppConfig) -> Aggregator:
    family = config.spec.family
    if family == "hk":
        return Coalitions(HKRule(config.hk, config.coalitions.record_trajectories), config.coalitions)
    if family == "fixed-k":  # fixed-K partitions the trained models: the paper's baseline, no opinion space
        return Coalitions(FixedKRule(config.fixed_k),
                          CoalitionParams(barycenter_weighting=config.coalitions.barycenter_weighting))
    return WeightedMean()  # fedavg, fedprox, and Per-FedAvg (whose difference is on the clients)


def build_strategy(config: AppConfig, recorder: RunRecorder | None = None) -> BouquetStrategy:
    """The app's strategy: a sampler (``selection``) and an aggregator (``strategy``), composed freely.

    With a recorder, the run folder receives every round's records and, when HK trajectories are
    recorded, ``trajectories/round-NNN.npz``.
    """
    # the vision task scores the global model centrally; every node of the app is waited for one at a time
    sampling = dataclasses.replace(config.sampling, min_evaluate_nodes=1, min_available_nodes=1,
                                   fraction_evaluate=0.0 if config.run.task == "vision"
                                   else config.sampling.fraction_evaluate)
    if config.run.selection == "random":
        sampler: UniformSampler | SketchSelection = UniformSampler(sampling)
    else:
        sampler = SketchSelection(config.selector(), sampling, config.selection)
    entries = (ProximalTerm(config.proximal),) if config.spec.family == "fedprox" else ()
    observers: list[Observer] = [ConsoleLines()]
    if recorder is not None:
        observers.append(RecorderObserver(recorder))
        if config.spec.family == "hk" and config.coalitions.record_trajectories:
            observers.append(TrajectoryWriter(recorder.folder / "trajectories"))
    return BouquetStrategy(sampler=sampler, aggregator=_aggregator(config), train_config=entries, observers=observers)


def evaluate_every_node(grid: Grid, arrays: ArrayRecord, timeout: float, recorder: RunRecorder | None = None,
                        new_message: MessageFactory = flower_message) -> list[dict[str, Any]]:
    """Evaluate ``arrays`` on every connected node; one row per replying node.

    Nodes that return forecasts (``predictions`` ArrayRecord) have them
    appended to ``predictions.csv`` (partition id, household, day, actual and
    predicted litres).
    """
    nodes = sorted(grid.get_node_ids())
    record = RecordDict({"arrays": arrays, "config": ConfigRecord({"final": True})})
    messages = [new_message(record, "evaluate", n, "final") for n in nodes]
    answered = []
    for reply in grid.send_and_receive(messages, timeout=timeout):
        if reply.has_error():
            log.warning("final evaluation: node %d failed: %s", reply.metadata.src_node_id, reply.error.reason)
            continue
        row: dict[str, Any] = {"node_id": reply.metadata.src_node_id}
        row.update(dict(reply.content.config_records["info"]))
        row.update(dict(reply.content.metric_records["metrics"]))
        answered.append((row, reply))
    rows = []
    # in partition order, not arrival order, so that predictions.csv is the same file in every run
    for row, reply in sorted(answered, key=lambda pair: pair[0]["partition-id"]):
        rows.append(row)
        if recorder is not None and "predictions" in reply.content.array_records:
            forecast = {k: v.numpy() for k, v in reply.content.array_records["predictions"].items()}
            days = forecast["day"].astype("datetime64[D]").astype(str)
            recorder.append_rows("predictions", [
                {"partition-id": row["partition-id"], "household": row["household"], "day": day,
                 "actual-litres": float(a), "predicted-litres": float(p)}
                for day, a, p in zip(days, forecast["actual-litres"], forecast["predicted-litres"])])
    return rows


def _write_pool(config: AppConfig, recorder: RunRecorder) -> None:
    if config.water_data.source == "daiad" and not config.water_data.path:
        log.info("data path is given per node (deployment): no pool report on the server")
        return
    pool = load_pool(config.water_data)
    pool.report.to_csv(recorder.folder / "pool.csv", index=False)
    log.info("federated pool: %d households (report: %s)", len(pool), recorder.folder / "pool.csv")


def central_evaluation(config: AppConfig, recorder: Recorder | None = None
                       ) -> tuple[ArrayRecord, Callable[[int, ArrayRecord], MetricRecord]]:
    """Vision task: the initial global arrays and an ``evaluate_fn`` scoring a model on the test set."""
    data = load_images(config.vision_data)
    torch.manual_seed(config.sampling.seed)
    model = make_model(config.vision_model.name, data.shape, len(data.classes))
    initial = ArrayRecord(model.state_dict())  # a copy: the model is then free to score others
    x_test, y_test = data.x_test, data.y_test
    size = config.central.size
    if 0 < size < len(y_test):
        keep = batch_indices(len(y_test), size, np.random.default_rng([config.vision_data.seed, 2]))
        x_test, y_test = x_test[keep], y_test[keep]
        log.info("central evaluation on %d of %d test images (central-eval-size)", len(keep), len(data.y_test))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        acc, loss = accuracy(model, x_test, y_test)
        log.info("round %d: central test accuracy %.4f, loss %.4f", server_round, acc, loss)
        if recorder is not None:
            recorder.log_round(server_round, "central", {"accuracy": acc, "loss": loss})
        return MetricRecord({"accuracy": acc, "loss": loss})

    return initial, evaluate


def _selection_summary(config: AppConfig, strategy: BouquetStrategy) -> dict[str, Any]:
    if config.run.selection == "random":
        return {"selection": "random"}
    clusters = [h["clusters"] for h in strategy.history if "clusters" in h]
    summary: dict[str, Any] = {"selection": config.run.selection, "selection-mode": config.selection.mode}
    if clusters:
        summary |= {"clusters-per-round": clusters, "c-star": average_cardinality(clusters)}
    sketch = [h["sketch-bytes"] for h in strategy.history if "sketch-bytes" in h]
    if sketch:
        summary |= {"sketch-bytes-per-round": float(np.mean(sketch)),
                    "model-bytes": strategy.history[-1].get("model-bytes")}
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` rounds and write the run folder."""
    started = time.time()
    config = AppConfig.from_run_config(context.run_config)
    run = config.run
    label = run.strategy if run.selection == "random" else f"{run.selection}-{run.strategy}"
    recorder = RunRecorder.create(run.results_dir, run.run_name, label=label)
    recorder.write_json("config.json", config.to_run_config())
    log.info("bouquet: results in %s", recorder.folder)
    strategy = build_strategy(config, recorder)
    if run.task == "vision":
        _run_vision(grid, config, strategy, recorder, started)
    else:
        _run_water(grid, config, strategy, recorder, started)


def _run_vision(grid: Grid, config: AppConfig, strategy: BouquetStrategy, recorder: RunRecorder,
                started: float) -> None:
    run = config.run
    initial, evaluate = central_evaluation(config, recorder)
    result = strategy.start(grid=grid, initial_arrays=initial,
                            num_rounds=run.num_server_rounds, timeout=run.round_timeout, evaluate_fn=evaluate)
    curve = {int(r): float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()}
    summary = {"task": "vision", "strategy": run.strategy, "rounds": run.num_server_rounds,
               "accuracy-per-round": [curve[r] for r in sorted(curve)],
               "final-accuracy": curve[max(curve)] if curve else None,
               **_selection_summary(config, strategy), "wall-seconds": time.time() - started}
    recorder.write_json("summary.json", summary)
    if curve:
        best = max(sorted(curve), key=curve.get)  # the earliest round with the highest accuracy
        accuracy_text = f"final test accuracy {100 * curve[max(curve)]:.2f} % (best {100 * curve[best]:.2f} % " \
                        f"at round {best})"
    else:
        accuracy_text = "no test accuracy (no round evaluated)"
    log.info("bouquet summary: vision, %s + %s, %d rounds: %s; %s", summary["selection"], run.strategy,
             run.num_server_rounds, accuracy_text, recorder.folder)


def _run_water(grid: Grid, config: AppConfig, strategy: BouquetStrategy, recorder: RunRecorder,
               started: float) -> None:
    run = config.run
    _write_pool(config, recorder)
    torch.manual_seed(config.sampling.seed)
    model = LSTMForecaster(config.water_model.hidden_size, config.water_model.num_layers)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=run.num_server_rounds, timeout=run.round_timeout)

    rows = evaluate_every_node(grid, result.arrays, timeout=run.round_timeout, recorder=recorder)
    recorder.append_rows("clients", rows)
    mae = np.array([r["mae-litres"] for r in rows])
    mse = np.array([r["mse"] for r in rows])
    summary = {
        "strategy": run.strategy, "rounds": run.num_server_rounds, "clients-evaluated": len(rows),
        "mae-litres-mean": float(mae.mean()) if len(mae) else None,
        "mae-litres-std": float(mae.std()) if len(mae) else None,
        "mse-mean": float(mse.mean()) if len(mse) else None,
        **_selection_summary(config, strategy),
        "wall-seconds": time.time() - started,
    }
    recorder.write_json("summary.json", summary)
    if len(rows):
        log.info("bouquet summary: %s, %d rounds, %d clients: MAE %.2f +- %.2f L/day, MSE %.4f (scaled); %s",
                 run.strategy, run.num_server_rounds, len(rows), mae.mean(), mae.std(), mse.mean(),
                 recorder.folder)
    else:
        log.warning("bouquet summary: no client answered the final evaluation; %s", recorder.folder)
