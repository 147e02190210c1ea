"""Figures and tables of the SCKM paper's Section 6 from our runs (PNG + the CSV behind each).

    python scripts/sckm_figures.py results/sckm/select-cifar10-cpu [--out docs/figures/sckm-select-cifar10-cpu]
        [--add-runs docs/figures/sckm-select-cifar10-cpu/runs.csv]

Reads ``<setting>/<arm>/seed-<k>/summary.json`` written by
``scripts/run_sckm_experiments.py`` (plus, with ``--add-runs``, the rows of
an earlier ``runs.csv``, and of the ``selection_facts.csv`` beside it, for
runs whose folders are gone; a run folder wins over a row for the same
setting, arm and seed) and writes:

* ``runs``: every run's accuracy per round (and C-hat), the data behind all
  of the below, small enough to keep in the repository;
* ``accuracy_per_round``: central test accuracy per round, mean over seeds,
  one panel per setting, every arm (Fig. 4 / 5);
* ``table``: the layout of Tables 5 and 6 per budget B: accuracy (%) averaged
  over the settings with that B for each shard count S, at the quarter points
  of the run (rounds T/4, T/2, 3T/4, T: the paper's 15/30/45/60 of 60), and
  the average and std over all of those cells; also ``table.md``;
* with ``--variants`` (the variant study), ``table`` is instead one
  row per arm (``variant``) and setting: ``variant,shards,budget,seeds,
  last5_mean,last5_std`` (each seed's mean over the last 5 rounds, then mean
  and std over seeds), with each arm's difference to ``random`` in
  ``table.md``; the Table 5 layout goes to ``table5``; and ``versus_random``:
  each arm against ``random`` of the same seed (the same initial model; every
  run trains the same ``data-seed`` partition), over the last 5 and the last
  50 rounds, per setting and pooled over the settings, with the mean paired
  difference, its 95 % t interval and how many pairs lie above random;
* ``seeds``: final accuracy mean +- std across seeds per setting and arm, and
  the same for each seed's mean over the last 5 rounds (``last5-``);
* ``clusters_per_round``: C-hat per round (mean over seeds) per SCKM-Cluster
  setting, and C* (eq. 10) per budget (Fig. 3), when such runs exist;
* ``rounds_to_target``: the first round whose seed-mean accuracy reaches the
  target (90 % of the best final seed-mean accuracy in that setting) per arm,
  and the saving of SCKM against each baseline; left empty where the target
  is not above the accuracy of the untrained model (round 0), i.e. where no
  arm learned;
* ``selection_facts``: what each arm chose, from the run folders'
  ``train_clients.csv`` and ``selection.csv`` (with ``sketch-source =
  "local-update"``, the aggregated updates of each round's ``update-nodes``
  instead of who trained) and each client's classes (the
  run's own seeded partition, rebuilt from its ``config.json``): distinct
  classes covered by a round's trained clients, the loss rank of the chosen
  among the candidates (1 = highest loss; empty where the arm asked no
  losses), rounds that re-use a client of the previous round, and distinct
  clients over the run; per run in the CSV, per setting and arm in ``.md``;
  with ``--variants`` also ``coverage_vs_accuracy``: per setting, the Spearman
  correlation across arms between classes covered and the accuracy of the
  last 50 rounds.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.data.images import VisionDataParams, load_images, partition
from bouquet.results import find_runs

TAIL_ROUNDS = 5
LONG_TAIL_ROUNDS = 50  # the variant study's second window (rounds 251-300 of 300): less swing than the last 5
SMOOTH_ROUNDS = 25
SETTING = re.compile(r"c(?P<clients>\d+)-s(?P<shards>\d+)-b(?P<budget>\d+)")


def load_runs(base: Path) -> pd.DataFrame | None:
    """One row per (setting, arm, seed, round) with the accuracy, and C-hat where recorded."""
    rows = []
    for run in find_runs(base, "*/*/seed-*"):
        seed_dir = run.path
        arm, setting = seed_dir.parent.name, seed_dir.parent.parent.name
        match = SETTING.fullmatch(setting)
        if match is None:
            continue
        summary = run.summary()
        clusters = summary.get("clusters-per-round", [])
        for rnd, acc in enumerate(summary["accuracy-per-round"]):
            rows.append({"setting": setting, "arm": arm, "seed": int(seed_dir.name.removeprefix("seed-")),
                         "round": rnd, "accuracy": 100.0 * acc,
                         "clusters": clusters[rnd - 1] if 1 <= rnd <= len(clusters) else np.nan,
                         **{k: int(v) for k, v in match.groupdict().items()}})
    return pd.DataFrame(rows) if rows else None


def add_runs(runs: pd.DataFrame | None, extra: list[pd.DataFrame]) -> pd.DataFrame:
    """``runs`` plus the rows of the earlier tables ``extra`` (read from ``runs.csv`` or ``selection_facts.csv``)
    for (setting, arm, seed) not in ``runs``, sorted by those columns (and ``round`` where there is one)."""
    frames = [] if runs is None else [runs]
    for rows in extra:
        if frames:
            have = pd.concat(frames)[["setting", "arm", "seed"]].drop_duplicates()
            rows = rows.merge(have, how="left", indicator=True).query("_merge == 'left_only'").drop(columns="_merge")
        frames.append(rows)
    if not frames:
        raise SystemExit("no runs: give a results folder with finished runs or --add-runs")
    order = [c for c in ("setting", "arm", "seed", "round") if c in frames[0]]
    return pd.concat(frames, ignore_index=True).sort_values(order, ignore_index=True)


def accuracy_figure(runs: pd.DataFrame, out: Path) -> None:
    import matplotlib.pyplot as plt

    curve = runs.groupby(["setting", "arm", "round"], as_index=False)["accuracy"].agg(["mean", "std"]).reset_index()
    curve.to_csv(out / "accuracy_per_round.csv", index=False)
    settings = sorted(runs["setting"].unique())
    cols = min(3, len(settings))
    rows = int(np.ceil(len(settings) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    styles = arm_styles(sorted(runs["arm"].unique()))
    for ax, setting in zip(axes.flat, settings):
        for arm, part in curve[curve["setting"] == setting].groupby("arm"):
            ax.plot(part["round"], part["mean"], label=arm, **styles[arm])
        ax.set_title(setting)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
    for ax in list(axes.flat)[len(settings):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accuracy_per_round.png", dpi=120)
    plt.close(fig)


def arm_styles(arms: list[str]) -> dict[str, dict[str, Any]]:
    """A colour (tab20: no two of up to 20 arms alike) and line per arm: SCKM arms dashed and thicker."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab20").colors
    return {arm: {"color": colours[i % len(colours)], "ls": "--" if arm.startswith("sckm") else "-",
                  "lw": 1.8 if arm.startswith("sckm") else 1.4} for i, arm in enumerate(arms)}


