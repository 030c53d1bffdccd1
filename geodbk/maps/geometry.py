"""Regular north-up grids over a region: resolution, CRS, cells inside the region, row blocks.

A :class:`RegularGrid` is a raster (cell centres on ``x``/``y``, ``y`` descending) in any
CRS, EPSG:4326 by default, built over a region with :meth:`RegularGrid.over`. A
:class:`CellLocator` gives the lon/lat of the cells of a row block that fall inside the
region polygon, which is what block prediction (:mod:`geodbk.maps.predict`) asks a model for.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np
import pyproj
import shapely
from affine import Affine
from shapely.geometry.base import BaseGeometry

from geodbk.blocks import blocks
from geodbk.errors import InputDataError, RegionError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.ingest.regions import Region

#: Cells predicted per block when ``chunk_rows`` is not given.
DEFAULT_CELLS_PER_CHUNK = 1 << 18
#: Points per side of the lattice that samples an area for a domain check (:func:`area_sample`).
DOMAIN_SAMPLE_SIDE = 64

WGS84 = pyproj.CRS.from_epsg(4326)

Bbox = tuple[float, float, float, float]
RegionLike = Union["Region", Bbox, BaseGeometry]


# --- resolution and CRS ---------------------------------------------------------------
_RESOLUTION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(m|km|deg|°)?\s*$")


def parse_resolution(resolution: float | str) -> tuple[float, str | None]:
    """Split a resolution into ``(value, unit)``.

    ``0.01`` or ``"0.01"`` -> ``(0.01, None)`` (units of the grid CRS); ``"0.01deg"`` ->
    ``(0.01, "deg")``; ``"500m"`` -> ``(500.0, "m")``; ``"2km"`` -> ``(2000.0, "m")``.
    """
    if isinstance(resolution, (int, float)) and not isinstance(resolution, bool):
        value, unit = float(resolution), None
    else:
        match = _RESOLUTION.match(str(resolution))
        if match is None:
            raise InputDataError(
                f"cannot read resolution {resolution!r}: give a number in the grid CRS units, "
                "or a number with a unit such as '0.01deg', '500m' or '2km'"
            )
        value, unit = float(match.group(1)), match.group(2)
        if unit == "km":
            value, unit = value * 1000.0, "m"
        elif unit == "°":
            unit = "deg"
    if not math.isfinite(value) or value <= 0:
        raise InputDataError(f"resolution must be positive, got {resolution!r}")
    return value, unit


def utm_crs_for(geometry: BaseGeometry) -> pyproj.CRS:
    """The WGS 84 UTM zone CRS (EPSG:326zz north, 327zz south) that contains the centre of a
    lon/lat geometry's bounds.

    The zone is computed from the centre (6-degree zones from 180 W), not looked up in the PROJ
    database, which took 65 ms a call (3,143 county summaries each ask once).

    Raises:
        RegionError: a centre outside UTM's latitudes (80 S to 84 N) or not a lon/lat point.
    """
    west, south, east, north = geometry.bounds
    lon0, lat0 = (west + east) / 2.0, (south + north) / 2.0
    if not (-80.0 <= lat0 <= 84.0 and -180.0 <= lon0 <= 180.0):
        raise RegionError(f"no UTM zone covers the centre of the bounds {geometry.bounds}")
    zone = min(int((lon0 + 180.0) // 6.0) + 1, 60)
    return _utm_zone((32600 if lat0 >= 0 else 32700) + zone)


@functools.lru_cache(maxsize=256)
def _utm_zone(code: int) -> pyproj.CRS:
    return pyproj.CRS.from_epsg(code)


def _region_geometry(region: RegionLike) -> tuple[BaseGeometry, str]:
    """A lon/lat shapely geometry and a name for a Region, bbox tuple or geometry."""
    if isinstance(region, BaseGeometry):
        return region, "geometry"
    if isinstance(region, (tuple, list, np.ndarray)):
        if len(region) != 4:
            raise RegionError(f"a bbox is (west, south, east, north), got {region!r}")
        west, south, east, north = (float(v) for v in region)
        if not (west < east and south < north):
            raise RegionError(f"bbox must have west < east and south < north, got {region!r}")
        return shapely.box(west, south, east, north), f"bbox({west}, {south}, {east}, {north})"
    geometry = getattr(region, "geometry", None)
    if not isinstance(geometry, BaseGeometry):
        raise RegionError(
            f"expected a Region, a (west, south, east, north) bbox or a geometry, got {type(region).__name__}"
        )
    return geometry, str(getattr(region, "name", "region"))


# --- the grid ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RegularGrid:
    """A north-up raster: ``height`` x ``width`` square cells of side ``resolution`` in ``crs``.

    ``transform`` maps (col, row) of cell corners to CRS coordinates (rasterio convention).
    ``geometry`` is the region polygon in lon/lat (EPSG:4326); cells whose centre is outside
    it are masked. Build one with :meth:`over`.
    """

    crs: pyproj.CRS
    transform: Affine
    width: int
    height: int
    geometry: BaseGeometry
    region_name: str = "region"

    @classmethod
    def over(
        cls,
        region: RegionLike,
        resolution: float | str,
        *,
        crs: str | int | pyproj.CRS | None = None,
    ) -> RegularGrid:
        """Cover ``region`` with square cells of ``resolution``.

        Parameters
        ----------
        region
            A :class:`geodbk.ingest.regions.Region`, a lon/lat ``(west, south, east, north)`` bbox, or a
            shapely geometry in EPSG:4326.
        resolution
            Cell side. A bare number is in the units of ``crs`` (degrees for EPSG:4326);
            ``"500m"`` / ``"2km"`` ask for metres, ``"0.01deg"`` for degrees.
        crs
            CRS the grid is defined in. Default: EPSG:4326, or the region's UTM zone when
            the resolution is in metres.

        The grid edges are snapped to multiples of the resolution, so grids of the same
        resolution over different regions line up.
        """
        geometry, name = _region_geometry(region)
        value, unit = parse_resolution(resolution)
        if crs is None:
            grid_crs = utm_crs_for(geometry) if unit == "m" else WGS84
        else:
            try:
                grid_crs = pyproj.CRS.from_user_input(crs)
            except pyproj.exceptions.CRSError as err:
                raise InputDataError(f"unknown CRS {crs!r}: {err}") from None
        if unit == "m" and grid_crs.is_geographic:
            raise InputDataError(
                f"resolution {resolution!r} is in metres but {grid_crs.name} is geographic; "
                "give a projected CRS or leave crs unset to use the region's UTM zone"
            )
        if unit == "deg" and not grid_crs.is_geographic:
            raise InputDataError(
                f"resolution {resolution!r} is in degrees but {grid_crs.name} is projected; "
                "give the resolution in metres (e.g. '500m')"
            )
        to_grid = pyproj.Transformer.from_crs(WGS84, grid_crs, always_xy=True)
        lon_min, lat_min, lon_max, lat_max = geometry.bounds
        west, south, east, north = to_grid.transform_bounds(lon_min, lat_min, lon_max, lat_max, densify_pts=21)
        west = math.floor(round(west / value, 9)) * value
        north = math.ceil(round(north / value, 9)) * value
        width = max(1, math.ceil(round((east - west) / value, 9)))
        height = max(1, math.ceil(round((north - south) / value, 9)))
        transform = Affine(value, 0.0, west, 0.0, -value, north)
        return cls(grid_crs, transform, int(width), int(height), geometry, name)

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)``, i.e. ``(len(y), len(x))``."""
        return self.height, self.width

    @property
    def resolution(self) -> float:
        """Cell side in CRS units."""
        return float(self.transform.a)

    @property
    def x(self) -> np.ndarray:
        """``(width,)`` cell-centre x coordinates, increasing."""
        return self.transform.c + (np.arange(self.width) + 0.5) * self.transform.a

    @property
    def y(self) -> np.ndarray:
        """``(height,)`` cell-centre y coordinates, decreasing (north-up)."""
        return self.transform.f + (np.arange(self.height) + 0.5) * self.transform.e

    def _grid_geometry(self) -> BaseGeometry:
        if self.crs.equals(WGS84):
            geometry = self.geometry
        else:
            to_grid = pyproj.Transformer.from_crs(WGS84, self.crs, always_xy=True)
            west, south, east, north = self.geometry.bounds
            # densify first so that long straight edges (a bbox) bend with the projection
            dense = shapely.segmentize(self.geometry, max(east - west, north - south) / 256.0)
            geometry = shapely.transform(dense, to_grid.transform, interleaved=False)
        shapely.prepare(geometry)
        return geometry

    def blocks(self, chunk_rows: int) -> Iterator[slice]:
        """Row slices of at most ``chunk_rows`` rows that cover the grid top to bottom."""
        return blocks(self.height, chunk_rows)

    def inside_mask(self) -> np.ndarray:
        """``(height, width)`` boolean, True where the cell centre is inside the region."""
        locator = CellLocator(self)
        return np.concatenate([locator.cells(rows)[1] for rows in self.blocks(self.default_chunk_rows())])

    def cells_inside(self) -> np.ndarray:
        """(m, 2) lon/lat degrees of the centres of the cells inside the region, row by row."""
        locator = CellLocator(self)
        parts = [locator.cells(rows)[0] for rows in self.blocks(self.default_chunk_rows())]
        return np.concatenate(parts) if parts else np.empty((0, 2))

    def default_chunk_rows(self) -> int:
        """Rows per block so that a block has about ``DEFAULT_CELLS_PER_CHUNK`` cells."""
        return max(1, min(self.height, DEFAULT_CELLS_PER_CHUNK // self.width))


class CellLocator:
    """Cell centres of row blocks in the grid CRS and lon/lat, with the region mask."""

    def __init__(self, grid: RegularGrid) -> None:
        self.x = grid.x
        self.y = grid.y
        self.geometry = grid._grid_geometry()
        self.to_lonlat = (
            None if grid.crs.equals(WGS84) else pyproj.Transformer.from_crs(grid.crs, WGS84, always_xy=True)
        )

    def cells(self, rows: slice | np.ndarray, cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """``(lonlat (m, 2) of the block's cells inside the region, inside (n_rows, n_cols) bool)``.

        ``rows`` and ``cols`` select grid rows and columns (all columns by default).
        """
        xx, yy = np.meshgrid(self.x[cols], self.y[rows])
        inside = shapely.contains_xy(self.geometry, xx, yy)
        px, py = xx[inside], yy[inside]
        if self.to_lonlat is not None:
            px, py = self.to_lonlat.transform(px, py)
        return np.column_stack([px, py]).astype(np.float64, copy=False), inside


def area_sample(geometry: BaseGeometry, side: int = DOMAIN_SAMPLE_SIDE) -> np.ndarray:
    """(m, 2) lon/lat degrees of the centres of a ``side`` x ``side`` lattice over ``geometry``
    (a lon/lat shapely geometry) that fall inside it; its representative point if none do."""
    west, south, east, north = geometry.bounds
    step = max(east - west, north - south) / side
    cells = RegularGrid.over(geometry, step, crs=4326).cells_inside() if step > 0 else np.empty((0, 2))
    if len(cells) == 0:
        point = geometry.representative_point()
        cells = np.array([[point.x, point.y]])
    return cells
