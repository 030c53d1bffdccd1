"""Where block prediction writes its rows: memory, a Zarr store or a NetCDF file, and how a grid is opened again.

Grids are streamed block by block (:func:`geodbk.maps.predict.predict_grid`), so the
streaming writers live with the gridding engine; :mod:`geodbk.io` holds the writers of a
finished dataset (GeoTIFF/COG, NetCDF, Zarr) and the vector formats.

The file sinks stream into a hidden temporary beside the target
(:class:`geodbk.fileio.StagedPath`) and rename it into place in :meth:`BlockSink.finish`;
:meth:`BlockSink.abort` removes it, so a failed or interrupted prediction never leaves a
partial grid at the target, and an older grid there stays as it was. What may stand at the
target is :func:`geodbk.fileio.check_output`'s rule (a file for a NetCDF file; an empty folder
or a Zarr store geodbk wrote for a Zarr store), unless ``overwrite``.

:class:`ZarrRegions` is the part of :class:`ZarrSink` that writes blocks: it holds no open
file, so Dask workers can each write their own blocks into the staged store
(:mod:`geodbk.maps.parallel`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xarray as xr

from geodbk.errors import InputDataError
from geodbk.fileio import ZARR_STORE, StagedPath, write_failure

#: Zarr v3 data types of the arrays a grid holds: numbers, booleans, times and text.
_ZARR3_GRID_TYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
    "complex64", "complex128", "numpy.datetime64", "numpy.timedelta64", "string", "fixed_length_utf32",
    "null_terminated_bytes",
})
#: Zarr v2 object codecs of text: the one kind of object array a grid holds.
_ZARR2_TEXT_CODECS = frozenset({"vlen-utf8", "vlen-bytes"})
#: Largest array metadata file read (a grid's are a few hundred bytes).
_MAX_ZARR_METADATA_BYTES = 1 << 20


def grid_encoding(ds: xr.Dataset) -> dict[str, dict[str, Any]]:
    """The NetCDF-4 encoding of every data variable of a grid, for the streaming
    :class:`NetCDFSink` and :func:`geodbk.io.cubes.write_netcdf` alike: the variable's
    ``grid_mapping`` (its link to the CRS in ``spatial_ref``); for floating variables zlib
    compression at level 4 with NaN as the float32 fill value; for a dask-backed variable, file
    chunks the size of its dask chunks (the blocks a streamed grid is written in).
    """
    encoding: dict[str, dict[str, Any]] = {}
    for name, var in ds.data_vars.items():
        enc = {key: value for key, value in var.encoding.items() if key == "grid_mapping"}
        if np.issubdtype(var.dtype, np.floating):
            enc.update(zlib=True, complevel=4, _FillValue=np.float32(np.nan))
        if var.chunks is not None:
            enc["chunksizes"] = var.data.chunksize
        encoding[str(name)] = enc
    return encoding


class BlockSink(Protocol):
    """Receives row blocks of a grid and hands back the finished dataset.

    ``write`` gets the float32 values of grid rows ``rows`` per variable, each shaped
    ``(..., n_rows, width)``; ``finish`` completes the output and returns it; ``abort``
    (after a failure) drops whatever was written.
    """

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None: ...

    def abort(self) -> None: ...

    def finish(self) -> xr.Dataset: ...


def _rows_index(ndim: int, rows: slice) -> tuple[slice, ...]:
    """Index of a row block in an array whose last two dims are (y, x)."""
    return (slice(None),) * (ndim - 2) + (rows, slice(None))


class MemorySink:
    """Fills the preallocated arrays of an in-memory template."""

    def __init__(self, template: xr.Dataset) -> None:
        self.ds = template

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        for name, values in block.items():
            self.ds[name].values[_rows_index(values.ndim, rows)] = values

    def abort(self) -> None:
        """Nothing to release or remove."""

    def finish(self) -> xr.Dataset:
        return self.ds


@dataclass(frozen=True)
class ZarrRegions:
    """Writes row blocks into the regions of an existing Zarr store, each block a whole number of chunks.

    A block must start and end on a Zarr chunk boundary along ``y`` (a multiple of
    ``chunk_rows``, or the last row): every chunk file then belongs to exactly one block,
    and a region write touches no metadata, so writers in several processes never write
    the same file. Picklable (it holds no open file).

    Attributes:
        path: the store, absolute (workers may run in other folders).
        dims: ``{variable: dims}``, the last two ``(y, x)``.
        chunk_rows: grid rows per Zarr chunk.
        height: grid rows.
    """

    path: Path
    dims: Mapping[str, tuple[str, ...]]
    chunk_rows: int
    height: int

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        """Store the float32 ``(..., n_rows, width)`` values of grid rows ``rows``."""
        if rows.start % self.chunk_rows or (rows.stop % self.chunk_rows and rows.stop != self.height):
            raise ValueError(f"rows {rows.start}:{rows.stop} are not whole Zarr chunks of {self.chunk_rows} rows")
        data_vars = {name: (self.dims[name], values) for name, values in block.items()}
        xr.Dataset(data_vars).to_zarr(self.path, region={"y": rows}, mode="r+", consolidated=False)


class ZarrSink:
    """Streams row blocks into a Zarr store (a folder) staged beside ``path``, swapped in by :meth:`finish`.

    Zarr chunks are the template's dask chunks: ``chunk_rows`` rows by the full width and
    the whole of any leading dimension, so a row block of ``chunk_rows`` rows is whole chunks.
    """

    def __init__(self, template: xr.Dataset, path: Path, *, overwrite: bool = False) -> None:
        self.staged = StagedPath.beside(path, kind=ZARR_STORE, overwrite=overwrite)
        encoding = {
            name: {**template[name].encoding, "chunks": template[name].data.chunksize} for name in template.data_vars
        }
        self.regions = ZarrRegions(
            self.staged.tmp.absolute(),
            {str(name): tuple(map(str, template[name].dims)) for name in template.data_vars},
            max(template.chunks["y"]),
            template.sizes["y"],
        )
        try:
            template.to_zarr(self.staged.tmp, mode="w", compute=False, encoding=encoding, consolidated=False)
        except BaseException:
            self.abort()
            raise

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        self.regions.write(rows, block)

    def abort(self) -> None:
        """Remove the staged store."""
        self.staged.discard()

    def finish(self) -> xr.Dataset:
        """Swap the complete store in for the target and open it lazily."""
        return open_grid(self.staged.commit())


class NetCDFSink:
    """Streams row blocks into a NetCDF-4 file staged beside ``path``, renamed into place by :meth:`finish`.

    The template's variables, attributes and coordinates are written first (its dask-backed data
    variables are only declared) and that file is closed before the blocks go in through one
    netCDF4 handle, so no other handle to the file is left for the garbage collector to close.
    A failed netCDF call raises OSError naming ``path`` (ENOSPC for a full disk, EFBIG at the
    file size limit, :func:`geodbk.fileio.write_failure`); the staged file is then removed.
    """

    def __init__(self, template: xr.Dataset, path: Path, *, overwrite: bool = False) -> None:
        import netCDF4
        from xarray.backends import NetCDF4DataStore

        self.staged = StagedPath.beside(path, overwrite=overwrite)
        self.nc: netCDF4.Dataset | None = None
        try:
            store = NetCDF4DataStore.open(self.staged.tmp, mode="w")
            try:
                template.dump_to_store(store, encoding=grid_encoding(template))
            finally:
                store.close()
            self.nc = netCDF4.Dataset(self.staged.tmp, "a")
            self.nc.set_auto_mask(False)
        except Exception as err:
            failure = self._failure(err)  # before the staged file is gone
            self.abort()
            raise failure from err
        except BaseException:
            self.abort()
            raise

    def _failure(self, err: Exception) -> Exception:
        return write_failure(self.staged.target, err, staged=self.staged.tmp)

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        assert self.nc is not None, "write after finish or abort"
        try:
            for name, values in block.items():
                self.nc[name][_rows_index(values.ndim, rows)] = values
        except Exception as err:
            raise self._failure(err) from err

    def _close(self) -> None:
        """Close the file once: a close that failed (a full disk) is not tried again."""
        nc, self.nc = self.nc, None
        if nc is not None and nc.isopen():
            nc.close()

    def abort(self) -> None:
        """Close and remove the staged file; an error closing it (the disk that failed the write
        fails the close too) gives way to the failure that led here."""
        try:
            with suppress(Exception):
                self._close()
        finally:
            self.staged.discard()

    def finish(self) -> xr.Dataset:
        """Close the file, rename it onto the target and open it lazily."""
        try:
            self._close()
        except Exception as err:
            raise self._failure(err) from err
        return open_grid(self.staged.commit())


def _zarr_type_problem(meta: dict[str, Any], *, v3: bool) -> str | None:
    """How a Zarr array's metadata (a v3 ``zarr.json`` or v2 ``.zarray``) names a data type that
    a grid does not hold, or None for numbers, booleans, times and text (its ``quarter`` and
    ``ref`` labels)."""
    if v3:
        dtype = meta.get("data_type")
        name = dtype.get("name") if isinstance(dtype, dict) else dtype
        return None if name in _ZARR3_GRID_TYPES else repr(name)
    dtype = meta.get("dtype")
    try:
        kind = np.dtype(dtype).kind
    except (TypeError, ValueError, OverflowError):
        return repr(dtype)
    if kind == "O":  # objects are text through a text codec, never e.g. a pickle
        filters = meta.get("filters")
        first = filters[0] if isinstance(filters, list) and filters else None
        codec = first.get("id") if isinstance(first, dict) else None
        return None if codec in _ZARR2_TEXT_CODECS else f"{dtype!r} (objects, codec {codec})"
    return None if kind in "biufcmMUS" else repr(dtype)


def _check_zarr_types(path: Path) -> None:
    """Refuse a Zarr store with an array that is not numbers, times or text, from the metadata
    of its arrays, before zarr opens it (zarr refuses an object array too, but its pending
    asyncio tasks then print tracebacks at exit).

    Raises:
        InputDataError: such an array, or array metadata that is not a JSON object of at most
            :data:`_MAX_ZARR_METADATA_BYTES`.
    """
    for meta_path in sorted([*path.glob("*/.zarray"), *path.glob("*/zarr.json")]):
        name = meta_path.parent.name
        try:
            small = meta_path.stat().st_size <= _MAX_ZARR_METADATA_BYTES
            meta = json.loads(meta_path.read_bytes()) if small else None
        except OSError as err:
            raise InputDataError(f"cannot read grid {path}: variable {name}: {err.strerror or err}") from None
        except (ValueError, RecursionError):
            meta = None
        if not isinstance(meta, dict):
            raise InputDataError(f"grid {path}: the {meta_path.name} of variable {name} is not Zarr metadata")
        v3 = meta_path.name == "zarr.json"
        problem = None if v3 and meta.get("node_type") != "array" else _zarr_type_problem(meta, v3=v3)
        if problem is not None:
            raise InputDataError(f"grid {path}: variable {name} is of type {problem}, not numbers, times or text")


def open_grid(path: str | Path) -> xr.Dataset:
    """Open a grid written by :func:`geodbk.maps.predict.predict_grid` or :mod:`geodbk.io.cubes`
    (NetCDF or Zarr), lazily.

    Raises:
        InputDataError: no grid at ``path``, an unreadable one, or a Zarr store with a variable
            that is not numbers, times or text.
    """
    path = Path(path)
    if not path.exists():
        raise InputDataError(f"no grid at {path}")
    zarr = path.suffix == ".zarr" or path.is_dir()
    if zarr:
        _check_zarr_types(path)
    try:
        if zarr:
            ds = xr.open_zarr(path, decode_coords="all", consolidated=False)
        else:
            ds = xr.open_dataset(path, decode_coords="all")
    except (OSError, ValueError) as err:
        raise InputDataError(f"cannot open grid {path}: {err}") from None
    except KeyError as err:  # xarray's Zarr backend: an array that does not name its dimensions
        why = f"it is not a store xarray wrote (no {err} in its metadata)"
        raise InputDataError(f"cannot open grid {path}: {why}") from None
    return ds


__all__ = ["BlockSink", "MemorySink", "NetCDFSink", "ZarrRegions", "ZarrSink", "grid_encoding", "open_grid"]
