"""Regular grids, region masks and chunked prediction, checked against an analytic model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyproj
import pytest
import shapely

from geodbk.dataset.model_info import ModelInfo
from geodbk.errors import InputDataError
from geodbk.maps.geometry import RegularGrid, parse_resolution
from geodbk.maps.predict import predict_grid
from geodbk.maps.reference import parse_refs, reference_points
from geodbk.maps.stores import open_grid
from geodbk.prediction import Z95
from geodbk.quarters import Quarter

PR_BBOX = (-67.3, 17.9, -65.6, 18.55)


class PlaneModel:
    """mean = lon + 2 lat, sd = 0.1 + 0.01 |lat|, k(x, r) = exp(-|x - r|^2), the same at every
    quarter; records its inputs (points and the quarters asked for)."""

    info = ModelInfo("plane", target="download", units="Mbps")
    has_kernel = True
    latest_quarter = None  # time-free: maps the quarters a test names

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []
        self.times: list[Quarter | None] = []

    @staticmethod
    def mean(lonlat: np.ndarray) -> np.ndarray:
        return lonlat[:, 0] + 2.0 * lonlat[:, 1]

    @staticmethod
    def sd(lonlat: np.ndarray) -> np.ndarray:
        return 0.1 + 0.01 * np.abs(lonlat[:, 1])

    def predict(self, lonlat: np.ndarray, time: Quarter | None = None) -> SimpleNamespace:
        lonlat = np.asarray(lonlat, dtype=np.float64)
        self.seen.append(lonlat)
        self.times.append(time)
        return SimpleNamespace(mean=self.mean(lonlat), sd=self.sd(lonlat))

    def predict_series(self, lonlat: np.ndarray, times) -> list:
        return [self.predict(lonlat, when) for when in times]

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: str | None = None) -> np.ndarray:
        self.times.append(time)
        d2 = ((lonlat[:, None, :] - ref_lonlat[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2)


class KernelFreePlane(PlaneModel):
    """The plane without a kernel (like knn): asking it for a kernel slice is an error."""

    has_kernel = False

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: str | None = None) -> np.ndarray:
        raise AssertionError("kernel_slice called on a model without a kernel")


def test_parse_resolution_units() -> None:
    assert parse_resolution(0.01) == (0.01, None)
    assert parse_resolution("0.01") == (0.01, None)
    assert parse_resolution("0.01deg") == (0.01, "deg")
    assert parse_resolution("500m") == (500.0, "m")
    assert parse_resolution("2km") == (2000.0, "m")
    for bad in ("-1", "abc", "0", "5 miles"):
        with pytest.raises(InputDataError):
            parse_resolution(bad)


def test_grid_geometry_is_north_up_with_cell_centres() -> None:
    grid = RegularGrid.over(PR_BBOX, 0.05)
    assert grid.crs.to_epsg() == 4326
    # edges snapped to multiples of the resolution, covering the bbox
    assert grid.transform.c == pytest.approx(-67.3) and grid.transform.f == pytest.approx(18.55)
    assert grid.shape == (13, 34)
    assert grid.x[0] == pytest.approx(-67.275) and grid.y[0] == pytest.approx(18.525)
    assert np.all(np.diff(grid.y) < 0) and np.all(np.diff(grid.x) > 0)
    ds = predict_grid(PlaneModel(), grid, progress=False)
    assert ds["mean"].dims == ("y", "x")
    assert ds.rio.crs.to_epsg() == 4326
    assert "spatial_ref" in ds.coords
    np.testing.assert_allclose(tuple(ds.rio.transform(recalc=True))[:6], tuple(grid.transform)[:6], atol=1e-9)
    assert ds["x"].attrs["standard_name"] == "longitude" and ds["y"].attrs["units"] == "degrees_north"
    assert ds["mean"].attrs["units"] == "log10(Mbps)" and ds["mean_mbps"].attrs["units"] == "Mbps"
    assert all(ds[v].dtype == np.float32 for v in ds.data_vars)


def test_cell_values_equal_model_at_cell_centre() -> None:
    model = PlaneModel()
    grid = RegularGrid.over(PR_BBOX, 0.1)
    ds = predict_grid(model, grid, refs={"a": (-66.0, 18.3)}, time="2023Q2", progress=False)
    # mean, sd and kernel slice all at the quarter asked for, which the attrs name
    assert model.times and set(model.times) == {Quarter(2023, 2)}
    assert ds.attrs["quarter"] == "2023Q2"
    lon, lat = np.meshgrid(grid.x, grid.y)
    lonlat = np.column_stack([lon.ravel(), lat.ravel()])
    mean, sd = model.mean(lonlat).reshape(grid.shape), model.sd(lonlat).reshape(grid.shape)
    # the snapped grid overhangs the bbox by one row; centres on or outside its edge are masked
    outside = ~shapely.contains_xy(shapely.box(*PR_BBOX), lon, lat)
    assert outside[0].all() and not outside[1:].any()
    for arr in (mean, sd, lon, lat):
        arr[outside] = np.nan
    np.testing.assert_allclose(ds["mean"].values, mean, rtol=1e-6)
    np.testing.assert_allclose(ds["sd"].values, sd, rtol=1e-6)
    np.testing.assert_allclose(ds["pi_width"].values, 2 * Z95 * sd, rtol=1e-6)
    np.testing.assert_allclose(ds["mean_mbps"].values, 10**mean, rtol=1e-5)
    np.testing.assert_allclose(ds["lower_mbps"].values, 10 ** (mean - Z95 * sd), rtol=1e-5)
    np.testing.assert_allclose(ds["upper_mbps"].values, 10 ** (mean + Z95 * sd), rtol=1e-5)
    k = np.exp(-((lon + 66.0) ** 2 + (lat - 18.3) ** 2))
    assert ds["kernel_slice"].dims == ("ref", "y", "x")
    np.testing.assert_allclose(ds["kernel_slice"].sel(ref="a").values, k, rtol=1e-6)
    assert float(ds["ref_lon"].sel(ref="a")) == -66.0


def test_model_without_kernel_gets_no_kernel_slice() -> None:
    grid = RegularGrid.over(PR_BBOX, 0.1)
    with_kernel = predict_grid(PlaneModel(), grid, refs={"a": (-66.0, 18.3)}, progress=False)
    ds = predict_grid(KernelFreePlane(), grid, refs={"a": (-66.0, 18.3)}, progress=False)
    assert "kernel_slice" not in ds.data_vars and "kernel_slice" in with_kernel.data_vars
    assert set(ds.data_vars) == set(with_kernel.data_vars) - {"kernel_slice"}
    for name in ds.data_vars:
        np.testing.assert_array_equal(ds[name].values, with_kernel[name].values)


def test_cells_outside_region_are_nan_and_not_predicted() -> None:
    triangle = shapely.Polygon([(-67.0, 18.0), (-66.0, 18.0), (-66.5, 18.5)])
    model = PlaneModel()
    grid = RegularGrid.over(triangle, 0.02)
    ds = predict_grid(model, grid, chunk_rows=5, progress=False)
    lon, lat = np.meshgrid(grid.x, grid.y)
    inside = shapely.contains_xy(triangle, lon, lat)
    assert 0 < inside.sum() < inside.size
    assert np.isfinite(ds["mean"].values[inside]).all()
    assert np.isnan(ds["mean"].values[~inside]).all()
    assert np.isnan(ds["upper_mbps"].values[~inside]).all()
    seen = np.concatenate(model.seen)
    assert len(seen) == inside.sum()
    assert shapely.contains_xy(triangle, seen[:, 0], seen[:, 1]).all()
    np.testing.assert_array_equal(grid.inside_mask(), inside)


@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
def test_chunked_and_unchunked_grids_are_identical(chunk_rows: int) -> None:
    grid = RegularGrid.over(shapely.Point(-66.5, 18.2).buffer(0.4), 0.03)
    refs = {"a": (-66.4, 18.1), "b": (-66.7, 18.3)}
    whole = predict_grid(PlaneModel(), grid, refs=refs, chunk_rows=grid.height, progress=False)
    chunked = predict_grid(PlaneModel(), grid, refs=refs, chunk_rows=chunk_rows, progress=False)
    for name in whole.data_vars:
        np.testing.assert_array_equal(chunked[name].values, whole[name].values)


def test_metre_resolution_uses_utm_zone_and_cell_size() -> None:
    model = PlaneModel()
    grid = RegularGrid.over(PR_BBOX, "5km")
    assert grid.crs.to_epsg() == 32619  # PR's centre lon -66.45 is in UTM zone 19N
    assert grid.transform.a == 5000.0 and grid.transform.e == -5000.0
    ds = predict_grid(model, grid, progress=False)
    assert ds.rio.crs.to_epsg() == 32619
    assert ds["x"].attrs["standard_name"] == "projection_x_coordinate" and ds["x"].attrs["units"] == "metre"
    np.testing.assert_allclose(np.diff(ds["x"].values), 5000.0)
    np.testing.assert_allclose(np.diff(ds["y"].values), -5000.0)
    # the value of a cell is the model at the cell centre transformed to lon/lat
    i, j = np.argwhere(np.isfinite(ds["mean"].values))[len(np.argwhere(np.isfinite(ds["mean"].values))) // 2]
    to_ll = pyproj.Transformer.from_crs(32619, 4326, always_xy=True)
    lon, lat = to_ll.transform(grid.x[j], grid.y[i])
    assert float(ds["mean"][i, j]) == pytest.approx(lon + 2 * lat, rel=1e-6)


def test_other_crs_on_request() -> None:
    ds = predict_grid(PlaneModel(), RegularGrid.over(PR_BBOX, 2000, crs="EPSG:32161"), progress=False)
    assert ds.rio.crs.to_epsg() == 32161
    assert ds.rio.resolution() == pytest.approx((2000.0, -2000.0))
    # a cell is masked exactly when its centre, taken back to lon/lat, is outside the bbox
    x, y = np.meshgrid(ds["x"].values, ds["y"].values)
    lon, lat = pyproj.Transformer.from_crs(32161, 4326, always_xy=True).transform(x, y)
    inside = shapely.contains_xy(shapely.box(*PR_BBOX), lon, lat)
    edge = shapely.distance(shapely.box(*PR_BBOX).boundary, shapely.points(lon, lat)) < 1e-3
    np.testing.assert_array_equal(np.isfinite(ds["mean"].values)[~edge], inside[~edge])
    assert inside.mean() > 0.8
    with pytest.raises(InputDataError, match="geographic"):
        RegularGrid.over(PR_BBOX, "500m", crs="EPSG:4326")
    with pytest.raises(InputDataError, match="projected"):
        RegularGrid.over(PR_BBOX, "0.01deg", crs="EPSG:32161")


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_streaming_to_store_matches_memory(tmp_path, suffix: str) -> None:
    grid = RegularGrid.over(shapely.Point(-66.5, 18.2).buffer(0.3), 0.02)
    refs = {"a": (-66.4, 18.1)}
    memory = predict_grid(PlaneModel(), grid, refs=refs, progress=False)
    stored = predict_grid(PlaneModel(), grid, refs=refs, chunk_rows=3, store=tmp_path / f"g{suffix}", progress=False)
    reopened = open_grid(tmp_path / f"g{suffix}")
    for ds in (stored, reopened):
        assert ds.rio.crs.to_epsg() == 4326
        assert tuple(ds.rio.transform())[:6] == pytest.approx(tuple(grid.transform)[:6])
        for name in memory.data_vars:
            np.testing.assert_array_equal(ds[name].values, memory[name].values)
        assert ds["mean"].attrs["units"] == "log10(Mbps)"
    with pytest.raises(InputDataError):
        predict_grid(PlaneModel(), grid, store=tmp_path / "g.tif", progress=False)


def test_parse_refs() -> None:
    assert parse_refs(["sanjuan:-66.06,18.45", "x:1,2"]) == {"sanjuan": (-66.06, 18.45), "x": (1.0, 2.0)}
    for bad in ("sanjuan", "a:1", "a:1,2,3", "a:x,y", "a:200,0"):
        with pytest.raises(InputDataError):
            parse_refs([bad])


def test_reference_points_urban_rural_wildland() -> None:
    import geopandas as gpd

    rng = np.random.default_rng(0)
    urban = np.array([-66.1, 18.4]) + rng.normal(0, 0.005, (200, 2))
    rural = np.array([-67.0, 18.1]) + rng.normal(0, 0.02, (50, 2))
    sparse_urban = np.array([[-66.9, 18.45], [-66.3, 18.05]])
    lonlat = np.vstack([urban, rural, sparse_urban])
    labels = ["urban"] * 200 + ["rural"] * 50 + ["urban"] * 2
    frame = gpd.GeoDataFrame(
        {"quadkey": [str(i) for i in range(len(lonlat))], "lon": lonlat[:, 0], "lat": lonlat[:, 1], "urban_rural": labels},
        geometry=gpd.points_from_xy(lonlat[:, 0], lonlat[:, 1]),
        crs="EPSG:4326",
    )
    region = SimpleNamespace(name="box", geometry=shapely.box(-67.2, 17.95, -65.9, 18.5))
    refs = reference_points(SimpleNamespace(frame=frame, region=region))
    assert set(refs) == {"urban", "rural", "wildland"}
    assert np.hypot(refs["urban"][0] + 66.1, refs["urban"][1] - 18.4) < 0.01
    assert np.hypot(refs["rural"][0] + 67.0, refs["rural"][1] - 18.1) < 0.05
    # farthest from all tiles inside the box: the south-east corner
    assert refs["wildland"][0] > -66.0 and refs["wildland"][1] < 18.05


def test_puerto_rico_region_mask_and_sample_refs() -> None:
    from geodbk.dataset.spatial_dataset import load_sample_dataset

    dataset = load_sample_dataset("PR", quarters=["2023Q4"])
    grid = RegularGrid.over(dataset.region, 0.02)
    inside = grid.inside_mask()
    # the island and its small islands cover a fraction of the bbox; sea cells are masked
    assert 0.2 < inside.mean() < 0.8
    refs = reference_points(dataset, grid)
    assert set(refs) == {"urban", "rural", "wildland"}
    for lon, lat in refs.values():
        assert dataset.region.geometry.buffer(0.02).contains(shapely.Point(lon, lat))
    # San Juan metro holds the densest urban tiles
    assert -66.3 < refs["urban"][0] < -65.9 and 18.3 < refs["urban"][1] < 18.5


def test_utm_zone_is_the_zone_of_the_centre_and_polar_centres_are_refused() -> None:
    from geodbk.errors import RegionError
    from geodbk.maps.geometry import utm_crs_for

    cases = {
        (-67.3, 17.9, -65.2, 18.5): 32619,  # Puerto Rico
        (-160.3, 18.9, -154.8, 22.3): 32604,  # Hawaii, centre in zone 4
        (150.0, -35.0, 151.0, -34.0): 32756,  # Sydney, southern hemisphere
        (179.5, 0.0, 179.99, 1.0): 32660,  # the last zone
        (-180.0, 10.0, -179.5, 11.0): 32601,  # the first zone
    }
    for bounds, epsg in cases.items():
        assert utm_crs_for(shapely.box(*bounds)).to_epsg() == epsg, bounds
    with pytest.raises(RegionError, match="no UTM zone"):
        utm_crs_for(shapely.box(0.0, 85.0, 1.0, 89.0))
