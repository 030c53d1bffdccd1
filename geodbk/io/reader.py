"""The one reader of the geodbk grid format: a grid's quarters, the grid at one quarter, the span of
its change layers and its cells inside a geometry.

:mod:`geodbk.maps.schema` writes the format; :class:`GridReader` is the base of the ``.dbk``
accessor (:mod:`geodbk.io.accessor`), so ``grid.dbk.quarters`` and the other members below are
read here and nowhere else. :func:`geodbk.io.geotiff.geotiff_bands`, which the accessor itself
calls, reads grids through this class directly. A grid comes in one of two layouts:

- several quarters: per-quarter variables with dims ``(time, y, x)``, a ``quarter`` label
  coordinate along ``time`` (and ``time``/``time_bounds``, the quarters' first days);
- one quarter: ``(y, x)`` variables, the mapped quarter in the ``quarter`` attribute (absent for
  a time-free model, which maps its fitted quarters pooled).

Change layers (``change``, ``change_sd``, ...) are ``(y, x)`` in both, with their quarters in the
grid's ``change="from:to"`` attribute and in each variable's ``quarter_from``/``quarter_to``.
Cells outside the mapped region are NaN.
"""

from __future__ import annotations

import numpy as np
import shapely
import xarray as xr
from shapely.geometry.base import BaseGeometry

from geodbk.errors import InputDataError
from geodbk.quarters import Quarter

#: Coordinates that a one-quarter map keeps: the cell centres and the CRS.
_MAP_COORDS = ("x", "y", "spatial_ref")


class GridReader:
    """Reads the layout of a geodbk grid ``ds`` (see the module docstring); ``ds.dbk`` is one."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def _variables(self, *names: str) -> list[xr.DataArray]:
        """The grid's variables ``names``.

        Raises:
            InputDataError: the grid lacks one of them (not a geodbk grid).
        """
        missing = [name for name in names if name not in self._ds.data_vars]
        if missing:
            have = list(self._ds.data_vars)
            raise InputDataError(f"not a geodbk grid: no {' or '.join(missing)} variable (it has {have})")
        return [self._ds[name] for name in names]

    @property
    def quarters(self) -> list[Quarter]:
        """The mapped quarters, in grid order: the ``quarter`` coordinate along ``time``, else the
        ``quarter`` attribute of a one-quarter grid, else ``[]`` (a time-free model's pooled map).

        Raises:
            InputDataError: a ``time`` dimension without its ``quarter`` coordinate, or a bad label.
        """
        if "time" in self._ds.dims:
            if "quarter" not in self._ds.coords:
                raise InputDataError("not a geodbk grid: a time dimension without its quarter coordinate")
            return [Quarter.parse(str(label)) for label in self._ds["quarter"].to_numpy()]
        label = self._ds.attrs.get("quarter")
        return [Quarter.parse(str(label))] if label else []

    def at(self, quarter: Quarter | str | None = None) -> xr.Dataset:
        """The grid at one quarter: each ``(time, y, x)`` variable as its ``(y, x)`` map at
        ``quarter`` (default the last mapped one), the time coordinates dropped; variables
        without a time dimension as they are. A one-quarter grid is returned as it is.

        Raises:
            InputDataError: ``quarter`` is not one of :attr:`quarters`.
        """
        quarters = self.quarters
        wanted = None if quarter is None else Quarter.parse(quarter)
        if wanted is not None and wanted not in quarters:
            have = ", ".join(map(str, quarters)) or "none (a time-free map)"
            raise InputDataError(f"the grid has no quarter {wanted}; its quarters: {have}")
        if "time" not in self._ds.dims:
            return self._ds
        in_time = [name for name, var in self._ds.variables.items() if "time" in var.dims and "x" not in var.dims]
        index = -1 if wanted is None else quarters.index(wanted)
        return self._ds.drop_vars(in_time).isel(time=index)

    @property
    def change_span(self) -> tuple[Quarter, Quarter] | None:
        """``(from, to)``: the quarters of the change layers, from the grid's ``change="from:to"``
        attribute, else from the ``quarter_from``/``quarter_to`` of its ``change`` variable; None
        for a grid without change layers.

        Raises:
            InputDataError: a malformed ``change`` attribute or quarter label.
        """
        if "change" in self._ds.attrs:
            return Quarter.parse_span(str(self._ds.attrs["change"]), "the grid's change attribute")
        attrs = self._ds["change"].attrs if "change" in self._ds.data_vars else {}
        if "quarter_from" in attrs and "quarter_to" in attrs:
            return Quarter.parse(str(attrs["quarter_from"])), Quarter.parse(str(attrs["quarter_to"]))
        return None

    def cells_inside(self, geometry: BaseGeometry | None = None) -> xr.DataArray:
        """``(y, x)`` bool, named ``inside``: the mapped cells (a finite ``mean``; the region is the
        same in every quarter) whose centres lie in or on ``geometry``, a shapely geometry in the
        grid's CRS (every mapped cell for None).

        Raises:
            InputDataError: the grid has no ``mean`` variable.
        """
        self._variables("mean")
        mean = self.at()["mean"]
        finite = xr.apply_ufunc(np.isfinite, mean, dask="allowed")
        inside = finite.drop_vars([name for name in mean.coords if name not in _MAP_COORDS])
        if geometry is not None:
            xx, yy = np.meshgrid(mean["x"].to_numpy(), mean["y"].to_numpy())
            inside = inside & shapely.intersects_xy(geometry, xx, yy)
        return inside.rename("inside")


__all__ = ["GridReader"]
