"""Area summaries: a fitted model's speed averaged over polygons (counties, tracts, any areas).

:func:`summarize_polygons` covers each polygon with the cells of a regular grid (cell centres
inside the polygon, found by rasterising it, :mod:`geodbk.maps.cover`; a polygon too small to
hold a centre gets its representative point) and reports, per polygon and quarter:

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

Polygons are summarised in blocks of whole polygons holding about ``cells_per_block`` cells
(:class:`SummaryJob`), so memory follows the block and the largest polygon, not the number of
polygons: every contiguous-US county at 0.01 degrees is 8.2 million cells in 32 blocks. A polygon's
cells are never split between blocks, since its joint variance needs all of them together;
a polygon's results do not depend on the others in its block. Given a Dask ``client`` the
blocks run on the cluster's workers (:mod:`geodbk.maps.parallel`), as ``predict_grid``'s row
blocks do, and the table is the serial one.

Memory is planned before any cell is made (:func:`plan_summary`). A polygon's joint variance
sums over every pair of its cells, and the GP kinds hold those pairs in float64 tiles: the
kernel tile of the inducing-point kinds, up to cells x cells values and its temporaries
(:data:`KERNEL_PAIR_BYTES` a pair), and the local residual field's blocks of
:data:`RESIDUAL_ROWS` cells against all the polygon's cells (:data:`RESIDUAL_PAIR_BYTES` a
pair). So the largest polygon plans the larger of the two (:func:`joint_variance_bytes`),
which must fit in :data:`JOINT_VARIANCE_BUDGET` = 2 GiB, half of the 4 GiB a map may hold
(:data:`geodbk.maps.schema.GRID_VALUE_BUDGET`; the other half is the model's, the block's
cells and their predictions): 9,268 cells a polygon, Puerto Rico at 0.01 degrees (7,958) but
not at 0.005 (31,845), which needs 6 GB with an sv-rbf model. A larger polygon is refused in
one line that names a coarser ``--resolution``. The constants are measured (peak RSS of one
polygon, 2,900 to 23,000 cells, sv-rbf and dbk-rbf); tests/hostile/test_work_bounds.py checks
the plan against a run.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Hashable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import geopandas as gpd
import numpy as np
import pyproj
import shapely
from shapely.geometry.base import BaseGeometry
from tqdm.auto import tqdm

from geodbk.errors import ExtrapolationWarning, InputDataError, ResourceLimitError
from geodbk.fileio import atomic_path, write_failure
from geodbk.maps.cover import cell_count, cover
from geodbk.maps.geometry import RegularGrid, parse_resolution
from geodbk.maps.predict import CaughtWarning
from geodbk.maps.schema import GRID_VALUE_BUDGET
from geodbk.maps.thresholds import DEFAULT, resolve_threshold
from geodbk.prediction import probability_below, to_data_units
from geodbk.quarters import Quarter

if TYPE_CHECKING:  # pragma: no cover - typing only
    from distributed import Client

#: Cell side of the summary grid when none is given: 0.005 degrees, about one zoom-16 tile.
DEFAULT_RESOLUTION = 0.005
#: Averaging cells per block of polygons (a polygon with more is a block of its own).
CELLS_PER_BLOCK = 1 << 18
#: Bytes a polygon's joint variance holds per pair of its cells in a kernel tile (module docstring).
KERNEL_PAIR_BYTES = 25
#: Bytes it holds per pair of cells in a block of the residual field, and the block's rows.
RESIDUAL_PAIR_BYTES = 88
RESIDUAL_ROWS = 2048
#: Largest planned joint variance of one polygon (bytes): half of a map's 4 GiB.
JOINT_VARIANCE_BUDGET = GRID_VALUE_BUDGET // 2
#: Margin around a block's lon/lat bounds within which training tiles are tested against its
#: polygons (degrees; far more than an edge bends between the polygons' CRS and lon/lat).
BOUNDS_PAD_DEG = 0.05
#: Output formats by file suffix.
SUMMARY_FORMATS = (".parquet", ".geoparquet", ".geojson", ".json", ".csv")
PROGRESS_LABEL = "summarising polygons"


def polygons_in_region(polygons: gpd.GeoDataFrame, region: shapely.Geometry) -> gpd.GeoDataFrame:
    """The polygons (any CRS, kept) that meet ``region`` (a lon/lat geometry): a bounding-box
    test first, then the shape. A county file holds thousands of polygons outside one state."""
    lonlat = polygons.to_crs(4326).geometry.reset_index(drop=True)
    west, south, east, north = region.bounds
    near = lonlat.cx[west:east, south:north]
    keep = np.zeros(len(polygons), dtype=bool)
    keep[near.index[near.intersects(region)]] = True
    return polygons[keep]


def polygon_grids(polygons: gpd.GeoDataFrame, resolution: float | str = DEFAULT_RESOLUTION) -> list[RegularGrid]:
    """Each polygon's averaging grid: :meth:`RegularGrid.over` its lon/lat shape at ``resolution``
    (degrees, or ``"500m"`` style for the polygon's UTM zone). Grids are snapped to multiples of
    ``resolution``, so neighbouring polygons in one CRS share a lattice."""
    return [RegularGrid.over(geometry, resolution) for geometry in polygons.to_crs(4326).geometry]


def polygon_cells(
    polygons: gpd.GeoDataFrame, resolution: float | str = DEFAULT_RESOLUTION
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cells covering each polygon, all at once: lon/lat (m, 2) degrees, polygon index (m,) and
    cell weight (m,) proportional to its area (cos(latitude) for a degree grid); see
    :func:`polygon_grids` and :func:`geodbk.maps.cover.cover`."""
    return cover(polygon_grids(polygons, resolution))


@dataclasses.dataclass(frozen=True)
class PolygonBlock:
    """Whole polygons summarised together: their row positions in the frame (k,), their averaging
    grids (lon/lat shapes, :func:`polygon_grids`), their shapes in the frame's own CRS and their
    averaging cells (k,) (:func:`geodbk.maps.cover.cell_count`)."""

    positions: np.ndarray
    grids: Sequence[RegularGrid]
    shapes: Sequence[BaseGeometry]
    cells: np.ndarray


@dataclasses.dataclass(frozen=True)
class BlockSummary:
    """A block's results, one value per polygon (k,): cells, area mean and joint sd (log10 units),
    share of the area below the threshold (``None`` without one), observed tiles, and the
    warnings raised while predicting."""

    positions: np.ndarray
    cells: np.ndarray
    mean: np.ndarray
    sd: np.ndarray
    share_below: np.ndarray | None
    observed_tiles: np.ndarray
    warnings: list[CaughtWarning]


@dataclasses.dataclass
class SummaryJob:
    """Summarises one :class:`PolygonBlock`: what every block needs but its polygons.

    The serial path calls it for each block; on a Dask cluster it is sent once to each worker
    (:func:`geodbk.maps.parallel.map_blocks`). ``level`` is the threshold in data units (or
    ``None``), ``crs`` the polygons' own CRS.
    """

    model: Any
    quarter: Quarter | None
    level: float | None
    crs: pyproj.CRS

    def __call__(self, block: PolygonBlock) -> BlockSummary:
        lonlat, groups, weights = cover(block.grids)
        n = len(block.grids)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExtrapolationWarning)
            area, cell = self.model.predict_areas(lonlat, groups, n, self.quarter, weights=weights, return_cells=True)
            share = None
            if self.level is not None:  # the cells' own distributions, for the exceedance share
                below = probability_below(cell.mean, cell.sd, np.log10(self.level))
                totals = np.bincount(groups, weights=weights, minlength=n)
                share = np.bincount(groups, weights=weights * below, minlength=n) / totals
        return BlockSummary(
            block.positions, np.bincount(groups, minlength=n), area.mean, area.sd, share,
            _observed_tiles(self.model, block, self.crs),
            [CaughtWarning(w.category, str(w.message), w.filename, w.lineno) for w in caught],
        )


