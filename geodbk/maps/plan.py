"""One map request, resolved once: :class:`MapPlan` = a grid, its layers and where they go.

A plan is what :meth:`geodbk.fit.geomodel.GeoModel.plan` makes of ``(resolution, region,
quarters, change, options)``: the :class:`~geodbk.maps.geometry.RegularGrid` (built once), the
:class:`~geodbk.maps.schema.GridLayers` of the model at those quarters, and the block size and
store of the prediction. :meth:`MapPlan.describe` says what it holds and costs before anything
is predicted; :meth:`MapPlan.check` is every refusal of a map request, in one place (a grid too
large to hold, a grid with no cell inside its region, an area or quarter outside the fitted
domain, a store this run may not write). :func:`geodbk.maps.predict.predict_plan` predicts a
plan, and ``GeoModel.grid(plan)`` calls it.

The plan needs only a :class:`~geodbk.maps.schema.SpatialPredictor` and, to refuse
extrapolation, the model's :data:`DomainReporter` (``GeoModel.domain_report``), so this module
does not import :mod:`geodbk.fit`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from shapely.geometry.base import BaseGeometry

from geodbk.dataset.domain import DomainReport
from geodbk.dataset.inputs import TimeLike
from geodbk.errors import InputDataError
from geodbk.fileio import ZARR_STORE, check_output
from geodbk.maps.geometry import RegularGrid, area_sample
from geodbk.maps.schema import BYTES_PER_VALUE, GridLayers, SpatialPredictor, check_cells_inside, check_grid_size
from geodbk.maps.thresholds import DEFAULT, Benchmark
from geodbk.quarters import Quarter

if TYPE_CHECKING:  # pragma: no cover - typing only
    from distributed import Client

#: How far (m, 2) lon/lat degrees at each of some quarters leave a model's fitted domain
#: (:meth:`geodbk.fit.geomodel.GeoModel.domain_report`).
DomainReporter = Callable[[np.ndarray, Sequence[TimeLike]], DomainReport]


@dataclass(frozen=True)
class MapPlan:
    """A map request, resolved: what :func:`geodbk.maps.predict.predict_plan` predicts.

    Build one with :meth:`over` (or :meth:`geodbk.fit.geomodel.GeoModel.plan`).

    Attributes:
        model: the fitted model.
        grid: the grid to fill.
        layers: its variables (quarters, change, threshold, benchmark, kernel-slice references).
        rows_per_block: grid rows predicted and written at a time (1 to ``grid.height``).
        max_distance: leave cells farther than this many metres from a training tile NaN, or ``None``.
        store: the ``*.zarr`` / ``*.nc`` store the blocks go to, or ``None`` (in memory).
        overwrite: replace whatever stands at ``store``.
        client: the Dask cluster that predicts the blocks (see
            :func:`~geodbk.maps.predict.predict_grid`), or ``None``: here.
        progress: show a progress bar over blocks.
        domain: the model's :data:`DomainReporter`, to refuse an area or quarter outside the
            fitted domain; ``None`` predicts there (with an ExtrapolationWarning).
        domain_lift: how that refusal says to lift it (the CLI's ``--allow-extrapolation``), or ``None``.
    """

    model: SpatialPredictor
    grid: RegularGrid
    layers: GridLayers
    rows_per_block: int
    max_distance: float | None = None
    store: Path | None = None
    overwrite: bool = False
    client: Client | str | None = None
    progress: bool = True
    domain: DomainReporter | None = None
    domain_lift: str | None = None

    @classmethod
    def over(
        cls,
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
        domain: DomainReporter | None = None,
    ) -> MapPlan:
        """The plan of ``model`` on ``grid``; the arguments are those of
        :func:`~geodbk.maps.predict.predict_grid` (``time`` and ``change`` already resolved to
        quarters), plus ``domain`` (see the class).

        Raises:
            InputDataError: a layer that cannot be made (:meth:`GridLayers.for_model`), ``chunk_rows``
                below 1 or a ``max_distance`` that is not positive.
        """
        layers = GridLayers.for_model(model, time=time, threshold=threshold, change=change, refs=refs,
                                      benchmark=benchmark)
        if chunk_rows is None:
            rows = max(1, grid.default_chunk_rows() // len(layers.quarters))
        else:
            rows = int(chunk_rows)
        if rows < 1:
            raise InputDataError(f"chunk_rows must be >= 1, got {chunk_rows}")
        if max_distance is not None and not max_distance > 0:
            raise InputDataError(f"max_distance must be positive metres, got {max_distance}")
        return cls(model, grid, layers, min(rows, grid.height), max_distance, None if store is None else Path(store),
                   overwrite, client, progress, domain)

    def with_refs(self, refs: Mapping[str, tuple[float, float]] | None) -> MapPlan:
        """This plan with its ``kernel_slice`` at ``refs`` instead (:meth:`GridLayers.with_refs`),
        e.g. reference points chosen on its grid; check it again, as the layers grew."""
        return replace(self, layers=self.layers.with_refs(refs, has_kernel=self.model.has_kernel))

    @property
    def cells(self) -> int:
        """Cells of the grid (inside the region or not)."""
        return int(self.grid.height) * int(self.grid.width)

    @property
    def nbytes(self) -> int:
        """Bytes of the grid's float32 values, over all layers."""
        return self.cells * self.layers.values_per_cell() * BYTES_PER_VALUE

    def describe(self) -> str:
        """One line: the grid's cells, resolution and CRS, its quarters, change and kernel-slice
        references, how many layers and values per cell, and the bytes they take."""
        grid, layers = self.grid, self.layers
        quarters = [str(q) for q in layers.quarters if q is not None]
        shown = ",".join(quarters) or "all fitted quarters pooled"
        n_layers, values = len(layers.variables()), layers.values_per_cell()
        unit = "deg" if grid.crs.is_geographic else "m"
        return (f"grid: {grid.height} x {grid.width} cells of {grid.resolution:g} {unit} in {grid.crs.to_string()}, "
                f"quarter(s) {shown}" + (f"; change {layers.change[0]} -> {layers.change[1]}" if layers.change else "")
                + (f"; kernel slices at {', '.join(layers.ref_names)}" if layers.ref_lonlat is not None else "")
                + f"; {n_layers} layers ({values} values per cell), "
                f"{_size(self.cells * values * BYTES_PER_VALUE)} of float32")

    def check(self) -> None:
        """Refuse the request before anything is predicted or written, in this order: an area or
        quarter outside the fitted domain (when the plan has a ``domain``), a grid too large to
        hold (:func:`~geodbk.maps.schema.check_grid_size`), a grid with no cell inside its
        region (:func:`~geodbk.maps.schema.check_cells_inside`), and a store this run may not
        write (:func:`check_store`).

        Raises:
            InputDataError: outside the domain, no cell inside, or a store of the wrong kind.
            ResourceLimitError: too many cells.
            OutputExistsError: a store that would destroy something.
        """
        if self.domain is not None:
            times = [*self.layers.quarters, *(self.layers.change or ())]
            refuse_outside(self.domain, self.grid.geometry, times, lift=self.domain_lift)
        check_grid_size(self.grid, self.layers.values_per_cell())
        check_cells_inside(self.grid)
        check_store(self.store, parallel=self.client is not None, overwrite=self.overwrite)


def _size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it at 1 or more (``"2.4 MiB"``)."""
    value, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.3g} {unit}"


def refuse_outside(
    domain: DomainReporter, geometry: BaseGeometry, times: Sequence[TimeLike], *, lift: str | None = None
) -> None:
    """Refuse an area (lon/lat shapely ``geometry``) mostly outside the fitted extent, or ``times``
    beyond the forecast allowance (:meth:`~geodbk.dataset.domain.DomainReport.problem`), asking
    ``domain`` about a lattice of points over the area (:func:`~geodbk.maps.geometry.area_sample`).

    Raises:
        InputDataError: naming the problem (and ``lift``, when given).
    """
    problem = domain(area_sample(geometry), times).problem()
    if problem is not None:
        raise InputDataError(problem if lift is None else f"{problem}; {lift}")


def check_store(
    store: str | Path | None,
    *,
    parallel: bool,
    name: str = "store",
    overwrite: bool = False,
    inputs: Sequence[str | Path] = (),
) -> None:
    """Raise unless ``store`` is a path this run can write (a Zarr store for a Dask cluster) that
    destroys nothing (:func:`geodbk.fileio.check_output`: not one of ``inputs``, nor holding one,
    and replacing only its own kind unless ``overwrite``); ``name`` is what the message calls it
    (``"--out"`` in the CLI)."""
    suffix = None if store is None else Path(store).suffix
    given = "none" if store is None else Path(store).name
    if parallel and suffix != ".zarr":
        raise InputDataError(
            f"a Dask cluster writes its blocks straight into a Zarr store: {name} must end in .zarr, got {given}"
        )
    if store is not None and suffix not in (".zarr", ".nc", ".nc4"):
        raise InputDataError(f"{name} must end in .nc or .zarr, got {given}")
    if store is not None:
        kind = ZARR_STORE if suffix == ".zarr" else None
        check_output(store, kind=kind, overwrite=overwrite, inputs=inputs, name=name)


__all__ = ["DomainReporter", "MapPlan", "check_store", "refuse_outside"]
