"""Chunked prediction of a fitted model over a :class:`~geodbk.maps.geometry.RegularGrid`.

:func:`predict_grid` walks the grid in row blocks, converts the cell centres to lon/lat,
asks a fitted model (anything that satisfies :class:`~geodbk.maps.schema.SpatialPredictor`,
e.g. :class:`geodbk.fit.geomodel.GeoModel`) for the variables that
:class:`~geodbk.maps.schema.GridLayers` lists (tile-mean predictive mean, sd, 95% bounds and
the probability of being below a speed benchmark, per quarter; optionally the change between
two quarters and kernel slices) at the cells inside the region polygon only (and, with
``max_distance``, within that many metres of a training tile), and writes the block into
preallocated float32 arrays or straight into a Zarr / NetCDF store
(:mod:`geodbk.maps.stores`), so peak memory depends on the block size and the number of
quarters, not on the grid size. :func:`predict_plan` does the same for a
:class:`~geodbk.maps.plan.MapPlan` (what ``GeoModel.grid`` predicts); :func:`predict_grid` is
:meth:`MapPlan.over` of its arguments, then :func:`predict_plan`.

Given a Dask ``client``, the same :class:`GridJob` runs on the cluster's workers instead, one
task per row block, each writing its block into the Zarr store itself
(:mod:`geodbk.maps.parallel`); the result is the serial one, bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Generator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from geodbk.errors import ExtrapolationWarning
from geodbk.maps.geometry import CellLocator, RegularGrid
from geodbk.maps.plan import MapPlan
from geodbk.maps.schema import GridLayers, SpatialPredictor, grid_template
from geodbk.maps.stores import BlockSink, MemorySink, NetCDFSink, ZarrRegions, ZarrSink
from geodbk.maps.thresholds import DEFAULT, Benchmark
from geodbk.quarters import Quarter

if TYPE_CHECKING:  # pragma: no cover - typing only
    from distributed import Client

PROGRESS_LABEL = "predicting grid"


def predict_grid(
    model: SpatialPredictor,
    grid: RegularGrid,
    *,
    refs: Mapping[str, tuple[float, float]] | None = None,
    time: Quarter | str | Sequence[Quarter | str] | None = None,
    change: Sequence[Quarter | str] | None = None,
    threshold: float | str | None = DEFAULT,
    benchmark: str | Benchmark | None = None,
    max_distance: float | None = None,
    chunk_rows: int | None = None,
    store: str | Path | None = None,
    progress: bool = True,
    client: Client | str | None = None,
    overwrite: bool = False,
) -> xr.Dataset:
    """Predict ``model`` on every cell of ``grid`` inside the region, one row block at a time.

    Parameters
    ----------
    model
        A fitted :class:`SpatialPredictor` (e.g. :class:`geodbk.fit.geomodel.GeoModel`); its
        ``meta`` (``target``, ``units``, ``service``, ``kind``) names the variables.
    grid
        The :class:`RegularGrid` to fill.
    refs
        ``{name: (lon, lat)}`` reference points for the ``kernel_slice`` variable (see
        :func:`reference_points`); no ``kernel_slice`` when empty or when the model has no
        kernel (``has_kernel`` false, e.g. knn).
    time
        The quarter to map, a :class:`~geodbk.quarters.Quarter` or its label ``"2023Q4"``
        (2-D layers); default the model's latest fitted quarter (time-free models map their
        pooled quarters). A list of quarters, e.g. ``["2022Q4", "2023Q4"]``, adds a CF ``time``
        dimension to the per-quarter layers.
    change
        ``(from, to)`` quarters, e.g. ``("2022Q4", "2023Q4")``: add the change layers
        (mean change, joint-posterior sd, P(increase), change of the median in data units).
    threshold
        ``p_below`` = P(tile-mean value < threshold), threshold in data units (Mbps); the
        default is the FCC benchmark for the model's service and target
        (:mod:`geodbk.maps.thresholds`); ``None`` leaves the layer out.
    benchmark
        a download/upload pair (``"35/3"``, :class:`~geodbk.maps.thresholds.Benchmark`, or
        ``"default"``: the service's FCC pair) for the ``p_meets`` layers of a model of both
        speeds (see :mod:`geodbk.maps.schema`); ``None`` leaves them out.
    max_distance
        Leave cells farther than this many metres from any training tile as NaN.
    chunk_rows
        Grid rows per block (default: about 262k cells per block, divided by the number of
        quarters). Peak memory grows with this, not with the grid size, when ``store`` is given.
    store
        Write blocks straight into this Zarr (``*.zarr``) or NetCDF (``*.nc``) store and
        return it opened lazily; without it the result is built in memory. The store is
        written atomically: blocks go to a hidden temporary beside it that is renamed into
        place at the end (:mod:`geodbk.fileio`); on any failure it is removed and an older
        store at the path is left as it was. An existing ``store`` is replaced only if it is
        the same kind of thing (a file for ``*.nc``; an empty folder or a Zarr store geodbk
        wrote for ``*.zarr``), see :func:`geodbk.fileio.check_output`.
    progress
        Show a tqdm bar over blocks.
    client
        Predict the blocks in parallel on a Dask cluster: a :class:`distributed.Client`, a
        scheduler address (``"tcp://host:8786"``), or ``"local"`` / ``"local:N"`` for a local
        cluster of N (default 2) single-threaded worker processes, shut down afterwards.
        Needs a ``*.zarr`` ``store`` on a filesystem every worker sees (workers write their
        blocks into it themselves) and geodbk installed on the workers; the model is sent to
        each worker once. The result equals the serial one exactly; see
        :mod:`geodbk.maps.parallel`.
    overwrite
        Replace whatever stands at ``store``.

    Returns
    -------
    xarray.Dataset
        Variables as listed in :mod:`geodbk.maps.schema`, float32, NaN outside the region, with
        CF attributes and the CRS in a ``spatial_ref`` coordinate (rioxarray convention).
    """
    return predict_plan(MapPlan.over(
        model, grid, refs=refs, time=time, change=change, threshold=threshold, benchmark=benchmark,
        max_distance=max_distance, chunk_rows=chunk_rows, store=store, progress=progress, client=client,
        overwrite=overwrite,
    ))


def predict_plan(plan: MapPlan) -> xr.Dataset:
    """Check ``plan`` (:meth:`MapPlan.check`), then predict it one row block at a time into its
    store (or memory); the result is described in :func:`predict_grid`."""
    plan.check()
    template = grid_template(plan.grid, plan.model, plan.layers, lazy=plan.store is not None,
                             chunk_rows=plan.rows_per_block, max_distance=plan.max_distance)
    sink = _open_sink(template, plan.store, overwrite=plan.overwrite)
    blocks = list(plan.grid.blocks(plan.rows_per_block))
    job = GridJob(plan.model, plan.grid, plan.layers, plan.max_distance, sink)
    log = _WarningLog()
    try:
        # closing: a failure here (a warning made an error) stops the cluster's blocks before the abort
        with contextlib.closing(_block_warnings(job, blocks, plan.client, plan.progress)) as results:
            for index, caught in results:
                log.add(index, caught)
        finished = sink.finish()
    except BaseException:  # KeyboardInterrupt too: drop the staged store, keep an older one
        sink.abort()
        raise
    log.emit(len(blocks))
    return finished


def _open_sink(template: xr.Dataset, store: str | Path | None, *, overwrite: bool) -> BlockSink:
    """Where the blocks go: the template itself, or a Zarr / NetCDF store staged at ``store``."""
    if store is None:
        return MemorySink(template)
    path = Path(store)
    if path.suffix == ".zarr":
        return ZarrSink(template, path, overwrite=overwrite)
    return NetCDFSink(template, path, overwrite=overwrite)


@dataclasses.dataclass(frozen=True)
class CaughtWarning:
    """A warning raised while predicting a block, in a form that pickles (from a Dask worker)."""

    category: type[Warning]
    message: str
    filename: str
    lineno: int


@dataclasses.dataclass
class GridJob:
    """Predicts one row block of ``grid`` and writes it: what every block needs but the rows.

    The serial path calls it for each block; on a Dask cluster it is sent once to each worker
    with the sink's picklable :class:`~geodbk.maps.stores.ZarrRegions` as ``sink``
    (:mod:`geodbk.maps.parallel`).
    """

    model: SpatialPredictor
    grid: RegularGrid
    layers: GridLayers
    max_distance: float | None
    sink: BlockSink | ZarrRegions

    @cached_property
    def locator(self) -> CellLocator:
        """Built once per process that runs blocks (not pickled: its prepared polygon would not survive)."""
        return CellLocator(self.grid)

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "locator"}

    def __call__(self, rows: slice) -> list[CaughtWarning]:
        """Predict and write grid rows ``rows``; return the warnings raised while predicting."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExtrapolationWarning)
            block = _predict_block(self.model, self.locator, rows, self.layers, self.max_distance)
        self.sink.write(rows, block)
        return [CaughtWarning(w.category, str(w.message), w.filename, w.lineno) for w in caught]


def _block_warnings(
    job: GridJob, blocks: Sequence[slice], client: Client | str | None, progress: bool
) -> Generator[tuple[int, list[CaughtWarning]], None, None]:
    """Run ``job`` on every block, here or on a Dask cluster; yield ``(block index, its warnings)``."""
    if client is None:
        for index, rows in enumerate(tqdm(blocks, desc=PROGRESS_LABEL, unit="block", disable=not progress)):
            yield index, job(rows)
        return
    from geodbk.maps.parallel import check_visible, connect, map_blocks

    sink = job.sink
    assert isinstance(sink, ZarrSink), "a cluster writes into a Zarr store"  # check_store made sure
    with connect(client) as dask_client:
        check_visible(dask_client, sink.regions.path)
        remote = dataclasses.replace(job, sink=sink.regions)
        yield from map_blocks(dask_client, remote, blocks, progress=progress, desc=PROGRESS_LABEL)


class _WarningLog:
    """The warnings of a grid's blocks, in one place.

    ExtrapolationWarnings become one at the end: the message of the first block (in grid
    order) that raised one, and how many blocks did. Others are re-raised as they come, once
    per message and place under the default filter (not once per block).
    """

    def __init__(self) -> None:
        self.extrapolating: dict[int, str] = {}
        self.registry: dict[Any, Any] = {}

    def add(self, index: int, caught: Sequence[CaughtWarning]) -> None:
        for w in caught:
            if issubclass(w.category, ExtrapolationWarning):
                self.extrapolating.setdefault(index, w.message)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=self.registry)

    def emit(self, n_blocks: int) -> None:
        """Warn (at the caller of ``predict_grid``) if any block extrapolated."""
        if self.extrapolating:
            first = self.extrapolating[min(self.extrapolating)]
            warnings.warn(
                f"{first} (in {len(self.extrapolating)} of {n_blocks} grid block(s); the first shown)",
                ExtrapolationWarning,
                stacklevel=3,
            )


def _predict_block(
    model: SpatialPredictor, locator: CellLocator, rows: slice, layers: GridLayers, max_distance: float | None
) -> dict[str, np.ndarray]:
    """float32 variables of one row block, (..., rows, width), NaN outside."""
    lonlat, inside = locator.cells(rows)
    if max_distance is not None and len(lonlat):
        near = model.distance_to_data(lonlat) <= max_distance
        inside[inside] = near
        lonlat = lonlat[near]
    values = layers.values(model, lonlat) if len(lonlat) else {}
    sizes = layers.sizes()
    block: dict[str, np.ndarray] = {}
    for name, (dims, _) in layers.variables().items():
        out = np.full((*(sizes[d] for d in dims[:-2]), *inside.shape), np.nan, dtype=np.float32)
        if values:
            out[..., inside] = values[name]
        block[name] = out
    return block


__all__ = ["predict_grid", "predict_plan"]
