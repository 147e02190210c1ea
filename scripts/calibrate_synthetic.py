"""Compare the synthetic Alicante-like population with the real DAIAD file (docs/DATA.md table).

    python scripts/calibrate_synthetic.py [--daiad ../shared/data/daiad/swm_trialA.zip] [--out results/calibration]
    python scripts/calibrate_synthetic.py --types family,holiday,business --households 60

Prints a markdown table and writes it, with the numbers as CSV, to ``--out``.  With ``--types`` it
describes the known-group benchmark instead: one column per household type (the DAIAD column beside
them), plus the share of days below 5 L (an empty home), in ``types.md`` / ``types.csv``.
Statistics are computed with the same cleaning and daily aggregation as the
app; "residential" synthetic households exclude the vacant and
non-residential archetypes, which the 92 trial households (occupied homes)
do not contain.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bouquet.data.daiad import clean_to_daily, read_daiad
from bouquet.data.synthetic import SyntheticParams, generate_population
from bouquet.data.water import HouseholdDaily, WaterDataParams, select_pool


def daily_stats(households: list[HouseholdDaily]) -> dict[str, float]:
    means = np.array([np.nanmean(h.litres) for h in households])
    cv = np.array([np.nanstd(h.litres) / np.nanmean(h.litres) for h in households if np.nanmean(h.litres) > 0])
    weekend, summer = [], []
    for h in households:
        days = h.first_day + np.arange(len(h.litres))
        weekday = (days.view("int64") + 3) % 7
        month = days.astype("datetime64[M]").view("int64") % 12 + 1
        values = h.litres
        wk, we, su, wi = (np.nanmean(values[mask]) if np.isfinite(values[mask]).any() else np.nan for mask in
                          (weekday < 5, weekday >= 5, np.isin(month, [6, 7, 8]), np.isin(month, [12, 1, 2])))
        if wk > 0:
            weekend.append(we / wk)
        if wi > 0 and np.isfinite(su):
            summer.append(su / wi)
    return {
        "households": len(households),
        "mean L/day (mean of households)": means.mean(),
        "median household L/day": np.median(means),
        "p10 household L/day": np.percentile(means, 10),
        "p90 household L/day": np.percentile(means, 90),
        "share >= 1.6 x mean": float((means >= 1.6 * means.mean()).mean()),
        "median day-to-day CV": np.median(cv),
        "weekend / weekday": np.nanmedian(weekend),
        "summer / winter (Jun-Aug / Dec-Feb)": np.nanmedian(summer),
        "max daily L": max(np.nanmax(h.litres) for h in households),
    }


def real_hourly_stats(readings: pd.DataFrame) -> dict[str, float]:
    hourly = readings[(readings["diff"] >= 0) & (readings["diff"] <= 3125)]  # no resets or jumps
    by_hour = hourly.groupby(hourly["timestamp"].dt.hour)["diff"].mean()
    return {"share of zero hourly readings": float((hourly["diff"] == 0).mean()),
            "peak hour (mean L)": int(by_hour.idxmax()), "night 2-4h / peak": float(by_hour[2:5].mean() / by_hour.max())}


def synthetic_hourly_stats(hourly: list[np.ndarray]) -> dict[str, float]:
    stacked = np.concatenate([h.reshape(-1, 24) for h in hourly])
    by_hour = stacked.mean(axis=0)
    return {"share of zero hourly readings": float(np.mean([(h == 0).mean() for h in hourly])),
            "peak hour (mean L)": int(by_hour.argmax()), "night 2-4h / peak": float(by_hour[2:5].mean() / by_hour.max())}


def markdown(frame: pd.DataFrame) -> str:
    """A pipe table with 3 significant digits (no tabulate dependency)."""
    cells = [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def empty_share(households: list[HouseholdDaily]) -> float:
    """Mean over households of the share of their (known) days below 5 L."""
    return float(np.mean([np.mean(h.litres[np.isfinite(h.litres)] < 5) for h in households]))


def type_columns(types: str, households: int) -> dict[str, dict[str, float]]:
    """One column of :func:`daily_stats` (and the share of near-empty days) per household type."""
    population = generate_population(SyntheticParams(n_households=households, household_types=types))
    columns = {}
    for kind in SyntheticParams(household_types=types).types:
        members = [HouseholdDaily(h.household_id, h.first_day, h.daily) for h in population if h.archetype == kind]
        columns[kind] = {**daily_stats(members), "share of days < 5 L": empty_share(members),
                         **synthetic_hourly_stats([h.hourly for h in population if h.archetype == kind])}
    return columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daiad", default="../shared/data/daiad/swm_trialA.zip")
    parser.add_argument("--out", default="results/calibration")
    parser.add_argument("--seeds", type=int, default=3, help="synthetic seeds for the pool-size rows")
    parser.add_argument("--types", default="", help="describe these household types (synthetic-types) instead")
    parser.add_argument("--households", type=int, default=60, help="households of the typed population")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    columns: dict[str, dict[str, float]] = {}
    path = Path(args.daiad)
    if path.exists():
        started = time.perf_counter()
        readings = read_daiad(path)
        read_seconds = time.perf_counter() - started
        daily, _ = clean_to_daily(readings)
        clean_seconds = time.perf_counter() - started - read_seconds
        real = [HouseholdDaily(k, first, v) for k, (first, v) in daily.items()]
        columns["DAIAD 92-household file"] = {**daily_stats(real), **real_hourly_stats(readings)}
        if args.types:
            columns["DAIAD 92-household file"]["share of days < 5 L"] = empty_share(real)
        print(f"read {path} in {read_seconds:.1f} s, cleaned in {clean_seconds:.1f} s")
    else:
        print(f"{path} not found: synthetic column only")
    if args.types:
        table = pd.DataFrame({**columns, **type_columns(args.types, args.households)})
        table.to_csv(out / "types.csv")
        text = markdown(table.reset_index(names="statistic")) + "\n"
        (out / "types.md").write_text(text)
        print(text)
        return

    started = time.perf_counter()
    population = generate_population(SyntheticParams())
    print(f"generated {len(population)} synthetic households in {time.perf_counter() - started:.1f} s")
    residential = [h for h in population if h.archetype not in ("vacant", "non-residential")]
    as_daily = [HouseholdDaily(h.household_id, h.first_day, h.daily) for h in residential]
    columns["synthetic, residential"] = {**daily_stats(as_daily),
                                         **synthetic_hourly_stats([h.hourly for h in residential])}
    everyone = [HouseholdDaily(h.household_id, h.first_day, h.daily) for h in population]
    columns["synthetic, all 1,099"] = daily_stats(everyone)

    table = pd.DataFrame(columns)
    pool_rows = []
    for seed in range(args.seeds):
        households = [HouseholdDaily(h.household_id, h.first_day, h.daily)
                      for h in generate_population(SyntheticParams(seed=seed))]
        report = select_pool(households, WaterDataParams()).report
        pool_rows.append({"seed": seed, "active (>= 1.6 x mean)": int((~report["status"].str.startswith("inactive")).sum()),
                          "pool (active, >= 730 days)": int((report["status"] == "pool").sum())})
    pools = pd.DataFrame(pool_rows)
    table.to_csv(out / "calibration.csv")
    pools.to_csv(out / "pool_sizes.csv", index=False)
    text = (markdown(table.reset_index(names="statistic")) + "\n\nPaper filters on the synthetic population "
            "(paper: 188 active, 184 pool):\n\n" + markdown(pools) + "\n")
    (out / "calibration.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
