"""The server half of the federated tree forecaster (``forecast-model = "trees"``): the fit over Flower's messages.

Every node of the federation takes part in every exchange (each household's rows are in every sum).  The
server waits for the pool's nodes, asks each for its identity (the stable order the sums are added in),
merges their sketches into bins, then grows the trees level by level (:func:`bouquet.algorithms.trees.fit`
over :class:`bouquet.tree_messages.FlowerSource`), logging its progress, and writes ``trees.csv`` (the validation
MAE after each number of trees, and the exchanges and seconds so far).  The fitted ensemble is then evaluated on
every node like the LSTM's final model (:func:`bouquet.serving.task.evaluate_every_node`), and the run's summary
holds what the fit cost: exchanges, bytes each way, the fit's seconds and the server's own work per exchange.
Where ``tree-coalitions`` gives a partition of the nodes, one ensemble is grown per coalition, each over its
own nodes only, and each node is served its coalition's.
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
from bouquet.forecasting.features import feature_grid
from bouquet.messages import MessageFactory, flower_message
from bouquet.results import RunRecorder
from bouquet.serving.task import final_evaluation
from bouquet.strategies.sampling import NodeOrder
from bouquet.transport import PollingTransport, Transport
from bouquet.tree_messages import FlowerSource

__all__ = ["ALL", "SETTLE_SECONDS", "coalitions", "evaluate_trees", "fit_trees", "wait_for_nodes"]

log = logging.getLogger(__name__)


def fit_trees(grid: Grid, config: AppConfig, expected_nodes: int, recorder: RunRecorder | None = None,
              transport: Transport | None = None, new_message: MessageFactory = flower_message
              ) -> tuple[dict[int, tuple[str, Ensemble]], dict[str, Any]]:
    """Fit the run's trees over every connected node (after waiting up to ``node-wait-seconds`` for
    ``expected_nodes``), one ensemble per coalition where ``tree-coalitions`` gives a partition
    (:func:`coalitions`).  Returns each node's coalition and ensemble, and the fits' costs."""
    transport = transport or PollingTransport(config.transport)
    order = NodeOrder(config.sampling.node_wait_seconds, new_message, identify=True, transport=transport)
    nodes = order.order(grid, wait_for_nodes(grid, expected_nodes, config.sampling.node_wait_seconds))
    groups = coalitions(config, {node: order.keys.get(node) for node in nodes})
    served: dict[int, tuple[str, Ensemble]] = {}
    costs: dict[str, Any] = {}
    for label, members in groups.items():
        ensemble, costs[label] = _fit_one(grid, config, members, label, recorder, transport, new_message)
        served |= dict.fromkeys(members, (label, ensemble))
    if list(groups) == [ALL]:
        return served, costs[ALL]
    total = {key: sum(c[key] for c in costs.values()) for key in ("exchanges", "fit-seconds", "bytes-to-nodes",
                                                                  "bytes-from-nodes", "wait-seconds")}
    return served, {**total, "nodes": len(nodes), "coalitions": costs}


#: The coalition of a fit over every node.
ALL = "all"


def coalitions(config: AppConfig, partition_ids: dict[int, int | None]) -> dict[str, list[int]]:
    """The nodes of each coalition (``tree-coalitions``), in their stable order: ``none``, every node in one;
    ``groups``, the pool's known groups (a benchmark with household types; the server reads the pool);
    a CSV file with columns ``partition-id`` and ``coalition``, every node's partition id in it."""
    spec = config.trees.coalitions
    nodes = list(partition_ids)
    if spec == "none":
        return {ALL: nodes}
    if spec == "groups":
        from bouquet.data.water import load_pool

        pool = load_pool(config.water_data)
        labels = {node: pool.group_of(int(pid)) if pid is not None else "" for node, pid in partition_ids.items()}
        if not all(labels.values()):
            raise ValueError("tree-coalitions = \"groups\" needs a pool with known groups on the server "
                             "(synthetic-types); some nodes have none")
    else:
        import pandas as pd

        table = pd.read_csv(spec)
        if not {"partition-id", "coalition"} <= set(table.columns):
            raise ValueError(f"tree-coalitions: {spec} needs the columns partition-id and coalition, it has "
                             f"{', '.join(map(str, table.columns))}")
        mapping = dict(zip(table["partition-id"].astype(int), table["coalition"].astype(str)))
        missing = sorted(int(pid) for pid in partition_ids.values() if pid is not None and int(pid) not in mapping)
        if missing or any(pid is None for pid in partition_ids.values()):
            raise ValueError(f"tree-coalitions: {spec} names no coalition for partition ids {missing[:10]}")
        labels = {node: mapping[int(pid)] for node, pid in partition_ids.items()}
    out: dict[str, list[int]] = {}
    for node in nodes:
        out.setdefault(labels[node], []).append(node)
    log.info("trees: one ensemble per coalition: %s", ", ".join(f"{k} ({len(v)} nodes)" for k, v in sorted(out.items())))
    return dict(sorted(out.items()))


