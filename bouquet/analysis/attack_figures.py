"""Table and figures of the attack study from its runs (PNG + the CSV behind each).

    python scripts/attack_figures.py results/attacks/digits-quick [--out docs/figures/attacks-digits-quick]

Reads ``<arm>/<attack>-<fraction>/seed-<k>/`` (``scripts/run_attack_experiments.py``).  The error of a run is
the honest clients' mean error with the final model (100 - accuracy in % on images, MAE in L/day on water;
every client when nobody attacks).  Writes:

* ``table.md`` / ``table.csv``: per arm and condition, the error (mean over seeds), its std over seeds, the
  change against the same arm without attackers (%), the change against the oracle (``fedavg-oracle``: FedAvg
  over the honest replies only, same condition and seeds) when the study ran it, the attackers' share of the
  shared model (``attacker-share`` of each round: :func:`bouquet.algorithms.attacks.attacker_share`, mean over
  rounds and seeds, in %), and for Krum, MultiKrum and Bulyan the share of the models they kept that came
  from attackers;
* on water, the naive forecasters (``naive: <forecaster>``: every client of the first run, the same test
  windows; :func:`bouquet.report.naive_client_errors`) as rows of the table;
* ``error_vs_fraction``: per attack, the error against the attacker fraction, one line per arm;
* ``change_vs_fraction``: the same as the change against each arm's own no-attack error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bouquet.analysis import figures_folder
from bouquet.report import naive_client_errors
from bouquet.results import find_runs, markdown_table

#: The arm that drops the attackers' replies (``attack-oracle``): the floor a perfect defence reaches.
ORACLE = "fedavg-oracle"


def run_error(summary: dict) -> float:
    """The honest clients' mean error of one run."""
    if summary.get("task") == "vision":
        return 100 * (1 - summary.get("accuracy-honest-mean", summary["client-accuracy-mean"]))
    return summary.get("mae-litres-honest-mean", summary["mae-litres-mean"])


def kept_attackers(rounds: list[dict]) -> float | None:
    """Share of the models a Krum-type rule kept that came from attackers (mean over rounds), or None."""
    shares = [len(set(r["robust-selected"]) & set(r.get("attacker-nodes", []))) / len(r["robust-selected"])
              for r in rounds if r.get("phase") == "train" and r.get("robust-selected")]
    return float(np.mean(shares)) if shares else None


def attacker_share(rounds: list[dict]) -> float | None:
    """The attackers' share of the shared model, mean over the rounds that report one, or None."""
    shares = [r["attacker-share"] for r in rounds if r.get("phase") == "train" and r.get("attacker-share") is not None]
    return float(np.mean(shares)) if shares else None


def load(base: Path) -> pd.DataFrame:
    rows = []
    for run in find_runs(base, "*/*/seed-*"):
        arm, cond = run.path.parent.parent.name, run.path.parent.name
        attack, _, fraction = cond.rpartition("-")
        rows.append({"arm": arm, "attack": attack, "fraction": float(fraction), "seed": run.path.name,
                     "error": run_error(run.summary()), "kept-attackers": kept_attackers(run.rounds()),
                     "attacker-share": attacker_share(run.rounds())})
    if not rows:
        raise SystemExit(f"no finished runs (*/*/seed-*/summary.json) under {base}")
    return pd.DataFrame(rows)


def table(runs: pd.DataFrame) -> pd.DataFrame:
    grouped = runs.groupby(["arm", "attack", "fraction"])
    out = grouped.agg(seeds=("error", "size"), error=("error", "mean"), seed_std=("error", "std"),
                      share=("attacker-share", "mean"), kept_attackers=("kept-attackers", "mean")).reset_index()
    clean = out[out["fraction"] == 0].set_index("arm")["error"]
    out["change (%)"] = [100 * (e / clean[a] - 1) if a in clean else np.nan for a, e in zip(out["arm"], out["error"])]
    oracle = out[out["arm"] == ORACLE].set_index(["attack", "fraction"])["error"]
    if len(oracle):
        out["vs oracle (%)"] = [100 * (e / oracle[(k, f)] - 1) if (k, f) in oracle.index else np.nan
                                for k, f, e in zip(out["attack"], out["fraction"], out["error"])]
    out["share"] = 100 * out["share"]
    out["kept_attackers"] = 100 * out["kept_attackers"]
    return out.rename(columns={"seed_std": "std across seeds", "share": "attackers' share (%)",
                               "kept_attackers": "attackers among kept (%)"})


def lines(runs: pd.DataFrame, summary: pd.DataFrame, column: str, ylabel: str, out: Path, name: str) -> None:
    attacks = sorted(a for a in summary["attack"].unique() if a != "none")
    fig, axes = plt.subplots(1, max(1, len(attacks)), figsize=(4.2 * max(1, len(attacks)), 4), squeeze=False,
                             sharey=True)
    rows = []
    for ax, attack in zip(axes[0], attacks):
        for arm, frame in summary.groupby("arm"):
            picked = frame[(frame["attack"] == attack) | (frame["fraction"] == 0)].sort_values("fraction")
            ax.plot(picked["fraction"] * 100, picked[column], marker="o", label=arm)
            rows += [{"attack": attack, "arm": arm, "fraction": f, column: v}
                     for f, v in zip(picked["fraction"], picked[column])]
        ax.set_title(attack)
        ax.set_xlabel("attackers (% of clients)")
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=120)
    plt.close(fig)
    pd.DataFrame(rows).to_csv(out / f"{name}.csv", index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="results/attacks/<data>-<profile>")
    parser.add_argument("--out", default=None, help="default: <base>/figures")
    args = parser.parse_args(argv)
    base = Path(args.base)
    out = figures_folder(base, args.out)
    runs = load(base)
    summary = table(runs)
    first = find_runs(base, "*/*/seed-*")[0]
    naive = pd.DataFrame(naive_client_errors(first))  # water: the naive forecasters beside every arm
    printed = summary
    if len(naive):
        rows = naive.groupby("forecaster")["mae"].mean()
        printed = pd.concat([summary, pd.DataFrame({"arm": [f"naive: {n}" for n in rows.index], "attack": "none",
                                                    "fraction": 0.0, "seeds": 0, "error": rows.to_numpy()})],
                            ignore_index=True)
    printed.to_csv(out / "table.csv", index=False)
    (out / "table.md").write_text(markdown_table(printed))
    vision = runs["error"].max() <= 100 and "digits" in base.name
    unit = "error (%)" if vision else "MAE (L/day)"
    lines(runs, summary, "error", f"honest clients' {unit}", out, "error_vs_fraction")
    lines(runs, summary, "change (%)", "change vs no attack (%)", out, "change_vs_fraction")
    lines(runs, summary, "attackers' share (%)", "attackers' share of the shared model (%)", out, "share_vs_fraction")
    print(markdown_table(printed))
    print(f"\nfigures and tables in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
