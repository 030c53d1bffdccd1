"""Generated Ookla-schema global quarterly tile files: a US-sized set inside a world of tiles.

:func:`write_global_quarters` writes one Parquet file per quarter, named as Ookla names its
global files (``2023-10-01_performance_mobile_tiles.parquet``), with Ookla's global schema:

* ``quadkey`` (zoom-16 Bing quadkey string), ``tile`` (WKT polygon string of the tile, corners
  from :func:`geodbk.ingest.quadkey.tile_bounds`, numbers in their shortest round-trip form);
* ``tile_x``, ``tile_y`` (tile centre lon, lat in degrees, rounded to 4 decimals as Ookla's are),
  from 2023Q3 on, between ``tile`` and the values;
* ``avg_d_kbps``, ``avg_u_kbps``, ``avg_lat_ms`` (int64 kbit/s and ms), then
  ``avg_lat_down_ms``, ``avg_lat_up_ms`` (int32 ms, null in about a fifth of the rows) from
  2022Q4 on, then ``tests``, ``devices`` (int64).

Rows are sorted by quadkey, so that a region's rows sit in a few row groups (the streaming
ingest does not rely on it: it then reads the WKT of fewer row groups), and written in row
groups of :data:`ROW_GROUP_ROWS`; the strings of one row group at a time are in memory.

Where the tiles are. The US part is drawn around :data:`US_CENTRES` (lon, lat, metro population
in millions; 72 metros): 75% of the US tiles fall around a metro chosen with probability
proportional to population, at a distance of ``gamma(1.5) * 20 km * sqrt(population)`` in a
uniform direction, and 25% are a rural background uniform over the contiguous states (the
shipped 2018 Census state polygons). Georgia's metros hold 4% of the population listed and the
state 1.9% of the contiguous area; Georgia gets 3% of the US tiles (20,849 of 700,000 in
2023Q4 at seed 0). The rest of the world is :data:`WORLD_CITIES` random cities (Pareto sizes
up to 20 million, latitudes 45S-65N, none inside the contiguous-US box) drawn the same way.
Each quarter holds a random subset of one population of distinct tiles 1.25 times its size,
so that tiles recur across quarters.

Values: download speed log-normal around 30 Mbit/s times 1.25 per year since 2019 (faster in
cities), upload a quarter of it, latency log-normal around 40 ms, tests ``1 + geometric``,
devices at most the tests. Everything is deterministic for a seed.

Usage: ``python benchmarks/synthetic_ookla.py --out DIR --quarters 2019Q1..2023Q4 --us-tiles N
--world-tiles M``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from geodbk.ingest.boundaries import state_boundaries  # noqa: E402
from geodbk.ingest.quadkey import OOKLA_ZOOM, lonlat_to_tile, tile_bounds  # noqa: E402
from geodbk.quarters import parse_quarter_label  # noqa: E402

#: Rows per Parquet row group (and per block of strings built at once).
ROW_GROUP_ROWS = 262_144
#: Share of the US tiles drawn around metros; the rest is the rural background.
URBAN_SHARE = 0.75
#: Number of random cities the rest of the world's tiles are drawn around.
WORLD_CITIES = 3000
#: Contiguous-US box (west, south, east, north), degrees: no world city lies inside it.
US_BOX = (-125.0, 24.0, -66.5, 49.5)
#: First quarter with tile_x/tile_y, and first with the loaded-latency columns.
CENTRE_FROM, LOADED_LATENCY_FROM = (2023, 3), (2022, 4)
#: US metro centres: (lon, lat, population in millions), rounded.
US_CENTRES = np.array([
    (-74.01, 40.71, 19.5), (-118.24, 34.05, 13.0), (-87.63, 41.88, 9.4), (-96.80, 32.78, 7.6),
    (-95.37, 29.76, 7.1), (-77.04, 38.91, 6.3), (-80.19, 25.76, 6.1), (-75.17, 39.95, 6.2),
    (-84.39, 33.75, 6.1), (-112.07, 33.45, 4.9), (-71.06, 42.36, 4.9), (-122.42, 37.77, 4.7),
    (-117.40, 33.95, 4.6), (-83.05, 42.33, 4.4), (-122.33, 47.61, 4.0), (-93.27, 44.98, 3.7),
    (-117.16, 32.72, 3.3), (-82.46, 27.95, 3.2), (-104.99, 39.74, 3.0), (-90.20, 38.63, 2.8),
    (-76.61, 39.29, 2.8), (-80.84, 35.23, 2.7), (-81.38, 28.54, 2.7), (-98.49, 29.42, 2.6),
    (-122.68, 45.52, 2.5), (-121.49, 38.58, 2.4), (-79.99, 40.44, 2.4), (-115.14, 36.17, 2.3),
    (-97.74, 30.27, 2.3), (-84.51, 39.10, 2.3), (-94.58, 39.10, 2.2), (-82.99, 39.96, 2.1),
    (-86.16, 39.77, 2.1), (-81.69, 41.50, 2.1), (-121.89, 37.34, 2.0), (-86.78, 36.16, 2.0),
    (-76.29, 36.85, 1.8), (-71.41, 41.82, 1.7), (-87.91, 43.04, 1.6), (-81.66, 30.33, 1.6),
    (-97.52, 35.47, 1.4), (-78.64, 35.78, 1.4), (-90.05, 35.15, 1.3), (-77.44, 37.54, 1.3),
    (-85.76, 38.25, 1.3), (-90.07, 29.95, 1.3), (-111.89, 40.76, 1.3), (-72.68, 41.76, 1.2),
    (-78.88, 42.89, 1.2), (-86.80, 33.52, 1.1), (-77.61, 43.16, 1.1), (-85.67, 42.96, 1.1),
    (-110.97, 32.22, 1.0), (-95.99, 36.15, 1.0), (-157.86, 21.31, 1.0), (-119.79, 36.74, 1.0),
    (-71.80, 42.26, 1.0), (-96.68, 40.81, 0.3), (-106.65, 35.08, 0.9), (-116.20, 43.62, 0.8),
    (-81.97, 33.47, 0.6), (-81.10, 32.08, 0.4), (-84.99, 32.46, 0.3), (-83.63, 32.84, 0.2),
    (-83.38, 33.95, 0.2), (-149.90, 61.22, 0.4), (-66.11, 18.47, 2.0), (-100.78, 46.81, 0.1),
    (-107.46, 43.00, 0.1), (-104.82, 41.14, 0.1), (-112.04, 46.59, 0.1), (-68.77, 44.80, 0.2),
])


def quarter_file_name(year: int, quarter: int, service: str = "mobile") -> str:
    """Ookla's name of a global quarter file, e.g. ``2023-10-01_performance_mobile_tiles.parquet``."""
    return f"{year}-{3 * (quarter - 1) + 1:02d}-01_performance_{service}_tiles.parquet"


