"""What ingest refuses and what it drops: the validation rules for Ookla tile rows.

Validation (the rule the README quotes). A file is refused, in one line, when it

* names a quarter outside what Ookla publishes: before 2019Q1 (the first open-data
  quarter, :data:`FIRST_QUARTER`) or after the current calendar quarter;
* holds two rows for one (quadkey, year, quarter, service).

A row is dropped and counted (``attrs["dropped"]``, one warning line for all of them) when

* a speed (``avg_d_kbps``, ``avg_u_kbps``) is infinite, negative or above
  :data:`MAX_SPEED_KBPS` = 10^8 kbit/s (100 Gbit/s, ten times the fastest consumer line),
  or the latency ``avg_lat_ms`` is infinite, negative or above :data:`MAX_LATENCY_MS` =
  60,000 ms (``"invalid_value"``);
* ``tests`` is missing, not a whole number, <= 0 or above :data:`MAX_TESTS`
  (``"no_tests"``): a tile average needs at least one test.

A missing (null) speed or latency is not an error: the row is dropped later only if that
column is the dataset's target (:func:`geodbk.dataset.spatial_dataset.build_dataset`).

The rules are applied to every row of every file, also by the streaming scan of
:mod:`geodbk.ingest.scan`, which keeps only a region's rows: a file is refused, and its
invalid rows counted, wherever in the world the offending rows lie. Duplicates are checked
within each file over all its rows not dropped and, across files, over the rows kept (a file given twice
always duplicates them).
"""

from __future__ import annotations

import warnings
from datetime import date

import numpy as np
import pandas as pd

from geodbk.errors import DroppedRowsWarning, InputDataError
from geodbk.quarters import Quarter

#: Ookla's first open-data quarter.
FIRST_QUARTER = Quarter(2019, 1)
#: Largest tile-average speed accepted, kbit/s (100 Gbit/s).
MAX_SPEED_KBPS = 1e8
#: Largest tile-average latency accepted, ms (one minute).
MAX_LATENCY_MS = 6e4
#: Largest number of tests (or devices) of one tile-quarter accepted.
MAX_TESTS = 2**31 - 1
#: Columns checked against a ceiling: name -> largest value accepted.
_CEILINGS = {"avg_d_kbps": MAX_SPEED_KBPS, "avg_u_kbps": MAX_SPEED_KBPS, "avg_lat_ms": MAX_LATENCY_MS}
#: Reasons rows are dropped, as counted in ``attrs["dropped"]``, and how the warning names them.
DROP_REASONS = {
    "invalid_value": "an infinite, negative or out-of-range speed or latency",
    "no_tests": "tests missing or <= 0",
}
#: The columns that name one tile row: no two rows may share them.
KEY_COLUMNS = ("quadkey", "year", "quarter", "service")


def current_quarter(today: date | None = None) -> Quarter:
    """The quarter of ``today`` (default: the system date), the last quarter a file may name."""
    today = today or date.today()
    return Quarter(today.year, (today.month - 1) // 3 + 1)


def check_published(years: np.ndarray, quarters: np.ndarray, name: str, today: date | None = None) -> None:
    """Refuse quarters Ookla cannot have published: before :data:`FIRST_QUARTER` or after the
    current quarter (:func:`current_quarter` of ``today``).

    Args:
        years, quarters: ``(n,)`` integers of the rows (quarters already checked to be 1-4).
        name: the file, for the message.

    Raises:
        InputDataError: a quarter outside that span.
    """
    first, last = FIRST_QUARTER, current_quarter(today)
    index = Quarter.index_of(years, quarters)
    outside = (index < first.index) | (index > last.index)
    if outside.any():
        row = np.flatnonzero(outside)[0]
        raise InputDataError(
            f"{name}: {int(outside.sum())} row(s) name a quarter Ookla has not published, e.g. "
            f"{Quarter.of_index(index[row])}; open data spans {first} to the current quarter {last}"
        )


def invalid_rows(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows to drop, by reason of :data:`DROP_REASONS` (see the module docstring's rule).

    Args:
        values: ``avg_d_kbps``, ``avg_u_kbps``, ``avg_lat_ms``, ``tests``, ``devices`` as float64
            ``(n,)`` arrays, NaN where missing or not a number.

    Returns:
        ``{reason: (n,) bool}``; a row that fails both checks counts as ``"no_tests"``.
    """
    with np.errstate(invalid="ignore"):
        tests = values["tests"]
        no_tests = ~(np.isfinite(tests) & (tests >= 1) & (tests <= MAX_TESTS) & (tests == np.floor(tests)))
        devices = values["devices"]
        bad = ~np.isnan(devices) & ~(np.isfinite(devices) & (devices >= 0) & (devices <= MAX_TESTS))
        for col, ceiling in _CEILINGS.items():
            v = values[col]
            bad |= ~np.isnan(v) & ~((v >= 0) & (v <= ceiling))
    return {"invalid_value": bad & ~no_tests, "no_tests": no_tests}


def check_duplicates(keys: pd.DataFrame) -> None:
    """Refuse rows that share their :data:`KEY_COLUMNS` (the module docstring's rule).

    Args:
        keys: a frame with the :data:`KEY_COLUMNS` (other columns are ignored).

    Raises:
        InputDataError: two rows for one (quadkey, year, quarter, service), naming one of them.
    """
    others = [c for c in KEY_COLUMNS if c != "quadkey"]
    if len(keys) == 0 or (
        all((keys[c] == keys[c].iloc[0]).all() for c in others) and keys["quadkey"].is_unique
    ):  # one quarter and service (an Ookla file): duplicates are repeated quadkeys
        return
    duplicated = keys.duplicated(list(KEY_COLUMNS)).to_numpy()
    if duplicated.any():
        row = keys.iloc[int(np.flatnonzero(duplicated)[0])]
        raise InputDataError(
            f"the tiles hold {int(duplicated.sum())} duplicate (quadkey, quarter, service) row(s), e.g. quadkey "
            f"{row['quadkey']} in {Quarter(int(row['year']), int(row['quarter']))} ({row['service']}); "
            "is a file given twice?"
        )


def warn_dropped(counts: dict[str, int], stacklevel: int = 2) -> None:
    """One :class:`DroppedRowsWarning` for the rows dropped as invalid, if any.

    Args:
        counts: rows dropped by reason of :data:`DROP_REASONS`.
        stacklevel: as for :func:`warnings.warn`, counted from the caller of this function.
    """
    if any(counts.values()):
        reasons = ", ".join(f"{n:,} with {DROP_REASONS[r]}" for r, n in counts.items() if n)
        warnings.warn(
            f"dropped {sum(counts.values()):,} tile row(s): {reasons}", DroppedRowsWarning, stacklevel=stacklevel + 1
        )


__all__ = [
    "DROP_REASONS",
    "FIRST_QUARTER",
    "KEY_COLUMNS",
    "MAX_LATENCY_MS",
    "MAX_SPEED_KBPS",
    "MAX_TESTS",
    "check_duplicates",
    "check_published",
    "current_quarter",
    "invalid_rows",
    "warn_dropped",
]
