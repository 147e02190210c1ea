"""Benchmark: what Flower and our client path cost over the bare compute of the same federated run.

    python scripts/bench_overhead.py                      # the synthetic pool in the paper setting and the DAIAD paper-profile FedAvg arm
    python scripts/bench_overhead.py --jobs synthetic-paper --rounds 5
    python scripts/bench_overhead.py --max-in-flight 16      # also each job through Flower with that window

For each job, in one invocation (machines here are noisy, so only ratios
measured together are compared):

* **Flower, warm**: ``python -m bouquet.launch .`` with the job's run config
  (what a user runs: one SuperNode per household) joining a warm runtime
  (``--up``, started once before the jobs and not counted), timed from the
  command's start to its exit;
* **Flower, cold**: the same with ``--cold``: a private SuperLink and Ray
  started and stopped for the run;
* **bare**: the same work in a loop with no Flower, on a process pool with one
  worker per CPU (one torch thread each, as the ClientApp sets): the same
  pool and LSTM, the same seeded choice of clients per round
  (:func:`bouquet.strategies.sampling.draw_nodes` in partition order), the same
  local training (:meth:`bouquet.tasks.water.WaterTask.train` with the app's
  seeds), the same aggregation (the app's aggregator on
  :class:`bouquet.strategies.rounds.ClientUpdates` in partition order), every
  client evaluated every round, and the final evaluation of every client.

The bare loop must reach the Flower run's final MAE to the last digit (checked
and printed): it is the same computation, and so must both Flower runs.  Prints a table, the line
``overhead ratio, cold: Y`` and, as its last line, ``overhead ratio: X`` (warm Flower wall / bare wall, the
larger over the jobs); writes ``results/bench/overhead.csv``.  With ``--max-in-flight N`` each
job also runs through Flower with ``max-in-flight=N`` (:mod:`bouquet.transport`: at
most N messages unanswered; it must give the same MAE), and the line before
the last is ``overhead ratio with max-in-flight=N: Y``.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bouquet.config import AppConfig
from bouquet.experiments import layered_run_config
from bouquet.launch import toml_value
from bouquet.results import find_runs
from bouquet.runtime import WarmRuntime
from bouquet.strategies.rounds import ClientUpdates
from bouquet.strategies.sampling import draw_nodes, training_count
from bouquet.tasks.water import LSTMForecaster, WaterTask

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "synthetic-paper": [],
    "daiad-paper-fedavg": [("data", "daiad"), ("profiles", "paper"), ("arms", "fedavg")],
}


def job_config(name: str, rounds: int | None) -> dict:
    # the paper's forecaster named: the app's pyproject.toml runs the personal one, whose fine-tuning and
    # validation split the bare loop does not do
    config = {"forecaster": "paper",
              **(layered_run_config(ROOT / "experiments" / "hk", JOBS[name], ROOT) if JOBS[name] else {})}
    if rounds is not None:
        config["num-server-rounds"] = rounds
    return config


# ------------------------------------------------------------------ the bare loop's workers
_CONFIG: AppConfig | None = None


def _init(run_config: dict) -> None:
    global _CONFIG
    torch.set_num_threads(1)
    _CONFIG = AppConfig.from_run_config(run_config)


@functools.cache
def _task(partition: int) -> WaterTask:
    c = _CONFIG
    return WaterTask.for_node(c.water_data, c.water_model, c.water_train, None, partition, None)


def _loaded(task: WaterTask, state: dict[str, np.ndarray]) -> torch.nn.Module:
    model = task.new_model()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return model


def _train(job: tuple[int, int, dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
    partition, server_round, state = job
    task = _task(partition)
    model = _loaded(task, state)
    rng = np.random.default_rng([_CONFIG.sampling.seed, server_round, partition])  # as client_app.train
    torch.manual_seed(int(rng.integers(2**31)))
    task.train(model, rng, 0.0)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, task.num_examples


def _evaluate(job: tuple[int, int, dict[str, np.ndarray], bool]) -> dict[str, float]:
    partition, server_round, state, final = job
    task = _task(partition)
    model = _loaded(task, state)
    rng = np.random.default_rng([_CONFIG.sampling.seed, server_round, partition, 1])  # as client_app.evaluate
    metrics = task.evaluate(model, rng, final=final)
    if final:
        task.final_arrays(model)
    return metrics


def bare_run(run_config: dict, supernodes: int, workers: int) -> tuple[float, float]:
    """(wall seconds, final MAE in L/day) of the run's work without Flower."""
    config = AppConfig.from_run_config(run_config)
    started = time.perf_counter()
    torch.manual_seed(config.sampling.seed)  # as WaterServer.begin
    model = LSTMForecaster.from_params(config.water_model, config.water_data.input_channels)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    aggregator = config.family.aggregator(config)
    partitions = list(range(supernodes))
    with get_context("fork").Pool(workers, initializer=_init, initargs=(run_config,)) as pool:
        for server_round in range(1, config.run.num_server_rounds + 1):
            count = training_count(config.sampling, len(partitions))
            picked = draw_nodes(partitions, count, np.random.default_rng([config.sampling.seed, server_round]))
            results = pool.map(_train, [(p, server_round, state) for p in picked])
            updates = ClientUpdates(server_round=server_round, seed=config.sampling.seed, node_ids=tuple(picked),
                                    models=tuple(m for m, _ in results), num_examples=tuple(float(n) for _, n in results),
                                    references=tuple(state for _ in picked),
                                    identities=tuple({"partition-id": p} for p in picked))
            aggregate = aggregator.aggregate(updates)
            if aggregate.model is not None:
                state = {k: np.asarray(v) for k, v in aggregate.model.items()}
            pool.map(_evaluate, [(p, server_round, state, False) for p in partitions])
        final = pool.map(_evaluate, [(p, 0, state, True) for p in partitions])
    return time.perf_counter() - started, float(np.mean([m["mae-litres"] for m in final]))


