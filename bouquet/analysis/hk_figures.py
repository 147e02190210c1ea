"""Figures and tables of the HK paper's Section 6 from our runs (PNG + the CSV behind each).

    python scripts/hk_figures.py results/hk/daiad-quick [--out docs/figures/hk-daiad-quick]

Reads the run folders written by ``scripts/run_hk_experiments.py``
(``<arm>/seed-<k>/``) and writes:

* ``mse_per_round``: mean held-out MSE (scaled) per round, per arm (Fig. 4);
* ``accuracy_per_round``: accuracy = 100 x (1 - WAPE) per round, per arm (Fig. 5);
  WAPE = sum |forecast - actual| / sum actual over all evaluated clients' test
  days pooled, in litres (the paper does not define accuracy for a forecaster).
  It is rebuilt from ``evaluate_clients.csv``: client i contributes
  ``n_i * mae_i`` litres of error and ``n_i * mae_i / wape_i`` litres of actual
  use (a client whose test days are all zero has no WAPE and adds only error);
* ``final_mae``: final MAE in litres/day, mean +- std across clients (averaged
  over seeds) and mean +- std across seeds, and the final scaled MSE (mean over
  all clients, the final model evaluated on every node), per arm (Fig. 6 /
  Table 4), also as ``final_mae.md``, with the naive forecasters as rows (``naive: <forecaster>``, on the
  same clients and test windows: :func:`bouquet.report.naive_client_errors`) and each row's skill
  (1 - MAE / the best naive forecaster's MAE);
* ``forecasts``: 60 test days of actual vs predicted daily litres for three
  households, every arm overlaid, seed 0 (Fig. 7), with the study's best naive forecaster dotted;
* ``coalitions_per_round``: K^t per round for each coalition arm;
* ``trajectories``: HK opinion trajectories over inner steps for each HK arm
  (first principal axis of the round's models vs inner step, coloured by final
  coalition; singletons in black), round 1 of seed 0 (Fig. 3).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.cm.tab20.colors)  # > 10 arms, distinct colours
import numpy as np
import pandas as pd

from bouquet.analysis import figures_folder
from bouquet.report import naive_client_errors, naive_client_forecasts
from bouquet.results import RunFolder, find_runs

Runs = dict[str, list[RunFolder]]


def load_runs(base: Path) -> Runs:
    runs: Runs = {}
    for run in find_runs(base, "*/seed-*"):
        runs.setdefault(run.path.parent.name, []).append(run)
    if not runs:
        raise SystemExit(f"no finished runs (*/seed-*/summary.json) under {base}")
    return runs


def rounds_frame(runs: Runs) -> pd.DataFrame:
    rows = []
    for arm, folders in runs.items():
        for run in folders:
            for record in run.rounds():
                rows.append({"arm": arm, "seed": run.path.name,
                             **{k: v for k, v in record.items() if not isinstance(v, list)}})
    return pd.DataFrame(rows)


def per_round(rounds: pd.DataFrame, column: str, phase: str) -> pd.DataFrame:
    """Mean and std over seeds of ``column`` per arm and round (empty when no run records it, e.g. no
    coalitions in a study without HK or fixed-K arms)."""
    if column not in rounds:
        return pd.DataFrame(columns=["arm", "round", "mean", "std"])
    subset = rounds[(rounds["phase"] == phase) & rounds[column].notna()]
    return subset.groupby(["arm", "round"])[column].agg(["mean", "std"]).reset_index()


def pooled_accuracy(runs: Runs) -> pd.DataFrame:
    """100 x (1 - pooled WAPE) per arm and round (mean and std over seeds)."""
    rows = []
    for arm, folders in runs.items():
        for run in folders:
            clients = run.table("evaluate_clients")
            error = clients["num-examples"] * clients["mae-litres"]
            actual = (error / clients["wape"]).where(np.isfinite(clients["wape"]) & (clients["wape"] > 0), 0.0)
            per = pd.DataFrame({"round": clients["round"], "error": error, "actual": actual}).groupby("round").sum()
            for server_round, values in per.iterrows():
                rows.append({"arm": arm, "round": server_round,
                             "accuracy": 100 * (1 - values["error"] / values["actual"])})
    return (pd.DataFrame(rows).groupby(["arm", "round"])["accuracy"].agg(["mean", "std"]).reset_index())


def line_plot(table: pd.DataFrame, ylabel: str, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for arm, group in table.groupby("arm"):
        ax.plot(group["round"], group["mean"], marker="o", markersize=3, label=arm,
                linestyle="-" if arm.startswith("hk-") else "--")
    ax.set_xlabel("communication round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(table):
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def final_mae(runs: Runs) -> pd.DataFrame:
    rows = []
    for arm, folders in runs.items():
        client_means, client_stds, final_mse = [], [], []
        for run in folders:
            clients = run.table("clients")
            client_means.append(clients["mae-litres"].mean())
            client_stds.append(clients["mae-litres"].std(ddof=1))
            final_mse.append(clients["mse"].mean())
        rows.append({"arm": arm, "seeds": len(folders),
                     "mae_mean": float(np.mean(client_means)),
                     "mae_std_across_clients": float(np.mean(client_stds)),
                     "mae_std_across_seeds": float(np.std(client_means, ddof=1)) if len(folders) > 1 else float("nan"),
                     "final_mse": float(np.mean(final_mse)),
                     "final_mse_std_across_seeds": float(np.std(final_mse, ddof=1)) if len(folders) > 1 else float("nan")})
    naive = pd.DataFrame(naive_client_errors(next(iter(runs.values()))[0]))  # the same data for every arm
    for name, group in (naive.groupby("forecaster") if len(naive) else []):
        rows.append({"arm": f"naive: {name}", "seeds": 0, "mae_mean": float(group["mae"].mean()),
                     "mae_std_across_clients": float(group["mae"].std(ddof=1)), "mae_std_across_seeds": float("nan"),
                     "final_mse": float("nan"), "final_mse_std_across_seeds": float("nan")})
    table = pd.DataFrame(rows)
    best = table.loc[table["arm"].str.startswith("naive: "), "mae_mean"].min() if len(naive) else float("nan")
    table["skill"] = 1 - table["mae_mean"] / best  # against the best naive forecaster (NaN for images)
    return table.sort_values("mae_mean").reset_index(drop=True)


def forecasts(runs: Runs, out: Path, days: int = 60, naive: str | None = None) -> None:
    """Forecast plot; ``naive`` names the naive forecaster drawn dotted beside the arms (the study's best)."""
    frames = []
    for arm, folders in runs.items():
        seed0 = [r for r in folders if r.path.name == "seed-0"] or folders[:1]
        predictions = seed0[0].table("predictions")
        frames.append(predictions.assign(arm=arm))
    table = pd.concat(frames)
    days_per_household = table.drop_duplicates(["household", "day"]).groupby("household").size()
    households = sorted(days_per_household.index, key=lambda h: (-days_per_household[h], h))[:3]  # longest tests
    table = table[table["household"].isin(households)]
    table = table.sort_values(["household", "arm", "day"]).groupby(["household", "arm"]).head(days)
    if naive is not None:  # the best naive forecaster's line, on the same days
        first = next(iter(runs.values()))[0]
        for household in households:
            mine = table[table["household"] == household].drop_duplicates("day")
            line = pd.DataFrame(naive_client_forecasts(first, int(mine["partition-id"].iloc[0]), naive))
            line = mine[["partition-id", "household", "day", "actual-litres"]].merge(line, on="day")
            table = pd.concat([table, line.rename(columns={"litres": "predicted-litres"}).assign(
                arm=f"naive: {naive}")], ignore_index=True)
    table.to_csv(out / "forecasts.csv", index=False)
    fig, axes = plt.subplots(len(households), 1, figsize=(10, 3 * len(households)), squeeze=False)
    for ax, household in zip(axes[:, 0], households):
        mine = table[table["household"] == household]
        actual = mine.drop_duplicates("day")
        ax.plot(range(len(actual)), actual["actual-litres"], color="black", linewidth=2, label="actual")
        for arm, group in mine.groupby("arm"):
            ax.plot(range(len(group)), group["predicted-litres"], linewidth=1.5 if arm.startswith("naive") else 1,
                    label=arm, linestyle=":" if arm.startswith("naive") else "-" if arm.startswith("hk-") else "--",
                    color="black" if arm.startswith("naive") else None)
        ax.set_title(f"household {household[:8]}")
        ax.set_ylabel("litres/day")
    axes[-1, 0].set_xlabel("test day")
    axes[0, 0].legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(out / "forecasts.png", dpi=120)
    plt.close(fig)


def trajectories(runs: Runs, out: Path) -> None:
    arms = sorted(a for a in runs if a.startswith("hk-"))
    rows = []
    if not arms:
        return
    fig, axes = plt.subplots(2, (len(arms) + 1) // 2, figsize=(4 * ((len(arms) + 1) // 2), 7), squeeze=False)
    for ax, arm in zip(axes.T.ravel(), arms):
        files = min(runs[arm], key=lambda run: run.path).trajectory_files()
        if not files:
            ax.set_title(f"{arm}: no trajectories")
            continue
        with np.load(files[0]) as stored:
            projection, labels = stored["projection"], stored["labels"]
        sizes = np.bincount(labels)
        colours = plt.cm.tab10(labels % 10)
        for client in range(projection.shape[1]):
            single = sizes[labels[client]] == 1
            ax.plot(range(projection.shape[0]), projection[:, client, 0], color="black" if single else colours[client],
                    linewidth=1.5 if single else 0.8)
            for step in range(projection.shape[0]):
                rows.append({"arm": arm, "round_file": files[0].name, "step": step, "client": client,
                             "coalition": int(labels[client]), "pc1": projection[step, client, 0],
                             "pc2": projection[step, client, 1]})
        ax.set_title(f"{arm}: K={len(sizes)}, {int((sizes == 1).sum())} singletons", fontsize=9)
        ax.set_xlabel("inner step s")
        ax.set_ylabel("opinion, 1st principal axis")
    fig.tight_layout()
    fig.savefig(out / "trajectories.png", dpi=120)
    plt.close(fig)
    pd.DataFrame(rows).to_csv(out / "trajectories.csv", index=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", help="folder with <arm>/seed-<k>/ run folders")
    parser.add_argument("--out", default=None, help="default: <runs>/figures")
    args = parser.parse_args(argv)
    base = Path(args.runs)
    out = figures_folder(base, args.out)
    runs = load_runs(base)
    rounds = rounds_frame(runs)

    mse = per_round(rounds, "mse", "evaluate")
    mse.to_csv(out / "mse_per_round.csv", index=False)
    line_plot(mse, "held-out MSE (scaled)", "Mean held-out MSE per round (Fig. 4)", out / "mse_per_round.png")
    accuracy = pooled_accuracy(runs)
    accuracy.to_csv(out / "accuracy_per_round.csv", index=False)
    line_plot(accuracy, "accuracy = 100 (1 - WAPE) %", "Accuracy per round (Fig. 5)", out / "accuracy_per_round.png")

    table = final_mae(runs)
    table.to_csv(out / "final_mae.csv", index=False)
    lines = [("| method | seeds | final MAE (L/day), mean +- std across clients | MAE std across seeds | "
              "final MSE (scaled), mean over clients +- std across seeds | skill vs best naive |"),
             "|---|--:|--:|--:|--:|--:|"]
    def cell(value: float, form: str) -> str:
        return "-" if not np.isfinite(value) else format(value, form)

    lines += [f"| {r.arm} | {r.seeds or '-'} | {r.mae_mean:.2f} +- {r.mae_std_across_clients:.2f} | "
              f"{cell(r.mae_std_across_seeds, '.2f')} | "
              + ("-" if not np.isfinite(r.final_mse) else
                 f"{r.final_mse:.4f} +- {cell(r.final_mse_std_across_seeds, '.4f')}")
              + f" | {cell(100 * r.skill, '+.1f')} % |" for r in table.itertuples()]
    (out / "final_mae.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(table["arm"], table["mae_mean"], yerr=table["mae_std_across_clients"], capsize=3,
           color=["tab:blue" if a.startswith("hk-") else "tab:orange" if a.startswith("naive: ") else "tab:gray"
                  for a in table["arm"]])
    ax.set_ylabel("final MAE (litres/day)")
    ax.set_title("Final MAE, mean +- std across clients (Fig. 6)")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "final_mae.png", dpi=120)
    plt.close(fig)

    coalitions = per_round(rounds, "coalitions", "train")
    coalitions.to_csv(out / "coalitions_per_round.csv", index=False)
    line_plot(coalitions, "coalitions K^t", "Number of coalitions per round", out / "coalitions_per_round.png")
    naive = table.loc[table["arm"].str.startswith("naive: ")].sort_values("mae_mean")["arm"]
    forecasts(runs, out, naive=naive.iloc[0].removeprefix("naive: ") if len(naive) else None)
    trajectories(runs, out)
    print("\n".join(lines))
    print(f"figures and CSVs in {out}")


if __name__ == "__main__":
    main()
