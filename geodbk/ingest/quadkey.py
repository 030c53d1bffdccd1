"""Bing Maps tile system maths: quadkeys, tile x/y, bounds, polygons and centres.

Ookla's open-data tiles are zoom-16 Web Mercator tiles named by their Bing quadkey: one
base-4 digit per zoom level, digit ``d = 2 * bit(y) + bit(x)`` from the most significant
bit down. Tile ``(x, y)`` at zoom ``z`` spans longitudes ``360 * [x, x + 1] / 2**z - 180``
and the latitudes whose Mercator ``y`` lies in ``[y, y + 1] / 2**z`` (``y`` grows
southwards). All functions are vectorised over numpy arrays; angles are in degrees
(EPSG:4326).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import shapely

from geodbk.errors import InputDataError

#: Zoom level of Ookla's open-data tiles (about 610 m at the equator).
OOKLA_ZOOM = 16
#: Web Mercator's latitude limit, degrees.
MAX_LATITUDE = 85.05112878


def _as_arrow(quadkeys: str | Iterable[str]) -> pa.LargeStringArray:
    """Quadkeys as one flat Arrow string array of ``n`` values (one string -> n = 1); Arrow-backed
    pandas strings and Arrow arrays are taken without a copy of their characters.

    Raises:
        InputDataError: a quadkey is missing or not a string.
    """
    if isinstance(quadkeys, str):
        quadkeys = [quadkeys]
    if isinstance(quadkeys, (pa.Array, pa.ChunkedArray)):
        arr = quadkeys
    elif isinstance(quadkeys, (pd.Series, pd.Index)) and isinstance(quadkeys.dtype, pd.StringDtype):
        arr = pa.array(quadkeys.array)  # Arrow's own, chunked
    else:
        values = np.asarray(quadkeys if isinstance(quadkeys, np.ndarray) else list(quadkeys), dtype=object)
        values = values.reshape(-1)
        try:
            arr = pa.array(values, type=pa.large_string(), from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            bad = sum(not isinstance(q, str) for q in values)
            raise InputDataError(f"{bad} quadkey(s) are missing or not strings") from None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise InputDataError(f"quadkeys must be strings, got {arr.type}")
    if arr.null_count:
        raise InputDataError(f"{arr.null_count} quadkey(s) are missing or not strings")
    return arr.cast(pa.large_string())


def quadkey_to_tile(quadkeys: str | Iterable[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tile column ``x``, row ``y`` and zoom of each quadkey.

    The digits are read straight from the strings' bytes (through Arrow), one zoom level at a
    time for all quadkeys: no Python object per quadkey.

    Args:
        quadkeys: one quadkey or a sequence of ``n`` quadkeys (strings of digits 0-3): a list,
            a numpy or pandas array, or an Arrow string array.

    Returns:
        ``(x, y, zoom)``, three int64 arrays of shape ``(n,)``.

    Raises:
        InputDataError: a quadkey is missing, empty, longer than 31 digits or has a digit
            other than 0-3.
    """
    arr = _as_arrow(quadkeys)
    n = len(arr)
    x = np.zeros(n, dtype=np.int64)
    y = np.zeros(n, dtype=np.int64)
    if n == 0:
        return x, y, np.zeros(0, dtype=np.int64)
    _, offsets, data = arr.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int64)[arr.offset : arr.offset + n + 1]
    zoom = np.diff(offsets)  # bytes: a digit is one byte, and any longer character is not a digit
    if zoom.min() < 1 or zoom.max() > 31:
        raise InputDataError("quadkeys must have 1 to 31 digits")
    data = np.frombuffer(data, dtype=np.uint8)
    for j in range(int(zoom.max())):  # one digit (zoom level) at a time, most significant first
        within = j < zoom
        digit = data[np.where(within, offsets[:-1] + j, 0)].astype(np.int64) - ord("0")
        wrong = within & ((digit < 0) | (digit > 3))
        if wrong.any():
            raise InputDataError(f"invalid quadkey {arr[int(np.flatnonzero(wrong)[0])].as_py()!r}: digits must be 0-3")
        x = np.where(within, (x << 1) | (digit & 1), x)
        y = np.where(within, (y << 1) | (digit >> 1), y)
    return x, y, zoom


def tile_to_quadkey(x: np.ndarray | int, y: np.ndarray | int, zoom: int = OOKLA_ZOOM) -> np.ndarray:
    """Quadkeys of tiles ``(x, y)`` at ``zoom``; returns an object array of ``n`` strings."""
    x = np.atleast_1d(np.asarray(x, dtype=np.int64))
    y = np.atleast_1d(np.asarray(y, dtype=np.int64))
    size = 1 << zoom
    if ((x < 0) | (x >= size) | (y < 0) | (y >= size)).any():
        raise InputDataError(f"tile x/y outside 0..{size - 1} at zoom {zoom}")
    shifts = np.arange(zoom - 1, -1, -1, dtype=np.int64)
    digits = ((x[:, None] >> shifts) & 1) + 2 * ((y[:, None] >> shifts) & 1)
    chars = (digits + ord("0")).astype(np.uint8)
    return np.array([row.tobytes().decode("ascii") for row in chars], dtype=object)


