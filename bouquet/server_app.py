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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp

from bouquet.algorithms.hk import opinion_trajectory_2d
from bouquet.algorithms.sckm import average_cardinality
from bouquet.config import AppConfig
from bouquet.data.images import load_images
from bouquet.data.water import load_pool
from bouquet.flower_logging import route_to_flower
from bouquet.results import RunRecorder
from bouquet.strategies.base import Recorder, SeededFedAvg
from bouquet.strategies.fedprox import SeededFedProx
from bouquet.strategies.fixed_k import FixedKFedAvg
from bouquet.strategies.hk import HKFedAvg
from bouquet.strategies.selection import ClientSelection, selection_strategy
from bouquet.tasks.vision import accuracy, batch_indices, make_model
from bouquet.tasks.water import LSTMForecaster

__all__ = ["app", "build_strategy", "evaluate_every_node"]

log = logging.getLogger(__name__)
route_to_flower()
app = ServerApp()


def build_strategy(config: AppConfig, recorder: Recorder | None = None) -> SeededFedAvg:
    """The strategy named by ``config.strategy``, with ``config.selection`` choosing its clients.

    The one seam every strategy goes through: the aggregator (``strategy``)
    and the client selector (``selection``; ``random`` is the seeded uniform
    draw of :class:`SeededFedAvg`) compose freely.
    """
    common: dict[str, Any] = {"clients_per_round": config.clients_per_round, "seed": config.seed,
                              "node_wait_seconds": config.node_wait_seconds, "recorder": recorder,
                              "fraction_evaluate": 0.0 if config.task == "vision" else config.fraction_evaluate,
                              "min_evaluate_nodes": 1, "min_available_nodes": 1}
    host: type[SeededFedAvg]
    if config.strategy == "fedavg" or config.strategy.startswith("perfedavg-"):  # Per-FedAvg: client-side
        host, extra = SeededFedAvg, {}
    elif config.strategy == "fedprox":
        host, extra = SeededFedProx, {"proximal_mu": config.proximal_mu}
    elif config.strategy.startswith("hk-"):
        host, extra = HKFedAvg, {**dataclasses.asdict(config.hk_params()),
                                 "record_trajectories": config.hk_record_trajectories,
                                 "opinion_space": config.hk_opinion_space}
    elif config.strategy.startswith("fixed-k-"):
        host, extra = FixedKFedAvg, {"k": config.fixed_k, "geometry": config.strategy.removeprefix("fixed-k-"),
                                     "barycenter_weighting": config.hk_barycenter_weighting}
    else:
        raise AssertionError(f"strategy {config.strategy!r} passed validation but has no builder")
    if config.selection == "random":
        return host(**extra, **common)
    return selection_strategy(config.selector(), host, mode=config.selection_mode,
                              sketch_fraction=config.sketch_fraction, sketch_batch_size=config.sketch_batch_size,
                              candidates_per_round=config.candidates_per_round or None,
                              query_timeout=config.query_timeout, max_sketch_age=config.max_sketch_age,
                              **extra, **common)


def evaluate_every_node(grid: Grid, arrays: ArrayRecord, timeout: float,
                        recorder: RunRecorder | None = None) -> list[dict[str, Any]]:
    """Evaluate ``arrays`` on every connected node; one row per replying node.

    Nodes that return forecasts (``predictions`` ArrayRecord) have them
    appended to ``predictions.csv`` (partition id, household, day, actual and
    predicted litres).
    """
    nodes = sorted(grid.get_node_ids())
    record = RecordDict({"arrays": arrays, "config": ConfigRecord({"final": True})})
    messages = [Message(content=record, message_type="evaluate", dst_node_id=n) for n in nodes]
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


def write_trajectories(strategy: HKFedAvg, folder: Path) -> None:
    """One ``round-NNN.npz`` per round: 2-D projected opinions per inner step, labels, node ids."""
    folder.mkdir(parents=True, exist_ok=True)
    for server_round, kept in strategy.trajectories.items():
        projection = opinion_trajectory_2d(kept["history"], kept["gram"], strategy.params)
        np.savez(folder / f"round-{server_round:03d}.npz", projection=projection, labels=kept["labels"],
                 node_ids=np.array(kept["node_ids"], dtype=np.uint64))


def _write_pool(config: AppConfig, recorder: RunRecorder) -> None:
    if config.data_source == "daiad" and not config.data_path:
        log.info("data path is given per node (deployment): no pool report on the server")
        return
    pool = load_pool(config.water_data())
    pool.report.to_csv(recorder.folder / "pool.csv", index=False)
    log.info("federated pool: %d households (report: %s)", len(pool), recorder.folder / "pool.csv")


