"""GeoTIFF and Cloud-Optimized GeoTIFF export of a prediction grid: one band per variable (per quarter),
descriptions from the variable names, nodata outside the region."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import rasterio
import rioxarray  # noqa: F401  (registers the .rio accessor)
import xarray as xr

from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path, write_failure
from geodbk.io.reader import GridReader

#: Nodata value written to GeoTIFFs (float32 bands); cells outside the region get it.
GEOTIFF_NODATA = -9999.0


def geotiff_bands(ds: xr.Dataset, variables: Sequence[str] | None = None) -> xr.DataArray:
    """Stack the map variables of a grid into one ``(band, y, x)`` float32 array.

    ``(y, x)`` variables are one band each, named after the variable. ``kernel_slice`` (dims
    ``ref, y, x``) becomes one band per reference point, ``kernel_slice:<ref>``. Per-quarter
    variables of a multi-quarter grid (dims ``time, y, x``) come first, as one group of bands
    per quarter named ``<variable>:<quarter>`` (``mean:2023Q4``). The band names are in the
    ``long_name`` attribute (a tuple, which rioxarray writes as band descriptions); each
    band's ``name``, ``units`` and ``quarter`` are in ``band_tags`` (a ``(y, x)`` band's quarter
    is its own ``quarter`` attribute, else that of a one-quarter grid).
    """
    if variables is not None:
        names = list(variables)
    else:
        names = [str(v) for v in ds.data_vars if set(ds[v].dims) >= {"y", "x"}]
    missing = [n for n in names if n not in ds.data_vars]
    if missing:
        raise InputDataError(f"grid has no variable(s) {missing}; it has {list(ds.data_vars)}")
    per_quarter = [n for n in names if ds[n].dims == ("time", "y", "x")]
    reader = GridReader(ds)
    mapped = reader.quarters
    entries: list[tuple[str, xr.DataArray, dict[str, str]]] = []
    for quarter in mapped if per_quarter else []:
        layers = reader.at(quarter)
        for name in per_quarter:
            tags = {"units": str(ds[name].attrs.get("units", "")), "quarter": str(quarter)}
            entries.append((f"{name}:{quarter}", layers[name], tags))
    grid_quarter = {} if "time" in ds.dims or not mapped else {"quarter": str(mapped[0])}
    for name in names:
        var = ds[name]
        units = {"units": str(var.attrs.get("units", ""))}
        units.update({"quarter": str(var.attrs["quarter"])} if "quarter" in var.attrs else grid_quarter)
        if var.dims == ("y", "x"):
            entries.append((name, var, units))
        elif var.dims == ("ref", "y", "x"):
            entries += [(f"{name}:{ref}", var.sel(ref=ref, drop=True), units) for ref in var["ref"].values]
        elif name not in per_quarter:
            raise InputDataError(
                f"variable {name} has dims {var.dims}; GeoTIFF bands need (y, x), (ref, y, x) or (time, y, x)"
            )
    keep = ("x", "y", "spatial_ref")
    stack = xr.concat(
        [layer.drop_vars([c for c in layer.coords if c not in keep]) for _, layer, _ in entries],
        dim="band",
        coords="minimal",
        compat="override",
    ).astype(np.float32, copy=False)
    stack = stack.assign_coords(band=np.arange(1, len(entries) + 1))
    stack.attrs = {
        "long_name": tuple(label for label, _, _ in entries),
        "band_tags": [{"name": label, **tags} for label, _, tags in entries],
    }
    return stack


def write_geotiff(
    ds: xr.Dataset,
    path: str | Path,
    *,
    variables: Sequence[str] | None = None,
    cog: bool = False,
    nodata: float = GEOTIFF_NODATA,
    compress: str = "DEFLATE",
    overwrite: bool = False,
) -> Path:
    """Write grid variables as a multi-band float32 GeoTIFF.

    Parameters
    ----------
    ds
        A grid from :func:`geodbk.maps.predict.predict_grid` (or :func:`geodbk.maps.stores.open_grid`),
        with its CRS in ``spatial_ref``.
    path
        Output ``.tif``.
    variables
        Variables to write, in band order (default: all ``(y, x)`` and ``(ref, y, x)`` ones).
    cog
        Write a Cloud-Optimized GeoTIFF (GDAL ``COG`` driver: tiled, with overviews).
    nodata
        Value of cells outside the region (NaN in the grid).
    compress
        GDAL compression.
    overwrite
        Replace a folder standing at ``path`` (a file there is always replaced).

    Returns the path. Band descriptions are the variable names; each band also carries
    ``name`` and ``units`` tags. The file is written atomically (:func:`geodbk.fileio.atomic_path`)
    and checked: GDAL reports some write errors (a full disk among them) only on its stderr, so
    every block of the staged file is read back before it replaces the target, and any failure
    raises OSError (ENOSPC for a full disk, EFBIG at the file size limit) with what GDAL printed.
    """
    if ds.rio.crs is None:
        raise InputDataError("grid has no CRS (spatial_ref); build it with geodbk.maps.predict.predict_grid")
    path = Path(path)
    bands = geotiff_bands(ds, variables)
    bands = bands.where(np.isfinite(bands), nodata)
    # inplace: rioxarray's default is a deep copy of every band
    bands.rio.write_nodata(nodata, inplace=True)
    bands.rio.write_crs(ds.rio.crs, inplace=True)
    bands.rio.write_transform(ds.rio.transform(), inplace=True)
    if cog:
        options = {"driver": "COG", "overview_resampling": "average", "blocksize": 256}
    else:
        options = {"driver": "GTiff", "tiled": True, "blockxsize": 256, "blockysize": 256}
    with atomic_path(path, overwrite=overwrite) as tmp, _gdal_stderr() as printed:
        try:
            bands.rio.to_raster(tmp, recalc_transform=False, compress=compress, **options)
            _read_every_block(tmp)
        except Exception as err:  # GDAL's error classes are many; all mean the file is not good
            raise write_failure(path, err, _text(printed), staged=tmp) from err
        messages = _text(printed)
    for line in messages.splitlines():
        warnings.warn(f"GDAL: {line}", RuntimeWarning, stacklevel=2)
    return path


def _read_every_block(path: Path) -> None:
    """Read each block of each band: a file GDAL failed to write in full raises here."""
    with rasterio.open(path) as src:
        for band in src.indexes:
            for _, window in src.block_windows(band):
                src.read(band, window=window)


@contextmanager
def _gdal_stderr() -> Iterator[BinaryIO]:
    """Collect what C libraries print on file descriptor 2 (GDAL, libtiff) in a temporary file
    instead of the terminal, so that a failure is one line (with the printed cause). Python's own
    ``sys.stderr``, when it writes to descriptor 2, keeps writing to the terminal meanwhile."""
    python_stderr = sys.stderr
    python_stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as printed:
        os.dup2(printed.fileno(), 2)
        if _writes_to_fd2(python_stderr):
            sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
        try:
            yield printed
        finally:
            if sys.stderr is not python_stderr:
                sys.stderr.close()
                sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)


def _writes_to_fd2(stream: object) -> bool:
    try:
        return stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # a captured or in-memory stream
        return False


def _text(printed: BinaryIO) -> str:
    """What was collected so far, stripped."""
    printed.seek(0)
    return printed.read().decode(errors="replace").strip()


__all__ = ["GEOTIFF_NODATA", "geotiff_bands", "write_geotiff"]