def polygon_blocks(
    polygons: gpd.GeoDataFrame, resolution: float | str = DEFAULT_RESOLUTION, cells_per_block: int = CELLS_PER_BLOCK
) -> list[PolygonBlock]:
    """The polygons in frame order, cut into blocks of whole polygons of at most
    ``cells_per_block`` averaging cells each (a larger polygon alone in its block).

    Holds each polygon's grid and cell count, not its cells: cells are counted here (a
    rasterisation per polygon) and made again by the block's job."""
    if cells_per_block < 1:
        raise InputDataError(f"cells_per_block must be >= 1, got {cells_per_block}")
    grids = polygon_grids(polygons, resolution)
    shapes = list(polygons.geometry)
    counts = np.array([cell_count(grid) for grid in grids], dtype=np.int64)
    starts = [0]
    held = 0
    for position, cells in enumerate(counts.tolist()):
        if held and held + cells > cells_per_block:
            starts.append(position)
            held = 0
        held += cells
    bounds = [*starts, len(grids)] if grids else []
    return [PolygonBlock(np.arange(a, b), grids[a:b], shapes[a:b], counts[a:b]) for a, b in pairwise(bounds)]


def joint_variance_bytes(cells: int) -> int:
    """Planned memory (bytes) of one polygon's joint variance over ``cells`` averaging cells: the
    larger of its kernel tile and its residual-field block (the module docstring)."""
    return max(KERNEL_PAIR_BYTES * cells * cells, RESIDUAL_PAIR_BYTES * cells * min(cells, RESIDUAL_ROWS))


