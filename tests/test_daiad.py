"""DAIAD loader: header variants, clear errors, and the cleaning rules on hand-made readings."""

import zipfile

import numpy as np
import pandas as pd
import pytest

from bouquet.data.daiad import (
    CleaningParams,
    DaiadFormatError,
    clean_to_daily,
    read_daiad,
)

ROWS = [
    ("a", "01/03/2016 00:30:00", 100, 0),
    ("a", "01/03/2016 01:30:00", 110, 10),
    ("b", "01/03/2016 00:30:00", 5, 0),
    ("b", "01/03/2016 01:30:00", 9, 4),
]


def write_csv(path, header, rows=ROWS):
    lines = [header] + [";".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("header", ["user key;datetime;meter reading;diff",
                                    "user.key;datetime;meter.reading;diff", "V1;V2;V3;V4"])
def test_every_documented_header_reads_the_same(tmp_path, header):
    frame = read_daiad(write_csv(tmp_path / "m.csv", header))
    assert list(frame.columns) == ["household", "timestamp", "diff"]
    assert frame["diff"].tolist() == [0, 10, 0, 4]
    assert frame["timestamp"].iloc[1] == pd.Timestamp("2016-03-01 01:30:00")
    assert sorted(frame["household"].cat.categories) == ["a", "b"]


def test_zip_is_read_like_csv(tmp_path):
    csv = write_csv(tmp_path / "m.csv", "user key;datetime;meter reading;diff")
    with zipfile.ZipFile(tmp_path / "m.zip", "w") as archive:
        archive.write(csv, "inner.csv")
    pd.testing.assert_frame_equal(read_daiad(tmp_path / "m.zip"), read_daiad(csv))


def test_zip_made_on_macos_loads(tmp_path):
    csv = write_csv(tmp_path / "m.csv", "user key;datetime;meter reading;diff")
    with zipfile.ZipFile(tmp_path / "mac.zip", "w") as archive:
        archive.write(csv, "trial/swm.csv")
        archive.writestr("__MACOSX/trial/._swm.csv", b"\x00\x05\x16\x07 resource fork")
        archive.writestr("trial/._swm.csv", b"\x00\x05\x16\x07")
        archive.writestr("__MACOSX/", b"")
    pd.testing.assert_frame_equal(read_daiad(tmp_path / "mac.zip"), read_daiad(csv))


def test_zip_with_two_data_files_names_them(tmp_path):
    csv = write_csv(tmp_path / "m.csv", "user key;datetime;meter reading;diff")
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as archive:
        archive.write(csv, "a.csv")
        archive.write(csv, "b.csv")
    with pytest.raises(DaiadFormatError, match=r"exactly one \.csv inside the zip, found \['a.csv', 'b.csv'\]"):
        read_daiad(tmp_path / "two.zip")


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "user key;datetime;meter reading;diff\n"
                                     "Jos\xe9;01/03/2016 00:30:00;1;0\n".encode("latin-1")])
def test_binary_or_non_utf8_file_is_a_format_error_naming_the_file(tmp_path, content):
    (tmp_path / "bad.csv").write_bytes(content)
    with pytest.raises(DaiadFormatError, match=r"bad\.csv: not (a )?UTF-8 text"):
        read_daiad(tmp_path / "bad.csv")


def test_the_meter_reading_column_is_not_read(tmp_path):
    rows = [("a", "01/03/2016 00:30:00", "n/a", 0), ("a", "01/03/2016 01:30:00", "", 10)]
    frame = read_daiad(write_csv(tmp_path / "r.csv", "user key;datetime;meter reading;diff", rows))
    assert frame["diff"].tolist() == [0, 10]  # documented: only household, datetime and diff are used


def test_missing_diff_is_an_error_naming_the_row(tmp_path):
    rows = ROWS[:1] + [("a", "01/03/2016 01:30:00", 110, "")]
    path = write_csv(tmp_path / "x.csv", "user key;datetime;meter reading;diff", rows)
    with pytest.raises(DaiadFormatError, match="unparsable diff <NA> on data row 2"):
        read_daiad(path)


def test_missing_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_daiad(tmp_path / "nope.csv")


def test_empty_file(tmp_path):
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(DaiadFormatError, match=r"e\.csv.*empty"):
        read_daiad(tmp_path / "e.csv")


def test_header_without_rows(tmp_path):
    path = write_csv(tmp_path / "h.csv", "user key;datetime;meter reading;diff", rows=[])
    with pytest.raises(DaiadFormatError, match="no readings"):
        read_daiad(path)


def test_missing_column_is_named(tmp_path):
    path = write_csv(tmp_path / "m.csv", "user key;datetime;diff", rows=[("a", "01/03/2016 00:30:00", 1)])
    with pytest.raises(DaiadFormatError, match=r"m\.csv: unrecognised header 'user key;datetime;diff'"):
        read_daiad(path)


