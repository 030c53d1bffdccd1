"""Ookla's schema versions, from hand-made rows: the original columns, the loaded latency of
2022Q4 on (null where not measured), and tile_x/tile_y of 2023Q3 on (or their absence)."""

from __future__ import annotations

import json
from pathlib import Path

import geopandas as gpd
import mercantile
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely

from geodbk.dataset.spatial_dataset import build_dataset
from geodbk.errors import InputDataError
from geodbk.ingest.ookla import LOADED_LATENCY_COLUMNS, TILE_COLUMNS, as_tiles, read_tiles

# Five zoom-16 tiles around San Juan, Puerto Rico, named by mercantile (independent of geodbk).
POINTS = [(-66.10, 18.42), (-66.06, 18.44), (-66.15, 18.38), (-65.99, 18.40), (-66.12, 18.46)]
TILES = [mercantile.tile(lon, lat, 16) for lon, lat in POINTS]
QUADKEYS = [mercantile.quadkey(t) for t in TILES]
BOUNDS = np.array([tuple(mercantile.bounds(t)) for t in TILES])  # west, south, east, north
CENTRES = np.column_stack([(BOUNDS[:, 0] + BOUNDS[:, 2]) / 2, (BOUNDS[:, 1] + BOUNDS[:, 3]) / 2])
WKT = [shapely.box(*b).wkt for b in BOUNDS]

OLD = {
    "quadkey": QUADKEYS,
    "tile": WKT,
    "avg_d_kbps": [51_234, 12_000, 7, 250_000, 99_999],
    "avg_u_kbps": [8_100, 2_000, 3, 30_000, 12_345],
    "avg_lat_ms": [31, 45, 120, 18, 0],
    "tests": [12, 3, 1, 40, 7],
    "devices": [5, 2, 1, 11, 4],
}
DOWN = [412.0, None, 95.0, 0.0, None]  # null where no test in the tile measured it
UP = [None, 1_830.5, 640.0, None, 77.25]


def _nan_equal(actual: pd.Series, expected: list) -> None:
    np.testing.assert_array_equal(actual.to_numpy(), np.array([np.nan if v is None else v for v in expected], float))


def _ookla_parquet(path: Path, **extra: pa.Array) -> Path:
    """A Parquet file with Ookla's own column types (int64 values, string quadkey and WKT)."""
    columns = {c: pa.array(v, type=pa.string() if c in ("quadkey", "tile") else pa.int64()) for c, v in OLD.items()}
    pq.write_table(pa.table({**columns, **extra}), path)
    return path


def test_old_schema_without_centres_or_loaded_latency(tmp_path):
    path = _ookla_parquet(tmp_path / "2022-07-01_performance_mobile_tiles.parquet")
    tiles = read_tiles(path)
    assert list(tiles.columns) == list(TILE_COLUMNS)
    assert not set(LOADED_LATENCY_COLUMNS) & set(tiles.columns)
    assert (tiles["year"] == 2022).all() and (tiles["quarter"] == 3).all() and (tiles["service"] == "mobile").all()
    assert tiles["quadkey"].tolist() == QUADKEYS
    for col in ("avg_d_kbps", "avg_u_kbps", "avg_lat_ms"):
        assert tiles[col].dtype == np.float64
        np.testing.assert_array_equal(tiles[col].to_numpy(), np.array(OLD[col], float))
    assert tiles["tests"].dtype == np.int64 and tiles["tests"].tolist() == OLD["tests"]
    # The centre comes from the quadkey: mercantile's tile midpoint.
    assert tiles["tile_x"].dtype == np.float64 and tiles["tile_y"].dtype == np.float64
    np.testing.assert_allclose(tiles[["tile_x", "tile_y"]].to_numpy(), CENTRES, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(tiles.geometry.bounds), BOUNDS, rtol=0, atol=1e-10)


