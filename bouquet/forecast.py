"""Tomorrow's forecast: what a utility runs bouquet for.

After the last round every household's node forecasts the days after its data ends (tomorrow and the 6 days
after, each from the one before) with the model it serves (its own or fine-tuned one, combined with its
baseline as ``fallback`` says).  In simulation the run folder gathers them in ``forecast.csv`` and keeps each
household's forecaster in ``models/`` (its weights, its scaler, its baseline and share); a deployed node writes
its own file on its own box (:func:`write_forecast_file`).

Forecast again from new readings, without retraining::

    python -m bouquet.forecast RUN_FOLDER --data new_readings.csv            # long format: unique_id, ds, y
    python -m bouquet.forecast RUN_FOLDER --data trial.zip --data-source daiad --days 7 --out forecast.csv

The new file should hold each household's recent days (at least the look-back, 12 days, without a gap, for the
model; the naive baselines read every day it holds); households of the run that the file lacks, and households
of the file the run has no forecaster for, are listed, not forecast.

Columns of ``forecast.csv``: ``partition-id``, ``household``, ``day`` (the forecast day), ``horizon`` (1 =
tomorrow), ``forecast-litres`` (what the household is served), ``model-litres`` (the model alone; empty where
its look-back holds a missing day), ``baseline-litres`` (the household's best naive forecaster), ``baseline``
(its name), ``model-share`` (the model's share of the served forecast: 1 the model, 0 the baseline).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["COLUMNS", "forecast_rows", "load_forecasters", "main", "reforecast", "save_forecaster",
           "write_forecast_file"]

log = logging.getLogger(__name__)

#: The columns of a forecast file, in order.
COLUMNS = ("partition-id", "household", "day", "horizon", "forecast-litres", "model-litres", "baseline-litres",
           "baseline", "model-share")


def forecast_rows(ahead: dict[str, np.ndarray], partition_id: int, household: str, info: dict[str, Any]
                  ) -> list[dict[str, Any]]:
    """Rows of a forecast file from a node's ``ahead`` arrays (:func:`bouquet.tasks.water.forecast_ahead`)."""
    days = np.asarray(ahead["day"]).astype("datetime64[D]").astype(str)
    return [{"partition-id": int(partition_id), "household": household, "day": day, "horizon": int(h),
             "forecast-litres": float(f), "model-litres": float(m), "baseline-litres": float(b),
             "baseline": str(info.get("baseline", "")), "model-share": float(s)}
            for day, h, f, m, b, s in zip(days, ahead["horizon"], ahead["forecast-litres"], ahead["model-litres"],
                                          ahead["baseline-litres"], ahead["model-share"])]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "household"


def write_forecast_file(rows: list[dict[str, Any]], folder: str | None, household: str) -> Path:
    """``<folder>/<household>.csv`` (default folder ``$BOUQUET_CACHE_DIR/forecasts``), written atomically; the
    node's own copy of its forecast in a deployment."""
    from bouquet.data.water import default_cache_dir

    target = Path(folder) if folder else default_cache_dir() / "forecasts"
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{_safe(household)}.csv"
    tmp = path.with_suffix(".csv.tmp")
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(tmp, index=False)
    tmp.replace(path)
    log.info("forecast of household %s: %s", household, path)
    return path


def save_forecaster(folder: Path, partition_id: int, household: str, model: dict[str, np.ndarray],
                    forecaster: dict[str, np.ndarray], baseline: str) -> Path:
    """``<run>/models/<partition-id>.npz``: what :func:`reforecast` needs of one household (its weights, its
    scaler, its baseline and the model's share)."""
    target = folder / "models"
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{int(partition_id):05d}.npz"
    arrays = {f"model/{k}": np.asarray(v) for k, v in model.items()}
    arrays |= {f"forecaster/{k}": np.asarray(v, dtype=np.float64) for k, v in forecaster.items()}
    arrays |= {"household": np.array(household), "baseline": np.array(baseline),
               "partition-id": np.array(int(partition_id))}
    np.savez(path, **arrays)
    return path


