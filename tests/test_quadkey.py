"""Bing tile maths against known values, the sample's reference ``tile`` polygons and ``mercantile``."""

import mercantile
import numpy as np
import pandas as pd
import pytest
import shapely

from geodbk import paths
from geodbk.errors import InputDataError
from geodbk.ingest.quadkey import (
    lonlat_to_quadkey,
    lonlat_to_tile,
    quadkey_bounds,
    quadkey_centres,
    quadkey_polygons,
    quadkey_to_tile,
    tile_bounds,
    tile_to_quadkey,
)


@pytest.fixture(scope="module")
def sample_rows() -> pd.DataFrame:
    df = pd.read_parquet(paths.PUERTO_RICO_MOBILE, columns=["quadkey", "tile", "tile_x", "tile_y"])
    return df.sample(20_000, random_state=1)


def test_known_quadkeys():
    # Bing's documented example: tile (3, 5) at zoom 3 is "213".
    x, y, z = quadkey_to_tile("213")
    assert (x[0], y[0], z[0]) == (3, 5, 3)
    assert tile_to_quadkey(3, 5, 3)[0] == "213"
    x, y, z = quadkey_to_tile(["0", "1", "2", "3"])
    assert x.tolist() == [0, 1, 0, 1] and y.tolist() == [0, 0, 1, 1] and z.tolist() == [1] * 4
    np.testing.assert_allclose(quadkey_bounds("0")[0], [-180.0, 0.0, 0.0, 85.0511287798], atol=1e-9)
    np.testing.assert_allclose(quadkey_bounds("3")[0], [0.0, -85.0511287798, 180.0, 0.0], atol=1e-9)


def test_bounds_and_polygons_match_sample_tile_column(sample_rows):
    reference = shapely.bounds(shapely.from_wkt(sample_rows["tile"].to_numpy()))
    ours = quadkey_bounds(sample_rows["quadkey"].to_numpy())
    # The sample's WKT is rounded to 9 decimals.
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-9)
    polys = quadkey_polygons(sample_rows["quadkey"].to_numpy()[:100])
    np.testing.assert_allclose(shapely.bounds(polys), ours[:100], rtol=0, atol=0)
    assert (shapely.get_num_coordinates(polys) == 5).all()


def test_centres_match_sample_tile_xy(sample_rows):
    centres = quadkey_centres(sample_rows["quadkey"].to_numpy())
    np.testing.assert_allclose(centres, sample_rows[["tile_x", "tile_y"]].to_numpy(), rtol=0, atol=1e-9)


def test_lonlat_to_quadkey_finds_the_tile_of_its_centre_and_corners(sample_rows):
    qk = sample_rows["quadkey"].to_numpy()
    centres = quadkey_centres(qk)
    assert (lonlat_to_quadkey(centres[:, 0], centres[:, 1]) == qk).all()
    b = quadkey_bounds(qk)
    eps = 1e-9
    # Just inside the north-west and south-east corners.
    assert (lonlat_to_quadkey(b[:, 0] + eps, b[:, 3] - eps) == qk).all()
    assert (lonlat_to_quadkey(b[:, 2] - eps, b[:, 1] + eps) == qk).all()
    # Just across the east edge is the next tile to the east.
    x, y, _ = quadkey_to_tile(qk)
    east = lonlat_to_quadkey(b[:, 2] + eps, (b[:, 1] + b[:, 3]) / 2)
    assert (east == tile_to_quadkey(x + 1, y, 16)).all()


@pytest.mark.parametrize("zoom", [1, 5, 16, 23])
def test_tile_quadkey_round_trip(zoom):
    rng = np.random.default_rng(zoom)
    x = rng.integers(0, 2**zoom, 500)
    y = rng.integers(0, 2**zoom, 500)
    qk = tile_to_quadkey(x, y, zoom)
    assert all(len(q) == zoom for q in qk)
    x2, y2, z2 = quadkey_to_tile(qk)
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)
    assert (z2 == zoom).all()
    # Adjacent tiles share edges exactly.
    b = tile_bounds(x, y, zoom)
    b_east = tile_bounds(np.minimum(x + 1, 2**zoom - 1), y, zoom)
    inner = x + 1 < 2**zoom
    np.testing.assert_array_equal(b[inner, 2], b_east[inner, 0])


def test_mixed_zoom_quadkeys():
    x, y, z = quadkey_to_tile(["213", "0323002020133321", "1"])
    assert z.tolist() == [3, 16, 1]
    assert tile_to_quadkey(x[1], y[1], 16)[0] == "0323002020133321"


@pytest.mark.parametrize("bad", ["0124", "", "03a1", None])
def test_invalid_quadkeys_are_refused(bad):
    with pytest.raises(InputDataError):
        quadkey_to_tile(["0123", bad])


def test_out_of_range_tile_is_refused():
    with pytest.raises(InputDataError):
        tile_to_quadkey(4, 0, 2)


# --- agreement with mercantile (an independent implementation) on random tiles ---------------


def _random_tiles(zoom: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    size = 2**zoom
    x = rng.integers(0, size, n)
    y = rng.integers(0, size, n)
    # Always include the corner tiles, where the bounds reach +-180 and +-85.0511.
    x[:2], y[:2] = [0, size - 1], [0, size - 1]
    return x, y


@pytest.mark.parametrize("zoom, n", [(16, 4000), (1, 50), (4, 200), (9, 500), (12, 500), (20, 500), (23, 500)])
def test_quadkeys_and_bounds_agree_with_mercantile(zoom, n):
    x, y = _random_tiles(zoom, n, seed=zoom)
    ours = tile_to_quadkey(x, y, zoom)
    theirs = [mercantile.quadkey(int(i), int(j), zoom) for i, j in zip(x, y, strict=True)]
    assert ours.tolist() == theirs

    back_x, back_y, back_z = quadkey_to_tile(theirs)
    expected = np.array([tuple(mercantile.quadkey_to_tile(q)) for q in theirs])
    np.testing.assert_array_equal(np.column_stack([back_x, back_y, back_z]), expected)

    reference = np.array([tuple(mercantile.bounds(int(i), int(j), zoom)) for i, j in zip(x, y, strict=True)])
    np.testing.assert_allclose(tile_bounds(x, y, zoom), reference, rtol=0, atol=1e-10)
    np.testing.assert_allclose(quadkey_bounds(ours), reference, rtol=0, atol=1e-10)
    midpoints = np.column_stack([(reference[:, 0] + reference[:, 2]) / 2, (reference[:, 1] + reference[:, 3]) / 2])
    np.testing.assert_allclose(quadkey_centres(ours), midpoints, rtol=0, atol=1e-10)


@pytest.mark.parametrize("zoom", [3, 16, 21])
def test_point_to_tile_agrees_with_mercantile(zoom):
    rng = np.random.default_rng(100 + zoom)
    lon = rng.uniform(-179.999, 179.999, 3000)
    lat = rng.uniform(-85.0, 85.0, 3000)
    x, y = lonlat_to_tile(lon, lat, zoom)
    expected = np.array([tuple(mercantile.tile(a, b, zoom))[:2] for a, b in zip(lon, lat, strict=True)])
    np.testing.assert_array_equal(np.column_stack([x, y]), expected)
    assert lonlat_to_quadkey(lon[:200], lat[:200], zoom).tolist() == [
        mercantile.quadkey(*mercantile.tile(a, b, zoom)) for a, b in zip(lon[:200], lat[:200], strict=True)
    ]