def _fit_one(grid: Grid, config: AppConfig, nodes: list[int], label: str, recorder: RunRecorder | None,
             transport: Transport, new_message: MessageFactory) -> tuple[Ensemble, dict[str, Any]]:
    """One ensemble over ``nodes``: the fit, its progress lines, its rows of ``trees.csv`` and its costs."""
    params = config.trees
    source = FlowerSource(grid, nodes, config.run.round_timeout, transport, new_message, secure=params.secure_sums)
    started = time.monotonic()
    levels = params.max_depth + (1 if params.renews else 0)
    who = "" if label == ALL else f"coalition {label}: "
    log.info("trees: %sfitting %d trees (depth %d, %s) over %d nodes: up to %d exchanges", who, params.trees,
             params.max_depth, params.objective, len(nodes), params.trees * levels + 3)
    rows: list[dict[str, Any]] = []

    def progress(done: int, fit_log: FitLog) -> None:
        rows.append({"trees": done, "exchanges": fit_log.exchanges, "seconds": time.monotonic() - started})
        if done % 10 == 0 or done == params.trees:
            val = fit_log.validation[-1] if fit_log.validation else float("nan")
            log.info("trees: %s%d/%d, %d exchanges, %.0f s; validation MAE %.2f L/day after %d trees", who, done,
                     params.trees, fit_log.exchanges, time.monotonic() - started, val, done - 1)

    fine = feature_grid(config.tree_features) if params.bins == "grid" else None
    ensemble, fit_log = fit(source, params, progress=progress, grid=fine)
    seconds = time.monotonic() - started
    if recorder is not None:
        done = {r["trees"]: r for r in rows}
        recorder.append_rows("trees", [
            {"coalition": label, "trees": k, "val-mae-litres": v, "exchanges": done.get(k, {}).get("exchanges", ""),
             "seconds": done.get(k, {}).get("seconds", "")} for k, v in enumerate(fit_log.validation)])
    server = max(seconds - source.wait_seconds, 0.0)
    costs = {**source.describe(), "exchanges": fit_log.exchanges, "fit-seconds": seconds,
             "server-seconds-per-exchange": server / max(fit_log.exchanges, 1),
             "val-mae-litres-by-trees": [float(v) for v in fit_log.validation]}
    log.info("trees: %sfitted in %.0f s, %d exchanges, %.1f MB to the nodes and %.1f MB back; the server's own work "
             "%.1f ms an exchange", who, seconds, fit_log.exchanges, source.bytes_sent / 1e6,
             source.bytes_received / 1e6, 1000 * costs["server-seconds-per-exchange"])
    return ensemble, costs


#: Seconds without a new node after which the fit goes on with the nodes there (a simulation with fewer SuperNodes
#: than the pool has households; deployed SuperNodes are long-running and are there when a run starts).
SETTLE_SECONDS = 5.0


def wait_for_nodes(grid: Grid, expected: int, wait_seconds: float, settle: float = SETTLE_SECONDS,
                   clock: Any = time.monotonic, sleep: Any = time.sleep) -> list[int]:
    """The connected nodes once ``expected`` of them are there, or no new one came for ``settle`` seconds (with at
    least one there), or ``wait_seconds`` passed; a line says so when fewer than ``expected`` take part."""
    started = clock()
    nodes = list(grid.get_node_ids())
    changed = started
    while len(nodes) < expected and clock() - started < wait_seconds:
        if nodes and clock() - changed >= settle:
            break
        sleep(0.5)
        now = list(grid.get_node_ids())
        if len(now) != len(nodes):
            nodes, changed = now, clock()
    if len(nodes) < expected:
        log.info("trees: %d nodes connected (the pool has %d households); the fit runs over these", len(nodes),
                 expected)
    return nodes


def evaluate_trees(grid: Grid, config: AppConfig, served: dict[int, tuple[str, Ensemble]], recorder: RunRecorder,
                   transport: Transport | None = None) -> list[dict[str, Any]]:
    """Every node evaluates its coalition's ensemble (its served forecast, its forecasts ahead); rows to
    ``clients.csv`` (``model``: the coalition)."""
    records: dict[str, ArrayRecord] = {}
    for label, ensemble in served.values():
        if label not in records:
            records[label] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in ensemble.to_arrays().items()})
    return final_evaluation(grid, config, {node: (label, records[label]) for node, (label, _) in served.items()},
                            recorder, transport=transport or PollingTransport(config.transport))
