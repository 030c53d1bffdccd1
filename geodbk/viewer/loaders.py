"""Cached readers of run-folder files, shared by every page a viewer serves.

Each reader is keyed by the file's path and its modification time (:func:`stamp`), so a file
rewritten in place (a new ``geodbk demo`` into the same folder) is read again, and a page
never sees a stale model next to a fresh grid. What they return is shared: do not mutate it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import xarray as xr

from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.fit.geomodel import GeoModel
from geodbk.ingest.regions import read_polygons
from geodbk.io.vectors import tile_predictions
from geodbk.maps.stores import open_grid
from geodbk.maps.summaries import polygons_in_region, summarize_polygons
from geodbk.quarters import Quarter
from geodbk.viewer.cells import at_quarter, grid_cells_lonlat
from geodbk.viewer.correlation import posterior_correlation
from geodbk.viewer.decisions import check_table, hexagon_columns
from geodbk.viewer.mercator import mercator_raster


def stamp(path: Path) -> float:
    """Modification time of ``path`` (seconds since the epoch), the cache key of its contents."""
    return path.stat().st_mtime


@functools.lru_cache(maxsize=8)
def load_dataset(path: str, stamp: float) -> SpatialDataset:
    """A run's ``dataset.parquet``."""
    return SpatialDataset.load(path)


@functools.lru_cache(maxsize=16)
def load_model(path: str, stamp: float) -> GeoModel:
    """A saved ``models/<kind>.pt``."""
    return GeoModel.load(path)


@functools.lru_cache(maxsize=16)
def load_grid(path: str, stamp: float) -> xr.Dataset:
    """A saved grid (``maps/<kind>.nc``), read into memory."""
    with open_grid(path) as ds:
        return ds.load()


@functools.lru_cache(maxsize=128)
def mercator_layer(path: str, stamp: float, variable: str, quarter: Quarter | None) -> xr.DataArray:
    """One grid variable at one quarter (2-D grids: the only one), warped to Web Mercator."""
    return mercator_raster(at_quarter(load_grid(path, stamp)[variable], quarter))


@functools.lru_cache(maxsize=32)
def prior_variance(model_path: str, grid_path: str, stamps: tuple[float, float], quarter: Quarter | None) -> np.ndarray:
    """``(m,)`` prior variance k(x, x) in (log10 units)² at the grid cells inside the region
    (in the order of :func:`geodbk.viewer.cells.grid_cells_lonlat`), at ``quarter``."""
    lonlat, _ = grid_cells_lonlat(load_grid(grid_path, stamps[1]))
    return load_model(model_path, stamps[0]).prior_variance(lonlat, quarter)


@functools.lru_cache(maxsize=32)
def cells_posterior_correlation(
    model_path: str, grid_path: str, stamps: tuple[float, float], ref: tuple[float, float], quarter: Quarter | None
) -> np.ndarray:
    """``(m,)`` posterior correlation of the first target between the grid cells inside the
    region (as :func:`prior_variance`) and ``ref`` at ``quarter``
    (:func:`geodbk.viewer.correlation.posterior_correlation`)."""
    lonlat, _ = grid_cells_lonlat(load_grid(grid_path, stamps[1]))
    return posterior_correlation(load_model(model_path, stamps[0]), lonlat, ref, quarter)


@functools.lru_cache(maxsize=8)
def load_hexagons(path: str, stamp: float) -> gpd.GeoDataFrame:
    """A run's hexagon table (``decisions/<kind>_h3.parquet``), its columns checked."""
    return check_table(gpd.read_parquet(path))


@functools.lru_cache(maxsize=8)
def hexagon_plot_columns(path: str, stamp: float) -> dict[str, object]:
    """:func:`geodbk.viewer.decisions.hexagon_columns` of a hexagon table (its Mercator rings)."""
    return hexagon_columns(load_hexagons(path, stamp))


@functools.lru_cache(maxsize=8)
def load_plan(path: str, stamp: float) -> gpd.GeoDataFrame:
    """A run's visit plan (``decisions/<kind>_plan.parquet``)."""
    return gpd.read_parquet(path)


@functools.lru_cache(maxsize=16)
def scored_test_tiles(model_path: str, dataset_path: str, stamps: tuple[float, float]) -> pd.DataFrame:
    """:func:`geodbk.io.vectors.tile_predictions` of a model at its run's test tiles, without geometry."""
    model = load_model(model_path, stamps[0])
    dataset = load_dataset(dataset_path, stamps[1])
    return pd.DataFrame(tile_predictions(model, dataset, split="test").drop(columns="geometry"))


@functools.lru_cache(maxsize=4)
def load_polygons(path: str, stamp: float) -> gpd.GeoDataFrame:
    """A polygon file (GeoJSON, shapefile zip, GeoPackage, GeoParquet) in lon/lat."""
    return read_polygons(path, what="polygon")


@functools.lru_cache(maxsize=8)
def region_polygons(polygons_path: str, dataset_path: str, stamps: tuple[float, float]) -> gpd.GeoDataFrame:
    """The polygons of the file that meet the run's region (a county file has thousands more)."""
    polygons = load_polygons(polygons_path, stamps[0])
    return polygons_in_region(polygons, load_dataset(dataset_path, stamps[1]).region.geometry)


@functools.lru_cache(maxsize=64)
def polygon_summary(
    model_path: str, polygons_path: str, dataset_path: str, stamps: tuple[float, float, float], quarter: Quarter | None
) -> pd.DataFrame:
    """:func:`geodbk.maps.summaries.summarize_polygons` of one model and quarter over the
    region's polygons, without geometry."""
    polygons = region_polygons(polygons_path, dataset_path, stamps[1:])
    summary = summarize_polygons(load_model(model_path, stamps[0]), polygons, time=quarter)
    return pd.DataFrame(summary.drop(columns="geometry"))
