"""Reference points for kernel slices: a dense urban place, a well-observed rural place, and the wildland
cell farthest from data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from geodbk.blocks import blocks
from geodbk.errors import InputDataError
from geodbk.maps.geometry import CellLocator, RegularGrid

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.dataset.spatial_dataset import SpatialDataset


def _local_xy(lonlat: np.ndarray, lat0: float) -> np.ndarray:
    """Equirectangular km coordinates around latitude ``lat0`` (good enough for nearest tiles)."""
    k = 111.32
    return np.column_stack([lonlat[:, 0] * k * math.cos(math.radians(lat0)), lonlat[:, 1] * k])


def reference_points(
    dataset: SpatialDataset,
    grid: RegularGrid | None = None,
    *,
    radius_km: float = 3.0,
    max_candidates: int = 40_000,
) -> dict[str, tuple[float, float]]:
    """Pick three reference points for kernel slices from a dataset.

    ``urban``: the urban tile with the most urban tiles within ``radius_km``; ``rural``: the
    rural tile with the most rural tiles within ``radius_km`` (a well-observed rural place);
    ``wildland``: the cell of ``grid`` (default: a degree grid over the dataset's region
    with 400 cells along its longer side, about 0.007 degrees for Puerto Rico) inside the
    region that is farthest from any observed tile. Returns
    ``{name: (lon, lat)}`` in degrees.
    """
    from scipy.spatial import cKDTree

    frame = dataset.frame.drop_duplicates("quadkey")
    lonlat = frame[["lon", "lat"]].to_numpy(np.float64)
    if len(lonlat) == 0:
        raise InputDataError("the dataset has no tiles to choose reference points from")
    lat0 = float(np.mean(lonlat[:, 1]))
    labels = frame["urban_rural"].to_numpy()
    refs: dict[str, tuple[float, float]] = {}
    for label in ("urban", "rural"):
        pts = lonlat[labels == label]
        if len(pts) == 0:
            continue
        xy = _local_xy(pts, lat0)
        counts = cKDTree(xy).query_ball_point(xy, r=radius_km, return_length=True)
        best = pts[int(np.argmax(counts))]
        refs[label] = (float(best[0]), float(best[1]))

    if grid is None:
        west, south, east, north = dataset.region.geometry.bounds
        grid = RegularGrid.over(dataset.region, max((east - west), (north - south)) / 400.0)
    stride = max(1, math.ceil(math.sqrt(grid.width * grid.height / max_candidates)))
    locator = CellLocator(grid)
    tree = cKDTree(_local_xy(lonlat, lat0))
    best_d, best_pt = -1.0, None
    for part in blocks(grid.height, stride * 64):
        rows = np.arange(part.start, part.stop, stride)
        cand, inside = locator.cells(rows, slice(None, None, stride))
        if not inside.any():
            continue
        dist, _ = tree.query(_local_xy(cand, lat0))
        i = int(np.argmax(dist))
        if dist[i] > best_d:
            best_d, best_pt = float(dist[i]), cand[i]
    if best_pt is not None:
        refs["wildland"] = (float(best_pt[0]), float(best_pt[1]))
    return refs

def parse_refs(items: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Parse ``["name:lon,lat", ...]`` (degrees) into ``{name: (lon, lat)}``."""
    refs: dict[str, tuple[float, float]] = {}
    for item in items:
        name, sep, rest = item.partition(":")
        parts = rest.split(",")
        try:
            if not sep or not name or len(parts) != 2:
                raise ValueError
            lon, lat = float(parts[0]), float(parts[1])
        except ValueError:
            raise InputDataError(f"reference point {item!r} is not name:lon,lat (e.g. sanjuan:-66.06,18.45)") from None
        if not (-180 <= lon <= 180 and -90 <= lat <= 90):
            raise InputDataError(f"reference point {item!r} is outside lon [-180, 180] / lat [-90, 90]")
        refs[name] = (lon, lat)
    return refs


__all__ = ["parse_refs", "reference_points"]