def test_unparsable_date_names_row_and_value(tmp_path):
    rows = ROWS[:2] + [("a", "2016-03-01T02:30", 111, 1)]
    path = write_csv(tmp_path / "d.csv", "user key;datetime;meter reading;diff", rows)
    with pytest.raises(DaiadFormatError, match=r"d\.csv: unparsable datetime '2016-03-01T02:30' on data row 3"):
        read_daiad(path)


def test_unparsable_diff(tmp_path):
    rows = ROWS[:1] + [("a", "01/03/2016 01:30:00", 110, "ten")]
    path = write_csv(tmp_path / "x.csv", "user key;datetime;meter reading;diff", rows)
    with pytest.raises(DaiadFormatError, match="unparsable diff 'ten' on data row 2"):
        read_daiad(path)


def readings(times, diffs, household="h"):
    return pd.DataFrame({"household": pd.Categorical([household] * len(times)),
                         "timestamp": pd.to_datetime(times), "diff": np.asarray(diffs, dtype=float)})


def hourly_day(day="2016-03-01", litres=1.0, minute=30):
    """Readings at HH:minute for every hour of one day, plus the one before (baseline)."""
    start = pd.Timestamp(day) - pd.Timedelta(hours=1) + pd.Timedelta(minutes=minute)
    times = [start + pd.Timedelta(hours=h) for h in range(25)]
    return times, [0.0] + [litres] * 24


def test_clean_full_day_sums_hours():
    times, diffs = hourly_day(litres=10)
    daily, report = clean_to_daily(readings(times, diffs))
    first, series = daily["h"]
    assert first == np.datetime64("2016-03-01")
    np.testing.assert_allclose(series, [240.0])
    assert report.loc["h", "valid_days"] == 1 and report.loc["h", "scaled_partial_days"] == 0


def test_negative_diff_is_not_consumption_and_is_counted():
    times, diffs = hourly_day(litres=10)
    diffs[5] = -5000.0  # meter replaced
    daily, report = clean_to_daily(readings(times, diffs))
    assert report.loc["h", "negative_diffs"] == 1
    assert report.loc["h", "negative_litres"] == -5000.0
    # 23 covered hours >= 22: scaled 230 * 24 / 23
    np.testing.assert_allclose(daily["h"][1], [230 * 24 / 23])
    assert report.loc["h", "scaled_partial_days"] == 1


def test_impossible_jump_is_dropped():
    times, diffs = hourly_day(litres=10)
    diffs[7] = 248_541.0
    daily, report = clean_to_daily(readings(times, diffs))
    assert report.loc["h", "impossible_jumps"] == 1
    assert report.loc["h", "impossible_litres"] == 248_541.0
    np.testing.assert_allclose(daily["h"][1], [230 * 24 / 23])


def test_high_but_possible_flow_is_kept():
    times, diffs = hourly_day(litres=10)
    diffs[7] = 3000.0  # below 3,125 L/h
    daily, report = clean_to_daily(readings(times, diffs))
    assert report.loc["h", "impossible_jumps"] == 0
    np.testing.assert_allclose(daily["h"][1], [230 + 3000])


def test_gap_is_missing_not_zero():
    first_times, first_diffs = hourly_day("2016-03-01", litres=10)
    later_times, later_diffs = hourly_day("2016-03-04", litres=20)
    later_diffs[0] = 999.0  # the reading after a 2-day gap: timing unknown
    daily, report = clean_to_daily(readings(first_times + later_times, first_diffs + later_diffs))
    _first, series = daily["h"]
    np.testing.assert_allclose(series, [240.0, np.nan, np.nan, 480.0])
    assert report.loc["h", "long_gap_readings"] == 1 and report.loc["h", "long_gap_litres"] == 999.0
    assert report.loc["h", "valid_days"] == 2 and report.loc["h", "days_spanned"] == 4


def test_two_hour_reading_is_spread_over_both_hours():
    times, diffs = hourly_day(litres=10)
    del times[3], diffs[3]
    diffs[3] = 20.0  # covers two hours
    daily, _ = clean_to_daily(readings(times, diffs))
    np.testing.assert_allclose(daily["h"][1], [240.0])


def test_day_with_too_few_hours_is_missing():
    times, diffs = hourly_day(litres=10)
    times, diffs = times[:20], diffs[:20]  # 19 hours covered
    daily, report = clean_to_daily(readings(times, diffs))
    assert "h" not in daily and report.loc["h", "valid_days"] == 0


def test_duplicates_dropped_and_input_untouched():
    times, diffs = hourly_day(litres=10)
    frame = readings(times + [times[4]], diffs + [diffs[4]])
    before = frame.copy()
    daily, report = clean_to_daily(frame)
    pd.testing.assert_frame_equal(frame, before)
    assert report.loc["h", "duplicates_dropped"] == 1
    np.testing.assert_allclose(daily["h"][1], [240.0])


def test_rules_validate():
    with pytest.raises(ValueError, match="min_hours_per_day"):
        CleaningParams(min_hours_per_day=25)
    with pytest.raises(ValueError, match="max_flow"):
        CleaningParams(max_flow_litres_per_hour=0)
