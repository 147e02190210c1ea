"""The variant study's table (issue 22): per arm and setting, each seed's last-5 mean, then mean and std over seeds."""

import numpy as np
import pandas as pd
import pytest

from tests.script_loader import script


def test_variant_table_by_hand(tmp_path):
    figures = script("sckm_figures")
    rows = []
    for arm, level in (("random", 20.0), ("sckm-update-neg-classifier", 25.0)):
        for seed in (0, 1):
            for rnd in range(11):  # rounds 6-10 are the last 5
                rows.append({"setting": "c10-s5-b2", "shards": 5, "budget": 2, "arm": arm, "seed": seed,
                             "round": rnd, "accuracy": level + seed + (rnd if rnd > 5 else -100)})
    rows.append({"setting": "c10-s2-b2", "shards": 2, "budget": 2, "arm": "random", "seed": 0, "round": 10,
                 "accuracy": 11.0})
    table = figures.variant_table(pd.DataFrame(rows), tmp_path)
    written = pd.read_csv(tmp_path / "table.csv")
    assert list(written.columns) == ["variant", "shards", "budget", "seeds", "last5_mean", "last5_std"]
    five = written[written["shards"] == 5].set_index("variant")
    # seed means over rounds 6-10: level + seed + 8; over seeds: level + 8.5, std of (x, x + 1) = 0.7071
    assert five.loc["sckm-update-neg-classifier", "last5_mean"] == pytest.approx(33.5)
    assert five.loc["random", "last5_mean"] == pytest.approx(28.5)
    assert five.loc["random", "last5_std"] == pytest.approx(np.sqrt(0.5))
    assert list(five.index) == ["sckm-update-neg-classifier", "random"]  # best first
    two = written[written["shards"] == 2].iloc[0]
    assert two["seeds"] == 1 and np.isnan(two["last5_std"]) and two["last5_mean"] == 11.0
    assert len(table) == 3
    assert "| sckm-update-neg-classifier | 2 | 33.50 +- 0.71 | +5.00 |" in (tmp_path / "table.md").read_text()
