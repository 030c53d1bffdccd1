"""Area summaries: a fitted model's speed averaged over polygons (counties, tracts, any areas).

:func:`summarize_polygons` covers each polygon with the cells of a regular grid (cell centres
inside the polygon; a polygon too small to hold a centre gets its representative point) and
reports, per polygon and quarter:

=====================  ==================================================================
``cells``              grid cells averaged
``mean_log10``         area mean of the tile-mean log10 value over the cells (area-weighted)
``sd_log10``           its sd under the joint posterior (:meth:`GeoModel.predict_areas`:
                       exact for the low-rank GP, not the mean of the cell sds)
``median_<u>``         10 ** mean_log10: the geometric-mean speed of the area
``lower_<u>``          10 ** (mean_log10 - 1.959964 sd_log10), ``upper_<u>`` likewise
``share_below``        expected share of the area whose tile-mean value is below the
                       threshold (mean of the cells' P(value < threshold))
``threshold``          that threshold in data units (defaults in :mod:`geodbk.maps.thresholds`)
``observed_tiles``     training tiles of the model inside the polygon
=====================  ==================================================================

The polygons keep their own columns, geometry and CRS.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pyproj
import shapely

from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.fileio import atomic_path, write_failure
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.schema import model_meta
from geodbk.maps.thresholds import DEFAULT, resolve_threshold
from geodbk.prediction import probability_below, to_data_units

#: Cell side of the summary grid when none is given: 0.005 degrees, about one zoom-16 tile.
DEFAULT_RESOLUTION = 0.005
#: Output formats by file suffix.
SUMMARY_FORMATS = (".parquet", ".geoparquet", ".geojson", ".json", ".csv")


def polygons_in_region(polygons: gpd.GeoDataFrame, region: shapely.Geometry) -> gpd.GeoDataFrame:
    """The polygons (any CRS, kept) that meet ``region`` (a lon/lat geometry): a bounding-box
    test first, then the shape. A county file holds thousands of polygons outside one state."""
    lonlat = polygons.to_crs(4326).geometry.reset_index(drop=True)
    west, south, east, north = region.bounds
    near = lonlat.cx[west:east, south:north]
    keep = np.zeros(len(polygons), dtype=bool)
    keep[near.index[near.intersects(region)]] = True
    return polygons[keep]


def polygon_cells(
    polygons: gpd.GeoDataFrame, resolution: float | str = DEFAULT_RESOLUTION
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cells covering each polygon: lon/lat (m, 2) degrees, polygon index (m,) and cell
    weight (m,) proportional to its area (cos(latitude) for a degree grid).

    Grids are snapped to multiples of ``resolution``, so neighbouring polygons share a lattice.
    """
    lonlat_parts, group_parts = [], []
    for index, geometry in enumerate(polygons.to_crs(4326).geometry):
        cells = RegularGrid.over(geometry, resolution).cells_inside()
        if len(cells) == 0:
            point = geometry.representative_point()
            cells = np.array([[point.x, point.y]])
        lonlat_parts.append(cells)
        group_parts.append(np.full(len(cells), index))
    lonlat = np.concatenate(lonlat_parts) if lonlat_parts else np.empty((0, 2))
    groups = np.concatenate(group_parts) if group_parts else np.empty(0, dtype=np.int64)
    weights = np.cos(np.radians(lonlat[:, 1]))
    return lonlat, groups.astype(np.int64), weights


def summarize_polygons(
    model: Any,
    polygons: gpd.GeoDataFrame,
    *,
    time: str | None = None,
    resolution: float | str = DEFAULT_RESOLUTION,
    threshold: float | str | None = DEFAULT,
) -> gpd.GeoDataFrame:
    """Summarise a fitted :class:`~geodbk.fit.geomodel.GeoModel` (a GP kind) over each polygon.

    Args:
        model: the fitted model.
        polygons: a GeoDataFrame of polygons in any CRS (kept in the output).
        time: the quarter, e.g. ``"2023Q4"`` (default the model's latest fitted quarter).
        resolution: side of the averaging cells (degrees, or ``"500m"`` style).
        threshold: for ``share_below``, in data units; default the FCC benchmark of the
            model's service and target; ``None`` leaves the column out.

    Returns:
        The polygons with the columns listed in the module docstring added (and ``quarter``).
    """
    if polygons.crs is None:
        raise InputDataError("the polygons have no CRS; geodbk will not guess one")
    if len(polygons) == 0:
        raise InputDataError("no polygons to summarise")
    if not getattr(model, "has_kernel", False):
        raise InputDataError(f"area summaries need a GP model; {model.kind} has no joint posterior")
    meta = model_meta(model)
    level = resolve_threshold(threshold, meta)
    quarter = time or model.latest_quarter
    lonlat, groups, weights = polygon_cells(polygons, resolution)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        area = model.predict_areas(lonlat, groups, len(polygons), quarter, weights=weights)
        cell = model.predict(lonlat, quarter)
    if caught:
        warnings.warn(str(caught[0].message), ExtrapolationWarning, stacklevel=2)
    key = str(meta.get("units", "Mbps")).lower()
    out = polygons.copy()
    out["quarter"] = quarter
    out["cells"] = np.bincount(groups, minlength=len(polygons))
    out["mean_log10"], out["sd_log10"] = area.mean, area.sd
    out[f"median_{key}"], out[f"lower_{key}"], out[f"upper_{key}"] = to_data_units(area.mean, area.sd)
    if level is not None:
        below = probability_below(cell.mean, cell.sd, np.log10(level))
        totals = np.bincount(groups, weights=weights, minlength=len(polygons))
        out["share_below"] = np.bincount(groups, weights=weights * below, minlength=len(polygons)) / totals
        out["threshold"] = level
    out["observed_tiles"] = _observed_tiles(model, polygons)
    return out


def _observed_tiles(model: Any, polygons: gpd.GeoDataFrame) -> np.ndarray:
    """Training tiles of ``model`` inside each polygon (-1 if the model has no tile locations)."""
    support = getattr(model, "support", None)
    if support is None:
        return np.full(len(polygons), -1)
    to_poly = pyproj.Transformer.from_crs(4326, polygons.crs, always_xy=True)
    x, y = to_poly.transform(support[:, 0], support[:, 1])
    return np.array([int(shapely.contains_xy(g, x, y).sum()) for g in polygons.geometry])


def write_summary(frame: gpd.GeoDataFrame, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write :func:`summarize_polygons` output atomically: GeoParquet (``.parquet``), GeoJSON
    (``.geojson``) or CSV without geometry (``.csv``). GeoJSON is written in EPSG:4326 (RFC 7946);
    GeoParquet keeps the polygons' CRS. A folder at ``path`` is replaced only with ``overwrite``;
    a failed write raises OSError (ENOSPC for a full disk)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUMMARY_FORMATS:
        raise InputDataError(f"summary output must end in one of {', '.join(SUMMARY_FORMATS)}, got {path.name}")
    with atomic_path(path, overwrite=overwrite) as tmp:
        try:
            if suffix in (".parquet", ".geoparquet"):
                frame.to_parquet(tmp)
            elif suffix == ".csv":
                frame.drop(columns=frame.geometry.name).to_csv(tmp, index=False)
            else:
                frame.to_crs(4326).to_file(tmp, driver="GeoJSON", engine="pyogrio")
        except Exception as err:  # pyarrow and pyogrio raise their own error types
            raise write_failure(path, err) from err
    return path


__all__ = ["DEFAULT_RESOLUTION", "polygon_cells", "polygons_in_region", "summarize_polygons", "write_summary"]
