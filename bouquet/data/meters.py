"""A utility's own meter data in the forecasting field's long format: ``unique_id, ds, y``.

One row per household and timestamp (the layout of statsforecast, mlforecast and the M competitions):

* ``unique_id``: the household (any text);
* ``ds``: a date (``2024-03-01``) or a timestamp (``2024-03-01 07:15:00``), ISO 8601;
* ``y``: litres.  With ``csv-values = "volume"`` (the default) the litres used in the period that ends at
  ``ds``; on a file with one row a day at midnight, the litres of the day ``ds``.  With
  ``csv-values = "reading"`` the meter's cumulative reading at ``ds`` (its differences are the volumes).

Other columns are ignored.  A file with one row per household and day (every ``ds`` at midnight) is daily
use already; any other file is a meter's readings and goes through the DAIAD cleaning rules
(:func:`bouquet.data.daiad.clean_to_daily`: resets and impossible jumps dropped, volumes spread over the hours
they cover, days with fewer than ``min-hours-per-day`` covered hours missing).  On daily rows a negative
volume, or one above ``24 x max-flow-litres-per-hour``, is dropped and counted in the report, as the cleaning
counts them; two rows for one household's day is an error (the file does not say which is right).

Errors name the file, the data row (the header is line 1, the first data row is row 1) and the column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bouquet.data.daiad import HOURS_PER_DAY, CleaningParams, clean_to_daily

__all__ = ["COLUMNS", "MeterFormatError", "read_meters"]

#: The long format's columns.
COLUMNS = ("unique_id", "ds", "y")


class MeterFormatError(ValueError):
    """A file that is not readable as long-format meter data."""


def _row(mask: pd.Series | np.ndarray) -> int:
    return int(np.flatnonzero(np.asarray(mask))[0])


def _read(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise FileNotFoundError(f"meter data file not found: {path}")
    if path.is_dir():
        raise MeterFormatError(f"{path}: is a directory, expected a .csv file")
    try:
        frame = pd.read_csv(path, dtype="string", skipinitialspace=True)
    except pd.errors.EmptyDataError as exc:
        raise MeterFormatError(f"{path}: the file is empty") from exc
    except UnicodeDecodeError as exc:
        raise MeterFormatError(f"{path}: not UTF-8 text ({exc.reason}); re-save it as UTF-8") from exc
    except pd.errors.ParserError as exc:
        raise MeterFormatError(f"{path}: not a comma-separated file ({exc})") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise MeterFormatError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}; the long format is "
                               f"unique_id, ds, y (got {', '.join(frame.columns)})")
    if frame.empty:
        raise MeterFormatError(f"{path}: the file has a header but no rows")
    return frame


def read_meters(path: str | Path, values: str = "volume", rules: CleaningParams | None = None
                ) -> tuple[dict[str, tuple[np.datetime64, np.ndarray]], pd.DataFrame]:
    """Daily litres per household from a long-format file (see the module), and what was dropped.

    Returns
    -------
    daily : dict
        ``household -> (first day, litres per day)``, every calendar day from the first to the last valid day,
        NaN where a day is missing.
    report : pandas.DataFrame
        One row per household (index ``household``): ``rows``, and per rule what it dropped (daily rows:
        ``negative_volumes``, ``impossible_volumes``; readings: the DAIAD cleaning's columns), ``valid_days``.

    Raises
    ------
    FileNotFoundError
    MeterFormatError
        Missing columns, an empty ``unique_id``, an unparsable ``ds`` or ``y`` (file, row and column named), two
        rows for one household's day in daily data, an unknown ``values``.
    """
    rules = rules if rules is not None else CleaningParams()
    if values not in ("volume", "reading"):
        raise MeterFormatError(f"csv-values must be 'volume' or 'reading', got {values!r}")
    path = Path(path)
    frame = _read(path)
    ids = frame["unique_id"].str.strip()
    empty = ids.isna() | (ids == "")
    if empty.any():
        raise MeterFormatError(f"{path}: row {_row(empty) + 1}, column 'unique_id': empty household id")
    stamps = pd.to_datetime(frame["ds"].str.strip(), errors="coerce", format="ISO8601")
    bad = stamps.isna()
    if bad.any():
        row = _row(bad)
        raise MeterFormatError(f"{path}: row {row + 1}, column 'ds': unparsable date {frame['ds'].iloc[row]!r} "
                               f"(expected ISO 8601, e.g. 2024-03-01 or 2024-03-01 07:15:00)")
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_localize(None)
    litres = pd.to_numeric(frame["y"].str.strip(), errors="coerce")
    bad = litres.isna() | ~np.isfinite(litres.to_numpy(dtype=np.float64, na_value=np.nan))
    if bad.any():
        row = _row(bad)
        raise MeterFormatError(f"{path}: row {row + 1}, column 'y': not a number ({frame['y'].iloc[row]!r})")
    data = pd.DataFrame({"household": ids.astype(str), "timestamp": stamps.astype("datetime64[ns]"),
                         "y": litres.astype(np.float64), "row": np.arange(1, len(frame) + 1)})
    data = data.sort_values(["household", "timestamp"], kind="stable").reset_index(drop=True)
    if values == "reading":  # the volume of the period ending at each reading
        data["y"] = data.groupby("household", sort=False)["y"].diff()
    midnight = bool((data["timestamp"] == data["timestamp"].dt.normalize()).all())
    if midnight:  # one row a day: two rows for one day cannot both be right
        twice = data.duplicated(["household", "timestamp"], keep=False)
        if twice.any():
            first = data[twice].sort_values("row").iloc[:1]
            same = data[twice & (data["household"] == first["household"].iloc[0])
                        & (data["timestamp"] == first["timestamp"].iloc[0])]
            raise MeterFormatError(f"{path}: rows {', '.join(str(r) for r in sorted(same['row']))}, column 'ds': "
                                   f"household {first['household'].iloc[0]!r} has two rows for "
                                   f"{first['timestamp'].iloc[0].date()} (daily data has one row a day)")
    if midnight:
        return _daily(data, values, rules)
    readings = data.dropna(subset=["y"]).rename(columns={"y": "diff"})[["household", "timestamp", "diff"]]
    daily, report = clean_to_daily(readings, rules)
    report.insert(0, "rows", data.groupby("household").size().reindex(report.index).fillna(0).astype(int))
    return daily, report


def _daily(data: pd.DataFrame, values: str, rules: CleaningParams
           ) -> tuple[dict[str, tuple[np.datetime64, np.ndarray]], pd.DataFrame]:
    """One row a household-day: the day's litres (``reading``: the reading of the next day minus this one's)."""
    data = data.copy()
    if values == "reading":  # the diff at day d is the use of day d - 1 (reading at midnight: the day's start)
        gap = data.groupby("household", sort=False)["timestamp"].diff().dt.days
        data["timestamp"] = data["timestamp"] - pd.Timedelta(days=1)
        data.loc[gap != 1, "y"] = np.nan  # a reading after a missing day covers more than one day
        data = data.dropna(subset=["y"])
    negative = data["y"] < 0
    impossible = data["y"] > rules.max_flow_litres_per_hour * HOURS_PER_DAY
    report = pd.DataFrame({
        "rows": data.groupby("household").size(),
        "negative_volumes": negative.groupby(data["household"]).sum().astype(int),
        "impossible_volumes": impossible.groupby(data["household"]).sum().astype(int),
    })
    report.index.name = "household"
    kept = data[~negative & ~impossible]
    daily: dict[str, tuple[np.datetime64, np.ndarray]] = {}
    valid = {}
    for household, group in kept.groupby("household", sort=True):
        days = group["timestamp"].to_numpy("datetime64[D]")
        index = (days - days[0]).astype(np.int64)
        series = np.full(int(index[-1]) + 1, np.nan)
        series[index] = group["y"].to_numpy(np.float64)
        daily[str(household)] = (days[0], series)
        valid[str(household)] = len(group)
    report["valid_days"] = pd.Series(valid, dtype="Int64").reindex(report.index).fillna(0).astype(int)
    return daily, report
