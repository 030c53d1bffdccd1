"""Streaming ingest: one region's tiles out of Ookla's global files, a batch of rows at a time.

Ookla's global quarterly files hold about 4 million mobile tiles each, 80% of whose bytes are
the WKT ``tile`` polygons. :func:`scan_tiles` reads a plain Parquet file (Ookla's own, or the
shipped samples) with pyarrow in batches of :data:`BATCH_ROWS` rows and, for each batch,

1. reads every column that :func:`geodbk.ingest.ookla.tile_columns` checks, but not the
   polygons: the quadkey, the values, and the key, centre and loaded-latency columns present;
2. checks every row by the rules of :mod:`geodbk.ingest.validation` through
   :func:`~geodbk.ingest.ookla.tile_columns` (the reader's own code, so a file that
   :func:`~geodbk.ingest.ookla.read_tiles` refuses is refused here, and the same rows are
   counted as dropped), computing each tile's centre from its quadkey, vectorised;
3. keeps the valid rows of the wanted service and quarters whose centre lies inside the
   region (grown by its buffer): the region's bounding box first, then the polygon.

Only then does it read the ``tile`` column, of the row groups that hold kept rows, and parse
polygons for the kept rows alone. So memory holds the kept rows, one batch, and one 8-byte
code per distinct (quadkey, year, quarter, service) key of the file's rows
(:class:`_DistinctKeys`), so that a duplicate is refused in the batch that repeats a key, not
after the whole file: 30 million copies of one row (a 1.1 MB file) are refused in the first
batch instead of filling 4 GiB with their keys. Never a whole file. Files are read one after
another; a URL is downloaded once into the cache (:func:`geodbk.ingest.sources.local_path`)
and read the same way. GeoParquet, GeoJSON and
shapefiles (zipped or not) are read whole by :func:`geodbk.ingest.ookla.read_raw`, then go
through the same checks and selection.

The result equals what :func:`~geodbk.ingest.ookla.read_tiles` followed by the selection of
service and quarters (:func:`select_rows`) and :func:`geodbk.ingest.regions.clip_to_region`
gives: the same rows in the same order, the same values, polygons and dropped counts.
Duplicates across files are refused among the kept rows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.errors import InputDataError
from geodbk.ingest.formats import check_head, format_of, read_head
from geodbk.ingest.names import SERVICES, ookla_sources
from geodbk.ingest.ookla import (
    READ_COLUMNS,
    check_columns,
    read_raw,
    tile_column_order,
    tile_columns,
    tile_geometry,
)
from geodbk.ingest.quadkey import quadkey_to_tile
from geodbk.ingest.regions import DEFAULT_BUFFER_DEG, Region, check_any_inside, region_test
from geodbk.ingest.sources import is_url, local_path
from geodbk.ingest.validation import DROP_REASONS, KEY_COLUMNS, check_duplicates, warn_dropped
from geodbk.ingest.vectorfiles import checked_path
from geodbk.quarters import Quarter

#: Rows read from a Parquet file at once.
BATCH_ROWS = 65_536


class _Keys(TypedDict):
    """The quarter and service of files that carry them neither as columns nor in their name."""

    year: int | None
    quarter: int | None
    service: str | None


def check_selection(
    services: set[str], quarters: set[Quarter], service: str | None, wanted: Sequence[tuple[int, int]] | None
) -> None:
    """Refuse a choice of service and quarters that the tiles cannot satisfy.

    Args:
        services: the services of the (valid, complete) tile rows.
        quarters: the quarters of those rows of ``service`` (of all rows if ``None``).
        service: the service asked for, or ``None`` for the one the tiles hold.
        wanted: the ``(year, quarter)`` asked for, or ``None`` for all.

    Raises:
        InputDataError: an unknown service, no tiles of ``service``, tiles of two services and
            no ``service``, or no tiles for a wanted quarter.
    """
    if service is not None:
        if service not in SERVICES:
            raise InputDataError(f"service must be one of {SERVICES}, got {service!r}")
        if service not in services:
            raise InputDataError(f"no {service} tiles (services present: {sorted(services)})")
    elif len(services) > 1:
        raise InputDataError(f"tiles mix services {sorted(services)}; pass service=")
    if wanted is not None:
        absent = [str(Quarter(y, q)) for y, q in wanted if Quarter(y, q) not in quarters]
        if absent:
            have = ", ".join(str(quarter) for quarter in sorted(quarters))
            raise InputDataError(f"no tiles for quarter(s) {absent}; the tiles hold {have}")


def select_rows(
    tiles: pd.DataFrame, service: str | None, wanted: Sequence[tuple[int, int]] | None
) -> tuple[np.ndarray, set[str], set[Quarter]]:
    """The rows of ``service`` (all if ``None``) in the ``wanted`` quarters (all if ``None``).

    Args:
        tiles: normalised tile rows (``service``, ``year``, ``quarter`` columns).

    Returns:
        ``(mask, services, quarters)``: the ``(n,)`` bool mask of the rows chosen, the services
        of all rows, and the quarters of the rows of ``service``: what
        :func:`check_selection` checks.
    """
    chosen = np.ones(len(tiles), dtype=bool)
    if service is not None:
        chosen = (tiles["service"] == service).to_numpy(dtype=bool)
    period = Quarter.index_of(tiles["year"].to_numpy(dtype=np.int64), tiles["quarter"].to_numpy(dtype=np.int64))
    quarters = {Quarter.of_index(index) for index in np.unique(period[chosen])}
    if wanted is not None:
        chosen &= np.isin(period, [Quarter(y, q).index for y, q in wanted])
    return chosen, set(pd.unique(tiles["service"])), quarters


@dataclass
class _Selection:
    """What is kept (the rows of a service and quarters inside a region), and the tallies
    that :func:`scan_tiles` reports: rows dropped by reason, services and quarters seen."""

    inside: Callable[[np.ndarray], np.ndarray]
    service: str | None
    wanted: Sequence[tuple[int, int]] | None
    drop_incomplete: bool
    dropped: dict[str, int] = field(
        default_factory=lambda: {"incomplete_quarter": 0, **dict.fromkeys(DROP_REASONS, 0), "outside_region": 0}
    )
    services: set[str] = field(default_factory=set)
    quarters: set[Quarter] = field(default_factory=set)

    def keep(self, frame: pd.DataFrame, invalid: dict[str, np.ndarray]) -> np.ndarray:
        """The ``(n,)`` mask of the rows of ``frame`` (from :func:`tile_columns`) to keep, counted."""
        valid = ~np.logical_or.reduce(list(invalid.values()))
        for reason, mask in invalid.items():
            self.dropped[reason] += int(mask.sum())
        if "quarter_incomplete" in frame.columns and self.drop_incomplete:
            incomplete = valid & frame["quarter_incomplete"].to_numpy(dtype=bool)
            self.dropped["incomplete_quarter"] += int(incomplete.sum())
            valid &= ~incomplete
        keys = frame.loc[valid, ["service", "year", "quarter"]]
        chosen, services, quarters = select_rows(keys, self.service, self.wanted)
        self.services |= services
        self.quarters |= quarters
        rows = np.flatnonzero(valid)[chosen]
        inside = self.inside(frame[["tile_x", "tile_y"]].to_numpy()[rows])
        self.dropped["outside_region"] += int((~inside).sum())
        keep = np.zeros(len(frame), dtype=bool)
        keep[rows[inside]] = True
        return keep


class _DistinctKeys:
    """The distinct :data:`~geodbk.ingest.validation.KEY_COLUMNS` keys of one file's valid rows,
    batch by batch: by (year, quarter, service, zoom), the sorted int64 codes ``x << 31 | y`` of
    their quadkeys' tiles (a quadkey has at most 31 digits, so x and y fit in 31 bits each)."""

    def __init__(self) -> None:
        self.codes: dict[Hashable, np.ndarray] = {}

    def add(self, keys: pd.DataFrame) -> None:
        """Take the keys of one batch's valid rows (a frame with the key columns, (n, 4)).

        Raises:
            InputDataError: a key repeated within the batch or seen in an earlier one
                (:func:`~geodbk.ingest.validation.check_duplicates`'s message, counting the
                batch's rows that repeat a key read before them).
        """
        x, y, zoom = quadkey_to_tile(keys["quadkey"])
        code = (x << 31) | y
        parts = keys[["year", "quarter", "service"]].assign(zoom=zoom)
        merged: dict[Hashable, np.ndarray] = {}
        earlier = np.zeros(len(keys), dtype=bool)
        repeated = False
        for part, rows in parts.groupby(list(parts.columns), sort=False).indices.items():
            seen = self.codes.get(part, np.empty(0, dtype=np.int64))
            batch = np.sort(code[rows])
            repeated |= bool((batch[1:] == batch[:-1]).any())
            at = np.searchsorted(seen, batch)
            known = at < len(seen)
            known[known] = seen[at[known]] == batch[known]
            earlier[rows] = np.isin(code[rows], batch[known])
            merged[part] = np.insert(seen, at, batch)
        if repeated or earlier.any():  # the earlier rows, then this batch's: check_duplicates raises
            check_duplicates(pd.concat([keys[earlier].drop_duplicates(list(KEY_COLUMNS)), keys], ignore_index=True))
        self.codes.update(merged)


