"""What a prediction grid holds: variable names, CF attributes, and their values at a block of cells.

:class:`GridLayers` is built once per grid (:meth:`GridLayers.for_model`) and then asked for
the values at the cells of each block (:meth:`GridLayers.values`). Variables, float32, NaN
outside the region (``<u>`` is the data unit in lower case: ``mbps`` or ``ms``):

Per quarter, dims ``(y, x)``, or ``(time, y, x)`` when several quarters are mapped:

========================  =======================================================
``mean``                  predictive mean of log10(value), the tile-mean surface
``sd``                    predictive standard deviation of log10(value)
``pi_width``              width of the 95% prediction interval, 2 * 1.959964 * sd
``mean_<u>``              10 ** mean, the median value in data units
``lower_<u>``             10 ** (mean - 1.959964 sd)
``upper_<u>``             10 ** (mean + 1.959964 sd)
``p_below``               P(tile-mean value < threshold) (when there is a threshold;
                          defaults in :mod:`geodbk.maps.thresholds`)
``p_meets``               P(tile-mean download >= D and upload >= U) for a benchmark
                          pair D/U, under the two targets' joint distribution (models of
                          both speeds, given a ``benchmark``)
``mean_upload_mbps``      the other target's median, 10 ** its mean (with ``p_meets``)
========================  =======================================================

Between two quarters (``change``), dims ``(y, x)``; GP models only:

========================  =======================================================
``change``                E[f(x, t_to) - f(x, t_from)], log10 units
``change_sd``             its standard deviation under the joint posterior
``p_increase``            P(f(x, t_to) > f(x, t_from))
``change_<u>``            10 ** mean(t_to) - 10 ** mean(t_from), data units
``p_meets_change``        P(meets) at t_to minus P(meets) at t_from (with ``p_meets``)
========================  =======================================================

``kernel_slice`` (dims ``(ref, y, x)``): the prior kernel k(x, x_ref) in log10 units
squared at the last mapped quarter (GP models only).

Several quarters give a CF ``time`` coordinate (the first day of each quarter, with
``time_bounds`` to the first day of the next) and a ``quarter`` label coordinate.

Size guard: before anything is allocated, :meth:`geodbk.maps.plan.MapPlan.check` refuses a grid whose float32
values (cells x values per cell x 4 bytes) would exceed :data:`GRID_VALUE_BUDGET` = 4 GiB, a
sixth of a 24 GB machine (an in-memory grid, an export or the dashboard holds a layer's
float64 copy and masks beside them): with the 7 layers of one quarter that is 153 million
cells (``predict --resolution 1e-4`` over Puerto Rico asks for 164 million). ``--max-cells``
(:func:`grid_size_limit`) sets the cap in cells instead.

Size: :class:`GridLayers` names, describes and computes every layer (about 500 lines with the
protocol and the template); apart, a layer's name, its attributes and its values would drift.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import pandas as pd
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor)
import xarray as xr

from geodbk.dataset.model_info import ModelInfo
from geodbk.errors import InputDataError, ResourceLimitError
from geodbk.maps.thresholds import DEFAULT, THRESHOLD_SOURCE, Benchmark, default_benchmark, resolve_threshold
from geodbk.prediction import Z95, probability_below, probability_both_above, to_data_units
from geodbk.quarters import Quarter

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.maps.geometry import RegularGrid

Dims = tuple[str, ...]

#: Bytes of one grid value (float32).
BYTES_PER_VALUE = 4
#: Memory the values of a grid may take unless a cap in cells is given, bytes (4 GiB).
GRID_VALUE_BUDGET = 4 << 30

_MAX_CELLS: ContextVar[int | None] = ContextVar("geodbk_max_grid_cells", default=None)


@contextmanager
def grid_size_limit(max_cells: int | None) -> Iterator[None]:
    """Within the block, grids may have up to ``max_cells`` cells (``None``: the default cap of
    :func:`check_grid_size`)."""
    token = _MAX_CELLS.set(max_cells)
    try:
        yield
    finally:
        _MAX_CELLS.reset(token)


class SpatialPredictor(Protocol):
    """Everything maps read from a fitted model (:class:`geodbk.fit.geomodel.GeoModel` is one).

    ``predict`` maps ``(n, 2)`` lon/lat degrees and a :class:`~geodbk.quarters.Quarter` (None: the default) to
    ``mean``, ``sd`` arrays ``(n,)`` in log10 units (of Mbps or ms); ``predict_series``, one per
    quarter. ``kernel_slice`` is the ``(n, k)`` prior kernel to ``k`` reference points (log10 units
    squared); it, ``predict_change`` and ``predict_areas`` are only called if ``has_kernel``.
    ``distance_to_data``: metres to the nearest training tile; ``support``: ``(m, 2)`` lon/lat of
    those tiles, or None; ``info``: what it was fitted on (:class:`~geodbk.dataset.model_info.ModelInfo`);
    ``latest_quarter``: None if time-free.
    """

    support: np.ndarray | None

    @property
    def info(self) -> ModelInfo: ...

    @property
    def kind(self) -> str: ...

    @property
    def has_kernel(self) -> bool: ...

    @property
    def latest_quarter(self) -> Quarter | None: ...

    def predict(self, lonlat: np.ndarray, time: Quarter | None = None) -> Any: ...

    def predict_series(self, lonlat: np.ndarray, times: Sequence[Quarter | None]) -> list[Any]: ...

    def predict_change(self, lonlat: np.ndarray, time_from: Quarter, time_to: Quarter) -> Any: ...

    def predict_areas(
        self, lonlat: np.ndarray, groups: np.ndarray, n_groups: int, time: Quarter | None, *, weights: np.ndarray,
        return_cells: Literal[True],
    ) -> tuple[Any, Any]: ...

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: Quarter | None = None) -> np.ndarray: ...

    def distance_to_data(self, lonlat: np.ndarray) -> np.ndarray: ...


def quarter_start(quarter: Quarter) -> pd.Timestamp:
    """2023Q4 -> 2023-10-01, the CF time value of a quarter."""
    return pd.Timestamp(quarter.start)


@dataclass(frozen=True)
class GridLayers:
    """The variables of one grid and how to compute them.

    Attributes:
        target, units: what the model predicts (``download``, ``Mbps``).
        quarters: the mapped quarters (``(None,)`` for a time-free model).
        stacked: several quarters along a ``time`` dimension (else 2-D layers).
        threshold: the ``p_below`` threshold in data units, or ``None`` for no such layer.
        change: ``(from, to)`` quarters of the change layers, or ``None``.
        ref_names: names of the kernel-slice reference points.
        ref_lonlat: (k, 2) their lon/lat in degrees, or ``None``.
        benchmark: the download/upload pair of the ``p_meets`` layers, or ``None``.
        other_target: the second target (``"upload"``) of a ``p_meets`` grid.
        correlation: the two targets' tile-mean error correlation of a ``p_meets`` grid.
    """

    target: str
    units: str
    quarters: tuple[Quarter | None, ...]
    stacked: bool
    threshold: float | None = None
    change: tuple[Quarter, Quarter] | None = None
    ref_names: tuple[str, ...] = ()
    ref_lonlat: np.ndarray | None = None
    benchmark: Benchmark | None = None
    other_target: str | None = None
    correlation: float = 0.0

    @classmethod
    def for_model(
        cls,
        model: Any,
        *,
        time: Quarter | str | Sequence[Quarter | str] | None = None,
        threshold: float | str | None = DEFAULT,
        change: Sequence[Quarter | str] | None = None,
        refs: Mapping[str, tuple[float, float]] | None = None,
        benchmark: str | Benchmark | None = None,
    ) -> GridLayers:
        """Resolve the grid's contents for ``model`` (see :func:`geodbk.maps.predict.predict_grid`).
        A ``benchmark`` needs a model of download and upload (``model.targets``, ``model.correlation``).
        Quarters (``time``, ``change``) are :class:`~geodbk.quarters.Quarter` values or their labels."""
        info = model.info
        has_kernel = model.has_kernel
        latest = model.latest_quarter
        stacked = time is not None and not isinstance(time, Quarter | str)
        quarters: tuple[Quarter | None, ...]
        if time is None or isinstance(time, Quarter | str):
            quarters = (latest if time is None else _check_quarter(time),)
        else:
            quarters = tuple(_check_quarter(quarter) for quarter in time)
        if not quarters:
            raise InputDataError("give at least one quarter to map")
        if stacked and latest is None:
            raise InputDataError("a time-free model (paper protocol) maps one pooled surface, not several quarters")
        if stacked and len(set(quarters)) != len(quarters):
            raise InputDataError(f"quarters repeat: {', '.join(map(str, quarters))}")
        level = resolve_threshold(threshold, info)
        pair = None
        if change is not None:
            if len(change) != 2:
                raise InputDataError(f"a change is between two quarters, from and to; got {change!r}")
            pair = check_change(*change)
            if latest is None or not has_kernel:
                raise InputDataError(
                    f"change maps need a space-time GP model; {info.kind} "
                    + ("is time-free" if latest is None else "is not a GP")
                )
        pair_levels, other, rho = None, None, 0.0
        if benchmark is not None:
            if tuple(model.targets) != ("download", "upload"):
                raise InputDataError(f"p_meets maps need a model of download and upload; the {info.kind} model "
                                     f"predicts {', '.join(model.targets)}")
            pair_levels = default_benchmark(info.service) if benchmark == DEFAULT else Benchmark.parse(benchmark)
            other, rho = "upload", float(model.correlation.tile)
        layers = cls(
            info.target, info.units, quarters, stacked, level,
            pair, (), None, pair_levels, other, rho,
        )
        return layers.with_refs(refs, has_kernel=has_kernel)

    def with_refs(self, refs: Mapping[str, tuple[float, float]] | None, *, has_kernel: bool) -> GridLayers:
        """These layers with the ``kernel_slice`` at ``refs`` ``{name: (lon, lat)}`` degrees (none
        without refs, or for a model without a kernel).

        Raises:
            InputDataError: a reference point that is not a finite (lon, lat) pair.
        """
        if not refs or not has_kernel:
            return replace(self, ref_names=(), ref_lonlat=None)
        names = tuple(refs)
        ref_lonlat = np.asarray([tuple(map(float, refs[n])) for n in names], dtype=np.float64)
        if ref_lonlat.shape != (len(names), 2) or not np.isfinite(ref_lonlat).all():
            raise InputDataError(f"reference points must be finite (lon, lat) pairs, got {dict(refs)}")
        return replace(self, ref_names=names, ref_lonlat=ref_lonlat)

    @property
    def key(self) -> str:
        """The data unit as used in variable names (``mbps``, ``ms``)."""
        return self.units.lower()

    @property
    def reference_quarter(self) -> Quarter | None:
        """The quarter of the kernel slices: the last mapped one."""
        return self.quarters[-1]

    def per_quarter_names(self) -> list[str]:
        names = ["mean", "sd", "pi_width", f"mean_{self.key}", f"lower_{self.key}", f"upper_{self.key}"]
        names += ["p_below"] if self.threshold is not None else []
        return names + (["p_meets", f"mean_{self.other_target}_{self.key}"] if self.benchmark is not None else [])

    def change_names(self) -> list[str]:
        if self.change is None:
            return []
        names = ["change", "change_sd", "p_increase", f"change_{self.key}"]
        return names + (["p_meets_change"] if self.benchmark is not None else [])

    def variables(self) -> dict[str, tuple[Dims, dict[str, Any]]]:
        """``{name: (dims, CF attributes)}`` of every variable, in order."""
        u, log_u = self.units, f"log10({self.units})"
        what = {"download": "download speed", "upload": "upload speed"}.get(self.target, self.target)
        per_quarter: dict[str, dict[str, Any]] = {
            "mean": {"long_name": f"predictive mean of log10 {what}", "units": log_u},
            "sd": {"long_name": f"predictive standard deviation of log10 {what}", "units": log_u},
            "pi_width": {"long_name": f"width of the 95% prediction interval of log10 {what}", "units": log_u},
            f"mean_{self.key}": {"long_name": f"predicted median {what} (10**mean)", "units": u},
            f"lower_{self.key}": {"long_name": f"lower bound of the 95% prediction interval of {what}", "units": u},
            f"upper_{self.key}": {"long_name": f"upper bound of the 95% prediction interval of {what}", "units": u},
        }
        if self.threshold is not None:
            per_quarter["p_below"] = {
                "long_name": f"probability that the tile-mean {what} is below {self.threshold:g} {u}",
                "units": "1",
                "threshold": self.threshold,
                "threshold_units": u,
                "threshold_source": THRESHOLD_SOURCE,
            }
        if self.benchmark is not None:
            per_quarter["p_meets"] = {
                "long_name": f"probability that the tile-mean download and upload speeds meet {self.benchmark} {u}",
                "units": "1", "benchmark": str(self.benchmark), "benchmark_units": u,
                "correlation": self.correlation, "threshold_source": THRESHOLD_SOURCE,
            }
            per_quarter[f"mean_{self.other_target}_{self.key}"] = {
                "long_name": f"predicted median {self.other_target} speed", "units": u}
        dims: Dims = ("time", "y", "x") if self.stacked else ("y", "x")
        out = {name: (dims, attrs) for name, attrs in per_quarter.items()}
        if self.change is not None:
            start, end = map(str, self.change)  # labels in the attributes
            span = f"from {start} to {end}"
            out["change"] = (("y", "x"), {"long_name": f"change of log10 {what} {span}", "units": log_u,
                                           "quarter_from": start, "quarter_to": end})
            out["change_sd"] = (("y", "x"), {"long_name": f"joint-posterior standard deviation of the change {span}",
                                              "units": log_u, "quarter_from": start, "quarter_to": end})
            out["p_increase"] = (("y", "x"), {"long_name": f"probability that {what} increased {span}", "units": "1",
                                               "quarter_from": start, "quarter_to": end})
            out[f"change_{self.key}"] = (("y", "x"), {"long_name": f"change of the median {what} {span}", "units": u,
                                                       "quarter_from": start, "quarter_to": end})
            if self.benchmark is not None:
                out["p_meets_change"] = (("y", "x"), {
                    "long_name": f"change of the probability of meeting {self.benchmark} {u} {span}", "units": "1",
                    "quarter_from": start, "quarter_to": end})
        if self.ref_lonlat is not None:
            attrs = {"long_name": "prior kernel k(x, x_ref) between each cell and the reference point",
                     "units": f"log10({u})^2"}
            if self.reference_quarter is not None:
                attrs["quarter"] = str(self.reference_quarter)
            out["kernel_slice"] = (("ref", "y", "x"), attrs)
        return out

    def sizes(self) -> dict[str, int]:
        """Lengths of the non-spatial dimensions."""
        return {"time": len(self.quarters), "ref": len(self.ref_names)}

    def values_per_cell(self) -> int:
        """How many float32 values the grid holds per cell, over all variables."""
        sizes = self.sizes()
        return sum(int(np.prod([sizes[d] for d in dims[:-2]])) for dims, _ in self.variables().values())

    def coords(self) -> dict[str, Any]:
        """The ``time``/``quarter``/``time_bounds`` and ``ref`` coordinates (xarray tuples)."""
        coords: dict[str, Any] = {}
        if self.stacked:
            starts = [quarter_start(q) for q in self.quarters if q is not None]
            ends = [start + pd.DateOffset(months=3) for start in starts]
            coords["time"] = ("time", pd.DatetimeIndex(starts).values,
                              {"standard_name": "time", "long_name": "first day of the quarter", "axis": "T",
                               "bounds": "time_bounds"})
            coords["time_bounds"] = (("time", "bounds"), np.column_stack([pd.DatetimeIndex(starts).values,
                                                                         pd.DatetimeIndex(ends).values]))
            coords["quarter"] = ("time", np.asarray([str(q) for q in self.quarters], dtype=object),
                                 {"long_name": "quarter label"})
        if self.ref_lonlat is not None:
            coords["ref"] = ("ref", np.asarray(self.ref_names, dtype=object), {"long_name": "reference point name"})
            coords["ref_lon"] = (
                "ref", self.ref_lonlat[:, 0], {"long_name": "reference point longitude", "units": "degrees_east"}
            )
            coords["ref_lat"] = (
                "ref", self.ref_lonlat[:, 1], {"long_name": "reference point latitude", "units": "degrees_north"}
            )
        return coords

    def values(self, model: Any, lonlat: np.ndarray) -> dict[str, np.ndarray]:
        """Every variable at ``lonlat`` (m, 2) degrees: (m,), or (T, m) / (k, m) with a lead dim."""
        per_quarter: dict[str, list[np.ndarray]] = {name: [] for name in self.per_quarter_names()}
        m = len(lonlat)
        others: list[Any] = [None] * len(self.quarters)
        if self.other_target is not None:
            others = model.for_target(self.other_target).predict_series(lonlat, self.quarters)
        for pred, other in zip(model.predict_series(lonlat, self.quarters), others, strict=True):
            mean = np.asarray(pred.mean, dtype=np.float64).reshape(-1)
            sd = np.asarray(pred.sd, dtype=np.float64).reshape(-1)
            if mean.shape != (m,) or sd.shape != (m,):
                raise InputDataError(f"model.predict returned mean {mean.shape} / sd {sd.shape} for {m} points")
            layers = [mean, sd, 2.0 * Z95 * sd, *to_data_units(mean, sd)]
            if self.threshold is not None:
                layers.append(probability_below(mean, sd, np.log10(self.threshold)))
            if self.benchmark is not None:
                layers += [self._p_meets(pred, other), 10.0 ** np.asarray(other.mean, np.float64)]
            for name, layer in zip(per_quarter, layers, strict=True):
                per_quarter[name].append(layer)
        out = {name: (np.stack(parts) if self.stacked else parts[0]) for name, parts in per_quarter.items()}
        if self.change is not None:
            change = model.predict_change(lonlat, *self.change)
            parts = [change.mean, change.sd, change.p_increase, change.median_change]
            if self.benchmark is not None:
                ends = [self._p_meets(*self._pair_at(model, lonlat, quarter)) for quarter in self.change]
                parts.append(ends[1] - ends[0])
            out.update(zip(self.change_names(), parts, strict=True))
        if self.ref_lonlat is not None:
            k = np.asarray(model.kernel_slice(lonlat, self.ref_lonlat, self.reference_quarter), dtype=np.float64)
            if k.shape != (m, len(self.ref_lonlat)):
                raise InputDataError(f"model.kernel_slice returned {k.shape}, expected {(m, len(self.ref_lonlat))}")
            out["kernel_slice"] = k.T
        return out


    def _p_meets(self, first: Any, second: Any) -> np.ndarray:
        """P(meets the benchmark) of the two targets' tile-mean predictions (m,)."""
        assert self.benchmark is not None
        return probability_both_above(first.mean, first.sd, second.mean, second.sd, self.correlation,
                                      *self.benchmark.log10_levels)

    def _pair_at(self, model: Any, lonlat: np.ndarray, quarter: Quarter) -> tuple[Any, Any]:
        assert self.other_target is not None
        return model.predict(lonlat, quarter), model.for_target(self.other_target).predict(lonlat, quarter)


