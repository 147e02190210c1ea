"""The water task's server half: the initial forecaster, the pool report, the run's summary.

Each run writes, beside the strategy's records (:mod:`bouquet.results`), ``pool.csv`` (when the data is
readable from the server, as in simulation), ``clients.csv`` (the final model's metrics on every node),
``predictions.csv`` (their test-day forecasts), ``summary.json`` (the clients' MAE beside the naive
forecasters', chosen on validation where there is a validation split) and ``report.png``.
"""

from __future__ import annotations

import logging
import time
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
from bouquet.serving.task import attack_summary, final_clients, run_summary
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.tasks.water import NAIVE_FORECASTS, LSTMForecaster, naive_metric
from bouquet.tuning import sample_std

__all__ = ["WaterServer", "mase_summary", "naive_summary", "naive_text", "pool_size", "pool_text", "write_pool"]

log = logging.getLogger(__name__)


def pool_size(config: AppConfig) -> int:
    """The clients a water simulation starts: the households of the federated pool."""
    return len(load_pool(config.water_data))


def write_pool(config: AppConfig, recorder: RunRecorder) -> None:
    if config.water_data.source == "daiad" and not config.water_data.path:
        log.info("data path is given per node (deployment): no pool report on the server")
        return
    pool = load_pool(config.water_data)
    pool.report.to_csv(recorder.folder / "pool.csv", index=False)
    log.info("federated pool: %s", pool_text(pool.report, recorder.folder / "pool.csv"))


def pool_text(report: Any, path: Any) -> str:
    """``179 of 1,099 households (left out: 800 inactive, 120 short history; why, per household: pool.csv; ...)``:
    what the filters kept, never silently."""
    status = report["status"].astype(str)
    kept = int((status == "pool").sum())
    reasons = status[status != "pool"].str.split(" (", regex=False).str[0].value_counts()
    if reasons.empty:
        return f"{kept} of {len(report)} households (report: {path})"
    left = ", ".join(f"{n:,} {reason}" for reason, n in reasons.items())
    hint = ("; a utility forecasting every household sets active-factor=0 min-history-days=0"
            if any(r in reasons.index for r in ("inactive", "short history")) else "")
    return f"{kept:,} of {len(report):,} households (left out: {left}; per household: {path}{hint})"


def naive_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The naive forecasters beside the model (water): their mean MAE over the same clients and test days, the
    best of them, the model's skill (1 - MAE / best naive MAE), the shares of households whose forecast beats
    their own best naive forecast, and what the households are served.  Empty when the clients reported no
    test-day ``naive-*`` metric (a run whose test period is locked).

    With a validation split (the clients report ``naive-val-*`` too), the best naive forecaster is the one with
    the lowest mean validation MAE, and each household's own best naive forecaster is the one with the lowest
    MAE on its own validation days (``best-naive-chosen-on: validation``): no choice looks at the test days.
    ``households-beating-own-best-naive`` is the share whose test MAE is below their own best's test MAE;
    ``households-beating-own-best-naive-on-test`` compares with each household's best on the test days (an
    oracle no forecaster has in advance).  Without a split both choices are made on the test days.
    """
    suffix = len("naive-")
    test_keys = {k[suffix:] for r in rows for k in r if k.startswith("naive-") and not k.startswith("naive-val-")}
    val_keys = {k[len("naive-val-"):] for r in rows for k in r if k.startswith("naive-val-")}
    names = sorted(test_keys)
    usable = [r for r in rows if all(f"naive-{n}" in r for n in names)
              and all(f"naive-val-{n}" in r for n in val_keys & test_keys)]
    if not names or not usable:
        return {}
    label = {naive_metric(n)[suffix:]: n for n in NAIVE_FORECASTS}
    naive = {label.get(n, n): float(np.mean([r[f"naive-{n}"] for r in usable])) for n in names}
    mae = np.array([float(r["mae-litres"]) for r in usable])
    on_test = np.array([min(float(r[f"naive-{n}"]) for n in names) for r in usable])
    summary: dict[str, Any] = {"naive-mae-litres": naive}
    chosen_names = sorted(val_keys & test_keys)
    if chosen_names:
        naive_val = {label.get(n, n): float(np.mean([r[f"naive-val-{n}"] for r in usable])) for n in chosen_names}
        best = min(naive_val, key=naive_val.get)
        own = np.array([float(r[f"naive-{min(chosen_names, key=lambda n, r=r: float(r[f'naive-val-{n}']))}"])
                        for r in usable])
        summary |= {"naive-val-mae-litres": naive_val, "best-naive-chosen-on": "validation"}
    else:
        best, own = min(naive, key=naive.get), on_test
        summary["best-naive-chosen-on"] = "test"
    summary |= {"best-naive": best, "best-naive-mae-litres": naive[best],
                "skill-vs-best-naive": float(1 - mae.mean() / naive[best]) if naive[best] > 0 else None,
                "households-beating-own-best-naive": float(np.mean(mae < own)),
                "households-beating-own-best-naive-on-test": float(np.mean(mae < on_test))}
    served = [str(r.get("served", "")) for r in usable]
    if any(served):
        summary["served"] = {kind: served.count(kind) for kind in ("model", "combined", "baseline")}
        summary["model-mae-litres-mean"] = float(np.mean([float(r.get("model-mae-litres", np.nan)) for r in usable]))
    return summary


def mase_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MASE (Hyndman and Koehler 2006) over households: each household's test MAE divided by its seasonal naive
    forecaster's in-sample MAE (``mase-scale``: season 7, the days before its first test day), averaged; the
    same for the model alone and for its own best naive forecaster (``baseline-mae-litres``).  Empty where
    the nodes report no scale."""
    usable = [r for r in rows if np.isfinite(float(r.get("mase-scale", np.nan))) and float(r["mase-scale"]) > 0]
    if not usable:
        return {}
    scale = np.array([float(r["mase-scale"]) for r in usable])
    out = {"mase-mean": float(np.mean(np.array([float(r["mae-litres"]) for r in usable]) / scale))}
    for key, name in (("model-mae-litres", "model-mase-mean"), ("baseline-mae-litres", "baseline-mase-mean")):
        if all(key in r for r in usable):
            out[name] = float(np.mean(np.array([float(r[key]) for r in usable]) / scale))
    return out


