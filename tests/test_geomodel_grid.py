"""GeoModel.grid: a verde-style map over the fitted region by default, and its fallback for older model files."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import shapely

from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.maps.geometry import RegularGrid

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def dataset():
    """One tile in ten of Puerto Rico's 2023Q4 sample, spread over the island."""
    ds = load_sample_dataset("PR", quarters=["2023Q4"])
    return dataclasses.replace(ds, frame=ds.frame.sample(frac=0.1, random_state=0))


@pytest.fixture(scope="module")
def model(dataset):
    return fit_dataset(dataset, "dbk-rbf", hidden=8, rank=8,
                       epochs=1, batch_size=256, progress=False, local_residuals=False)


@pytest.fixture(scope="module")
def two_quarter_model():
    """A tiny dbk-rbf of one tile in twenty of Puerto Rico's 2023Q2-2023Q4."""
    ds = load_sample_dataset("PR", quarters=["2023Q2", "2023Q3", "2023Q4"])
    ds = dataclasses.replace(ds, frame=ds.frame.sample(frac=0.05, random_state=0))
    return fit_dataset(ds, "dbk-rbf", hidden=8, rank=8, epochs=1, batch_size=256, progress=False,
                       local_residuals=False)


def test_grid_defaults_to_the_fitted_region_and_latest_quarter(dataset, model):
    # Mona Island and the coast have no tiles, but they are in the fitted region's polygon: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExtrapolationWarning)
        grid = model.grid(0.02, progress=False)
    expected = RegularGrid.over(dataset.region, 0.02)
    assert grid.attrs["region"] == "Puerto Rico" and grid.attrs["quarter"] == "2023Q4"
    assert grid["mean"].dims == ("y", "x")
    np.testing.assert_allclose(grid["x"].values, expected.x)
    np.testing.assert_allclose(grid["y"].values, expected.y)
    # cells inside the region polygon (not its bounding box) are filled, the others NaN
    inside = expected.inside_mask()
    assert 0 < inside.sum() < inside.size
    np.testing.assert_array_equal(np.isfinite(grid["mean"].values), inside)
    # and they hold the model's prediction at the cell centres
    lon, lat = np.meshgrid(expected.x, expected.y)
    at_cells = model.predict(np.column_stack([lon[inside], lat[inside]]), "2023Q4")
    np.testing.assert_allclose(grid["mean"].values[inside], at_cells.mean, rtol=1e-5)
    np.testing.assert_allclose(grid["sd"].values[inside], at_cells.sd, rtol=1e-5)


def test_grid_takes_a_region_crs_and_predict_grid_options(model):
    box = (-66.2, 18.3, -66.0, 18.45)
    grid = model.grid("2km", region=box, quarters="2023Q4", threshold=None, progress=False)
    assert grid.rio.crs.to_epsg() == 32619  # the box's UTM zone, for a resolution in metres
    assert grid.rio.resolution() == (2000.0, -2000.0)
    assert "p_below" not in grid
    inside = RegularGrid.over(box, "2km").inside_mask()  # the lon/lat box, a quadrilateral in UTM
    assert inside.sum() > 40
    np.testing.assert_array_equal(np.isfinite(grid["mean"].values), inside)
    with pytest.raises(InputDataError, match="resolution"):
        model.grid("fine", progress=False)


def test_region_survives_save_and_older_files_fall_back_to_the_training_tiles(tmp_path, dataset, model):
    model.save(tmp_path / "m.pt")
    loaded = GeoModel.load(tmp_path / "m.pt")
    assert loaded.fitted_region().geometry.equals(dataset.region.geometry)
    # a model file from before the region polygon was stored: the box of its training tiles
    older = dataclasses.replace(model, info=dataclasses.replace(model.info, region_wkb_hex=None))
    region = older.fitted_region()
    half_tile = 180.0 / 2**16
    west, south = model.support.min(axis=0) - half_tile
    east, north = model.support.max(axis=0) + half_tile
    assert region.name == "Puerto Rico"
    np.testing.assert_allclose(region.geometry.bounds, (west, south, east, north))
    assert shapely.contains_xy(region.geometry, model.support[:, 0], model.support[:, 1]).all()
    grid = older.grid(0.05, progress=False)
    inside = RegularGrid.over(region, 0.05).inside_mask()
    assert inside.sum() > 0.8 * inside.size  # a box: all but the edge cells that the snapped grid adds
    np.testing.assert_array_equal(np.isfinite(grid["mean"].values), inside)
    with pytest.raises(InputDataError, match="give a region"):
        dataclasses.replace(older, support=None).fitted_region()


def test_grid_maps_latest_all_or_listed_quarters_and_the_change_over_the_last_year(two_quarter_model):
    model = two_quarter_model
    assert model.map_time("latest") == "2023Q4" and model.map_time("all") == ["2023Q2", "2023Q3", "2023Q4"]
    assert model.map_time("2023q3") == "2023Q3" and model.map_time(["2023Q3", "2023Q4"]) == ["2023Q3", "2023Q4"]
    # fewer than five fitted quarters: the change runs from the first one
    assert model.change_span("last-year") == ("2023Q2", "2023Q4")
    assert model.change_span("2023Q3:2023Q4") == ("2023Q3", "2023Q4") and model.change_span(None) is None
    everything = model.grid(0.1, quarters="all", change="last-year", threshold=None, progress=False)
    assert [str(t) for t in everything["time"].dt.strftime("%Y-%m").values] == ["2023-04", "2023-07", "2023-10"]
    latest = model.grid(0.1, change=("2023Q3", "2023Q4"), threshold=None, progress=False)
    assert latest["mean"].dims == ("y", "x")
    inside = np.isfinite(latest["mean"].values)
    np.testing.assert_allclose(everything["mean"].values[-1][inside], latest["mean"].values[inside], rtol=1e-6)
    assert {"change", "change_sd"} <= set(everything.data_vars) and {"change", "change_sd"} <= set(latest.data_vars)


def test_a_change_needs_two_fitted_quarters_and_check_domain_refuses_far_places_and_quarters(model):
    with pytest.raises(InputDataError, match="two fitted quarters"):
        model.change_span("last-year")
    with pytest.raises(InputDataError, match="no quarter"):
        model.map_time([])
    with pytest.raises(InputDataError, match="two quarters"):
        model.change_span(("2023Q2", "2023Q3", "2023Q4"))
    model.check_domain(model.fitted_region().geometry)  # its own region and quarter: fine
    florida = shapely.box(-82.0, 27.0, -81.0, 28.0)
    with pytest.raises(InputDataError, match="outside"):
        model.check_domain(florida)
    with pytest.raises(InputDataError):
        model.check_domain(model.fitted_region().geometry, "2031Q1")
    with pytest.raises(InputDataError, match="outside"):  # before a single cell is predicted
        model.grid(0.1, region=florida, allow_extrapolation=False, progress=False)
