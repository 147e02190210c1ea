"""Why the direction screen misses label flips: each update's cosine with the round's median update, by round.

A diagnostic on the attack study's digits setting (20 IID clients, 10 batches of 32 per round, validation
fraction 0.2) on its *tuning* data seed (100; the confirmatory seeds 0-4 are not read, nor any test image).
Clients 0-3 (20 %) train on flipped labels (``y -> 9 - y``); the model moves on by the oracle's rule (the
honest clients' mean), so every round asks: had the screen seen these updates, where would it draw the line?
Prints, per round, the lowest and median cosine of the honest updates and the highest of the flipped ones
(:func:`bouquet.algorithms.robust.direction_screen`'s score).  Pure torch / numpy, no Flower; about a minute.

    python scripts/probe_label_flip_directions.py [--rounds 10] [--seed 100]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import torch

from bouquet.algorithms.robust import direction_screen
from bouquet.data.images import VisionDataParams
from bouquet.tasks.params import VisionModelParams, VisionTrainParams
from bouquet.tasks.vision import VisionTask


def label_flip_cosines(rounds: int = 10, seed: int = 100, clients: int = 20, attackers: int = 4) -> pd.DataFrame:
    """Per round, the honest updates' lowest and median cosine with the median update and the flipped ones'
    highest; clients ``0 .. attackers - 1`` flip their labels (the attack harness's ``label-flip``,
    :meth:`bouquet.tasks.vision.VisionTask.poisoned`) and every client trains as in a run
    (:meth:`~bouquet.tasks.vision.VisionTask.train`); the model moves by the honest clients' mean."""
    if not 0 < attackers < clients / 2:
        raise ValueError(f"attackers must be between 1 and fewer than half of {clients} clients, got {attackers}")
    torch.set_num_threads(1)
    data = VisionDataParams(dataset="digits", partitioner="iid", seed=seed, validation_fraction=0.2,
                            score_test=False)
    flipped = np.arange(clients) < attackers
    tasks = [VisionTask.for_node(data, VisionModelParams(), VisionTrainParams(local_batches=10), c, clients)
             for c in range(clients)]
    tasks = [task.poisoned("label-flip", 1.0) if flipped[c] else task for c, task in enumerate(tasks)]
    torch.manual_seed(seed)
    model = tasks[0].new_model()
    rows = []
    for rnd in range(1, rounds + 1):
        base = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().astype(np.float64)
        updates = []
        for client, task in enumerate(tasks):
            local = task.new_model()
            local.load_state_dict(model.state_dict())
            task.train(local, np.random.default_rng([seed, rnd, client]), proximal_mu=0.0)
            updates.append(torch.nn.utils.parameters_to_vector(local.parameters()).detach().numpy() - base)
        matrix = np.asarray(updates)
        _, cosines = direction_screen(matrix, -1.0)
        honest = cosines[~flipped]
        rows.append({"round": rnd, "honest-lowest": honest.min(), "honest-median": float(np.median(honest)),
                     "flipped-highest": cosines[flipped].max()})
        moved = (base + matrix[~flipped].mean(axis=0)).astype(np.float32)
        torch.nn.utils.vector_to_parameters(torch.from_numpy(moved), model.parameters())
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=100, help="data seed (the study's tuning seed by default)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--attackers", type=int, default=4)
    args = parser.parse_args(argv)
    frame = label_flip_cosines(args.rounds, args.seed, args.clients, args.attackers)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:+.2f}"))
    return 0