def _around(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    """``(n, 2)`` lon/lat points around ``centres`` rows ``(lon, lat, population)``, chosen with
    probability proportional to population, at gamma-distributed distances (km) growing as
    ``sqrt(population)`` (so a metro's area grows with its population)."""
    pick = rng.choice(len(centres), size=n, p=centres[:, 2] / centres[:, 2].sum())
    lon0, lat0, pop = centres[pick].T
    r_km = rng.gamma(1.5, 20.0 * np.sqrt(pop))
    angle = rng.uniform(0.0, 2.0 * np.pi, n)
    lat = lat0 + r_km * np.sin(angle) / 111.32
    lon = lon0 + r_km * np.cos(angle) / (111.32 * np.cos(np.radians(lat0)))
    return np.column_stack([lon, lat])


def _us_background(rng: np.random.Generator, n: int) -> np.ndarray:
    """``(n, 2)`` lon/lat points uniform (in degrees) over the contiguous states."""
    states = state_boundaries()
    land = states[~states["STUSPS"].isin(["AK", "HI", "PR"])].geometry.union_all()
    shapely.prepare(land)
    points = np.empty((0, 2))
    while len(points) < n:
        batch = rng.uniform(US_BOX[:2], US_BOX[2:], size=(2 * n, 2))
        points = np.vstack([points, batch[shapely.contains_xy(land, batch[:, 0], batch[:, 1])]])
    return points[:n]


def _world_centres(rng: np.random.Generator) -> np.ndarray:
    """:data:`WORLD_CITIES` rows ``(lon, lat, population)`` outside the contiguous-US box."""
    lon = rng.uniform(-180.0, 180.0, 3 * WORLD_CITIES)
    lat = rng.uniform(-45.0, 65.0, 3 * WORLD_CITIES)
    outside = ~((US_BOX[0] < lon) & (lon < US_BOX[2]) & (US_BOX[1] < lat) & (lat < US_BOX[3]))
    lon, lat = lon[outside][:WORLD_CITIES], lat[outside][:WORLD_CITIES]
    return np.column_stack([lon, lat, np.minimum(0.05 * (1.0 + rng.pareto(1.2, WORLD_CITIES)), 20.0)])


def _distinct_tiles(rng: np.random.Generator, draw, n: int) -> np.ndarray:
    """``(n,)`` distinct zoom-16 tile ids ``x * 2**16 + y`` of points from ``draw(rng, m)``,
    in random order."""
    ids = np.empty(0, dtype=np.int64)
    while len(ids) < n:
        lonlat = draw(rng, 2 * (n - len(ids)) + 1000)
        x, y = lonlat_to_tile(lonlat[:, 0], lonlat[:, 1])
        fresh = np.sort((x << OOKLA_ZOOM) | y)
        fresh = fresh[np.concatenate([[True], fresh[1:] != fresh[:-1]])]  # np.unique, without its slow hashing
        ids = np.concatenate([ids, rng.permutation(fresh[~np.isin(fresh, ids, kind="sort")])])
    return ids[:n]


def tile_population(us_tiles: int, world_tiles: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct tiles the quarters draw from, 1.25 times the tiles per quarter of each part.

    Returns:
        ``(us_ids, us_metro, world_ids)``: int64 tile ids ``x * 2**16 + y`` at zoom 16 of the US
        and of the rest of the world, and a bool mask of the US tiles drawn around a metro.
    """
    rng = np.random.default_rng([seed, 0])
    n_metro = int(round(1.25 * us_tiles * URBAN_SHARE))
    metro = _distinct_tiles(rng, lambda r, m: _around(r, US_CENTRES, m), n_metro)
    rural = _distinct_tiles(rng, _us_background, int(round(1.25 * us_tiles)) - n_metro)
    us = np.concatenate([metro, rural[~np.isin(rural, metro, kind="sort")]])
    world_centres = _world_centres(rng)
    world = _distinct_tiles(rng, lambda r, m: _around(r, world_centres, m), int(round(1.25 * world_tiles)))
    return us, np.arange(len(us)) < len(metro), world[~np.isin(world, us, kind="sort")]


def _quadkey_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integers that sort zoom-16 tiles in the order of their quadkey strings."""
    key = np.zeros(len(x), dtype=np.int64)
    for bit in range(OOKLA_ZOOM):
        key |= (((y >> bit) & 1) << (2 * bit + 1)) | (((x >> bit) & 1) << (2 * bit))
    return key


def _quadkey_strings(x: np.ndarray, y: np.ndarray) -> pa.Array:
    """Zoom-16 quadkeys of tiles ``(x, y)`` as an Arrow string array, built from one byte buffer."""
    shifts = np.arange(OOKLA_ZOOM - 1, -1, -1)
    digits = (((x[:, None] >> shifts) & 1) + 2 * ((y[:, None] >> shifts) & 1) + ord("0")).astype(np.uint8)
    offsets = np.arange(0, OOKLA_ZOOM * len(x) + 1, OOKLA_ZOOM, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(x), [None, pa.py_buffer(offsets), pa.py_buffer(digits.tobytes())])


def _wkt(bounds: np.ndarray) -> pa.Array:
    """Ookla-style WKT tile polygons (NW, NE, SE, SW, NW corners) of ``(n, 4)`` bounds."""
    w, s, e, n = (pc.cast(pa.array(bounds[:, i]), pa.string()) for i in range(4))
    corners = [(w, n), (e, n), (e, s), (w, s), (w, n)]
    parts = []
    for i, (lon, lat) in enumerate(corners):
        parts += [lon, " ", lat] + ([", "] if i < len(corners) - 1 else [])
    return pc.binary_join_element_wise("POLYGON((", *parts, "))", "")


def _quarter_table(rng: np.random.Generator, ids: np.ndarray, urban: np.ndarray, year: int, quarter: int) -> dict:
    """Sorted numeric columns of one quarter's tiles ``ids`` (``urban`` marks metro tiles)."""
    x, y = ids >> OOKLA_ZOOM, ids & ((1 << OOKLA_ZOOM) - 1)
    order = np.argsort(_quadkey_order(x, y), kind="stable")
    x, y, urban = x[order], y[order], urban[order]
    n = len(ids)
    growth = 1.25 ** (year - 2019 + (quarter - 1) / 4)
    down = 30_000.0 * growth * np.exp(0.4 * urban + rng.normal(0.0, 0.7, n))
    tests = 1 + rng.geometric(0.25, n)
    columns = {
        "x": x,
        "y": y,
        "avg_d_kbps": np.maximum(down, 1).astype(np.int64),
        "avg_u_kbps": np.maximum(down / 4 * np.exp(rng.normal(0.0, 0.5, n)), 1).astype(np.int64),
        "avg_lat_ms": np.maximum(40.0 * np.exp(rng.normal(0.0, 0.5, n)), 1).astype(np.int64),
        "tests": tests.astype(np.int64),
        "devices": (1 + rng.binomial(tests - 1, 0.5)).astype(np.int64),
    }
    if (year, quarter) >= LOADED_LATENCY_FROM:
        for col, scale in (("avg_lat_down_ms", 300.0), ("avg_lat_up_ms", 500.0)):
            values = np.maximum(scale * np.exp(rng.normal(0.0, 0.6, n)), 1).astype(np.int32)
            columns[col] = pa.array(values, mask=rng.random(n) < 0.2)
    return columns


def _schema(year: int, quarter: int) -> pa.Schema:
    fields = [("quadkey", pa.string()), ("tile", pa.string())]
    if (year, quarter) >= CENTRE_FROM:
        fields += [("tile_x", pa.float64()), ("tile_y", pa.float64())]
    fields += [("avg_d_kbps", pa.int64()), ("avg_u_kbps", pa.int64()), ("avg_lat_ms", pa.int64())]
    if (year, quarter) >= LOADED_LATENCY_FROM:
        fields += [("avg_lat_down_ms", pa.int32()), ("avg_lat_up_ms", pa.int32())]
    return pa.schema(fields + [("tests", pa.int64()), ("devices", pa.int64())])


def _write_quarter(path: Path, columns: dict, schema: pa.Schema) -> None:
    """Write one quarter's sorted columns, building the strings of one row group at a time."""
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, len(columns["x"]), ROW_GROUP_ROWS):
            part = {k: v[start : start + ROW_GROUP_ROWS] for k, v in columns.items()}
            bounds = tile_bounds(part["x"], part["y"], OOKLA_ZOOM)
            row = {"quadkey": _quadkey_strings(part["x"], part["y"]), "tile": _wkt(bounds)}
            row["tile_x"] = np.round((bounds[:, 0] + bounds[:, 2]) / 2, 4)
            row["tile_y"] = np.round((bounds[:, 1] + bounds[:, 3]) / 2, 4)
            row.update({k: v for k, v in part.items() if k not in ("x", "y")})
            table = pa.table({name: row[name] for name in schema.names}, schema=schema)
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)