def smoothed_curves(runs: pd.DataFrame, window: int = SMOOTH_ROUNDS) -> pd.DataFrame:
    """Per setting and arm, the seed-mean accuracy per round averaged over the ``window`` rounds ending at each
    round (fewer at the start): the trend under the round-to-round swings of two label-sorted clients a round."""
    mean = runs.groupby(["setting", "arm", "round"], as_index=False)["accuracy"].mean()
    mean["smoothed"] = mean.groupby(["setting", "arm"])["accuracy"].transform(
        lambda curve: curve.rolling(window, min_periods=1).mean())
    return mean


def smoothed_figure(runs: pd.DataFrame, out: Path, window: int = SMOOTH_ROUNDS) -> None:
    """``accuracy_smoothed.png`` / ``.csv``: :func:`smoothed_curves`, one panel per setting, every arm."""
    import matplotlib.pyplot as plt

    curves = smoothed_curves(runs, window)
    curves.to_csv(out / "accuracy_smoothed.csv", index=False)
    settings = sorted(curves["setting"].unique())
    styles = arm_styles(sorted(curves["arm"].unique()))
    fig, axes = plt.subplots(1, len(settings), figsize=(5.6 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes.flat, settings):
        for arm, part in curves[curves["setting"] == setting].groupby("arm"):
            ax.plot(part["round"], part["smoothed"], label=arm, **styles[arm])
        ax.set_title(f"{setting}: mean of the last {window} rounds")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "accuracy_smoothed.png", dpi=120)
    plt.close(fig)


