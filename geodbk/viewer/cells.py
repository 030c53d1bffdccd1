"""Cells and quarters of a saved grid, as the dashboard shows them.

The grid's layout (its quarters, one quarter of it, its change span and its cells) is read by
the ``.dbk`` accessor (:class:`geodbk.io.reader.GridReader`); this module turns it into what
the dashboard shows (its :class:`~geodbk.quarters.Quarter` values, the last quarter where the
wanted one is missing, lon/lat of the cells).
"""

from __future__ import annotations

import numpy as np
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor that gives a grid's CRS)
import xarray as xr

import geodbk.io.accessor  # noqa: F401  (registers the .dbk accessor that reads a grid's layout)
from geodbk.quarters import Quarter

#: Name of a lone variable while it is read as a one-variable grid (:func:`at_quarter`).
_LONE = "values"


def grid_quarters(grid: xr.Dataset | None) -> list[Quarter]:
    """The quarters of a grid (``grid.dbk.quarters``); ``[]`` for a time-free model's map or no grid."""
    return [] if grid is None else list(grid.dbk.quarters)


def shown_quarter(grid: xr.Dataset | None, wanted: Quarter | None, fallback: Quarter | None) -> Quarter | None:
    """The quarter a map of ``grid`` shows: ``wanted`` if the grid has it, else the grid's last,
    else ``fallback`` (a time-free model's own latest quarter, or ``None``)."""
    quarters = grid_quarters(grid)
    if wanted in quarters:
        return wanted
    return quarters[-1] if quarters else fallback


def at_quarter(values: xr.DataArray, quarter: Quarter | None) -> xr.DataArray:
    """The 2-D ``(y, x)`` map of a grid variable at ``quarter`` (the last one when ``quarter``
    is not in the grid, ``grid.dbk.at``), keeping only the ``x``, ``y`` and ``spatial_ref``
    coordinates; a 2-D variable is returned as it is."""
    lone = values.to_dataset(name=_LONE)
    shown = quarter if quarter in grid_quarters(lone) else None
    at = lone.dbk.at(shown)[_LONE].rename(values.name)
    return at.drop_vars([name for name in at.coords if name not in ("x", "y", "spatial_ref")])


def change_span(grid: xr.Dataset) -> str:
    """``"2022Q4 → 2023Q4"``: the quarters of a grid's change layers (``grid.dbk.change_span``;
    ``"? → ?"`` if the grid does not say)."""
    span = grid.dbk.change_span
    return "? → ?" if span is None else f"{span[0]} → {span[1]}"


def grid_cells_lonlat(grid: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(lonlat, inside)``: ``(m, 2)`` lon/lat degrees of the ``m`` cells inside the region,
    in row-major ``(y, x)`` order, and the ``(ny, nx)`` bool mask of those cells.

    Cell centres in a projected CRS (UTM grids) are converted to degrees; the cells are
    ``grid.dbk.cells_inside()``.
    """
    xx, yy = np.meshgrid(grid["x"].to_numpy(), grid["y"].to_numpy())
    inside = grid.dbk.cells_inside().to_numpy()
    px, py = xx[inside], yy[inside]
    crs = grid.rio.crs
    if crs is not None and not pyproj.CRS.from_user_input(crs).is_geographic:
        px, py = pyproj.Transformer.from_crs(crs, 4326, always_xy=True).transform(px, py)
    return np.column_stack([px, py]), inside


def on_cells(grid: xr.Dataset, inside: np.ndarray, values: np.ndarray, name: str) -> xr.DataArray:
    """A ``(y, x)`` grid variable named ``name``: ``values`` (``(m,)``, one per cell inside the
    region, as from :func:`grid_cells_lonlat`) on the grid's cells, NaN outside."""
    full = np.full(inside.shape, np.nan, dtype=np.float64)
    full[inside] = values
    return grid.dbk.cells_inside().copy(data=full).rename(name)
