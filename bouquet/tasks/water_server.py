"""The water task's server half: the initial forecaster, the pool report, the run's summary.

Each run writes, beside the strategy's records (:mod:`bouquet.results`), ``pool.csv`` (when the data is
readable from the server, as in simulation), ``clients.csv`` (the final model's metrics on every node),
``predictions.csv`` (their test-day forecasts), ``summary.json`` (the clients' MAE beside the naive
forecasters', chosen on validation where there is a validation split) and ``report.png``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from bouquet.checkpoint import Checkpoint
from bouquet.config import AppConfig
from bouquet.data.water import load_pool
from bouquet.personal_state import PersonalRun
from bouquet.report import draw_report
from bouquet.results import RunRecorder
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.tasks.server import attack_summary, final_clients, run_summary
from bouquet.tasks.water import NAIVE_FORECASTS, LSTMForecaster, naive_metric
from bouquet.tuning import sample_std

__all__ = ["WaterServer", "naive_summary", "naive_text", "write_pool"]

log = logging.getLogger(__name__)


def write_pool(config: AppConfig, recorder: RunRecorder) -> None:
    if config.water_data.source == "daiad" and not config.water_data.path:
        log.info("data path is given per node (deployment): no pool report on the server")
        return
    pool = load_pool(config.water_data)
    pool.report.to_csv(recorder.folder / "pool.csv", index=False)
    log.info("federated pool: %d households (report: %s)", len(pool), recorder.folder / "pool.csv")


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


def naive_text(summary: dict[str, Any]) -> str:
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


class WaterServer:
    """The water task's :class:`bouquet.tasks.server.ServerTask`."""

    def __init__(self, config: AppConfig) -> None:
        self.config = config

    def new_model(self) -> torch.nn.Module:
        return LSTMForecaster.from_params(self.config.water_model, self.config.water_data.input_channels)

    def begin(self, recorder: RunRecorder, checkpoint: Checkpoint | None
              ) -> tuple[ArrayRecord, Callable[[int, ArrayRecord], MetricRecord] | None]:
        if checkpoint is None:
            write_pool(self.config, recorder)
        torch.manual_seed(self.config.sampling.seed)
        return ArrayRecord(self.new_model().state_dict()), None  # no central evaluation: the data is on the nodes

    def finish(self, grid: Grid, strategy: BouquetStrategy, result: Result, recorder: RunRecorder,
               checkpoint: Checkpoint | None, personal: PersonalRun | None, started: float) -> dict[str, Any]:
        config, run = self.config, self.config.run
        rows = final_clients(grid, config, strategy, recorder, personal)
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
            **attack_summary(config, rows, "mae-litres"),
            **run_summary(config, strategy, checkpoint, started),
        }
        recorder.write_json("summary.json", summary)
        if len(rows):
            try:
                log.info("report: %s", draw_report(recorder.folder))
            except Exception as error:  # noqa: BLE001 (a figure must never cost the run its results)
                log.warning("report.png could not be drawn (%s: %s); python -m bouquet.report %s draws it again",
                            type(error).__name__, error, recorder.folder)
            log.info("bouquet summary: %s, %d rounds, %d clients: MAE %.2f +- %.2f L/day%s, MSE %.4f (scaled); %s",
                     run.strategy, run.num_server_rounds, len(rows), mae.mean(), sample_std(mae),
                     naive_text(summary), mse.mean(), recorder.folder)
        else:
            log.warning("bouquet summary: no client answered the final evaluation; %s", recorder.folder)
        return summary