def quarter_rounds(last: int) -> list[int]:
    return sorted({max(1, round(last * q)) for q in (0.25, 0.5, 0.75, 1.0)})


def variant_table(runs: pd.DataFrame, out: Path) -> pd.DataFrame:
    """The variant study's table: one row per arm and setting, each seed's mean accuracy (%) over the
    last 5 rounds, then their mean and std (ddof 1; empty with one seed) over the seeds; ``table.csv`` and
    ``table.md``, best first within each setting."""
    last = int(runs["round"].max())
    tail = runs[runs["round"] > last - TAIL_ROUNDS].groupby(["shards", "budget", "arm", "seed"])["accuracy"].mean()
    rows = [{"variant": arm, "shards": shards, "budget": budget, "seeds": len(part),
             "last5_mean": part.mean(), "last5_std": part.std(ddof=1) if len(part) > 1 else np.nan}
            for (shards, budget, arm), part in tail.groupby(["shards", "budget", "arm"])]
    table = pd.DataFrame(rows).sort_values(["shards", "budget", "last5_mean"], ascending=[True, True, False])
    table.to_csv(out / "table.csv", index=False)
    lines = []
    for (shards, budget), part in table.groupby(["shards", "budget"]):
        random_mean = part.set_index("variant")["last5_mean"].get("random", np.nan)
        title = (f"**S = {shards}, B = {budget}** (accuracy %, mean over rounds {max(0, last - TAIL_ROUNDS + 1)}-{last}, "
                 "mean +- std over seeds)")
        lines += [title, "", "| variant | seeds | last 5 | vs random |", "|---|--:|--:|--:|"]
        for _, r in part.iterrows():
            spread = "" if pd.isna(r["last5_std"]) else f" +- {r['last5_std']:.2f}"
            versus = "-" if pd.isna(random_mean) else f"{r['last5_mean'] - random_mean:+.2f}"
            lines.append(f"| {r['variant']} | {r['seeds']} | {r['last5_mean']:.2f}{spread} | {versus} |")
        lines.append("")
    (out / "table.md").write_text("\n".join(lines))
    return table


def paired_differences(runs: pd.DataFrame) -> pd.DataFrame:
    """Each arm's accuracy (%) minus that of ``random`` with the same setting and seed, averaged over the last
    :data:`TAIL_ROUNDS` (``diff_last5``) and the last :data:`LONG_TAIL_ROUNDS` rounds (``diff_last50``); one row
    per (shards, budget, arm, seed) that has a random run beside it."""
    last = int(runs["round"].max())
    keys = ["shards", "budget", "arm", "seed"]
    means = pd.DataFrame({
        f"last{k}": runs[runs["round"] > last - k].groupby(keys)["accuracy"].mean()
        for k in (TAIL_ROUNDS, LONG_TAIL_ROUNDS)}).reset_index()
    base = means[means["arm"] == "random"].drop(columns="arm")
    pairs = means[means["arm"] != "random"].merge(base, on=["shards", "budget", "seed"], suffixes=("", "_random"))
    for k in (TAIL_ROUNDS, LONG_TAIL_ROUNDS):
        pairs[f"diff_last{k}"] = pairs[f"last{k}"] - pairs[f"last{k}_random"]
    return pairs[[*keys, f"diff_last{TAIL_ROUNDS}", f"diff_last{LONG_TAIL_ROUNDS}"]]


