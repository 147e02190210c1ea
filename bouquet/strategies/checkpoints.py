"""Checkpoints of a :class:`~bouquet.strategies.strategy.BouquetStrategy` run, and resuming from one.

:func:`save_checkpoint` turns the strategy's whole server state (:class:`~bouquet.strategies.state.ServerState`:
every model the store keeps, which node is served which, the stable node order, the sampler's state) and
the metrics gathered so far into one checkpoint file (:mod:`bouquet.checkpoint`), naming nodes by their
stable key, not by Flower's node id.  :func:`restore` waits for the nodes, learns their new ids, and loads
the state into a strategy built with the same parts, returning the metrics to go on with.
:class:`Checkpointing` is the hook that saves one after each round ``checkpoint-*`` says.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from bouquet.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointParams,
    join_arrays,
    keys_to_nodes,
    missing_keys,
    nodes_to_keys,
    snapshot_files,
    split_arrays,
    write_checkpoint,
)
from bouquet.strategies.arrays import to_numpy, to_record
from bouquet.strategies.hooks import Hook
from bouquet.strategies.state import ServerState

__all__ = ["Checkpointing", "restore", "save_checkpoint"]

log = logging.getLogger(__name__)

_MODEL = "model:"  # checkpoint groups: "model:<store key>" per model, _STATE for the state's arrays
_STATE = "state-arrays"
_AGGREGATOR = "aggregator:"  # older checkpoints: a server optimiser's moments, per group (now in the parts' state)
_PHASES = ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp")


def _result_to_json(result: Result) -> dict[str, dict[str, dict[str, Any]]]:
    # MetricRecord values are int, float (numpy's float64 is one) or lists of them: JSON-able as they are
    return {phase: {str(r): dict(record) for r, record in getattr(result, phase).items()} for phase in _PHASES}


def _result_from_json(payload: Mapping[str, Any]) -> Result:
    result = Result()
    for phase in _PHASES:
        getattr(result, phase).update({int(r): MetricRecord(dict(m)) for r, m in payload.get(phase, {}).items()})
    return result


def save_checkpoint(state: ServerState, result: Result, run_folder: str | Path, extra: Mapping[str, Any],
                    keep: int = 2) -> Path:
    """Write the checkpoint of a strategy's last completed round into ``run_folder/checkpoints``.

    Parameters
    ----------
    state : ServerState
        The strategy's whole state after that round (``strategy.state()``).
    result : flwr.serverapp.strategy.Result
        The run's metrics until now.
    run_folder : str or Path
        The run folder (its files' sizes are recorded, so a resumed run appends where this one stopped).
    extra : mapping
        JSON-able header entries (the run config, the bouquet version).
    keep : int, default 2
        Checkpoints to keep.
    """
    known = state.nodes.get("keys", {})  # NodeOrder's state: {node id (text): stable key or None}
    keys = {int(node): key for node, key in known.items() if key is not None}
    keyless = len(known) - len(keys)
    if keyless:  # (NodeOrder has warned that their sampling order is not reproducible either)
        log.warning("checkpoint: %d node(s) reported no stable identity in time; their state is saved under "
                    "today's node ids, which a restarted simulation does not keep", keyless)
    plain, state_arrays = split_arrays({"store": state.store, "nodes": state.nodes, "sampler": state.sampler,
                                        "parts": state.parts})
    named = nodes_to_keys(plain, keys)  # (sketches are arrays now, not JSON text: nothing to walk in them)
    json.dumps(named)  # a part whose state is not JSON-able fails here, before anything is written
    meta = {**extra, "seed": state.seed, "state": named, "result": _result_to_json(result),
            "files": snapshot_files(run_folder), "num-nodes": len(keys)}
    models = {f"{_MODEL}{key}": to_numpy(record) for key, record in state.models.items()}
    models[_STATE] = state_arrays
    return write_checkpoint(run_folder, state.server_round, meta, models, keep=keep)


def restore(strategy: Any, grid: Grid, checkpoint: Checkpoint) -> Result:
    """Load ``checkpoint`` into ``strategy`` (same parts and parameters) once its nodes are connected.

    Waits (up to the strategy's ``node-wait-seconds``) until every node the checkpointed run knew is
    connected again (asking each new node once for its stable key), and maps the checkpoint's nodes onto
    today's node ids.  A node of the checkpoint that is not connected is an error (its coalition, its model
    or its selection history would be lost silently otherwise).

    Returns
    -------
    flwr.serverapp.strategy.Result
        The metrics of the rounds up to the checkpoint.
    """
    meta = checkpoint.meta
    expected = int(meta.get("num-nodes", 0))
    deadline = time.monotonic() + max(strategy.nodes.wait_seconds, 1.0)
    while True:  # after a SuperLink restart, dead registrations linger and nodes come back one by one
        connected = strategy.nodes.connected(grid, checkpoint.server_round + 1, expected)
        keys = {node: strategy.nodes.keys.get(node) for node in connected}
        missing = missing_keys(meta["state"], keys)
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if missing:
        names = ", ".join(sorted(m.split(":", 1)[1] for m in missing)[:10])
        raise CheckpointError(f"{len(missing)} node(s) of the checkpointed run are not connected (stable keys: "
                              f"{names}{', ...' if len(missing) > 10 else ''}); start them, then resume again")
    state = join_arrays(keys_to_nodes(meta["state"], keys), checkpoint.models.get(_STATE, {}))
    models = {key.removeprefix(_MODEL): to_record(arrays) for key, arrays in checkpoint.models.items()
              if key.startswith(_MODEL)}
    parts = state.get("parts", {})
    older = {key.removeprefix(_AGGREGATOR): arrays for key, arrays in checkpoint.models.items()
             if key.startswith(_AGGREGATOR)}
    if older:  # written before the parts' state had one form: a server optimiser's moments stood apart
        parts = {**parts, "ServerOptimizer": older}
    try:
        strategy.load_state(ServerState(server_round=checkpoint.server_round, seed=int(meta["seed"]), models=models,
                                        store=state["store"], nodes=state["nodes"], sampler=state["sampler"],
                                        parts=parts))
    except ValueError as error:
        raise CheckpointError(f"{checkpoint.path}: {error}") from error
    log.info("resumed from %s: round %d done, %d nodes mapped to this run's node ids", checkpoint.path,
             checkpoint.server_round, len(connected))
    return _result_from_json(meta.get("result", {}))


class Checkpointing(Hook):
    """Saves a checkpoint into ``run_folder`` after each round that ``params`` says is due.

    Parameters
    ----------
    run_folder : str or Path
    header : mapping
        JSON-able entries of every checkpoint (the run config, the bouquet version).
    params : CheckpointParams
        How often and how many to keep.
    num_rounds : int
        The run's last round (always checkpointed).
    """

    def __init__(self, run_folder: str | Path, header: Mapping[str, Any], params: CheckpointParams,
                 num_rounds: int) -> None:
        self.run_folder = Path(run_folder)
        self.header = dict(header)
        self.params = params
        self.num_rounds = num_rounds

    def due(self, server_round: int) -> bool:
        return self.params.due(server_round, self.num_rounds)

    def on_round_end(self, server_round: int, state: ServerState, result: Result) -> None:
        save_checkpoint(state, result, self.run_folder, self.header, keep=self.params.keep)
