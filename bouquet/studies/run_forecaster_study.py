"""Water studies under the honest protocol: tune on validation, then report the test numbers once.

    python scripts/run_forecaster_study.py --data daiad --tune-seeds 0 1                  # tuning only: test locked
    python scripts/run_forecaster_study.py --data daiad --tune-seeds 0 1 --seeds 0 1 2 3 4 --final
    python scripts/run_forecaster_study.py --data synthetic --arms local,fedavg,hk --final
    python scripts/run_forecaster_study.py --study hk-paper --profile paper   # the HK paper's Table 4 arms

Layers (``experiments/<study>``, default ``forecaster``): ``data/<data>.toml`` < ``profiles/<profile>.toml``
(the protocol) < ``arms/<arm>.toml`` (fixed keys and a ``[grid]`` of candidates) < the seed (``seed`` and
``data-seed``: the synthetic pool is drawn anew, a file's households reordered).

**Rolling origins** (a profile with ``split = "origins"``: the forecaster study, ``--profile rolling``):

1. *The baseline the LSTM adds to* (``forecast-baseline``): the household blend or the window median, whichever
   has the lower validation MAE at the first origin (no training).
2. *Tuning*, on the first origin's validation days with the test period locked (``score-test = false``: no test
   day reaches a node): every candidate of every Flower arm (real ``flwr run``s, resumable), and in process the
   baselines, each trainable one with the same budget of four candidates (the pooled LSTM: epochs x learning
   rate; LightGBM local and pooled: four settings; the window averages: their window): the nodes' naive
   forecasters, statsforecast's SeasonalNaive, WindowAverage, SeasonalWindowAverage and AutoETS per household,
   LightGBM (mlforecast) per household and pooled, the pooled LSTM.  Per arm the candidate with the lowest
   mean validation MAE (the model alone, for the LSTMs) is chosen: ``choices.csv``, ``validation.csv``.  Without
   ``--final`` the runner stops here.
3. *The test blocks, once* (``--final``, logged with the commit in ``test-log.jsonl``): each arm's choice at every
   origin and seed, the baselines on the same days; ``forecasts.csv.gz`` (every forecaster's daily forecasts),
   ``households.csv`` (per forecaster, household and origin: MAE, RMSE, MASE), ``table.csv`` / ``table.md``
   (households as the replicate: :func:`bouquet.analysis.rolling_study.study_table`; the per-household best
   baseline is chosen per household on the first origin's validation days among the naive blend, ETS, the
   seasonal window average, LightGBM local and the local LSTM), ``table.png``, ``study.json``.

**A split by fraction** (``--study hk-paper``, the paper's protocol): every candidate on ``--tune-seeds``, per arm
the lowest mean validation MAE, then the chosen candidates on ``--seeds`` with paired t intervals over seeds
(``table.csv``, ``runs.csv``), as before.

Results: ``<out>/<data>-<profile>/`` (``--out`` default ``results/<study>``).  The baselines need the forecasting
extra: ``pip install "bouquet-fl[forecasting]"``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.analysis.forecaster_study import REFERENCE_ARMS, plot_study, run_rows, study_table
from bouquet.analysis.water_baselines import federated_rows, federated_validation
from bouquet.experiments import (
    Job,
    arm_names,
    layered_run_config,
    load_layer,
    require_data_files,
    run_jobs,
    source_commit,
    study_parser,
)
from bouquet.launch import pool_size, toml_value
from bouquet.results import RunFolder, markdown_table
from bouquet.studies import ROOT
from bouquet.tuning import Candidate, candidate_name, choose_on_validation, expand_grid


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
    households of each tuning seed's pool (no model is trained; the test period is locked)."""
    from bouquet.config import AppConfig
    from bouquet.data.water import load_pool
    from bouquet.tasks.water import naive_errors

    scores: dict[str, list[float]] = {"window median": [], "blend": []}
    for seed in seeds:
        config = AppConfig.from_run_config({**seeded(base, seed), "score-test": False}).water_data
        pool = load_pool(config)
        errors = [naive_errors(pool.client(i, config), "validation") for i in range(len(pool))]
        for name, values in scores.items():
            values.append(float(np.mean([e[name] for e in errors])))
    means = {name: float(np.mean(values)) for name, values in scores.items()}
    return ("household" if means["blend"] < means["window median"] else "window-median"), means