def mean_interval(values: pd.Series) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its two-sided 95 % Student t interval (NaN with one value)."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return float(values.mean()), np.nan
    return float(values.mean()), float(stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n))


def versus_random(runs: pd.DataFrame, out: Path) -> pd.DataFrame:
    """The variant study's answer to "does it beat random": :func:`paired_differences` summarised per arm and
    setting, and per arm over every setting (``shards`` = ``all``): pairs, mean paired difference and 95 % t
    half-width over the last 5 and the last 50 rounds, and the pairs above random over the last 50;
    ``versus_random.csv`` and ``.md`` (best pooled arm first)."""
    pairs = paired_differences(runs)
    rows = []
    groups = [*pairs.groupby(["arm", "shards", "budget"]),
              *(((arm, "all", "all"), part) for arm, part in pairs.groupby("arm"))]
    for (arm, shards, budget), part in groups:
        row = {"variant": arm, "shards": shards, "budget": budget, "pairs": len(part)}
        for k in (TAIL_ROUNDS, LONG_TAIL_ROUNDS):
            row[f"diff_last{k}_mean"], row[f"diff_last{k}_ci95"] = mean_interval(part[f"diff_last{k}"])
        row[f"above_last{LONG_TAIL_ROUNDS}"] = int((part[f"diff_last{LONG_TAIL_ROUNDS}"] > 0).sum())
        rows.append(row)
    table = pd.DataFrame(rows)
    pooled = table[table["shards"] == "all"].set_index("variant")[f"diff_last{LONG_TAIL_ROUNDS}_mean"]
    order = table.assign(pooled=table["variant"].map(pooled),
                         setting=pd.to_numeric(table["shards"], errors="coerce").fillna(np.inf))  # "all" last
    table = table.loc[order.sort_values(["pooled", "variant", "setting"], ascending=[False, True, True]).index]
    table.to_csv(out / "versus_random.csv", index=False)

    def cell(mean: float, half: float) -> str:
        return f"{mean:+.2f}" + ("" if np.isnan(half) else f" +- {half:.2f}")

    long = LONG_TAIL_ROUNDS
    lines = [("Accuracy (points) minus random's with the same seed; mean over the pairs +- the half-width of its "
              f"95 % t interval; 'above': pairs above random over the last {long} rounds."), "",
             f"| variant | S | pairs | last {TAIL_ROUNDS} rounds | last {long} rounds | above |", "|---|---|--:|--:|--:|--:|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['variant']} | {r['shards']} | {r['pairs']} | "
                     f"{cell(r[f'diff_last{TAIL_ROUNDS}_mean'], r[f'diff_last{TAIL_ROUNDS}_ci95'])} | "
                     f"{cell(r[f'diff_last{long}_mean'], r[f'diff_last{long}_ci95'])} | {r[f'above_last{long}']} |")
    (out / "versus_random.md").write_text("\n".join(lines) + "\n")
    return table