def _check_quarter(quarter: Quarter | str) -> Quarter:
    """``quarter`` as a :class:`Quarter` (parsed from a label like ``"2023Q4"``).

    Raises:
        InputDataError: anything but a Quarter or a label.
    """
    if not isinstance(quarter, Quarter | str):
        raise InputDataError(f"quarters are labels like '2023Q4', got {quarter!r}")
    return Quarter.parse(quarter)


def check_change(start: Quarter | str, end: Quarter | str) -> tuple[Quarter, Quarter]:
    """The ``(from, to)`` quarters of a change, refused unless between two quarters: each a
    :class:`Quarter` or a label like ``"2023Q4"``, and different (a change of a quarter to itself
    is 0 with sd 0, and its P(increase) 0/0).

    Raises:
        InputDataError: a bad label, or the same quarter twice.
    """
    pair = _check_quarter(start), _check_quarter(end)
    if pair[0] == pair[1]:
        raise InputDataError(f"a change is between two different quarters; got {start} to {end}")
    return pair


def check_cells_inside(grid: RegularGrid) -> None:
    """Refuse a grid none of whose cell centres lies inside its region, so that every cell of
    the map would be NaN (a resolution larger than the region). Row blocks are tested until one
    holds a cell inside: the first, for any grid finer than its region.

    Raises:
        InputDataError: no cell centre inside; the message gives the region's extent.
    """
    from geodbk.maps.geometry import CellLocator

    locator = CellLocator(grid)
    if any(locator.cells(rows)[1].any() for rows in grid.blocks(grid.default_chunk_rows())):
        return
    west, south, east, north = locator.geometry.bounds
    unit = grid.crs.axis_info[0].unit_name if grid.crs.axis_info else "CRS"
    raise InputDataError(
        f"no cell of the {grid.height:,} x {grid.width:,} grid at resolution {grid.resolution:g} has its centre inside "
        f"the region ({east - west:.3g} x {north - south:.3g} {unit} units), so the map would be empty; use a finer "
        "--resolution"
    )


