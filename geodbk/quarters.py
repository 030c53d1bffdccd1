"""Quarters: the :class:`Quarter` value (``2023Q4``) and decimal years of quarter middles (``2023.875``).

Every quarter label the package reads goes through :meth:`Quarter.parse`, and every label it
writes is ``str(Quarter)``; :func:`quarter_years` is the one formula from (year, quarter) to
decimal years and :meth:`Quarter.index_of` the one from (year, quarter) to a quarter index,
both vectorised for table columns. The module sits on the package's ground floor, beside
:mod:`geodbk.paths`, so that every layer (ingest included) uses the one value.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from geodbk.errors import InputDataError

#: Decimal years per quarter (a quarter's middle is year + (quarter - 0.5) * QUARTER_YEARS).
QUARTER_YEARS = 0.25

#: Decimal-year slack when finding the quarter of a time (float round-off at a quarter's start).
_YEARS_SLACK = 1e-9


def quarter_years(year: Any, quarter: Any) -> np.ndarray:
    """Decimal years of the middle of each (year, quarter): ``year + (quarter - 0.5) / 4``.

    ``year`` and ``quarter`` are scalars or equal-shaped arrays (table columns); the result is
    float64 of their broadcast shape.
    """
    return np.asarray(year, dtype=np.float64) + (np.asarray(quarter, dtype=np.float64) - 0.5) * QUARTER_YEARS


@dataclass(frozen=True, order=True)
class Quarter:
    """One calendar quarter: ``Quarter(2023, 4)`` is October to December 2023, written ``"2023Q4"``.

    Ordered by time; ``str()`` gives the canonical label that :meth:`parse` reads back.

    Attributes:
        year: the calendar year.
        number: the quarter of the year, 1-4.

    Raises:
        InputDataError: a number outside 1-4.
    """

    year: int
    number: int

    def __post_init__(self) -> None:
        if self.number not in (1, 2, 3, 4):
            raise InputDataError(f"a quarter's number is 1-4, got {self.number!r} (year {self.year})")

    @classmethod
    def parse(cls, text: str | Quarter) -> Quarter:
        """``"2023Q4"`` (any case, surrounding spaces allowed) -> ``Quarter(2023, 4)``; a Quarter is returned as it is.

        Raises:
            InputDataError: anything but a four-digit year, ``Q`` and a quarter 1-4.
        """
        if isinstance(text, Quarter):
            return text
        label = text.strip().upper() if isinstance(text, str) else ""
        if len(label) != 6 or label[4] != "Q" or not label[:4].isdigit() or label[5] not in "1234":
            raise InputDataError(f"bad quarter {text!r}: write it like 2023Q4")
        return cls(int(label[:4]), int(label[5]))

    @classmethod
    def parse_list(cls, text: str | Iterable[str | Quarter]) -> list[Quarter]:
        """``"2023Q1, 2023q4"`` (comma-separated; blank items skipped) or a sequence of labels -> Quarters, in order."""
        items = text.split(",") if isinstance(text, str) else text
        return [cls.parse(item) for item in items if not (isinstance(item, str) and not item.strip())]

    @classmethod
    def parse_span(cls, text: str, name: str = "a change") -> tuple[Quarter, Quarter]:
        """``"2022Q4:2023Q4"`` -> ``(Quarter(2022, 4), Quarter(2023, 4))``: the from and to quarters of a change.

        Raises:
            InputDataError: no ``:`` or an empty side (the message names ``name``), or a bad quarter.
        """
        start, sep, end = text.partition(":")
        if not sep or not start.strip() or not end.strip():
            raise InputDataError(f"{name} takes FROM:TO quarters, e.g. 2022Q4:2023Q4; got {text!r}")
        return cls.parse(start), cls.parse(end)

    @classmethod
    def of_years(cls, years: float) -> Quarter:
        """The quarter holding the decimal-year time ``years`` (``2023.875``, the middle of Q4 -> 2023Q4)."""
        return cls.of_index(math.floor(float(years) / QUARTER_YEARS + _YEARS_SLACK))

    @classmethod
    def of_index(cls, index: int) -> Quarter:
        """The quarter ``index`` quarters after 0000Q1 (:attr:`index` read back)."""
        return cls(int(index) // 4, int(index) % 4 + 1)

    @staticmethod
    def index_of(year: Any, number: Any) -> np.ndarray:
        """Quarters after 0000Q1 of each (year, quarter number): ``4 * year + number - 1``.

        ``year`` and ``number`` are integer scalars or equal-shaped arrays (table columns); the
        result is int64 of their broadcast shape, ordered as the quarters are (2023Q4 -> 8095).
        """
        return np.asarray(year, dtype=np.int64) * 4 + np.asarray(number, dtype=np.int64) - 1

    @property
    def index(self) -> int:
        """Quarters after 0000Q1 (:meth:`index_of` of this quarter; :meth:`of_index` reads it back)."""
        return int(self.index_of(self.year, self.number))

    def __str__(self) -> str:
        return f"{self.year:04d}Q{self.number}"

    def shift(self, n: int) -> Quarter:
        """The quarter ``n`` quarters later (earlier for negative ``n``); ``2023Q4.shift(1)`` is 2024Q1."""
        return self.of_index(self.index + n)

    @property
    def start(self) -> datetime.date:
        """The first day of the quarter (2023Q4 -> 2023-10-01)."""
        return datetime.date(self.year, 3 * (self.number - 1) + 1, 1)

    @property
    def years(self) -> float:
        """Decimal years of the quarter's middle (2023Q4 -> 2023.875), by :func:`quarter_years`."""
        return float(quarter_years(self.year, self.number))


def parse_quarter_label(text: str) -> tuple[int, int]:
    """``"2023Q4"`` -> ``(2023, 4)``: :meth:`Quarter.parse` as a (year, quarter) pair, for table columns."""
    quarter = Quarter.parse(text)
    return quarter.year, quarter.number


__all__ = ["QUARTER_YEARS", "Quarter", "parse_quarter_label", "quarter_years"]
