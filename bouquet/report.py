"""``report.png`` of a water run: what a utility reads first.

    python -m bouquet.report RUN_FOLDER [--out FILE]

Three panels from the run folder's own files (every water run writes one at its end; this command redraws
it): the learning curve (the held-out MAE of each round's evaluated households: on their validation days
where the run has a validation split, else on their test days; or the training loss when the run evaluated
only at the end; for the federated trees, the validation MAE after each number of trees), the skill against the best naive forecaster per round (``1 - MAE / the same households'
best-naive MAE`` on the same days, the forecaster the summary names, chosen on validation when the run has a
validation split), and the test days of three households (best, median and worst skill): actual use, the
forecast the household is served, and its own baseline (the naive forecaster its validation days chose, the
one the node falls back to; with ``fallback = "none"`` the summary's best naive forecaster, recomputed from
the run's data config by :func:`naive_client_forecasts`, where the server can read the
data).  Where the served forecast is not the model's alone, the model's forecast is drawn too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.results import RunFolder

__all__ = ["draw_report", "household_picks", "main", "naive_client_errors", "naive_client_forecasts", "skill_per_round"]

log = logging.getLogger(__name__)


def skill_per_round(evaluations: pd.DataFrame, clients: pd.DataFrame, naive_column: str,
                    mae_column: str = "mae-litres") -> pd.DataFrame:
    """Per round: the evaluated households' mean MAE (L/day), their best-naive mean MAE and the skill.

    ``evaluations``: ``evaluate_clients.csv`` (``round``, ``partition-id``, ``mae_column``: ``mae-litres`` on the
    test days, or ``val-mae-litres`` on the validation days); ``clients``: ``clients.csv`` with ``naive_column``
    (the final evaluation's naive MAE of each household on the same days).
    """
    naive = clients.set_index("partition-id")[naive_column]
    rows = []
    for server_round, group in evaluations.groupby("round"):
        known = group[group["partition-id"].isin(naive.index)]
        if known.empty:
            continue
        mae, reference = known[mae_column].mean(), naive.loc[known["partition-id"]].mean()
        rows.append({"round": int(server_round), "mae-litres": mae, "naive-mae-litres": reference,
                     "skill": 1 - mae / reference if reference > 0 else np.nan})
    return pd.DataFrame(rows, columns=["round", "mae-litres", "naive-mae-litres", "skill"])


def household_picks(clients: pd.DataFrame, naive_column: str) -> dict[str, int]:
    """The partition ids of the households with the best, the median and the worst skill against
    ``naive_column`` (``1 - mae / naive``; the median is the lower middle one).  Households whose naive MAE is
    0 (no use on any test day) have no skill and are not picked."""
    clients = clients[clients[naive_column] > 0]
    if clients.empty:
        return {}
    skill = (1 - clients["mae-litres"] / clients[naive_column]).to_numpy()
    order = np.argsort(-skill, kind="stable")
    ids = clients["partition-id"].to_numpy()
    return {"best": int(ids[order[0]]), "median": int(ids[order[(len(order) - 1) // 2]]), "worst": int(ids[order[-1]])}


def naive_client_errors(run: RunFolder) -> list[dict[str, Any]]:
    """Each finally evaluated client's held-out MAE (L/day) under each naive forecaster of a water run.

    Rows ``{"partition-id", "forecaster", "mae"}``: from the ``naive-*`` columns of ``clients.csv`` (runs since
    the clients report them), else recomputed on the same test windows from the run's own data config
    (:func:`bouquet.tasks.water.naive_errors`).  Empty for image runs.
    """
    from bouquet.tasks.water import NAIVE_FORECASTS, naive_errors, naive_metric

    config = run.app_config()
    if not config.task.forecasting:
        return []
    clients = run.table("clients")
    columns = {naive_metric(name): name for name in NAIVE_FORECASTS if naive_metric(name) in clients.columns}
    if columns:  # the clients reported them (the blend only with a validation split)
        return [{"partition-id": int(row["partition-id"]), "forecaster": name, "mae": float(row[column])}
                for _, row in clients.iterrows() for column, name in columns.items()]
    from bouquet.data.water import load_pool

    pool = load_pool(config.water_data)
    return [{"partition-id": index, "forecaster": name, "mae": mae}
            for index in sorted(int(p) for p in clients["partition-id"].unique())
            for name, mae in naive_errors(pool.client(index, config.water_data)).items()]


def naive_client_forecasts(run: RunFolder, partition_id: int, forecaster: str) -> dict[str, Any]:
    """One client's test-day forecasts in litres by one naive forecaster: ``{"day": [...], "litres": [...]}``
    (days as ``YYYY-MM-DD`` text, as in ``predictions.csv``), from the run's own data config."""
    from bouquet.data.water import load_pool
    from bouquet.tasks.water import naive_litres

    config = run.app_config()
    windows = load_pool(config.water_data).client(partition_id, config.water_data)
    return {"day": windows.test_days.astype("datetime64[D]").astype(str).tolist(),
            "litres": naive_litres(windows)[forecaster].tolist()}


def draw_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Draw ``report.png`` of the water run in ``folder`` (module docstring); returns the file written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bouquet.tasks.water import naive_metric

    run = RunFolder(folder)
    summary = run.summary()
    if "mae-litres-mean" not in summary:
        raise ValueError(f"{run.path} is not a finished water run (its summary has no mae-litres-mean)")
    best = summary.get("best-naive")
    clients = run.table("clients") if run.has("clients") else pd.DataFrame()
    naive_column = naive_metric(best) if best else None
    has_naive = naive_column is not None and naive_column in clients.columns
    picks = household_picks(clients, naive_column) if has_naive else {}
    fig = plt.figure(figsize=(13, 9), constrained_layout=True)
    grid = fig.add_gridspec(2, 3)
    curve, skill_axis = fig.add_subplot(grid[0, :2]), fig.add_subplot(grid[0, 2])
    evaluations = run.table("evaluate_clients") if run.has("evaluate_clients") else pd.DataFrame()
    on_validation = "val-mae-litres" in evaluations.columns and "mae-litres" not in evaluations.columns
    round_naive = naive_metric(best, "validation") if on_validation and best else naive_column
    per_round = pd.DataFrame(columns=["round", "mae-litres", "naive-mae-litres", "skill"])
    if has_naive and not evaluations.empty and round_naive in clients.columns:
        per_round = skill_per_round(evaluations, clients, round_naive,
                                    "val-mae-litres" if on_validation else "mae-litres")
    final = summary["mae-litres-mean"]
    rounds = summary.get("rounds", 0)
    trees = run.table("trees") if run.has("trees") else pd.DataFrame()
    step = "round"
    if len(trees):  # the federated trees: the validation MAE after each number of trees, per coalition
        step = "trees"
        if "coalition" not in trees.columns:  # a run of before coalitions: one ensemble
            trees = trees.assign(coalition="all")
        for label, group in trees.groupby("coalition", sort=True):
            name = "validation MAE" if label == "all" else f"coalition {label}"
            curve.plot(group["trees"], group["val-mae-litres"], label=name)
        curve.set_ylabel("MAE on the validation days (L/day), the model alone")
    elif len(per_round):
        curve.plot(per_round["round"], per_round["mae-litres"], marker=".", label="model (households evaluated)")
        curve.plot(per_round["round"], per_round["naive-mae-litres"], ls=":", color="grey",
                   label=f"{best} (the same households)")
        curve.set_ylabel(f"MAE on the {'validation' if on_validation else 'test'} days (L/day)")
    else:  # no per-round evaluation: the training loss is the learning curve
        train = run.rounds("train")
        curve.plot([r["round"] for r in train if "train-loss" in r], [r["train-loss"] for r in train if "train-loss" in r],
                   marker=".", label="training loss (scaled)")
        curve.set_ylabel("training loss (scaled)")
    curve.set_xlabel("trees" if step == "trees" else "round")
    after = f"{summary.get('trees')} trees" if step == "trees" else f"{rounds} rounds"
    what = "federated trees" if step == "trees" else summary.get("strategy", "")
    curve.set_title(f"{what}: final MAE {final:.2f} L/day over {summary.get('clients-evaluated')} "
                    f"households after {after}")
    curve.legend(loc="upper right")
    if len(per_round):
        skill_axis.plot(per_round["round"], 100 * per_round["skill"], marker=".")
    final_skill = summary.get("skill-vs-best-naive")
    if final_skill is not None:
        skill_axis.axhline(100 * final_skill, ls="--", color="black", lw=1,
                           label=f"final, every household: {100 * final_skill:+.1f} %")
        skill_axis.legend(loc="lower right")
    skill_axis.axhline(0, color="grey", lw=0.8)
    skill_axis.set_xlabel("round" if step == "round" else "(the final model only)")
    chosen_on = summary.get("best-naive-chosen-on", "test")
    skill_axis.set_title(f"skill vs {best or 'no naive forecaster'} (chosen on {chosen_on})")
    skill_axis.set_ylabel("1 - MAE / naive MAE (%)")
    predictions = run.table("predictions") if run.has("predictions") else pd.DataFrame()
    for column, (label, pid) in enumerate(picks.items()):
        axis = fig.add_subplot(grid[1, column])
        days = predictions[predictions["partition-id"] == pid]
        x = pd.to_datetime(days["day"])
        row = clients[clients["partition-id"] == pid].iloc[0]
        axis.plot(x, days["actual-litres"], color="black", lw=1.2, label="actual")
        axis.plot(x, days["predicted-litres"], color="tab:blue", lw=1.2, label="served forecast")
        own = str(row.get("baseline", "")) if pd.notna(row.get("baseline", "")) else ""
        share = float(row.get("served-model-share", 1.0))
        if "model-litres" in days.columns and share < 1:
            axis.plot(x, days["model-litres"], color="tab:green", lw=0.8, ls="--", label="model alone")
        if own and "baseline-litres" in days.columns:
            axis.plot(x, days["baseline-litres"], color="tab:orange", ls=":", label=f"own baseline: {own}")
        else:
            try:
                naive = naive_client_forecasts(run, pid, best)
                axis.plot(pd.to_datetime(naive["day"]), naive["litres"], color="tab:orange", ls=":", label=best)
            except (OSError, ValueError, KeyError) as error:  # the data lives on the nodes only
                log.info("report: no naive forecasts for partition %d (%s)", pid, error)
        served = f", model share {share:.2f}" if own else ""
        axis.set_title(f"{label} household ({pid}): MAE {row['mae-litres']:.0f} vs {row[naive_column]:.0f} L/day"
                       f"{served}", fontsize=9)
        axis.tick_params(axis="x", labelrotation=45)
        axis.set_ylabel("litres / day")
        axis.legend(loc="upper left", fontsize=7)
    target = Path(out) if out is not None else run.path / "report.png"
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw report.png of a bouquet water run.")
    parser.add_argument("folder", help="a run folder (results/<date>-<time>-<strategy>)")
    parser.add_argument("--out", default=None, help="the file to write (default: <folder>/report.png)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not (folder / "summary.json").exists():
        print(f"error: {folder} holds no summary.json (not a finished run folder)", file=sys.stderr)
        return 2
    try:
        print(draw_report(folder, args.out))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
