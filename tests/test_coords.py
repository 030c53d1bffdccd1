"""geodbk.dataset.coords: the state-box transform and the data-centred equal-area projection."""

from __future__ import annotations

import json

import numpy as np
import pyproj
import pytest

from geodbk.dataset.coords import CoordinateTransform, ProjectedTransform, transform_from_dict
from geodbk.errors import InputDataError

ANCHORAGE = (-149.9, 61.2)
#: Alaska's bounding box (W, S, E, N), degrees: west of the antimeridian to east of it.
ALASKA_BOX = (-179.18, 51.2, 179.78, 71.4)


def _uniform(
    rng: np.random.Generator, n: int, lon: tuple[float, float], lat: tuple[float, float]
) -> np.ndarray:
    """``(n, 2)`` lon/lat degrees, uniform over the box ``lon x lat``."""
    return np.column_stack([rng.uniform(*lon, n), rng.uniform(*lat, n)])


@pytest.fixture(scope="module")
def puerto_rico() -> np.ndarray:
    """``(500, 2)`` random lon/lat over Puerto Rico."""
    return _uniform(np.random.default_rng(0), 500, (-67.3, -65.2), (17.9, 18.6))


@pytest.fixture(scope="module")
def aleutians() -> np.ndarray:
    """``(400, 2)`` random lon/lat on both sides of the antimeridian."""
    rng = np.random.default_rng(1)
    east = _uniform(rng, 200, (179.0, 180.0), (51.0, 53.0))
    west = _uniform(rng, 200, (-180.0, -179.0), (51.0, 53.0))
    return np.vstack([east, west])


