"""The bouquet ClientApp: one household's water-use forecaster per node.

The node's household is ``partition-id`` of the federated pool (see
:mod:`bouquet.data.water`), from ``context.node_config`` in simulation and from
``flower-supernode --node-config "partition-id=K data-path=..."`` in
deployment, where ``data-path`` names the node's own data file (it overrides
the run config's ``data-path``, so no data travels from the server).  A node
file holding a single household is that node's household whatever its
partition id, and the active-client filter (a comparison between households)
is not applied on the node.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from bouquet.config import AppConfig
from bouquet.flower_logging import route_to_flower
from bouquet.data.water import ClientWindows, load_pool
from bouquet.tasks.perfedavg import personalize, train_perfedavg
from bouquet.tasks.water import LSTMForecaster, evaluate_windows, predict, proximal_penalty, train_windows

route_to_flower()
app = ClientApp()


@functools.lru_cache(maxsize=8)
def _windows(config: AppConfig, partition_id: int, data_path: str | None) -> tuple[str, ClientWindows]:
    data = config.water_data(data_path)
    if data_path is not None:
        # A node's own file: the active filter compares households with each other, which a node holding
        # one household cannot do (the operator chose the household); history and window minimums apply.
        data = dataclasses.replace(data, active_factor=0.0)
    pool = load_pool(data)
    index = 0 if data_path is not None and len(pool) == 1 else partition_id
    windows = pool.client(index, data)  # a clear error when index is outside the pool
    return pool.households[index].household_id, windows


def node_data(context: Context) -> tuple[AppConfig, int, str, ClientWindows]:
    """Config, partition id, household id and windows of this node."""
    config = AppConfig.from_run_config(context.run_config)
    if "partition-id" not in context.node_config:
        raise KeyError("node config lacks 'partition-id' (start the SuperNode with --node-config \"partition-id=K\")")
    partition_id = int(context.node_config["partition-id"])
    data_path = context.node_config.get("data-path")
    household, windows = _windows(config, partition_id, None if data_path is None else str(data_path))
    return config, partition_id, household, windows


def _model(config: AppConfig, arrays: ArrayRecord) -> LSTMForecaster:
    torch.set_num_threads(1)
    model = LSTMForecaster(config.hidden_size, config.num_layers)
    model.load_state_dict(arrays.to_torch_state_dict())
    return model


def _info(partition_id: int, household: str) -> ConfigRecord:
    """Identity of the replying node, kept out of the averaged metrics."""
    return ConfigRecord({"partition-id": partition_id, "household": household})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """E local epochs of Adam from the received global model."""
    config, partition_id, household, windows = node_data(context)
    server_round = int(msg.content["config"].get("server-round", 0))
    model = _model(config, msg.content["arrays"])
    rng = np.random.default_rng([config.seed, server_round, partition_id])
    torch.manual_seed(int(rng.integers(2**31)))
    if config.strategy.startswith("perfedavg-"):
        loss = train_perfedavg(model, windows.x_train, windows.y_train, config.local_epochs, config.batch_size,
                               config.perfedavg_settings(), rng)
    else:
        mu = float(msg.content["config"].get("proximal-mu", 0.0))  # sent by FedProx
        penalty = proximal_penalty(model, mu) if mu > 0 else None
        loss = train_windows(model, windows, config.train_settings(), rng, penalty=penalty)
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(windows.y_train)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics,
                          "info": _info(partition_id, household)})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Held-out MSE/MAE (scaled and in litres/day) of the received model."""
    config, partition_id, household, windows = node_data(context)
    model = _model(config, msg.content["arrays"])
    if config.strategy.startswith("perfedavg-"):  # Per-FedAvg evaluates after one personal step
        server_round = int(msg.content["config"].get("server-round", 0))
        rng = np.random.default_rng([config.seed, server_round, partition_id, 1])
        personalize(model, windows.x_train, windows.y_train, config.perfedavg_alpha, config.batch_size, rng)
    metrics = {**evaluate_windows(model, windows), "num-examples": len(windows.y_test)}
    content = RecordDict({"metrics": MetricRecord(metrics), "info": _info(partition_id, household)})
    if msg.content["config"].get("final", False):  # the final evaluation also returns the forecasts
        content["predictions"] = ArrayRecord({
            "day": Array(windows.test_days.astype("datetime64[D]").astype(np.int64)),
            "actual-litres": Array(windows.to_litres(windows.y_test)),
            "predicted-litres": Array(windows.to_litres(predict(model, windows.x_test)))})
    return Message(content, reply_to=msg)
