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
from geodbk.quarters import Quarter

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
    q2, q3, q4 = Quarter(2023, 2), Quarter(2023, 3), Quarter(2023, 4)
    assert model.map_time("latest") == q4 and model.map_time("all") == [q2, q3, q4]
    assert model.map_time("2023q3") == q3 == model.map_time(q3) and model.map_time(["2023Q3", q4]) == [q3, q4]
    # fewer than five fitted quarters: the change runs from the first one
    assert model.change_span("last-year") == (q2, q4)
    assert model.change_span("2023Q3:2023Q4") == (q3, q4) == model.change_span((q3, "2023Q4"))
    assert model.change_span(None) is None
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


def test_a_forecast_split_model_gives_one_answer_to_which_quarters_it_fitted():
    """The forecast split holds the last quarter (2023Q4) out as its test set, so the model's
    fitted quarters are 2023Q2-2023Q3, and every reader agrees: ``map_time``, the quarters of
    the demo's "all" map (the dashboard's quarter slider), the forecast allowance that
    ``geodbk predict --quarter`` checks, and the demo's check before it fits."""
    from geodbk.cli.options import check_domain
    from geodbk.dataset.splits import fitted_quarters
    from geodbk.viewer import grid_quarters, shown_quarter

    ds = load_sample_dataset("PR", quarters=["2023Q2", "2023Q3", "2023Q4"], split="forecast")
    ds = dataclasses.replace(ds, frame=ds.frame.sample(frac=0.05, random_state=0))
    model = fit_dataset(ds, "knn")
    q2, q3, q4 = Quarter(2023, 2), Quarter(2023, 3), Quarter(2023, 4)
    assert model.info.quarters == (q2, q3, q4)  # the dataset's, the held-out test quarter included
    assert model.info.fitted_quarters == (q2, q3) == fitted_quarters(ds.quarters, "forecast")
    assert model.info.last_fitted_quarter == model.latest_quarter == q3
    # map_time: "latest" and "all" are the fitted quarters
    assert model.map_time("latest") == q3 and model.map_time("all") == [q2, q3]
    # the dashboard's slider: the quarters of the run's map, its default the last
    grid = model.grid(0.1, quarters="all", threshold=None, progress=False)
    assert grid_quarters(grid) == [q2, q3] and shown_quarter(grid, None, None) == q3
    # --quarter: the forecast allowance starts at the same last fitted quarter
    report = model.domain_report(np.array([[-66.5, 18.2]]), [q4])
    assert report.fitted == (q2.years, q3.years) and report.quarters_after == 1
    region = model.fitted_region().geometry
    check_domain(model, region, q4, allow=False)  # the held-out quarter: a forecast, still allowed
    with pytest.raises(InputDataError, match="--allow-extrapolation"):
        check_domain(model, region, q4.shift(1), allow=False)
    assert str(model.map_time(q4)) == "2023Q4"  # and mapped when named