def _open_parquet(path: Path) -> pq.ParquetFile | None:
    """``path`` as a pyarrow ParquetFile if it is plain Parquet (streamed), ``None`` if it is
    another format or GeoParquet (read whole)."""
    if format_of(path) != "Parquet":
        return None
    check_head(read_head(path), "Parquet", f"tile file {path}")
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _unreadable(path, err) from err
    metadata = file.schema_arrow.metadata or {}
    return None if b"geo" in metadata else file


def _unreadable(path: Path, err: Exception) -> InputDataError:
    return InputDataError(f"cannot read Parquet file {path}: {err}")


def _batches(file: pq.ParquetFile, columns: list[str], batch_rows: int, path: Path) -> Iterator[pd.DataFrame]:
    """The ``columns`` of ``file`` as pandas frames of at most ``batch_rows`` rows, in file order."""
    try:
        if file.metadata.num_rows == 0:
            yield file.schema_arrow.empty_table().select(columns).to_pandas()
        for batch in file.iter_batches(batch_size=batch_rows, columns=columns):
            yield batch.to_pandas()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _unreadable(path, err) from err


def _kept_strings(file: pq.ParquetFile, column: str, rows: np.ndarray, batch_rows: int, path: Path) -> np.ndarray:
    """The values of ``column`` at the file's row numbers ``rows`` (increasing), as an object
    array, reading only the row groups that hold them, a batch at a time."""
    sizes = [file.metadata.row_group(i).num_rows for i in range(file.num_row_groups)]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    group_of = np.searchsorted(starts, rows, side="right") - 1
    parts = []
    try:
        for group in np.unique(group_of):
            offset = starts[group]
            wanted = rows[group_of == group]
            for batch in file.iter_batches(batch_size=batch_rows, row_groups=[int(group)], columns=[column]):
                here = wanted[(wanted >= offset) & (wanted < offset + batch.num_rows)] - offset
                parts.append(batch.column(0).take(pa.array(here)))
                offset += batch.num_rows
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _unreadable(path, err) from err
    if not parts:
        return np.empty(0, dtype=object)
    return pa.chunked_array(parts).to_numpy(zero_copy_only=False)


