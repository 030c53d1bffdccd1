"""The .dbk accessor on grids: layout (quarters, one quarter, change span, cells), back-transform,
intervals, exceedance and GeoTIFF, on (y, x) and (time, y, x)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import rasterio
import shapely
import xarray as xr
from scipy.stats import norm

import geodbk.io.accessor  # noqa: F401  (registers .dbk)
from geodbk.dataset.model_info import ModelInfo
from geodbk.errors import InputDataError
from geodbk.io.cubes import write_netcdf, write_zarr
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.maps.stores import open_grid
from geodbk.prediction import ChangePrediction, Prediction
from geodbk.quarters import Quarter

REGION = shapely.Point(-66.5, 18.2).buffer(0.2)
QUARTERS = ["2023Q3", "2023Q4"]


def truth(lonlat: np.ndarray, quarter: Quarter | str | None) -> tuple[np.ndarray, np.ndarray]:
    """mean = 1.5 + 0.8 (lon + 66.5) (+0.1 in 2023Q4), sd = 0.15 + 0.2 (lat - 18): log10 Mbps around 35 Mbps."""
    step = 0.1 if quarter is not None and Quarter.parse(quarter) == Quarter(2023, 4) else 0.0
    return 1.5 + 0.8 * (lonlat[:, 0] + 66.5) + step, 0.15 + 0.2 * (lonlat[:, 1] - 18.0)


class QuarterModel:
    """A space-time stand-in whose predictive distribution is :func:`truth`."""

    info = ModelInfo("truth", target="download", units="Mbps", service="mobile")
    has_kernel = False
    latest_quarter = Quarter(2023, 4)

    def predict(self, lonlat, time=None):
        return Prediction(*truth(np.asarray(lonlat, dtype=np.float64), time or self.latest_quarter))

    def predict_series(self, lonlat, times):
        return [self.predict(lonlat, when) for when in times]


class ChangeModel(QuarterModel):
    """:class:`QuarterModel` with change layers: the change is the step of :func:`truth`, sd 0.05."""

    has_kernel = True

    def predict_change(self, lonlat, time_from, time_to):
        lonlat = np.asarray(lonlat, dtype=np.float64)
        (mean_from, sd_from), (mean_to, sd_to) = truth(lonlat, time_from), truth(lonlat, time_to)
        return ChangePrediction(mean_to - mean_from, np.full(len(lonlat), 0.05), mean_from, mean_to, sd_from, sd_to)


@pytest.fixture(scope="module")
def grid() -> RegularGrid:
    return RegularGrid.over(REGION, 0.01)


@pytest.fixture(scope="module", params=["2-D", "time"])
def ds(request, grid) -> xr.Dataset:
    time = QUARTERS if request.param == "time" else None
    return predict_grid(QuarterModel(), grid, time=time, progress=False)


def expected(ds: xr.Dataset, grid: RegularGrid) -> tuple[np.ndarray, np.ndarray]:
    """mean and sd of :func:`truth` at every cell, shaped like ds["mean"], NaN outside the region."""
    inside = grid.inside_mask()
    lon, lat = np.meshgrid(grid.x, grid.y)
    quarters = [str(q) for q in ds["quarter"].values] if "time" in ds.dims else ["2023Q4"]
    means, sds = [], []
    for quarter in quarters:
        mean, sd = truth(np.column_stack([lon.ravel(), lat.ravel()]), quarter)
        means.append(np.where(inside, mean.reshape(grid.shape), np.nan))
        sds.append(np.where(inside, sd.reshape(grid.shape), np.nan))
    shape = ds["mean"].shape
    return np.stack(means).reshape(shape), np.stack(sds).reshape(shape)


def test_quarters_and_one_quarter_of_a_grid(ds, grid):
    mean, _ = expected(ds, grid)
    if "time" in ds.dims:
        assert ds.dbk.quarters == [Quarter(2023, 3), Quarter(2023, 4)]
        np.testing.assert_array_equal(ds.dbk.at("2023q3")["mean"].values, ds["mean"].values[0])
        np.testing.assert_allclose(ds.dbk.at(Quarter(2023, 3))["mean"].values, mean[0], rtol=1e-6)
    else:
        assert ds.dbk.quarters == [Quarter(2023, 4)]
        assert ds.dbk.at("2023Q4") is ds
    last = ds.dbk.at()
    assert last["mean"].dims == ("y", "x")
    assert not {"time", "quarter", "time_bounds"} & set(last.variables)
    np.testing.assert_allclose(last["mean"].values, mean.reshape(-1, *grid.shape)[-1], rtol=1e-6)
    assert last.rio.crs == ds.rio.crs
    with pytest.raises(InputDataError, match="no quarter 2022Q1"):
        ds.dbk.at("2022Q1")
    assert ds.dbk.change_span is None


def test_cells_inside_a_geometry(ds, grid):
    mapped = ds.dbk.cells_inside()
    assert mapped.dims == ("y", "x") and mapped.dtype == bool
    np.testing.assert_array_equal(mapped.values, grid.inside_mask())
    west = shapely.box(-66.8, 17.8, -66.5, 18.6)  # the western half of the region, in the grid's CRS
    lon, _ = np.meshgrid(grid.x, grid.y)
    np.testing.assert_array_equal(ds.dbk.cells_inside(west).values, grid.inside_mask() & (lon <= -66.5))
    assert not ds.dbk.cells_inside(shapely.box(0, 0, 1, 1)).any()


def test_change_span_of_a_change_grid(grid):
    ds = predict_grid(ChangeModel(), grid, time=QUARTERS, change=("2023Q3", "2023Q4"), progress=False)
    assert ds.dbk.change_span == (Quarter(2023, 3), Quarter(2023, 4))
    without_attr = ds.copy()
    del without_attr.attrs["change"]
    assert without_attr.dbk.change_span == (Quarter(2023, 3), Quarter(2023, 4))  # from the change variable
    np.testing.assert_allclose(ds.dbk.at()["change"].values[grid.inside_mask()], 0.1, rtol=1e-5)
    with pytest.raises(InputDataError, match="FROM:TO"):
        _ = ds.assign_attrs(change="2023Q3").dbk.change_span


@pytest.mark.parametrize("writer", [write_netcdf, write_zarr, "netcdf-sink"])
def test_layout_survives_netcdf_and_zarr(tmp_path, grid, writer):
    ds = predict_grid(ChangeModel(), grid, time=QUARTERS, change=("2023Q3", "2023Q4"), progress=False)
    if writer == "netcdf-sink":  # streamed block by block into the file
        predict_grid(
            ChangeModel(), grid, time=QUARTERS, change=("2023Q3", "2023Q4"), progress=False, store=tmp_path / "grid.nc"
        ).close()
        path = tmp_path / "grid.nc"
    else:
        path = writer(ds, tmp_path / ("grid.nc" if writer is write_netcdf else "grid.zarr"))
    with open_grid(path) as back:
        assert back.dbk.quarters == ds.dbk.quarters
        assert back.dbk.change_span == ds.dbk.change_span
        np.testing.assert_array_equal(back.dbk.cells_inside().values, ds.dbk.cells_inside().values)
        for quarter in QUARTERS:
            np.testing.assert_array_equal(back.dbk.at(quarter)["mean"].values, ds.dbk.at(quarter)["mean"].values)
        assert back.dbk.at().rio.crs == ds.rio.crs


def test_data_units_are_the_back_transform_of_mean_and_sd(ds, grid):
    mean, sd = expected(ds, grid)
    out = ds.dbk.mbps()
    assert list(out.data_vars) == ["mean_mbps", "lower_mbps", "upper_mbps"]
    for name in out.data_vars:
        assert out[name].dims == ds["mean"].dims
        assert out[name].attrs["units"] == "Mbps"
        # the same numbers as the layers the grid was written with (float32 there)
        np.testing.assert_allclose(out[name].values, ds[name].values, rtol=1e-5)
    np.testing.assert_allclose(out["mean_mbps"].values, 10**mean, rtol=1e-5)
    np.testing.assert_allclose(out["lower_mbps"].values, 10 ** (mean - 1.959964 * sd), rtol=1e-5)
    np.testing.assert_allclose(out["upper_mbps"].values, 10 ** (mean + 1.959964 * sd), rtol=1e-5)
    assert np.isnan(out["mean_mbps"].values).sum() == np.isnan(mean).sum() > 0  # outside the region
    assert out.rio.crs == ds.rio.crs and out.rio.transform() == ds.rio.transform()
    xr.testing.assert_identical(ds.dbk.to_data_units(), out)


def test_pi_bounds_in_log10(ds, grid):
    mean, sd = expected(ds, grid)
    bounds = ds.dbk.pi_bounds()
    np.testing.assert_allclose(bounds["lower"].values, mean - 1.959964 * sd, rtol=1e-5)
    np.testing.assert_allclose(bounds["upper"].values, mean + 1.959964 * sd, rtol=1e-5)
    np.testing.assert_allclose(10 ** bounds["upper"].values, ds["upper_mbps"].values, rtol=1e-5)
    assert bounds["lower"].attrs["units"] == "log10(Mbps)" and bounds["upper"].dims == ds["mean"].dims


def test_exceedance_and_p_below(ds, grid):
    mean, sd = expected(ds, grid)
    below = ds.dbk.p_below(50.0)
    np.testing.assert_allclose(below.values, norm.cdf((np.log10(50.0) - mean) / sd), rtol=1e-5, atol=1e-7)
    assert below.attrs["threshold"] == 50.0 and below.dims == ds["mean"].dims
    above = ds.dbk.exceedance(50.0)
    np.testing.assert_allclose(above.values, 1.0 - below.values)
    assert "above 50 Mbps" in above.attrs["long_name"]
    # without a threshold: the grid's own (the FCC mobile benchmark, 35 Mbps), as its p_below layer
    assert ds.attrs["threshold"] == 35.0
    np.testing.assert_allclose(ds.dbk.p_below().values, ds["p_below"].values, rtol=1e-5, atol=1e-7)
    with pytest.raises(InputDataError, match="threshold"):
        ds.dbk.p_below(-1.0)


def test_to_geotiff_writes_every_band(tmp_path, ds):
    path = ds.dbk.to_geotiff(tmp_path / "map.tif", ["mean", "sd"])
    with rasterio.open(path) as src:
        if "time" in ds.dims:
            assert src.descriptions == ("mean:2023Q3", "sd:2023Q3", "mean:2023Q4", "sd:2023Q4")
            first = src.read(3, masked=True).filled(np.nan)  # mean in 2023Q4
            np.testing.assert_array_equal(first, ds["mean"].sel(time=ds["time"][1]).values)
        else:
            assert src.descriptions == ("mean", "sd")
            np.testing.assert_array_equal(src.read(1, masked=True).filled(np.nan), ds["mean"].values)
        assert src.crs.to_epsg() == 4326


def test_a_lazy_grid_stays_lazy(tmp_path, grid):
    ds = predict_grid(QuarterModel(), grid, time=QUARTERS, progress=False)
    back = open_grid(write_zarr(ds, tmp_path / "g.zarr"))
    out = back.dbk.to_data_units()
    assert out["upper_mbps"].chunks is not None  # dask-backed until asked
    np.testing.assert_allclose(out["upper_mbps"].values, ds["upper_mbps"].values, rtol=1e-5)
    assert back.dbk.p_below().chunks is not None


def test_not_a_grid_or_not_speed_is_a_clear_error(ds):
    with pytest.raises(InputDataError, match="not a geodbk grid: no sd"):
        ds.drop_vars("sd").dbk.to_data_units()
    latency = ds.assign_attrs(units="ms", target="latency")
    with pytest.raises(InputDataError, match="in ms"):
        latency.dbk.mbps()
    assert list(latency.dbk.to_data_units().data_vars) == ["mean_ms", "lower_ms", "upper_ms"]
    no_threshold = ds.copy()
    del no_threshold.attrs["threshold"]
    with pytest.raises(InputDataError, match="no threshold"):
        no_threshold.dbk.exceedance()


def test_geodbk_registers_dbk_when_grids_are_used_and_not_before():
    code = (
        "import sys, geodbk\n"
        "light = 'xarray' not in sys.modules\n"
        "geodbk.open_grid\n"
        "import xarray as xr\n"
        "print(light, hasattr(xr.Dataset, 'dbk'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