# ---------------------------------------------------------------------------------------------- rolling origins
#: The in-process baselines' candidates: each trainable baseline gets at least the budget of the federated arm with the
#: most (the trees: 18), on grids wide enough that no choice sits at an edge of a numeric one.
POOLED_LSTM = [{"epochs": e, "learning-rate": lr} for e in (3, 5, 10, 20, 40) for lr in (0.001, 0.003, 0.01, 0.03)]
#: LightGBM as a forecaster would fit it (the trees' inputs, level-scaled target): the trees arm's grid in LightGBM's
#: terms (leaf-wise with 2^depth leaves and the same depth, the same rate), wider in depth and trees.
LIGHTGBM = [{"objective": objective, "num_leaves": 2 ** depth, "max_depth": depth, "learning_rate": 0.1,
             "n_estimators": trees, "huber_delta": 0.2}
            for objective in ("l1", "huber") for depth in (3, 4, 6, 8) for trees in (25, 50, 100, 200, 400)]
#: The arm whose runs grow bouquet's federated trees (``forecast-model = "trees"``): tuned by the fit's in-process
#: twin (the same requests and sums, without the messages: the same trees), its test blocks fitted in Flower.
TREES_ARM = "trees"
#: The same trees trained on the pooled rows (one party holding every household's rows): the arm's choice.
TREES_POOLED = "trees pooled"
#: statsforecast's models, grouped as arms (the window of the window averages chosen on validation).
STATS_ARMS = {"ETS": ["ETS"], "seasonal naive": ["seasonal naive"],
              "window average": ["window average 7", "window average 14", "window average 28"],
              "seasonal window average": ["seasonal window average 2", "seasonal window average 4",
                                          "seasonal window average 8"]}
#: The nodes' naive forecasters in the table.
NODE_NAIVE = ("blend", "weekday average", "window median", "last value")  # seasonal naive: statsforecast's row
#: The per-household best baseline's candidates (each household takes the one with its lowest validation MAE).
OWN_BEST = ("naive: blend", "ETS", "seasonal window average", "LightGBM local", "local (model)")
OWN_BEST_NAME = "best baseline per household"


def _replicate(base: dict[str, Any], seed: int) -> tuple[int, int]:
    """``(data, training seed)`` of a study seed: the synthetic pool is drawn anew per seed (a data replicate); a
    file's households are the same in every seed (the seed is training noise)."""
    return (seed, 0) if base.get("data-source", "synthetic") == "synthetic" else (0, seed)


def _with_data(frame: pd.DataFrame, data: int, synthetic: bool) -> pd.DataFrame:
    """Households keyed by their data replicate where the pool is drawn anew per seed."""
    if synthetic and len(frame):
        frame = frame.assign(household=f"d{data}:" + frame["household"].astype(str))
    return frame


def _cached(path: Path, compute: Any) -> pd.DataFrame:
    """A resumable step: ``path`` (CSV) if it exists, else ``compute()`` written there."""
    if path.exists():
        return pd.read_csv(path, parse_dates=["day"] if "forecasts" in path.name else None)
    frame = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)
    return frame


def _validation_mae(rows: pd.DataFrame) -> pd.DataFrame:
    """``forecaster, seed, household, mae`` from forecast rows (validation days)."""
    err = rows.assign(abs=(rows["forecast"] - rows["actual"]).abs())
    return err.groupby(["forecaster", "seed", "household"])["abs"].mean().rename("mae").reset_index()