def _scan_parquet(
    file: pq.ParquetFile, path: Path, label: str, selection: _Selection, keys: _Keys, batch_rows: int
) -> gpd.GeoDataFrame:
    """The kept rows of one plain Parquet file, streamed (see the module docstring)."""
    names = file.schema_arrow.names
    check_columns(names, label)
    columns = [c for c in READ_COLUMNS if c in names]
    kept, rows, start = [], [], 0
    distinct = _DistinctKeys()
    for raw in _batches(file, columns, batch_rows, path):
        frame, invalid = tile_columns(raw, name=label, **keys)
        valid = ~np.logical_or.reduce(list(invalid.values()))
        distinct.add(frame.loc[valid, list(KEY_COLUMNS)])
        keep = selection.keep(frame, invalid)
        kept.append(frame[keep])
        rows.append(start + np.flatnonzero(keep))
        start += len(raw)
    frame = pd.concat(kept, ignore_index=True)
    raw_kept = pd.DataFrame(index=frame.index)
    if "tile" in names:
        raw_kept["tile"] = _kept_strings(file, "tile", np.concatenate(rows), batch_rows, path)
    geometry = tile_geometry(raw_kept, frame["quadkey"].to_numpy(dtype=object), label)
    return gpd.GeoDataFrame(frame, geometry=geometry, crs=4326)