def most_cells(limit: int = JOINT_VARIANCE_BUDGET) -> int:
    """The most averaging cells a polygon may have for its joint variance to plan at most ``limit`` bytes."""
    low, high = 1, math.isqrt(limit)  # joint_variance_bytes(n) > n^2
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if joint_variance_bytes(middle) <= limit else (low, middle - 1)
    return low


@dataclasses.dataclass(frozen=True)
class SummaryPlan:
    """The blocks of a summary (:func:`polygon_blocks`) and its memory: the largest polygon
    (its label in the frame's index, its averaging cells) and its planned joint variance in
    bytes (:func:`joint_variance_bytes`, at most :data:`JOINT_VARIANCE_BUDGET`)."""

    blocks: list[PolygonBlock]
    largest: Hashable
    cells: int
    planned: int

    def describe(self) -> str:
        """One line: the largest polygon, its planned memory and the limit."""
        return (f"memory plan: the largest polygon (index {self.largest}) has {self.cells:,} averaging cells; its "
                f"joint covariance plans {_gib(self.planned)} of the {_gib(JOINT_VARIANCE_BUDGET)} allowed "
                f"({most_cells():,} cells), half of the {_gib(GRID_VALUE_BUDGET)} limit")


def plan_summary(
    polygons: gpd.GeoDataFrame, resolution: float | str = DEFAULT_RESOLUTION, cells_per_block: int = CELLS_PER_BLOCK
) -> SummaryPlan:
    """The blocks of ``polygons`` (:func:`polygon_blocks`) and their memory plan, checked.

    Raises:
        InputDataError: no polygons.
        ResourceLimitError: the largest polygon's joint variance (:func:`joint_variance_bytes`)
            is above :data:`JOINT_VARIANCE_BUDGET`; the message names a coarser ``--resolution``.
    """
    if len(polygons) == 0:
        raise InputDataError("no polygons to summarise")
    blocks = polygon_blocks(polygons, resolution, cells_per_block)
    sizes = np.concatenate([block.cells for block in blocks])
    position = int(np.argmax(sizes))
    cells = int(sizes[position])
    plan = SummaryPlan(blocks, polygons.index[position], cells, joint_variance_bytes(cells))
    if plan.planned > JOINT_VARIANCE_BUDGET:
        fitting = most_cells()
        raise ResourceLimitError(
            f"the polygon with index {plan.largest} has {cells:,} averaging cells at resolution {resolution}; its "
            f"joint covariance plans {_gib(plan.planned)}, above the {_gib(JOINT_VARIANCE_BUDGET)} allowed "
            f"({fitting:,} cells), half of the {_gib(GRID_VALUE_BUDGET)} limit; use a coarser --resolution, e.g. "
            f"{_coarser(resolution, math.sqrt(cells / fitting))}"
        )
    return plan


def _gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"


def _coarser(resolution: float | str, factor: float) -> str:
    """``resolution`` (a number or ``"500m"`` style) times ``factor``, rounded up to two
    significant digits, with its unit."""
    value, unit = parse_resolution(resolution)
    scaled = value * factor
    step = 10.0 ** (math.floor(math.log10(scaled)) - 1)
    return f"{math.ceil(scaled / step) * step:g}{unit or ''}"


