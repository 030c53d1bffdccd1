"""Study regions: a named EPSG:4326 polygon, and clipping tiles to it.

A region is given as a U.S. state (name, USPS abbreviation or 2-digit FIPS code), as
counties (``"Kauai, HI"``, ``"15007"``, several joined by ``+``), both looked up in the shipped
2018 Census 1:20M boundaries (:mod:`geodbk.ingest.boundaries`), or as a polygon file (GeoJSON, shapefile or
zipped shapefile, GeoPackage, GeoParquet; read by :mod:`geodbk.ingest.vectorfiles`). A tile
belongs to the region when its centre lies inside the region polygon grown by ``buffer_deg``
degrees.

The 1:20M generalised coastline cuts off coastal tiles: with no buffer, 1.7% of Puerto
Rico's and 5.9% of Hawaii's mobile tile-quarters have their centre outside it. The default
buffer of 0.01 degrees (about 1.1 km, two tile widths) brings that down to 0.13% and 0.87%;
what is left is mostly offshore (ships, small islets). Pass ``buffer_deg=0`` for the strict
polygon. Either way the number of dropped rows is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from shapely.geometry.base import BaseGeometry

from geodbk.errors import InputDataError, RegionError
from geodbk.ingest.boundaries import counties_named, is_county_spec, lookup_counties, lookup_state
from geodbk.ingest.formats import FORMATS
from geodbk.ingest.sources import is_url, local_path
from geodbk.ingest.vectorfiles import checked_path, read_vector

#: Default growth of the region polygon before clipping, degrees (see module docstring).
DEFAULT_BUFFER_DEG = 0.01


@dataclass(frozen=True)
class Region:
    """A named study region.

    Attributes:
        name: human-readable name, e.g. ``"Puerto Rico"``.
        geometry: (multi)polygon in EPSG:4326 degrees.
        code: USPS abbreviation of the U.S. state that the region is or lies in (``"PR"``;
            a state, or counties of one state), else ``None``.
    """

    name: str
    geometry: BaseGeometry
    code: str | None = None

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """``(west, south, east, north)`` of the region polygon, degrees."""
        west, south, east, north = self.geometry.bounds
        return float(west), float(south), float(east), float(north)

    def buffered(self, buffer_deg: float) -> BaseGeometry:
        """The region polygon grown by ``buffer_deg`` degrees (itself when 0)."""
        if buffer_deg < 0:
            raise RegionError(f"buffer_deg must be >= 0, got {buffer_deg}")
        return self.geometry if buffer_deg == 0 else self.geometry.buffer(buffer_deg)


def read_polygons(
    source: str | Path,
    *,
    what: str = "region",
    keep_crs: bool = False,
    cache_dir: str | Path | None = None,
) -> gpd.GeoDataFrame:
    """Read a polygon file (GeoJSON, shapefile or zip, GeoPackage, GeoParquet) in EPSG:4326,
    or in the file's own CRS with ``keep_crs``; through :func:`geodbk.ingest.vectorfiles.read_vector`,
    which takes the format from the suffix and refuses a file whose content is another format.

    Args:
        source: path, or http(s) URL downloaded once into ``cache_dir``
            (:func:`geodbk.ingest.sources.fetch`).
        what: what the file is, for error messages.

    Raises:
        InputDataError: the file is missing, of a format not read (a VRT), unreadable, empty,
            has no CRS, or holds no polygons.
        DownloadError: a URL cannot be fetched.
    """
    path = local_path(source, cache_dir)
    frame = read_vector(path, what)
    if len(frame) == 0:
        raise InputDataError(f"{what} file {path} has no features")
    if frame.crs is None:
        raise InputDataError(
            f"{what} file {path} has no CRS; geodbk will not guess one. "
            "Add one (e.g. a .prj file) or reproject it to EPSG:4326"
        )
    frame = frame[frame.geometry.notna() & ~frame.geometry.is_empty]
    kinds = set(frame.geom_type.unique())
    if not kinds or not kinds <= {"Polygon", "MultiPolygon"}:
        raise InputDataError(f"{what} file {path} must hold polygons, found {sorted(kinds)}")
    return frame if keep_crs else frame.to_crs(4326)


def load_region(spec: str | Path | Region | int) -> Region:
    """Resolve a region from a state, counties or a polygon file.

    Args:
        spec: a state (``"Puerto Rico"``, ``"PR"``, ``"72"`` or ``72``); counties
            (``"Kauai, HI"``, ``"15007"``, ``"Vieques, PR+Culebra, PR"``: see
            :mod:`geodbk.ingest.boundaries`); a path to a polygon file; or a :class:`Region`
            (returned unchanged).

    Returns:
        The region. Its ``code`` is the USPS code of the state that a state or counties of one
        state lie in, else ``None``.

    Raises:
        RegionError: ``spec`` is none of these, or names an unknown or ambiguous county.
        InputDataError: the polygon file is missing (a path with a suffix of
            :data:`~geodbk.ingest.formats.FORMATS`), a GDAL virtual path, unreadable, empty or has no CRS.
    """
    if isinstance(spec, Region):
        return spec
    if isinstance(spec, int):
        spec = f"{spec:02d}"
    if isinstance(spec, str) and not Path(spec).suffix:
        state = lookup_state(spec)
        if state is not None:
            return Region(str(state["NAME"]), shapely.make_valid(state.geometry), str(state["STUSPS"]))
    path = Path(spec)
    if path.suffix and path.exists():
        polygons = read_polygons(path)
        return Region(path.stem, shapely.make_valid(polygons.geometry.union_all()))
    if path.suffix.lower() in FORMATS and not is_url(spec):  # a polygon file that is not there (or a /vsi
        checked_path(path, "region")  # path), said so in one line: not read as counties when its name holds a comma
    if isinstance(spec, str) and is_county_spec(spec):
        name, counties, usps = lookup_counties(spec)
        return Region(name, shapely.make_valid(counties.geometry.union_all()), usps or None)
    named = counties_named(spec) if isinstance(spec, str) else []
    hint = f"; a county? say {' or '.join(repr(label) for label in named)}" if named else ""
    raise RegionError(
        f"unknown region {str(spec)!r}: not a U.S. state name, USPS abbreviation or FIPS "
        f"code, counties ('Kauai, HI', '15007', joined by '+'), nor an existing polygon file{hint}"
    )


def region_test(region: Region, *, buffer_deg: float = DEFAULT_BUFFER_DEG) -> Callable[[np.ndarray], np.ndarray]:
    """A test of points against the region polygon grown by ``buffer_deg`` degrees.

    Returns:
        A function of ``(n, 2)`` lon/lat degrees that gives the boolean ``(n,)`` mask of the
        points inside; points outside the grown polygon's bounding box are out without a
        polygon test.
    """
    area = region.buffered(buffer_deg)
    shapely.prepare(area)
    west, south, east, north = area.bounds

    def inside(lonlat: np.ndarray) -> np.ndarray:
        lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
        lon, lat = lonlat[:, 0], lonlat[:, 1]
        mask = (west <= lon) & (lon <= east) & (south <= lat) & (lat <= north)
        mask[mask] = shapely.contains_xy(area, lon[mask], lat[mask])
        return mask

    return inside


def inside_region(lonlat: np.ndarray, region: Region, *, buffer_deg: float = DEFAULT_BUFFER_DEG) -> np.ndarray:
    """Boolean ``(n,)`` mask of points ``lonlat`` (``(n, 2)`` degrees) inside the region.

    The region polygon is grown by ``buffer_deg`` degrees first.
    """
    return region_test(region, buffer_deg=buffer_deg)(lonlat)


def check_any_inside(n_inside: int, region: Region) -> None:
    """Raise :class:`RegionError` when no tile (``n_inside`` = 0) lies inside ``region``."""
    if n_inside == 0:
        raise RegionError(
            f"no tiles left after clipping to {region.name} "
            f"(bounds {tuple(round(v, 3) for v in region.bounds)}); "
            "are the tiles and the region the same place?"
        )


def clip_to_region(
    tiles: gpd.GeoDataFrame, region: Region, *, buffer_deg: float = DEFAULT_BUFFER_DEG
) -> gpd.GeoDataFrame:
    """Keep the tiles whose centre lies inside ``region`` (grown by ``buffer_deg`` degrees).

    Args:
        tiles: normalised tiles (see :func:`geodbk.ingest.ookla.read_tiles`), with a ``quadkey``
            column.

    Returns:
        The kept rows. ``result.attrs["dropped"]["outside_region"]`` counts the others.

    Raises:
        RegionError: no tile is inside the region.
    """
    from geodbk.ingest.quadkey import quadkey_centres

    codes, uniques = pd.factorize(tiles["quadkey"])
    keep_unique = inside_region(quadkey_centres(np.asarray(uniques, dtype=object)), region, buffer_deg=buffer_deg)
    keep = keep_unique[codes]
    check_any_inside(int(keep.sum()), region)
    kept = tiles[keep].copy()
    kept.attrs["dropped"] = {**tiles.attrs.get("dropped", {}), "outside_region": int((~keep).sum())}
    return kept
