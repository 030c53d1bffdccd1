"""Interactive Panel dashboard over one or more geodbk run folders.

Serve it with ``geodbk serve --run outputs/demo`` or
``panel serve apps/dashboard.py --args --run outputs/demo``.

A run folder is what ``geodbk demo`` writes (see ``docs/architecture.md``): the dataset,
one fitted :class:`geodbk.geomodel.GeoModel` per model kind, the metrics table and the
prebuilt prediction grids. Nothing is trained when the page opens: the map layers come from
the saved grids, and only the kernel slice and the predictive distribution at a clicked
point are computed live (one ``GeoModel.kernel_slice`` over the grid cells and one
``GeoModel.predict``).

Arguments after ``--args``: ``--run DIR`` (repeatable; default ``$GEODBK_RUN`` or
``outputs/demo``) and ``--offline`` (no basemap tiles; ``GEODBK_OFFLINE=1`` does the same).
"""

from __future__ import annotations

import argparse
import functools
import io
import operator
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import holoviews as hv
from bokeh.models import CustomJSHover
import numpy as np
import pandas as pd
import panel as pn
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor used to reproject grids)
import shapely
import xarray as xr
from holoviews import streams

from geodbk.dataset import SpatialDataset
from geodbk.export import tile_predictions
from geodbk.geomodel import GeoModel
from geodbk.grids import open_grid
from geodbk.prediction import Z95
from geodbk.workflow import RunFolder

hv.extension("bokeh")
pn.extension(notifications=False)

DEFAULT_RUN = Path("outputs/demo")
TARGETS = ("download", "upload", "latency")
ALL_QUARTERS = "all quarters"
MAP_WIDTH, MAP_HEIGHT = 620, 400
SIDE_WIDTH = 430
URBAN_COLOURS = {"urban": "#d95f02", "rural": "#1b9e77"}
OOKLA_ATTRIBUTION = (
    "Speedtest® by Ookla® Global Fixed and Mobile Network Performance Maps. Based on analysis "
    "by Ookla of Speedtest Intelligence® data. Ookla trademarks used under license."
)

#: Map layers: label -> (grid variable template, colour map, log colour scale).
LAYERS = {
    "Predictive median": ("mean_{u}", "viridis", True),
    "Predictive sd (log10)": ("sd", "magma", False),
    "95% PI width (log10)": ("pi_width", "magma", False),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Arguments given after ``panel serve apps/dashboard.py --args``."""
    parser = argparse.ArgumentParser(prog="dashboard.py")
    parser.add_argument("--run", action="append", type=Path, help="run folder (repeatable)")
    parser.add_argument("--offline", action="store_true", help="never load basemap tiles")
    args, _ = parser.parse_known_args(argv)
    if not args.run:
        args.run = [Path(os.environ.get("GEODBK_RUN", DEFAULT_RUN))]
    args.offline = args.offline or os.environ.get("GEODBK_OFFLINE", "") not in ("", "0")
    return args


# --- reading run folders (cached across browser sessions) ------------------------------------
def _stamp(path: Path) -> float:
    return path.stat().st_mtime


@pn.cache(max_items=8)
def _load_dataset(path: str, stamp: float) -> SpatialDataset:
    return SpatialDataset.load(path)


@pn.cache(max_items=16)
def _load_model(path: str, stamp: float) -> GeoModel:
    return GeoModel.load(path)


@pn.cache(max_items=16)
def _load_grid(path: str, stamp: float) -> xr.Dataset:
    with open_grid(path) as ds:
        return ds.load()


@pn.cache(max_items=64)
def _mercator_layer(path: str, stamp: float, variable: str) -> xr.DataArray:
    return mercator_raster(_load_grid(path, stamp)[variable])


@pn.cache(max_items=16)
def _prior_variance(model_path: str, grid_path: str, stamp: tuple[float, float]) -> np.ndarray:
    """k(x, x) at the grid cells inside the region."""
    grid = _load_grid(grid_path, stamp[1])
    lonlat, _ = grid_cells_lonlat(grid)
    return _load_model(model_path, stamp[0]).prior_variance(lonlat, grid.attrs.get("quarter"))


@pn.cache(max_items=16)
def _test_tiles(model_path: str, dataset_path: str, stamp: float) -> pd.DataFrame:
    """:func:`geodbk.export.tile_predictions` of a model at its run's test tiles."""
    model = _load_model(model_path, _stamp(Path(model_path)))
    dataset = _load_dataset(dataset_path, _stamp(Path(dataset_path)))
    return pd.DataFrame(tile_predictions(model, dataset, split="test").drop(columns="geometry"))


@dataclass(frozen=True)
class Fit:
    """One saved model in a run folder and the files that go with it."""

    run: Path
    kind: str
    target: str

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.run.name}, {self.target})"

    @property
    def files(self) -> RunFolder:
        return RunFolder(self.run)

    @property
    def model_path(self) -> Path:
        return self.files.model(self.kind)

    @property
    def grid_path(self) -> Path:
        return self.files.map_netcdf(self.kind)

    @property
    def geotiff_path(self) -> Path:
        return self.files.map_geotiff(self.kind)

    @property
    def test_tiles_path(self) -> Path:
        return self.files.test_tiles(self.kind)

    @property
    def dataset_path(self) -> Path:
        return self.files.dataset

    def model(self) -> GeoModel:
        return _load_model(str(self.model_path), _stamp(self.model_path))

    def grid(self) -> xr.Dataset | None:
        if not self.grid_path.exists():
            return None
        return _load_grid(str(self.grid_path), _stamp(self.grid_path))

    def dataset(self) -> SpatialDataset:
        return _load_dataset(str(self.dataset_path), _stamp(self.dataset_path))

    def mercator_layer(self, variable: str) -> xr.DataArray:
        return _mercator_layer(str(self.grid_path), _stamp(self.grid_path), variable)

    def prior_variance(self) -> np.ndarray:
        """``(m,)`` prior variance k(x, x) at the grid cells inside the region (see grid_cells_lonlat)."""
        return _prior_variance(
            str(self.model_path), str(self.grid_path), (_stamp(self.model_path), _stamp(self.grid_path))
        )

    def test_tiles(self) -> pd.DataFrame:
        return _test_tiles(str(self.model_path), str(self.dataset_path), _stamp(self.model_path))


