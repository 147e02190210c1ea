"""Water studies under the honest protocol: tune on validation, then report the test numbers once.

    python scripts/run_forecaster_study.py --data daiad --tune-seeds 0 1 --seeds 0 1 2 3 4
    python scripts/run_forecaster_study.py --data synthetic --arms local,fedavg,fedper --seeds 0 1 2 3 4
    python scripts/run_forecaster_study.py --data daiad --pooled          # + the pooled reference (no Flower)
    python scripts/run_forecaster_study.py --study hk-paper --profile paper   # the HK paper's Table 4 arms

Layers (``experiments/<study>``, default ``forecaster``): ``data/<data>.toml`` < ``profiles/<profile>.toml``
(the protocol: validation split, rounds, E, ...) < ``arms/<arm>.toml`` (fixed keys and a ``[grid]`` of
candidates) < the seed (``seed`` and ``data-seed``: the synthetic pool is generated anew, the DAIAD pool
reordered).

1. **The baseline, on validation** (any forecaster but the paper's).  Which naive forecaster the model adds
   to (``forecast-baseline``): the household blend (``household``) or the window median, whichever naive
   forecast has the lower mean validation MAE over the tuning seeds' pools (computed here from the data, no
   training).
2. **Tuning.**  Every candidate of every arm runs on ``--tune-seeds`` (real ``flwr run``s, resumable:
   :func:`bouquet.experiments.run_jobs`); per arm the candidate with the lowest mean validation MAE is
   chosen (:func:`bouquet.tuning.choose_on_validation`); ``choices.csv`` / ``choices.md`` hold every
   candidate's validation numbers and no test number.
3. **The test numbers, once.**  Each arm's chosen candidate runs on every ``--seeds`` seed; ``table.csv`` /
   ``table.md`` give its test MAE (mean and sample std over seeds), skill against the best naive forecaster
   (chosen on validation, per seed), paired differences with 95 % t intervals against FedAvg's chosen
   candidate and against that naive forecaster, and the shares of households beating their own best naive
   forecast (chosen on their validation windows; and on the test days, the oracle); ``table.png`` draws it.

Results: ``<out>/<data>-<profile>/<arm>/<candidate>/seed-<k>/`` run folders and the tables beside them
(``--out`` default ``results/<study>``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.analysis.forecaster_study import REFERENCE_ARMS, plot_study, run_rows, study_table
from bouquet.experiments import (
    Job,
    arm_names,
    layered_run_config,
    load_layer,
    require_data_files,
    run_jobs,
    study_parser,
)
from bouquet.launch import pool_size, toml_value
from bouquet.results import markdown_table
from bouquet.tuning import Candidate, choose_on_validation, expand_grid

ROOT = Path(__file__).resolve().parents[1]


def candidates(experiments: Path, arm: str) -> list[Candidate]:
    layer = load_layer(experiments, "arms", arm)
    grid = layer.pop("grid", {})
    return expand_grid(arm, layer, grid)


def slug(name: str) -> str:
    """A folder name for a candidate (``fedavg[learning-rate=0.01]`` -> ``learning-rate=0.01``)."""
    inner = name[name.index("[") + 1:-1] if "[" in name else "default"
    return re.sub(r"[^A-Za-z0-9=.,_-]", "_", inner)


def base_config(experiments: Path, data: str, profile: str) -> dict[str, Any]:
    return layered_run_config(experiments, [("data", data), ("profiles", profile)], ROOT)


def seeded(config: dict[str, Any], seed: int) -> dict[str, Any]:
    return {**config, "seed": seed, "data-seed": seed}


def choose_baseline(base: dict[str, Any], seeds: list[int]) -> tuple[str, dict[str, float]]:
    """``household`` or ``window-median``: the naive forecast with the lower mean validation MAE over the
    households of each tuning seed's pool (no model is trained, no test window is read)."""
    from bouquet.config import AppConfig
    from bouquet.data.water import load_pool
    from bouquet.tasks.water import naive_errors

    scores: dict[str, list[float]] = {"window median": [], "median-weekday blend": []}
    for seed in seeds:
        config = AppConfig.from_run_config(seeded(base, seed)).water_data
        pool = load_pool(config)
        errors = [naive_errors(pool.client(i, config), "validation") for i in range(len(pool))]
        for name, values in scores.items():
            values.append(float(np.mean([e[name] for e in errors])))
    means = {name: float(np.mean(values)) for name, values in scores.items()}
    return ("household" if means["median-weekday blend"] < means["window median"] else "window-median"), means