def write_global_quarters(
    folder: Path, quarters: Sequence[str], us_tiles_per_quarter: int, world_tiles_per_quarter: int, seed: int = 0
) -> list[Path]:
    """Write one Ookla-schema global mobile tile file per quarter into ``folder``.

    Args:
        folder: output folder (created if missing); files already there are replaced.
        quarters: labels like ``"2019Q1"``.
        us_tiles_per_quarter: tiles per quarter inside the US (see the module docstring).
        world_tiles_per_quarter: tiles per quarter elsewhere.
        seed: the same seed gives the same files.

    Returns:
        The paths written, in the order of ``quarters``; each file has
        ``us_tiles_per_quarter + world_tiles_per_quarter`` rows.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    us, metro, world = tile_population(us_tiles_per_quarter, world_tiles_per_quarter, seed)
    written = []
    for label in quarters:
        year, quarter = parse_quarter_label(label)
        rng = np.random.default_rng([seed, year, quarter])
        pick_us = rng.choice(len(us), size=us_tiles_per_quarter, replace=False)
        pick_world = rng.choice(len(world), size=world_tiles_per_quarter, replace=False)
        ids = np.concatenate([us[pick_us], world[pick_world]])
        urban = np.concatenate([metro[pick_us], np.ones(world_tiles_per_quarter, dtype=bool)])
        path = folder / quarter_file_name(year, quarter)
        _write_quarter(path, _quarter_table(rng, ids, urban, year, quarter), _schema(year, quarter))
        written.append(path)
    return written


def parse_quarter_range(text: str) -> list[str]:
    """``"2019Q1..2023Q4"`` -> every quarter label from the first to the last; a comma list
    (``"2019Q1,2023Q4"``) -> its labels."""
    if ".." not in text:
        pairs = [parse_quarter_label(label) for label in text.split(",")]
    else:
        (y0, q0), (y1, q1) = (parse_quarter_label(part) for part in text.split(".."))
        pairs = [divmod(i, 4) for i in range(y0 * 4 + q0 - 1, y1 * 4 + q1)]
        pairs = [(y, q + 1) for y, q in pairs]
    return [f"{y}Q{q}" for y, q in pairs]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--quarters", default="2019Q1..2023Q4", help="2019Q1..2023Q4, or a comma list")
    p.add_argument("--us-tiles", type=int, default=700_000, help="US tiles per quarter")
    p.add_argument("--world-tiles", type=int, default=3_300_000, help="other tiles per quarter")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    quarters = parse_quarter_range(args.quarters)
    for path in write_global_quarters(args.out, quarters, args.us_tiles, args.world_tiles, args.seed):
        print(f"wrote {path} ({pq.ParquetFile(path).metadata.num_rows:,} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
