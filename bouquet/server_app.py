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
import hashlib
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
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from bouquet import __version__
from bouquet.algorithms.sckm import average_cardinality
from bouquet.checkpoint import Checkpoint, checkpoint_to_resume, rewind_files
from bouquet.config import AppConfig
from bouquet.data.images import load_images
from bouquet.data.water import load_pool
from bouquet.flower_logging import route_to_flower
from bouquet.grid import PollingGrid
from bouquet.messages import MessageFactory, flower_message
from bouquet.personal_state import PersonalRun
from bouquet.report import draw_report
from bouquet.results import RunRecorder
from bouquet.strategies.aggregation import Aggregator, Coalitions, FixedKRule, HKRule, WeightedMean
from bouquet.strategies.attacks import AttackHarness
from bouquet.strategies.checkpoints import restore, save_checkpoint
from bouquet.strategies.clustered import CFLClusters, ClusterMeans, IFCASampler, LocalModels, ifca_models
from bouquet.strategies.entries import ProximalTerm
from bouquet.strategies.models import AssignedModels, ModelStore, SharedModel
from bouquet.strategies.observers import ConsoleLines, Observer, Recorder, RecorderObserver, TrajectoryWriter
from bouquet.strategies.params import ROBUST_RULES, CoalitionParams
from bouquet.strategies.robust import FlowerRobustRule
from bouquet.strategies.sampling import Sampler, UniformSampler
from bouquet.strategies.selection import SketchSelection
from bouquet.strategies.server_opt import ServerOptimizer
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.strategies.update_selection import UpdateSelection
from bouquet.tasks.vision import accuracy, batch_indices, make_model, torch_device
from bouquet.tasks.water import NAIVE_FORECASTS, LSTMForecaster, naive_metric
from bouquet.tuning import sample_std

__all__ = ["app", "build_strategy", "evaluate_every_node", "make_aggregator"]

log = logging.getLogger(__name__)
route_to_flower()
app = ServerApp()


def make_aggregator(config: AppConfig) -> Aggregator:
    """The aggregator part the run config names (also the bare loop of ``scripts/bench_overhead.py``)."""
    family = config.spec.family
    if family == "hk":
        return Coalitions(HKRule(config.hk, config.coalitions.record_trajectories), config.coalitions, config.memory)
    if family == "fixed-k":  # fixed-K partitions the trained models: the paper's baseline, no opinion space
        c = config.coalitions
        return Coalitions(FixedKRule(config.fixed_k),
                          CoalitionParams(barycenter_weighting=c.barycenter_weighting,
                                          min_coalition_fraction=c.min_coalition_fraction,
                                          update_norm_bound=c.update_norm_bound), config.memory)
    if family == "ifca":
        return ClusterMeans()
    if family == "cfl":
        return CFLClusters(config.cfl)
    if family == "local":
        return LocalModels()
    if family in ROBUST_RULES:
        return FlowerRobustRule(family, config.robust)
    return WeightedMean()  # fedavg, fedprox, and Per-FedAvg (whose difference is on the clients)


def _models(config: AppConfig, cluster_models: list[ArrayRecord] | None) -> ModelStore:
    family = config.spec.family
    if family == "ifca":
        return ifca_models(config.ifca, config.sampling.seed, cluster_models)
    if family in ("cfl", "local") or config.store.coalition_models == "personal":
        return AssignedModels()
    return SharedModel()


