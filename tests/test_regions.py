"""Regions from the shipped state boundaries or polygon files, and clipping tiles to them."""

import geopandas as gpd
import numpy as np
import pytest
import shapely

from geodbk.errors import InputDataError, RegionError
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.ingest.regions import DEFAULT_BUFFER_DEG, Region, clip_to_region, inside_region, load_region


@pytest.mark.parametrize("spec", ["PR", "pr", "Puerto Rico", "puerto rico", "72", 72])
def test_state_by_name_abbreviation_or_fips(spec):
    region = load_region(spec)
    assert region.name == "Puerto Rico" and region.code == "PR"
    west, south, east, north = region.bounds
    # Puerto Rico incl. Mona, Vieques and Culebra, in degrees (the file is NAD83; now EPSG:4326).
    assert -68.0 < west < -67.9 and -65.3 < east < -65.2 and 17.8 < south < 18.0 and 18.5 < north < 18.6


def test_hawaii_and_fips_with_leading_zero():
    assert load_region("15").code == "HI"
    assert load_region("6").name == "California"
    assert load_region(load_region("HI")) is not None


@pytest.mark.parametrize("spec", ["Puerto Ricoo", "XX", "99"])
def test_unknown_region_is_refused(spec):
    with pytest.raises(RegionError, match="unknown region"):
        load_region(spec)


@pytest.mark.parametrize("spec", ["no_such_file.geojson", "areas/Kauai, HI.GPKG", "/no/such, dir/box.shp"])
def test_missing_polygon_file_is_named(spec):
    """A polygon file's path that does not exist says so, even with a comma in it (which would
    otherwise read as 'NAME, STATE' counties)."""
    with pytest.raises(InputDataError, match=r"^region file not found: "):
        load_region(spec)


def test_polygon_file_in_another_crs_is_reprojected(tmp_path):
    square = shapely.box(-66.3, 18.1, -66.0, 18.4)
    path = tmp_path / "box.gpkg"
    gpd.GeoDataFrame(geometry=[square], crs=4326).to_crs(32161).to_file(path)  # NAD83 / Puerto Rico
    region = load_region(str(path))
    assert region.name == "box" and region.code is None
    np.testing.assert_allclose(region.bounds, square.bounds, atol=1e-6)


@pytest.mark.filterwarnings("ignore:'crs' was not provided")
def test_polygon_file_without_crs_is_refused(tmp_path):
    path = tmp_path / "box.shp"
    gpd.GeoDataFrame(geometry=[shapely.box(0, 0, 1, 1)]).to_file(path)
    with pytest.raises(InputDataError, match="no CRS"):
        load_region(path)


def test_polygon_file_must_hold_polygons(tmp_path):
    path = tmp_path / "points.geojson"
    gpd.GeoDataFrame(geometry=[shapely.Point(0, 0)], crs=4326).to_file(path)
    with pytest.raises(InputDataError, match="polygons"):
        load_region(path)


def test_inside_region_on_a_square():
    region = Region("square", shapely.box(0.0, 0.0, 1.0, 1.0))
    pts = np.array([[0.5, 0.5], [1.005, 0.5], [1.02, 0.5], [-0.5, 2.0]])
    assert inside_region(pts, region, buffer_deg=0).tolist() == [True, False, False, False]
    assert inside_region(pts, region, buffer_deg=0.01).tolist() == [True, True, False, False]
    with pytest.raises(RegionError):
        inside_region(pts, region, buffer_deg=-1)


def test_clip_counts_what_the_coarse_coast_drops(pr_tiles_2023q4):
    region = load_region("PR")
    strict = clip_to_region(pr_tiles_2023q4, region, buffer_deg=0)
    default = clip_to_region(pr_tiles_2023q4, region)
    n = len(pr_tiles_2023q4)
    for kept in (strict, default):
        assert len(kept) + kept.attrs["dropped"]["outside_region"] == n
    assert DEFAULT_BUFFER_DEG == 0.01
    assert strict.attrs["dropped"]["outside_region"] > 5 * default.attrs["dropped"]["outside_region"] > 0
    centres = quadkey_centres(strict["quadkey"].to_numpy(dtype=object))
    assert shapely.contains_xy(region.geometry, centres[:, 0], centres[:, 1]).all()


def test_clip_to_the_wrong_place_is_an_error(pr_tiles_2023q4):
    with pytest.raises(RegionError, match="no tiles left after clipping to Hawaii"):
        clip_to_region(pr_tiles_2023q4, load_region("HI"))
