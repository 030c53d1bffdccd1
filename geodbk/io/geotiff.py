"""GeoTIFF and Cloud-Optimized GeoTIFF export of a prediction grid: one band per variable (per quarter),
descriptions from the variable names, nodata outside the region."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import rioxarray  # noqa: F401  (registers the .rio accessor)
import xarray as xr

from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path

#: Nodata value written to GeoTIFFs (float32 bands); cells outside the region get it.
GEOTIFF_NODATA = -9999.0


def geotiff_bands(ds: xr.Dataset, variables: Sequence[str] | None = None) -> xr.DataArray:
    """Stack the map variables of a grid into one ``(band, y, x)`` float32 array.

    ``(y, x)`` variables are one band each, named after the variable. ``kernel_slice`` (dims
    ``ref, y, x``) becomes one band per reference point, ``kernel_slice:<ref>``. Per-quarter
    variables of a multi-quarter grid (dims ``time, y, x``) come first, as one group of bands
    per quarter named ``<variable>:<quarter>`` (``mean:2023Q4``). The band names are in the
    ``long_name`` attribute (a tuple, which rioxarray writes as band descriptions); each
    band's ``name``, ``units`` and ``quarter`` are in ``band_tags``.
    """
    if variables is not None:
        names = list(variables)
    else:
        names = [str(v) for v in ds.data_vars if set(ds[v].dims) >= {"y", "x"}]
    missing = [n for n in names if n not in ds.data_vars]
    if missing:
        raise InputDataError(f"grid has no variable(s) {missing}; it has {list(ds.data_vars)}")
    per_quarter = [n for n in names if ds[n].dims == ("time", "y", "x")]
    entries: list[tuple[str, xr.DataArray, dict[str, str]]] = []
    for index in range(ds.sizes.get("time", 0) if per_quarter else 0):
        quarter = str(ds["quarter"].values[index]) if "quarter" in ds.coords else str(index)
        for name in per_quarter:
            tags = {"units": str(ds[name].attrs.get("units", "")), "quarter": quarter}
            entries.append((f"{name}:{quarter}", ds[name].isel(time=index, drop=True), tags))
    for name in names:
        var = ds[name]
        units = {"units": str(var.attrs.get("units", ""))}
        if "quarter" in var.attrs:
            units["quarter"] = str(var.attrs["quarter"])
        elif "quarter" in ds.attrs:
            units["quarter"] = str(ds.attrs["quarter"])
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

    Returns the path. Band descriptions are the variable names; each band also carries
    ``name`` and ``units`` tags. The file is written atomically (:func:`geodbk.fileio.atomic_path`).
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
    options = {"compress": compress}
    with atomic_path(path) as tmp:
        if cog:
            bands.rio.to_raster(
                tmp, driver="COG", overview_resampling="average", blocksize=256, recalc_transform=False, **options
            )
        else:
            bands.rio.to_raster(
                tmp, driver="GTiff", tiled=True, blockxsize=256, blockysize=256, recalc_transform=False, **options
            )
    return path


__all__ = ["GEOTIFF_NODATA", "geotiff_bands", "write_geotiff"]
