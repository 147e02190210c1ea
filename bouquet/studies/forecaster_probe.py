"""What holds the water LSTM back: local-only training of forecaster variants beside the naive forecasters.

    python scripts/forecaster_probe.py --data daiad --households 19 --epochs 5 30 --out results/forecaster-probe
    python scripts/forecaster_probe.py --data synthetic --households 40 --epochs 5 30

No federation and no Flower: the pool of the HK study's data layer (``experiments/hk/data``); each of
``--households`` households of it (the first, in pool order) trains
its own LSTM on its own fit windows for each epoch budget, once per variant, from the same torch seed,
and is scored on its own validation windows, in litres/day, beside the naive forecasters on the same windows
(:func:`bouquet.tasks.water.naive_errors`).  The probe reads the design period only: the windows are the
rolling-origin protocol's at its first origin (``split = "origins"``, ``origin = 0``) with the test period
locked (``score-test = false``), so no test day reaches it (:data:`PROTOCOL`; a test checks it).  Each variant (``--variants``, :data:`VARIANTS`) is a set of
run-config keys over the paper's protocol, applied one at a time so each change is measured beside the
last: ``paper``, ``window-mean`` / ``window-median`` (``forecast-baseline``), ``+l1`` / ``+huber``
(``forecast-loss``), ``+weekday`` (``calendar-inputs``), ``+profile`` (``household-inputs``), ``improved``
(the ``forecaster`` preset: all four) and changes on top of it (``+robust`` scaler, ``+lr3e-3``,
``+64-units``).  Scaling, calendar and household inputs leave the test days and litres unchanged, so every
variant is scored on the naive forecasters' windows.  With ``--pooled``, each variant is also trained once
on every household's windows together (the centralised reference for a federation: ``<variant> (pooled)``
rows).  Prints one table (mean MAE over households, skill against the best naive forecaster, share of households
beating their own best naive forecast) and writes it as ``probe.md`` under ``--out``; the rows go to
``probe.csv`` after each household, and rows already there are not computed again.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bouquet.config import AppConfig
from bouquet.data.water import load_pool
from bouquet.experiments import load_layer
from bouquet.results import markdown_table
from bouquet.studies import ROOT
from bouquet.tasks.water import LSTMForecaster, evaluate_windows, naive_errors, train_windows

#: Each variant's run-config keys (over the HK study's data layer).
VARIANTS: dict[str, dict[str, object]] = {
    "paper": {},
    "window-mean": {"forecast-baseline": "window-mean"},
    "window-median": {"forecast-baseline": "window-median"},
    "window-median+huber": {"forecast-baseline": "window-median", "forecast-loss": "huber"},
    "window-median+l1": {"forecast-baseline": "window-median", "forecast-loss": "l1"},
    "paper+l1+weekday": {"forecast-loss": "l1", "calendar-inputs": "weekday"},
    "window-median+l1+weekday": {"forecast-baseline": "window-median", "forecast-loss": "l1",
                                 "calendar-inputs": "weekday"},
    "paper+profile": {"household-inputs": "profile"},
    "improved": {"forecaster": "improved"},
    "improved+robust": {"forecaster": "improved", "scaler": "robust"},
    "improved+lr3e-3": {"forecaster": "improved", "learning-rate": 0.003},
    "improved+64-units": {"forecaster": "improved", "hidden-size": 64},
}
#: The windows every probe reads: the design period of the rolling-origin protocol, the test period locked
#: (set last: no variant can change them).
PROTOCOL: dict[str, object] = {"split": "origins", "origin": 0, "score-test": False}


def app_config(data: str, path: str | None, variant: dict[str, object] | None = None) -> AppConfig:
    """The HK study's data layer (``experiments/hk/data/<data>.toml``: the same pool as the studies) with
    ``variant``'s keys, at the protocol's first origin with the test period locked (:data:`PROTOCOL`)."""
    overrides = load_layer(ROOT / "experiments" / "hk", "data", data)
    if "data-path" in overrides:
        overrides["data-path"] = path or str((ROOT / overrides["data-path"]).resolve())
    return AppConfig.from_run_config({**overrides, **(variant or {}), **PROTOCOL})


def data_config(data: str, path: str | None):
    """The water data of :func:`app_config` (the design period's windows, the test period locked)."""
    return app_config(data, path).water_data


def probe(data: str, path: str | None, households: int, epochs: list[int], variants: list[str], seed: int,
          done: pd.DataFrame, saved: Path | None = None) -> pd.DataFrame:
    """Every row of ``done`` plus the missing ones; with ``saved``, the rows so far are written there after
    each household (an interrupted probe resumes from the last household written)."""
    config = data_config(data, path)
    pool = load_pool(config)
    configs = {variant: app_config(data, path, VARIANTS[variant]) for variant in variants}
    rows, frame = [], done
    for index in range(min(households, len(pool))):
        naive = naive_errors(pool.client(index, config), "validation")
        rows += [{"household": index, "variant": f"naive: {name}", "epochs": 0, "mae": mae}
                 for name, mae in naive.items()]
        for variant in variants:
            for budget in epochs:
                if len(done) and ((done["household"] == index) & (done["variant"] == variant)
                                  & (done["epochs"] == budget)).any():
                    continue
                chosen = configs[variant]
                windows = pool.client(index, chosen.water_data)
                torch.manual_seed(seed)
                model = LSTMForecaster.from_params(chosen.water_model, chosen.water_data.input_channels)
                training = dataclasses.replace(chosen.water_train, epochs=budget)
                train_windows(model, windows, training, np.random.default_rng([seed, index]))
                rows.append({"household": index, "variant": variant, "epochs": budget,
                             "mae": evaluate_windows(model, windows, "validation")["mae-litres"]})
        frame = pd.concat([done, pd.DataFrame(rows)], ignore_index=True).drop_duplicates(
            ["household", "variant", "epochs"], keep="first")
        if saved is not None:
            frame.to_csv(saved, index=False)
        print(f"household {index + 1}/{min(households, len(pool))} done", flush=True)
    return frame


def pooled(data: str, path: str | None, households: int, epochs: list[int], variants: list[str], seed: int,
           done: pd.DataFrame) -> pd.DataFrame:
    """``<variant> (pooled)`` rows: one model trained on every household's fit windows at once (shuffled
    together, ``epochs`` passes) and scored on each household's validation windows: the centralised reference
    a federation of the same households would reach if averaging were pooling."""
    pool = load_pool(data_config(data, path))
    count = min(households, len(pool))
    rows = []
    for variant in variants:
        chosen = app_config(data, path, VARIANTS[variant])
        windows = [pool.client(index, chosen.water_data) for index in range(count)]
        together = dataclasses.replace(windows[0], x_train=np.concatenate([w.x_train for w in windows]),
                                       y_train=np.concatenate([w.y_train for w in windows]))
        for budget in epochs:
            name = f"{variant} (pooled)"
            if len(done) and ((done["variant"] == name) & (done["epochs"] == budget)).any():
                continue
            torch.manual_seed(seed)
            model = LSTMForecaster.from_params(chosen.water_model, chosen.water_data.input_channels)
            train_windows(model, together, dataclasses.replace(chosen.water_train, epochs=budget),
                          np.random.default_rng(seed))
            rows += [{"household": index, "variant": name, "epochs": budget,
                      "mae": evaluate_windows(model, w, "validation")["mae-litres"]} for index, w in enumerate(windows)]
            print(f"{name}, {budget} epochs done", flush=True)
    return pd.concat([done, pd.DataFrame(rows)], ignore_index=True)


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    naive = frame[frame["variant"].str.startswith("naive: ")]
    own_best = naive.groupby("household")["mae"].min()
    best_name = naive.groupby("variant")["mae"].mean().idxmin()
    best = naive.groupby("variant")["mae"].mean().min()
    out = []
    for (variant, budget), group in frame.groupby(["variant", "epochs"]):
        beats = (group.set_index("household")["mae"] < own_best.reindex(group["household"]).to_numpy()).mean()
        out.append({"variant": variant, "epochs": budget if budget else "-", "households": len(group),
                    "MAE (L/day)": group["mae"].mean(), f"skill vs {best_name}": 1 - group["mae"].mean() / best,
                    "beats own best naive": beats if not variant.startswith("naive: ") else np.nan})
    return pd.DataFrame(out).sort_values("MAE (L/day)").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("daiad", "synthetic"), default="daiad")
    parser.add_argument("--data-path", default=None, help="DAIAD file (default: the HK study's, ../shared/data)")
    parser.add_argument("--households", type=int, default=19)
    parser.add_argument("--epochs", type=int, nargs="+", default=[5, 30])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, among {', '.join(VARIANTS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pooled", action="store_true",
                        help="also train each variant once on all the households' windows together (centralised)")
    parser.add_argument("--out", default="results/forecaster-probe")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose among {', '.join(VARIANTS)}")
    if any(e < 1 for e in args.epochs):
        raise SystemExit(f"--epochs must be >= 1, got {args.epochs}")
    out = Path(args.out) / f"{args.data}-{args.households}"
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "probe.csv"
    done = pd.read_csv(saved) if saved.exists() else pd.DataFrame(columns=["household", "variant", "epochs", "mae"])
    frame = probe(args.data, args.data_path, args.households, args.epochs, variants, args.seed, done, saved)
    if args.pooled:
        frame = pooled(args.data, args.data_path, args.households, args.epochs, variants, args.seed, frame)
        frame.to_csv(saved, index=False)
    table = summarise(frame)
    (out / "probe.md").write_text(markdown_table(table))
    print(markdown_table(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
