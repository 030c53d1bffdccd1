"""GeoModel.grid: a verde-style map over the fitted region by default, and its fallback for older model files."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import shapely

from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.fit.geomodel import GeoModel, fit_dataset
from geodbk.fit.protocol import map_model_config
from geodbk.maps.geometry import RegularGrid
from geodbk.models.config import TrainConfig

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def dataset():
    """One tile in ten of Puerto Rico's 2023Q4 sample, spread over the island."""
    ds = load_sample_dataset("PR", quarters=["2023Q4"])
    return dataclasses.replace(ds, frame=ds.frame.sample(frac=0.1, random_state=0))


@pytest.fixture(scope="module")
def model(dataset):
    return fit_dataset(dataset, "dbk-rbf", model_config=map_model_config("space-time", hidden=8, rank=8),
                       train_config=TrainConfig(epochs=1, batch_size=256, progress=False), local_residuals=False)


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
    grid = model.grid("2km", region=box, quarter="2023Q4", threshold=None, progress=False)
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
    older = dataclasses.replace(model, meta={k: v for k, v in model.meta.items() if k != "region_wkb_hex"})
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
