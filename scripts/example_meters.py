"""Write the example meter files of ``examples/`` (the long format of ``data-source = "csv"``, docs/DATA.md).

    python scripts/example_meters.py            # examples/meters_daily.csv, examples/meter_readings_hourly.csv

Both come from the embedded synthetic generator (seed 7), not from any real household: three households'
last 240 days as daily volumes, and one household's last 30 days as the readings of a cumulative meter at
irregular minutes of every hour.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bouquet.data.synthetic import SyntheticParams, generate_population

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    population = generate_population(SyntheticParams(n_households=40, seed=7))
    picked = [h for h in population if np.isfinite(h.daily).sum() > 600][:3]
    rows = []
    for k, h in enumerate(picked):
        days = h.first_day + np.arange(len(h.daily))
        for day, litres in zip(days[-240:], h.daily[-240:]):
            if np.isfinite(litres):
                rows.append({"unique_id": f"meter-{k + 1:03d}", "ds": str(day), "y": round(float(litres), 1)})
    (ROOT / "examples").mkdir(exist_ok=True)
    pd.DataFrame(rows).to_csv(ROOT / "examples" / "meters_daily.csv", index=False)
    rng = np.random.default_rng(3)
    first = picked[0]
    start = pd.Timestamp(str(first.first_day + len(first.daily) - 30))
    reading, readings = 51234.0, []
    for d, total in enumerate(first.daily[-30:]):
        shares = rng.dirichlet(np.ones(24))
        for hour in range(24):
            reading += (total if np.isfinite(total) else 0.0) * shares[hour]
            stamp = start + pd.Timedelta(days=d, hours=hour, minutes=int(rng.integers(0, 60)))
            readings.append({"unique_id": "meter-001", "ds": str(stamp), "y": round(reading, 1)})
    pd.DataFrame(readings).to_csv(ROOT / "examples" / "meter_readings_hourly.csv", index=False)
    print(f"{len(rows)} daily rows, {len(readings)} readings in {ROOT / 'examples'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
