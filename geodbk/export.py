"""Write predictive maps and test-tile predictions to the usual GIS formats.

* :func:`write_geotiff` - a grid from :func:`geodbk.grids.predict_grid` as a float32
  GeoTIFF (or Cloud-Optimized GeoTIFF), one band per variable, band descriptions set from the
  variable names and nodata outside the region.
* :func:`write_netcdf` / :func:`write_zarr` - the whole grid dataset, CRS included; read back
  with :func:`geodbk.grids.open_grid`.
* :func:`tile_predictions` / :func:`write_tile_predictions` - the held-out tiles of a
  :class:`geodbk.dataset.SpatialDataset` with the observed value and a model's predictive
  mean, sd and 95% bounds, in log10 and data units, as GeoJSON or GeoParquet.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import geopandas as gpd
import numpy as np
import rioxarray  # noqa: F401  (registers the .rio accessor)
import xarray as xr

from geodbk.errors import InputDataError
from geodbk.prediction import Z95, to_data_units

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.dataset import SpatialDataset
    from geodbk.geomodel import GeoModel

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
    names = list(variables) if variables is not None else [v for v in ds.data_vars if set(ds[v].dims) >= {"y", "x"}]
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
        A grid from :func:`geodbk.grids.predict_grid` (or :func:`geodbk.grids.open_grid`),
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
    ``name`` and ``units`` tags.
    """
    if ds.rio.crs is None:
        raise InputDataError("grid has no CRS (spatial_ref); build it with geodbk.grids.predict_grid")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bands = geotiff_bands(ds, variables)
    bands = bands.where(np.isfinite(bands), nodata)
    # inplace: rioxarray's default is a deep copy of every band
    bands.rio.write_nodata(nodata, inplace=True)
    bands.rio.write_crs(ds.rio.crs, inplace=True)
    bands.rio.write_transform(ds.rio.transform(), inplace=True)
    options = {"compress": compress}
    if cog:
        bands.rio.to_raster(
            path, driver="COG", overview_resampling="average", blocksize=256, recalc_transform=False, **options
        )
    else:
        bands.rio.to_raster(
            path, driver="GTiff", tiled=True, blockxsize=256, blockysize=256, recalc_transform=False, **options
        )
    return path


def write_netcdf(ds: xr.Dataset, path: str | Path) -> Path:
    """Write the whole grid dataset to NetCDF-4 (zlib-compressed float32, CRS in ``spatial_ref``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encoding = {}
    for name in ds.data_vars:
        enc = {k: v for k, v in ds[name].encoding.items() if k == "grid_mapping"}
        if np.issubdtype(ds[name].dtype, np.floating):
            enc.update(zlib=True, complevel=4, _FillValue=np.float32(np.nan))
        encoding[name] = enc
    ds.to_netcdf(path, mode="w", engine="netcdf4", encoding=encoding)
    return path


def write_zarr(ds: xr.Dataset, path: str | Path) -> Path:
    """Write the whole grid dataset to a Zarr store (a folder), replacing one that is there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = ds.copy()
    for name in clean.variables:
        grid_mapping = clean[name].encoding.get("grid_mapping")
        clean[name].encoding = {"grid_mapping": grid_mapping} if grid_mapping else {}
    clean.to_zarr(path, mode="w", consolidated=False)
    return path


def tile_predictions(model: "GeoModel", dataset: "SpatialDataset", *, split: str = "test") -> gpd.GeoDataFrame:
    """The tiles of one split of ``dataset`` with ``model``'s predictions, one row per (tile, quarter).

    Each row is predicted at its own quarter, as a new measurement with its own number of
    tests (:meth:`geodbk.geomodel.GeoModel.predict_tiles`), the distribution its observed
    value is scored against.

    Columns: ``quadkey, year, quarter, tests, urban_rural, lon, lat`` (tile centre, degrees),
    the observation ``y`` (log10) and ``observed_<u>`` (data units, e.g. ``observed_mbps``),
    the prediction ``mean, sd, lower, upper, pi_width`` (log10) and ``mean_<u>, lower_<u>,
    upper_<u>`` (10 ** the log10 value), ``inside_pi`` (observation inside the 95% interval),
    and ``geometry`` (tile polygon, EPSG:4326).
    """
    frame = dataset.frame
    if "split" not in frame.columns:
        raise InputDataError("dataset frame has no 'split' column")
    tiles = frame[frame["split"] == split]
    if len(tiles) == 0:
        raise InputDataError(f"dataset has no tiles in split {split!r}")
    pred = model.predict_tiles(tiles).measurement()
    mean = np.asarray(pred.mean, dtype=np.float64)
    sd = np.asarray(pred.sd, dtype=np.float64)
    key = str(getattr(dataset, "units", "Mbps")).lower()
    y = tiles["y"].to_numpy(np.float64)
    lower, upper = mean - Z95 * sd, mean + Z95 * sd
    keep = [c for c in ("quadkey", "year", "quarter", "tests", "urban_rural", "lon", "lat") if c in tiles.columns]
    out = tiles[keep].copy()
    out["y"] = y
    out[f"observed_{key}"] = tiles["value"].to_numpy(np.float64)
    out["mean"] = mean
    out["sd"] = sd
    out["lower"] = lower
    out["upper"] = upper
    out["pi_width"] = upper - lower
    out[f"mean_{key}"], out[f"lower_{key}"], out[f"upper_{key}"] = to_data_units(mean, sd)
    out["inside_pi"] = (y >= lower) & (y <= upper)
    return gpd.GeoDataFrame(out.reset_index(drop=True), geometry=tiles.geometry.to_numpy(), crs=tiles.crs or "EPSG:4326")


def write_tile_predictions(
    model: "GeoModel", dataset: "SpatialDataset", path: str | Path, *, split: str = "test"
) -> Path:
    """Write :func:`tile_predictions` to ``*.geojson`` (GeoJSON) or ``*.parquet`` (GeoParquet)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".geojson", ".json", ".parquet", ".geoparquet"):
        raise InputDataError(f"test tiles go to .geojson or .parquet, got {path.name}")
    frame = tile_predictions(model, dataset, split=split)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix in (".geojson", ".json"):
        frame.to_file(path, driver="GeoJSON", engine="pyogrio")
    else:
        frame.to_parquet(path)
    return path


__all__ = [
    "GEOTIFF_NODATA",
    "geotiff_bands",
    "tile_predictions",
    "write_geotiff",
    "write_netcdf",
    "write_tile_predictions",
    "write_zarr",
]
