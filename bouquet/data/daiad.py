"""Load and clean DAIAD / Alicante smart-water-meter CSV files.

The trial files are ``;``-separated with one row per meter reading::

    user key;datetime;meter reading;diff
    1f8730a9-...;01/03/2016 00:28:55;68321;10

``diff`` is the number of litres since the household's previous reading.
Readings are roughly hourly but irregular (``:19:43`` offsets, gaps of hours
to days), and the files contain meter resets and replacements (negative
diffs of up to -248,520 L followed by the matching positive jump).

:func:`read_daiad` reads such a file (plain ``.csv`` or a ``.zip`` holding one
CSV) in chunks, keeping only three compact columns.  :func:`clean_to_daily`
turns the readings into daily litres per household with the rules documented
in ``docs/DATA.md`` and counts what each rule removed per household.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bouquet.params import require

__all__ = [
    "KNOWN_HEADERS",
    "CleaningParams",
    "DaiadFormatError",
    "clean_to_daily",
    "read_daiad",
]

#: Column-name variants of the public releases, mapped to our names.
KNOWN_HEADERS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("user key", "datetime", "meter reading", "diff"): ("household", "timestamp", "reading", "diff"),
    ("user.key", "datetime", "meter.reading", "diff"): ("household", "timestamp", "reading", "diff"),
    ("v1", "v2", "v3", "v4"): ("household", "timestamp", "reading", "diff"),
}
DATE_FORMAT = "%d/%m/%Y %H:%M:%S"
HOURS_PER_DAY = 24
_NS_PER_HOUR = 3_600_000_000_000


class DaiadFormatError(ValueError):
    """A file that is not a readable DAIAD smart-water-meter CSV."""


@dataclass(frozen=True)
class CleaningParams:
    """Rules that separate consumption from meter artefacts.

    Parameters
    ----------
    max_flow_litres_per_hour : float, default 3125
        Readings implying a mean flow above this since the previous reading are
        not consumption (meter replacement / reset jump).  3,125 L/h is the
        overload flow Q4 of a DN15 residential meter (Q3 = 2.5 m3/h): the meter
        cannot register more.
    max_spread_hours : float, default 6
        A reading whose previous reading is at most this many hours earlier is
        spread evenly over the hours it covers.  After a longer gap the timing
        of the consumption is unknown: the reading is dropped and the hours of
        the gap stay missing (gaps are not zeros).
    min_hours_per_day : int, default 22
        A day with fewer covered hours is missing.  A day with at least this
        many is kept and its total scaled by 24 / covered hours.
    """

    max_flow_litres_per_hour: float = 3125.0
    max_spread_hours: float = 6.0
    min_hours_per_day: int = 22

    def __post_init__(self) -> None:
        require(self.max_flow_litres_per_hour > 0, "max_flow_litres_per_hour",
                f"max_flow_litres_per_hour must be > 0, got {self.max_flow_litres_per_hour}")
        require(self.max_spread_hours >= 1, "max_spread_hours",
                f"max_spread_hours must be >= 1, got {self.max_spread_hours}")
        require(1 <= self.min_hours_per_day <= HOURS_PER_DAY, "min_hours_per_day",
                f"min_hours_per_day must be in [1, 24], got {self.min_hours_per_day}")


def _is_data_member(name: str) -> bool:
    """A zip member that can be the data: a .csv file, not macOS metadata (``__MACOSX/``, ``._name``)."""
    base = name.rsplit("/", 1)[-1]
    return name.lower().endswith(".csv") and not name.startswith("__MACOSX/") and not base.startswith("._")


def _open_text(path: Path):
    if zipfile.is_zipfile(path):
        archive = zipfile.ZipFile(path)
        members = [n for n in archive.namelist() if _is_data_member(n)]
        if len(members) != 1:
            raise DaiadFormatError(f"{path}: expected exactly one .csv inside the zip, found {members or 'none'}")
        return archive.open(members[0])
    return open(path, "rb")


def _read_header(path: Path) -> tuple[str, ...]:
    with _open_text(path) as handle:
        raw = handle.readline()
    try:
        first = raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError as exc:
        raise DaiadFormatError(f"{path}: not a UTF-8 text file (byte {exc.start} of the first line is "
                               f"{raw[exc.start:exc.start + 1]!r}); expected a ';'-separated CSV") from exc
    if not first:
        raise DaiadFormatError(f"{path}: the file is empty")
    names = tuple(part.strip().strip('"').lower() for part in first.split(";"))
    if names not in KNOWN_HEADERS:
        known = " | ".join(";".join(h) for h in KNOWN_HEADERS)
        raise DaiadFormatError(f"{path}: unrecognised header {first!r}; expected one of: {known} (';'-separated)")
    return names


def read_daiad(path: str | Path, chunk_rows: int = 2_000_000) -> pd.DataFrame:
    """Read a DAIAD smart-water-meter CSV (or a zip holding one).

    Parameters
    ----------
    path : str or Path
        ``.csv`` file or ``.zip`` with exactly one ``.csv`` inside (macOS metadata members, ``__MACOSX/``
        and ``._name``, are ignored).  UTF-8 text; the cumulative ``meter reading`` column is not read, so
        its values are not checked.
    chunk_rows : int, default 2,000,000
        Rows parsed per chunk; bounds the memory held as raw strings.

    Returns
    -------
    pandas.DataFrame
        Columns ``household`` (category), ``timestamp`` (datetime64[ns]) and
        ``diff`` (float64, litres since the previous reading); one row per
        reading, in file order.  The cumulative ``meter reading`` column is not
        kept.

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    DaiadFormatError
        Empty file, a file that is not UTF-8 text (binary, another encoding),
        unknown header, missing column, or an unparsable date or diff (the
        message names the file, the row and the value).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"DAIAD data file not found: {path}")
    if path.is_dir():
        raise DaiadFormatError(f"{path}: is a directory, expected a .csv or .zip file")
    header = KNOWN_HEADERS[_read_header(path)]
    chunks = []
    rows_before = 0
    with _open_text(path) as handle:
        try:  # pandas 2 decodes the first chunk when the reader is made, pandas 3 when it is read
            reader = pd.read_csv(
                handle,
                sep=";",
                header=0,
                names=list(header),
                usecols=["household", "timestamp", "diff"],
                dtype="string",
                chunksize=chunk_rows,
                on_bad_lines="error",
            )
            for chunk in reader:
                chunks.append(_parse_chunk(chunk, path, rows_before))
                rows_before += len(chunk)
        except UnicodeDecodeError as exc:
            raise DaiadFormatError(f"{path}: not UTF-8 text after the header ({exc.reason} at byte {exc.start} of "
                                   f"a chunk); re-save the file as UTF-8") from exc
        except ValueError as exc:
            if isinstance(exc, DaiadFormatError):
                raise
            raise DaiadFormatError(f"{path}: {exc}") from exc
    if not chunks or rows_before == 0:
        raise DaiadFormatError(f"{path}: the file has a header but no readings")
    frame = pd.concat(chunks, ignore_index=True)
    frame["household"] = frame["household"].astype("category")
    return frame