def load_forecasters(run: Path) -> dict[str, dict[str, Any]]:
    """``household -> {"partition-id", "model" (state dict arrays), "offset", "scale", "blend", "model-share",
    "model-blend", "baseline"}`` of a finished run's ``models/``."""
    folder = Path(run) / "models"
    if not folder.is_dir():
        raise FileNotFoundError(f"{run}: no models/ folder (a water run writes it after its final evaluation; "
                                f"runs of earlier versions did not)")
    out = {}
    for path in sorted(folder.glob("*.npz")):
        with np.load(path, allow_pickle=False) as stored:
            entry: dict[str, Any] = {"partition-id": int(stored["partition-id"]), "baseline": str(stored["baseline"]),
                                     "model": {k[len("model/"):]: stored[k] for k in stored.files
                                               if k.startswith("model/")}}
            for key in ("offset", "scale", "blend", "model-share", "model-blend"):
                entry[key] = float(stored[f"forecaster/{key}"][0])
            out[str(stored["household"])] = entry
    if not out:
        raise FileNotFoundError(f"{run}: models/ holds no forecaster")
    return out


def reforecast(run: Path, data_path: str, data_source: str = "csv", csv_values: str = "volume", days: int = 7
               ) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Forecast the ``days`` days after each household's data in ``data_path`` with the run's forecasters.

    Returns the forecast rows (:data:`COLUMNS`) and ``{"no-data": [...], "no-forecaster": [...]}`` (households of
    the run the file lacks; households of the file the run has no forecaster for)."""
    import dataclasses

    import torch

    from bouquet.algorithms.trees import Ensemble
    from bouquet.config import AppConfig
    from bouquet.data.water import read_households
    from bouquet.results import RunFolder
    from bouquet.tasks.trees import tree_step
    from bouquet.tasks.water import LSTMForecaster, forecast_ahead, served_ahead

    forecasters = load_forecasters(run)
    config = AppConfig.from_run_config(RunFolder(run).config())
    data = dataclasses.replace(config.water_data, source=data_source, path=str(data_path), csv_values=csv_values)
    households, _ = read_households(data)
    by_id = {h.household_id: h for h in households}
    rows = []
    for household, entry in forecasters.items():
        if household not in by_id:
            continue
        series = by_id[household]
        valid = np.flatnonzero(np.isfinite(series.litres))
        litres = series.litres[: valid[-1] + 1] if len(valid) else series.litres
        blend = None if np.isnan(entry["blend"]) else entry["blend"]
        if "edges" in entry["model"]:  # the federated trees' ensemble
            step = tree_step(Ensemble.from_arrays(entry["model"]), series.first_day, config.tree_features)
            ahead = served_ahead(step, litres, series.first_day, data.lookback, entry["baseline"], entry["model-share"],
                                 blend, days)
        else:
            model = LSTMForecaster.from_params(config.water_model, data.input_channels)
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in entry["model"].items()})
            model.blend = entry["model-blend"]
            ahead = forecast_ahead(model, litres, series.first_day, (entry["offset"], entry["scale"]), data,
                                   entry["baseline"], entry["model-share"], blend, days)
        rows += forecast_rows(ahead, entry["partition-id"], household, {"baseline": entry["baseline"]})
    missing = {"no-data": sorted(set(forecasters) - set(by_id)), "no-forecaster": sorted(set(by_id) - set(forecasters))}
    return pd.DataFrame(rows, columns=list(COLUMNS)), missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bouquet.forecast", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished water run's folder (results/<run>)")
    parser.add_argument("--data", required=True, help="the new readings (long-format CSV, or a DAIAD file)")
    parser.add_argument("--data-source", default="csv", choices=["csv", "daiad"])
    parser.add_argument("--csv-values", default="volume", choices=["volume", "reading"])
    parser.add_argument("--days", type=int, default=7, help="days to forecast after the data ends (default 7)")
    parser.add_argument("--out", type=Path, default=None, help="the forecast file (default RUN/reforecast.csv)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days must be >= 1")
    try:
        frame, missing = reforecast(args.run, args.data, args.data_source, args.csv_values, args.days)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or args.run / "reforecast.csv"
    frame.to_csv(out, index=False)
    households = frame["household"].nunique() if len(frame) else 0
    print(f"{households} households forecast for {args.days} days: {out}")
    for key, names in missing.items():
        if names:
            what = "the file has no readings for" if key == "no-data" else "the run has no forecaster for"
            print(f"{len(names)} households {what}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}")
    summary = json.dumps({"households": households, **{k: len(v) for k, v in missing.items()}})
    print(summary)
    return 0 if households else 1


if __name__ == "__main__":
    sys.exit(main())
