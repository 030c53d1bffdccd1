"""Read Ookla open-data speed-test tiles into one normalised GeoDataFrame.

Sources: Ookla's own quarterly files (Parquet with a WKT ``tile`` column, or zipped
shapefiles), GeoJSON (plain or several inside a zip, as published by downstream projects),
and the Parquet sample shipped in ``data/`` (which adds region, service, year, quarter and
``quarter_incomplete`` columns). A source may be a local path or an http(s) URL; URLs are
downloaded once into a cache folder (:mod:`geodbk.ingest.sources`).

Normalised columns (:data:`TILE_COLUMNS`): ``quadkey`` (str), ``year`` (int16), ``quarter``
(int16), ``service`` (str), ``avg_d_kbps``, ``avg_u_kbps`` (kbit/s), ``avg_lat_ms`` (ms) as
float64 so that a missing value stays NaN, ``tests``, ``devices`` (int64), ``tile_x``,
``tile_y`` (float64, the tile centre's lon and lat in degrees, always computed from the
quadkey) and ``geometry`` = tile polygon in EPSG:4326. Null, empty or missing geometries are
rebuilt from the quadkey.

Ookla's schema grew over time, and every version is read:

* ``avg_lat_down_ms``, ``avg_lat_up_ms`` (:data:`LOADED_LATENCY_COLUMNS`): latency under
  load during the download and upload phases, ms. Ookla added them with the 2022Q4 files,
  in Parquet only, and leaves them null where no test in the tile measured them. They are
  kept when a file has them, as float64 with NaN for null (and for empty strings, which
  text conversions write for null); a negative or non-numeric value is an error. Files
  without them (older quarters, shapefiles, the shipped sample) give frames without the
  columns, and several files read together give NaN for the rows of the older ones.
* ``tile_x``, ``tile_y``: the tile centre, added to Ookla's files with 2023Q3. Files
  without them get the centre from the quadkey; files with them are checked: a point that
  lies outside its quadkey's tile is an error (a mislabelled column), and the output holds
  the exact quadkey centre either way (Ookla's values are rounded).

Validation: the rules of :mod:`geodbk.ingest.validation` (which files are refused, which rows
dropped and counted), applied to every row read.

Two readers share the rules and the normalisation (:func:`tile_columns`, :func:`tile_geometry`):
:func:`read_tiles` reads whole files into memory (any region), and
:func:`geodbk.ingest.scan.scan_tiles` streams Ookla's global Parquet files one batch at a time
and keeps one region's rows (what :func:`geodbk.dataset.spatial_dataset.build_dataset` uses).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from geodbk.errors import InputDataError
from geodbk.ingest.formats import check_head, format_of, read_head
from geodbk.ingest.names import OOKLA_BUCKET_URL, SERVICES, ookla_sources, ookla_url, parse_quarter, parse_service
from geodbk.ingest.quadkey import bounds_centres, quadkey_polygons, quadkey_to_tile, tile_bounds
from geodbk.ingest.sources import is_url, local_path
from geodbk.ingest.validation import (
    DROP_REASONS,
    FIRST_QUARTER,
    MAX_LATENCY_MS,
    MAX_SPEED_KBPS,
    MAX_TESTS,
    check_duplicates,
    check_published,
    current_quarter,
    invalid_rows,
    warn_dropped,
)
from geodbk.ingest.vectorfiles import checked_path, read_vector_layers

#: Ookla's value columns, present in every Ookla file.
VALUE_COLUMNS = ("avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices")
#: Ookla's loaded-latency columns (ms), in Parquet files from 2022Q4 on; kept when present.
LOADED_LATENCY_COLUMNS = ("avg_lat_down_ms", "avg_lat_up_ms")
#: Tile centre columns (lon, lat degrees), in Ookla's files from 2023Q3 on; always in the output.
CENTRE_COLUMNS = ("tile_x", "tile_y")
#: Columns of every normalised tiles frame, in order; present loaded-latency columns go
#: between ``tile_y`` and ``geometry``.
TILE_COLUMNS = ("quadkey", "year", "quarter", "service", *VALUE_COLUMNS, *CENTRE_COLUMNS, "geometry")
#: The columns of a raw table that :func:`tile_columns` reads (those present); geometry is apart.
READ_COLUMNS = ("quadkey", "year", "quarter", "service", *VALUE_COLUMNS, *CENTRE_COLUMNS,
                *LOADED_LATENCY_COLUMNS, "quarter_incomplete")

def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        schema = pq.read_schema(path)
        if schema.metadata and b"geo" in schema.metadata:
            return gpd.read_parquet(path)
        return pd.read_parquet(path)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise InputDataError(f"cannot read Parquet file {path}: {err}") from err


def read_raw(path: Path) -> list[tuple[pd.DataFrame, str]]:
    """Read one local file into raw frames, each with the name its quarter is parsed from
    (Parquet with pyarrow; the vector formats through :mod:`geodbk.ingest.vectorfiles`).

    Raises:
        InputDataError: the file is missing, of another format than its suffix, or unreadable.
    """
    path = checked_path(path, "tile")
    if format_of(path) == "Parquet":
        check_head(read_head(path), "Parquet", f"tile file {path}")
        return [(_read_parquet(path), str(path))]
    return [(frame, name) for name, frame in read_vector_layers(path, "tile")]


def tile_geometry(raw: pd.DataFrame, quadkeys: np.ndarray, name: str) -> np.ndarray:
    """Tile polygons in EPSG:4326: the file's own where present, else rebuilt from quadkeys.

    Args:
        raw: the raw rows: a GeoDataFrame (its geometry is used), or a frame whose ``tile``
            column, if any, holds WKT polygons.
        quadkeys: ``(n,)`` object array of the rows' quadkeys.
        name: the file, for messages.

    Returns:
        ``(n,)`` object array of shapely polygons.

    Raises:
        InputDataError: geometries without a CRS, or invalid WKT.
    """
    if isinstance(raw, gpd.GeoDataFrame) and raw.geometry.name in raw.columns:
        geoms = raw.geometry
        if geoms.crs is None and geoms.notna().any():
            raise InputDataError(
                f"{name} has tile geometries but no CRS; geodbk will not guess one. "
                "Set or reproject to EPSG:4326, or drop the geometry (polygons are rebuilt from quadkeys)"
            )
        if geoms.crs is not None and not geoms.crs.equals("EPSG:4326"):
            geoms = geoms.to_crs(4326)
        geoms = np.asarray(geoms.array, dtype=object)
    elif "tile" in raw.columns:
        tile = raw["tile"].to_numpy(dtype=object)
        codes, uniques = pd.factorize(tile)
        try:
            parsed = shapely.from_wkt(np.asarray(uniques, dtype=object))
        except shapely.errors.GEOSException as err:
            raise InputDataError(f"the 'tile' column holds invalid WKT: {err}") from err
        geoms = np.where(codes >= 0, parsed[np.maximum(codes, 0)], None)
    else:
        geoms = np.full(len(raw), None, dtype=object)
    missing = shapely.is_missing(geoms) | shapely.is_empty(geoms)
    if missing.any():
        codes, uniques = pd.factorize(quadkeys[missing])
        geoms = geoms.copy()
        geoms[missing] = quadkey_polygons(np.asarray(uniques, dtype=object))[codes]
    return geoms


def _key_column(raw: pd.DataFrame, column: str, given: object, from_name: object, label: str) -> np.ndarray:
    if column in raw.columns:
        values = raw[column]
        if values.isna().any():
            raise InputDataError(f"{label}: {int(values.isna().sum())} row(s) have no {column}")
        return values.to_numpy()
    value = given if given is not None else from_name
    if value is None:
        hint = "year= and quarter=" if column in ("year", "quarter") else f"{column}="
        raise InputDataError(
            f"{label}: no {column!r} column and the file name does not say the {column} "
            f"(like ..._2023Q4 or 2023-10-01_performance_mobile_...); pass {hint}"
        )
    return np.full(len(raw), value)


def _loaded_latency(values: pd.Series, column: str, name: str) -> np.ndarray:
    """One loaded-latency column as a float64 ``(n,)`` array in ms, NaN where Ookla left it null.

    Empty or blank strings (what text conversions write for null) are NaN too.

    Raises:
        InputDataError: a value is neither blank nor a number, or is negative or infinite.
    """
    if pd.api.types.is_numeric_dtype(values.dtype):
        latency = values.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        text = values.astype("string").str.strip()
        blank = (text.isna() | (text == "")).to_numpy(dtype=bool)
        numeric = pd.to_numeric(text.mask(blank), errors="coerce")
        unreadable = numeric.isna().to_numpy(dtype=bool) & ~blank
        if unreadable.any():
            example = values.to_numpy()[np.flatnonzero(unreadable)[0]]
            raise InputDataError(
                f"{name}: {column} has {int(unreadable.sum())} value(s) that are not numbers, e.g. {example!r}"
            )
        latency = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    invalid = ~np.isnan(latency) & ~(np.isfinite(latency) & (latency >= 0))
    if invalid.any():
        raise InputDataError(
            f"{name}: {column} has {int(invalid.sum())} negative or infinite value(s), e.g. "
            f"{latency[invalid][0]:g}; a latency is >= 0 ms and a missing one is null"
        )
    return latency


def _tile_centres(raw: pd.DataFrame, bounds: np.ndarray, quadkeys: pd.Series, name: str) -> np.ndarray:
    """``(n, 2)`` tile centres (lon, lat degrees) of the rows: the centres of their quadkeys' tiles.

    Args:
        raw: the raw table; its own ``tile_x``/``tile_y``, if any, are checked.
        bounds: ``(n, 4)`` bounds of each row's quadkey tile; ``quadkeys``: ``(n,)`` the quadkeys.

    Raises:
        InputDataError: a row's own ``tile_x``/``tile_y`` lies outside its quadkey's tile.
    """
    centres = bounds_centres(bounds)
    if not set(CENTRE_COLUMNS) <= set(raw.columns):
        return centres
    given = np.column_stack([pd.to_numeric(raw[c], errors="coerce").to_numpy(dtype=np.float64) for c in CENTRE_COLUMNS])
    inside = (
        (bounds[:, 0] <= given[:, 0])
        & (given[:, 0] <= bounds[:, 2])
        & (bounds[:, 1] <= given[:, 1])
        & (given[:, 1] <= bounds[:, 3])
    )
    outside = ~np.isnan(given).any(axis=1) & ~inside
    if outside.any():
        row = np.flatnonzero(outside)[0]
        raise InputDataError(
            f"{name}: {int(outside.sum())} row(s) have tile_x/tile_y outside their quadkey's tile, e.g. "
            f"quadkey {quadkeys.iloc[row]} at ({given[row, 0]:g}, {given[row, 1]:g})"
        )
    return centres


def check_columns(columns: Iterable[str], name: str) -> None:
    """Refuse a table without ``quadkey`` and :data:`VALUE_COLUMNS`, naming what it has.

    Raises:
        InputDataError: a column is missing.
    """
    columns = list(columns)
    missing = [c for c in ("quadkey", *VALUE_COLUMNS) if c not in columns]
    if missing:
        raise InputDataError(f"{name}: missing column(s) {missing}; found {columns}")


def tile_columns(
    raw: pd.DataFrame,
    *,
    year: int | None = None,
    quarter: int | None = None,
    service: str | None = None,
    name: str = "tiles",
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Check every row of one raw Ookla table and give its normalised columns, without polygons.

    ``year``/``quarter``/``service`` fill in what the table lacks as columns; if still
    unknown they are parsed from ``name``.

    Returns:
        ``(frame, invalid)``: ``frame`` has one row per row of ``raw`` (invalid ones included)
        with :data:`TILE_COLUMNS` but ``geometry``, those of :data:`LOADED_LATENCY_COLUMNS`
        that ``raw`` has (float64 ms, NaN where missing), and ``quarter_incomplete`` when
        ``raw`` has it; ``invalid`` maps each reason of
        :data:`~geodbk.ingest.validation.DROP_REASONS` to an ``(n,)`` bool mask of the rows to
        drop (:func:`~geodbk.ingest.validation.invalid_rows`); their tests and devices are 0.

    Raises:
        InputDataError: missing columns, missing or invalid quadkeys, unknown or unpublished
            quarter or service, a tile centre outside its tile, or a bad loaded latency.
    """
    check_columns(raw.columns, name)
    if raw["quadkey"].isna().any():
        raise InputDataError(f"{name}: {int(raw['quadkey'].isna().sum())} row(s) have no quadkey")
    quadkeys = raw["quadkey"].astype(str)
    bounds = tile_bounds(*quadkey_to_tile(quadkeys))  # validates the digits
    parsed = parse_quarter(name) or (None, None)
    years = _key_column(raw, "year", year, parsed[0], name)
    quarters = _key_column(raw, "quarter", quarter, parsed[1], name)
    services = _key_column(raw, "service", service, parse_service(name), name)
    bad = sorted(set(pd.unique(services)) - set(SERVICES))
    if bad:
        raise InputDataError(f"{name}: unknown service(s) {bad}; expected {SERVICES}")
    if not set(pd.unique(quarters)) <= {1, 2, 3, 4}:
        raise InputDataError(f"{name}: quarter values must be 1-4")
    check_published(years, quarters, name)
    values = {col: pd.to_numeric(raw[col], errors="coerce").to_numpy(dtype=np.float64) for col in VALUE_COLUMNS}
    invalid = invalid_rows(values)
    keep = ~np.logical_or.reduce(list(invalid.values()))
    for col in ("tests", "devices"):  # whole numbers in range where kept (invalid_rows checked them)
        values[col] = np.where(keep, np.nan_to_num(values[col]), 0).astype(np.int64)
    centres = _tile_centres(raw, bounds, quadkeys, name)
    loaded = {col: _loaded_latency(raw[col], col, name) for col in LOADED_LATENCY_COLUMNS if col in raw.columns}
    frame = pd.DataFrame(
        {
            "quadkey": quadkeys.array,
            "year": np.asarray(years, dtype=np.int16),
            "quarter": np.asarray(quarters, dtype=np.int16),
            "service": pd.array(np.asarray(services, dtype=object), dtype="str"),
            **values,
            "tile_x": centres[:, 0],
            "tile_y": centres[:, 1],
            **loaded,
        }
    )
    if "quarter_incomplete" in raw.columns:
        frame["quarter_incomplete"] = raw["quarter_incomplete"].fillna(False).to_numpy(dtype=bool)
    return frame, invalid


