"""Regular grids over a region and chunked prediction into an :class:`xarray.Dataset`.

A :class:`RegularGrid` is a north-up raster (cell centres on ``x``/``y``, ``y`` descending)
in any CRS, EPSG:4326 by default. :func:`predict_grid` walks it in row blocks, converts the
cell centres to lon/lat, asks a fitted model (anything that satisfies
:class:`SpatialPredictor`, e.g. :class:`geodbk.geomodel.GeoModel`) for the variables that
:class:`geodbk.layers.GridLayers` lists (tile-mean predictive mean, sd, 95% bounds and the
probability of being below a speed benchmark, per quarter; optionally the change between two
quarters and kernel slices) at the cells inside the region polygon only (and, with
``max_distance``, within that many metres of a training tile), and writes the block into
preallocated float32 arrays or straight into a Zarr / NetCDF store, so peak memory depends
on the block size and the number of quarters, not on the grid size.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, Sequence, Union

import numpy as np
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor)
import shapely
import xarray as xr
from affine import Affine
from shapely.geometry.base import BaseGeometry
from tqdm.auto import tqdm

from geodbk.errors import ExtrapolationWarning, InputDataError, RegionError
from geodbk.layers import GridLayers, model_meta
from geodbk.thresholds import DEFAULT

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.dataset import SpatialDataset
    from geodbk.regions import Region


#: Cells predicted per block when ``chunk_rows`` is not given.
DEFAULT_CELLS_PER_CHUNK = 1 << 18

WGS84 = pyproj.CRS.from_epsg(4326)

Bbox = tuple[float, float, float, float]
RegionLike = Union["Region", Bbox, BaseGeometry]


class SpatialPredictor(Protocol):
    """What grid prediction needs from a fitted model (:class:`geodbk.geomodel.GeoModel` is one).

    ``predict`` takes ``(n, 2)`` lon/lat in degrees and a quarter (``"2023Q4"``, or None for
    the model's default) and returns an object with ``mean`` and ``sd`` arrays of shape
    ``(n,)`` in target units (log10 of Mbps or ms); ``predict_series`` returns one such
    object per quarter of a sequence (what grids call). ``kernel_slice`` returns the ``(n, k)``
    prior kernel between the points and ``k`` reference points, in target units squared;
    it is only called when ``has_kernel`` is true, as is ``predict_change`` (a
    :class:`~geodbk.prediction.ChangePrediction`, for change layers only). ``distance_to_data`` gives metres to the
    nearest training tile (needed for ``max_distance`` only).
    """

    has_kernel: bool

    def predict(self, lonlat: np.ndarray, time: str | None = None) -> Any: ...

    def predict_series(self, lonlat: np.ndarray, times: Sequence[str | None]) -> list[Any]: ...

    def predict_change(self, lonlat: np.ndarray, time_from: str, time_to: str) -> Any: ...

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: str | None = None) -> np.ndarray: ...

    def distance_to_data(self, lonlat: np.ndarray) -> np.ndarray: ...


# --- resolution and CRS ---------------------------------------------------------------
_RESOLUTION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(m|km|deg|°)?\s*$")


def parse_resolution(resolution: float | str) -> tuple[float, str | None]:
    """Split a resolution into ``(value, unit)``.

    ``0.01`` or ``"0.01"`` -> ``(0.01, None)`` (units of the grid CRS); ``"0.01deg"`` ->
    ``(0.01, "deg")``; ``"500m"`` -> ``(500.0, "m")``; ``"2km"`` -> ``(2000.0, "m")``.
    """
    if isinstance(resolution, (int, float)) and not isinstance(resolution, bool):
        value, unit = float(resolution), None
    else:
        match = _RESOLUTION.match(str(resolution))
        if match is None:
            raise InputDataError(
                f"cannot read resolution {resolution!r}: give a number in the grid CRS units, "
                "or a number with a unit such as '0.01deg', '500m' or '2km'"
            )
        value, unit = float(match.group(1)), match.group(2)
        if unit == "km":
            value, unit = value * 1000.0, "m"
        elif unit == "°":
            unit = "deg"
    if not math.isfinite(value) or value <= 0:
        raise InputDataError(f"resolution must be positive, got {resolution!r}")
    return value, unit


def utm_crs_for(geometry: BaseGeometry) -> pyproj.CRS:
    """The WGS 84 UTM zone CRS that contains the centre of a lon/lat geometry."""
    west, south, east, north = geometry.bounds
    infos = pyproj.database.query_utm_crs_info(
        datum_name="WGS 84",
        area_of_interest=pyproj.aoi.AreaOfInterest(west, south, east, north),
    )
    if not infos:
        raise RegionError(f"no UTM zone covers the bounds {geometry.bounds}")
    lon0, lat0 = (west + east) / 2.0, (south + north) / 2.0
    zone = int((lon0 + 180.0) // 6.0) + 1
    code = (32600 if lat0 >= 0 else 32700) + zone
    for info in infos:
        if int(info.code) == code:
            return pyproj.CRS.from_epsg(code)
    return pyproj.CRS.from_epsg(int(infos[0].code))


def _region_geometry(region: RegionLike) -> tuple[BaseGeometry, str]:
    """A lon/lat shapely geometry and a name for a Region, bbox tuple or geometry."""
    if isinstance(region, BaseGeometry):
        return region, "geometry"
    if isinstance(region, (tuple, list, np.ndarray)):
        if len(region) != 4:
            raise RegionError(f"a bbox is (west, south, east, north), got {region!r}")
        west, south, east, north = (float(v) for v in region)
        if not (west < east and south < north):
            raise RegionError(f"bbox must have west < east and south < north, got {region!r}")
        return shapely.box(west, south, east, north), f"bbox({west}, {south}, {east}, {north})"
    geometry = getattr(region, "geometry", None)
    if not isinstance(geometry, BaseGeometry):
        raise RegionError(f"expected a Region, a (west, south, east, north) bbox or a geometry, got {type(region).__name__}")
    return geometry, str(getattr(region, "name", "region"))


# --- the grid ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RegularGrid:
    """A north-up raster: ``height`` x ``width`` square cells of side ``resolution`` in ``crs``.

    ``transform`` maps (col, row) of cell corners to CRS coordinates (rasterio convention).
    ``geometry`` is the region polygon in lon/lat (EPSG:4326); cells whose centre is outside
    it are masked. Build one with :meth:`over`.
    """

    crs: pyproj.CRS
    transform: Affine
    width: int
    height: int
    geometry: BaseGeometry
    region_name: str = "region"

    @classmethod
    def over(
        cls,
        region: RegionLike,
        resolution: float | str,
        *,
        crs: str | int | pyproj.CRS | None = None,
    ) -> "RegularGrid":
        """Cover ``region`` with square cells of ``resolution``.

        Parameters
        ----------
        region
            A :class:`geodbk.regions.Region`, a lon/lat ``(west, south, east, north)`` bbox, or a
            shapely geometry in EPSG:4326.
        resolution
            Cell side. A bare number is in the units of ``crs`` (degrees for EPSG:4326);
            ``"500m"`` / ``"2km"`` ask for metres, ``"0.01deg"`` for degrees.
        crs
            CRS the grid is defined in. Default: EPSG:4326, or the region's UTM zone when
            the resolution is in metres.

        The grid edges are snapped to multiples of the resolution, so grids of the same
        resolution over different regions line up.
        """
        geometry, name = _region_geometry(region)
        value, unit = parse_resolution(resolution)
        if crs is None:
            grid_crs = utm_crs_for(geometry) if unit == "m" else WGS84
        else:
            try:
                grid_crs = pyproj.CRS.from_user_input(crs)
            except pyproj.exceptions.CRSError as err:
                raise InputDataError(f"unknown CRS {crs!r}: {err}") from None
        if unit == "m" and grid_crs.is_geographic:
            raise InputDataError(
                f"resolution {resolution!r} is in metres but {grid_crs.name} is geographic; "
                "give a projected CRS or leave crs unset to use the region's UTM zone"
            )
        if unit == "deg" and not grid_crs.is_geographic:
            raise InputDataError(
                f"resolution {resolution!r} is in degrees but {grid_crs.name} is projected; "
                "give the resolution in metres (e.g. '500m')"
            )
        to_grid = pyproj.Transformer.from_crs(WGS84, grid_crs, always_xy=True)
        west, south, east, north = to_grid.transform_bounds(*geometry.bounds, densify_pts=21)
        west = math.floor(round(west / value, 9)) * value
        north = math.ceil(round(north / value, 9)) * value
        width = max(1, math.ceil(round((east - west) / value, 9)))
        height = max(1, math.ceil(round((north - south) / value, 9)))
        transform = Affine(value, 0.0, west, 0.0, -value, north)
        return cls(grid_crs, transform, int(width), int(height), geometry, name)

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)``, i.e. ``(len(y), len(x))``."""
        return self.height, self.width

    @property
    def resolution(self) -> float:
        """Cell side in CRS units."""
        return float(self.transform.a)

    @property
    def x(self) -> np.ndarray:
        """``(width,)`` cell-centre x coordinates, increasing."""
        return self.transform.c + (np.arange(self.width) + 0.5) * self.transform.a

    @property
    def y(self) -> np.ndarray:
        """``(height,)`` cell-centre y coordinates, decreasing (north-up)."""
        return self.transform.f + (np.arange(self.height) + 0.5) * self.transform.e

    def _grid_geometry(self) -> BaseGeometry:
        if self.crs.equals(WGS84):
            geometry = self.geometry
        else:
            to_grid = pyproj.Transformer.from_crs(WGS84, self.crs, always_xy=True)
            west, south, east, north = self.geometry.bounds
            # densify first so that long straight edges (a bbox) bend with the projection
            dense = shapely.segmentize(self.geometry, max(east - west, north - south) / 256.0)
            geometry = shapely.transform(dense, to_grid.transform, interleaved=False)
        shapely.prepare(geometry)
        return geometry

    def blocks(self, chunk_rows: int) -> Iterator[slice]:
        """Row slices of at most ``chunk_rows`` rows that cover the grid top to bottom."""
        for start in range(0, self.height, chunk_rows):
            yield slice(start, min(start + chunk_rows, self.height))

    def inside_mask(self) -> np.ndarray:
        """``(height, width)`` boolean, True where the cell centre is inside the region."""
        locator = _BlockLocator(self)
        return np.concatenate([locator.cells(rows)[1] for rows in self.blocks(self.default_chunk_rows())])

    def cells_inside(self) -> np.ndarray:
        """(m, 2) lon/lat degrees of the centres of the cells inside the region, row by row."""
        locator = _BlockLocator(self)
        parts = [locator.cells(rows)[0] for rows in self.blocks(self.default_chunk_rows())]
        return np.concatenate(parts) if parts else np.empty((0, 2))

    def default_chunk_rows(self) -> int:
        """Rows per block so that a block has about ``DEFAULT_CELLS_PER_CHUNK`` cells."""
        return max(1, min(self.height, DEFAULT_CELLS_PER_CHUNK // self.width))


class _BlockLocator:
    """Cell centres of row blocks in the grid CRS and lon/lat, with the region mask."""

    def __init__(self, grid: RegularGrid) -> None:
        self.x = grid.x
        self.y = grid.y
        self.geometry = grid._grid_geometry()
        self.to_lonlat = (
            None if grid.crs.equals(WGS84) else pyproj.Transformer.from_crs(grid.crs, WGS84, always_xy=True)
        )

    def cells(self, rows: slice | np.ndarray, cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """``(lonlat (m, 2) of the block's cells inside the region, inside (n_rows, n_cols) bool)``.

        ``rows`` and ``cols`` select grid rows and columns (all columns by default).
        """
        xx, yy = np.meshgrid(self.x[cols], self.y[rows])
        inside = shapely.contains_xy(self.geometry, xx, yy)
        px, py = xx[inside], yy[inside]
        if self.to_lonlat is not None:
            px, py = self.to_lonlat.transform(px, py)
        return np.column_stack([px, py]).astype(np.float64, copy=False), inside


# --- reference points for kernel slices ------------------------------------------------
def _local_xy(lonlat: np.ndarray, lat0: float) -> np.ndarray:
    """Equirectangular km coordinates around latitude ``lat0`` (good enough for nearest tiles)."""
    k = 111.32
    return np.column_stack([lonlat[:, 0] * k * math.cos(math.radians(lat0)), lonlat[:, 1] * k])


def reference_points(
    dataset: "SpatialDataset",
    grid: RegularGrid | None = None,
    *,
    radius_km: float = 3.0,
    max_candidates: int = 40_000,
) -> dict[str, tuple[float, float]]:
    """Pick three reference points for kernel slices from a dataset.

    ``urban``: the urban tile with the most urban tiles within ``radius_km``; ``rural``: the
    rural tile with the most rural tiles within ``radius_km`` (a well-observed rural place);
    ``wildland``: the cell of ``grid`` (default: a degree grid over the dataset's region
    with 400 cells along its longer side, about 0.007 degrees for Puerto Rico) inside the
    region that is farthest from any observed tile. Returns
    ``{name: (lon, lat)}`` in degrees.
    """
    from scipy.spatial import cKDTree

    frame = dataset.frame.drop_duplicates("quadkey")
    lonlat = frame[["lon", "lat"]].to_numpy(np.float64)
    if len(lonlat) == 0:
        raise InputDataError("the dataset has no tiles to choose reference points from")
    lat0 = float(np.mean(lonlat[:, 1]))
    labels = frame["urban_rural"].to_numpy()
    refs: dict[str, tuple[float, float]] = {}
    for label in ("urban", "rural"):
        pts = lonlat[labels == label]
        if len(pts) == 0:
            continue
        xy = _local_xy(pts, lat0)
        counts = cKDTree(xy).query_ball_point(xy, r=radius_km, return_length=True)
        best = pts[int(np.argmax(counts))]
        refs[label] = (float(best[0]), float(best[1]))

    if grid is None:
        west, south, east, north = dataset.region.geometry.bounds
        grid = RegularGrid.over(dataset.region, max((east - west), (north - south)) / 400.0)
    stride = max(1, math.ceil(math.sqrt(grid.width * grid.height / max_candidates)))
    locator = _BlockLocator(grid)
    tree = cKDTree(_local_xy(lonlat, lat0))
    best_d, best_pt = -1.0, None
    for start in range(0, grid.height, stride * 64):
        rows = np.arange(start, min(start + stride * 64, grid.height), stride)
        cand, inside = locator.cells(rows, slice(None, None, stride))
        if not inside.any():
            continue
        dist, _ = tree.query(_local_xy(cand, lat0))
        i = int(np.argmax(dist))
        if dist[i] > best_d:
            best_d, best_pt = float(dist[i]), cand[i]
    if best_pt is not None:
        refs["wildland"] = (float(best_pt[0]), float(best_pt[1]))
    return refs


# --- the result dataset ------------------------------------------------------------------
def _coordinate_attrs(crs: pyproj.CRS) -> tuple[dict[str, str], dict[str, str]]:
    if crs.is_geographic:
        return (
            {"standard_name": "longitude", "long_name": "longitude of cell centre", "units": "degrees_east", "axis": "X"},
            {"standard_name": "latitude", "long_name": "latitude of cell centre", "units": "degrees_north", "axis": "Y"},
        )
    unit = crs.axis_info[0].unit_name if crs.axis_info else "metre"
    units = "m" if unit in ("metre", "meter") else unit
    return (
        {"standard_name": "projection_x_coordinate", "long_name": "x of cell centre", "units": units, "axis": "X"},
        {"standard_name": "projection_y_coordinate", "long_name": "y of cell centre", "units": units, "axis": "Y"},
    )


def _template(
    grid: RegularGrid,
    model: SpatialPredictor,
    layers: GridLayers,
    *,
    lazy: bool,
    chunk_rows: int,
    max_distance: float | None,
) -> xr.Dataset:
    """The empty result dataset (NaN) with coordinates, CF attributes and the CRS."""
    import dask.array as da

    meta = model_meta(model)
    sizes = layers.sizes()

    def empty(dims: tuple[str, ...]) -> Any:
        lead = tuple(sizes[d] for d in dims[:-2])
        if lazy:
            return da.full((*lead, *grid.shape), np.nan, dtype=np.float32, chunks=(*lead, chunk_rows, grid.width))
        return np.full((*lead, *grid.shape), np.nan, dtype=np.float32)

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
        "source": f"geodbk model {meta.get('kind', type(model).__name__)}",
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
        ds.attrs["quarter"] = layers.quarters[0]
    if layers.threshold is not None:
        ds.attrs["threshold"] = layers.threshold
    if layers.change is not None:
        ds.attrs["change"] = ":".join(layers.change)
    for key in ("kind", "quarters"):
        if key in meta:
            ds.attrs[f"model_{key}"] = str(meta[key])
    # inplace: rioxarray's default is a deep copy, which would double the preallocated arrays
    ds.rio.write_crs(grid.crs, inplace=True)
    ds.rio.write_transform(grid.transform, inplace=True)
    return ds.rio.write_coordinate_system(inplace=True)


# --- prediction -------------------------------------------------------------------------
def _rows_index(ndim: int, rows: slice) -> tuple[slice, ...]:
    """Index of a row block in an array whose last two dims are (y, x)."""
    return (slice(None),) * (ndim - 2) + (rows, slice(None))


class _MemorySink:
    def __init__(self, template: xr.Dataset) -> None:
        self.ds = template

    def write(self, rows: slice, block: Mapping[str, np.ndarray]) -> None:
        for name, values in block.items():
            self.ds[name].values[_rows_index(values.ndim, rows)] = values

    def close(self) -> None:
        """Nothing to release."""

    def finish(self) -> xr.Dataset:
        return self.ds


class _ZarrSink:
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


class _NetCDFSink:
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


def predict_grid(
    model: SpatialPredictor,
    grid: RegularGrid,
    *,
    refs: Mapping[str, tuple[float, float]] | None = None,
    time: str | Sequence[str] | None = None,
    change: tuple[str, str] | None = None,
    threshold: float | str | None = DEFAULT,
    max_distance: float | None = None,
    chunk_rows: int | None = None,
    store: str | Path | None = None,
    progress: bool = True,
) -> xr.Dataset:
    """Predict ``model`` on every cell of ``grid`` inside the region, one row block at a time.

    Parameters
    ----------
    model
        A fitted :class:`SpatialPredictor` (e.g. :class:`geodbk.geomodel.GeoModel`); its
        ``meta`` (``target``, ``units``, ``service``, ``kind``) names the variables.
    grid
        The :class:`RegularGrid` to fill.
    refs
        ``{name: (lon, lat)}`` reference points for the ``kernel_slice`` variable (see
        :func:`reference_points`); no ``kernel_slice`` when empty or when the model has no
        kernel (``has_kernel`` false, e.g. knn).
    time
        The quarter to map, e.g. ``"2023Q4"`` (2-D layers); default the model's latest
        fitted quarter (time-free models map their pooled quarters). A list of quarters,
        e.g. ``["2022Q4", "2023Q4"]``, adds a CF ``time`` dimension to the per-quarter layers.
    change
        ``(from, to)`` quarters, e.g. ``("2022Q4", "2023Q4")``: add the change layers
        (mean change, joint-posterior sd, P(increase), change of the median in data units).
    threshold
        ``p_below`` = P(tile-mean value < threshold), threshold in data units (Mbps); the
        default is the FCC benchmark for the model's service and target
        (:mod:`geodbk.thresholds`); ``None`` leaves the layer out.
    max_distance
        Leave cells farther than this many metres from any training tile as NaN.
    chunk_rows
        Grid rows per block (default: about 262k cells per block, divided by the number of
        quarters). Peak memory grows with this, not with the grid size, when ``store`` is given.
    store
        Write blocks straight into this Zarr (``*.zarr``) or NetCDF (``*.nc``) store and
        return it opened lazily; without it the result is built in memory.
    progress
        Show a tqdm bar over blocks.

    Returns
    -------
    xarray.Dataset
        Variables as listed in :mod:`geodbk.layers`, float32, NaN outside the region, with
        CF attributes and the CRS in a ``spatial_ref`` coordinate (rioxarray convention).
    """
    layers = GridLayers.for_model(model, time=time, threshold=threshold, change=change, refs=refs)
    if chunk_rows is None:
        rows_per_block = max(1, grid.default_chunk_rows() // len(layers.quarters))
    else:
        rows_per_block = int(chunk_rows)
    if rows_per_block < 1:
        raise InputDataError(f"chunk_rows must be >= 1, got {chunk_rows}")
    rows_per_block = min(rows_per_block, grid.height)
    if max_distance is not None and not max_distance > 0:
        raise InputDataError(f"max_distance must be positive metres, got {max_distance}")
    template_args = {"lazy": store is not None, "chunk_rows": rows_per_block, "max_distance": max_distance}
    if store is None:
        sink: Any = _MemorySink(_template(grid, model, layers, **template_args))
    else:
        path = Path(store)
        if path.suffix not in (".zarr", ".nc", ".nc4"):
            raise InputDataError(f"store must end in .zarr or .nc, got {path.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        template = _template(grid, model, layers, **template_args)
        sink = _ZarrSink(template, path) if path.suffix == ".zarr" else _NetCDFSink(template, path)

    locator = _BlockLocator(grid)
    blocks = list(grid.blocks(rows_per_block))
    extrapolating: list[str] = []
    try:
        for rows in tqdm(blocks, desc="predicting grid", unit="block", disable=not progress):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ExtrapolationWarning)
                block = _predict_block(model, locator, rows, layers, max_distance)
            extrapolating += [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)][:1]
            for w in caught:
                if not issubclass(w.category, ExtrapolationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            sink.write(rows, block)
    except BaseException:
        sink.close()
        raise
    if extrapolating:
        warnings.warn(
            f"{extrapolating[0]} (in {len(extrapolating)} of {len(blocks)} grid block(s); the first shown)",
            ExtrapolationWarning,
            stacklevel=2,
        )
    return sink.finish()


def _predict_block(
    model: SpatialPredictor, locator: _BlockLocator, rows: slice, layers: GridLayers, max_distance: float | None
) -> dict[str, np.ndarray]:
    """float32 variables of one row block, (..., rows, width), NaN outside."""
    lonlat, inside = locator.cells(rows)
    if max_distance is not None and len(lonlat):
        near = model.distance_to_data(lonlat) <= max_distance
        inside[inside] = near
        lonlat = lonlat[near]
    values = layers.values(model, lonlat) if len(lonlat) else {}
    sizes = layers.sizes()
    block: dict[str, np.ndarray] = {}
    for name, (dims, _) in layers.variables().items():
        out = np.full((*(sizes[d] for d in dims[:-2]), *inside.shape), np.nan, dtype=np.float32)
        if values:
            out[..., inside] = values[name]
        block[name] = out
    return block


def predict_region(
    model: SpatialPredictor,
    region: RegionLike,
    resolution: float | str,
    *,
    crs: str | int | pyproj.CRS | None = None,
    time: str | Sequence[str] | None = None,
    **kwargs: Any,
) -> xr.Dataset:
    """:meth:`RegularGrid.over` then :func:`predict_grid` (``kwargs`` go to it); see both."""
    return predict_grid(model, RegularGrid.over(region, resolution, crs=crs), time=time, **kwargs)


def open_grid(path: str | Path) -> xr.Dataset:
    """Open a grid written by :func:`predict_grid` or :mod:`geodbk.export` (NetCDF or Zarr), lazily."""
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


def parse_refs(items: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Parse ``["name:lon,lat", ...]`` (degrees) into ``{name: (lon, lat)}``."""
    refs: dict[str, tuple[float, float]] = {}
    for item in items:
        name, sep, rest = item.partition(":")
        parts = rest.split(",")
        try:
            if not sep or not name or len(parts) != 2:
                raise ValueError
            lon, lat = float(parts[0]), float(parts[1])
        except ValueError:
            raise InputDataError(f"reference point {item!r} is not name:lon,lat (e.g. sanjuan:-66.06,18.45)") from None
        if not (-180 <= lon <= 180 and -90 <= lat <= 90):
            raise InputDataError(f"reference point {item!r} is outside lon [-180, 180] / lat [-90, 90]")
        refs[name] = (lon, lat)
    return refs


__all__ = [
    "RegularGrid",
    "SpatialPredictor",
    "open_grid",
    "parse_refs",
    "parse_resolution",
    "predict_grid",
    "predict_region",
    "reference_points",
    "utm_crs_for",
]
