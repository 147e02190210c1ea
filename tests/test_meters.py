"""A utility's own meters in the long format (data-source = "csv"): daily volumes, meter readings, the example
files, and every kind of bad file named by file, row and column."""

from pathlib import Path

import numpy as np
import pytest

from bouquet.config import AppConfig
from bouquet.data.meters import MeterFormatError, read_meters
from bouquet.data.water import load_pool

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="m.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_daily_volumes_by_hand(tmp_path):
    path = write(tmp_path, "unique_id,ds,y,extra\na,2024-03-01,100,x\na,2024-03-02,120,x\na,2024-03-04,-5,x\n"
                           "a,2024-03-05,90000,x\na,2024-03-06,130,x\nb,2024-03-02,50,x\n")
    daily, report = read_meters(path)
    first, litres = daily["a"]
    assert first == np.datetime64("2024-03-01")
    np.testing.assert_array_equal(litres, [100, 120, np.nan, np.nan, np.nan, 130])  # -5 and 90,000 dropped
    assert report.loc["a", "negative_volumes"] == 1 and report.loc["a", "impossible_volumes"] == 1
    assert report.loc["a", "rows"] == 5 and report.loc["a", "valid_days"] == 3
    assert daily["b"][0] == np.datetime64("2024-03-02") and daily["b"][1].tolist() == [50]


def test_daily_readings_become_the_days_use(tmp_path):
    path = write(tmp_path, "unique_id,ds,y\na,2024-03-01,1000\na,2024-03-02,1100\na,2024-03-03,1250\n"
                           "a,2024-03-05,1500\na,2024-03-06,1580\n")
    daily, _ = read_meters(path, "reading")
    first, litres = daily["a"]
    # the reading at midnight starts the day: day 1 used 100, day 2 150; 3..4 span two days: missing
    assert first == np.datetime64("2024-03-01")
    np.testing.assert_array_equal(litres, [100, 150, np.nan, np.nan, 80])


def test_hourly_readings_go_through_the_cleaning_rules(tmp_path):
    daily, report = read_meters(ROOT / "examples" / "meter_readings_hourly.csv", "reading")
    first, litres = daily["meter-001"]
    assert len(litres) >= 29 and np.isfinite(litres[1:-1]).all()
    assert report.loc["meter-001", "rows"] == 720 and "negative_diffs" in report.columns
    # the same days as the daily example file of the same household (the generator's own): a reading a few
    # minutes into the hour is spread over the hour it closes, so a few litres move across midnight
    volumes, _ = read_meters(ROOT / "examples" / "meters_daily.csv")
    own_first, own = volumes["meter-001"]
    offset = int((first - own_first).astype(int))
    same = own[offset + 1: offset + len(litres) - 1]
    assert np.median(np.abs(litres[1:-1] - same)) < 1.0
    assert litres[1:-1].sum() == pytest.approx(same.sum(), rel=0.01)


@pytest.mark.parametrize("text, message", [
    ("household,ds,y\na,2024-03-01,1\n", r"missing column\(s\) 'unique_id'; the long format is unique_id, ds, y"),
    ("unique_id,ds\na,2024-03-01\n", r"missing column\(s\) 'y'"),
    ("unique_id,ds,y\na,2024-03-01,1\na,yesterday,2\n", r"row 2, column 'ds': unparsable date 'yesterday'"),
    ("unique_id,ds,y\na,2024-03-01,lots\n", r"row 1, column 'y': not a number \('lots'\)"),
    ("unique_id,ds,y\na,2024-03-01,1\n,2024-03-02,2\n", r"row 2, column 'unique_id': empty household id"),
    ("unique_id,ds,y\na,2024-03-01,1\nb,2024-03-01,1\na,2024-03-01,2\n",
     r"rows 1, 3, column 'ds': household 'a' has two rows for 2024-03-01"),
    ("unique_id,ds,y\n", "has a header but no rows"),
    ("", "the file is empty"),
])
def test_bad_files_are_named_by_file_row_and_column(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(MeterFormatError, match=message) as error:
        read_meters(path)
    assert str(path) in str(error.value)


def test_missing_file_and_unknown_values(tmp_path):
    with pytest.raises(FileNotFoundError, match="meter data file not found"):
        read_meters(tmp_path / "nope.csv")
    with pytest.raises(MeterFormatError, match="csv-values must be"):
        read_meters(ROOT / "examples" / "meters_daily.csv", "cumulative")


def test_the_example_file_is_a_pool_through_the_run_config(tmp_path, monkeypatch):
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(tmp_path))
    config = AppConfig.from_run_config({"data-source": "csv", "data-path": str(ROOT / "examples" / "meters_daily.csv"),
                                        "active-factor": 0.0, "min-history-days": 0, "split": "origins",
                                        "validation-days": 28})
    pool = load_pool(config.water_data)
    assert [h.household_id for h in pool.households] == ["meter-001", "meter-002", "meter-003"]
    assert set(pool.report["status"]) == {"pool"} and "negative_volumes" in pool.report.columns
    windows = pool.client(0, config.water_data)
    assert len(windows.y_test) == 28 and len(windows.y_val) == 28  # origin 0 of 3 four-week blocks
    with pytest.raises(ValueError, match="needs a data path"):
        load_pool(AppConfig.from_run_config({"data-source": "csv"}).water_data)
