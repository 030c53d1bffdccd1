"""Tag tiles urban or rural from U.S. Census 2020 data.

Two routes, tried in this order:

1. **Urban-area polygons** (``urban_areas=``): a TIGER/Line 2020 Urban Area file
   (``tl_2020_us_uac20``, or a state clip; path, zip or URL). A tile is urban when its centre
   lies inside any urban area. This is the Census definition at tile scale.
2. **County urban share** (the fallback, always available from the shipped files): the 2020
   Census county table gives each county's urban population percentage ``POPPCT_URB``; a
   tile is urban when its county's ``POPPCT_URB / 100 >= threshold``. Tiles are placed in
   counties by their centre, using the 2018 1:20M county boundaries; centres just outside
   the generalised coastline go to the nearest county (distance measured in the local UTM
   zone). Counties absent from the table are left out of the join, so their tiles go to
   the nearest county that has a share.

Both routes return the ``route`` string that says which was used; datasets store it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from geodbk import paths
from geodbk.errors import InputDataError
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.ingest.regions import read_polygons

URBAN, RURAL = "urban", "rural"
#: Route labels stored in datasets.
ROUTE_URBAN_AREAS = "census-2020-urban-areas"
ROUTE_COUNTY_SHARE = "census-2020-county-urban-share"


@lru_cache(maxsize=2)
def county_urban_share(
    county_boundaries: str | Path = paths.COUNTY_BOUNDARIES,
    county_table: str | Path = paths.COUNTY_URBAN_TABLE,
) -> gpd.GeoDataFrame:
    """County polygons (EPSG:4326) with ``GEOID`` and ``urban_share`` = POPPCT_URB / 100.

    Only counties present in both the boundaries and the table are returned.
    """
    table_path = Path(county_table)
    try:
        table = pd.read_csv(table_path, dtype={"GEOID": str}, usecols=["GEOID", "POPPCT_URB"])
    except (OSError, ValueError) as err:
        raise InputDataError(f"cannot read the county urban table {table_path}: {err}") from err
    table["GEOID"] = table["GEOID"].str.zfill(5)
    counties = read_polygons(county_boundaries, what="county boundary")
    if "GEOID" not in counties.columns:
        raise InputDataError(f"county boundary file {county_boundaries} has no GEOID column")
    merged = counties[["GEOID", "geometry"]].merge(table, on="GEOID", how="inner")
    merged["urban_share"] = merged["POPPCT_URB"].astype(np.float64) / 100.0
    return merged.drop(columns="POPPCT_URB")


def _urban_by_areas(
    centres: gpd.GeoSeries, urban_areas: str | Path | gpd.GeoDataFrame, cache_dir: str | Path | None
) -> np.ndarray:
    if isinstance(urban_areas, gpd.GeoDataFrame):
        if urban_areas.crs is None:
            raise InputDataError("urban_areas has no CRS; geodbk will not guess one")
        areas = urban_areas.to_crs(4326)
    else:
        areas = read_polygons(urban_areas, what="urban area", cache_dir=cache_dir)
    union = shapely.make_valid(areas.geometry.union_all())
    shapely.prepare(union)
    return shapely.contains_xy(union, centres.x.to_numpy(), centres.y.to_numpy())


def _urban_by_county_share(centres: gpd.GeoSeries, threshold: float, counties: gpd.GeoDataFrame) -> np.ndarray:
    points = gpd.GeoDataFrame(geometry=centres.reset_index(drop=True), crs=4326)
    inside = gpd.sjoin(points, counties, how="left", predicate="within")
    inside = inside[~inside.index.duplicated(keep="first")]
    share = inside["urban_share"].to_numpy(dtype=np.float64, copy=True)
    outside = np.isnan(share)
    if outside.any():
        utm = points[outside].estimate_utm_crs()
        west, south, east, north = points[outside].total_bounds
        nearby = counties.cx[west - 1.0 : east + 1.0, south - 1.0 : north + 1.0]
        if len(nearby) == 0:
            nearby = counties
        nearest = gpd.sjoin_nearest(points[outside].to_crs(utm), nearby.to_crs(utm), how="left")
        nearest = nearest[~nearest.index.duplicated(keep="first")]
        share[np.flatnonzero(outside)] = nearest["urban_share"].to_numpy(dtype=np.float64)
    return share >= threshold


def tag_urban_rural(
    tiles: gpd.GeoDataFrame,
    *,
    urban_areas: str | Path | gpd.GeoDataFrame | None = None,
    threshold: float = 0.5,
    county_boundaries: str | Path = paths.COUNTY_BOUNDARIES,
    county_table: str | Path = paths.COUNTY_URBAN_TABLE,
    cache_dir: str | Path | None = None,
) -> tuple[gpd.GeoDataFrame, str]:
    """Add an ``urban_rural`` column (``"urban"``/``"rural"``) to ``tiles``.

    Args:
        tiles: frame with a ``quadkey`` column (zoom-16 Ookla tiles); the tile centre is
            what gets classified.
        urban_areas: Census Urban Area polygons (path, zip, http(s) URL or GeoDataFrame).
            ``None`` uses the county urban-share fallback.
        threshold: county route only: urban when ``POPPCT_URB / 100 >= threshold``.
        county_boundaries, county_table: county route inputs (default: shipped files).
        cache_dir: download cache for a URL ``urban_areas``.

    Returns:
        ``(tagged, route)``: a copy of ``tiles`` with ``urban_rural``, and a string naming
        the route, e.g. ``"census-2020-urban-areas"`` or
        ``"census-2020-county-urban-share>=0.5"``.

    Raises:
        InputDataError: unreadable inputs, or an inputs file without a CRS.
    """
    if not 0.0 <= threshold <= 1.0:
        raise InputDataError(f"urban threshold must be in [0, 1] (a population share), got {threshold}")
    codes, uniques = pd.factorize(tiles["quadkey"])
    lonlat = quadkey_centres(np.asarray(uniques, dtype=object))
    centres = gpd.GeoSeries(shapely.points(lonlat), crs=4326)
    if urban_areas is not None:
        urban = _urban_by_areas(centres, urban_areas, cache_dir)
        route = ROUTE_URBAN_AREAS
    else:
        urban = _urban_by_county_share(centres, threshold, county_urban_share(county_boundaries, county_table))
        route = f"{ROUTE_COUNTY_SHARE}>={threshold:g}"
    tagged = tiles.copy()
    tagged["urban_rural"] = pd.array(np.where(urban[codes], URBAN, RURAL), dtype="str")
    return tagged, route