def tables(runs: pd.DataFrame, out: Path, name: str = "table") -> None:
    mean = runs.groupby(["setting", "shards", "budget", "arm", "round"], as_index=False)["accuracy"].mean()
    last = int(mean["round"].max())
    checkpoints = quarter_rounds(last)
    rows = []
    for budget, part in mean.groupby("budget"):
        for arm, arm_part in part.groupby("arm"):
            cells = arm_part[arm_part["round"].isin(checkpoints)]
            row = {"budget": budget, "arm": arm}
            for shards, shard_part in cells.groupby("shards"):
                row[f"shard {shards}"] = shard_part["accuracy"].mean()
            for rnd in checkpoints:
                row[f"round {rnd}"] = cells[cells["round"] == rnd]["accuracy"].mean()
            row["all avg"] = cells["accuracy"].mean()
            row["all std"] = cells["accuracy"].std(ddof=1)
            rows.append(row)
    table = pd.DataFrame(rows)
    shard_columns = [f"shard {k}" for k in sorted(mean["shards"].unique())]  # a budget may lack a shard count
    table = table.reindex(columns=["budget", "arm", *shard_columns, *[f"round {r}" for r in checkpoints],
                                   "all avg", "all std"])
    table.to_csv(out / f"{name}.csv", index=False)
    lines = []
    for budget, part in table.groupby("budget"):
        cols = [c for c in part.columns if c not in ("budget", "arm")]
        missing = [c for c in shard_columns if part[c].isna().all()]
        note = f"; {', '.join(missing)} not run, so the rounds and averages are over the others" if missing else ""
        lines += [f"**Select = {budget}** (accuracy %, seed means; rounds {checkpoints} of {last}{note})", "",
                  "| arm | " + " | ".join(cols) + " |", "|---|" + "--:|" * len(cols)]
        for _, r in part.sort_values("all avg", ascending=False).iterrows():
            lines.append(f"| {r['arm']} | " + " | ".join("-" if pd.isna(r[c]) else f"{r[c]:.2f}" for c in cols) + " |")
        lines.append("")
    (out / f"{name}.md").write_text("\n".join(lines))

    final = runs[runs["round"] == last].groupby(["setting", "arm"])["accuracy"].agg(["mean", "std", "count"])
    # a round-to-round noisier curve is better summarised by each seed's mean over the last few rounds
    tail = runs[runs["round"] > last - TAIL_ROUNDS].groupby(["setting", "arm", "seed"])["accuracy"].mean()
    tail = tail.groupby(["setting", "arm"]).agg(["mean", "std"]).add_prefix(f"last{TAIL_ROUNDS}-")
    final.join(tail).reset_index().to_csv(out / "seeds.csv", index=False)


