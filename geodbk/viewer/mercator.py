"""Web Mercator (EPSG:3857), the map's coordinates, as web basemaps use: points, tables,
outlines and rasters from lon/lat degrees (EPSG:4326) or a grid's own CRS."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor used to reproject grids)
import shapely
import xarray as xr

TO_LONLAT = pyproj.Transformer.from_crs(3857, 4326, always_xy=True)
TO_MERCATOR = pyproj.Transformer.from_crs(4326, 3857, always_xy=True)


def mercator_to_lonlat(x: float, y: float) -> tuple[float, float]:
    """Web Mercator metres (the map's coordinates) -> lon/lat degrees."""
    lon, lat = TO_LONLAT.transform(x, y)
    return float(lon), float(lat)


def lonlat_to_mercator(lon: float, lat: float) -> tuple[float, float]:
    """lon/lat degrees -> Web Mercator metres."""
    x, y = TO_MERCATOR.transform(lon, lat)
    return float(x), float(y)


def with_mercator(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``easting``/``northing`` (EPSG:3857 metres) from its ``lon``/``lat`` columns (degrees)."""
    easting, northing = TO_MERCATOR.transform(frame["lon"].to_numpy(), frame["lat"].to_numpy())
    return frame.assign(easting=easting, northing=northing)


def outline_paths(geometry: shapely.Geometry) -> list[np.ndarray]:
    """Rings (exteriors and holes) of a lon/lat (multi)polygon as ``(n, 2)`` Web Mercator arrays (metres)."""
    rings = []
    for polygon in getattr(geometry, "geoms", [geometry]):
        for ring in [polygon.exterior, *polygon.interiors]:
            lon, lat = np.asarray(ring.coords).T
            rings.append(np.column_stack(TO_MERCATOR.transform(lon, lat)))
    return rings


def circle_mercator(lon: float, lat: float, km: float, samples: int = 73) -> np.ndarray:
    """``(samples, 2)`` Web Mercator metres of the circle of radius ``km`` (great-circle, small
    radii) around ``(lon, lat)`` degrees, closed (first point repeated last)."""
    earth_km = 6371.0088
    bearing = np.linspace(0.0, 2.0 * np.pi, samples)
    angle = np.degrees(km / earth_km)
    lats = lat + angle * np.cos(bearing)
    lons = lon + angle * np.sin(bearing) / np.cos(np.radians(lat))
    return np.column_stack(TO_MERCATOR.transform(lons, lats))


def mercator_raster(values: xr.DataArray) -> xr.DataArray:
    """A 2-D ``(y, x)`` grid variable (its CRS, else EPSG:4326; NaN outside the region) warped
    onto a Web Mercator raster (``x``/``y`` in metres, NaN where no cell maps)."""
    crs = values.rio.crs or "EPSG:4326"
    warped = values.rio.write_crs(crs).rio.write_nodata(np.nan, encoded=False).rio.reproject("EPSG:3857", nodata=np.nan)
    return warped.drop_vars("spatial_ref", errors="ignore")