def check_grid_size(grid: RegularGrid, values_per_cell: int, *, lift: str | None = None) -> None:
    """Refuse a grid too large to hold (see the module docstring), before anything is allocated.

    Args:
        grid: the grid.
        values_per_cell: float32 values per cell (:meth:`GridLayers.values_per_cell`).
        lift: how the message says to lift the cap (default: ``pass --max-cells <cells>``).

    Raises:
        ResourceLimitError: more cells than the cap of :func:`grid_size_limit`, or by default more
            than :data:`GRID_VALUE_BUDGET` bytes of values.
    """
    cells = int(grid.height) * int(grid.width)
    cap = _MAX_CELLS.get()
    if cap is None:
        cap = GRID_VALUE_BUDGET // (BYTES_PER_VALUE * max(1, values_per_cell))
        why = f"{values_per_cell} value(s) per cell, {GRID_VALUE_BUDGET / 2**30:g} GiB of float32"
    else:
        why = "set by --max-cells"
    if cells > cap:
        raise ResourceLimitError(
            f"a grid of {grid.height:,} x {grid.width:,} = {cells:,} cells at resolution {grid.resolution:g} is "
            f"above the limit of {cap:,} cells ({why}); use a coarser resolution or "
            + (lift or f"pass --max-cells {cells}")
        )


