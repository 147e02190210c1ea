"""Figures and the table of the known-groups study from its runs (PNG + the CSV behind each).

    python scripts/groups_figures.py results/groups/digits-rotate-quick [--out docs/figures/groups-digits-rotate]

Reads the run folders written by ``scripts/run_groups_experiments.py`` (``<arm>/seed-<k>/``).  A client's
*error* is what it measures with the model it is served at evaluation: 100 - accuracy (%) on images, MAE in
litres/day on water.  Writes:

* ``ari_per_round``: adjusted Rand index of the round's coalitions / clusters against the true groups (over
  the round's participants; the ``ari`` of the train records), mean over seeds, per arm that forms groups;
  dashed: the ARI of the served models over every evaluated client (``served-ari``);
* ``k_per_round``: coalitions / clusters per round (mean over seeds);
* ``error_per_round``: mean per-client error per round;
* ``error_per_group``: final-round mean error per true group, per arm (mean over seeds);
* ``served_error``: the distribution of final per-client errors (all seeds pooled), per arm;
* ``stability_per_round`` (only when the clients have no true groups, e.g. DAIAD): ARI between consecutive
  rounds' coalitions over the clients in both;
* on water, the naive forecasters (``naive: <forecaster>``, each of
  :data:`bouquet.tasks.water.NAIVE_FORECASTS`; :func:`bouquet.tasks.water.naive_errors`) on the same test
  windows, as rows of the table, bars of
  ``error_per_group`` and boxes of ``served_error``;
* ``table.md`` / ``table.csv``: per arm, final error mean +- std across clients (mean over seeds), std across
  seeds, change vs FedAvg, the share of clients whose error (mean over seeds) is below FedAvg's, ARI at round 5 and at the end, the round from which ARI stays >= 0.9 (every seed), the final
  K and served-model ARI.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.cm.tab20.colors)  # > 10 arms, distinct colours
import pandas as pd

from bouquet.algorithms.groups import stability
from bouquet.analysis import figures_folder
from bouquet.report import naive_client_errors
from bouquet.results import RunFolder, find_runs, markdown_table

#: Rows of the naive forecasters are named ``naive: <forecaster>`` (water benchmarks only).
NAIVE = "naive: "

#: The round by which the study's target asks for ARI >= 0.9.
TARGET_ROUND = 5
TARGET_ARI = 0.9


def load_runs(base: Path) -> dict[str, list[RunFolder]]:
    runs: dict[str, list[RunFolder]] = {}
    for run in find_runs(base, "*/seed-*"):
        runs.setdefault(run.path.parent.name, []).append(run)
    if not runs:
        raise SystemExit(f"no finished runs (*/seed-*/summary.json) under {base}")
    return dict(sorted(runs.items()))


def client_errors(runs: dict[str, list[RunFolder]]) -> tuple[pd.DataFrame, str]:
    """Every (arm, seed, round, client) error with the served model, and the error's unit."""
    frames = []
    unit = ""
    for arm, folders in runs.items():
        for run in folders:
            table = run.table("evaluate_clients")
            if "accuracy" in table:
                table["error"], unit = 100.0 * (1.0 - table["accuracy"]), "error (%)"
            else:
                table["error"], unit = table["mae-litres"], "MAE (L/day)"
            table["arm"], table["seed"] = arm, run.path.name
            if "group" not in table:  # data without ground truth (DAIAD)
                table["group"] = None
            frames.append(table[["arm", "seed", "round", "partition-id", "group", "model", "error"]])
    return pd.concat(frames, ignore_index=True), unit


def naive_errors_frame(runs: dict[str, list[RunFolder]], clients: pd.Series) -> pd.DataFrame:
    """Water benchmarks: each evaluated client's held-out MAE under the naive forecasters (empty for images).

    The data are those of the first run (every arm of a study shares them); the same test windows as the
    federated models' evaluation (:func:`bouquet.report.naive_client_errors`).
    """
    from bouquet.data.water import load_pool

    first = next(iter(runs.values()))[0]
    wanted = {int(c) for c in clients.unique()}
    errors = [e for e in naive_client_errors(first) if e["partition-id"] in wanted]
    if not errors:
        return pd.DataFrame(columns=["arm", "seed", "partition-id", "group", "model", "error"])
    config = first.app_config()
    pool = load_pool(config.water_data)
    return pd.DataFrame([{"arm": NAIVE + e["forecaster"], "seed": "-", "partition-id": e["partition-id"],
                          "group": pool.group_of(e["partition-id"]) or None, "model": "none", "error": e["mae"]}
                         for e in errors])