def normalise_tiles(
    raw: pd.DataFrame,
    *,
    year: int | None = None,
    quarter: int | None = None,
    service: str | None = None,
    name: str = "tiles",
) -> gpd.GeoDataFrame:
    """Turn one raw Ookla table into the normalised tiles frame (see the module docstring).

    Arguments as for :func:`tile_columns`.

    Returns:
        The rows of ``raw`` that pass :func:`~geodbk.ingest.validation.invalid_rows`, with
        :data:`TILE_COLUMNS`, plus those of :data:`LOADED_LATENCY_COLUMNS` that ``raw`` has
        (float64 ms, NaN where missing) before ``geometry``; ``attrs["dropped"]`` counts the
        others by reason.

    Raises:
        InputDataError: as :func:`tile_columns`, and geometries without a CRS.
    """
    frame, invalid = tile_columns(raw, year=year, quarter=quarter, service=service, name=name)
    quadkeys = frame["quadkey"].to_numpy(dtype=object)
    tiles = gpd.GeoDataFrame(frame, geometry=tile_geometry(raw, quadkeys, name), crs=4326)
    tiles = tiles[~np.logical_or.reduce(list(invalid.values()))].reset_index(drop=True)
    tiles.attrs["dropped"] = {reason: int(mask.sum()) for reason, mask in invalid.items()}
    return tiles


