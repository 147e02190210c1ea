"""The bouquet ClientApp: one household's water-use forecaster, or one image shard, per node.

``task = "water"``: the node is a household (below).  ``task = "vision"``:
the node holds client ``partition-id`` of ``num-partitions`` non-IID image
partitions (:mod:`bouquet.data.images`) and trains ``local-batches`` SGD
steps; the global model is evaluated centrally by the server.  For either
task the app answers ``query.identify`` (its partition-id, so that the server
samples the same clients every run: :mod:`bouquet.node_identity`) and
``query.sketch`` (client selection,
:mod:`bouquet.sketching`) and, when a training message asks for it
(piggyback selection), attaches a sketch to its training reply.

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
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from bouquet.config import AppConfig
from bouquet.data.images import ImageData, load_images, partition
from bouquet.data.water import ClientWindows, load_pool
from bouquet.flower_logging import route_to_flower
from bouquet.node_identity import (
    node_config_ints,
    partition_id,
    register_identity_query,
)
from bouquet.sketching import SketchRequest, register_sketch_query, sketch_records
from bouquet.tasks.perfedavg import personalize, train_perfedavg
from bouquet.tasks.vision import batch_at, batch_indices, make_model, train_batches
from bouquet.tasks.water import (
    LSTMForecaster,
    evaluate_windows,
    predict,
    proximal_penalty,
    train_windows,
)

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
    node_partition = partition_id(context)
    data_path = context.node_config.get("data-path")
    household, windows = _windows(config, node_partition, None if data_path is None else str(data_path))
    return config, node_partition, household, windows


@functools.lru_cache(maxsize=2)
def _partitioned(config: AppConfig, num_partitions: int) -> tuple[ImageData, list[np.ndarray]]:
    """The decoded images and their client partition, once per worker process and run.

    A simulation worker serves many partitions in turn; re-reading the decoded image cache for each
    (0.1-0.5 s for CIFAR-10) cost more than the sketch or training step it was read for.
    """
    data = load_images(config.vision_data())
    return data, partition(data.y_train, num_partitions, config.vision_data())


@functools.lru_cache(maxsize=8)
def _shard(config: AppConfig, partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray, tuple]:
    data, parts = _partitioned(config, num_partitions)
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    rows = parts[partition_id]
    return data.x_train[rows], data.y_train[rows], (data.shape, len(data.classes))


def vision_data(context: Context) -> tuple[AppConfig, int, np.ndarray, np.ndarray, tuple]:
    """Config, partition id, this node's training images and labels, (image shape, classes)."""
    config = AppConfig.from_run_config(context.run_config)
    node_partition, num_partitions = node_config_ints(context, "partition-id", "num-partitions")
    x, y, meta = _shard(config, node_partition, num_partitions)
    return config, node_partition, x, y, meta


def new_model(context: Context) -> torch.nn.Module:
    """An untrained model of this run's task (weights come from the server)."""
    torch.set_num_threads(1)
    config = AppConfig.from_run_config(context.run_config)
    if config.task == "vision":
        _, _, _, _, (shape, classes) = vision_data(context)
        return make_model(config.vision_model, shape, classes)
    return LSTMForecaster(config.hidden_size, config.num_layers)


def _model(context: Context, arrays: ArrayRecord) -> torch.nn.Module:
    model = new_model(context)
    model.load_state_dict(arrays.to_torch_state_dict())
    return model


def _training_set(context: Context) -> tuple[np.ndarray, np.ndarray]:
    config = AppConfig.from_run_config(context.run_config)
    if config.task == "vision":
        _, _, x, y, _ = vision_data(context)
        return x, y
    _, _, _, windows = node_data(context)
    return windows.x_train, windows.y_train


def training_batch(context: Context, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One mini-batch of this node's training data (images, or household windows)."""
    x, y = _training_set(context)
    if AppConfig.from_run_config(context.run_config).task == "vision":
        return batch_at(x, y, batch_size, rng)
    pick = batch_indices(len(y), batch_size, rng)
    return torch.from_numpy(x[pick]), torch.from_numpy(y[pick])


def task_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for class labels (integer targets), MSE for forecasts (float targets)."""
    if not targets.dtype.is_floating_point:
        return torch.nn.functional.cross_entropy(outputs, targets.long())
    return torch.nn.functional.mse_loss(outputs, targets)


register_identity_query(app)  # the server orders nodes by partition-id: same seed, same clients
register_sketch_query(app, model_fn=new_model, batch_fn=training_batch,
                      num_examples_fn=lambda context: len(_training_set(context)[1]), loss_fn=task_loss,
                      seed_fn=partition_id)


def _start_training(msg: Message, context: Context, seed: int,
                    partition_id: int) -> tuple[torch.nn.Module, torch.nn.Module | None, np.random.Generator]:
    """The received model to train, a copy of it when a piggyback sketch is asked for, and the round's rng."""
    model = _model(context, msg.content["arrays"])
    received = _model(context, msg.content["arrays"]) if "sketch-seed" in msg.content["config"] else None
    server_round = int(msg.content["config"].get("server-round", 0))
    rng = np.random.default_rng([seed, server_round, partition_id])
    torch.manual_seed(int(rng.integers(2**31)))
    return model, received, rng


def _training_reply(msg: Message, context: Context, content: RecordDict, received: torch.nn.Module | None,
                    rng: np.random.Generator) -> Message:
    """The training reply; with piggyback selection, plus the sketch of the received model."""
    request = SketchRequest.from_config(msg.content["config"])
    if received is not None and request is not None:
        batch = training_batch(context, request.batch_size, rng)
        extra = sketch_records(received, batch, request, len(_training_set(context)[1]), task_loss)
        content = RecordDict({**dict(content.items()), **extra})
    return Message(content, reply_to=msg)


def _info(partition_id: int, household: str) -> ConfigRecord:
    """Identity of the replying node, kept out of the averaged metrics."""
    return ConfigRecord({"partition-id": partition_id, "household": household})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training from the received global model (E epochs of Adam, or local-batches of SGD)."""
    config = AppConfig.from_run_config(context.run_config)
    if config.task == "vision":
        return _train_vision(msg, context)
    config, partition_id, household, windows = node_data(context)
    model, received, rng = _start_training(msg, context, config.seed, partition_id)
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
    return _training_reply(msg, context, content, received, rng)


def _train_vision(msg: Message, context: Context) -> Message:
    config, partition_id, x, y, _ = vision_data(context)
    model, received, rng = _start_training(msg, context, config.seed, partition_id)
    mu = float(msg.content["config"].get("proximal-mu", 0.0))  # sent by FedProx
    penalty = proximal_penalty(model, mu) if mu > 0 else None
    loss = train_batches(model, x, y, config.vision_train_settings(), rng, penalty=penalty)
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics,
                          "info": _info(partition_id, "")})
    return _training_reply(msg, context, content, received, rng)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Held-out MSE/MAE (scaled and in litres/day) of the received model."""
    config, partition_id, household, windows = node_data(context)
    model = _model(context, msg.content["arrays"])
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