def round_records(runs: dict[str, list[RunFolder]]) -> pd.DataFrame:
    rows = []
    for arm, folders in runs.items():
        for run in folders:
            train = {r["round"]: r for r in run.rounds("train")}
            for record in run.rounds("evaluate"):
                t = train.get(record["round"], {})
                rows.append({"arm": arm, "seed": run.path.name, "round": record["round"],
                             "ari": t.get("ari"), "k": t.get("coalitions"),
                             "served-ari": record.get("served-ari"), "models-served": record.get("models-served")})
    return pd.DataFrame(rows)


def coalition_stability(runs: dict[str, list[RunFolder]]) -> pd.DataFrame:
    """ARI between consecutive rounds' coalitions (participants in both), per arm that forms them."""
    rows = []
    for arm, folders in runs.items():
        for run in folders:
            if not run.has("coalitions"):
                continue
            table = run.table("coalitions")
            by_round = {r: dict(zip(g["partition-id"], g["coalition"], strict=True))
                        for r, g in table.groupby("round")}
            rounds = sorted(by_round)
            for previous, current in itertools.pairwise(rounds):
                value = stability(by_round[previous], by_round[current])
                if value is not None:
                    rows.append({"arm": arm, "seed": run.path.name, "round": current, "stability": value})
    return pd.DataFrame(rows, columns=["arm", "seed", "round", "stability"])