def read_tiles(
    source: str | Path | Sequence[str | Path],
    *,
    year: int | None = None,
    quarter: int | None = None,
    service: str | None = None,
    cache_dir: str | Path | None = None,
    drop_incomplete: bool = True,
) -> gpd.GeoDataFrame:
    """Read Ookla tiles from a file, a URL, or a list of them.

    Args:
        source: path or http(s) URL of a Parquet/GeoParquet file, a GeoJSON file, a shapefile,
            or a zip with a shapefile or GeoJSON files; ``"mobile:2023Q4"`` for Ookla's global
            file of a quarter (:func:`~geodbk.ingest.names.ookla_source`); or a sequence of these.
        year, quarter: the quarter of files that carry it neither as columns nor in
            their name (``..._2023Q4.geojson``, ``2023-10-01_performance_...``).
        service: ``"mobile"`` or ``"fixed"`` for files that do not say.
        cache_dir: download cache for URLs (default :data:`geodbk.paths.CACHE_DIR`).
        drop_incomplete: drop rows flagged ``quarter_incomplete`` (the truncated 2020Q2
            of the shipped sample).

    Returns:
        Normalised tiles (columns :data:`TILE_COLUMNS`, EPSG:4326), one row per (tile,
        quarter), plus :data:`LOADED_LATENCY_COLUMNS` (float64 ms) when any source has
        them; rows from sources without them hold NaN there. ``attrs["dropped"]`` maps
        ``"incomplete_quarter"`` and the reasons of :data:`DROP_REASONS` to the number of
        rows dropped for each; invalid rows also give one :class:`DroppedRowsWarning`.

    Raises:
        InputDataError: unreadable or corrupt file, missing columns, unknown or unpublished
            quarter, duplicate rows (see the module docstring).
        DownloadError: a URL cannot be fetched.
    """
    sources: Iterable = ookla_sources(source)
    frames = []
    for src in sources:
        for raw, name in read_raw(local_path(src, cache_dir)):
            label = name if not is_url(src) else f"{src}/{Path(name).name}"
            frames.append(normalise_tiles(raw, year=year, quarter=quarter, service=service, name=label))
    if not frames:
        raise InputDataError("no tile sources given")
    counts = {reason: sum(f.attrs["dropped"][reason] for f in frames) for reason in DROP_REASONS}
    tiles = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return _finish(tiles, drop_incomplete, counts)


