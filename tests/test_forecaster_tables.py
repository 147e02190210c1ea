"""The forecaster study's table by hand: arms ordered by validation MAE, paired intervals against the best naive
forecaster and the reference arms, a run folder read back."""

import json

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis.forecaster_study import plot_study, run_rows, study_table


def _final():
    rows = []
    for arm, val, test in (("fedavg", 10.0, [70.0, 72.0, 74.0]), ("local", 12.0, [71.0, 74.0, 77.0]),
                           ("hk", 9.0, [69.0, 71.0, 73.0])):
        for seed, mae in enumerate(test):
            rows.append({"arm": arm, "candidate": f"{arm}-c", "seed": seed, "val-mae": val + seed, "test-mae": mae,
                         "best-naive": "window median", "best-naive-mae": 75.0, "window-median-mae": 80.0,
                         "beats-own-naive": 0.5, "beats-own-naive-on-test": 0.4})
    return pd.DataFrame(rows)


def test_the_table_orders_arms_by_validation_and_pairs_them_by_seed():
    table = study_table(_final())
    assert table["arm"].tolist() == ["hk", "fedavg", "local"]  # by mean validation MAE: 10, 11, 13
    hk = table.set_index("arm").loc["hk"]
    assert hk["test MAE"] == pytest.approx(71.0) and hk["seeds"] == 3
    assert hk["skill vs best naive"] == pytest.approx(float(np.mean(1 - np.array([69, 71, 73]) / 75.0)))
    # hk - fedavg is -1 in every seed: a zero-width paired interval; hk - local is -2, -3, -4
    assert hk["vs fedavg [95 % CI]"].startswith("-1.00") and hk["vs local [95 % CI]"].startswith("-3.00")
    assert pd.isna(table.set_index("arm").loc["fedavg", "vs fedavg [95 % CI]"])  # no arm is paired with itself


def test_the_figure_and_a_run_folder_read_back(tmp_path):
    assert plot_study(_final(), tmp_path).stat().st_size > 5000
    folder = tmp_path / "run"
    assert run_rows(folder, "fedavg", "c", 0) is None  # not finished: no summary
    folder.mkdir()
    (folder / "clients.csv").write_text("partition-id,mae-litres\n0,70.0\n1,72.0\n")
    (folder / "summary.json").write_text(json.dumps({"mae-litres-mean": 71.0, "val-mae-litres-mean": 9.5,
                                                     "naive-mae-litres": {"window median": 80.0}}))
    row = run_rows(folder, "fedavg", "c", 0)
    assert row["test-mae"] == 71.0 and row["val-mae"] == 9.5 and row["households"] == 2
    assert row["window-median-mae"] == 80.0 and row["best-naive"] is None