def flower_run(run_config: dict, supernodes: int, results: Path, runtime_dir: Path,
               cold: bool) -> tuple[float, float]:
    """(wall seconds, final MAE) of ``python -m bouquet.launch .`` on the same run config: joining the warm
    runtime in ``runtime_dir``, or (``cold``) on a private SuperLink and Ray started and stopped for the run."""
    overrides = {**run_config, "results-dir": str(results), "run-name": "bench"}
    text = " ".join(f"{k}={toml_value(v)}" for k, v in overrides.items())
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bouquet.launch", str(ROOT), "--supernodes", str(supernodes),
                           "--runtime-dir", str(runtime_dir), *(["--cold"] if cold else []),
                           "--run-config", text], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    runs = find_runs(results, "*")
    if done.returncode != 0 or not runs:
        raise SystemExit(f"the Flower run failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall, float(runs[-1].summary()["mae-litres-mean"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--rounds", type=int, default=None, help="override num-server-rounds (a shorter bench)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="bare loop processes")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "overhead.csv")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="also run each job through Flower with this window (run-config max-in-flight)")
    args = parser.parse_args(argv)
    if args.max_in_flight is not None and args.max_in_flight < 1:
        parser.error(f"--max-in-flight must be >= 1, got {args.max_in_flight}")

    print(f"# bench_overhead: {os.cpu_count()} CPUs, torch {torch.__version__}, bare loop on {args.workers} "
          f"processes", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as runtime_folder:
        runtime = WarmRuntime(Path(runtime_folder))
        started = time.perf_counter()
        runtime.up()
        up_wall = time.perf_counter() - started
        print(f"warm runtime up in {up_wall:.1f} s (paid once, not counted in the warm runs)", flush=True)
        try:
            for name in args.jobs:
                rows.append(_job(name, args, Path(runtime_folder)))
        finally:
            runtime.down()
    print("\n| job | SuperNodes | Flower, warm runtime (s) | Flower, cold (s) | bare (s) | warm / bare | cold / bare "
          "| fixed cost per run, warm (s) | final MAE (all) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        mae = f"{r['flower-mae']:.2f}" if r["same-mae"] else f"{r['flower-mae']:.2f} / {r['cold-mae']:.2f} / {r['bare-mae']:.2f}"
        print(f"| {r['job']} | {r['supernodes']} | {r['flower-s']:.1f} | {r['cold-s']:.1f} | {r['bare-s']:.1f} "
              f"| {r['ratio']:.2f} | {r['cold-ratio']:.2f} | {r['flower-s'] - r['bare-s']:.1f} | {mae} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"\nwritten {args.out}")
    if args.max_in_flight is not None:
        print(f"overhead ratio with max-in-flight={args.max_in_flight}: {max(r['window-ratio'] for r in rows):.2f}")
    print(f"overhead ratio, cold: {max(r['cold-ratio'] for r in rows):.2f}")
    print(f"overhead ratio: {max(r['ratio'] for r in rows):.2f}")
    return 0 if all(r["same-mae"] for r in rows) else 1


def _job(name: str, args: argparse.Namespace, runtime_dir: Path) -> dict:
    """One job: Flower joining the warm runtime, Flower cold, the bare loop; the row of the table."""
    from bouquet.launch import pool_size

    run_config = job_config(name, args.rounds)
    supernodes = pool_size(ROOT, " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items()))
    walls = {}
    for cold in (False, True):
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as folder:
            walls[cold] = flower_run(run_config, supernodes, Path(folder), runtime_dir, cold)
    (flower_wall, flower_mae), (cold_wall, cold_mae) = walls[False], walls[True]
    window = {}
    if args.max_in_flight is not None:
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as folder:
            window_wall, window_mae = flower_run({**run_config, "max-in-flight": args.max_in_flight}, supernodes,
                                                 Path(folder), runtime_dir, False)
        window = {"window-s": window_wall, "window-mae": window_mae}
    bare_wall, bare_mae = bare_run(run_config, supernodes, args.workers)
    same = all(np.isclose(mae, bare_mae, rtol=0, atol=1e-9)
               for mae in [flower_mae, cold_mae, *([window["window-mae"]] if window else [])])
    windowed = (f"; with max-in-flight={args.max_in_flight} {window['window-s']:.1f} s "
                f"({window['window-s'] / bare_wall:.2f}x, MAE {window['window-mae']:.4f})") if window else ""
    print(f"{name}: {supernodes} SuperNodes; Flower {flower_wall:.1f} s warm, {cold_wall:.1f} s cold, bare "
          f"{bare_wall:.1f} s ({flower_wall / bare_wall:.2f}x warm, {cold_wall / bare_wall:.2f}x cold){windowed}; "
          f"final MAE {flower_mae:.4f} warm, {cold_mae:.4f} cold, {bare_mae:.4f} bare "
          f"({'same' if same else 'DIFFERENT'})", flush=True)
    return {"job": name, "supernodes": supernodes, "flower-s": flower_wall, "cold-s": cold_wall, "bare-s": bare_wall,
            "ratio": flower_wall / bare_wall, "cold-ratio": cold_wall / bare_wall, "flower-mae": flower_mae,
            "cold-mae": cold_mae, "bare-mae": bare_mae, "same-mae": bool(same), **window,
            **({"window-ratio": window["window-s"] / bare_wall} if window else {})}


if __name__ == "__main__":
    sys.exit(main())