def _lon_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Smallest signed difference of two longitude arrays, degrees."""
    return (a - b + 180.0) % 360.0 - 180.0


@pytest.mark.parametrize("points", ["puerto_rico", "aleutians"])
def test_round_trip(points: str, request: pytest.FixtureRequest) -> None:
    lonlat = request.getfixturevalue(points)
    t = ProjectedTransform.from_lonlat(lonlat)
    back = t.to_lonlat(t.to_unit(lonlat))
    assert back.shape == lonlat.shape
    assert np.all((back[:, 0] >= -180.0) & (back[:, 0] < 180.0))
    assert np.max(np.abs(_lon_difference(back[:, 0], lonlat[:, 0]))) < 1e-9
    assert np.max(np.abs(back[:, 1] - lonlat[:, 1])) < 1e-9


def test_antimeridian_is_not_torn(aleutians: np.ndarray) -> None:
    t = ProjectedTransform.from_lonlat(aleutians)
    assert abs(abs(t.lon0) - 180.0) < 1.0
    uv = t.to_unit(aleutians)
    assert np.all(np.isfinite(uv))
    # 2 degrees of latitude (~222 km) is the longer side; 2 degrees of longitude at ~52 N is
    # ~137 km, so u spans ~2 * 137 / 222 = 1.24 units, not a sliver nor the whole globe
    np.testing.assert_allclose([uv[:, 1].min(), uv[:, 1].max()], [-1.0, 1.0], atol=1e-12)
    assert 1.2 < np.ptp(uv[:, 0]) < 1.3
    assert 2 * t.scale_m == pytest.approx(222e3, rel=0.01)


def test_circular_mean_of_two_points_across_the_antimeridian() -> None:
    t = ProjectedTransform.from_lonlat([[179.6, 52.0], [-179.8, 52.0]])
    assert abs(abs(t.lon0) - 180.0) < 0.5
    assert t.lat0 == pytest.approx(52.0)


def test_longer_side_spans_unit_interval(puerto_rico: np.ndarray) -> None:
    t = ProjectedTransform.from_lonlat(puerto_rico)
    uv = t.to_unit(puerto_rico)
    assert uv.dtype == np.float64
    lo, hi = uv.min(axis=0), uv.max(axis=0)
    # Puerto Rico is wider (east-west) than tall
    np.testing.assert_allclose([lo[0], hi[0]], [-1.0, 1.0], atol=1e-12)
    assert -1.0 < lo[1] < hi[1] < 1.0
    assert hi[1] - lo[1] < 1.0
    # centred: the shorter side is symmetric about 0
    assert lo[1] == pytest.approx(-hi[1], abs=1e-12)
    np.testing.assert_allclose(t.extent, [lo[0], lo[1], hi[0], hi[1]], atol=1e-12)


def test_single_point_gets_finite_transform() -> None:
    t = ProjectedTransform.from_lonlat([ANCHORAGE])
    assert t.scale_m == 1000.0
    np.testing.assert_allclose(t.to_unit([ANCHORAGE]), [[0.0, 0.0]], atol=1e-9)
    assert t.extent == pytest.approx((0.0, 0.0, 0.0, 0.0), abs=1e-9)


def test_metres_match_geodesic_distance() -> None:
    geod = pyproj.Geod(ellps="WGS84")
    lon2, lat2, _ = geod.fwd(*ANCHORAGE, 60.0, 50_000.0)
    pair = np.array([ANCHORAGE, (lon2, lat2)])
    _, _, true_m = geod.inv(*ANCHORAGE, lon2, lat2)
    t = ProjectedTransform.from_lonlat(pair)
    xy = t.to_metres(pair)
    assert np.linalg.norm(xy[1] - xy[0]) == pytest.approx(true_m, rel=0.005)
    uv = t.to_unit(pair)
    assert np.linalg.norm(uv[1] - uv[0]) == pytest.approx(t.metres_to_units(true_m), rel=0.005)


def test_city_fills_the_square_where_the_state_box_gives_a_sliver() -> None:
    rng = np.random.default_rng(2)
    lon, lat = ANCHORAGE
    city = _uniform(rng, 300, (lon - 0.2, lon + 0.2), (lat - 0.05, lat + 0.05))
    u = ProjectedTransform.from_lonlat(city).to_unit(city)[:, 0]
    np.testing.assert_allclose([u.min(), u.max()], [-1.0, 1.0], atol=1e-12)
    # the paper's protocol: Alaska's box squeezes the same city into a sliver of u
    u_box = CoordinateTransform.from_bounds(ALASKA_BOX).to_unit(city)[:, 0]
    assert np.ptp(u_box) < 0.01


def test_crs_is_the_centred_laea(puerto_rico: np.ndarray) -> None:
    t = ProjectedTransform.from_lonlat(puerto_rico)
    expected = pyproj.CRS(f"+proj=laea +lat_0={t.lat0} +lon_0={t.lon0} +datum=WGS84 +units=m")
    assert t.crs == expected
    assert t.crs != pyproj.CRS(f"+proj=laea +lat_0={t.lat0} +lon_0={t.lon0 + 1} +datum=WGS84 +units=m")


def test_dict_round_trip(aleutians: np.ndarray) -> None:
    projected = ProjectedTransform.from_lonlat(aleutians)
    box = CoordinateTransform.from_bounds(ALASKA_BOX)
    for t in (projected, box):
        d = json.loads(json.dumps(t.to_dict()))
        assert d["kind"] == t.kind
        assert type(t).from_dict(d) == t
        assert transform_from_dict(d) == t
    assert projected.to_dict()["kind"] == "laea" and box.to_dict()["kind"] == "box"
    restored = transform_from_dict(json.loads(json.dumps(projected.to_dict())))
    np.testing.assert_array_equal(restored.to_unit(aleutians), projected.to_unit(aleutians))


def test_box_dict_without_kind_is_a_box() -> None:
    old = {"west": -67.5, "south": 17.5, "east": -65.0, "north": 18.5}
    expected = CoordinateTransform(-67.5, 17.5, -65.0, 18.5)
    assert transform_from_dict(old) == expected
    assert CoordinateTransform.from_dict(old) == expected


def test_box_extent_and_outside() -> None:
    box = CoordinateTransform(-67.5, 17.5, -65.0, 18.5)
    assert box.extent == (-1.0, -1.0, 1.0, 1.0)
    flags = box.outside([[-66.0, 18.0], [-67.52, 18.0], [0.0, 0.0]])
    # the middle point is 0.016 units west of the box: inside the default 0.05 margin
    np.testing.assert_array_equal(flags, [False, False, True])
    assert box.outside([[-67.52, 18.0]], margin=0.0).tolist() == [True]


def test_projected_outside(puerto_rico: np.ndarray) -> None:
    t = ProjectedTransform.from_lonlat(puerto_rico)
    flags = t.outside([[-66.3, 18.2], [0.0, 0.0], [-66.3, 25.0], [np.nan, 18.2]])
    np.testing.assert_array_equal(flags, [False, True, True, True])
    assert not t.outside(puerto_rico).any()


@pytest.mark.parametrize(
    "bad",
    [np.empty((0, 2)), np.array([[-66.0, np.nan]]), np.array([[np.inf, 18.0]]), np.array([[-66.0, 95.0]])],
    ids=["empty", "nan", "inf", "latitude"],
)
def test_bad_input(bad: np.ndarray) -> None:
    with pytest.raises(InputDataError):
        ProjectedTransform.from_lonlat(bad)


def test_bad_dicts() -> None:
    with pytest.raises(InputDataError, match="unknown transform kind"):
        transform_from_dict({"kind": "mercator"})
    with pytest.raises(InputDataError):
        ProjectedTransform.from_dict({"kind": "laea", "lon0": 0.0})
    with pytest.raises(InputDataError):
        CoordinateTransform.from_dict({"kind": "laea", "west": 0, "south": 0, "east": 1, "north": 1})