def test_new_schema_keeps_loaded_latency_with_nulls_as_nan(tmp_path):
    # As in Ookla's files: int32 loaded latency (2023) in one column, double (2026) in the other,
    # and tile_x/tile_y rounded to 4 decimals.
    rounded = np.round(CENTRES, 4)
    path = _ookla_parquet(
        tmp_path / "2023-10-01_performance_fixed_tiles.parquet",
        tile_x=pa.array(rounded[:, 0]),
        tile_y=pa.array(rounded[:, 1]),
        avg_lat_down_ms=pa.array([None if v is None else int(v) for v in DOWN], type=pa.int32()),
        avg_lat_up_ms=pa.array(UP, type=pa.float64()),
    )
    tiles = read_tiles(path)
    assert list(tiles.columns) == [*TILE_COLUMNS[:-1], "avg_lat_down_ms", "avg_lat_up_ms", "geometry"]
    assert (tiles["service"] == "fixed").all() and (tiles["quarter"] == 4).all()
    for col, expected in (("avg_lat_down_ms", DOWN), ("avg_lat_up_ms", UP)):
        assert tiles[col].dtype == np.float64
        _nan_equal(tiles[col], expected)
    assert tiles["avg_lat_down_ms"].isna().tolist() == [False, True, False, False, True]
    assert tiles["avg_lat_down_ms"].iloc[3] == 0.0  # a measured 0 is a value, not a sentinel
    # Ookla's rounded centres are accepted; the output holds the exact quadkey centre.
    assert np.abs(rounded - CENTRES).max() > 1e-6
    np.testing.assert_allclose(tiles[["tile_x", "tile_y"]].to_numpy(), CENTRES, rtol=0, atol=1e-10)


def test_geojson_nulls_and_empty_strings_are_nan(tmp_path):
    features = []
    for i, b in enumerate(BOUNDS):
        props = {k: v[i] for k, v in OLD.items() if k != "tile"}
        # null in one column; an empty string (as text conversions write null) in the other
        props["avg_lat_down_ms"] = DOWN[i]
        props["avg_lat_up_ms"] = "" if UP[i] is None else str(UP[i])
        ring = [[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]], [b[0], b[1]]]
        geometry = {"type": "Polygon", "coordinates": [ring]}
        features.append({"type": "Feature", "properties": props, "geometry": geometry})
    path = tmp_path / "pr_ookla_2023Q2_mobile.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    raw = gpd.read_file(path)
    assert not pd.api.types.is_numeric_dtype(raw["avg_lat_up_ms"])  # read as text: the parser meets ""
    tiles = read_tiles(path)
    for col, expected in (("avg_lat_down_ms", DOWN), ("avg_lat_up_ms", UP)):
        assert tiles[col].dtype == np.float64
        _nan_equal(tiles[col], expected)
    np.testing.assert_allclose(tiles[["tile_x", "tile_y"]].to_numpy(), CENTRES, rtol=0, atol=1e-10)


def test_no_tile_columns_at_all_rebuilds_centres_and_polygons(tmp_path):
    table = pd.DataFrame({k: v for k, v in OLD.items() if k != "tile"})
    table["avg_lat_down_ms"] = pd.array([None if v is None else int(v) for v in DOWN], dtype="Int32")
    path = tmp_path / "tiles.parquet"
    table.to_parquet(path)
    tiles = read_tiles(path, year=2023, quarter=1, service="mobile")
    assert "avg_lat_up_ms" not in tiles.columns
    _nan_equal(tiles["avg_lat_down_ms"], DOWN)
    np.testing.assert_allclose(tiles[["tile_x", "tile_y"]].to_numpy(), CENTRES, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(tiles.geometry.bounds), BOUNDS, rtol=0, atol=1e-10)


def test_old_and_new_files_together_give_nan_for_the_old_rows(tmp_path):
    old = _ookla_parquet(tmp_path / "2022-07-01_performance_mobile_tiles.parquet")
    new = _ookla_parquet(
        tmp_path / "2023-10-01_performance_mobile_tiles.parquet",
        avg_lat_down_ms=pa.array(DOWN, type=pa.float64()),
        avg_lat_up_ms=pa.array(UP, type=pa.float64()),
    )
    tiles = read_tiles([old, new])
    assert list(tiles.columns) == [*TILE_COLUMNS[:-1], *LOADED_LATENCY_COLUMNS, "geometry"]
    assert tiles["avg_lat_down_ms"].dtype == np.float64
    assert tiles["avg_lat_down_ms"].iloc[:5].isna().all()
    _nan_equal(tiles["avg_lat_up_ms"].iloc[5:], UP)