def baseline_rows(base: dict[str, Any], seed: int, origin: int, part: str, choices: dict[str, str] | None,
                  folder: Path, refit: int, households: int | None = None,
                  trees: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """Every in-process forecaster's rows on one origin's ``part`` days for the data of study seed ``seed``:
    the nodes' naive forecasters, statsforecast's, LightGBM local and pooled, the pooled LSTM and the trees
    (``trees``: the trees arm's candidates, name -> run config; for tuning, every candidate's federated twin and
    its pooled fit; after it, the pooled fit of the arm's choice) (``choices``: only each arm's chosen
    candidate; None: every candidate, for tuning).  Each step is cached under ``folder``."""
    from bouquet.analysis.water_baselines import (
        level_lightgbm_rows,
        naive_rows,
        origin_data,
        pooled_lstm_rows,
        stats_rows,
    )
    from bouquet.forecasting.baselines import LevelLightGBMParams

    data_id, train_seed = _replicate(base, seed)
    where = folder / f"{part}-origin-{origin}-data-{data_id}"
    run_config = seeded(base, seed)
    data = origin_data(run_config, origin, part, households)
    pieces = [_cached(where / "naive.forecasts.csv", lambda: naive_rows(data, NODE_NAIVE))]
    models = [m for arm, names in STATS_ARMS.items() for m in names
              if choices is None or choices.get(arm) in (None, f"{arm}[{m}]", arm)]
    for model in models:
        pieces.append(_cached(where / f"stats-{slug('[' + model + ']')}.forecasts.csv",
                              lambda model=model: stats_rows(data, [model], refit)))
    for pooled in (False, True):
        arm = "LightGBM pooled" if pooled else "LightGBM local"
        for grid in LIGHTGBM:
            name = candidate_name(arm, grid)
            if choices is not None and choices.get(arm) != name:
                continue
            params = LevelLightGBMParams(**grid, seed=0)
            pieces.append(_cached(where / f"lgbm-{slug(name)}-{'pooled' if pooled else 'local'}.forecasts.csv",
                                  lambda params=params, pooled=pooled, name=name: level_lightgbm_rows(
                                      data, params, pooled, name)))
    for name, run_config in (trees or {}).items():
        inner = name[name.index("["):] if "[" in name else ""
        for arm, federated in ((TREES_ARM, True), (TREES_POOLED, False)):
            label = f"{arm}{inner}"
            if choices is None or (arm == TREES_POOLED and choices.get(TREES_POOLED) == label):
                params = _tree_params(base, run_config)
                pieces.append(_cached(where / f"{arm.replace(' ', '-')}-{slug(label)}.forecasts.csv",
                                      lambda params=params, federated=federated, label=label: _tree_forecasts(
                                          data, params, federated, label)))
    for grid in POOLED_LSTM:
        name = candidate_name("LSTM pooled", grid)
        if choices is not None and choices.get("LSTM pooled") != name:
            continue
        path = where / f"lstm-{slug(name)}-seed-{train_seed}.forecasts.csv"
        if not path.exists():
            print(f"pooled LSTM {name}, origin {origin} ({part}), seed {train_seed} ...", flush=True)
            rows, _ = pooled_lstm_rows(data, grid["epochs"], grid["learning-rate"], train_seed, name)
            _cached(path, lambda rows=rows: rows)
        pieces.append(pd.read_csv(path, parse_dates=["day"]))
    frame = pd.concat(pieces, ignore_index=True)
    frame["day"] = pd.to_datetime(frame["day"])
    frame["seed"] = train_seed if data_id == 0 else 0
    frame.loc[~frame["forecaster"].str.startswith("LSTM pooled"), "seed"] = 0
    return _with_data(frame, data_id, base.get("data-source", "synthetic") == "synthetic")


def _tree_params(base: dict[str, Any], run_config: dict[str, Any]) -> Any:
    """The trees' params of a candidate's run config."""
    from bouquet.config import AppConfig

    return AppConfig.from_run_config({**base, **run_config}).trees


def _tree_forecasts(data: Any, params: Any, federated: bool, name: str) -> pd.DataFrame:
    from bouquet.analysis.water_baselines import tree_rows

    print(f"{name} ({'the federated fit, in process' if federated else 'pooled'}), origin {data.origin} "
          f"({data.part}) ...", flush=True)
    return tree_rows(data, params, name, federated)[0]


def _names(raw: str) -> tuple[str, str, bool]:
    """``(arm, candidate, model alone)`` of an in-process forecaster's row name (``statsforecast: window average 7``
    is the candidate ``window average[window average 7]`` of the arm ``window average``)."""
    model = raw.endswith(" (model)")
    name = raw.removesuffix(" (model)")
    if name.startswith("statsforecast: "):
        stat = name.removeprefix("statsforecast: ")
        for arm, names in STATS_ARMS.items():
            if stat in names:
                return arm, arm if len(names) == 1 else f"{arm}[{stat}]", model
    return name.split("[", 1)[0], name, model


def _table_name(raw: str) -> str:
    """The table's name of an in-process forecaster (its arm, `` (model)`` where it is the model alone)."""
    arm, _, model = _names(raw)
    return f"{arm} (model)" if model else arm


def _job(label: str, config: dict[str, Any], seed: int, folder: Path, args: argparse.Namespace) -> Job:
    """One Flower run of the study: as many SuperNodes as its pool has households (``--supernodes`` caps them; each
    origin and each synthetic data seed has its own pool), and at most that many clients a round (a data layer
    whose every household trains every round names the largest pool; asking for more nodes than there are would
    make each round wait ``node-wait-seconds`` for them)."""
    run_config = seeded(config, seed)
    nodes = args.supernodes or pool_size(ROOT, " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items()))
    if int(run_config.get("clients-per-round", 0)) > nodes:
        run_config["clients-per-round"] = nodes
    return Job(label, run_config, folder, nodes)


def rolling_study(args: argparse.Namespace, experiments: Path, arms: list[str], base: dict[str, Any], out: Path) -> int:
    """The rolling-origin protocol: tune on the first origin's validation days (test locked), then, with
    ``--final``, score every origin's test block once (module docstring)."""
    from bouquet.config import AppConfig

    config = AppConfig.from_run_config(base)
    origins = config.water_data.origins
    synthetic = config.water_data.source == "synthetic"
    tune = {**base, "origin": 0, "score-test": False}
    if config.run.forecaster != "paper" and "forecast-baseline" not in base:
        baseline, naive = choose_baseline(tune, args.tune_seeds)
        (out / "baseline.json").write_text(json.dumps({"forecast-baseline": baseline, "validation-mae": naive},
                                                      indent=1))
        print(f"baseline chosen on validation: {baseline} ({', '.join(f'{k} {v:.2f}' for k, v in naive.items())})")
        base, tune = {**base, "forecast-baseline": baseline}, {**tune, "forecast-baseline": baseline}
    grids = {arm: candidates(experiments, arm) for arm in arms}
    every = [c for arm in arms for c in grids[arm]]
    trees = {c.name: c.run_config for c in grids.get(TREES_ARM, [])}  # tuned in process by the fit's twin

    def describe(summary: dict) -> str:
        return f"validation MAE {summary.get('val-mae-litres-mean', float('nan')):.2f} L/day"

    # 1. tuning: every candidate on the first origin's validation days, the test period locked
    jobs = [_job(f"{c.name} seed {s} (tuning)", {**tune, **c.run_config}, s,
                 out / "tuning" / c.arm / slug(c.name) / f"seed-{s}", args)
            for c in every if c.arm != TREES_ARM for s in args.tune_seeds]
    failures = run_jobs(ROOT, jobs, out / ".superlink", describe, args.ray_address)
    validation = []
    for c in every:
        if c.arm == TREES_ARM:
            continue
        for s in args.tune_seeds:
            folder = out / "tuning" / c.arm / slug(c.name) / f"seed-{s}"
            if RunFolder(folder).finished:
                data_id, train_seed = _replicate(base, s)
                rows = federated_validation(folder, c.name, train_seed)
                validation.append(_with_data(rows.assign(arm=c.arm), data_id, synthetic).rename(
                    columns={"forecaster": "candidate"}))
    for s in args.tune_seeds:
        rows = baseline_rows(base, s, 0, "validation", None, out / "baselines", args.refit, args.supernodes, trees)
        mae = _validation_mae(rows)
        names = [_names(f) for f in mae["forecaster"]]
        mae["arm"], mae["candidate"] = [n[0] for n in names], [n[1] for n in names]
        # the pooled LSTM is chosen on its model alone, as the federated arms are (the served share is fitted
        # on the same days)
        keep = [not (n[0] == "LSTM pooled" and not n[2]) for n in names]
        validation.append(mae[keep].drop(columns="forecaster"))
    validation_frame = pd.concat(validation, ignore_index=True)[["arm", "candidate", "seed", "household", "mae"]]
    validation_frame.to_csv(out / "validation.csv", index=False)
    per_candidate = validation_frame.groupby(["arm", "candidate", "seed"])["mae"].mean().reset_index()
    choices = _trees_pooled_follow(choose_on_validation(per_candidate.rename(columns={"mae": "val-mae"})))
    choices.to_csv(out / "choices.csv", index=False)
    (out / "choices.md").write_text(markdown_table(choices) + "\n")
    print(markdown_table(choices))
    picks = dict(zip(choices.loc[choices["chosen"], "arm"], choices.loc[choices["chosen"], "candidate"]))
    rules = serving_rules(tune, args.tune_seeds, [c for c in every if c.name == picks.get(c.arm)],
                          picks.get("LSTM pooled"), out, args.supernodes)
    if not args.final:
        print("tuning done; the test blocks stay locked until --final")
        return 1 if failures else 0

    # 2. the test blocks, once: every origin, every seed, each arm's chosen candidate
    chosen = dict(zip(choices.loc[choices["chosen"], "arm"], choices.loc[choices["chosen"], "candidate"]))
    log_entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **source_commit(ROOT), "data": args.data,
                 "profile": args.profile, "arms": arms, "seeds": args.seeds, "origins": origins, "choices": chosen,
                 "fallback": rules}
    with open(out / "test-log.jsonl", "a") as log:
        log.write(json.dumps(log_entry) + "\n")
    picked = [c for c in every if c.name == chosen.get(c.arm)]
    served_base = {**base, "fallback": rules.get("LSTM pooled", base.get("fallback", "none"))}  # the pooled LSTM's
    # the trees are deterministic: on a file's households every seed grows the same trees (one run an origin)
    final = [(k, c, s) for k in range(origins) for c in picked
             for s in (args.seeds[:1] if c.arm == TREES_ARM and not synthetic else args.seeds)]
    jobs = [_job(f"{c.name} origin {k} seed {s}", {**base, **c.run_config, "origin": k, "score-test": True,
                                                    "fallback": rules[c.arm]}, s,
                 out / "final" / c.arm / slug(c.name) / f"origin-{k}" / f"seed-{s}", args) for k, c, s in final]
    failures += run_jobs(ROOT, jobs, out / ".superlink", describe, args.ray_address)
    pieces = []
    for job, (k, c, s) in zip(jobs, final):
        if RunFolder(job.folder).finished:
            data_id, train_seed = _replicate(base, s)
            pieces.append(_with_data(federated_rows(job.folder, c.arm, train_seed, k), data_id, synthetic))
    scales = []
    for k in range(origins):
        for s in (args.seeds if synthetic else args.seeds[:1]):
            pieces.append(baseline_rows(served_base, s, k, "test", chosen, out / "baselines", args.refit,
                                        args.supernodes,
                                        trees))
        if not synthetic:  # the pooled LSTM's other training seeds
            for s in args.seeds[1:]:
                rows = baseline_rows(served_base, s, k, "test", chosen, out / "baselines", args.refit, args.supernodes)
                pieces.append(rows[rows["forecaster"].str.startswith("LSTM pooled")])
        from bouquet.analysis.water_baselines import origin_data

        for s in (args.seeds if synthetic else args.seeds[:1]):
            data_id, _ = _replicate(base, s)
            scales.append(_with_data(origin_data(seeded(base, s), k, "test", args.supernodes).scales(), data_id, synthetic))
    # the per-household best baseline is chosen on each household's own validation days before the first origin
    own = []
    for s in (args.seeds if synthetic else args.seeds[:1]):
        rows = baseline_rows(base, s, 0, "validation", chosen, out / "baselines", args.refit, args.supernodes, trees)
        mae = _validation_mae(rows)
        own.append(mae.assign(forecaster=[_table_name(f) for f in mae["forecaster"]]))
    for job, (k, c, s) in zip(jobs, final):
        if k == 0 and c.arm == "local" and RunFolder(job.folder).finished:
            data_id, train_seed = _replicate(base, s)
            own.append(_with_data(federated_validation(job.folder, "local (model)", train_seed), data_id, synthetic))
    own_validation = pd.concat(own, ignore_index=True)
    forecasts = pd.concat(pieces, ignore_index=True)
    forecasts["day"] = pd.to_datetime(forecasts["day"])
    federated_names = {n for a in arms for n in (a, f"{a} (model)")}
    forecasts["forecaster"] = [f if f in federated_names else _table_name(f) for f in forecasts["forecaster"]]
    forecasts = forecasts.drop_duplicates(["forecaster", "seed", "household", "origin", "day"])
    forecasts.round({"actual": 3, "forecast": 3}).to_csv(out / "forecasts.csv.gz", index=False)
    _served_counts(jobs, final).to_csv(out / "served.csv", index=False)
    table, errors = rolling_tables(forecasts, validation_frame, own_validation, chosen,
                                   pd.concat(scales, ignore_index=True), list(arms), _holidays(forecasts, config))
    errors.to_csv(out / "households.csv", index=False)
    table.to_csv(out / "table.csv", index=False)
    (out / "table.md").write_text(markdown_table(table) + "\n")
    (out / "study.json").write_text(json.dumps({**log_entry, "arms-run": [c.name for c in picked],
                                                "households-scored": int(errors["household"].nunique()),
                                                "households-left-out": table.attrs["left-out"],
                                                "failures": failures}, indent=1))
    plot_rolling(errors, table, out / "table.png")
    print(markdown_table(table))
    if args.docs is not None:
        args.docs.mkdir(parents=True, exist_ok=True)
        for name in ("baseline.json", "choices.csv", "choices.md", "fallback.json", "table.csv", "table.md",
                     "table.png", "households.csv", "study.json", "test-log.jsonl", "forecasts.csv.gz", "served.csv"):
            if (out / name).exists():
                shutil.copyfile(out / name, args.docs / name)
        print(f"tables and figures copied to {args.docs}")
    return 1 if failures else 0


def serving_rules(tune: dict[str, Any], seeds: list[int], picked: list[Candidate], pooled_lstm: str | None, out: Path,
                  households: int | None = None) -> dict[str, str]:
    """Each Flower arm's serving rule (``fallback``), and the pooled LSTM's (``pooled_lstm``: its chosen candidate),
    chosen by nested validation on the first origin's validation days (:func:`bouquet.forecasting.combine.choose_rule`)
    from the chosen candidate's validation forecasts (the tuning runs' ``val-predictions.csv``; the trees' twin;
    the pooled LSTM's in-process rows) and each household's naive forecasts; written to ``fallback.json``."""
    from bouquet.analysis.water_baselines import origin_data
    from bouquet.forecasting.combine import choose_rule
    from bouquet.tasks.water import naive_litres

    path = out / "fallback.json"
    if path.exists():
        return json.loads(path.read_text())["rules"]
    rules, scores = {}, {}
    arms = [(c.arm, c.name) for c in picked] + ([("LSTM pooled", pooled_lstm)] if pooled_lstm else [])
    for arm, name in arms:
        units = []
        for s in seeds:
            data = origin_data(seeded(tune, s), 0, "validation", households)
            data_id, train_seed = _replicate(tune, s)
            if arm == "LSTM pooled":
                frame = pd.read_csv(out / "baselines" / f"validation-origin-0-data-{data_id}" /
                                    f"lstm-{slug(name)}-seed-{train_seed}.forecasts.csv")
                frame = frame[frame["forecaster"] == f"{name} (model)"]
                model = {h: g.set_index(pd.to_datetime(g["day"]))["forecast"] for h, g in frame.groupby("household")}
            elif arm == TREES_ARM:
                frame = pd.read_csv(out / "baselines" / f"validation-origin-0-data-{data_id}" /
                                    f"{TREES_ARM}-{slug(name)}.forecasts.csv")
                model = {h: g.set_index(pd.to_datetime(g["day"]))["forecast"] for h, g in frame.groupby("household")}
            else:
                folder = out / "tuning" / arm / slug(name) / f"seed-{s}"
                if not RunFolder(folder).finished:
                    continue
                frame = RunFolder(folder).table("val-predictions")
                model = {str(h): g.set_index(pd.to_datetime(g["day"]))["model-litres"]
                         for h, g in frame.groupby("household")}
            for household, w in data.windows.items():
                if household not in model:
                    continue
                days = pd.to_datetime(w.val_days.astype("datetime64[D]"))
                units.append((model[household].reindex(days).to_numpy(dtype=np.float64),
                              naive_litres(w, "validation"), w.to_litres(w.y_val)))
        rules[arm], scores[arm] = choose_rule(units)
        print(f"{arm}: serving rule {rules[arm]!r} by nested validation "
              f"({', '.join(f'{k} {v:.2f}' for k, v in scores[arm].items())} L/day on the second halves)")
    path.write_text(json.dumps({"rules": rules, "second-half-mae": scores}, indent=1))
    return rules


def _served_counts(jobs: list[Job], final: list[tuple[int, Candidate, int]]) -> pd.DataFrame:
    """``arm, candidate, origin, seed, model, combined, baseline``: what each final Flower run served its households
    (its ``clients.csv``)."""
    rows = []
    for job, (k, c, s) in zip(jobs, final):
        if RunFolder(job.folder).finished:
            served = RunFolder(job.folder).table("clients")["served"].astype(str).value_counts()
            rows.append({"arm": c.arm, "candidate": c.name, "origin": k, "seed": s,
                         **{kind: int(served.get(kind, 0)) for kind in ("model", "combined", "baseline")}})
    return pd.DataFrame(rows, columns=["arm", "candidate", "origin", "seed", "model", "combined", "baseline"])


def _trees_pooled_follow(choices: pd.DataFrame) -> pd.DataFrame:
    """The pooled trees are the trees arm's choice trained pooled (not a choice of their own): their chosen
    candidate is the one with the arm's settings."""
    arm = choices[(choices["arm"] == TREES_ARM) & choices["chosen"]]
    pooled = choices["arm"] == TREES_POOLED
    if arm.empty or not pooled.any():
        return choices
    name = TREES_POOLED + str(arm["candidate"].iloc[0])[len(TREES_ARM):]
    choices = choices.copy()
    choices.loc[pooled, "chosen"] = choices.loc[pooled, "candidate"] == name
    return choices


def _holidays(forecasts: pd.DataFrame, config: Any) -> list[np.datetime64]:
    """The public holidays among the forecast days (the trees' holiday calendar; none for ``none``)."""
    from bouquet.forecasting.features import holiday_days

    days = np.unique(pd.to_datetime(forecasts["day"]).to_numpy().astype("datetime64[D]"))
    return list(days[holiday_days(config.tree_features.holidays, days)])


def rolling_tables(forecasts: pd.DataFrame, validation: pd.DataFrame, own_validation: pd.DataFrame,
                   chosen: dict[str, str], scales: pd.DataFrame, federated: list[str],
                   holidays: list[np.datetime64] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The study table and the per-household, per-origin errors (:mod:`bouquet.analysis.rolling_study`).

    ``validation``: ``arm, candidate, seed, household, mae`` (every candidate's validation MAE at the first
    origin, the tuning seeds' data); ``own_validation``: ``forecaster, household, mae`` of the per-household best
    baseline's candidates on every scored household's validation days before the first origin; ``chosen``: arm ->
    its chosen candidate; ``federated``: the arms run in Flower (``local`` among them is a baseline)."""
    from bouquet.analysis.rolling_study import chosen_forecasts, common_days, household_errors, per_household_choice
    from bouquet.analysis.rolling_study import study_table as rolling_table

    common = common_days(forecasts)
    flower = list(federated)
    federated = [a for a in flower if a != "local"]  # local training is a baseline, though it runs in Flower
    picked = validation[validation["candidate"] == validation["arm"].map(chosen)]
    named = picked.assign(forecaster=[f"{a} (model)" if a in flower else a for a in picked["arm"]])
    per_household = own_validation.groupby(["forecaster", "household"])["mae"].mean().reset_index()
    choice = per_household_choice(per_household, [c for c in OWN_BEST if c in set(common["forecaster"])])
    # a household that joins the pool only at a later origin (its days before the first origin were too few or
    # gappy) has no design-period validation to choose its best baseline on: it sits out the table, named
    unchosen = sorted(set(common["household"]) - set(choice))
    if unchosen:
        print(f"{len(unchosen)} households joined the pool after the first origin and have no validation days "
              f"before it to choose their best baseline on; the table leaves them out: {', '.join(unchosen)}")
        common = common[~common["household"].isin(unchosen)]
    common = pd.concat([common, chosen_forecasts(common, choice, OWN_BEST_NAME)], ignore_index=True)
    errors = household_errors(common, scales)
    present = set(errors["forecaster"])
    val_means = named.groupby("forecaster")["mae"].mean()
    baselines = [f for f in present if f not in federated and f != OWN_BEST_NAME
                 and f.removesuffix(" (model)") not in federated]
    best = min((b for b in baselines if b in val_means.index), key=lambda b: val_means[b])
    pooled = "LightGBM pooled" if "LightGBM pooled" in present else None
    by_mae = errors.groupby("forecaster")["mae"].mean()
    # the federated arms in validation order: the chosen one first (the figure draws it)
    federated = sorted((a for a in federated if a in present), key=lambda a: val_means.get(f"{a} (model)", np.inf))
    order = [*federated, *[f"{a} (model)" for a in federated if f"{a} (model)" in present],
             OWN_BEST_NAME, *sorted(baselines, key=lambda b: by_mae[b])]
    table = rolling_table(common, errors, best, OWN_BEST_NAME, pooled, [o for o in order if o in present],
                          holidays=holidays)
    table.insert(1, "val MAE", [next((val_means[n] for n in (f, f"{f} (model)", f.removesuffix(" (model)"))
                                      if n in val_means.index), np.nan) for f in table["forecaster"]])
    table.attrs["best-baseline"] = best
    table.attrs["left-out"] = unchosen
    return table, errors


def plot_rolling(errors: pd.DataFrame, table: pd.DataFrame, path: Path) -> None:
    """``table.png``: each forecaster's MAE per origin (households' mean) and its households' MAE against their
    own best baseline's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    names = list(table["forecaster"])[:8]
    drawn = [*names, *[n for n in ("LightGBM pooled",) if n in set(table["forecaster"]) and n not in names]]
    per_origin = errors.groupby(["forecaster", "origin"])["mae"].mean().unstack()
    for name in drawn:
        if name in per_origin.index:
            left.plot(per_origin.columns, per_origin.loc[name], marker="o", label=name)
    left.set_xticks(list(per_origin.columns))
    left.set_xlabel("origin (test block)")
    left.set_ylabel("MAE (L/day), mean over households")
    left.legend(fontsize=7)
    left.set_title("MAE per test block")
    wide = errors.groupby(["forecaster", "household"])["mae"].mean().unstack(0)
    own = wide.get(OWN_BEST_NAME)
    if own is not None and names:
        first = names[0]
        right.scatter(own, wide[first], s=12)
        top = float(np.nanmax([own.max(), wide[first].max()]))
        right.plot([0, top], [0, top], color="grey", lw=0.8)
        right.set_xlabel(f"{OWN_BEST_NAME}: MAE (L/day)")
        right.set_ylabel(f"{first}: MAE (L/day)")
        right.set_title(f"each household (below the line: {first} wins)")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__, ROOT / "experiments" / "<study>", data="daiad", profile="rolling", out=None)
    parser.add_argument("--study", default="forecaster",
                        help="experiments/<study>/ (forecaster, hk-paper), or the path of a study folder")
    parser.add_argument("--tune-seeds", type=int, nargs="+", default=[0, 1])
    parser.set_defaults(seeds=[0, 1, 2, 3, 4])
    parser.add_argument("--reference", default=list(REFERENCE_ARMS), nargs="+",
                        help="the arms every other arm is paired with (default: fedavg local)")
    parser.add_argument("--final", action="store_true",
                        help="rolling origins: after tuning, score every origin's test block (once; logged)")
    parser.add_argument("--refit", type=int, default=1,
                        help="rolling origins: statsforecast refits every N days (1: every day)")
    parser.add_argument("--tune-only", action="store_true", help="stop after the choice (no test numbers)")
    parser.add_argument("--docs", type=Path, default=None,
                        help="also copy the tables and figures (not the run folders) into this folder")
    parser.add_argument("--supernodes", type=int, default=None,
                        help="SuperNodes (the first N households of the pool); default: the whole pool")
    args = parser.parse_args(argv)

    experiments = Path(args.study) if "/" in args.study else ROOT / "experiments" / args.study
    if not experiments.is_dir():
        raise SystemExit(f"unknown study {args.study!r}: no folder {experiments}")
    arms = arm_names(experiments, args.arms)
    base = base_config(experiments, args.data, args.profile)
    require_data_files(base)
    out = Path(args.out or f"results/{experiments.name}").resolve() / f"{args.data}-{args.profile}"
    out.mkdir(parents=True, exist_ok=True)
    if base.get("split") == "origins":
        return rolling_study(args, experiments, arms, base, out)
    if args.final:
        raise SystemExit("--final is the rolling-origin protocol's (a profile with split = 'origins')")
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
    if args.docs is not None:
        args.docs.mkdir(parents=True, exist_ok=True)
        for name in ("baseline.json", "choices.csv", "choices.md", "runs.csv", "table.csv", "table.md", "table.png"):
            if (out / name).exists():
                shutil.copyfile(out / name, args.docs / name)
        print(f"tables and figures copied to {args.docs}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
