"""The loader and pipeline on the real 92-household DAIAD file (skipped with a reason when absent)."""

import numpy as np
import pytest

from bouquet.data.daiad import clean_to_daily, read_daiad
from bouquet.data.water import WaterDataParams, build_pool

pytestmark = pytest.mark.realdata


def test_real_file_reads_every_row(daiad_zip):
    frame = read_daiad(daiad_zip)
    assert len(frame) == 674_019
    assert frame["household"].nunique() == 92
    assert frame["timestamp"].min() >= np.datetime64("2016-03-01")
    assert frame["timestamp"].max() < np.datetime64("2017-03-01")


def test_real_file_cleaning_matches_documented_statistics(daiad_zip):
    daily, report = clean_to_daily(read_daiad(daiad_zip))
    # docs/DATA.md: ~235 L/day per household, resets and impossible jumps removed
    means = np.array([np.nanmean(series) for _, series in daily.values()])
    assert 215 <= means.mean() <= 255
    assert report["negative_diffs"].sum() > 100
    assert report["impossible_litres"].max() > 100_000  # the 248,541 L reset jump
    assert (report["valid_days"] <= report["days_spanned"]).all()
    assert len(daily) >= 90


def test_real_pool_with_one_year_history(daiad_zip):
    config = WaterDataParams(source="daiad", path=str(daiad_zip), min_history_days=300, active_factor=0.0)
    pool = build_pool(config)
    assert 70 <= len(pool) <= 92  # 76 measured: gappy meters lack 10 windows of 13 valid days
    windows = pool.client(0, config)
    assert len(windows.y_train) > 4 * len(windows.y_test) - 5
    assert {"negative_diffs", "valid_days", "status"} <= set(pool.report.columns)


def test_the_docker_households_pass_a_nodes_own_checks(daiad_zip, tmp_path):
    # each node file the Docker deployment mounts must pass the default job's checks on the node itself (its
    # rolling-origin split on the household's own dates), else that node's ClientApp refuses every round
    from bouquet.config import DEFAULT_JOB, AppConfig, with_preset
    from bouquet.deploy import node_files
    from bouquet.tasks.water import node_windows

    paths = node_files(tmp_path, 3, daiad_zip)
    assert [p.name for p in paths] == ["node-0.csv", "node-1.csv", "node-2.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-0.csv", "node-1.csv", "node-2.csv"]
    config = AppConfig.from_run_config(with_preset({"forecaster": DEFAULT_JOB, "data-source": "daiad",
                                                    "min-history-days": 300, "active-factor": 0.0}))
    households = {node_windows(config.water_data, k, str(p))[0] for k, p in enumerate(paths)}
    assert len(households) == 3
