"""Tables and the figure of the forecaster study (``scripts/run_forecaster_study.py``): each run's numbers read
from its folder, the per-arm table with paired 95 % intervals (ordered by validation MAE, the column that picks
the winner) and ``table.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.results import RunFolder
from bouquet.tuning import paired_interval, sample_std

__all__ = ["REFERENCE_ARMS", "plot_study", "run_rows", "study_table"]

#: The arms every other arm is paired with in the table.
REFERENCE_ARMS = ("fedavg", "local")


def run_rows(folder: Path, arm: str, candidate: str, seed: int) -> dict[str, Any] | None:
    run = RunFolder(folder)
    if not run.finished:
        return None
    s = run.summary()
    clients = run.table("clients")
    return {"arm": arm, "candidate": candidate, "seed": seed, "val-mae": s.get("val-mae-litres-mean"),
            "test-mae": s["mae-litres-mean"], "best-naive": s.get("best-naive"),
            "best-naive-mae": s.get("best-naive-mae-litres"),
            "window-median-mae": s.get("naive-mae-litres", {}).get("window median"),
            "beats-own-naive": s.get("households-beating-own-best-naive"),
            "beats-own-naive-on-test": s.get("households-beating-own-best-naive-on-test"),
            "households": len(clients), "wall-seconds": s.get("wall-seconds")}


def study_table(final: pd.DataFrame, references: tuple[str, ...] = REFERENCE_ARMS) -> pd.DataFrame:
    """Per arm (its chosen candidate), its mean validation MAE over every seed (the column that picks the
    study's winner), the test numbers over seeds and the paired intervals (against the best naive forecaster
    and against each of ``references`` that ran: FedAvg and local training); rows by validation MAE."""
    reference_mae = {ref: final[final["arm"] == ref].set_index("seed")["test-mae"] for ref in references
                     if (final["arm"] == ref).any()}
    rows = []
    for arm, group in final.groupby("arm", sort=False):
        group = group.set_index("seed").sort_index()
        naive = group["best-naive-mae"]
        row = {"arm": arm, "candidate": group["candidate"].iloc[0], "seeds": len(group),
               "val MAE": group["val-mae"].mean(),
               "test MAE": group["test-mae"].mean(), "std": sample_std(group["test-mae"]),
               "best naive (val)": naive.mean(),
               "skill vs best naive": float(np.mean(1 - group["test-mae"] / naive)),
               "vs best naive [95 % CI]": paired_interval(group["test-mae"], naive).text(),
               # the naive forecaster every earlier water result was measured against
               "vs window median [95 % CI]": paired_interval(group["test-mae"], group["window-median-mae"]).text(),
               "beats own naive (val)": group["beats-own-naive"].mean(),
               "beats own naive (test)": group["beats-own-naive-on-test"].mean()}
        for ref, reference in reference_mae.items():
            common = group.index.intersection(reference.index)
            if arm != ref and len(common):
                row[f"vs {ref} [95 % CI]"] = paired_interval(group.loc[common, "test-mae"],
                                                             reference.loc[common]).text()
        rows.append(row)
    # in the order of the validation MAE: the arm on top is the one validation would pick
    return pd.DataFrame(rows).sort_values("val MAE").reset_index(drop=True)


def plot_study(final: pd.DataFrame, out: Path) -> Path:
    """``table.png``: each arm's test MAE relative to the best naive forecaster of the same seed (chosen on
    validation), per seed (dots), with its mean and paired 95 % t interval; 0 is the naive forecaster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    relative = final.assign(change=100 * (final["test-mae"] / final["best-naive-mae"] - 1))
    order = relative.groupby("arm")["change"].mean().sort_values().index.tolist()
    fig, ax = plt.subplots(figsize=(1.3 * len(order) + 3, 4.5), constrained_layout=True)
    for x, arm in enumerate(order):
        rows = relative[relative["arm"] == arm]
        interval = paired_interval(rows["test-mae"], rows["best-naive-mae"])
        mean_naive = rows["best-naive-mae"].mean()
        half = 100 * interval.half_width / mean_naive if interval.n > 1 else 0.0
        ax.errorbar(x, rows["change"].mean(), yerr=half, fmt="o", color="black", capsize=4, zorder=3)
        ax.scatter(np.full(len(rows), x) + np.linspace(-0.15, 0.15, len(rows)), rows["change"], s=14, alpha=0.7,
                   zorder=2)
    ax.axhline(0, ls="--", color="tab:orange", label=f"best naive forecaster, chosen on validation "
                                                    f"({final['best-naive'].mode().iloc[0]})")
    ax.set_xticks(range(len(order)), order, rotation=20)
    ax.set_ylabel("test MAE vs the best naive (%)")
    ax.set_title(f"each arm's chosen candidate, {final['seed'].nunique()} seeds: mean, paired 95 % interval",
                 fontsize=10)
    ax.legend(loc="best", fontsize=8)
    path = out / "table.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
