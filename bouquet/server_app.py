"""The bouquet ServerApp: it only wires.  The run config is read once; the strategy is built from its family
(:mod:`bouquet.families`) and selection keys; the task's server half (:mod:`bouquet.serving.task`) gives
the initial model and central evaluation and writes the summary.  Each run writes
``<results-dir>/<run-name>/`` (:mod:`bouquet.results`): ``config.json``, ``rounds.jsonl``, the clients'
tables, ``coalitions.csv`` and ``trajectories/``, ``selection.csv``, checkpoints, and what the task writes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from bouquet import __version__
from bouquet.checkpoint import Checkpoint, checkpoint_to_resume, rewind_files
from bouquet.config import DEPRECATED_KEYS, AppConfig
from bouquet.flower_logging import route_to_flower
from bouquet.personal_state import PersonalRun
from bouquet.results import RunRecorder
from bouquet.serving.task import ServerTask
from bouquet.strategies.aggregation import TrajectoryWriter
from bouquet.strategies.attacks import AttackHarness
from bouquet.strategies.checkpoints import Checkpointing, restore
from bouquet.strategies.hooks import CentralEvaluation, ConsoleLines, Hook, RecorderObserver
from bouquet.strategies.sampling import Sampler, UniformSampler
from bouquet.strategies.selection import SketchSelection
from bouquet.strategies.server_opt import ServerOptimizer
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.strategies.update_selection import UpdateSelection
from bouquet.transport import PollingTransport

__all__ = ["app", "build_strategy", "server_task"]

log = logging.getLogger(__name__)
route_to_flower()
app = ServerApp()

def server_task(config: AppConfig) -> ServerTask:
    """The server half of the run config's task (its row's ``server``; the client half:
    :func:`bouquet.client_app.node_task`)."""
    return config.task.server_half()(config)


def build_strategy(config: AppConfig, recorder: RunRecorder | None = None,
                   cluster_models: list[ArrayRecord] | None = None, hooks: Sequence[Hook] = ()) -> BouquetStrategy:
    """The app's strategy: a sampler (``selection``) and an aggregator (``strategy``), composed freely.

    With a recorder, the run folder receives every round's records and, when HK trajectories are
    recorded, ``trajectories/round-NNN.npz``.  ``cluster_models`` are IFCA's K initial models (default:
    the initial model perturbed K times); ``hooks`` follow the recording ones (central evaluation, checkpoints).
    """
    # a task that scores the shared model on the server (vision) leaves the clients' evaluation out, if asked
    central_only = config.task.central_evaluation and config.central.mode == "central"
    sampling = dataclasses.replace(config.sampling, fraction_evaluate=0.0) if central_only else config.sampling
    by_updates = config.selection.sketch_source == "local-update"  # every candidate trains; selection filters
    family = config.family
    if family.sampler is not None:
        sampler: Sampler = family.sampler(config, sampling)
    elif by_updates:
        sampler = UniformSampler(dataclasses.replace(
            sampling, clients_per_round=config.selection.candidates_per_round or None, fraction_train=1.0))
    elif config.run.selection == "random":
        sampler = UniformSampler(sampling)
    else:
        sampler = SketchSelection(config.selector(), sampling, config.selection)
    entries = family.train_entries(config)
    parts: list[Hook] = [ConsoleLines()]
    if recorder is not None:
        parts.append(RecorderObserver(recorder))
        if family.opinions and config.coalitions.record_trajectories:
            parts.append(TrajectoryWriter(recorder.folder / "trajectories"))
    aggregator = family.aggregator(config)
    if by_updates:
        aggregator = UpdateSelection(aggregator, config.selector(), config.sampling.clients_per_round,
                                     config.selection.sketch_fraction)
    if config.attack.active:
        aggregator = AttackHarness(aggregator, config.attack)
    if config.server_opt.active:  # outermost: the server step moves whatever the parts inside made
        aggregator = ServerOptimizer(aggregator, config.server_opt)
    # polling: a deployment's gRPC Grid would wait 3 s between pulls for replies
    return BouquetStrategy(sampler=sampler, aggregator=aggregator, models=family.models(config, cluster_models),
                           train_config=entries, hooks=(*parts, *hooks), transport=PollingTransport(config.transport),
                           screening=config.screening)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` rounds and write the run folder."""
    started = time.time()
    config = AppConfig.from_run_config(context.run_config)
    run = config.run
    if config.checkpoint.resume_from:
        recorder, checkpoint = _reopen(config)
    else:
        label = run.strategy if run.selection == "random" else f"{run.selection}-{run.strategy}"
        recorder, checkpoint = RunRecorder.create(run.results_dir, run.run_name, label=label), None
        recorder.write_json("config.json", config.to_run_config())
    log.info("bouquet: results in %s", recorder.folder)
    task = server_task(config)
    train_itself = getattr(task, "train_itself", None)  # a forecaster trained by its own exchanges (the trees)
    if train_itself is not None and train_itself(grid, recorder, started) is not None:
        return
    initial, evaluate = task.begin(recorder, checkpoint)
    # the run whose personal state the nodes keep (personal layers, Ditto), named in every message
    personal = PersonalRun.for_folder(recorder.folder, checkpoint) if config.personal.stateful else None
    header: dict[str, Any] = {"config": config.to_run_config(), "version": __version__}
    if personal is not None:
        header["personal-lineage"] = list(personal.lineage)
    hooks = (*([CentralEvaluation(evaluate)] if evaluate is not None else []),
             Checkpointing(recorder.folder, header, config.checkpoint, run.num_server_rounds))
    strategy = build_strategy(config, recorder, config.family.initial_models(config, task.new_model), hooks)
    result = restore(strategy, grid, checkpoint) if checkpoint is not None else None  # resuming: where it was
    entries = ConfigRecord(personal.entries() if personal is not None else {})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=run.num_server_rounds,
                            timeout=run.round_timeout, train_config=entries, evaluate_config=entries, result=result)
    task.finish(grid, strategy, result, recorder, checkpoint, personal, started)


def _reopen(config: AppConfig) -> tuple[RunRecorder, Checkpoint]:
    """The interrupted run's folder and its last readable checkpoint, the folder cut back to it."""
    folder = Path(config.checkpoint.resume_from).expanduser().resolve()
    checkpoint = checkpoint_to_resume(folder, config.to_run_config(), __version__, config.checkpoint.allow_new_rounds,
                                      renamed=DEPRECATED_KEYS)
    for change in rewind_files(folder, checkpoint.meta["files"]):
        log.info("resume: %s", change)
    log.info("resume: %s after round %d", folder, checkpoint.server_round)
    return RunRecorder.reopen(folder), checkpoint