def naive_text(summary: dict[str, Any]) -> str:
    """`` (blend: 136.62 L/day, the best naive forecast on validation; skill +5.6 %; 50 % of households beat their
    own best naive forecast on the test days; served: 120 model, 40 combined, 19 baseline)`` for the console."""
    if "best-naive" not in summary or summary.get("skill-vs-best-naive") is None:
        return ""
    skill = summary["skill-vs-best-naive"]
    where = " on validation" if summary.get("best-naive-chosen-on") == "validation" else ""
    share = summary.get("households-beating-own-best-naive")
    beats = f"; {100 * share:.0f} % of households beat their own best naive forecast on the test days" \
        if share is not None and where else ""
    served = summary.get("served")
    fallback = (f"; served: {served['model']} model, {served['combined']} combined, {served['baseline']} baseline"
                if served and (served["combined"] or served["baseline"]) else "")
    return (f" ({summary['best-naive']}: {summary['best-naive-mae-litres']:.2f} L/day, the best naive "
            f"forecast{where}; skill {100 * skill:+.1f} %{beats}{fallback})")


class WaterServer:
    """The water task's :class:`bouquet.serving.task.ServerTask`."""

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
        return self.summarise(rows, recorder, {"strategy": run.strategy, "rounds": run.num_server_rounds},
                              run_summary(config, strategy, checkpoint, started))

    def train_itself(self, grid: Grid, recorder: RunRecorder, started: float) -> dict[str, Any] | None:
        """The trees (``forecast-model = "trees"``) train by their own exchanges, not by a strategy's rounds:
        fit them over every node, evaluate the ensemble on every node, write the summary and return it.  None
        for the LSTM (the strategy trains it)."""
        config = self.config
        if not config.forecast_model.trees:
            return None
        from bouquet.serving.trees import evaluate_trees, fit_trees

        write_pool(config, recorder)
        expected = pool_size(config) if config.water_data.source == "synthetic" or config.water_data.path else 1
        served, costs = fit_trees(grid, config, expected, recorder)
        rows = evaluate_trees(grid, config, served, recorder)
        t = config.trees
        return self.summarise(rows, recorder, {"forecast-model": "trees", "trees": t.trees, "tree-depth": t.max_depth,
                                               "tree-objective": t.objective, "tree-fit": costs},
                              {"wall-seconds": time.time() - started})

    def summarise(self, rows: list[dict[str, Any]], recorder: RunRecorder, head: dict[str, Any],
                  tail: dict[str, Any]) -> dict[str, Any]:
        """``summary.json`` from every node's final evaluation (``rows``), between ``head`` (what trained) and
        ``tail`` (what the run cost), ``report.png``, and the console line."""
        config = self.config
        scored = [r for r in rows if "mae-litres" in r]  # none where the test period is locked
        mae = np.array([r["mae-litres"] for r in scored])
        mse = np.array([r["mse"] for r in scored])
        val = np.array([r["val-mae-litres"] for r in rows if "val-mae-litres" in r])
        summary = {
            **head, "clients-evaluated": len(rows),
            "test-period-scored": bool(len(scored)),
            "mae-litres-mean": float(mae.mean()) if len(mae) else None,
            "mae-litres-std": sample_std(mae) if len(mae) > 1 else None,
            "mse-mean": float(mse.mean()) if len(mse) else None,
            **({"val-mae-litres-mean": float(val.mean())} if len(val) else {}),
            **mase_summary(scored),
            **naive_summary(scored),
            **({"fallback-share": rows[0].get("served-model-share")} if config.fallback.rule == "pooled" and rows
               else {}),
            **attack_summary(config, scored, "mae-litres"),
            **tail,
        }
        recorder.write_json("summary.json", summary)
        what = head.get("strategy") or f"{head.get('trees')} trees"
        rounds = f"{head['rounds']} rounds, " if "rounds" in head else ""
        if len(scored):
            try:
                log.info("report: %s", draw_report(recorder.folder))
            except Exception as error:  # noqa: BLE001 (a figure must never cost the run its results)
                log.warning("report.png could not be drawn (%s: %s); python -m bouquet.report %s draws it again",
                            type(error).__name__, error, recorder.folder)
            log.info("bouquet summary: %s, %s%d clients: MAE %.2f +- %.2f L/day%s%s, MSE %.4f (scaled); %s",
                     what, rounds, len(rows), mae.mean(), sample_std(mae),
                     f", MASE {summary['mase-mean']:.3f}" if summary.get("mase-mean") is not None else "",
                     naive_text(summary), mse.mean(), recorder.folder)
        elif len(rows):
            log.info("bouquet summary: %s, %s%d clients: validation MAE %.2f L/day (the test period is "
                     "locked: score-test = false); %s", what, rounds, len(rows),
                     float(val.mean()) if len(val) else float("nan"), recorder.folder)
        else:
            log.warning("bouquet summary: no client answered the final evaluation; %s", recorder.folder)
        return summary