# --- the result dataset ------------------------------------------------------------------
def _coordinate_attrs(crs: pyproj.CRS) -> tuple[dict[str, str], dict[str, str]]:
    if crs.is_geographic:
        return (
            {
                "standard_name": "longitude", "long_name": "longitude of cell centre", "units": "degrees_east",
                "axis": "X",
            },
            {
                "standard_name": "latitude", "long_name": "latitude of cell centre", "units": "degrees_north",
                "axis": "Y",
            },
        )
    unit = crs.axis_info[0].unit_name if crs.axis_info else "metre"
    units = "m" if unit in ("metre", "meter") else unit
    return (
        {"standard_name": "projection_x_coordinate", "long_name": "x of cell centre", "units": units, "axis": "X"},
        {"standard_name": "projection_y_coordinate", "long_name": "y of cell centre", "units": units, "axis": "Y"},
    )


def grid_template(
    grid: RegularGrid,
    model: SpatialPredictor,
    layers: GridLayers,
    *,
    lazy: bool,
    chunk_rows: int,
    max_distance: float | None,
) -> xr.Dataset:
    """The empty result dataset (NaN) with coordinates, CF attributes and the CRS, of a grid that
    :meth:`~geodbk.maps.plan.MapPlan.check` passed (so not too large to hold)."""
    import dask.array as da

    sizes, (height, width) = layers.sizes(), grid.shape

    def empty(dims: tuple[str, ...]) -> Any:
        lead = tuple(sizes[d] for d in dims[:-2])
        if lazy:
            return da.full((*lead, height, width), np.nan, dtype=np.float32, chunks=(*lead, chunk_rows, width))
        return np.full((*lead, height, width), np.nan, dtype=np.float32)

    data_vars = {name: (dims, empty(dims), attrs) for name, (dims, attrs) in layers.variables().items()}
    x_attrs, y_attrs = _coordinate_attrs(grid.crs)
    coords: dict[str, Any] = {"x": ("x", grid.x, x_attrs), "y": ("y", grid.y, y_attrs), **layers.coords()}
    ds = xr.Dataset(data_vars, coords=coords)
    for name in ("time", "time_bounds"):  # one CF time encoding for the coordinate and its bounds
        if name in ds.coords:
            ds[name].encoding.update(units="days since 1970-01-01", calendar="proleptic_gregorian", dtype="int64")
    ds.attrs = {
        "title": f"geodbk predictive map of log10 {layers.target} ({layers.units})",
        "Conventions": "CF-1.8",
        "source": f"geodbk model {model.info.kind}",
        "target": layers.target,
        "units": layers.units,
        "region": grid.region_name,
        "resolution": grid.resolution,
        "prediction_interval": "95% (mean +/- 1.959964 sd) of the tile-mean speed",
        "nodata": "NaN outside the region"
        + ("" if max_distance is None else f" or farther than {max_distance:g} m from a training tile"),
    }
    if layers.stacked:
        ds.attrs["quarters"] = ",".join(map(str, layers.quarters))
    elif layers.quarters[0] is not None:  # a time-free model maps all of its fitted quarters pooled
        ds.attrs["quarter"] = str(layers.quarters[0])
    if layers.threshold is not None:
        ds.attrs["threshold"] = layers.threshold
    if layers.change is not None:
        ds.attrs["change"] = ":".join(map(str, layers.change))
    ds.attrs["model_kind"] = model.info.kind
    if model.info.quarters:
        ds.attrs["model_quarters"] = str([str(quarter) for quarter in model.info.quarters])
    # inplace: rioxarray's default is a deep copy, which would double the preallocated arrays
    ds.rio.write_crs(grid.crs, inplace=True)
    ds.rio.write_transform(grid.transform, inplace=True)
    return ds.rio.write_coordinate_system(inplace=True)


__all__ = [
    "GridLayers",
    "SpatialPredictor",
    "check_cells_inside",
    "check_change",
    "check_grid_size",
    "grid_size_limit",
    "grid_template",
    "quarter_start",
]
