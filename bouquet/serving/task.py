"""The server half that both tasks share: what a task's server side does, and the parts of its work that are
the same for every task (the final evaluation on every node and the summary's common entries).

A task's server half (:class:`ServerTask`; :class:`bouquet.serving.water.WaterServer`,
:class:`bouquet.serving.vision.VisionServer`) gives the run its initial model and, where the task
has one, its central evaluation, and writes the run's summary after the rounds.  The ServerApp wires it
to the strategy; the client side of each task is :class:`bouquet.tasks.base.Task`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from bouquet.algorithms.sckm import average_cardinality
from bouquet.checkpoint import Checkpoint
from bouquet.config import AppConfig
from bouquet.messages import MessageFactory, flower_message
from bouquet.personal_state import PersonalRun
from bouquet.results import RunRecorder
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.transport import FLOWER_TRANSPORT, Transport

__all__ = ["ServerTask", "attack_summary", "evaluate_every_node", "final_clients", "final_evaluation", "pooled_share",
           "run_summary", "selection_summary"]

log = logging.getLogger(__name__)


class ServerTask(Protocol):
    """A task's server half."""

    def new_model(self) -> torch.nn.Module:
        """A fresh model of the task (IFCA's cluster models are drawn with it)."""
        ...

    def begin(self, recorder: RunRecorder, checkpoint: Checkpoint | None
              ) -> tuple[ArrayRecord, Callable[[int, ArrayRecord], MetricRecord] | None]:
        """The initial model (drawn from the run's torch seed) and the central evaluation, if any."""
        ...

    def finish(self, grid: Grid, strategy: BouquetStrategy, result: Result, recorder: RunRecorder,
               checkpoint: Checkpoint | None, personal: PersonalRun | None, started: float) -> dict[str, Any]:
        """After the rounds: evaluate where the task does, write and log ``summary.json``; return it."""
        ...


def evaluate_every_node(grid: Grid, served: dict[int, tuple[str, ArrayRecord]], timeout: float,
                        recorder: RunRecorder | None = None,
                        new_message: MessageFactory = flower_message,
                        entries: dict[str, Any] | None = None, transport: Transport = FLOWER_TRANSPORT
                        ) -> list[dict[str, Any]]:
    """Evaluate on every node in ``served`` the model it is served (``node -> (store key, arrays)``).

    One row per replying node, with the key of its model (``model``).  A node's final arrays go to the run
    folder: its test-day forecasts (``predictions`` ArrayRecord) to ``predictions.csv`` (partition id,
    household, day, actual, served, model and baseline litres), its forecast of the days after its data
    (``ahead``) to ``forecast.csv``, and its forecaster (``model``, ``forecaster``) to ``models/``.  ``entries`` go into the evaluation config beside ``final``
    (the run that personal state belongs to).  The messages travel by ``transport`` (default Flower's
    ``grid.send_and_receive``).
    """
    config = ConfigRecord({"final": True, **(entries or {})})
    contents: dict[str, RecordDict] = {}
    messages = []
    for node, (key, arrays) in served.items():
        if key not in contents:
            contents[key] = RecordDict({"arrays": arrays, "config": config})
        messages.append(new_message(contents[key], "evaluate", node, "final"))
    answered = []
    for reply in transport.exchange(grid, messages, timeout):
        if reply.has_error():
            log.warning("final evaluation: node %d failed: %s", reply.metadata.src_node_id, reply.error.reason)
            continue
        row: dict[str, Any] = {"node_id": reply.metadata.src_node_id}
        row.update(dict(reply.content.config_records["info"]))
        row.update(dict(reply.content.metric_records["metrics"]))
        row["model"] = served[reply.metadata.src_node_id][0] if reply.metadata.src_node_id in served else ""
        answered.append((row, reply))
    rows = []
    # in partition order, not arrival order, so that predictions.csv is the same file in every run
    for row, reply in sorted(answered, key=lambda pair: pair[0]["partition-id"]):
        rows.append(row)
        if recorder is not None:
            _keep_final_arrays(recorder, row, reply.content.array_records)
    return rows


def _keep_final_arrays(recorder: RunRecorder, row: dict[str, Any], records: dict[str, ArrayRecord]) -> None:
    """A node's final arrays into the run folder: ``predictions`` (test days) to ``predictions.csv``,
    ``validation`` (the model's validation forecasts) to ``val-predictions.csv``, ``ahead`` (the days after its
    data) to ``forecast.csv``, ``model`` + ``forecaster`` to ``models/<partition-id>.npz``."""
    from bouquet.forecast import forecast_rows, save_forecaster

    arrays = {name: {k: v.numpy() for k, v in record.items()} for name, record in records.items()}
    if "predictions" in arrays:
        forecast = arrays["predictions"]
        days = forecast["day"].astype("datetime64[D]").astype(str)
        columns = [c for c in ("actual-litres", "predicted-litres", "model-litres", "baseline-litres") if c in forecast]
        recorder.append_rows("predictions", [
            {"partition-id": row["partition-id"], "household": row["household"], "day": day,
             **{c: float(forecast[c][i]) for c in columns}} for i, day in enumerate(days)])
    if "validation" in arrays:
        forecast = arrays["validation"]
        days = forecast["day"].astype("datetime64[D]").astype(str)
        recorder.append_rows("val-predictions", [
            {"partition-id": row["partition-id"], "household": row["household"], "day": day,
             "actual-litres": float(forecast["actual-litres"][i]), "model-litres": float(forecast["model-litres"][i])}
            for i, day in enumerate(days)])
    if "ahead" in arrays:
        recorder.append_rows("forecast", forecast_rows(arrays["ahead"], row["partition-id"], row["household"], row))
    if "model" in arrays and "forecaster" in arrays:
        save_forecaster(recorder.folder, row["partition-id"], row["household"], arrays["model"],
                        arrays["forecaster"], str(row.get("baseline", "")))


