"""Which form of coalition memory finds the known groups, and how fast: an offline probe on real updates.

    python scripts/memory_probe.py --data digits-rotate --seeds 0 1 2 3 4 --rounds 10
    python scripts/memory_probe.py --data digits-permute --seeds 0 1 2 3 4 --out results/groups/memory-probe

Runs FedAvg in-process (as ``scripts/group_cosines.py``: the app's tasks, data and seeds, every client
training every round), keeps each round's cosine matrix of the updates ``w_i - theta``, and scores, per round,
the adjusted Rand index against the true groups of the coalitions each rule forms from what it has seen so
far: HK and average linkage on that round's cosines alone (no memory; HK is the paper) and both on the pair evidence
(:class:`bouquet.algorithms.memory.PairEvidence`) for each decay and tau (a fixed grid, and Otsu's threshold
of the evidence values) and memory of HK's own coalitions (``together``: the share of informative rounds a
pair spent in one coalition, average linkage at the majority, as ``coalition-memory-evidence = "together"``).
Only the groups' ground truth is used, never a test error.  The updates come from
FedAvg, not from clients training their coalition's model, so this probes the first rounds (before the
coalition models pull the groups further apart) and is a lower bound later on.  Writes ``<out>/<data>.csv``
(one row per seed, round and rule) and prints the mean ARI per round, and per round the median cosine within
and between the true groups; each seed's cosines of the whole update and the Gram matrices of each parameter
tensor's updates are kept in ``<out>/<data>-seed<S>-rounds<R>.npz``, so scoring again skips the training.
``--arrays features.`` scores the cosines of the updates of the named tensors only (as ``hk-opinion-arrays``);
``--layer-mean`` the mean over parameter tensors of each tensor's update cosines (every layer one vote,
however many weights it has).

    python scripts/memory_probe.py --data digits-rotate --arrays features.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import adjusted_rand_score

from bouquet.algorithms.hk import HKParams, gram_cosines, hk_coalitions
from bouquet.algorithms.memory import (
    MAJORITY,
    PairEvidence,
    average_linkage,
    evidence_opinions,
    otsu_threshold,
    together_evidence,
)
from bouquet.analysis.probes import clients, cosine_matrix, flat, split_pairs
from bouquet.config import AppConfig
from bouquet.experiments import layered_run_config
from bouquet.strategies.params import CoalitionParams

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments" / "groups"
TAUS = (0.2, 0.3, 0.5)
LINKAGE_TAUS = (0.1, 0.15, 0.2)
DECAYS = (1.0, 0.7)


def hk_labels(opinions: np.ndarray, tau: float) -> np.ndarray:
    return hk_coalitions(opinions, HKParams(geometry="cosine", tau=tau)).labels


def linkage_labels(similarity: np.ndarray, tau: float) -> np.ndarray:
    return average_linkage(similarity, tau)


def centered(cosines: np.ndarray) -> np.ndarray:
    """The cosines of the unit updates less the round's mean unit update (the direction every client shares)."""
    n = len(cosines)
    center = np.eye(n) - 1.0 / n
    return np.clip(gram_cosines(center @ cosines @ center), -1.0, 1.0)


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.triu_indices(len(matrix), 1)]


def rounds_of_cosines(data: str, seed: int, rounds: int,
                      count: int | None) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, list[str]]:
    """Per round, the update cosine matrix of FedAvg's clients and the Gram matrix of the updates of each
    parameter tensor (L x S x S, dot products, so any set of tensors can be scored); the true groups; the
    tensors' names."""
    layers = layered_run_config(EXPERIMENTS, [("data", data), ("profiles", "quick")], ROOT)
    count = count or int(layers.pop("num-supernodes", 20))
    layers.pop("num-supernodes", None)
    config = AppConfig.from_run_config({**layers, "seed": seed})
    tasks, model = clients(config, count)
    groups = np.array([task.group for task in tasks])
    out, by_layer = [], []
    for round_ in range(1, rounds + 1):
        theta = flat(model)
        trained, sizes = [], []
        for index, task in enumerate(tasks):
            local = task.new_model()
            local.load_state_dict(model.state_dict())
            task.train(local, np.random.default_rng([seed, round_, index]), 0.0)
            trained.append(local)
            sizes.append(task.num_examples)
        weights = np.array([flat(m) for m in trained])
        out.append(cosine_matrix(weights - theta))
        initial = [p.detach().double().flatten().numpy() for p in model.parameters()]
        tensors = [[p.detach().double().flatten().numpy() for p in m.parameters()] for m in trained]
        updates = [np.array([own[layer] for own in tensors]) - start for layer, start in enumerate(initial)]
        by_layer.append(np.array([update @ update.T for update in updates]))
        shares = np.array(sizes, dtype=np.float64) / sum(sizes)
        state = {name: sum(share * m.state_dict()[name].double() for share, m in zip(shares, trained, strict=True))
                 for name in model.state_dict()}
        model.load_state_dict({name: value.to(model.state_dict()[name].dtype) for name, value in state.items()})
    return out, by_layer, groups, [name for name, _ in model.named_parameters()]


def chosen_tensors(names: list[str], prefixes: tuple[str, ...]) -> np.ndarray:
    """The indices of the tensors whose names start with one of ``prefixes`` (as ``hk-opinion-arrays``)."""
    chosen = np.array([index for index, name in enumerate(names) if name.startswith(prefixes)], dtype=int)
    if not len(chosen):
        raise SystemExit(f"--arrays: no tensor starts with {', '.join(prefixes)}; the tensors are {', '.join(names)}")
    return chosen


