"""H3 hexagons over a region: the cells of the FCC's mobile coverage maps (the 5G Fund map uses
resolution 9, about 0.1 km^2).

:meth:`HexagonCover.over` takes every H3 cell of one resolution whose centre lies inside a
lon/lat region (H3's own polygon fill, :func:`h3.geo_to_cells`). A hexagon's area is sampled by
:meth:`~HexagonCover.sample_points`, the centres of its descendants at :func:`sample_resolution`
with equal weights: a model's speed is a tile mean, one value per zoom-16 Ookla tile (about
0.6 km x 0.6 km, 0.36 km^2), so points finer than resolution 9 (0.1 km^2) add nothing but for
hexagons that are themselves that small, which get their 7 children.
:meth:`~HexagonCover.tile_points` merges them by tile (the tile centres, where the model's
training rows sit, each weighted by its share of the hexagon's points): what a summary predicts.
H3's hierarchy is not exactly nested: below resolution 9 the descendants' union is the
hexagon with a ragged edge (about 6% of the centres at resolutions 5-7 lie in a neighbouring
hexagon, and as many of the neighbours' in this one), so such a mean is over H3's cell of the
hierarchy rather than exactly over the polygon; :meth:`~HexagonCover.index_of` is geometric.

H3's Python calls are one cell at a time (h3 4.x has no vectorised centre, boundary or
point-to-cell call); the whole-cover calls (the polygon fill and the children of every
hexagon, :func:`h3.uncompact_cells`) go through ``h3.api.numpy_int`` and return arrays. Every
resolution-9 hexagon of Puerto Rico (124k) with its polygons, 867k sample points and their 223k
(hexagon, tile) points takes about 2.5 s on one core (``benchmarks/bench_hexagons.py``). Cells are
held as H3's 64-bit integers, sorted; ``ids`` gives the hexadecimal strings the FCC publishes
(``"894ce857313ffff"``).

Cells that cross the antimeridian are not split: their polygons are wrong there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain

import h3.api.numpy_int as h3
import numpy as np
import shapely
from shapely.geometry.base import BaseGeometry

from geodbk.errors import InputDataError
from geodbk.ingest.quadkey import OOKLA_ZOOM, bounds_centres, lonlat_to_tile, tile_bounds

#: Resolutions a cover may have: 5 (about 250 km^2) to 10 (about 0.015 km^2).
RESOLUTIONS = range(5, 11)
#: Finest resolution whose cells are smaller than a zoom-16 tile: sample points are no finer
#: than this for hexagons coarser than it.
TILE_RESOLUTION = 9


def sample_resolution(resolution: int) -> int:
    """Resolution of the descendants whose centres average a hexagon of ``resolution``:
    ``max(resolution + 1, TILE_RESOLUTION)`` (the 7 children of a hexagon at or below tile size)."""
    return max(resolution + 1, TILE_RESOLUTION)


def check_resolution(resolution: int) -> int:
    """``resolution`` as an int in :data:`RESOLUTIONS`, or a one-line InputDataError."""
    if isinstance(resolution, bool) or not isinstance(resolution, (int, np.integer)) or resolution not in RESOLUTIONS:
        raise InputDataError(
            f"H3 resolution must be an integer from {RESOLUTIONS[0]} to {RESOLUTIONS[-1]}, got {resolution!r}"
        )
    return int(resolution)


def _lonlat(latlng_pairs: Iterable[tuple[float, float]]) -> np.ndarray:
    """(k, 2) lon/lat degrees from h3's (lat, lng) pairs."""
    return np.fromiter(chain.from_iterable(latlng_pairs), dtype=np.float64).reshape(-1, 2)[:, ::-1].copy()


def _centres(cells: np.ndarray) -> np.ndarray:
    """(n, 2) lon/lat degrees of the centres of ``cells`` (n,)."""
    return _lonlat(h3.cell_to_latlng(cell) for cell in cells.tolist())