def _parse_chunk(chunk: pd.DataFrame, path: Path, offset: int) -> pd.DataFrame:
    household, stamp, diff = chunk["household"], chunk["timestamp"], chunk["diff"]
    timestamps = pd.to_datetime(stamp, format=DATE_FORMAT, errors="coerce")
    bad = timestamps.isna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise DaiadFormatError(
            f"{path}: unparsable datetime {stamp.iloc[row]!r} on data row {offset + row + 1} "
            f"(expected dd/mm/YYYY HH:MM:SS)"
        )
    litres = pd.to_numeric(diff, errors="coerce")
    bad = litres.isna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise DaiadFormatError(f"{path}: unparsable diff {diff.iloc[row]!r} on data row {offset + row + 1}")
    missing_id = household.isna() | (household.str.strip() == "")
    if missing_id.any():
        row = int(np.flatnonzero(missing_id.to_numpy())[0])
        raise DaiadFormatError(f"{path}: empty user key on data row {offset + row + 1}")
    return pd.DataFrame(
        {
            "household": household.astype("category"),
            "timestamp": timestamps.astype("datetime64[ns]"),
            "diff": litres.astype("float64"),
        }
    )


def clean_to_daily(
    readings: pd.DataFrame, rules: CleaningParams = CleaningParams()
) -> tuple[dict[str, tuple[np.datetime64, np.ndarray]], pd.DataFrame]:
    """Turn meter readings into daily consumption per household.

    Rules, in order (``docs/DATA.md`` explains each):

    1. duplicate (household, timestamp) rows are dropped;
    2. the first reading of a household has no known interval and is dropped;
    3. negative diffs (meter reset / replacement) are not consumption;
    4. diffs implying more than ``max_flow_litres_per_hour`` since the previous
       reading are not consumption;
    5. diffs after a gap longer than ``max_spread_hours`` are dropped and the
       gap stays missing; other diffs are spread evenly over the whole hours
       they cover (``max(1, round(elapsed hours))`` hours ending at the hour of
       the reading);
    6. a day with fewer than ``min_hours_per_day`` covered hours is missing
       (NaN); a kept day with 24 - h uncovered hours is scaled by 24 / (24 - h).

    Parameters
    ----------
    readings : pandas.DataFrame
        Output of :func:`read_daiad` (``household``, ``timestamp``, ``diff``).
        Not modified.
    rules : CleaningParams

    Returns
    -------
    daily : dict
        ``household id -> (first day, litres per day)`` where the array covers
        every calendar day from the first to the last covered day, NaN where a
        day is missing.
    report : pandas.DataFrame
        One row per household: readings, and per rule the readings and litres
        it removed; days spanned, valid days and scaled partial days.
    """
    for column in ("household", "timestamp", "diff"):
        if column not in readings.columns:
            raise ValueError(f"readings lack the column {column!r}; got {list(readings.columns)}")
    frame = readings[["household", "timestamp", "diff"]].sort_values(["household", "timestamp"], kind="stable")
    household = frame["household"].astype("category")
    codes = household.cat.codes.to_numpy()
    names = household.cat.categories
    stamps = frame["timestamp"].to_numpy("datetime64[ns]").astype(np.int64)
    diffs = frame["diff"].to_numpy(np.float64)
    n_households = len(names)

    same_household = np.zeros(len(codes), dtype=bool)
    same_household[1:] = codes[1:] == codes[:-1]
    duplicate = np.zeros(len(codes), dtype=bool)
    duplicate[1:] = same_household[1:] & (stamps[1:] == stamps[:-1])
    keep = ~duplicate
    codes, stamps, diffs = codes[keep], stamps[keep], diffs[keep]
    first = np.ones(len(codes), dtype=bool)
    first[1:] = codes[1:] != codes[:-1]
    elapsed = np.full(len(codes), np.nan)
    elapsed[1:] = (stamps[1:] - stamps[:-1]) / _NS_PER_HOUR
    elapsed[first] = np.nan

    negative = ~first & (diffs < 0)
    rate = diffs / np.maximum(np.nan_to_num(elapsed, nan=1.0), 1.0)
    impossible = ~first & ~negative & (rate > rules.max_flow_litres_per_hour)
    long_gap = ~first & ~negative & ~impossible & (elapsed > rules.max_spread_hours)
    accepted = ~(first | negative | impossible | long_gap)

    def per_household(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        w = None if weights is None else np.where(mask, weights, 0.0)
        return np.bincount(codes, weights=w if w is not None else mask.astype(float), minlength=n_households)

    report = pd.DataFrame(
        {
            "readings": np.bincount(household.cat.codes.to_numpy(), minlength=n_households),
            "duplicates_dropped": np.bincount(household.cat.codes.to_numpy()[duplicate], minlength=n_households),
            "negative_diffs": per_household(negative).astype(int),
            "negative_litres": per_household(negative, diffs),
            "impossible_jumps": per_household(impossible).astype(int),
            "impossible_litres": per_household(impossible, diffs),
            "long_gap_readings": per_household(long_gap).astype(int),
            "long_gap_litres": per_household(long_gap, diffs),
        },
        index=pd.Index(names.astype(str), name="household"),
    )

    hour_end = stamps[accepted] // _NS_PER_HOUR
    span = np.maximum(1, np.rint(elapsed[accepted])).astype(np.int64)
    owner = np.repeat(codes[accepted], span)
    litres = np.repeat(diffs[accepted] / span, span)
    # hours covered by each reading: hour_end - span + 1 ... hour_end
    offsets = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    hours = np.repeat(hour_end - span + 1, span) + offsets
    hourly = pd.DataFrame({"owner": owner, "hour": hours, "litres": litres})
    hourly = hourly.groupby(["owner", "hour"], sort=True)["litres"].sum().reset_index()
    hourly["day"] = hourly["hour"] // HOURS_PER_DAY
    per_day = hourly.groupby(["owner", "day"], sort=True)["litres"].agg(["sum", "count"]).reset_index()

    daily: dict[str, tuple[np.datetime64, np.ndarray]] = {}
    spanned = np.zeros(n_households, dtype=int)
    valid = np.zeros(n_households, dtype=int)
    scaled = np.zeros(n_households, dtype=int)
    for owner_code, group in per_day.groupby("owner", sort=True):
        days = group["day"].to_numpy()
        covered = group["count"].to_numpy()
        ok = covered >= rules.min_hours_per_day
        if not ok.any():
            continue
        days, covered, totals = days[ok], covered[ok], group["sum"].to_numpy()[ok]
        series = np.full(days[-1] - days[0] + 1, np.nan)
        series[days - days[0]] = totals * HOURS_PER_DAY / covered
        daily[str(names[owner_code])] = (np.datetime64(int(days[0]), "D"), series)
        spanned[owner_code] = len(series)
        valid[owner_code] = int(ok.sum())
        scaled[owner_code] = int((covered < HOURS_PER_DAY).sum())
    report["days_spanned"] = spanned
    report["valid_days"] = valid
    report["scaled_partial_days"] = scaled
    return daily, report
