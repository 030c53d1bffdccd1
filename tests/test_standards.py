"""Outputs meet their published standards: Cloud-Optimized GeoTIFF (rio-cogeo) and GeoParquet metadata."""

from __future__ import annotations

import json
import re
from pathlib import Path

import geopandas as gpd
import numpy as np
import pyarrow.parquet as pq
import pyproj
import pytest
import shapely
from rio_cogeo.cogeo import cog_validate

import geodbk.io.accessor  # noqa: F401  (registers .dbk)
from geodbk.dataset.model_info import ModelInfo
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.io.geotiff import write_geotiff
from geodbk.io.vectors import write_tile_predictions
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.maps.summaries import write_summary
from geodbk.prediction import Prediction
from geodbk.quarters import Quarter

REGION = shapely.Point(-66.5, 18.2).buffer(0.3)


class SlopeModel:
    """mean = 1.5 + (lon + 66.5) log10 Mbps (+0.1 in 2023Q4), sd 0.2; a new measurement of k tests has
    variance sd^2 + 0.1 / k."""

    info = ModelInfo("slope", target="download", units="Mbps")
    targets = ("download",)
    has_kernel = False
    latest_quarter = Quarter(2023, 4)

    def predict(self, lonlat, time=None, *, tests=None):
        lonlat = np.asarray(lonlat, dtype=np.float64)
        mean = 1.5 + (lonlat[:, 0] + 66.5) + (0.1 if time in (None, Quarter(2023, 4)) else 0.0)
        sd = np.full(len(lonlat), 0.2)
        extra = None if tests is None else np.sqrt(sd**2 + 0.1 / np.asarray(tests, dtype=np.float64))
        return Prediction(mean, sd, extra)

    def predict_series(self, lonlat, times):
        return [self.predict(lonlat, when) for when in times]

    def predict_tiles(self, tiles):
        return self.predict(tiles[["lon", "lat"]].to_numpy(np.float64), tests=tiles["tests"].to_numpy(np.float64))


# --- Cloud-Optimized GeoTIFF --------------------------------------------------------------
@pytest.mark.parametrize("time", [None, ["2023Q3", "2023Q4"]], ids=["2-D", "time"])
def test_cog_output_validates_with_rio_cogeo(tmp_path, time):
    # 600 x 600 cells: large enough that a COG needs internal overviews
    ds = predict_grid(SlopeModel(), RegularGrid.over(REGION, 0.001), time=time, progress=False)
    valid, errors, warnings = cog_validate(write_geotiff(ds, tmp_path / "map.tif", cog=True), strict=True, quiet=True)
    assert (valid, errors, warnings) == (True, [], [])
    valid, errors, _ = cog_validate(ds.dbk.to_geotiff(tmp_path / "dbk.tif", ["mean", "p_below"], cog=True),
                                    strict=True, quiet=True)
    assert valid and not errors
    # the control: a plain tiled GeoTIFF of the same grid has no overviews, and strict validation says so
    valid, _, warnings = cog_validate(write_geotiff(ds, tmp_path / "plain.tif"), strict=True, quiet=True)
    assert not valid and any("overviews" in w for w in warnings)


# --- GeoParquet ---------------------------------------------------------------------------
def geo_metadata(path: Path) -> dict:
    metadata = pq.read_schema(path).metadata
    assert b"geo" in metadata, "no GeoParquet 'geo' key in the Parquet schema metadata"
    return json.loads(metadata[b"geo"])


def assert_valid_geoparquet(path: Path, frame: gpd.GeoDataFrame) -> None:
    """The file-level 'geo' metadata of GeoParquet 1.x (https://geoparquet.org/releases/v1.1.0/)
    describes ``frame``: version, primary column, WKB encoding, geometry types, bbox and the
    CRS as PROJJSON."""
    geo = geo_metadata(path)
    assert re.fullmatch(r"1\.\d+\.\d+(-[0-9A-Za-z.]+)?", geo["version"])
    assert geo["primary_column"] == frame.geometry.name
    assert set(geo["columns"]) == {frame.geometry.name}
    column = geo["columns"][frame.geometry.name]
    assert column["encoding"] == "WKB"
    assert set(column["geometry_types"]) == set(frame.geom_type.unique())
    np.testing.assert_allclose(column["bbox"], frame.total_bounds)
    crs = column["crs"]
    assert crs["type"] in ("GeographicCRS", "ProjectedCRS") and "projjson" in crs["$schema"]
    assert pyproj.CRS.from_json_dict(crs) == frame.crs
    assert crs["id"] == {"authority": "EPSG", "code": frame.crs.to_epsg()}
    back = gpd.read_parquet(path)
    assert back.crs == frame.crs and back.geometry.equals(frame.geometry.reset_index(drop=True))


@pytest.fixture(scope="module")
def dataset():
    return load_sample_dataset("PR", quarters=["2023Q4"])


def test_tile_predictions_are_valid_geoparquet(tmp_path, dataset):
    path = write_tile_predictions(SlopeModel(), dataset, tmp_path / "tiles.parquet")
    tiles = gpd.read_parquet(path)
    assert len(tiles) == int((dataset.frame["split"] == "test").sum())
    assert_valid_geoparquet(path, tiles)
    assert pyproj.CRS.from_json_dict(geo_metadata(path)["columns"]["geometry"]["crs"]).to_epsg() == 4326


def test_dataset_file_is_valid_geoparquet(tmp_path, dataset):
    path = dataset.save(tmp_path / "dataset.parquet")
    assert_valid_geoparquet(path, dataset.frame)


def test_area_summary_keeps_a_projected_crs_in_its_geoparquet(tmp_path):
    # two areas in NAD83 / Puerto Rico & Virgin Is. (metres): the summary keeps the polygons' CRS
    areas = gpd.GeoDataFrame(
        {"name": ["west", "east"], "mean_log10": [1.4, 1.7], "sd_log10": [0.1, 0.2]},
        geometry=[shapely.box(140_000, 230_000, 160_000, 250_000), shapely.box(200_000, 230_000, 230_000, 260_000)],
        crs="EPSG:32161",
    )
    path = write_summary(areas, tmp_path / "areas.parquet")
    assert_valid_geoparquet(path, areas)
    assert geo_metadata(path)["columns"]["geometry"]["crs"]["type"] == "ProjectedCRS"
