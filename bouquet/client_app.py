"""The bouquet ClientApp: one household's water-use forecaster, or one image shard, per node.

Each message is handled the same way: the run config is parsed once (:class:`bouquet.config.AppConfig`),
:func:`node_task` builds this node's :class:`bouquet.tasks.base.Task` once (the one place that looks at
``task``), and the handler runs it.  ``task = "water"``: the node is household ``partition-id`` of the
federated pool (:class:`bouquet.tasks.water.WaterTask`).  ``task = "vision"``: the node holds client
``partition-id`` of ``num-partitions`` non-IID image partitions and trains ``local-batches`` SGD steps
(:class:`bouquet.tasks.vision.VisionTask`).  For either task the app answers ``query.identify`` (its
partition-id, so that the server samples the same clients every run: :mod:`bouquet.node_identity`),
``query.sketch`` (client selection, :mod:`bouquet.sketching`) and ``query.losses`` (IFCA's choice of
cluster, :mod:`bouquet.losses`) and, when a training message asks for it (piggyback selection),
attaches a sketch to its training reply.  In a benchmark with known groups its replies name its group.

Personalisation (water task; :class:`bouquet.tasks.params.PersonalParams`): ``personalize-epochs``
fine-tunes the served model before each evaluation; ``personal-layers = "head"`` keeps the output layer on
the node (the reply carries the head it was sent); ``ditto-lambda`` trains a personal model beside the
federated one.  Personal state lives in the node's ``context.state``, backed by the node's own files
(:mod:`bouquet.personal_state`), so a node that restarts and a resumed run find it again.

The node's identity comes from ``context.node_config`` in simulation and from
``flower-supernode --node-config "partition-id=K data-path=..."`` in deployment, where ``data-path``
names the node's own data file (it overrides the run config's ``data-path``, so no data travels from the
server).  A node file holding a single household is that node's household whatever its partition id,
and the active-client filter (a comparison between households) is not applied on the node.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from bouquet.algorithms.attacks import DATA_ATTACKS, MODEL_ATTACKS, AttackParams, attackers, poison_update
from bouquet.config import AppConfig
from bouquet.flower_logging import route_to_flower
from bouquet.losses import register_loss_query
from bouquet.node_identity import node_config_ints, partition_id, register_identity_query
from bouquet.personal_state import PersonalRun, load_personal, save_personal
from bouquet.queries import SketchRequest
from bouquet.sketching import register_sketch_query, sketch_records
from bouquet.tasks.base import Task, head_keys, task_loss
from bouquet.tasks.trees import TreeWaterTask
from bouquet.tasks.vision import VisionTask
from bouquet.tasks.water import WaterTask
from bouquet.tree_messages import register_tree_query

__all__ = ["app", "is_attacker", "node_task", "trees", "vision_task", "water_task"]

route_to_flower()
app = ClientApp()


def node_task(config: AppConfig, context: Context) -> Task:
    """This node's task for the run ``config``, built once per worker for each node and run config and then
    reused (a sketch query alone asks for it three times)."""
    torch.set_num_threads(1)  # one simulated client per core: torch's own threads would oversubscribe them
    key = (config, tuple(sorted((str(k), str(v)) for k, v in context.node_config.items())))
    task = _TASKS.pop(key, None)
    if task is None:
        task = _build_task(config, context)
    _TASKS[key] = task  # the most recently used last; the least recently used goes first
    while len(_TASKS) > _TASKS_KEPT:
        _TASKS.popitem(last=False)
    return task


#: Tasks kept per worker (a simulation worker serves many nodes in turn; each task holds one node's data).
_TASKS_KEPT = 256
_TASKS: OrderedDict[tuple, Task] = OrderedDict()


def _build_task(config: AppConfig, context: Context) -> Task:
    """The task's client half, from its row's ``node`` (:mod:`bouquet.tasks.registry`)."""
    return config.task.node_half()(config, context)


def vision_task(config: AppConfig, context: Context) -> Task:
    """The vision task's client half: the node's image shard (``partition-id`` of ``num-partitions``)."""
    node, num_partitions = node_config_ints(context, "partition-id", "num-partitions")
    return VisionTask.for_node(config.vision_data, config.vision_model, config.vision_train, node, num_partitions)


def water_task(config: AppConfig, context: Context) -> Task:
    """The water task's client half: household ``partition-id`` of the pool, or the node's own meter file
    (node config ``data-path``), under the LSTM or, with ``forecast-model = "trees"``, the federated trees
    (:class:`bouquet.tasks.trees.TreeWaterTask`)."""
    data_path = context.node_config.get("data-path")
    if config.forecast_model.trees:
        return TreeWaterTask.for_node(config.water_data, config.trees, config.tree_features, partition_id(context),
                                      None if data_path is None else str(data_path), config.fallback)
    perfedavg = config.perfedavg_settings() if config.family.meta_learning else None
    return WaterTask.for_node(config.water_data, config.water_model, config.water_train, perfedavg,
                              partition_id(context), None if data_path is None else str(data_path), config.personal,
                              config.fallback)


def _task(context: Context) -> Task:
    return node_task(AppConfig.from_run_config(context.run_config), context)


def _loaded(task: Task, arrays: ArrayRecord) -> torch.nn.Module:
    load = getattr(task, "load", None)  # a forecaster that is not a torch module (the trees) loads itself
    if load is not None:
        return load({k: v.numpy() for k, v in arrays.items()})
    model = task.new_model()
    model.load_state_dict(arrays.to_torch_state_dict())
    return model


def _info(task: Task, attacker: bool | None = None) -> ConfigRecord:
    """Identity of the replying node (its known group in a benchmark; in attacked runs, whether it attacks).

    ``attacker`` is None outside attacked runs, so that their records carry no such column.
    """
    info = {"partition-id": task.partition_id, "household": task.household}
    if task.group:
        info["group"] = task.group
    if attacker is not None:
        info["attacker"] = attacker
    return ConfigRecord(info)


def _attacker_flag(config: AppConfig, context: Context, task: Task) -> bool | None:
    return is_attacker(config, context, task) if config.attack.active else None


def is_attacker(config: AppConfig, context: Context, task: Task) -> bool:
    """Whether this node is one of the run's attackers (:func:`bouquet.algorithms.attacks.attackers`).

    The draw needs the federation's size: ``num-partitions`` in the node config (set by the simulation;
    give it to a deployed SuperNode with ``--node-config "partition-id=K num-partitions=N"``).
    """
    attack = config.attack
    if not attack.active:
        return False
    (num_partitions,) = node_config_ints(context, "num-partitions")
    return task.partition_id in attackers(num_partitions, attack.fraction, config.sampling.seed)


def _poison_model(model: torch.nn.Module, received: ArrayRecord, attack: AttackParams,
                  rng: np.random.Generator) -> dict[str, Array]:
    """The attacker's model: ``theta + poison(w - theta)`` for each floating array (:func:`poison_update`)."""
    out = {}
    for name, value in model.state_dict().items():
        w = value.detach().cpu().numpy()
        if np.issubdtype(w.dtype, np.floating):
            theta = received[name].numpy()
            w = (theta + poison_update(w - theta, attack.attack, attack.strength, rng)).astype(w.dtype)
        out[name] = Array(np.ascontiguousarray(w))
    return out


