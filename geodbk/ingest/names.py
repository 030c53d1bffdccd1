"""What Ookla's file names say: the URL of a quarter's global file, and the quarter and
service that a file name or URL names."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from geodbk.errors import InputDataError
from geodbk.ingest.validation import check_published
from geodbk.quarters import Quarter

#: Public https root of Ookla's open-data S3 bucket (``s3://ookla-open-data``).
OOKLA_BUCKET_URL = "https://ookla-open-data.s3.amazonaws.com"
#: Ookla's services, each with its own files.
SERVICES = ("mobile", "fixed")

_QUARTER_IN_NAME = re.compile(r"(?<!\d)(20\d\d)[_-]?[Qq]([1-4])(?!\d)")
_OOKLA_DATE_IN_NAME = re.compile(r"(?<!\d)(20\d\d)-(01|04|07|10)-01_performance")
_HIVE_IN_NAME = re.compile(r"year=(20\d\d)/quarter=([1-4])")
_SERVICE_IN_NAME = re.compile(r"(?:^|[^a-z])(mobile|fixed)(?:[^a-z]|$)")
_SERVICE_QUARTER = re.compile(r"([A-Za-z]+):(\d{4})[Qq](\d)")


def ookla_url(service: str, year: int, quarter: int, fmt: str = "parquet") -> str:
    """The https URL of Ookla's global tile file for one quarter.

    Args:
        service: ``"mobile"`` or ``"fixed"``.
        year: 2019 onwards.
        quarter: 1-4; the quarter must be published (:func:`check_published`).
        fmt: ``"parquet"`` or ``"shapefile"`` (a zip).

    Example:
        ``ookla_url("mobile", 2023, 4)`` ->
        ``https://ookla-open-data.s3.amazonaws.com/parquet/performance/type=mobile/year=2023/quarter=4/2023-10-01_performance_mobile_tiles.parquet``
    """
    if service not in SERVICES:
        raise InputDataError(f"service must be one of {SERVICES}, got {service!r}")
    if quarter not in (1, 2, 3, 4):
        raise InputDataError(f"quarter must be 1-4, got {quarter!r}")
    check_published(np.array([year]), np.array([quarter]), "Ookla's files")
    folder, ext = {"parquet": ("parquet", "parquet"), "shapefile": ("shapefiles", "zip")}.get(fmt, (None, None))
    if folder is None:
        raise InputDataError(f"fmt must be 'parquet' or 'shapefile', got {fmt!r}")
    month = Quarter(int(year), quarter).start.month
    name = f"{int(year)}-{month:02d}-01_performance_{service}_tiles.{ext}"
    return f"{OOKLA_BUCKET_URL}/{folder}/performance/type={service}/year={int(year)}/quarter={quarter}/{name}"


def ookla_source(source: str | Path) -> str | Path:
    """``source`` as a path or URL: ``"fixed:2023Q4"`` (a service and a quarter) becomes Ookla's
    URL of that quarter's global file (:func:`ookla_url`), unless a file of that name exists;
    anything else is returned unchanged.

    Raises:
        InputDataError: an unknown service, or a quarter Ookla has not published.
    """
    found = _SERVICE_QUARTER.fullmatch(source) if isinstance(source, str) else None
    if found is None or Path(source).exists():
        return source
    return ookla_url(found.group(1).lower(), int(found.group(2)), int(found.group(3)))


def ookla_sources(source: str | Path | Iterable[str | Path]) -> list[str | Path]:
    """One path or URL, or a sequence of them, as a list, each through :func:`ookla_source`."""
    return [ookla_source(s) for s in ([source] if isinstance(source, (str, Path)) else source)]


def parse_quarter(name: str) -> tuple[int, int] | None:
    """``(year, quarter)`` from a file name or URL, or ``None``.

    Understands ``..._ookla_2023Q4.geojson``, Ookla's ``2023-10-01_performance_...`` and
    the hive form ``year=2023/quarter=4``. The rightmost match wins, so a member of a zip
    (``tiles_2020Q3_2023Q4.zip/x_2023Q4.geojson``) is named by its own file name.
    """
    found = []
    for m in _HIVE_IN_NAME.finditer(name):
        found.append((m.start(), int(m.group(1)), int(m.group(2))))
    for m in _OOKLA_DATE_IN_NAME.finditer(name):
        found.append((m.start(), int(m.group(1)), (int(m.group(2)) - 1) // 3 + 1))
    for m in _QUARTER_IN_NAME.finditer(name):
        found.append((m.start(), int(m.group(1)), int(m.group(2))))
    if not found:
        return None
    _, year, quarter = max(found)
    return year, quarter


def parse_service(name: str) -> str | None:
    """``"mobile"`` or ``"fixed"`` if the file name or URL says which, else ``None``."""
    m = _SERVICE_IN_NAME.search(name.lower().replace("type=", "/"))
    return m.group(1) if m else None


__all__ = [
    "OOKLA_BUCKET_URL", "SERVICES", "ookla_source", "ookla_sources", "ookla_url", "parse_quarter", "parse_service",
]
