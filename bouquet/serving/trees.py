"""The server half of the federated tree forecaster (``forecast-model = "trees"``): the fit over Flower's messages.

Every node of the federation takes part in every exchange (each household's rows are in every sum).  The
server waits for the pool's nodes, asks each for its identity (the stable order the sums are added in),
merges their sketches into bins, then grows the trees level by level (:func:`bouquet.algorithms.trees.fit`
over :class:`bouquet.tree_messages.FlowerSource`), logging its progress, and writes ``trees.csv`` (the validation
MAE after each number of trees, and the exchanges and seconds so far).  The fitted ensemble is then evaluated on
every node like the LSTM's final model (:func:`bouquet.serving.task.evaluate_every_node`), and the run's summary
holds what the fit cost: exchanges, bytes each way, the fit's seconds and the server's own work per exchange.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp import Grid

from bouquet.algorithms.trees import Ensemble, FitLog, fit
from bouquet.config import AppConfig
from bouquet.messages import flower_message
from bouquet.results import RunRecorder
from bouquet.serving.task import evaluate_every_node
from bouquet.strategies.sampling import NodeOrder
from bouquet.transport import PollingTransport, Transport
from bouquet.tree_messages import FlowerSource

__all__ = ["evaluate_trees", "fit_trees"]

log = logging.getLogger(__name__)


def fit_trees(grid: Grid, config: AppConfig, expected_nodes: int, recorder: RunRecorder | None = None,
              transport: Transport | None = None) -> tuple[Ensemble, list[int], dict[str, Any]]:
    """Fit the run's trees over every connected node (after waiting up to ``node-wait-seconds`` for
    ``expected_nodes``).  Returns the ensemble, the nodes in their stable order and the fit's costs."""
    transport = transport or PollingTransport(config.transport)
    order = NodeOrder(config.sampling.node_wait_seconds, flower_message, identify=True, transport=transport)
    nodes = order.connected(grid, 0, max(expected_nodes, 1))
    params = config.trees
    source = FlowerSource(grid, nodes, config.run.round_timeout, transport)
    started = time.monotonic()
    levels = params.max_depth + (1 if params.renews else 0)
    log.info("trees: fitting %d trees (depth %d, %s) over %d nodes: up to %d exchanges", params.trees,
             params.max_depth, params.objective, len(nodes), params.trees * levels + 3)
    rows: list[dict[str, Any]] = []

    def progress(done: int, fit_log: FitLog) -> None:
        rows.append({"trees": done, "exchanges": fit_log.exchanges, "seconds": time.monotonic() - started})
        if done % 10 == 0 or done == params.trees:
            val = fit_log.validation[-1] if fit_log.validation else float("nan")
            log.info("trees: %d/%d, %d exchanges, %.0f s; validation MAE %.2f L/day after %d trees", done,
                     params.trees, fit_log.exchanges, time.monotonic() - started, val, done - 1)

    ensemble, fit_log = fit(source, params, progress=progress)
    seconds = time.monotonic() - started
    if recorder is not None:
        done = {r["trees"]: r for r in rows}
        curve = [{"trees": k, "val-mae-litres": v, "exchanges": done.get(k, {}).get("exchanges", ""),
                  "seconds": done.get(k, {}).get("seconds", "")} for k, v in enumerate(fit_log.validation)]
        recorder.append_rows("trees", curve)
    server = max(seconds - source.wait_seconds, 0.0)
    costs = {**source.describe(), "exchanges": fit_log.exchanges, "fit-seconds": seconds,
             "server-seconds-per-exchange": server / max(fit_log.exchanges, 1),
             "val-mae-litres-by-trees": [float(v) for v in fit_log.validation]}
    log.info("trees: fitted in %.0f s, %d exchanges, %.1f MB to the nodes and %.1f MB back; the server's own work "
             "%.1f ms an exchange", seconds, fit_log.exchanges, source.bytes_sent / 1e6, source.bytes_received / 1e6,
             1000 * costs["server-seconds-per-exchange"])
    return ensemble, nodes, costs


def evaluate_trees(grid: Grid, config: AppConfig, ensemble: Ensemble, nodes: list[int], recorder: RunRecorder,
                   transport: Transport | None = None) -> list[dict[str, Any]]:
    """Every node evaluates the ensemble (its served forecast, its forecasts ahead); rows to ``clients.csv``."""
    record = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in ensemble.to_arrays().items()})
    rows = evaluate_every_node(grid, dict.fromkeys(nodes, ("trees", record)), timeout=config.run.round_timeout,
                               recorder=recorder, transport=transport or PollingTransport(config.transport))
    recorder.append_rows("clients", rows)
    return rows