def central_evaluation(config: AppConfig, recorder: Recorder | None = None
                       ) -> tuple[ArrayRecord, Callable[[int, ArrayRecord], MetricRecord]]:
    """Vision task: the initial global arrays and an ``evaluate_fn`` scoring a model on the test set."""
    data = load_images(config.vision_data())
    torch.manual_seed(config.seed)
    model = make_model(config.vision_model, data.shape, len(data.classes))
    initial = ArrayRecord(model.state_dict())  # a copy: the model is then free to score others
    x_test, y_test = data.x_test, data.y_test
    if 0 < config.central_eval_size < len(y_test):
        keep = batch_indices(len(y_test), config.central_eval_size, np.random.default_rng([config.data_seed, 2]))
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


def _selection_summary(strategy: SeededFedAvg) -> dict[str, Any]:
    if not isinstance(strategy, ClientSelection):
        return {"selection": "random"}
    clusters = [h["clusters"] for h in strategy.history if "clusters" in h]
    summary: dict[str, Any] = {"selection": strategy.selector.name, "selection-mode": strategy.mode}
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
    recorder = RunRecorder.create(config.results_dir, config.run_name,
                                  label=config.strategy if config.selection == "random"
                                  else f"{config.selection}-{config.strategy}")
    recorder.write_json("config.json", config.to_run_config())
    log.info("bouquet: results in %s", recorder.folder)
    strategy = build_strategy(config, recorder)
    if config.task == "vision":
        _run_vision(grid, config, strategy, recorder, started)
    else:
        _run_water(grid, config, strategy, recorder, started)


def _run_vision(grid: Grid, config: AppConfig, strategy: SeededFedAvg, recorder: RunRecorder,
                started: float) -> None:
    initial, evaluate = central_evaluation(config, recorder)
    result = strategy.start(grid=grid, initial_arrays=initial,
                            num_rounds=config.num_server_rounds, timeout=config.round_timeout, evaluate_fn=evaluate)
    curve = {int(r): float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()}
    summary = {"task": "vision", "strategy": config.strategy, "rounds": config.num_server_rounds,
               "accuracy-per-round": [curve[r] for r in sorted(curve)],
               "final-accuracy": curve[max(curve)] if curve else None,
               **_selection_summary(strategy), "wall-seconds": time.time() - started}
    recorder.write_json("summary.json", summary)
    if curve:
        best = max(sorted(curve), key=curve.get)  # the earliest round with the highest accuracy
        accuracy_text = f"final test accuracy {100 * curve[max(curve)]:.2f} % (best {100 * curve[best]:.2f} % " \
                        f"at round {best})"
    else:
        accuracy_text = "no test accuracy (no round evaluated)"
    log.info("bouquet summary: vision, %s + %s, %d rounds: %s; %s", summary["selection"], config.strategy,
             config.num_server_rounds, accuracy_text, recorder.folder)


def _run_water(grid: Grid, config: AppConfig, strategy: SeededFedAvg, recorder: RunRecorder,
               started: float) -> None:
    _write_pool(config, recorder)
    torch.manual_seed(config.seed)
    model = LSTMForecaster(config.hidden_size, config.num_layers)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=config.num_server_rounds, timeout=config.round_timeout)

    if isinstance(strategy, HKFedAvg) and strategy.record_trajectories:
        write_trajectories(strategy, recorder.folder / "trajectories")
    rows = evaluate_every_node(grid, result.arrays, timeout=config.round_timeout, recorder=recorder)
    recorder.append_rows("clients", rows)
    mae = np.array([r["mae-litres"] for r in rows])
    mse = np.array([r["mse"] for r in rows])
    summary = {
        "strategy": config.strategy, "rounds": config.num_server_rounds, "clients-evaluated": len(rows),
        "mae-litres-mean": float(mae.mean()) if len(mae) else None,
        "mae-litres-std": float(mae.std()) if len(mae) else None,
        "mse-mean": float(mse.mean()) if len(mse) else None,
        **_selection_summary(strategy),
        "wall-seconds": time.time() - started,
    }
    recorder.write_json("summary.json", summary)
    if len(rows):
        log.info("bouquet summary: %s, %d rounds, %d clients: MAE %.2f +- %.2f L/day, MSE %.4f (scaled); %s",
                 config.strategy, config.num_server_rounds, len(rows), mae.mean(), mae.std(), mse.mean(),
                 recorder.folder)
    else:
        log.warning("bouquet summary: no client answered the final evaluation; %s", recorder.folder)