@dataclass(frozen=True)
class HexagonCover:
    """H3 cells of one resolution, sorted by their 64-bit index.

    Attributes:
        resolution: the H3 resolution, in :data:`RESOLUTIONS`.
        cells: (n,) uint64 H3 indexes, ascending.
        centres: (n, 2) lon/lat degrees of the cells' centres.
    """

    resolution: int
    cells: np.ndarray
    centres: np.ndarray

    @classmethod
    def over(cls, region: BaseGeometry, resolution: int) -> HexagonCover:
        """Every cell of ``resolution`` whose centre is inside ``region`` (a lon/lat Polygon or
        MultiPolygon).

        Raises:
            InputDataError: for a resolution outside :data:`RESOLUTIONS`, a region that is not a
                non-empty (Multi)Polygon, or one that holds no cell centre.
        """
        resolution = check_resolution(resolution)
        polygonal = isinstance(region, BaseGeometry) and region.geom_type in ("Polygon", "MultiPolygon")
        if not polygonal or region.is_empty:
            kind = region.geom_type if isinstance(region, BaseGeometry) else type(region).__name__
            raise InputDataError(f"hexagons cover a non-empty lon/lat Polygon or MultiPolygon, got {kind}")
        cells = np.sort(np.asarray(h3.geo_to_cells(region, resolution), dtype=np.uint64))
        if len(cells) == 0:
            raise InputDataError(f"no resolution-{resolution} H3 hexagon has its centre inside the region")
        return cls(resolution, cells, _centres(cells))

    def __len__(self) -> int:
        return len(self.cells)

    def __getitem__(self, positions: slice | np.ndarray) -> HexagonCover:
        """The cover of the hexagons at ``positions`` (a slice, or indexes in ascending order)."""
        return HexagonCover(self.resolution, self.cells[positions], self.centres[positions])

    @property
    def ids(self) -> np.ndarray:
        """(n,) str: the cells' H3 ids, lower-case hexadecimal as the FCC publishes them."""
        return np.array([h3.int_to_str(cell) for cell in self.cells.tolist()], dtype=str)

    def polygons(self) -> np.ndarray:
        """(n,) shapely Polygons of the cells in lon/lat degrees (6 vertices, 5 for a pentagon,
        up to 10 for a cell crossing an icosahedron edge)."""
        rings = [h3.cell_to_boundary(cell) for cell in self.cells.tolist()]
        sizes = np.fromiter(map(len, rings), dtype=np.int64, count=len(rings))
        vertices = _lonlat(chain.from_iterable(rings))
        return shapely.polygons(shapely.linearrings(vertices, indices=np.repeat(np.arange(len(rings)), sizes)))

    def sample_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The points averaged for each hexagon's mean: the centres of its descendants at
        :func:`sample_resolution` (7 ** (that - resolution) of them; fewer for a pentagon).

        Returns:
            lonlat (m, 2) degrees, hexagon (m,) int64 position in this cover, and weights (m,)
            equal within a hexagon and summing to 1 over it.
        """
        children = np.asarray(h3.uncompact_cells(self.cells, sample_resolution(self.resolution)), dtype=np.uint64)
        parents = np.fromiter((h3.cell_to_parent(child, self.resolution) for child in children.tolist()),
                              dtype=np.uint64, count=len(children))
        hexagon = np.searchsorted(self.cells, parents)
        counts = np.bincount(hexagon, minlength=len(self))
        return _centres(children), hexagon, 1.0 / counts[hexagon]

    def tile_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`sample_points` merged by the zoom-16 Ookla tile holding them, which is where a
        model's tile-mean speed is defined (its training rows sit at tile centres): one point per
        (hexagon, tile) pair, about a quarter as many as sample points at resolution 9.

        Returns:
            lonlat (m, 2) degrees of the tiles' centres, hexagon (m,) int64 position in this cover
            (ascending), and weights (m,): the hexagon's share of its sample points in the tile,
            summing to 1 over a hexagon.
        """
        lonlat, hexagon, weights = self.sample_points()
        x, y = lonlat_to_tile(lonlat[:, 0], lonlat[:, 1], OOKLA_ZOOM)
        # one int64 per pair: hexagon, then the tile's column and row (< 2^16 each at zoom 16)
        key = (hexagon << 32) | (x.astype(np.int64) << 16) | y.astype(np.int64)
        pairs, inverse = np.unique(key, return_inverse=True)
        tiles = tile_bounds((pairs >> 16) & 0xFFFF, pairs & 0xFFFF, OOKLA_ZOOM)
        return bounds_centres(tiles), pairs >> 32, np.bincount(inverse.reshape(-1), weights=weights)

    def index_of(self, lonlat: np.ndarray) -> np.ndarray:
        """(n,) int64 position in this cover of the hexagon holding each point of ``lonlat``
        (n, 2) degrees, or -1 for a point in no hexagon of the cover.

        Raises:
            InputDataError: for an array that is not (n, 2) finite lon/lat degrees.
        """
        points = np.asarray(lonlat, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != 2:
            raise InputDataError(f"points must have shape (n, 2) as (lon, lat) degrees, got {points.shape}")
        if not (np.isfinite(points).all() and (np.abs(points[:, 1]) <= 90).all()):
            raise InputDataError("points must be finite lon/lat degrees with |lat| <= 90")
        cells = np.fromiter(
            (h3.latlng_to_cell(lat, lon, self.resolution) for lon, lat in points.tolist()),
            dtype=np.uint64, count=len(points),
        )
        if len(self) == 0:
            return np.full(len(points), -1, dtype=np.int64)
        position = np.minimum(np.searchsorted(self.cells, cells), len(self) - 1)
        return np.where(self.cells[position] == cells, position, -1).astype(np.int64)


__all__ = ["RESOLUTIONS", "TILE_RESOLUTION", "HexagonCover", "check_resolution", "sample_resolution"]
