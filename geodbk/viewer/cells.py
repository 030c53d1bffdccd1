"""Cells and quarters of a saved grid.

A grid comes in one of two layouts (see :mod:`geodbk.maps.schema`): per-quarter variables with
dims ``(time, y, x)`` and a ``quarter`` label coordinate (the default of ``geodbk demo``),
or 2-D ``(y, x)`` variables with the mapped quarter in the ``quarter`` attribute (``geodbk
demo --quarter``, or a time-free model without it). Cells outside the region are NaN.
"""

from __future__ import annotations

import numpy as np
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor that gives a grid's CRS)
import xarray as xr


def grid_quarters(grid: xr.Dataset | None) -> list[str]:
    """Quarter labels of a grid: its ``quarter`` coordinate along ``time``, else the mapped
    quarter of a 2-D grid, else ``[]`` (a time-free model)."""
    if grid is None:
        return []
    if "time" in grid.dims and "quarter" in grid.coords:
        return [str(q) for q in grid["quarter"].to_numpy()]
    quarter = grid.attrs.get("quarter")
    return [str(quarter)] if quarter else []


def shown_quarter(grid: xr.Dataset | None, wanted: str | None, fallback: str | None) -> str | None:
    """The quarter a map of ``grid`` shows: ``wanted`` if the grid has it, else the grid's last,
    else ``fallback`` (a time-free model's own latest quarter, or ``None``)."""
    quarters = grid_quarters(grid)
    if wanted in quarters:
        return wanted
    return quarters[-1] if quarters else fallback


def at_quarter(values: xr.DataArray, quarter: str | None) -> xr.DataArray:
    """The 2-D ``(y, x)`` map of a grid variable at ``quarter`` (the last one when ``quarter``
    is not in the grid), without the time coordinates; a 2-D variable is returned as it is."""
    if "time" in values.dims:
        labels = [str(q) for q in values["quarter"].to_numpy()] if "quarter" in values.coords else []
        values = values.isel(time=labels.index(quarter) if quarter in labels else -1)
    extra = [name for name in values.coords if name not in ("x", "y", "spatial_ref")]
    return values.drop_vars(extra)


def change_span(grid: xr.Dataset) -> str:
    """``"2022Q4 → 2023Q4"``: the quarters of a grid's change layers (``"? → ?"`` if unknown)."""
    attrs = grid["change"].attrs if "change" in grid else {}
    start = attrs.get("quarter_from") or str(grid.attrs.get("change", "?:?")).split(":")[0]
    end = attrs.get("quarter_to") or str(grid.attrs.get("change", "?:?")).split(":")[-1]
    return f"{start} → {end}"


def grid_cells_lonlat(grid: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(lonlat, inside)``: ``(m, 2)`` lon/lat degrees of the ``m`` cells inside the region,
    in row-major ``(y, x)`` order, and the ``(ny, nx)`` bool mask of those cells.

    Cell centres in a projected CRS (UTM grids) are converted to degrees. The region mask is
    the same in every quarter, so the last quarter's ``mean`` is used.
    """
    xx, yy = np.meshgrid(grid["x"].to_numpy(), grid["y"].to_numpy())
    inside = np.isfinite(at_quarter(grid["mean"], None).to_numpy())
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
    return at_quarter(grid["mean"], None).copy(data=full).rename(name)