def _finish(tiles: pd.DataFrame, drop: bool, counts: dict[str, int]) -> gpd.GeoDataFrame:
    """Refuse duplicate (quadkey, year, quarter, service) rows, drop (if ``drop``) and count the
    ``quarter_incomplete`` rows, remove that flag, put the columns in :data:`TILE_COLUMNS` order
    with the loaded latency before ``geometry``, and warn once about the rows dropped as invalid
    (``counts``, by reason of :data:`~geodbk.ingest.validation.DROP_REASONS`)."""
    check_duplicates(tiles)
    n_incomplete = 0
    if "quarter_incomplete" in tiles.columns:
        flag = tiles["quarter_incomplete"].to_numpy(dtype=bool)
        if drop:
            n_incomplete = int(flag.sum())
            tiles = tiles[~flag]
        tiles = tiles.drop(columns="quarter_incomplete").reset_index(drop=True)
    tiles = gpd.GeoDataFrame(tiles[list(tile_column_order(tiles.columns))], geometry="geometry", crs=4326)
    warn_dropped(counts, stacklevel=3)
    tiles.attrs["dropped"] = {"incomplete_quarter": n_incomplete, **counts}
    return tiles


def tile_column_order(columns: Iterable[str]) -> tuple[str, ...]:
    """The columns of a normalised tiles frame in order: :data:`TILE_COLUMNS` with those of
    :data:`LOADED_LATENCY_COLUMNS` among ``columns`` before ``geometry``."""
    loaded = [c for c in LOADED_LATENCY_COLUMNS if c in set(columns)]
    return (*TILE_COLUMNS[:-1], *loaded, "geometry")