register_identity_query(app)  # the server orders nodes by partition-id: same seed, same clients
trees = register_tree_query(app, task_fn=_task)  # query.trees: the federated trees' exchanges
register_sketch_query(app, model_fn=lambda context: _task(context).new_model(),
                      batch_fn=lambda context, size, rng: _task(context).training_batch(size, rng),
                      num_examples_fn=lambda context: _task(context).num_examples, loss_fn=task_loss,
                      seed_fn=partition_id)
register_loss_query(app, model_fn=lambda context: _task(context).new_model(),
                    loss_fn=lambda context, model, examples, rng: _task(context).loss(model, examples, rng),
                    seed_fn=partition_id)


def _personal_run(config: AppConfig, message_config: ConfigRecord) -> PersonalRun | None:
    """The run a stateful personalisation's state belongs to (named by the server), else None."""
    if not config.personal.stateful:
        return None
    run = PersonalRun.from_config(message_config)
    if run is None:
        raise ValueError("personal-layers / ditto-lambda keep state per run, but the message names no run "
                         "('personal-run' in its config; bouquet's ServerApp sends it)")
    return run


def _numpy_state(model: torch.nn.Module, keys: list[str] | None = None) -> dict[str, np.ndarray]:
    state = model.state_dict()
    return {k: state[k].detach().cpu().numpy().copy() for k in (keys if keys is not None else state)}


def _with_personal(task: Task, config: AppConfig, model: torch.nn.Module, personal: dict[str, np.ndarray] | None
                   ) -> torch.nn.Module:
    """The model a node uses: its personal head over the served body, or its Ditto model (the served model
    until it has one)."""
    if personal is None:
        return model
    tensors = {k: torch.from_numpy(v) for k, v in personal.items()}
    if config.personal.ditto_lambda > 0:
        own = task.new_model()
        own.load_state_dict(tensors)
        return own
    model.load_state_dict(tensors, strict=False)
    return model