def clusters_figure(runs: pd.DataFrame, out: Path) -> None:
    import matplotlib.pyplot as plt

    cl = runs[runs["arm"] == "sckm-cluster"].dropna(subset=["clusters"])
    if cl.empty:
        return
    per_round = cl.groupby(["setting", "budget", "round"], as_index=False)["clusters"].mean()
    per_round.to_csv(out / "clusters_per_round.csv", index=False)
    c_star = cl.groupby(["setting", "budget", "seed"])["clusters"].mean().apply(np.floor).groupby(
        ["setting", "budget"]).agg(["mean", "std"]).reset_index()
    c_star.to_csv(out / "c_star.csv", index=False)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for setting, part in per_round.groupby("setting"):
        ax.plot(part["round"], part["clusters"], label=setting)
    ax.set_xlabel("round")
    ax.set_ylabel("C-hat (elbow clusters)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "clusters_per_round.png", dpi=120)
    plt.close(fig)


def rounds_to_target(runs: pd.DataFrame, out: Path) -> None:
    mean = runs.groupby(["setting", "arm", "round"], as_index=False)["accuracy"].mean()
    last = int(mean["round"].max())
    rows = []
    for setting, part in mean.groupby("setting"):
        target = 0.9 * part[part["round"] == last]["accuracy"].max()
        start = part[part["round"] == 0]["accuracy"].max()
        for arm, arm_part in part.groupby("arm"):
            reached = arm_part[(arm_part["accuracy"] >= target) & (arm_part["round"] > 0)]["round"]
            # a target the untrained model already meets (no arm learned) says nothing: left empty
            rows.append({"setting": setting, "arm": arm, "target-accuracy": target,
                         "target-above-start": bool(target > start),
                         "rounds-to-target": int(reached.min()) if len(reached) and target > start else np.nan})
    table = pd.DataFrame(rows)
    sckm = table[table["arm"].str.startswith("sckm")].set_index("setting")["rounds-to-target"]
    table["sckm-saving-%"] = [100.0 * (1 - sckm.get(s, np.nan) / r) if r and not np.isnan(r) else np.nan
                              for s, r in zip(table["setting"], table["rounds-to-target"])]
    table.to_csv(out / "rounds_to_target.csv", index=False)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also checked by the one-command reproduction's tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="results/sckm/<study>-<data>-<profile>")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/figures/sckm-<base name>")
    parser.add_argument("--add-runs", type=Path, nargs="*", default=[],
                        help="earlier runs.csv files to include (runs whose folders are gone)")
    parser.add_argument("--variants", action="store_true",
                        help="the variant study: table.csv/.md is one row per variant and setting (last-5 mean +- "
                             "std over seeds); the Table 5 layout goes to table5.csv/.md")
    return parser


def run_selection_facts(trained: dict[int, list[int]], client_classes: list[set[int]],
                        candidate_losses: dict[int, dict[int, float]] | None = None,
                        chosen: dict[int, list[int]] | None = None) -> dict[str, float]:
    """What one run chose, from the partitions trained per round.

    Parameters
    ----------
    trained : {round: partition ids trained that round}
    client_classes : the label set of each partition
    candidate_losses : {round: {node id: loss at the global model}}, optional (query-phase selectors)
    chosen : {round: node ids selected among those candidates}, optional

    Returns
    -------
    dict
        ``classes-covered`` (mean over rounds of the size of the union of the trained clients' classes),
        ``reused-rounds`` (rounds sharing a client with the round before), ``distinct-clients``, and
        ``loss-rank`` (mean rank of the chosen by loss, 1 = highest; NaN without losses).
    """
    rounds = sorted(trained)
    covered = [len(set().union(*(client_classes[k] for k in trained[r]))) for r in rounds]
    reused = sum(bool(set(trained[r]) & set(trained[p])) for p, r in itertools.pairwise(rounds))
    ranks = []
    for r, losses in (candidate_losses or {}).items():
        order = sorted(losses, key=lambda node: -losses[node])
        ranks += [order.index(node) + 1 for node in (chosen or {}).get(r, []) if node in losses]
    return {"classes-covered": float(np.mean(covered)), "reused-rounds": reused,
            "distinct-clients": len(set().union(*(set(trained[r]) for r in rounds))),
            "loss-rank": float(np.mean(ranks)) if ranks else np.nan}


@functools.lru_cache(maxsize=8)
def _client_classes(vision: VisionDataParams, num_clients: int) -> list[set[int]]:
    """Each client's label set under the run's own seeded partition (what its ClientApp trains on)."""
    labels = load_images(vision).y_train
    return [set(np.unique(labels[rows]).tolist()) for rows in partition(labels, num_clients, vision)]


def selection_facts(base: Path, out: Path, extra: list[Path] | None = None) -> pd.DataFrame | None:
    """``selection_facts.csv`` (per run) and ``.md`` (per setting and arm) from the run folders in ``base``, plus
    the rows of the earlier ``selection_facts.csv`` files ``extra`` for runs whose folders are gone."""
    rows = []
    for run in find_runs(base, "*/*/seed-*"):  # finished runs only, as in the accuracy table
        match = SETTING.fullmatch(run.path.parent.parent.name)
        if match is None or not run.has("train_clients") or not (run.path / "config.json").exists():
            continue
        classes = _client_classes(run.app_config().vision_data, int(match["clients"]))
        train = run.table("train_clients")
        trained = {int(r): part["partition-id"].astype(int).tolist() for r, part in train.groupby("round")}
        aggregated = {int(r["round"]): r["update-nodes"] for r in run.rounds("train") if "update-nodes" in r}
        if aggregated:  # sketch-source local-update: every candidate trains; the selection is whose update counts
            partitions = {(int(r), int(n)): int(p) for r, n, p in zip(train["round"], train["node_id"],
                                                                      train["partition-id"])}
            trained = {r: [partitions[(r, int(n))] for n in nodes] for r, nodes in aggregated.items()}
        losses = chosen = None
        if run.has("selection"):
            sel = run.table("selection").dropna(subset=["loss"])
            losses = {int(r): dict(zip(part["node_id"], part["loss"])) for r, part in sel.groupby("round")}
            chosen = {int(r): part.loc[part["selected"], "node_id"].tolist() for r, part in sel.groupby("round")}
        rows.append({"setting": run.path.parent.parent.name, "arm": run.path.parent.name,
                     "seed": int(run.path.name.removeprefix("seed-")),
                     **run_selection_facts(trained, classes, losses, chosen)})
    earlier = [pd.read_csv(path) for path in extra or [] if path.exists()]
    if not rows and not earlier:
        return None
    facts = add_runs(pd.DataFrame(rows) if rows else None, earlier)
    facts.to_csv(out / "selection_facts.csv", index=False)
    header = ("| setting | arm | classes covered a round (mean over seeds) | loss rank of the chosen (1 = highest) "
              "| rounds re-using a client | distinct clients |")
    lines = [header, "|---|---|--:|--:|--:|--:|"]
    span = lambda col: f"{col.min():.3g}-{col.max():.3g}" if col.notna().any() else "-"
    for (setting, arm), part in facts.groupby(["setting", "arm"]):
        lines.append(f"| {setting} | {arm} | {part['classes-covered'].mean():.2f} | {span(part['loss-rank'])} | "
                     f"{span(part['reused-rounds'])} | {span(part['distinct-clients'])} |")
    (out / "selection_facts.md").write_text("\n".join(lines) + "\n")
    return facts


def coverage_correlation(runs: pd.DataFrame, facts: pd.DataFrame, out: Path) -> pd.DataFrame:
    """Whether a selector's accuracy follows how many classes its clients cover: per setting, the Spearman
    correlation across arms between the classes covered a round and the accuracy (%) of the last
    :data:`LONG_TAIL_ROUNDS` rounds (each the mean over the arm's seeds), with and without FedCor (the best
    arm, which could make the correlation alone); ``coverage_vs_accuracy.csv``."""
    from scipy import stats

    last = int(runs["round"].max())
    tail = (runs[runs["round"] > last - LONG_TAIL_ROUNDS].groupby(["setting", "arm", "seed"])["accuracy"].mean()
            .groupby(["setting", "arm"]).mean())
    coverage = facts.groupby(["setting", "arm"])["classes-covered"].mean()
    both = pd.DataFrame({"accuracy": tail, "coverage": coverage}).dropna().reset_index()
    rows = []
    for setting, part in both.groupby("setting"):
        row = {"setting": setting, "arms": len(part)}
        for suffix, arms in (("", part), ("_without_fedcor", part[~part["arm"].str.startswith("fedcor")])):
            rho, p_value = stats.spearmanr(arms["coverage"], arms["accuracy"]) if len(arms) > 2 else (np.nan,) * 2
            row[f"spearman{suffix}"], row[f"p{suffix}"] = float(rho), float(p_value)
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(out / "coverage_vs_accuracy.csv", index=False)
    return table


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    out = args.out or Path("docs/figures") / f"sckm-{args.base.name}"
    out.mkdir(parents=True, exist_ok=True)
    runs = add_runs(load_runs(args.base), [pd.read_csv(path) for path in args.add_runs])
    runs.to_csv(out / "runs.csv", index=False)
    accuracy_figure(runs, out)
    if args.variants:
        tables(runs, out, name="table5")
        variant_table(runs, out)
        versus_random(runs, out)
        smoothed_figure(runs, out)
    else:
        tables(runs, out)
    clusters_figure(runs, out)
    rounds_to_target(runs, out)
    # read before selection_facts rewrites out/selection_facts.csv (which may be one of them)
    facts = selection_facts(args.base, out, [path.parent / "selection_facts.csv" for path in args.add_runs])
    if args.variants and facts is not None:
        coverage_correlation(runs, facts, out)
    print((out / "table.md").read_text())
    print(f"figures and CSVs in {out}")


if __name__ == "__main__":
    main()