def as_tiles(
    frame: pd.DataFrame, *, service: str | None = None, drop_incomplete: bool = True, name: str = "tiles"
) -> gpd.GeoDataFrame:
    """Normalise an in-memory table of tiles (raw Ookla columns or already normalised).

    Same checks and output as :func:`read_tiles`; rows already dropped (``attrs["dropped"]``)
    stay counted.
    """
    before = dict(frame.attrs.get("dropped", {}))
    normalised = normalise_tiles(frame, service=service, name=name)
    tiles = _finish(normalised, drop_incomplete, normalised.attrs["dropped"])
    tiles.attrs["dropped"] = {
        k: before.get(k, 0) + tiles.attrs["dropped"].get(k, 0) for k in {*before, *tiles.attrs["dropped"]}
    }
    return tiles


#: The names of :mod:`geodbk.ingest.names` and :mod:`geodbk.ingest.validation` stay importable
#: from here, where they lived before those modules were split off.
__all__ = [
    "CENTRE_COLUMNS",
    "DROP_REASONS",
    "FIRST_QUARTER",
    "LOADED_LATENCY_COLUMNS",
    "MAX_LATENCY_MS",
    "MAX_SPEED_KBPS",
    "MAX_TESTS",
    "OOKLA_BUCKET_URL",
    "SERVICES",
    "TILE_COLUMNS",
    "VALUE_COLUMNS",
    "READ_COLUMNS",
    "as_tiles",
    "check_columns",
    "check_published",
    "current_quarter",
    "invalid_rows",
    "normalise_tiles",
    "ookla_url",
    "parse_quarter",
    "parse_service",
    "read_raw",
    "read_tiles",
    "tile_column_order",
    "tile_columns",
    "tile_geometry",
]