def _tile_lat(y: np.ndarray, zoom: np.ndarray) -> np.ndarray:
    n = np.pi * (1.0 - 2.0 * y / np.exp2(zoom))
    return np.degrees(np.arctan(np.sinh(n)))


def tile_bounds(x: np.ndarray, y: np.ndarray, zoom: np.ndarray | int) -> np.ndarray:
    """Bounds of tiles as an ``(n, 4)`` float64 array of ``west, south, east, north`` degrees."""
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    y = np.atleast_1d(np.asarray(y, dtype=np.float64))
    zoom = np.broadcast_to(np.asarray(zoom, dtype=np.float64), x.shape)
    size = np.exp2(zoom)
    west = x / size * 360.0 - 180.0
    east = (x + 1.0) / size * 360.0 - 180.0
    north = _tile_lat(y, zoom)
    south = _tile_lat(y + 1.0, zoom)
    return np.column_stack([west, south, east, north])


def quadkey_bounds(quadkeys: str | Iterable[str]) -> np.ndarray:
    """``(n, 4)`` array of ``west, south, east, north`` degrees of each quadkey's tile."""
    return tile_bounds(*quadkey_to_tile(quadkeys))


def quadkey_polygons(quadkeys: str | Iterable[str]) -> np.ndarray:
    """Tile polygons (``(n,)`` array of shapely Polygons, EPSG:4326) of the quadkeys."""
    b = quadkey_bounds(quadkeys)
    return shapely.box(b[:, 0], b[:, 1], b[:, 2], b[:, 3])


def bounds_centres(bounds: np.ndarray) -> np.ndarray:
    """``(n, 2)`` tile centres ``(lon, lat)`` of ``(n, 4)`` tile bounds: the midpoint of each side."""
    return np.column_stack([(bounds[:, 0] + bounds[:, 2]) / 2.0, (bounds[:, 1] + bounds[:, 3]) / 2.0])


def quadkey_centres(quadkeys: str | Iterable[str]) -> np.ndarray:
    """``(n, 2)`` array of tile centres ``(lon, lat)``: the midpoint of each tile's bounds."""
    return bounds_centres(quadkey_bounds(quadkeys))


def lonlat_to_tile(
    lon: np.ndarray | float, lat: np.ndarray | float, zoom: int = OOKLA_ZOOM
) -> tuple[np.ndarray, np.ndarray]:
    """Tile ``(x, y)`` at ``zoom`` that contains each point (latitudes clipped to +-85.05...)."""
    lon = np.atleast_1d(np.asarray(lon, dtype=np.float64))
    lat = np.clip(np.atleast_1d(np.asarray(lat, dtype=np.float64)), -MAX_LATITUDE, MAX_LATITUDE)
    if not (np.isfinite(lon).all() and np.isfinite(lat).all()):
        raise InputDataError("lon/lat must be finite")
    size = 1 << zoom
    sin_lat = np.sin(np.radians(lat))
    fx = (lon + 180.0) / 360.0
    fy = 0.5 - np.log((1.0 + sin_lat) / (1.0 - sin_lat)) / (4.0 * np.pi)
    x = np.clip(np.floor(fx * size), 0, size - 1).astype(np.int64)
    y = np.clip(np.floor(fy * size), 0, size - 1).astype(np.int64)
    return x, y


def lonlat_to_quadkey(
    lon: np.ndarray | float, lat: np.ndarray | float, zoom: int = OOKLA_ZOOM
) -> np.ndarray:
    """Quadkey (object array of ``n`` strings) of the zoom-``zoom`` tile holding each point."""
    return tile_to_quadkey(*lonlat_to_tile(lon, lat, zoom), zoom)


#: Distance below which two projected tile centres are the same tile, metres (a zoom-16 tile
#: is 300-600 m wide, so this only absorbs rounding).
SAME_TILE_M = 1.0


def tile_centres(lonlat: np.ndarray, zoom: int = OOKLA_ZOOM) -> np.ndarray:
    """``(n, 2)`` centres ``(lon, lat)`` of the zoom-``zoom`` tiles holding ``lonlat`` (n, 2) degrees."""
    x, y = lonlat_to_tile(lonlat[:, 0], lonlat[:, 1], zoom)
    return bounds_centres(tile_bounds(x, y, zoom))