def build_strategy(config: AppConfig, recorder: RunRecorder | None = None,
                   cluster_models: list[ArrayRecord] | None = None) -> BouquetStrategy:
    """The app's strategy: a sampler (``selection``) and an aggregator (``strategy``), composed freely.

    With a recorder, the run folder receives every round's records and, when HK trajectories are
    recorded, ``trajectories/round-NNN.npz``.  ``cluster_models`` are IFCA's K initial models (default:
    the initial model perturbed K times).
    """
    # the vision task scores the global model centrally unless its clients evaluate; every node of the app
    # is waited for one at a time
    central_only = config.run.task == "vision" and config.central.mode == "central"
    sampling = dataclasses.replace(config.sampling, min_evaluate_nodes=1, min_available_nodes=1, identify_nodes=True,
                                   fraction_evaluate=0.0 if central_only else config.sampling.fraction_evaluate)
    by_updates = config.selection.sketch_source == "local-update"  # every candidate trains; selection filters
    if config.spec.family == "ifca":
        sampler: Sampler = IFCASampler(config.ifca, sampling, config.selection.query_timeout)
    elif by_updates:
        sampler = UniformSampler(dataclasses.replace(
            sampling, clients_per_round=config.selection.candidates_per_round or None, fraction_train=1.0))
    elif config.run.selection == "random":
        sampler = UniformSampler(sampling)
    else:
        sampler = SketchSelection(config.selector(), sampling, config.selection)
    entries = (ProximalTerm(config.proximal),) if config.spec.family == "fedprox" else ()
    observers: list[Observer] = [ConsoleLines()]
    if recorder is not None:
        observers.append(RecorderObserver(recorder))
        if config.spec.family == "hk" and config.coalitions.record_trajectories:
            observers.append(TrajectoryWriter(recorder.folder / "trajectories"))
    aggregator = make_aggregator(config)
    if by_updates:
        aggregator = UpdateSelection(aggregator, config.selector(), config.sampling.clients_per_round,
                                     config.selection.sketch_fraction)
    if config.attack.active:
        aggregator = AttackHarness(aggregator, config.attack)
    if config.server_opt.active:  # outermost: the server step moves whatever the parts inside made
        aggregator = ServerOptimizer(aggregator, config.server_opt)
    return BouquetStrategy(sampler=sampler, aggregator=aggregator, models=_models(config, cluster_models),
                           train_config=entries, observers=observers)