def pooled_reference(base: dict[str, Any], baseline: str, seeds: list[int], epochs: list[int],
                     personalize: list[int], out: Path) -> pd.DataFrame:
    """The centralised reference: one model on every household's fit windows (Adam, the study's loss and
    learning rate), then each household's fine-tuning; epochs and fine-tuning chosen on validation.
    Rows per (epochs, fine-tuning, seed); resumable through ``pooled.csv``."""
    import torch

    from bouquet.config import AppConfig
    from bouquet.data.water import load_pool
    from bouquet.tasks.water import WaterTask, evaluate_windows

    path = out / "pooled.csv"
    done = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["epochs", "personalize", "seed"])
    rows = done.to_dict("records")
    torch.set_num_threads(1)
    for seed in seeds:
        config = AppConfig.from_run_config({**seeded(base, seed), "forecast-baseline": baseline,
                                            "learning-rate": 0.001, "local-epochs": 1})
        pool = load_pool(config.water_data)
        tasks = [WaterTask(i, "", pool.client(i, config.water_data), config.water_model, config.water_train,
                           personal=config.personal) for i in range(len(pool))]
        for budget in epochs:
            if all(((done["epochs"] == budget) & (done["personalize"] == p) & (done["seed"] == seed)).any()
                   for p in personalize):
                continue
            torch.manual_seed(seed)
            model = tasks[0].new_model()
            rng = np.random.default_rng([seed, 99])
            x = np.concatenate([t.windows.x_train for t in tasks])
            y = np.concatenate([t.windows.y_train for t in tasks])
            blends = np.concatenate([np.full(t.num_examples, t.blend) for t in tasks])
            _train_pooled(model, x, y, blends, config.water_train, budget, rng)
            for p in personalize:
                val, test = [], []
                for i, task in enumerate(tasks):
                    own = task.new_model()
                    own.load_state_dict(model.state_dict())
                    tuned = dataclasses.replace(task, personal=dataclasses.replace(task.personal, epochs=p))
                    tuned.fine_tune(own, np.random.default_rng([seed, i, 1]))
                    val.append(evaluate_windows(own, task.windows, "validation")["mae-litres"])
                    test.append(evaluate_windows(own, task.windows)["mae-litres"])
                rows.append({"epochs": budget, "personalize": p, "seed": seed, "val-mae": float(np.mean(val)),
                             "test-mae": float(np.mean(test))})
                pd.DataFrame(rows).to_csv(path, index=False)
                print(f"pooled seed {seed}, {budget} epochs, fine-tuning {p}: val {np.mean(val):.2f}", flush=True)
    return pd.DataFrame(rows)


