"""The whole grid dataset as NetCDF-4 or Zarr, CRS included; read back with :func:`geodbk.maps.stores.open_grid`.

Both writers are atomic (:mod:`geodbk.fileio`): the output is written to a hidden temporary
beside the target and renamed into place when complete, so a failure leaves an older file or
store at the target as it was. A NetCDF file replaces a file, a Zarr store an empty folder or a
store geodbk wrote; anything else only with ``overwrite`` (:func:`geodbk.fileio.check_output`).
A failed write raises OSError, ENOSPC for a full disk and EFBIG at the file size limit (which
netCDF reports as "HDF error"), and removes its temporary.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from geodbk.fileio import ZARR_STORE, atomic_dir, atomic_path, write_failure
from geodbk.maps.stores import grid_encoding


def write_netcdf(ds: xr.Dataset, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the whole grid dataset to NetCDF-4 (:func:`geodbk.maps.stores.grid_encoding`:
    zlib-compressed, NaN-filled, CRS in ``spatial_ref``)."""
    path = Path(path)
    with atomic_path(path, overwrite=overwrite) as tmp:
        try:
            ds.to_netcdf(tmp, mode="w", engine="netcdf4", encoding=grid_encoding(ds))
        except Exception as err:  # netCDF4 raises RuntimeError or OSError, often with a wrong errno
            raise write_failure(path, err, staged=tmp) from err
    return path


def write_zarr(ds: xr.Dataset, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the whole grid dataset to a Zarr store (a folder), replacing a store geodbk wrote there."""
    path = Path(path)
    clean = ds.copy()
    for name in clean.variables:
        grid_mapping = clean[name].encoding.get("grid_mapping")
        clean[name].encoding = {"grid_mapping": grid_mapping} if grid_mapping else {}
    with atomic_dir(path, kind=ZARR_STORE, overwrite=overwrite) as tmp:
        clean.to_zarr(tmp, mode="w", consolidated=False)
    return path


__all__ = ["write_netcdf", "write_zarr"]