def _save_personal(config: AppConfig, context: Context, run: PersonalRun, server_round: int,
                   arrays: dict[str, np.ndarray]) -> None:
    save_personal(context, run, server_round, arrays, config.checkpoint, config.run.num_server_rounds,
                  config.personal.state_dir)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training from the received global model (E epochs of Adam, or local-batches of SGD).

    With a piggyback request in the config, the reply also carries the sketch of the received model.  An
    attacker (:func:`is_attacker`) trains on poisoned data (data attacks) or sends a poisoned model (model
    attacks; its piggybacked sketch stays honest), and says so in its ``info`` record.
    """
    config = AppConfig.from_run_config(context.run_config)
    task = node_task(config, context)
    attacker = is_attacker(config, context, task)
    if attacker and config.attack.attack in DATA_ATTACKS:
        task = task.poisoned(config.attack.attack, config.attack.strength)
    arrays, train_config = msg.content["arrays"], msg.content["config"]
    model = _loaded(task, arrays)
    request = SketchRequest.from_config(train_config)
    received = _loaded(task, arrays) if request is not None else None
    server_round = int(train_config.get("server-round", 0))
    run = _personal_run(config, train_config)
    personal = load_personal(context, run, server_round - 1, config.personal.state_dir) if run else None
    if config.personal.layers == "head":
        model = _with_personal(task, config, model, personal)
    rng = np.random.default_rng([config.sampling.seed, server_round, task.partition_id])
    torch.manual_seed(int(rng.integers(2**31)))
    loss = task.train(model, rng, float(train_config.get("proximal-mu", 0.0)))  # proximal-mu: sent by FedProx
    trained = ArrayRecord(model.state_dict())
    if run is not None and config.personal.layers == "head":  # the trained head stays here; the served one goes back
        head = head_keys(model)
        _save_personal(config, context, run, server_round, _numpy_state(model, head))
        trained = ArrayRecord({k: arrays[k] if k in head else Array(v) for k, v in _numpy_state(model).items()})
    elif run is not None:  # Ditto: the personal model's own step, pulled toward the served model
        own = _with_personal(task, config, _loaded(task, arrays), personal)
        ditto = np.random.default_rng([config.sampling.seed, server_round, task.partition_id, 4])
        torch.manual_seed(int(ditto.integers(2**31)))
        task.train_personal(own, _loaded(task, arrays), ditto)
        _save_personal(config, context, run, server_round, _numpy_state(own))
    if attacker and config.attack.attack in MODEL_ATTACKS:
        noise = np.random.default_rng([config.sampling.seed, server_round, task.partition_id, 2])
        trained = ArrayRecord(_poison_model(model, arrays, config.attack, noise))
    content = RecordDict({"arrays": trained,
                          "metrics": MetricRecord({"train-loss": loss, "num-examples": task.num_examples}),
                          "info": _info(task, attacker if config.attack.active else None)})
    if received is not None:
        batch = task.training_batch(request.batch_size, rng)
        content = RecordDict({**dict(content.items()),
                              **sketch_records(received, batch, request, task.num_examples, task_loss)})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Held-out MSE/MAE (scaled and in litres/day) of the received model (with the node's personal head or
    Ditto model, fine-tuned first with ``personalize-epochs``) on the validation windows (``val-*``), and on the
    test windows in the final evaluation (or every round where there is no validation split; never where the
    test period is locked).  The final one adds the naive forecasters' MAE on the same days (``naive-*``,
    ``naive-val-*``), what the node serves (``fallback``), its test-day forecasts, its forecast of the days
    after its data (written to the node's own forecast file in a deployment) and the model it forecasts
    with."""
    config = AppConfig.from_run_config(context.run_config)
    task = node_task(config, context)
    message_config = msg.content["config"]
    if "fallback-share" in message_config:  # fallback = "pooled": the share the server chose for every node
        share = float(message_config["fallback-share"])
        task = dataclasses.replace(task, fallback=dataclasses.replace(task.fallback, share=share))
    model = _loaded(task, msg.content["arrays"])
    server_round = int(message_config.get("server-round", 0))
    rng = np.random.default_rng([config.sampling.seed, server_round, task.partition_id, 1])
    final = bool(message_config.get("final", False)) or bool(message_config.get("fallback-shares", False))
    run = _personal_run(config, message_config)
    if run is not None:  # the final evaluation comes after every round
        upto = config.run.num_server_rounds if final else server_round
        model = _with_personal(task, config, model, load_personal(context, run, upto, config.personal.state_dir))
    if message_config.get("fallback-shares", False):  # fallback = "pooled": each share's validation MAE
        return Message(RecordDict({"metrics": MetricRecord(task.share_errors(model, rng)), "info": _info(task)}),
                       reply_to=msg)
    final = bool(message_config.get("final", False))
    metrics = task.evaluate(model, rng, final=final)
    info = _info(task, _attacker_flag(config, context, task))
    content = RecordDict({"metrics": MetricRecord(metrics), "info": info})
    if final:
        for key, value in task.final_info(model).items():
            info[key] = value
        for name, arrays in task.final_arrays(model).items():
            content[name] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
        if "ahead" in content.array_records:
            _write_node_forecast(context, task, content.array_records["ahead"], dict(info))
    return Message(content, reply_to=msg)


def _write_node_forecast(context: Context, task: Task, ahead: ArrayRecord, info: dict) -> None:
    """A deployed node (one whose node config names its own ``data-path``) keeps its forecast on its own box:
    ``<forecast-dir>/<household>.csv`` (node config ``forecast-dir``, default ``$BOUQUET_CACHE_DIR/forecasts``)."""
    if "data-path" not in context.node_config and "forecast-dir" not in context.node_config:
        return  # simulation: the server gathers every node's forecast in the run folder
    from bouquet.forecast import forecast_rows, write_forecast_file

    folder = context.node_config.get("forecast-dir")
    rows = forecast_rows({k: v.numpy() for k, v in ahead.items()}, task.partition_id, task.household, info)
    write_forecast_file(rows, None if folder is None else str(folder), task.household)