def separation(cosines: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """Median cosine of the pairs within a true group and of the pairs across groups."""
    within, between = split_pairs(cosines, groups)
    return float(np.median(within)), float(np.median(between))


def score(cosines_by_round: list[np.ndarray], groups: np.ndarray) -> list[dict]:
    rows = []
    nodes = list(range(len(groups)))
    evidence = {decay: PairEvidence() for decay in DECAYS}
    together = {tau: PairEvidence() for tau in TAUS}
    for round_, cosines in enumerate(cosines_by_round, start=1):
        opinions = evidence_opinions(cosines)
        within, between = separation(cosines, groups)
        rows.append({"round": round_, "rule": "median cosine within groups", "ari": within})
        rows.append({"round": round_, "rule": "median cosine between groups", "ari": between})
        for tau in TAUS:
            values, observed = together_evidence(hk_labels(opinions, tau))
            together[tau] = together[tau].update(nodes, values, 1.0, observed=observed)
            labels = linkage_labels(together[tau].mean(), MAJORITY)
            rows.append({"round": round_, "rule": f"memory together, HK tau {tau}",
                         "ari": adjusted_rand_score(groups, labels), "K": int(labels.max()) + 1, "tau": tau})
        for tau in TAUS:
            labels = hk_labels(opinions, tau)
            rows.append({"round": round_, "rule": f"no memory, tau {tau}", "ari": adjusted_rand_score(groups, labels),
                         "K": int(labels.max()) + 1, "tau": tau})
        for tau in (*LINKAGE_TAUS, "otsu"):
            value = otsu_threshold(off_diagonal(cosines)) if tau == "otsu" else tau
            labels = linkage_labels(cosines, value)
            rows.append({"round": round_, "rule": f"no memory, linkage, tau {tau}",
                         "ari": adjusted_rand_score(groups, labels), "K": int(labels.max()) + 1, "tau": value})
        for decay in DECAYS:
            evidence[decay] = evidence[decay].update(nodes, cosines, decay)
            mean = evidence[decay].mean()
            remembered = evidence_opinions(mean)
            for tau in (*TAUS, "otsu"):
                value = otsu_threshold(off_diagonal(mean)) if tau == "otsu" else tau
                labels = hk_labels(remembered, value)
                rows.append({"round": round_, "rule": f"memory decay {decay}, HK, tau {tau}",
                             "ari": adjusted_rand_score(groups, labels), "K": int(labels.max()) + 1, "tau": value})
            for tau in (*LINKAGE_TAUS, "otsu"):
                value = otsu_threshold(off_diagonal(mean)) if tau == "otsu" else tau
                labels = linkage_labels(mean, value)
                rows.append({"round": round_, "rule": f"memory decay {decay}, linkage, tau {tau}",
                             "ari": adjusted_rand_score(groups, labels), "K": int(labels.max()) + 1, "tau": value})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="digits-rotate", help="experiments/groups/data/<name>.toml")
    parser.add_argument("--clients", type=int, default=None, help="default: the benchmark's num-supernodes")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=Path("results/groups/memory-probe"))
    parser.add_argument("--centered", action="store_true",
                        help="score the cosines of the updates less the round's mean (unit) update")
    parser.add_argument("--layer-mean", action="store_true",
                        help="score the mean over parameter tensors of each tensor's update cosines")
    parser.add_argument("--arrays", default="",
                        help="score the cosines of the updates of these tensors only (comma-separated name "
                             "prefixes, as hk-opinion-arrays: 'features.' is the feature extractor)")
    args = parser.parse_args(argv)
    if args.arrays and args.layer_mean:
        parser.error("--arrays and --layer-mean: choose one")
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        cache = args.out / f"{args.data}-seed{seed}-rounds{args.rounds}.npz"  # the training is the slow part
        stored = np.load(cache) if cache.exists() else None
        if stored is not None and "grams" in stored:
            cosines_by_round, by_layer = list(stored["cosines"]), list(stored["grams"])
            groups, names = stored["groups"], [str(name) for name in stored["names"]]
        else:  # no cache, or one written before the per-tensor Gram matrices were kept
            cosines_by_round, by_layer, groups, names = rounds_of_cosines(args.data, seed, args.rounds, args.clients)
            args.out.mkdir(parents=True, exist_ok=True)
            np.savez(cache, cosines=np.array(cosines_by_round), grams=np.array(by_layer), groups=groups,
                     names=np.array(names))
        if args.arrays:
            chosen = chosen_tensors(names, CoalitionParams(opinion_arrays=args.arrays).opinion_prefixes)
            cosines_by_round = [gram_cosines(grams[chosen].sum(axis=0)) for grams in by_layer]
        if args.layer_mean:
            cosines_by_round = [np.mean([gram_cosines(gram) for gram in grams], axis=0) for grams in by_layer]
        if args.centered:
            cosines_by_round = [centered(cosines) for cosines in cosines_by_round]
        rows += [{"seed": seed, **row} for row in score(cosines_by_round, groups)]
        print(f"seed {seed}: done", flush=True)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ((f"-arrays-{args.arrays.replace(',', '+')}".rstrip(".") if args.arrays else "")
              + ("-layer-mean" if args.layer_mean else "") + ("-centered" if args.centered else ""))
    frame.to_csv(args.out / f"{args.data}{suffix}.csv", index=False)
    table = frame.pivot_table(index="rule", columns="round", values="ari", aggfunc="mean").round(2)
    worst = frame.pivot_table(index="rule", columns="round", values="ari", aggfunc="min").round(2)
    print("mean ARI over seeds, per round\n" + table.to_string())
    print("\nlowest ARI over seeds, per round\n" + worst.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
