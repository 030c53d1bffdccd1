"""GeoTIFF / COG, NetCDF, Zarr and tile-prediction files re-open with the values written."""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pytest
import rasterio
import shapely
from scipy.stats import norm

from geodbk.dataset.model_info import ModelInfo
from geodbk.errors import InputDataError
from geodbk.io.cubes import write_netcdf, write_zarr
from geodbk.io.geotiff import GEOTIFF_NODATA, write_geotiff
from geodbk.io.vectors import tile_predictions, write_tile_predictions
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.maps.stores import open_grid
from geodbk.prediction import Z95, Prediction

REGION = shapely.Point(-66.5, 18.2).buffer(0.3)


def plane_mean(lon, lat):
    return 1.8 + 0.5 * (lon + 66.5) + (lat - 18.2)


def plane_sd(lat):
    return 0.2 + 0.1 * (lat - 18.0)


def plane_measurement_sd(lat, tests):
    """sd of a new measurement of ``tests`` speed tests: tile-mean variance + 0.3^2 / tests."""
    return np.sqrt(plane_sd(lat) ** 2 + 0.3**2 / tests)


class PlaneModel:
    """mean = plane_mean(lon, lat) (about 1.8, i.e. ~60 Mbps), sd = 0.2 + 0.1 (lat - 18), k(x, r) = exp(-|x - r|^2);
    a new measurement of k tests has sd = plane_measurement_sd(lat, k). Time-free: ``time`` is ignored."""

    info = ModelInfo("plane", target="download", units="Mbps")
    targets = ("download",)
    has_kernel = True
    latest_quarter = None  # time-free: maps the quarters a test names

    def predict(self, lonlat: np.ndarray, time=None, *, tests=None) -> Prediction:
        lonlat = np.asarray(lonlat, dtype=np.float64)
        extra = None if tests is None else plane_measurement_sd(lonlat[:, 1], np.asarray(tests, dtype=np.float64))
        return Prediction(plane_mean(lonlat[:, 0], lonlat[:, 1]), plane_sd(lonlat[:, 1]), extra)

    def predict_series(self, lonlat: np.ndarray, times) -> list:
        return [self.predict(lonlat, when) for when in times]

    def predict_tiles(self, tiles) -> Prediction:
        return self.predict(tiles[["lon", "lat"]].to_numpy(np.float64), tests=tiles["tests"].to_numpy(np.float64))

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time=None) -> np.ndarray:
        return np.exp(-((lonlat[:, None, :] - ref_lonlat[None]) ** 2).sum(-1))


@pytest.fixture(scope="module")
def grid_ds():
    grid = RegularGrid.over(REGION, 0.01)
    return grid, predict_grid(PlaneModel(), grid, refs={"metro": (-66.4, 18.3), "hills": (-66.6, 18.1)}, progress=False)


def test_geotiff_reopens_with_crs_transform_bands_and_nodata(tmp_path, grid_ds) -> None:
    grid, ds = grid_ds
    path = write_geotiff(ds, tmp_path / "map.tif")
    with rasterio.open(path) as src:
        assert src.crs.to_epsg() == 4326
        assert tuple(src.transform)[:6] == pytest.approx(tuple(grid.transform)[:6], abs=1e-12)
        assert (src.height, src.width) == grid.shape
        assert src.descriptions == (
            "mean", "sd", "pi_width", "mean_mbps", "lower_mbps", "upper_mbps", "p_below",
            "kernel_slice:metro", "kernel_slice:hills",
        )
        assert src.nodata == GEOTIFF_NODATA
        assert src.tags(1)["units"] == "log10(Mbps)" and src.tags(4)["units"] == "Mbps"
        mean = src.read(1)
        p_below = src.read(7)
        ks = src.read(9)
        # a cell inside the region: the model at the cell centre
        i, j = grid.height // 2, grid.width // 3
        lon, lat = src.xy(i, j)
        assert mean[i, j] == pytest.approx(plane_mean(lon, lat), rel=1e-6)
        sd = src.read(2)[i, j]
        assert p_below[i, j] == pytest.approx(norm.cdf((np.log10(35.0) - mean[i, j]) / sd), rel=1e-5)
        assert src.tags(7)["units"] == "1"
        assert ks[i, j] == pytest.approx(np.exp(-((lon + 66.6) ** 2 + (lat - 18.1) ** 2)), rel=1e-6)
        # cells outside the circle are nodata, in every band, and masked by rasterio
        inside = grid.inside_mask()
        assert (mean[~inside] == GEOTIFF_NODATA).all() and (mean[inside] != GEOTIFF_NODATA).all()
        assert (src.read_masks(6) == 0).sum() == (~inside).sum()