def _train_pooled(model: Any, x: np.ndarray, y: np.ndarray, blends: np.ndarray, settings: Any, epochs: int,
                  rng: np.random.Generator) -> None:
    """Adam over the pooled windows, each batch's household blends set on the model per window."""
    import torch

    from bouquet.tasks.water import training_loss

    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    loss_fn = training_loss(settings)
    tx, ty, tb = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(blends.astype(np.float32))
    model.train()
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(y)))
        for start in range(0, len(y), settings.batch_size):
            batch = order[start:start + settings.batch_size]
            model.blend = tb[batch]  # a per-window blend: the pooled windows come from many households
            optimizer.zero_grad()
            loss_fn(model(tx[batch]), ty[batch]).backward()
            optimizer.step()
    model.blend = 0.0


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__, ROOT / "experiments" / "<study>", data="daiad", profile="study", out=None)
    parser.add_argument("--study", default="forecaster", help="experiments/<study>/ (forecaster, hk-paper)")
    parser.add_argument("--tune-seeds", type=int, nargs="+", default=[0, 1])
    parser.set_defaults(seeds=[0, 1, 2, 3, 4])
    parser.add_argument("--reference", default=list(REFERENCE_ARMS), nargs="+",
                        help="the arms every other arm is paired with (default: fedavg local)")
    parser.add_argument("--pooled", action="store_true", help="also the pooled reference (in-process, no Flower)")
    parser.add_argument("--pooled-epochs", type=int, nargs="+", default=[2, 5, 10])
    parser.add_argument("--tune-only", action="store_true", help="stop after the choice (no test numbers)")
    parser.add_argument("--docs", type=Path, default=None,
                        help="also copy the tables and figures (not the run folders) into this folder")
    parser.add_argument("--supernodes", type=int, default=None,
                        help="SuperNodes (the first N households of the pool); default: the whole pool")
    args = parser.parse_args(argv)

    experiments = ROOT / "experiments" / args.study
    if not experiments.is_dir():
        raise SystemExit(f"unknown study {args.study!r}: no folder {experiments}")
    arms = arm_names(experiments, args.arms)
    base = base_config(experiments, args.data, args.profile)
    require_data_files(base)
    out = Path(args.out or f"results/{args.study}").resolve() / f"{args.data}-{args.profile}"
    out.mkdir(parents=True, exist_ok=True)
    baseline = None
    if base.get("forecaster", "paper") != "paper":
        baseline, naive = choose_baseline(base, args.tune_seeds)
        (out / "baseline.json").write_text(json.dumps({"forecast-baseline": baseline, "validation-mae": naive},
                                                      indent=1))
        print(f"baseline chosen on validation: {baseline} ({', '.join(f'{k} {v:.2f}' for k, v in naive.items())})")
        base["forecast-baseline"] = baseline
    supernodes = args.supernodes or pool_size(ROOT, " ".join(f"{k}={toml_value(v)}" for k, v in seeded(base, 0).items()))
    grids = {arm: candidates(experiments, arm) for arm in arms}

    def jobs_for(chosen: list[Candidate], seeds: list[int]) -> list[Job]:
        return [Job(f"{c.name} seed {s}", seeded({**base, **c.run_config}, s), out / c.arm / slug(c.name) / f"seed-{s}",
                    supernodes) for c in chosen for s in seeds]

    def describe(summary: dict) -> str:
        return f"validation MAE {summary.get('val-mae-litres-mean', float('nan')):.2f} L/day"

    every = [c for arm in arms for c in grids[arm]]
    failures = run_jobs(ROOT, jobs_for(every, args.tune_seeds), out / ".superlink", describe, args.ray_address)
    tuning = pd.DataFrame([r for c in every for s in args.tune_seeds
                           if (r := run_rows(out / c.arm / slug(c.name) / f"seed-{s}", c.arm, c.name, s))])
    choices = choose_on_validation(tuning[["arm", "candidate", "seed", "val-mae"]])
    choices.to_csv(out / "choices.csv", index=False)
    (out / "choices.md").write_text(markdown_table(choices) + "\n")
    print(markdown_table(choices))
    if args.tune_only:
        return 1 if failures else 0
    chosen = [c for c in every if c.name in set(choices.loc[choices["chosen"], "candidate"])]
    failures += run_jobs(ROOT, jobs_for(chosen, args.seeds), out / ".superlink", describe, args.ray_address)
    final = pd.DataFrame([r for c in chosen for s in args.seeds
                          if (r := run_rows(out / c.arm / slug(c.name) / f"seed-{s}", c.arm, c.name, s))])
    final.to_csv(out / "runs.csv", index=False)
    table = study_table(final, tuple(args.reference))
    table.to_csv(out / "table.csv", index=False)
    (out / "table.md").write_text(markdown_table(table) + "\n")
    plot_study(final, out)
    print(markdown_table(table))
    if args.pooled:
        pooled = pooled_reference(base, baseline or "none", args.seeds, args.pooled_epochs, [0, 5], out)
        means = pooled.groupby(["epochs", "personalize"])[["val-mae", "test-mae"]].mean().reset_index()
        best = means.loc[means["val-mae"].idxmin()]
        print(f"pooled reference chosen on validation: {int(best['epochs'])} epochs, fine-tuning "
              f"{int(best['personalize'])}: test MAE {best['test-mae']:.2f} L/day")
    if args.docs is not None:
        args.docs.mkdir(parents=True, exist_ok=True)
        for name in ("baseline.json", "choices.csv", "choices.md", "runs.csv", "table.csv", "table.md", "table.png",
                     "pooled.csv"):
            if (out / name).exists():
                shutil.copyfile(out / name, args.docs / name)
        print(f"tables and figures copied to {args.docs}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
