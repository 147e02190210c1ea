"""The confirmatory groups study's arithmetic: a run's error curve and ARI, the choice on validation, the table.

A study is written down before its confirmatory runs (``experiments/groups/studies/<name>.toml``,
:class:`StudyDesign`): the benchmarks, the candidates the memory form is chosen from, the references, the
tuning and confirmatory data seeds, the rounds whose ARI is reported and the comparisons.  The choice reads the
validation images only (:func:`validation_frame`, then :func:`bouquet.tuning.choose_on_validation`): per
candidate, the clients' mean validation error over every round (the area under the error curve divided by the
rounds), averaged over the benchmarks and tuning seeds, so one form is chosen for every benchmark.  The
confirmatory table (:func:`study_table`) reports, per benchmark and arm, the final error and the mean error
over the rounds, ARI at the design's rounds (the mean and the lowest seed), and every comparison the design
names as a paired 95 % t interval over the data seeds.  Pure pandas / numpy.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.results import RunFolder
from bouquet.tuning import paired_interval

__all__ = ["CHOSEN", "StudyDesign", "run_curve", "study_table", "validation_frame"]

#: The name the design's comparisons give the form validation chose.
CHOSEN = "chosen"


@dataclass(frozen=True)
class StudyDesign:
    """What a confirmatory groups study runs and reports, fixed before its confirmatory runs.

    Parameters
    ----------
    profile : str
        The profile layer (``experiments/groups/profiles``).
    benchmarks : sequence of str
        Data layers (``experiments/groups/data``).
    candidates : sequence of str
        Arm layers the memory form is chosen from, on validation.
    references : sequence of str
        Arm layers run beside the chosen form (FedAvg, IFCA told K).
    tune_seeds, seeds : sequence of int
        Data seeds of the tuning runs (test locked) and of the confirmatory runs; disjoint.
    ari_rounds : sequence of int
        Rounds whose ARI the table reports (with the last round).
    comparisons : sequence of (str, str)
        Pairs of arms (``"chosen"`` for the chosen form) whose paired differences are reported.
    """

    profile: str
    benchmarks: tuple[str, ...]
    candidates: tuple[str, ...]
    references: tuple[str, ...]
    tune_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    ari_rounds: tuple[int, ...]
    comparisons: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for name in ("benchmarks", "candidates", "tune_seeds", "seeds"):
            if not getattr(self, name):
                raise ValueError(f"the study design needs at least one of {name.replace('_', '-')}")
        if set(self.tune_seeds) & set(self.seeds):
            raise ValueError(f"tune-seeds and seeds must be disjoint (the choice must not see the confirmatory data), "
                             f"both hold {sorted(set(self.tune_seeds) & set(self.seeds))}")
        arms = {CHOSEN, *self.references}
        for a, b in self.comparisons:
            if a not in arms or b not in arms:
                raise ValueError(f"comparison {a!r} vs {b!r}: each side must be 'chosen' or a reference "
                                 f"({sorted(self.references)})")

    @classmethod
    def load(cls, path: str | Path) -> StudyDesign:
        """Read a design TOML; an unknown or missing key is an error naming it."""
        raw = tomllib.loads(Path(path).read_text())
        fields = {"profile", "benchmarks", "candidates", "references", "tune-seeds", "seeds", "ari-rounds",
                  "comparisons"}
        unknown = sorted(set(raw) - fields - {"description"})
        missing = sorted(fields - set(raw))
        if unknown or missing:
            raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}")
        return cls(str(raw["profile"]), tuple(raw["benchmarks"]), tuple(raw["candidates"]), tuple(raw["references"]),
                   tuple(int(s) for s in raw["tune-seeds"]), tuple(int(s) for s in raw["seeds"]),
                   tuple(int(r) for r in raw["ari-rounds"]), tuple((str(a), str(b)) for a, b in raw["comparisons"]))


def run_curve(run: RunFolder, metric: str) -> pd.DataFrame:
    """Per round of a finished run: the clients' mean error (%) with the model each is served on ``metric``
    (``accuracy``: the test images, ``val-accuracy``: validation), the round's ARI against the true groups
    (training participants; NaN for arms without coalitions) and its number of coalitions or clusters."""
    clients = run.table("evaluate_clients")
    if metric not in clients:
        raise ValueError(f"{run.path}: no {metric!r} in evaluate_clients.csv (columns {list(clients.columns)})")
    error = (100.0 * (1.0 - clients[metric])).groupby(clients["round"]).mean()
    train = {r["round"]: r for r in run.rounds("train")}
    return pd.DataFrame({"round": error.index.astype(int), "error": error.to_numpy(),
                         "ari": [train.get(r, {}).get("ari", np.nan) for r in error.index],
                         "k": [train.get(r, {}).get("coalitions", np.nan) for r in error.index]})


def validation_frame(curves: Mapping[tuple[str, str, int], pd.DataFrame]) -> pd.DataFrame:
    """The tuning runs as :func:`bouquet.tuning.choose_on_validation` reads them: one row per (candidate,
    benchmark and seed) with ``val-error``, the mean validation error over the rounds; every candidate is
    one arm (``memory``), so one form is chosen for every benchmark."""
    rows = [{"arm": "memory", "candidate": candidate, "seed": f"{benchmark}:{seed}",
             "val-error": float(curve["error"].mean())}
            for (benchmark, candidate, seed), curve in curves.items()]
    return pd.DataFrame(rows)


def study_table(curves: Mapping[tuple[str, str, int], pd.DataFrame], design: StudyDesign, chosen: str
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The confirmatory tables from the test curves of every (benchmark, arm, seed).

    Returns
    -------
    (table, comparisons)
        ``table``: per benchmark and arm, the seeds, the final error and the mean error over the rounds
        (mean over seeds), its change against FedAvg (``fedavg`` among the arms), and for each ARI round the
        mean and lowest seed's ARI, and K at the last round.  ``comparisons``: per benchmark and design
        comparison, the paired differences of the final and of the mean error (points), with their 95 %
        intervals, and whether each interval excludes 0.
    """
    name = {chosen: CHOSEN}
    per_run = []
    for (benchmark, arm, seed), curve in curves.items():
        last = curve.iloc[-1]
        row = {"benchmark": benchmark, "arm": name.get(arm, arm), "seed": seed, "final": float(last["error"]),
               "mean": float(curve["error"].mean()), "k-last": float(last["k"])}
        for r in (*design.ari_rounds, int(last["round"])):
            at = curve.loc[curve["round"] == r, "ari"]
            row[f"ari-r{r}"] = float(at.iloc[0]) if len(at) else np.nan
        per_run.append(row)
    runs = pd.DataFrame(per_run)
    table_rows = []
    ari_columns = [c for c in runs.columns if c.startswith("ari-r")]
    for (benchmark, arm), group in runs.groupby(["benchmark", "arm"], sort=False):
        row: dict[str, Any] = {"benchmark": benchmark, "arm": arm if arm != CHOSEN else f"{CHOSEN}: {chosen}",
                               "seeds": len(group), "final error (%)": group["final"].mean(),
                               "mean error (%)": group["mean"].mean()}
        base = runs[(runs["benchmark"] == benchmark) & (runs["arm"] == "fedavg")]
        if len(base):
            row["final vs FedAvg"] = f"{100 * (group['final'].mean() / base['final'].mean() - 1):+.1f} %"
        for column in ari_columns:
            values = group[column].dropna()
            row[column.replace("ari-r", "ARI r")] = (f"{values.mean():.2f} ({values.min():.2f})" if len(values)
                                                     else "-")
        row["K last"] = group["k-last"].mean()
        table_rows.append(row)
    comparisons = []
    for benchmark in dict.fromkeys(runs["benchmark"]):
        here = runs[runs["benchmark"] == benchmark]
        for a, b in design.comparisons:
            left = here[here["arm"] == a].set_index("seed")
            right = here[here["arm"] == b].set_index("seed")
            seeds = sorted(set(left.index) & set(right.index))
            if not seeds:
                continue
            row = {"benchmark": benchmark, "comparison": f"{a} - {b}", "seeds": len(seeds)}
            for what in ("final", "mean"):
                interval = paired_interval(left.loc[seeds, what].to_numpy(), right.loc[seeds, what].to_numpy())
                row[f"{what} error difference (points)"] = interval.text()
                row[f"{what}: excludes 0"] = bool(interval.excludes_zero)
            comparisons.append(row)
    return pd.DataFrame(table_rows), pd.DataFrame(comparisons)