@dataclass
class Catalog:
    """The fits found in the run folders, and why a folder was skipped."""

    fits: list[Fit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def scan(cls, runs: list[Path]) -> "Catalog":
        catalog = cls()
        for run in runs:
            models = sorted((run / "models").glob("*.pt")) if run.is_dir() else []
            if not (run / "dataset.parquet").exists() or not models:
                catalog.problems.append(f"`{run}` is not a run folder (no dataset.parquet or models/*.pt)")
                continue
            for path in models:
                target = str(_load_model(str(path), _stamp(path)).meta.get("target", "download"))
                catalog.fits.append(Fit(run, path.stem, target))
        return catalog

    def for_target(self, target: str) -> list[Fit]:
        return [fit for fit in self.fits if fit.target == target]


# --- geometry helpers: the map is drawn in Web Mercator (EPSG:3857), like web basemaps ---------
_TO_LONLAT = pyproj.Transformer.from_crs(3857, 4326, always_xy=True)
_TO_MERCATOR = pyproj.Transformer.from_crs(4326, 3857, always_xy=True)


def mercator_to_lonlat(x: float, y: float) -> tuple[float, float]:
    """Web Mercator metres (the map's coordinates) -> lon/lat degrees."""
    lon, lat = _TO_LONLAT.transform(x, y)
    return float(lon), float(lat)


def with_mercator(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``easting``/``northing`` (EPSG:3857 metres) from its ``lon``/``lat`` columns."""
    easting, northing = _TO_MERCATOR.transform(frame["lon"].to_numpy(), frame["lat"].to_numpy())
    return frame.assign(easting=easting, northing=northing)


def raster_hover(label: str) -> dict:
    """Hover options for a Web Mercator ``hv.Image``: lon/lat in degrees (not metres) and the value."""
    radius = 6378137.0  # the spherical Web Mercator radius, metres
    to_degrees = {
        "$x": CustomJSHover(code=f"return (value / {radius} * 180 / Math.PI).toFixed(4)"),
        "$y": CustomJSHover(code=f"return ((2 * Math.atan(Math.exp(value / {radius})) - Math.PI / 2) * 180 / Math.PI).toFixed(4)"),
    }
    return {
        "tools": ["hover"],
        "hover_tooltips": [("lon", "$x{custom}"), ("lat", "$y{custom}"), (label, "@image{0.000}")],
        "hover_formatters": to_degrees,
    }


def mercator_raster(values: xr.DataArray) -> xr.DataArray:
    """A grid variable (any CRS, NaN outside the region) warped onto a Web Mercator raster."""
    crs = values.rio.crs or "EPSG:4326"
    warped = values.rio.write_crs(crs).rio.write_nodata(np.nan, encoded=False).rio.reproject("EPSG:3857", nodata=np.nan)
    return warped.drop_vars("spatial_ref", errors="ignore")


def outline_paths(geometry: shapely.Geometry) -> list[np.ndarray]:
    """Rings of a lon/lat (multi)polygon as ``(n, 2)`` Web Mercator arrays."""
    rings = []
    for polygon in getattr(geometry, "geoms", [geometry]):
        for ring in [polygon.exterior, *polygon.interiors]:
            lon, lat = np.asarray(ring.coords).T
            rings.append(np.column_stack(_TO_MERCATOR.transform(lon, lat)))
    return rings


def grid_cells_lonlat(grid: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(lonlat (m, 2) of the cells inside the region, inside (ny, nx) bool)``."""
    xx, yy = np.meshgrid(grid["x"].to_numpy(), grid["y"].to_numpy())
    inside = np.isfinite(grid["mean"].to_numpy())
    px, py = xx[inside], yy[inside]
    crs = grid.rio.crs
    if crs is not None and not pyproj.CRS.from_user_input(crs).is_geographic:
        px, py = pyproj.Transformer.from_crs(crs, 4326, always_xy=True).transform(px, py)
    return np.column_stack([px, py]), inside


def default_reference(fit: Fit, grid: xr.Dataset | None) -> tuple[float, float]:
    """The grid's first saved reference point (urban when present), else the region centre."""
    if grid is not None and "ref_lon" in grid.coords:
        names = [str(n) for n in grid["ref"].to_numpy()]
        i = names.index("urban") if "urban" in names else 0
        return float(grid["ref_lon"][i]), float(grid["ref_lat"][i])
    centre = fit.dataset().region.geometry.representative_point()
    return float(centre.x), float(centre.y)


def tiles_in_quarter(frame: pd.DataFrame, quarter: str) -> pd.DataFrame:
    if quarter == ALL_QUARTERS:
        return frame
    year, q = quarter.split("Q")
    return frame[(frame["year"] == int(year)) & (frame["quarter"] == int(q))]


# --- the page -------------------------------------------------------------------------------
class Dashboard:
    """Widgets, the map with its Tap stream, and the panels that follow a click."""

    def __init__(self, catalog: Catalog, *, offline: bool) -> None:
        self.catalog = catalog
        self.offline = offline
        targets = [t for t in TARGETS if catalog.for_target(t)] or ["download"]
        self.target = pn.widgets.Select(
            name="Target",
            options=sorted(set(targets) | {"download", "upload"}, key=TARGETS.index),
            value=targets[0],
            width=180,
        )
        self.model = pn.widgets.Select(name="Model run", options={}, width=380)
        self.quarter = pn.widgets.Select(name="Observed tiles: quarter", options=[], width=180)
        self.layer = pn.widgets.RadioButtonGroup(
            name="Layer", options=list(LAYERS), value="Predictive median", button_type="default"
        )
        self.clim = pn.widgets.EditableRangeSlider(
            name="Colour limits", start=0.0, end=1.0, value=(0.0, 1.0), step=0.01, width=380
        )
        self.overlays = pn.widgets.CheckBoxGroup(
            name="Overlays",
            options=["observed tiles", "urban/rural", "region outline"] + ([] if offline else ["basemap"]),
            value=["region outline"] + ([] if offline else ["basemap"]),
            inline=True,
        )
        self.slice_kind = pn.widgets.RadioButtonGroup(
            name="Kernel slice", options=["correlation", "covariance"], value="correlation", width=SIDE_WIDTH
        )
        self.notice = pn.pane.Alert(
            "", alert_type="warning", visible=False, width=SIDE_WIDTH * 2, css_classes=["geodbk-notice"]
        )
        self.geotiff = pn.widgets.FileDownload(
            label="GeoTIFF of the map", button_type="primary", width=190, embed=False
        )
        self.test_geojson = pn.widgets.FileDownload(label="Test tiles GeoJSON", width=190, embed=False)
        self.tiles_geojson = pn.widgets.FileDownload(
            label="Shown tiles GeoJSON",
            width=190,
            callback=self._shown_tiles_geojson,
            filename="observed_tiles.geojson",
        )

        # The Tap stream's source must be a DynamicMap of one element (here the raster): one
        # that returns an Overlay gets no tap callback. Every DynamicMap returns the same
        # layers each time (hidden ones empty), as HoloViews cannot add layers after the first frame.
        raster = hv.DynamicMap(pn.bind(self._raster, self.model, self.layer, self.clim))
        self.tap = streams.Tap(source=raster, x=None, y=None)
        layers = [
            raster,
            hv.DynamicMap(pn.bind(self._vector_layers, self.model, self.quarter, self.overlays)),
            hv.DynamicMap(self._reference_marker, streams=[self.tap]),
        ]
        if not offline:
            layers.insert(0, hv.DynamicMap(pn.bind(self._basemap, self.overlays)))
        self.map = functools.reduce(operator.mul, layers).opts(
            width=MAP_WIDTH, height=MAP_HEIGHT, xaxis=None, yaxis=None, data_aspect=1, active_tools=["wheel_zoom"]
        )
        self.map_title = pn.pane.Markdown(
            pn.bind(
                lambda fit, layer: (
                    f"**{fit.kind}** · {layer} · click the map to see the kernel slice there" if fit else ""
                ),
                self.model,
                self.layer,
            ),
            css_classes=["geodbk-map-title"],
            margin=(0, 10),
        )
        self.target.param.watch(self._on_target, "value")
        self.model.param.watch(self._on_model, "value")
        self.layer.param.watch(self._reset_clim, "value")
        self._on_target()

    # -- state that follows the widgets ------------------------------------------------------
    @property
    def fit(self) -> Fit | None:
        return self.model.value

    def _on_target(self, *_: object) -> None:
        fits = self.catalog.for_target(self.target.value)
        if fits:
            self.notice.visible = False
        else:
            trained = sorted({f.target for f in self.catalog.fits})
            self.notice.object = (
                f"No model in this run was trained on **{self.target.value}** (it has: {', '.join(trained)}). "
                f"Fit one with `geodbk demo --target {self.target.value} --out outputs/demo-{self.target.value}` "
                f"and serve both: `geodbk serve --run outputs/demo --run outputs/demo-{self.target.value}`."
            )
            self.notice.visible = True
            fits = self.catalog.fits
        options = {fit.label: fit for fit in fits}
        current = self.model.value
        self.model.options = options
        if current in fits:
            self._on_model()
        else:
            self.model.value = fits[0]

    def _on_model(self, *_: object) -> None:
        fit = self.fit
        if fit is None:
            return
        quarters = fit.dataset().quarters
        self.quarter.options = [ALL_QUARTERS] + quarters
        if self.quarter.value not in self.quarter.options:
            self.quarter.value = quarters[-1] if quarters else ALL_QUARTERS
        self._reset_clim()
        for button, path in ((self.geotiff, fit.geotiff_path), (self.test_geojson, fit.test_tiles_path)):
            button.disabled = not path.exists()
            if path.exists():
                button.file = str(path)
                button.filename = f"{fit.run.name}_{path.name}"

    def _layer_variable(self, fit: Fit) -> str:
        template = LAYERS[self.layer.value][0]
        return template.format(u=str(fit.dataset().units).lower())

    def _reset_clim(self, *_: object) -> None:
        fit = self.fit
        grid = fit.grid() if fit else None
        if grid is None:
            return
        values = grid[self._layer_variable(fit)].to_numpy()
        values = values[np.isfinite(values)]
        if values.size == 0:
            return
        lo, hi = (float(v) for v in np.percentile(values, [2, 98]))
        full_lo, full_hi = float(values.min()), float(values.max())
        step = max((full_hi - full_lo) / 200.0, 1e-6)
        with pn.io.hold():
            self.clim.param.update(start=full_lo, end=full_hi, step=step, value=(round(lo, 4), round(hi, 4)))

    def _shown_tiles_geojson(self) -> io.BytesIO:
        fit = self.fit
        frame = tiles_in_quarter(fit.dataset().frame, self.quarter.value) if fit else None
        columns = ["quadkey", "year", "quarter", "value", "urban_rural", "split", "geometry"]
        text = frame[columns].to_json() if frame is not None else '{"type": "FeatureCollection", "features": []}'
        return io.BytesIO(text.encode("utf-8"))

    # -- the map ---------------------------------------------------------------------------
    @staticmethod
    def _basemap(overlays: list[str]) -> hv.Tiles:
        return hv.element.tiles.CartoLight().opts(alpha=1.0 if "basemap" in overlays else 0.0)

    def _raster(self, fit: Fit | None, layer: str, clim: tuple[float, float]) -> hv.Image:
        """The selected grid variable of the selected model, warped to Web Mercator."""
        if fit is None or fit.grid() is None:
            return hv.Image([])
        name = self._layer_variable(fit)
        _, cmap, logz = LAYERS[layer]
        units = fit.grid()[name].attrs.get("units", "")
        label = f"{layer} [{units}]"
        return hv.Image(fit.mercator_layer(name), kdims=["x", "y"], vdims=[hv.Dimension(name, label=label)]).opts(
            cmap=cmap, logz=logz, clim=tuple(clim), colorbar=True, alpha=0.85, **raster_hover(label)
        )

    def _vector_layers(self, fit: Fit | None, quarter: str, overlays: list[str]) -> hv.Overlay:
        """Urban/rural tiles, observed tiles of the quarter, region outline (empty when hidden)."""
        columns = ["lon", "lat", "value", "urban_rural", "year", "quarter"]
        frame = fit.dataset().frame[columns] if fit else pd.DataFrame(columns=columns)
        urban = frame.drop_duplicates(["lon", "lat"]) if "urban/rural" in overlays else frame.iloc[:0]
        observed = tiles_in_quarter(frame, quarter) if "observed tiles" in overlays and fit else frame.iloc[:0]
        outline = outline_paths(fit.dataset().region.geometry) if "region outline" in overlays and fit else []
        target, units = (fit.dataset().target, fit.dataset().units) if fit else ("value", "")
        value = hv.Dimension("value", label=f"observed {target} [{units}]")
        return hv.Overlay(
            [
                hv.Points(with_mercator(urban), ["easting", "northing"], ["urban_rural", "lon", "lat"]).opts(
                    color="urban_rural",
                    cmap=URBAN_COLOURS,
                    marker="square",
                    size=4,
                    alpha=0.4,
                    show_legend=True,
                    legend_position="bottom_left",
                ),
                hv.Points(with_mercator(observed), ["easting", "northing"], [value, "urban_rural", "lon", "lat"]).opts(
                    color="value",
                    cmap="viridis",
                    logz=True,
                    size=3,
                    alpha=0.8,
                    line_color="white",
                    line_width=0.2,
                    tools=["hover"],
                    hover_tooltips=[
                        (value.label, "@value"),
                        ("class", "@urban_rural"),
                        ("lon", "@lon"),
                        ("lat", "@lat"),
                    ],
                ),
                hv.Path(outline).opts(color="black", line_width=1.2),
            ]
        )

    def _reference_marker(self, x: float | None, y: float | None) -> hv.Points:
        """A cross at the kernel slice's reference point (the last click)."""
        fit = self.fit
        if fit is None:
            lonlat = np.empty((0, 2))
        elif x is None or y is None:
            lonlat = np.array([default_reference(fit, fit.grid())])
        else:
            lonlat = np.array([mercator_to_lonlat(x, y)])
        points = np.column_stack(_TO_MERCATOR.transform(lonlat[:, 0], lonlat[:, 1])) if len(lonlat) else lonlat
        return hv.Points(points).opts(color="red", marker="x", size=14, line_width=3)

    # -- what a click shows ------------------------------------------------------------------
    def kernel_view(self, fit: Fit | None, x: float | None, y: float | None, kind: str) -> pn.viewable.Viewable:
        """Kernel slice (correlation or covariance) at the clicked point, and the predictive density there."""
        if fit is None or fit.grid() is None:
            return pn.pane.Markdown("Pick a model run with a saved grid.")
        grid = fit.grid()
        lon, lat = default_reference(fit, grid) if x is None or y is None else mercator_to_lonlat(x, y)
        model = fit.model()
        quarter = grid.attrs.get("quarter")  # the quarter the raster shows (absent: a time-free model)
        pred = model.predict(np.array([[lon, lat]]), quarter)
        mean, sd = float(pred.mean[0]), float(pred.sd[0])
        density = pn.pane.HoloViews(self._density(fit, mean, sd), css_classes=["geodbk-density"])
        if not model.has_kernel:  # the knn and dnn baselines
            return pn.Column(
                self._reference_pane(fit, lon, lat, mean, sd, kind, None),
                pn.pane.Alert(f"{fit.kind} is not a GP: it has no kernel to slice", alert_type="secondary", width=SIDE_WIDTH),
                density,
            )
        lonlat, inside = grid_cells_lonlat(grid)
        values = np.full(inside.shape, np.nan, dtype=np.float64)
        values[inside] = model.kernel_slice(lonlat, np.array([[lon, lat]]), quarter)[:, 0]
        units = f"log10({fit.dataset().units})²"
        if kind == "correlation":
            k_ref = float(model.kernel_slice(np.array([[lon, lat]]), np.array([[lon, lat]]), quarter)[0, 0])
            values[inside] /= np.sqrt(np.clip(fit.prior_variance() * k_ref, 1e-30, None))
            label, title = "ρ(x, x_ref)", f"correlation with ({lon:.4f}, {lat:.4f})"
        else:
            label, title = f"k(x, x_ref) [{units}]", f"k(·, x_ref) at ({lon:.4f}, {lat:.4f})"
        # a diverging map centred on 0 when the slice changes sign, else a sequential one
        signed = bool(np.nanmin(values) < 0)
        k_slice = grid["mean"].copy(data=values.astype(np.float32)).rename("k")
        image = hv.Image(mercator_raster(k_slice), kdims=["x", "y"], vdims=[hv.Dimension("k", label=label)]).opts(
            cmap="RdBu_r" if signed else "viridis",
            symmetric=signed,
            colorbar=True,
            **raster_hover(label),
        )
        ref_x, ref_y = _TO_MERCATOR.transform(lon, lat)
        marker = hv.Points([(ref_x, ref_y)]).opts(color="red", marker="x", size=12, line_width=3)
        outline = hv.Path(outline_paths(fit.dataset().region.geometry)).opts(color="black", line_width=0.8)
        plot = (image * outline * marker).opts(
            width=SIDE_WIDTH, height=260, xaxis=None, yaxis=None, data_aspect=1, toolbar=None, title=title
        )
        # text and plots are replaced together, so the text never describes an older click
        return pn.Column(
            self._reference_pane(fit, lon, lat, mean, sd, kind, values[inside]),
            pn.pane.HoloViews(plot, css_classes=["geodbk-kernel"]),
            density,
        )

    @staticmethod
    def _reference_pane(
        fit: Fit, lon: float, lat: float, mean: float, sd: float, kind: str, k: np.ndarray | None
    ) -> pn.pane.Markdown:
        """The clicked point, its predictive distribution in data and log10 units, and the slice's range."""
        units = fit.dataset().units
        if k is None:
            kernel = "no kernel (not a GP)"
        else:
            kernel = (
                f"{kind} over the grid: min {np.nanmin(k):.4f}, median {np.nanmedian(k):.4f}, max {np.nanmax(k):.4f}"
            )
        text = (
            f"**Reference point** lon {lon:.4f}, lat {lat:.4f}  \n"
            f"Predicted median **{10**mean:.1f} {units}**, 95% PI "
            f"[{10 ** (mean - Z95 * sd):.1f}, {10 ** (mean + Z95 * sd):.1f}] {units}  \n"
            f"log10: mean {mean:.3f}, sd {sd:.3f}, PI width {2 * Z95 * sd:.3f}  \n"
            f"{kernel}"
        )
        return pn.pane.Markdown(text, css_classes=["geodbk-ref"], width=SIDE_WIDTH)

    @staticmethod
    def _density(fit: Fit, mean: float, sd: float) -> hv.Overlay:
        units = fit.dataset().units
        grid = np.linspace(mean - 4 * sd, mean + 4 * sd, 200)
        density = np.exp(-0.5 * ((grid - mean) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
        xdim = hv.Dimension("log10_value", label=f"log10({units})")
        inner = np.abs(grid - mean) <= Z95 * sd
        band = hv.Area((grid[inner], density[inner]), xdim, "density").opts(color="#9ecae1", line_alpha=0)
        curve = hv.Curve((grid, density), xdim, "density").opts(color="#08519c")
        centre = hv.VLine(mean).opts(color="#08519c", line_dash="dashed")
        lower, upper = 10 ** (mean - Z95 * sd), 10 ** (mean + Z95 * sd)
        return (band * curve * centre).opts(
            width=SIDE_WIDTH,
            height=190,
            toolbar=None,
            title=f"predictive: median {10**mean:.1f} {units}, 95% PI [{lower:.1f}, {upper:.1f}]",
        )

    # -- tables and class comparison ---------------------------------------------------------
    def metrics_view(self, fit: Fit | None) -> pn.viewable.Viewable:
        if fit is None:
            return pn.pane.Markdown("")
        path = fit.files.metrics_csv
        if not path.exists():
            return pn.pane.Markdown(f"No `metrics.csv` in `{fit.run}`.")
        table = pd.read_csv(path)
        table = table.set_index(["model", "group"]).round(3)
        mine = table.loc[[fit.kind]] if fit.kind in table.index.get_level_values(0) else table.iloc[:0]
        return pn.Column(
            pn.pane.Markdown(f"**Test metrics of {fit.kind} by class** (log10 {fit.target})"),
            pn.pane.DataFrame(mine, sizing_mode="stretch_width", css_classes=["geodbk-metrics"]),
            pn.pane.Markdown("**All models in this run**"),
            pn.pane.DataFrame(table, sizing_mode="stretch_width", max_rows=60),
            width=SIDE_WIDTH,
        )

    def pi_width_view(self, fit: Fit | None) -> pn.viewable.Viewable:
        if fit is None:
            return pn.pane.Markdown("")
        frame = fit.test_tiles()
        violin = hv.Violin(frame, "urban_rural", hv.Dimension("pi_width", label="95% PI width (log10)")).opts(
            violin_fill_color="urban_rural",
            cmap=URBAN_COLOURS,
            inner="box",
            width=MAP_WIDTH,
            height=260,
            toolbar=None,
            title=f"95% PI width at the test tiles by class ({fit.kind})",
        )
        return pn.pane.HoloViews(violin, css_classes=["geodbk-violin"])

    # -- layout ------------------------------------------------------------------------------
    def view(self) -> pn.viewable.Viewable:
        kernel = pn.bind(self.kernel_view, self.model, self.tap.param.x, self.tap.param.y, self.slice_kind)
        controls = pn.Column(
            pn.Row(self.target, self.quarter),
            self.model,
            self.layer,
            self.clim,
            self.overlays,
            pn.Row(self.geotiff, self.test_geojson, self.tiles_geojson),
        )
        return pn.Column(
            pn.pane.Markdown("## geodbk · Deep Basis Kernel GP maps of mobile internet speed", margin=(0, 10)),
            self.notice,
            pn.Row(
                pn.Column(
                    controls,
                    self.map_title,
                    pn.pane.HoloViews(self.map, css_classes=["geodbk-map"]),
                    pn.bind(self.pi_width_view, self.model),
                ),
                pn.Column(
                    self.slice_kind,
                    pn.panel(kernel, defer_load=False),
                    pn.bind(self.metrics_view, self.model),
                ),
            ),
            pn.pane.Markdown(f"<small>{OOKLA_ATTRIBUTION}</small>", width=MAP_WIDTH + SIDE_WIDTH),
        )


def missing_runs_page(catalog: Catalog) -> pn.viewable.Viewable:
    """What the page says when there is nothing to show."""
    problems = "\n".join(f"- {p}" for p in catalog.problems)
    return pn.Column(
        pn.pane.Markdown("## geodbk dashboard: no run folder yet"),
        pn.pane.Alert(
            f"{problems}\n\nBuild one on the shipped Puerto Rico sample (a few minutes on a laptop), then reload:\n\n"
            "```\ngeodbk demo --out outputs/demo\ngeodbk serve --run outputs/demo\n```",
            alert_type="info",
            css_classes=["geodbk-no-run"],
        ),
    )


def create_app(runs: list[Path], *, offline: bool) -> pn.viewable.Viewable:
    """The page for the given run folders."""
    catalog = Catalog.scan(runs)
    if not catalog.fits:
        return missing_runs_page(catalog)
    return Dashboard(catalog, offline=offline).view()


if pn.state.served:
    _args = parse_args(sys.argv[1:])
    create_app(_args.run, offline=_args.offline).servable(title="geodbk dashboard")