def test_geotiff_variable_selection_and_errors(tmp_path, grid_ds) -> None:
    _, ds = grid_ds
    path = write_geotiff(ds, tmp_path / "pi.tif", variables=["lower_mbps", "upper_mbps"])
    with rasterio.open(path) as src:
        assert src.count == 2 and src.descriptions == ("lower_mbps", "upper_mbps")
        lower, upper = src.read(masked=True)
        np.testing.assert_allclose(lower.compressed(), ds["lower_mbps"].to_masked_array().compressed(), rtol=1e-6)
        assert (upper > lower).compressed().all() and upper.count() == lower.count() > 0
    with pytest.raises(InputDataError, match="no variable"):
        write_geotiff(ds, tmp_path / "x.tif", variables=["nope"])


def test_cog_option_writes_tiled_cog_with_overviews(tmp_path) -> None:
    grid = RegularGrid.over(REGION, 0.001)  # 600 x 600: large enough for overviews
    ds = predict_grid(PlaneModel(), grid, progress=False)
    path = write_geotiff(ds, tmp_path / "map_cog.tif", variables=["mean", "sd"], cog=True)
    with rasterio.open(path) as src:
        assert src.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG"
        assert src.profile["tiled"] and src.block_shapes[0] == (256, 256)
        assert src.overviews(1) and src.overviews(1)[0] == 2
        assert src.descriptions == ("mean", "sd")
        assert src.nodata == GEOTIFF_NODATA
        np.testing.assert_array_equal(src.read(1, masked=True).filled(np.nan), np.nan_to_num(ds["mean"].values, nan=np.nan))


@pytest.mark.parametrize("fmt", ["netcdf", "zarr"])
def test_netcdf_and_zarr_round_trip(tmp_path, grid_ds, fmt: str) -> None:
    grid, ds = grid_ds
    path = write_netcdf(ds, tmp_path / "g.nc") if fmt == "netcdf" else write_zarr(ds, tmp_path / "g.zarr")
    back = open_grid(path)
    assert back.rio.crs.to_epsg() == 4326
    assert tuple(back.rio.transform())[:6] == pytest.approx(tuple(grid.transform)[:6])
    assert list(back["ref"].values) == ["metro", "hills"]
    for name in ds.data_vars:
        np.testing.assert_array_equal(back[name].values, ds[name].values)
        assert back[name].attrs["long_name"] == ds[name].attrs["long_name"]
    assert back.attrs["Conventions"] == "CF-1.8"


@pytest.fixture(scope="module")
def sample_dataset():
    from geodbk.dataset.spatial_dataset import load_sample_dataset

    return load_sample_dataset("PR", quarters=["2023Q4"])


@pytest.mark.parametrize("suffix", [".geojson", ".parquet"])
def test_tile_predictions_round_trip_through_geopandas(tmp_path, sample_dataset, suffix: str) -> None:
    model = PlaneModel()
    path = write_tile_predictions(model, sample_dataset, tmp_path / f"test_tiles{suffix}")
    back = gpd.read_file(path) if suffix == ".geojson" else gpd.read_parquet(path)
    test = sample_dataset.frame[sample_dataset.frame["split"] == "test"]
    assert len(back) == len(test)
    assert back.crs.to_epsg() == 4326
    assert list(back["quadkey"]) == list(test["quadkey"])
    assert set(back["urban_rural"]) <= {"urban", "rural"}
    assert (back["quarter"] == 4).all() and (back["year"] == 2023).all()
    np.testing.assert_array_equal(back["tests"], test["tests"])
    expected = plane_mean(test["lon"].to_numpy(), test["lat"].to_numpy())
    np.testing.assert_allclose(back["mean"], expected, rtol=1e-9)
    # each tile is scored as a new measurement with its own number of tests
    expected_sd = plane_measurement_sd(test["lat"].to_numpy(), test["tests"].to_numpy(np.float64))
    np.testing.assert_allclose(back["sd"], expected_sd, rtol=1e-9)
    np.testing.assert_allclose(back["mean_mbps"], 10**expected, rtol=1e-9)
    np.testing.assert_allclose(back["observed_mbps"], test["value"], rtol=1e-9)
    np.testing.assert_allclose(back["upper"] - back["lower"], 2 * Z95 * back["sd"], rtol=1e-9)
    np.testing.assert_allclose(back["lower_mbps"], 10 ** back["lower"], rtol=1e-9)
    np.testing.assert_array_equal(back["inside_pi"], (back["y"] >= back["lower"]) & (back["y"] <= back["upper"]))
    # the geometry is the tile polygon around the tile centre
    b = back.geometry.bounds
    np.testing.assert_allclose((b["minx"] + b["maxx"]) / 2, test["lon"], atol=1e-6)
    np.testing.assert_allclose((b["miny"] + b["maxy"]) / 2, test["lat"], atol=1e-3)


def test_tile_predictions_bad_input(tmp_path, sample_dataset) -> None:
    with pytest.raises(InputDataError, match="split"):
        tile_predictions(PlaneModel(), sample_dataset, split="holdout")
    with pytest.raises(InputDataError, match="geojson"):
        write_tile_predictions(PlaneModel(), sample_dataset, tmp_path / "tiles.csv")