def _scan_whole(
    path: Path, source: str | Path, selection: _Selection, keys: _Keys
) -> Iterable[gpd.GeoDataFrame]:
    """The kept rows of each table of a file read whole (GeoParquet, GeoJSON, shapefiles)."""
    for raw, name in read_raw(path):
        label = name if not is_url(source) else f"{source}/{Path(name).name}"
        frame, invalid = tile_columns(raw, name=label, **keys)
        check_duplicates(frame[~np.logical_or.reduce(list(invalid.values()))])
        keep = selection.keep(frame, invalid)
        raw_kept = raw.iloc[np.flatnonzero(keep)]
        geometry = tile_geometry(raw_kept, frame.loc[keep, "quadkey"].to_numpy(dtype=object), label)
        yield gpd.GeoDataFrame(frame[keep].reset_index(drop=True), geometry=geometry, crs=4326)


def scan_tiles(
    source: str | Path | Sequence[str | Path],
    region: Region,
    *,
    buffer_deg: float = DEFAULT_BUFFER_DEG,
    service: str | None = None,
    quarters: Sequence[tuple[int, int]] | None = None,
    year: int | None = None,
    quarter: int | None = None,
    cache_dir: str | Path | None = None,
    drop_incomplete: bool = True,
    batch_rows: int = BATCH_ROWS,
) -> gpd.GeoDataFrame:
    """Read the tiles of one region, service and set of quarters from files or URLs, streaming.

    Args:
        source: what :func:`geodbk.ingest.ookla.read_tiles` reads: a path or http(s) URL, or
            a sequence of them; ``"mobile:2023Q4"`` or ``"fixed:2023Q4"`` is Ookla's global file of
            that service and quarter (:func:`~geodbk.ingest.names.ookla_source`).
        region: the study region; a tile is kept when its centre lies inside the region
            polygon grown by ``buffer_deg`` degrees.
        service: keep this service (``None``: the tiles must hold one); also the service of
            files that do not say.
        quarters: keep these ``(year, quarter)`` (``None``: all).
        year, quarter: the quarter of files that carry it neither as columns nor in their name.
        cache_dir: download cache for URLs.
        drop_incomplete: drop rows flagged ``quarter_incomplete``.
        batch_rows: rows of a Parquet file read at once.

    Returns:
        The kept tiles as :func:`~geodbk.ingest.ookla.read_tiles` normalises them (columns
        :data:`~geodbk.ingest.ookla.TILE_COLUMNS`, and the loaded latency when any source has
        it), in file and row order. ``attrs["dropped"]`` counts ``"incomplete_quarter"``, the
        reasons of :data:`~geodbk.ingest.validation.DROP_REASONS` (over every row read) and
        ``"outside_region"`` (rows of the service and quarters outside the region); invalid
        rows also give one :class:`~geodbk.errors.DroppedRowsWarning`.

    Raises:
        InputDataError: what :func:`~geodbk.ingest.ookla.read_tiles` raises, and what
            :func:`check_selection` raises.
        RegionError: no tile lies inside the region.
        DownloadError: a URL cannot be fetched.
    """
    sources = ookla_sources(source)
    if not sources:
        raise InputDataError("no tile sources given")
    selection = _Selection(region_test(region, buffer_deg=buffer_deg), service, quarters, drop_incomplete)
    keys = _Keys(year=year, quarter=quarter, service=service)
    parts: list[gpd.GeoDataFrame] = []
    for src in sources:
        path = checked_path(local_path(src, cache_dir), "tile")
        file = _open_parquet(path)
        if file is None:
            parts.extend(_scan_whole(path, src, selection, keys))
            continue
        label = str(path) if not is_url(src) else f"{src}/{path.name}"
        parts.append(_scan_parquet(file, path, label, selection, keys, batch_rows))
    tiles = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    check_duplicates(tiles)
    counts = {reason: selection.dropped[reason] for reason in DROP_REASONS}
    warn_dropped(counts)
    check_selection(selection.services, selection.quarters, service, quarters)
    check_any_inside(len(tiles), region)
    tiles = gpd.GeoDataFrame(tiles[list(tile_column_order(tiles.columns))], geometry="geometry", crs=4326)
    tiles.attrs["dropped"] = dict(selection.dropped)
    return tiles


__all__ = ["BATCH_ROWS", "check_selection", "scan_tiles", "select_rows"]