def summarize_polygons(
    model: Any,
    polygons: gpd.GeoDataFrame,
    *,
    time: Quarter | str | None = None,
    resolution: float | str = DEFAULT_RESOLUTION,
    threshold: float | str | None = DEFAULT,
    cells_per_block: int = CELLS_PER_BLOCK,
    plan: SummaryPlan | None = None,
    client: Client | str | None = None,
    progress: bool = False,
) -> gpd.GeoDataFrame:
    """Summarise a fitted :class:`~geodbk.fit.geomodel.GeoModel` (a GP kind) over each polygon.

    Args:
        model: the fitted model.
        polygons: a GeoDataFrame of polygons in any CRS (kept in the output).
        time: the quarter, a :class:`~geodbk.quarters.Quarter` or its label ``"2023Q4"`` (default
            the model's latest fitted quarter).
        resolution: side of the averaging cells (degrees, or ``"500m"`` style).
        threshold: for ``share_below``, in data units; default the FCC benchmark of the
            model's service and target; ``None`` leaves the column out.
        cells_per_block: averaging cells predicted together (whole polygons; module docstring).
        plan: :func:`plan_summary` of these polygons, made by the caller to show it first
            (then ``resolution`` and ``cells_per_block`` are those it was made with); default
            made here.
        client: summarise the blocks on a Dask cluster: a :class:`distributed.Client`, a
            scheduler address (``"tcp://host:8786"``) or ``"local"`` / ``"local:N"``, as for
            :func:`~geodbk.maps.predict.predict_grid`; the model is sent to each worker once.
        progress: show a tqdm bar over blocks.

    Returns:
        The polygons with the columns listed in the module docstring added (and ``quarter``).

    Raises:
        InputDataError: polygons without a CRS, no polygons, or a model without a joint posterior.
        ResourceLimitError: the largest polygon is above the memory plan's limit (:func:`plan_summary`).
    """
    if polygons.crs is None:
        raise InputDataError("the polygons have no CRS; geodbk will not guess one")
    if not model.has_kernel:
        raise InputDataError(f"area summaries need a GP model; {model.kind} has no joint posterior")
    level = resolve_threshold(threshold, model.info)
    quarter = model.latest_quarter if time is None else Quarter.parse(time)
    blocks = (plan or plan_summary(polygons, resolution, cells_per_block)).blocks
    job = SummaryJob(model, quarter, level, pyproj.CRS.from_user_input(polygons.crs))
    n = len(polygons)
    cells, observed = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    mean, sd, share = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    extrapolating: dict[int, str] = {}
    for index, done in _run_blocks(job, blocks, client, progress):
        rows = done.positions
        cells[rows], mean[rows], sd[rows], observed[rows] = done.cells, done.mean, done.sd, done.observed_tiles
        if done.share_below is not None:
            share[rows] = done.share_below
        for w in done.warnings:
            if issubclass(w.category, ExtrapolationWarning):
                extrapolating.setdefault(index, w.message)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if extrapolating:  # once, with the first block's message
        warnings.warn(extrapolating[min(extrapolating)], ExtrapolationWarning, stacklevel=2)
    key = model.info.units.lower()
    out = polygons.copy()
    out["quarter"] = None if quarter is None else str(quarter)
    out["cells"] = cells
    out["mean_log10"], out["sd_log10"] = mean, sd
    out[f"median_{key}"], out[f"lower_{key}"], out[f"upper_{key}"] = to_data_units(mean, sd)
    if level is not None:
        out["share_below"] = share
        out["threshold"] = level
    out["observed_tiles"] = observed
    return out


def _run_blocks(
    job: SummaryJob, blocks: Sequence[PolygonBlock], client: Client | str | None, progress: bool
) -> Iterator[tuple[int, BlockSummary]]:
    """``(block index, its summary)`` for every block, here in order or on a Dask cluster as they finish."""
    if client is None:
        for index, block in enumerate(tqdm(blocks, desc=PROGRESS_LABEL, unit="block", disable=not progress)):
            yield index, job(block)
        return
    from geodbk.maps.parallel import connect, map_blocks

    with connect(client) as dask_client:
        yield from map_blocks(dask_client, job, blocks, progress=progress, desc=PROGRESS_LABEL)


def _observed_tiles(model: Any, block: PolygonBlock, crs: pyproj.CRS) -> np.ndarray:
    """Training tiles of ``model`` inside each polygon of ``block`` (its shapes, in ``crs``), (k,);
    -1 each if the model has no tile locations. The tiles are first cut to the polygons' lon/lat
    bounds (padded by :data:`BOUNDS_PAD_DEG` for edges that bend between the CRSs), then matched
    to the shapes through an STRtree (a tile on an edge is in neither, as with ``contains``)."""
    support = model.support
    if support is None:
        return np.full(len(block.shapes), -1)
    west, south, east, north = shapely.total_bounds([grid.geometry for grid in block.grids])
    near = support[(support[:, 0] >= west - BOUNDS_PAD_DEG) & (support[:, 0] <= east + BOUNDS_PAD_DEG)
                   & (support[:, 1] >= south - BOUNDS_PAD_DEG) & (support[:, 1] <= north + BOUNDS_PAD_DEG)]
    x, y = pyproj.Transformer.from_crs(4326, crs, always_xy=True).transform(near[:, 0], near[:, 1])
    _, inside = shapely.STRtree(block.shapes).query(shapely.points(x, y), predicate="within")
    return np.bincount(inside, minlength=len(block.shapes))


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


__all__ = [
    "CELLS_PER_BLOCK", "DEFAULT_RESOLUTION", "JOINT_VARIANCE_BUDGET", "KERNEL_PAIR_BYTES", "RESIDUAL_PAIR_BYTES",
    "RESIDUAL_ROWS", "BlockSummary", "PolygonBlock", "SummaryJob", "SummaryPlan", "joint_variance_bytes", "most_cells",
    "plan_summary", "polygon_blocks",
    "polygon_cells", "polygon_grids", "polygons_in_region", "summarize_polygons", "write_summary",
]
