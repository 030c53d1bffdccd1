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
quarters, not on the grid size.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyproj
import xarray as xr
from tqdm.auto import tqdm

from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.maps.geometry import CellLocator, RegionLike, RegularGrid
from geodbk.maps.schema import GridLayers, SpatialPredictor, grid_template
from geodbk.maps.stores import MemorySink, NetCDFSink, ZarrSink
from geodbk.maps.thresholds import DEFAULT


def predict_grid(
    model: SpatialPredictor,
    grid: RegularGrid,
    *,
    refs: Mapping[str, tuple[float, float]] | None = None,
    time: str | Sequence[str] | None = None,
    change: tuple[str, str] | None = None,
    threshold: float | str | None = DEFAULT,
    max_distance: float | None = None,
    chunk_rows: int | None = None,
    store: str | Path | None = None,
    progress: bool = True,
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
        The quarter to map, e.g. ``"2023Q4"`` (2-D layers); default the model's latest
        fitted quarter (time-free models map their pooled quarters). A list of quarters,
        e.g. ``["2022Q4", "2023Q4"]``, adds a CF ``time`` dimension to the per-quarter layers.
    change
        ``(from, to)`` quarters, e.g. ``("2022Q4", "2023Q4")``: add the change layers
        (mean change, joint-posterior sd, P(increase), change of the median in data units).
    threshold
        ``p_below`` = P(tile-mean value < threshold), threshold in data units (Mbps); the
        default is the FCC benchmark for the model's service and target
        (:mod:`geodbk.maps.thresholds`); ``None`` leaves the layer out.
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
        store at the path is left as it was.
    progress
        Show a tqdm bar over blocks.

    Returns
    -------
    xarray.Dataset
        Variables as listed in :mod:`geodbk.maps.schema`, float32, NaN outside the region, with
        CF attributes and the CRS in a ``spatial_ref`` coordinate (rioxarray convention).
    """
    layers = GridLayers.for_model(model, time=time, threshold=threshold, change=change, refs=refs)
    if chunk_rows is None:
        rows_per_block = max(1, grid.default_chunk_rows() // len(layers.quarters))
    else:
        rows_per_block = int(chunk_rows)
    if rows_per_block < 1:
        raise InputDataError(f"chunk_rows must be >= 1, got {chunk_rows}")
    rows_per_block = min(rows_per_block, grid.height)
    if max_distance is not None and not max_distance > 0:
        raise InputDataError(f"max_distance must be positive metres, got {max_distance}")
    template_args: dict[str, Any] = {
        "lazy": store is not None, "chunk_rows": rows_per_block, "max_distance": max_distance,
    }
    if store is None:
        sink: Any = MemorySink(grid_template(grid, model, layers, **template_args))
    else:
        path = Path(store)
        if path.suffix not in (".zarr", ".nc", ".nc4"):
            raise InputDataError(f"store must end in .zarr or .nc, got {path.name}")
        template = grid_template(grid, model, layers, **template_args)
        sink = ZarrSink(template, path) if path.suffix == ".zarr" else NetCDFSink(template, path)

    locator = CellLocator(grid)
    blocks = list(grid.blocks(rows_per_block))
    extrapolating: list[str] = []
    try:
        for rows in tqdm(blocks, desc="predicting grid", unit="block", disable=not progress):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ExtrapolationWarning)
                block = _predict_block(model, locator, rows, layers, max_distance)
            extrapolating += [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)][:1]
            for w in caught:
                if not issubclass(w.category, ExtrapolationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            sink.write(rows, block)
        finished = sink.finish()
    except BaseException:  # KeyboardInterrupt too: drop the staged store, keep an older one
        sink.abort()
        raise
    if extrapolating:
        warnings.warn(
            f"{extrapolating[0]} (in {len(extrapolating)} of {len(blocks)} grid block(s); the first shown)",
            ExtrapolationWarning,
            stacklevel=2,
        )
    return finished


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


def predict_region(
    model: SpatialPredictor,
    region: RegionLike,
    resolution: float | str,
    *,
    crs: str | int | pyproj.CRS | None = None,
    time: str | Sequence[str] | None = None,
    **kwargs: Any,
) -> xr.Dataset:
    """:meth:`RegularGrid.over` then :func:`predict_grid` (``kwargs`` go to it); see both."""
    return predict_grid(model, RegularGrid.over(region, resolution, crs=crs), time=time, **kwargs)


__all__ = ["predict_grid", "predict_region"]