def test_in_memory_nullable_integers(tmp_path):
    frame = pd.DataFrame(OLD).assign(
        year=2023, quarter=4, service="mobile",
        avg_lat_down_ms=pd.array([None if v is None else int(v) for v in DOWN], dtype="Int32"),
        avg_lat_up_ms=pd.Series([np.nan if v is None else v for v in UP], dtype="float32"),
    )
    tiles = as_tiles(frame)
    for col, expected in (("avg_lat_down_ms", DOWN), ("avg_lat_up_ms", UP)):
        assert tiles[col].dtype == np.float64
        _nan_equal(tiles[col], expected)
    again = as_tiles(tiles)  # an already normalised frame keeps its columns
    pd.testing.assert_frame_equal(
        pd.DataFrame(again.drop(columns="geometry")), pd.DataFrame(tiles.drop(columns="geometry"))
    )


@pytest.mark.parametrize(
    "column, values, message",
    [
        ("avg_lat_down_ms", [-1.0, 10.0, None, 3.0, 4.0], "avg_lat_down_ms has 1 negative or infinite"),
        ("avg_lat_up_ms", [1.0, np.inf, None, 3.0, 4.0], "avg_lat_up_ms has 1 negative or infinite"),
        ("avg_lat_up_ms", ["12", "n/a", "", "3", "x"], "avg_lat_up_ms has 2 value.s. that are not numbers, e.g. 'n/a'"),
    ],
)
def test_bad_loaded_latency_is_a_one_line_error(column, values, message):
    frame = pd.DataFrame(OLD).assign(year=2023, quarter=4, service="mobile", **{column: values})
    with pytest.raises(InputDataError, match=message) as err:
        as_tiles(frame, name="hand-made")
    assert "\n" not in str(err.value) and str(err.value).startswith("hand-made:")


def test_tile_centre_outside_its_quadkey_is_an_error():
    frame = pd.DataFrame(OLD).assign(year=2023, quarter=4, service="mobile", tile_x=CENTRES[:, 0], tile_y=CENTRES[:, 1])
    assert len(as_tiles(frame)) == 5
    swapped = frame.assign(tile_x=CENTRES[:, 1], tile_y=CENTRES[:, 0])  # lat and lon mixed up
    with pytest.raises(InputDataError, match=f"5 row.s. have tile_x/tile_y outside .* quadkey {QUADKEYS[0]}") as err:
        as_tiles(swapped)
    assert "\n" not in str(err.value)
    neighbour = frame.copy()
    neighbour.loc[2, "tile_x"] += BOUNDS[2, 2] - BOUNDS[2, 0]  # the centre of the tile to the east
    neighbour.loc[4, "tile_y"] = np.nan  # a null centre is not checked
    with pytest.raises(InputDataError, match=f"1 row.s. .* quadkey {QUADKEYS[2]}"):
        as_tiles(neighbour)


def test_build_dataset_takes_the_new_schema():
    rng = np.random.default_rng(0)
    lon = rng.uniform(-66.3, -65.9, 60)
    lat = rng.uniform(18.25, 18.42, 60)
    keys = [mercantile.quadkey(mercantile.tile(a, b, 16)) for a, b in zip(lon, lat, strict=True)]
    quadkeys = pd.unique(np.array(keys))
    n = len(quadkeys)
    latency = rng.uniform(20, 400, n)
    latency[::4] = np.nan
    frame = pd.DataFrame({
        "quadkey": quadkeys, "year": 2023, "quarter": 4, "service": "mobile",
        "avg_d_kbps": rng.integers(1_000, 200_000, n), "avg_u_kbps": rng.integers(500, 40_000, n),
        "avg_lat_ms": rng.integers(10, 90, n), "tests": rng.integers(1, 50, n), "devices": rng.integers(1, 9, n),
        "avg_lat_down_ms": latency, "avg_lat_up_ms": latency * 2,
    })
    ds = build_dataset(frame, "PR", target="latency", buffer_deg=0.1)
    assert len(ds) == n and ds.units == "ms"
    assert ds.dropped["missing_value"] == 0  # NaN loaded latency does not drop rows of the avg_lat_ms target
    by_key = frame.set_index("quadkey")["avg_lat_ms"]
    np.testing.assert_array_equal(ds.frame["value"].to_numpy(), by_key.loc[ds.frame["quadkey"]].to_numpy(dtype=float))
