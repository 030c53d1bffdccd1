"""Quarters as labels (``"2023Q4"``) and as decimal years of their middles (``2023.875``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from geodbk.errors import InputDataError

#: Decimal years per quarter (a quarter's middle is year + (quarter - 0.5) * QUARTER_YEARS).
QUARTER_YEARS = 0.25


def quarter_years(year: Any, quarter: Any) -> np.ndarray:
    """Decimal years of the middle of each (year, quarter): ``year + (quarter - 0.5) / 4``."""
    return np.asarray(year, dtype=np.float64) + (np.asarray(quarter, dtype=np.float64) - 0.5) * QUARTER_YEARS


def quarter_label(years: float) -> str:
    """``2023.875`` (middle of Q4) -> ``"2023Q4"``."""
    index = int(np.floor(years * 4 + 1e-9))
    return f"{index // 4}Q{index % 4 + 1}"


def parse_quarter_label(text: str) -> tuple[int, int]:
    """``"2023Q4"`` -> ``(2023, 4)``."""
    label = text.strip().upper()
    if len(label) != 6 or label[4] != "Q" or not label[:4].isdigit() or label[5] not in "1234":
        raise InputDataError(f"bad quarter {text!r}: write it like 2023Q4")
    return int(label[:4]), int(label[5])


__all__ = ["QUARTER_YEARS", "parse_quarter_label", "quarter_label", "quarter_years"]
