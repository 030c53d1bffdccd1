"""Where block prediction writes its rows: memory, a Zarr store or a NetCDF file, and how a grid is opened again.

Grids are streamed block by block (:func:`geodbk.maps.predict.predict_grid`), so the
streaming writers live with the gridding engine; :mod:`geodbk.io` holds the writers of a
finished dataset (GeoTIFF/COG, NetCDF, Zarr) and the vector formats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Protocol

import numpy as np
import xarray as xr

from geodbk.errors import InputDataError


class BlockSink(Protocol):
    """Receives row blocks of a grid and hands back the finished dataset."""

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None: ...

    def close(self) -> None: ...

    def finish(self) -> xr.Dataset: ...


def _rows_index(ndim: int, rows: slice) -> tuple[slice, ...]:
    """Index of a row block in an array whose last two dims are (y, x)."""
    return (slice(None),) * (ndim - 2) + (rows, slice(None))


class MemorySink:
    def __init__(self, template: xr.Dataset) -> None:
        self.ds = template

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        for name, values in block.items():
            self.ds[name].values[_rows_index(values.ndim, rows)] = values

    def close(self) -> None:
        """Nothing to release."""

    def finish(self) -> xr.Dataset:
        return self.ds


class ZarrSink:
    def __init__(self, template: xr.Dataset, path: Path) -> None:
        self.path = path
        self.dims = {name: template[name].dims for name in template.data_vars}
        encoding = {
            name: {**template[name].encoding, "chunks": template[name].data.chunksize} for name in template.data_vars
        }
        template.to_zarr(path, mode="w", compute=False, encoding=encoding, consolidated=False)

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        data_vars = {name: (self.dims[name], values) for name, values in block.items()}
        xr.Dataset(data_vars).to_zarr(self.path, region={"y": rows}, mode="r+", consolidated=False)

    def close(self) -> None:
        """Nothing to release: every block is written when it arrives."""

    def finish(self) -> xr.Dataset:
        return open_grid(self.path)


class NetCDFSink:
    def __init__(self, template: xr.Dataset, path: Path) -> None:
        import netCDF4

        self.path = path
        encoding = {
            name: {**template[name].encoding, "zlib": True, "complevel": 4, "chunksizes": template[name].data.chunksize, "_FillValue": np.float32(np.nan)}
            for name in template.data_vars
        }
        template.to_netcdf(path, mode="w", compute=False, encoding=encoding, engine="netcdf4")
        self.nc = netCDF4.Dataset(path, "a")
        self.nc.set_auto_mask(False)

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        for name, values in block.items():
            self.nc[name][_rows_index(values.ndim, rows)] = values

    def close(self) -> None:
        if self.nc.isopen():
            self.nc.close()

    def finish(self) -> xr.Dataset:
        self.close()
        return open_grid(self.path)

def open_grid(path: str | Path) -> xr.Dataset:
    """Open a grid written by :func:`geodbk.maps.predict.predict_grid` or :mod:`geodbk.io.cubes` (NetCDF or Zarr), lazily."""
    path = Path(path)
    if not path.exists():
        raise InputDataError(f"no grid at {path}")
    try:
        if path.suffix == ".zarr" or path.is_dir():
            ds = xr.open_zarr(path, decode_coords="all", consolidated=False)
        else:
            ds = xr.open_dataset(path, decode_coords="all")
    except (OSError, ValueError) as err:
        raise InputDataError(f"cannot open grid {path}: {err}") from None
    return ds


__all__ = ["BlockSink", "MemorySink", "NetCDFSink", "ZarrSink", "open_grid"]
