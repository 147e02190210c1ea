"""Tables of the SCKM paper's pair-wise feature probe (Section 4, Tables 3-4): per client what SCKM-Select
ranks by (eta, eq. 9) beside its facts, where the pairs it would choose rank, and the one-feature probes' rank
(eq. 6) and Rel.A (eq. 7).  The training that gives the pairs and sketches is ``scripts/sckm_probe.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bouquet.algorithms.probe import FEATURES, probe_losses, rank_and_relative_accuracy
from bouquet.algorithms.selection import Candidates, SCKMSelectSelector

__all__ = ["CLIENT_FACTS", "chosen_pair_percentiles", "client_rows", "client_table", "tables"]


def client_rows(sketches: np.ndarray, layer_sizes: list[int], losses: list[float], classes: list[int],
                pairs: list[tuple[int, int]], scores: list[float]) -> list[dict]:
    """Per client: SCKM-Select's eta (eq. 9 on its layer-weighted sketches), the norm of that weighted sketch,
    its loss and classes, and its partner accuracy (mean score of the pairs it is in)."""
    weighted, eta = SCKMSelectSelector().scores(
        Candidates(ids=list(range(len(sketches))), sketches=sketches, layer_sizes=list(layer_sizes)))
    partner = np.zeros(len(sketches))
    count = np.zeros(len(sketches))
    for (i, j), score in zip(pairs, scores):
        partner[[i, j]] += score
        count[[i, j]] += 1
    return [{"client": k, "eta": float(eta[k]), "sketch-norm": float(np.linalg.norm(weighted[k])),
             "loss": float(losses[k]), "classes": int(classes[k]), "partner-accuracy": float(partner[k] / count[k])}
            for k in range(len(sketches))]


CLIENT_FACTS = ("sketch-norm", "loss", "classes", "partner-accuracy")


def client_table(clients: pd.DataFrame, pairs: pd.DataFrame, out: Path) -> None:
    """Spearman(eta, fact) per (shards, round, seed); mean +- std over seeds to ``probe_clients.md``."""
    clients.to_csv(out / "probe_clients.csv", index=False)
    rows = []
    for (shards, t, seed), part in clients.groupby(["shards", "round", "seed"]):
        rows.append({"shards": shards, "round": t, "seed": seed,
                     **{fact: part["eta"].corr(part[fact], method="spearman") for fact in CLIENT_FACTS}})
    table = pd.DataFrame(rows).groupby(["shards", "round"])[list(CLIENT_FACTS)].agg(["mean", "std"])
    lines = ["| shards | round | " + " | ".join(f"Spearman(eta, {f})" for f in CLIENT_FACTS) + " |",
             "|--:|--:|" + "--:|" * len(CLIENT_FACTS)]
    for (shards, t), r in table.iterrows():
        lines.append(f"| {shards} | {t} | " + " | ".join(
            f"{r[(f, 'mean')]:+.2f} +- {r[(f, 'std')]:.2f}" for f in CLIENT_FACTS) + " |")
    lines += ["", ("Percentile (0-100, among the slice's pairs by validation accuracy; random pair ~ 50) of the "
                   "pair SCKM-Select would choose at B = 2 (the two largest eta) and of the two highest-loss "
                   "clients, mean +- std over seeds:"), "", "| shards | round | top-2 eta pair | top-2 loss pair |", "|--:|--:|--:|--:|"]
    picks = chosen_pair_percentiles(pairs, clients)
    for (shards, t), part in picks.groupby(["shards", "round"]):
        lines.append(f"| {shards} | {t} | " + " | ".join(
            f"{part[c].mean():.0f} +- {part[c].std():.0f}" for c in ("eta-pair", "loss-pair")) + " |")
    picks.to_csv(out / "probe_chosen_pairs.csv", index=False)
    (out / "probe_clients.md").write_text("\n".join(lines) + "\n")


def chosen_pair_percentiles(pairs: pd.DataFrame, clients: pd.DataFrame) -> pd.DataFrame:
    """Per (shards, seed, round): the percentile of the top-2-eta pair and of the top-2-loss pair among the
    slice's pairs (share of pairs with a lower validation accuracy, in %)."""
    rows = []
    for (shards, seed, t), part in clients.groupby(["shards", "seed", "round"]):
        slice_pairs = pairs[(pairs["shards"] == shards) & (pairs["seed"] == seed) & (pairs["round"] == t)]
        accuracy = {(int(i), int(j)): a for i, j, a in
                    zip(slice_pairs["i"], slice_pairs["j"], slice_pairs["val-accuracy"])}
        row = {"shards": shards, "seed": seed, "round": t}
        for name, column in (("eta-pair", "eta"), ("loss-pair", "loss")):
            i, j = sorted(part.nlargest(2, column)["client"].astype(int))
            row[name] = 100.0 * float(np.mean([a < accuracy[(i, j)] for a in accuracy.values()]))
        rows.append(row)
    return pd.DataFrame(rows)


def tables(pairs: pd.DataFrame, out: Path) -> None:
    ranks, rels = [], []
    for axis in ("shards", "round"):
        for value, part in pairs.groupby(axis):
            losses = probe_losses({f: part[f].to_numpy() for f in FEATURES}, part["label"].to_numpy())
            rank, rel = rank_and_relative_accuracy(losses)
            ranks.append({"charac": axis, "type": value, **rank})
            rels.append({"charac": axis, "type": value, **rel})
    for name, rows in (("probe_rank", ranks), ("probe_rel_a", rels)):
        table = pd.DataFrame(rows)
        avg = table[list(FEATURES)].mean()
        std = table[list(FEATURES)].std(ddof=1)
        table = pd.concat([table, pd.DataFrame([{"charac": "all", "type": "avg", **avg},
                                                {"charac": "all", "type": "std", **std}])])
        table.to_csv(out / f"{name}.csv", index=False)
        lines = ["| charac | type | " + " | ".join(FEATURES) + " |", "|---|---|" + "--:|" * len(FEATURES)]
        for _, r in table.iterrows():
            lines.append(f"| {r['charac']} | {r['type']} | " + " | ".join(f"{r[f]:.3g}" for f in FEATURES) + " |")
        (out / f"{name}.md").write_text("\n".join(lines) + "\n")