def final_clients(grid: Grid, config: AppConfig, strategy: BouquetStrategy, recorder: RunRecorder,
                   personal: PersonalRun | None = None) -> list[dict]:
    """Every node evaluates the model it is served; rows to ``clients.csv`` (with the model's key).  With
    ``fallback = "pooled"`` the nodes are first asked for their shares' errors (:func:`pooled_share`)."""
    served = strategy.serve(grid)
    entries = personal.entries() if personal is not None else {}
    return final_evaluation(grid, config, served, recorder, entries, strategy.transport)


def final_evaluation(grid: Grid, config: AppConfig, served: dict[int, tuple[str, ArrayRecord]], recorder: RunRecorder,
                     entries: dict[str, Any] | None = None, transport: Transport = FLOWER_TRANSPORT,
                     new_message: MessageFactory = flower_message) -> list[dict]:
    """Every node in ``served`` evaluates its model (:func:`evaluate_every_node`), told the pool's share first
    where the rule is ``pooled``; rows to ``clients.csv``."""
    entries = dict(entries or {})
    if config.fallback.rule == "pooled":
        share = pooled_share(grid, served, config.run.round_timeout, entries, transport, new_message)
        if share is not None:
            entries["fallback-share"] = share
    rows = evaluate_every_node(grid, served, timeout=config.run.round_timeout, recorder=recorder,
                               new_message=new_message, entries=entries, transport=transport)
    recorder.append_rows("clients", rows)
    return rows


def pooled_share(grid: Grid, served: dict[int, tuple[str, ArrayRecord]], timeout: float,
                 entries: dict[str, Any] | None = None, transport: Transport = FLOWER_TRANSPORT,
                 new_message: MessageFactory = flower_message) -> float | None:
    """``fallback = "pooled"``: every node scores each share of its model and its best naive forecaster on its
    validation days (``val-share-mae-<i>``); the share with the lowest sum over the nodes that answered
    (:func:`bouquet.forecasting.combine.pooled_weight`).  None (with a warning) where none answered."""
    from bouquet.forecasting.combine import COMBINATION_WEIGHTS, pooled_weight

    config = ConfigRecord({"fallback-shares": True, **(entries or {})})
    messages = [new_message(RecordDict({"arrays": arrays, "config": config}), "evaluate", node, "shares")
                for node, (_, arrays) in served.items()]
    errors = []
    for reply in transport.exchange(grid, messages, timeout):
        if reply.has_error():
            log.warning("pooled share: node %d failed: %s", reply.metadata.src_node_id, reply.error.reason)
            continue
        metrics = reply.content.metric_records["metrics"]
        errors.append([float(metrics[f"val-share-mae-{i}"]) for i in range(len(COMBINATION_WEIGHTS))])
    if not errors:
        log.warning("pooled share: no node answered; each node serves its own combination")
        return None
    share = pooled_weight(errors)
    log.info("fallback pooled: the model's share %.2f for every household (the lowest validation MAE summed over "
             "%d households)", share, len(errors))
    return share


def selection_summary(config: AppConfig, strategy: BouquetStrategy) -> dict[str, Any]:
    """The selector, and what it did: clusters per round and C* (eq. 10), sketch bytes."""
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


def run_summary(config: AppConfig, strategy: BouquetStrategy, checkpoint: Checkpoint | None,
                started: float) -> dict[str, Any]:
    """The entries every task's summary has: the selection (:func:`selection_summary`), the round a resumed
    run went on from (``resumed-after-round``, the last resume if several) and ``wall-seconds`` since
    ``started``."""
    resumed = {} if checkpoint is None else {"resumed-after-round": checkpoint.server_round}
    return {**selection_summary(config, strategy), **resumed, "wall-seconds": time.time() - started}


def attack_summary(config: AppConfig, rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The attackers (partition ids) and the honest clients' mean ``metric``, in attacked runs only."""
    if not config.attack.active:
        return {}
    bad = [bool(r.get("attacker", False)) for r in rows]
    honest = np.array([float(r[metric]) for r, b in zip(rows, bad) if not b])
    return {"attack": config.attack.attack, "attack-fraction": config.attack.fraction,
            "attack-scale": config.attack.strength,
            "attackers": sorted(int(r["partition-id"]) for r, b in zip(rows, bad) if b),
            f"{metric}-honest-mean": float(honest.mean()) if len(honest) else None}