def line_plot(frame: pd.DataFrame, column: str, ylabel: str, path: Path, dashed: str | None = None) -> None:
    curves = frame.groupby(["arm", "round"])[[c for c in (column, dashed) if c]].mean().reset_index()
    curves.to_csv(path.with_suffix(".csv"), index=False)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for arm, curve in curves.groupby("arm"):
        if curve[column].notna().any():
            (line,) = ax.plot(curve["round"], curve[column], marker="o", label=arm)
            if dashed and curve[dashed].notna().any():
                ax.plot(curve["round"], curve[dashed], ls="--", color=line.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    plt.close(fig)


def first_round_at(curves: pd.DataFrame, threshold: float) -> int | None:
    """First round from which every seed's ARI stays >= threshold (None: never)."""
    worst = curves.groupby("round")["ari"].min().sort_index()
    ok = (worst >= threshold).to_numpy()
    for index in range(len(ok)):
        if ok[index:].all():
            return int(worst.index[index])
    return None


def final_errors(errors: pd.DataFrame) -> pd.DataFrame:
    """The rows of each (arm, seed)'s last round."""
    return errors[errors["round"] == errors.groupby(["arm", "seed"])["round"].transform("max")]


def summary_table(errors: pd.DataFrame, records: pd.DataFrame, unit: str) -> pd.DataFrame:
    last = final_errors(errors)
    per_seed = last.groupby(["arm", "seed"])["error"].agg(["mean", "std"])
    fedavg = per_seed.loc["fedavg", "mean"].mean() if "fedavg" in per_seed.index.get_level_values(0) else None
    per_client = last.groupby(["arm", "partition-id"])["error"].mean().unstack()  # arms x clients, seed mean
    rows = []
    for arm, seeds in per_seed.groupby(level=0):
        rec = records[records["arm"] == arm]
        final_round = rec["round"].max() if len(rec) else 0
        at = rec[rec["round"] == min(TARGET_ROUND, final_round)]
        end = rec[rec["round"] == final_round]
        mean = seeds["mean"].mean()
        naive = arm.startswith(NAIVE)
        rows.append({"arm": arm, "seeds": "-" if naive else len(seeds), f"final {unit}": mean,
                     "std across clients": seeds["std"].mean(),
                     "std across seeds": None if naive else seeds["mean"].std(ddof=1),
                     "vs fedavg (%)": 100.0 * (mean - fedavg) / fedavg if fedavg else None,
                     "clients better than fedavg (%)": 100.0 * float((per_client.loc[arm]
                                                                      < per_client.loc["fedavg"]).mean())
                     if fedavg else None,
                     "ARI r3 (lowest seed)": rec.loc[rec["round"] == min(3, final_round), "ari"].min(),
                     f"ARI r{TARGET_ROUND}": at["ari"].mean(), "ARI final": end["ari"].mean(),
                     "ARI final (lowest seed)": end["ari"].min(),
                     f"ARI>={TARGET_ARI} from round": first_round_at(rec.dropna(subset=["ari"]), TARGET_ARI)
                     if rec["ari"].notna().any() else None,
                     "K final": end["k"].mean(), "served ARI final": end["served-ari"].mean(),
                     "models served": end["models-served"].mean()})
    return pd.DataFrame(rows)


def paired_table(errors: pd.DataFrame, references: list[str]) -> pd.DataFrame:
    """Per arm and reference arm: the final mean error minus the reference's, seed by seed (same seed, same
    data), with its paired 95 % Student-t interval (:func:`bouquet.tuning.paired_interval`), also in % of the
    reference's mean; seeds only where both ran."""
    from bouquet.tuning import paired_interval

    per_seed = final_errors(errors).groupby(["arm", "seed"])["error"].mean().unstack()  # arms x seeds
    rows = []
    for reference in references:
        if reference not in per_seed.index:
            raise SystemExit(f"--paired-against {reference!r}: no such arm among {', '.join(per_seed.index)}")
        for arm in per_seed.index:
            if arm == reference or arm.startswith(NAIVE):
                continue
            both = per_seed.loc[[arm, reference]].dropna(axis=1)
            if both.shape[1] == 0:
                continue
            interval = paired_interval(both.loc[arm].to_numpy(), both.loc[reference].to_numpy())
            base = float(both.loc[reference].mean())
            rows.append({"arm": arm, "against": reference, "seeds": interval.n, "difference": interval.mean,
                         "95% half-width": interval.half_width, "difference (%)": 100.0 * interval.mean / base,
                         "95% half-width (%)": 100.0 * interval.half_width / base})
    return pd.DataFrame(rows)


def at_rounds_table(errors: pd.DataFrame, records: pd.DataFrame, rounds: list[int]) -> pd.DataFrame:
    """Per arm and round R: the mean per-client error (mean over seeds), and the round's ARI (mean and lowest
    seed) and K (mean); rounds an arm did not reach are left out."""
    trained = errors[~errors["arm"].str.startswith(NAIVE)]
    rows = []
    for (arm, at), group in trained[trained["round"].isin(rounds)].groupby(["arm", "round"]):
        rec = records[(records["arm"] == arm) & (records["round"] == at)]
        rows.append({"arm": arm, "round": int(at), "error": group.groupby("seed")["error"].mean().mean(),
                     "seeds": group["seed"].nunique(), "ARI": rec["ari"].mean(), "ARI (lowest seed)": rec["ari"].min(),
                     "K": rec["k"].mean()})
    return pd.DataFrame(rows)


def validation_choices(runs: dict[str, list[RunFolder]], families: list[str], seeds: list[str]) -> pd.DataFrame:
    """``NAME=ARM,ARM,...``: per name, the arm with the lowest mean validation MAE (``val-mae-litres-mean``
    of the runs' summaries) over ``seeds`` (:func:`bouquet.tuning.choose_on_validation`; no test number is
    read)."""
    from bouquet.tuning import choose_on_validation

    rows = []
    for family in families:
        name, _, arms = family.partition("=")
        for arm in arms.split(","):
            if arm not in runs:
                raise SystemExit(f"--choose {family!r}: no runs of arm {arm!r}")
            for run in runs[arm]:
                if run.path.name not in seeds:
                    continue
                value = run.summary().get("val-mae-litres-mean")
                if value is None:
                    raise SystemExit(f"--choose: {run.path} has no validation MAE (run with validation-fraction > 0)")
                rows.append({"arm": name, "candidate": arm, "seed": run.path.name, "val-mae": value})
    return choose_on_validation(pd.DataFrame(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="results/groups/<data>-<profile>")
    parser.add_argument("--out", type=Path, default=None, help="default: <base>/figures")
    parser.add_argument("--paired-against", action="append", default=None, metavar="ARM",
                        help="write paired.md: each arm's final error minus this arm's, per seed, with paired 95 %% "
                             "intervals (repeatable; default: fedavg where it ran)")
    parser.add_argument("--at-round", type=int, action="append", default=None, metavar="R",
                        help="also write at_rounds.md (error, ARI, K per arm at round R) and the paired differences "
                             "at round R in paired.md (repeatable)")
    parser.add_argument("--choose", action="append", default=None, metavar="NAME=ARM,ARM,...",
                        help="water: choose among these arms on validation MAE over --tuning-seeds; writes "
                             "choices.md (repeatable)")
    parser.add_argument("--tuning-seeds", nargs="+", type=int, default=[0, 1], metavar="K",
                        help="the seeds --choose reads (default: 0 1)")
    args = parser.parse_args(argv)
    out = figures_folder(args.base, args.out)
    runs = load_runs(args.base)
    errors, unit = client_errors(runs)
    naive = naive_errors_frame(runs, errors["partition-id"])
    if len(naive):  # the naive forecasters beside every water result, as one more "round" each
        errors = pd.concat([errors, naive.assign(round=0)], ignore_index=True)
    records = round_records(runs)
    has_groups = errors["group"].notna().any()

    if has_groups and records["ari"].notna().any():
        line_plot(records, "ari", "ARI vs true groups (dashed: served models)", out / "ari_per_round", "served-ari")
    line_plot(records, "k", "coalitions / clusters", out / "k_per_round")
    trained = errors[~errors["arm"].str.startswith(NAIVE)]
    line_plot(trained.groupby(["arm", "seed", "round"])["error"].mean().reset_index(), "error",
              f"mean per-client {unit}", out / "error_per_round")

    last = final_errors(errors)
    if has_groups:
        per_group = last.groupby(["arm", "group", "seed"])["error"].mean().groupby(["arm", "group"]).mean().unstack()
        per_group.to_csv(out / "error_per_group.csv")
        ax = per_group.plot.bar(figsize=(9, 5.5))
        ax.set_ylabel(f"final {unit} (group mean)")
        ax.figure.tight_layout()
        ax.figure.savefig(out / "error_per_group.png", dpi=120)
        plt.close(ax.figure)
    else:
        stable = coalition_stability(runs)
        if len(stable):
            line_plot(stable, "stability", "ARI between consecutive rounds' coalitions",
                      out / "stability_per_round")

    last[["arm", "seed", "partition-id", "group", "model", "error"]].to_csv(out / "served_error.csv", index=False)
    arms = list(runs) + sorted(naive["arm"].unique()) if len(naive) else list(runs)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.boxplot([last.loc[last["arm"] == arm, "error"] for arm in arms], showmeans=True)
    ax.set_xticks(range(1, len(arms) + 1), arms, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"final per-client {unit} (all seeds)")
    fig.tight_layout()
    fig.savefig(out / "served_error.png", dpi=120)
    plt.close(fig)

    table = summary_table(errors, records, unit)
    table.to_csv(out / "table.csv", index=False)
    (out / "table.md").write_text(markdown_table(table))
    print(markdown_table(table))
    references = args.paired_against or (["fedavg"] if "fedavg" in runs else [])
    if args.at_round:
        at = at_rounds_table(errors, records, sorted(args.at_round))
        at.to_csv(out / "at_rounds.csv", index=False)
        (out / "at_rounds.md").write_text(markdown_table(at))
        print(markdown_table(at))
    if args.choose:
        choices = validation_choices(runs, args.choose, [f"seed-{k}" for k in args.tuning_seeds])
        choices.to_csv(out / "choices.csv", index=False)
        (out / "choices.md").write_text(markdown_table(choices))
        print(markdown_table(choices))
    if references:
        paired = paired_table(errors, references).assign(round="final")
        for at_round in sorted(args.at_round or []):
            paired = pd.concat([paired, paired_table(errors[errors["round"] <= at_round], references)
                                .assign(round=at_round)], ignore_index=True)
        paired.to_csv(out / "paired.csv", index=False)
        (out / "paired.md").write_text(markdown_table(paired))
        print(markdown_table(paired))
    print(f"figures and tables in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