def evaluate_every_node(grid: Grid, served: dict[int, tuple[str, ArrayRecord]], timeout: float,
                        recorder: RunRecorder | None = None,
                        new_message: MessageFactory = flower_message,
                        entries: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Evaluate on every node in ``served`` the model it is served (``node -> (store key, arrays)``).

    One row per replying node, with the key of its model (``model``).  Nodes that return forecasts
    (``predictions`` ArrayRecord) have them appended to ``predictions.csv`` (partition id, household,
    day, actual and predicted litres).  ``entries`` go into the evaluation config beside ``final``
    (the run that personal state belongs to).
    """
    config = ConfigRecord({"final": True, **(entries or {})})
    contents: dict[str, RecordDict] = {}
    messages = []
    for node, (key, arrays) in served.items():
        if key not in contents:
            contents[key] = RecordDict({"arrays": arrays, "config": config})
        messages.append(new_message(contents[key], "evaluate", node, "final"))
    answered = []
    for reply in grid.send_and_receive(messages, timeout=timeout):
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
    model.to(torch_device(config.vision_model.device))  # initialised on the CPU: the same start on any device
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


def naive_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The naive forecasters beside the model (water): their mean MAE over the same clients and test windows,
    the best of them, the model's skill (1 - MAE / best naive MAE) and the share of households whose own
    forecast beats their own best naive forecast.  Empty when the clients reported no ``naive-*`` metric.

    With a validation split (the clients report ``naive-val-*`` too), the best naive forecaster is the one with
    the lowest mean validation MAE, and each household's own best naive forecaster is chosen on its own
    validation windows (``best-naive-chosen-on: validation``): no choice looks at the test days.  Without
    one, both are chosen on the test windows, as before the split existed.  ``households-beating-own-best-
    naive-on-test`` is always against each household's best on the test days (the hardest comparison).
    """
    keys = {k for r in rows for k in r if k.startswith("naive-")}
    val_names = sorted(k for k in keys if k.startswith("naive-val-"))
    test_names = sorted(keys - set(val_names))
    usable = [r for r in rows if all(k in r for k in (*test_names, *val_names))]
    if not test_names or not usable:
        return {}
    label = {naive_metric(n): n for n in NAIVE_FORECASTS}
    naive = {label.get(name, name): float(np.mean([r[name] for r in usable])) for name in test_names}
    mae = np.array([float(r["mae-litres"]) for r in usable])
    on_test = np.array([min(float(r[name]) for name in test_names) for r in usable])
    summary: dict[str, Any] = {"naive-mae-litres": naive}
    if val_names:
        val_label = {naive_metric(n, "validation"): n for n in NAIVE_FORECASTS}
        naive_val = {val_label.get(name, name): float(np.mean([r[name] for r in usable])) for name in val_names}
        best = min(naive_val, key=naive_val.get)
        chosen = [min(naive_val, key=lambda n, r=r: float(r[naive_metric(n, "validation")])) for r in usable]
        own = np.array([float(r[naive_metric(n)]) for r, n in zip(usable, chosen)])
        summary |= {"naive-val-mae-litres": naive_val, "best-naive-chosen-on": "validation"}
    else:
        best, own = min(naive, key=naive.get), on_test
        summary["best-naive-chosen-on"] = "test"
    return {**summary, "best-naive": best, "best-naive-mae-litres": naive[best],
            "skill-vs-best-naive": float(1 - mae.mean() / naive[best]) if naive[best] > 0 else None,
            "households-beating-own-best-naive": float(np.mean(mae < own)),
            "households-beating-own-best-naive-on-test": float(np.mean(mae < on_test))}


def _naive_text(summary: dict[str, Any]) -> str:
    """`` (window mean: 166.30 L/day, the best naive forecast; skill -6.6 %)`` for the console line (``the best
    naive forecast on validation`` when it was chosen there), and the share of households beating their own."""
    if "best-naive" not in summary:
        return ""
    skill = summary["skill-vs-best-naive"]
    where = " on validation" if summary.get("best-naive-chosen-on") == "validation" else ""
    share = summary.get("households-beating-own-best-naive")
    beats = f"; {100 * share:.0f} % of households beat their own{where}" if share is not None and where else ""
    return (f" ({summary['best-naive']}: {summary['best-naive-mae-litres']:.2f} L/day, the best "
            f"naive forecast{where}; skill {100 * skill:+.1f} %{beats})" if skill is not None else "")


def _resume_summary(checkpoint: Checkpoint | None) -> dict[str, Any]:
    """``resumed-after-round`` in a resumed run's summary (the last resume, if several)."""
    return {} if checkpoint is None else {"resumed-after-round": checkpoint.server_round}


def _attack_summary(config: AppConfig, rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The attackers (partition ids) and the honest clients' mean ``metric``, in attacked runs only."""
    if not config.attack.active:
        return {}
    bad = [bool(r.get("attacker", False)) for r in rows]
    honest = np.array([float(r[metric]) for r, b in zip(rows, bad) if not b])
    return {"attack": config.attack.attack, "attack-fraction": config.attack.fraction,
            "attack-scale": config.attack.strength,
            "attackers": sorted(int(r["partition-id"]) for r, b in zip(rows, bad) if b),
            f"{metric}-honest-mean": float(honest.mean()) if len(honest) else None}


def _cluster_models(config: AppConfig, new_model: Callable[[], torch.nn.Module]) -> list[ArrayRecord] | None:
    """IFCA's K initial models, each from its own torch seed ``[seed, cluster]`` (None for other strategies)."""
    if config.spec.family != "ifca":
        return None
    models = []
    for cluster in range(int(config.ifca.k)):
        torch.manual_seed(int(np.random.default_rng([config.sampling.seed, cluster, 11]).integers(2**31)))
        models.append(ArrayRecord(new_model().state_dict()))
    return models


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` rounds and write the run folder."""
    started = time.time()
    config = AppConfig.from_run_config(context.run_config)
    grid = PollingGrid(grid, config.grid)  # a deployment's gRPC Grid would wait 3 s between pulls for replies
    run = config.run
    if config.checkpoint.resume_from:
        recorder, checkpoint = _reopen(config)
    else:
        label = run.strategy if run.selection == "random" else f"{run.selection}-{run.strategy}"
        recorder, checkpoint = RunRecorder.create(run.results_dir, run.run_name, label=label), None
        recorder.write_json("config.json", config.to_run_config())
    log.info("bouquet: results in %s", recorder.folder)
    if run.task == "vision":
        _run_vision(grid, config, recorder, started, checkpoint)
    else:
        _run_water(grid, config, recorder, started, checkpoint)


def _reopen(config: AppConfig) -> tuple[RunRecorder, Checkpoint]:
    """The interrupted run's folder and its last readable checkpoint, the folder cut back to it."""
    folder = Path(config.checkpoint.resume_from).expanduser().resolve()
    checkpoint = checkpoint_to_resume(folder, config.to_run_config(), __version__, config.checkpoint.allow_new_rounds)
    for change in rewind_files(folder, checkpoint.meta["files"]):
        log.info("resume: %s", change)
    log.info("resume: %s after round %d", folder, checkpoint.server_round)
    return RunRecorder.reopen(folder), checkpoint


def personal_run(config: AppConfig, folder: Path, checkpoint: Checkpoint | None) -> PersonalRun | None:
    """The run nodes keep personal state for (personal layers, Ditto), named in every training and evaluation
    config: a key of the run folder, and the rounds it was resumed after (:mod:`bouquet.personal_state`)."""
    if not config.personal.stateful:
        return None
    lineage = () if checkpoint is None else (*checkpoint.meta.get("personal-lineage", []), checkpoint.server_round)
    return PersonalRun(hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16], tuple(int(r) for r in lineage))


def _start(strategy: BouquetStrategy, grid: Grid, config: AppConfig, recorder: RunRecorder, initial: ArrayRecord,
           checkpoint: Checkpoint | None, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord] | None = None,
           personal: PersonalRun | None = None) -> Result:
    """Run the rounds (from the checkpoint's, when resuming), checkpointing as ``checkpoint-*`` says."""
    run, params = config.run, config.checkpoint
    result = restore(strategy, grid, checkpoint) if checkpoint is not None else None
    header: dict[str, Any] = {"config": config.to_run_config(), "version": __version__}
    entries = ConfigRecord(personal.entries() if personal is not None else {})
    if personal is not None:
        header["personal-lineage"] = list(personal.lineage)

    def on_round_end(server_round: int, so_far: Result) -> None:
        if params.due(server_round, run.num_server_rounds):
            save_checkpoint(strategy, so_far, recorder.folder, header, keep=params.keep)

    return strategy.start(grid=grid, initial_arrays=initial, num_rounds=run.num_server_rounds,
                          timeout=run.round_timeout, train_config=entries, evaluate_config=entries,
                          evaluate_fn=evaluate_fn, on_round_end=on_round_end, result=result)


def _final_clients(grid: Grid, config: AppConfig, strategy: BouquetStrategy, recorder: RunRecorder,
                   personal: PersonalRun | None = None) -> list[dict]:
    """Every node evaluates the model it is served; rows to ``clients.csv`` (with the model's key)."""
    rows = evaluate_every_node(grid, strategy.serve(grid), timeout=config.run.round_timeout, recorder=recorder,
                               entries=personal.entries() if personal is not None else None)
    recorder.append_rows("clients", rows)
    return rows


def _run_vision(grid: Grid, config: AppConfig, recorder: RunRecorder, started: float,
                checkpoint: Checkpoint | None = None) -> None:
    run = config.run
    initial, evaluate = central_evaluation(config, recorder)
    images = load_images(config.vision_data)
    clusters = _cluster_models(config, lambda: make_model(config.vision_model.name, images.shape, len(images.classes)))
    strategy = build_strategy(config, recorder, clusters)
    central = config.central.mode in ("central", "both")
    result = _start(strategy, grid, config, recorder, initial, checkpoint, evaluate if central else None)
    curve = {int(r): float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()}
    summary: dict[str, Any] = {"task": "vision", "strategy": run.strategy, "rounds": run.num_server_rounds,
                               "accuracy-per-round": [curve[r] for r in sorted(curve)],
                               "final-accuracy": curve[max(curve)] if curve else None}
    if config.central.mode != "central":  # the clients score the models they are served
        client_curve = {int(r): float(m["accuracy"]) for r, m in result.evaluate_metrics_clientapp.items()}
        rows = _final_clients(grid, config, strategy, recorder)
        final = np.array([r["accuracy"] for r in rows])
        summary |= {"client-accuracy-per-round": [client_curve[r] for r in sorted(client_curve)],
                    "clients-evaluated": len(rows),
                    "client-accuracy-mean": float(final.mean()) if len(final) else None,
                    "client-accuracy-std": sample_std(final) if len(final) > 1 else None,
                    **_attack_summary(config, rows, "accuracy")}
    summary |= {**_selection_summary(config, strategy), **_resume_summary(checkpoint),
                "wall-seconds": time.time() - started}
    recorder.write_json("summary.json", summary)
    if curve:
        best = max(sorted(curve), key=curve.get)  # the earliest round with the highest accuracy
        accuracy_text = f"final test accuracy {100 * curve[max(curve)]:.2f} % (best {100 * curve[best]:.2f} % " \
                        f"at round {best})"
    elif summary.get("client-accuracy-mean") is not None:
        accuracy_text = (f"clients' accuracy with the model each is served {100 * summary['client-accuracy-mean']:.2f}"
                         f" +- {100 * summary['client-accuracy-std']:.2f} % ({summary['clients-evaluated']} clients)")
    else:
        accuracy_text = "no test accuracy (no round evaluated)"
    log.info("bouquet summary: vision, %s + %s, %d rounds: %s; %s", summary["selection"], run.strategy,
             run.num_server_rounds, accuracy_text, recorder.folder)


def _run_water(grid: Grid, config: AppConfig, recorder: RunRecorder, started: float,
               checkpoint: Checkpoint | None = None) -> None:
    run = config.run
    if checkpoint is None:
        _write_pool(config, recorder)
    torch.manual_seed(config.sampling.seed)
    new_model = lambda: LSTMForecaster.from_params(config.water_model, config.water_data.input_channels)
    initial = ArrayRecord(new_model().state_dict())
    strategy = build_strategy(config, recorder, _cluster_models(config, new_model))
    personal = personal_run(config, recorder.folder, checkpoint)
    _start(strategy, grid, config, recorder, initial, checkpoint, personal=personal)

    rows = _final_clients(grid, config, strategy, recorder, personal)
    mae = np.array([r["mae-litres"] for r in rows])
    mse = np.array([r["mse"] for r in rows])
    val = np.array([r["val-mae-litres"] for r in rows if "val-mae-litres" in r])
    summary = {
        "strategy": run.strategy, "rounds": run.num_server_rounds, "clients-evaluated": len(rows),
        "mae-litres-mean": float(mae.mean()) if len(mae) else None,
        "mae-litres-std": sample_std(mae) if len(mae) > 1 else None,
        "mse-mean": float(mse.mean()) if len(mse) else None,
        **({"val-mae-litres-mean": float(val.mean())} if len(val) else {}),
        **naive_summary(rows),
        **_selection_summary(config, strategy), **_resume_summary(checkpoint),
        **_attack_summary(config, rows, "mae-litres"),
        "wall-seconds": time.time() - started,
    }
    recorder.write_json("summary.json", summary)
    if len(rows):
        try:
            log.info("report: %s", draw_report(recorder.folder))
        except Exception as error:  # noqa: BLE001 (a figure must never cost the run its results)
            log.warning("report.png could not be drawn (%s: %s); python -m bouquet.report %s draws it again",
                        type(error).__name__, error, recorder.folder)
        log.info("bouquet summary: %s, %d rounds, %d clients: MAE %.2f +- %.2f L/day%s, MSE %.4f (scaled); %s",
                 run.strategy, run.num_server_rounds, len(rows), mae.mean(), sample_std(mae), _naive_text(summary),
                 mse.mean(), recorder.folder)
    else:
        log.warning("bouquet summary: no client answered the final evaluation; %s", recorder.folder)
