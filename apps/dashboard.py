"""Interactive Panel dashboard over one or more geodbk run folders.

Serve it with ``geodbk serve --run outputs/demo`` or
``panel serve apps/dashboard.py --args --run outputs/demo``.

A run folder is what ``geodbk demo`` writes (see ``docs/architecture.md``): the dataset,
one fitted :class:`geodbk.fit.geomodel.GeoModel` per model kind, the metrics table and the
prebuilt prediction grids. Nothing is trained when the page opens: the map layers come from
the saved grids (one map per fitted quarter, chosen with the quarter slider, plus the change
between two quarters), and only what follows a click is computed live: the kernel slice over
the grid cells (one ``GeoModel.kernel_slice``), the predictive distribution there and its
time series over every fitted quarter (one ``GeoModel.predict_series``).

The map fills the page's width. Under it lies an OpenStreetMap basemap (CARTO's light tiles,
through ``holoviews.element.tiles``) that a check box hides, and hovering it reads out the
cell's predictive median, 95% interval and P(below the threshold) at the map's quarter.

Arguments after ``--args``: ``--run DIR`` (repeatable; default ``$GEODBK_RUN`` or
``outputs/demo``), ``--no-basemap`` (no tiles, for offline use: the page then makes no request
outside its server) and ``--polygons FILE`` (default ``$GEODBK_POLYGONS``): a polygon file
(counties, tracts; GeoJSON, shapefile zip, GeoPackage, GeoParquet) whose polygons meeting the
model's region get an area summary table (:func:`geodbk.maps.summaries.summarize_polygons`)
for the slider's quarter.

The page holds widgets, layout and callbacks only: what it shows is computed by
:mod:`geodbk.viewer` (run-folder catalog, grid cells, kernel slices, units, layers), and its
HoloViews plots are built in ``apps/dashboard_views.py``.
"""

from __future__ import annotations

import argparse
import functools
import io
import operator
import os
import sys
from pathlib import Path

import holoviews as hv
import numpy as np
import pandas as pd
import panel as pn
import xarray as xr
from dashboard_views import (
    URBAN_COLOURS,
    basemap_tiles,
    density_plot,
    kernel_slice_plot,
    raster_hover,
    readout_tooltips,
    series_plot,
    vector_overlay,
)
from holoviews import streams

from geodbk.errors import GeodbkError
from geodbk.viewer import (
    ALL_QUARTERS,
    DEFAULT_LAYER,
    LAYER_BY_KEY,
    NEAR_KM,
    Catalog,
    Fit,
    Layer,
    PointPrediction,
    Series,
    cell_readout,
    change_span,
    colour_limits,
    grid_cells_lonlat,
    grid_quarters,
    grid_units,
    layer_cmap,
    layer_label,
    layer_options,
    layer_variable,
    lonlat_to_mercator,
    mercator_to_lonlat,
    metrics_tables,
    observed_near,
    on_cells,
    outline_paths,
    resolve_layer,
    shown_quarter,
    slice_at_cells,
    slice_units,
    summary_table,
    tiles_geojson,
    tiles_in_quarter,
)

hv.extension("bokeh")
pn.extension(notifications=False)

DEFAULT_RUN = Path("outputs/demo")
TARGETS = ("download", "upload", "latency")
PANEL_WIDTH = 620  # pixels: the area summary and the PI-width violin (the map fills the page width)
MAP_MIN_HEIGHT, MAP_MAX_HEIGHT = 300, 720  # pixels: the map's height follows its width and the region's shape
SIDE_WIDTH = 430
OOKLA_ATTRIBUTION = (
    "Speedtest® by Ookla® Global Fixed and Mobile Network Performance Maps. Based on analysis "
    "by Ookla of Speedtest Intelligence® data. Ookla trademarks used under license."
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Arguments given after ``panel serve apps/dashboard.py --args``."""
    parser = argparse.ArgumentParser(prog="dashboard.py")
    parser.add_argument("--run", action="append", type=Path, help="run folder (repeatable)")
    parser.add_argument("--no-basemap", action="store_true", help="no basemap tiles (for offline use)")
    parser.add_argument("--polygons", type=Path, help="polygon file for the area summary table")
    args, _ = parser.parse_known_args(argv)
    if not args.run:
        args.run = [Path(os.environ.get("GEODBK_RUN", DEFAULT_RUN))]
    if args.polygons is None and os.environ.get("GEODBK_POLYGONS"):
        args.polygons = Path(os.environ["GEODBK_POLYGONS"])
    return args


# --- the page -------------------------------------------------------------------------------
class Dashboard:
    """Widgets, the map with its Tap stream, and the panels that follow a click."""

    def __init__(self, catalog: Catalog, *, basemap: bool, polygons: Path | None = None) -> None:
        self.catalog = catalog
        self.polygons = polygons
        targets = [t for t in TARGETS if catalog.for_target(t)] or ["download"]
        self.target = pn.widgets.Select(
            name="Target",
            options=sorted(set(targets) | {"download", "upload"}, key=TARGETS.index),
            value=targets[0],
            width=180,
        )
        self.model = pn.widgets.Select(name="Model run", options={}, width=380)
        self.quarter = pn.widgets.Select(name="Observed tiles: quarter", options=[], width=180)
        # options and visibility follow the selected model's grid (see _on_model)
        self.map_quarter = pn.widgets.DiscreteSlider(
            name="Map quarter", options=["latest"], value="latest", width=380, css_classes=["geodbk-quarter"]
        )
        self.layer = pn.widgets.RadioButtonGroup(
            name="Layer",
            options=layer_options(None),
            value=DEFAULT_LAYER,
            button_type="default",
            orientation="vertical",
            width=200,
            css_classes=["geodbk-layers"],
        )
        self.clim = pn.widgets.EditableRangeSlider(
            name="Colour limits", start=0.0, end=1.0, value=(0.0, 1.0), step=0.01, width=380
        )
        overlays = ["observed tiles", "urban/rural", "region outline"] + (["polygons"] if polygons else [])
        self.overlays = pn.widgets.CheckBoxGroup(
            name="Overlays",
            options=overlays,
            value=["region outline"] + (["polygons"] if polygons else []),
            inline=True,
        )
        # without a basemap (--no-basemap) there is nothing to toggle
        self.basemap = pn.widgets.Checkbox(
            name="basemap (OpenStreetMap, CARTO)", value=True, visible=basemap, css_classes=["geodbk-basemap"]
        )
        self.slice_kind = pn.widgets.RadioButtonGroup(
            name="Kernel slice", options=["correlation", "covariance"], value="correlation", width=SIDE_WIDTH
        )
        self.notice = pn.pane.Alert(
            "", alert_type="warning", visible=False, width=SIDE_WIDTH * 2, css_classes=["geodbk-notice"]
        )
        self.problems = pn.pane.Alert(  # model files or folders that did not load, one line each
            "\n".join(f"- {p}" for p in catalog.problems),
            alert_type="warning",
            visible=bool(catalog.problems),
            width=SIDE_WIDTH * 2,
            css_classes=["geodbk-problems"],
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
        self.summary_csv = pn.widgets.FileDownload(
            label="Area summary CSV",
            width=190,
            callback=self._summary_csv,
            filename="area_summary.csv",
        )

        # The Tap stream's source must be a DynamicMap of one element (here the raster): one
        # that returns an Overlay gets no tap callback. Every DynamicMap returns the same
        # layers each time (hidden ones empty), as HoloViews cannot add layers after the first frame.
        raster = hv.DynamicMap(pn.bind(self._raster, self.model, self.layer, self.clim, self.map_quarter))
        self.tap = streams.Tap(source=raster, x=None, y=None)
        layers = [
            raster,
            hv.DynamicMap(pn.bind(self._vector_layers, self.model, self.quarter, self.overlays)),
            hv.DynamicMap(self._reference_marker, streams=[self.tap]),
        ]
        if basemap:
            layers.insert(0, hv.DynamicMap(pn.bind(basemap_tiles, self.basemap)))
        self.map = functools.reduce(operator.mul, layers).opts(
            responsive=True,
            data_aspect=1,
            min_height=MAP_MIN_HEIGHT,
            max_height=MAP_MAX_HEIGHT,
            xaxis=None,
            yaxis=None,
            active_tools=["wheel_zoom"],
        )
        self.map_title = pn.pane.Markdown(
            pn.bind(self._map_title, self.model, self.layer, self.map_quarter),
            css_classes=["geodbk-map-title"],
            margin=(0, 10),
        )
        self.target.param.watch(self._on_target, "value")
        self.model.param.watch(self._on_model, "value")
        self.layer.param.watch(self._on_layer, "value")
        self.map_quarter.param.watch(self._follow_map_quarter, "value")
        self._on_target()

    # -- state that follows the widgets ------------------------------------------------------
    @property
    def fit(self) -> Fit | None:
        return self.model.value

    def _quarter(self, fit: Fit | None) -> str | None:
        """The quarter the map shows: the slider's, if the grid has it, else the grid's last
        (``None`` for a time-free model)."""
        if fit is None:
            return None
        return shown_quarter(fit.grid(), self.map_quarter.value, fit.model().latest_quarter)

    def _on_target(self, *_: object) -> None:
        fits = self.catalog.for_target(self.target.value)
        if fits:
            self.notice.visible = False
        else:
            self.notice.object = (
                f"No model in this run was trained on **{self.target.value}** "
                f"(it has: {', '.join(self.catalog.targets)}). "
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
        grid = fit.grid()
        with pn.io.hold():
            self._update_layer_choices(grid)
            self._update_map_quarters(grid)
        self._reset_clim()
        for button, path in ((self.geotiff, fit.geotiff_path), (self.test_geojson, fit.test_tiles_path)):
            button.disabled = not path.exists()
            if path.exists():
                button.file = str(path)
                button.filename = f"{fit.run.name}_{path.name}"
        # the run's GeoTIFF holds the last mapped quarter only
        mapped = grid_quarters(grid)
        self.geotiff.label = f"GeoTIFF of the map ({mapped[-1]})" if len(mapped) > 1 else "GeoTIFF of the map"

    def _update_layer_choices(self, grid: xr.Dataset | None) -> None:
        """Offer the layers this grid has; keep the current one if it is among them."""
        options = layer_options(grid)
        value = self.layer.value if self.layer.value in options.values() else DEFAULT_LAYER
        self.layer.param.update(options=options, value=value)

    def _update_map_quarters(self, grid: xr.Dataset | None) -> None:
        """The slider's quarters are the grid's; hidden for a 2-D grid (one quarter or time-free)."""
        quarters = grid_quarters(grid)
        if len(quarters) > 1:
            value = self.map_quarter.value if self.map_quarter.value in quarters else quarters[-1]
            self.map_quarter.param.update(options=quarters, value=value, visible=True)
        else:
            only = quarters or ["latest"]
            self.map_quarter.param.update(options=only, value=only[0], visible=False)
        self._enable_map_quarter()

    def _enable_map_quarter(self) -> None:
        """Change layers are one map between two quarters: the slider does not apply to them."""
        self.map_quarter.disabled = not LAYER_BY_KEY.get(self.layer.value, LAYER_BY_KEY[DEFAULT_LAYER]).per_quarter

    def _on_layer(self, *_: object) -> None:
        """A new layer: its own colour limits, and the slider only for per-quarter layers."""
        self._enable_map_quarter()
        self._reset_clim()

    def _follow_map_quarter(self, event: object) -> None:
        """The observed-tiles overlay follows the map's quarter (unless it shows all quarters)."""
        if self.quarter.value != ALL_QUARTERS and self.map_quarter.value in self.quarter.options:
            self.quarter.value = self.map_quarter.value

    def _layer(self, fit: Fit) -> Layer:
        return resolve_layer(self.layer.value, fit.grid())

    def _reset_clim(self, *_: object) -> None:
        """Colour limits of the layer over all quarters, so that colours compare between quarters."""
        fit = self.fit
        grid = fit.grid() if fit else None
        if grid is None:
            return
        layer = self._layer(fit)
        limits = colour_limits(grid[layer_variable(layer, grid)].to_numpy(), layer)
        if limits is None:
            return
        start, end, value = limits
        step = max((end - start) / 200.0, 1e-6)
        with pn.io.hold():
            self.clim.param.update(start=start, end=end, step=step, value=value)

    def _map_title(self, fit: Fit | None, layer_key: str, quarter_value: str) -> str:
        """What the map shows: model, layer, and its quarter (or the change's two quarters)."""
        if fit is None or fit.grid() is None:
            return ""
        grid = fit.grid()
        layer = resolve_layer(layer_key, grid)
        when = self._quarter(fit) if layer.per_quarter else f"change {change_span(grid)}"
        when = f" · {when}" if when else ""
        click = "click the map to see the kernel slice and time series there"
        return f"**{fit.kind}** · {layer_label(layer, grid)}{when} · {click}"

    def _shown_tiles_geojson(self) -> io.BytesIO:
        fit = self.fit
        frame = tiles_in_quarter(fit.dataset().frame, self.quarter.value) if fit else None
        return io.BytesIO(tiles_geojson(frame).encode("utf-8"))

    def _summary_csv(self) -> io.BytesIO:
        """The area summary table shown (every column of summarize_polygons), as CSV."""
        fit = self.fit
        if fit is None or self.polygons is None or not fit.model().has_kernel:
            return io.BytesIO(b"")
        try:
            summary = fit.polygon_summary(self.polygons, self._quarter(fit))
        except (GeodbkError, OSError):  # the page already says why there is no table
            return io.BytesIO(b"")
        return io.BytesIO(summary.to_csv(index=False).encode("utf-8"))

    # -- the map ---------------------------------------------------------------------------
    def _raster(self, fit: Fit | None, layer_key: str, clim: tuple[float, float], quarter_value: str) -> hv.Image:
        """The selected grid variable of the selected model at the slider's quarter, in Web Mercator,
        carrying the hover readout of each cell at that quarter (change layers included)."""
        if fit is None or fit.grid() is None:
            return hv.Image([])
        grid = fit.grid()
        layer = resolve_layer(layer_key, grid)
        name = layer_variable(layer, grid)
        units = grid[name].attrs.get("units", "")
        label = f"{layer_label(layer, grid)} [{units}]"
        quarter = self._quarter(fit)
        cells = xr.Dataset(
            {"mean": fit.mercator_layer("mean", quarter), "sd": fit.mercator_layer("sd", quarter)}, attrs=grid.attrs
        )
        readout = cell_readout(cells)
        shown = readout.assign({name: fit.mercator_layer(name, quarter if layer.per_quarter else None)})
        readout_lines = readout_tooltips(
            readout,
            units=grid_units(grid)[1],
            quarter=quarter,
            p_below_label=layer_label(LAYER_BY_KEY["p_below"], grid),
        )
        vdims = [hv.Dimension(name, label=label), *readout.data_vars]
        return hv.Image(shown, kdims=["x", "y"], vdims=vdims).opts(
            cmap=layer_cmap(layer, grid),
            logz=layer.logz,
            clim=tuple(clim),
            colorbar=True,
            alpha=0.85,
            **raster_hover(label, readout_lines),
        )

    def _vector_layers(self, fit: Fit | None, quarter: str, overlays: list[str]) -> hv.Overlay:
        """Urban/rural tiles, observed tiles of the quarter, region outline, polygons (empty when hidden)."""
        columns = ["lon", "lat", "value", "urban_rural", "year", "quarter"]
        frame = fit.dataset().frame[columns] if fit else pd.DataFrame(columns=columns)
        return vector_overlay(
            urban=frame.drop_duplicates(["lon", "lat"]) if "urban/rural" in overlays else frame.iloc[:0],
            observed=tiles_in_quarter(frame, quarter) if "observed tiles" in overlays and fit else frame.iloc[:0],
            outline=outline_paths(fit.dataset().region.geometry) if "region outline" in overlays and fit else [],
            polygons=self._polygon_outlines(fit) if "polygons" in overlays else [],
            label=f"observed {fit.dataset().target} [{fit.dataset().units}]" if fit else "observed value",
        )

    def _polygon_outlines(self, fit: Fit | None) -> list[np.ndarray]:
        """Outlines of the summary polygons that meet the region (none if the file cannot be read)."""
        if fit is None or self.polygons is None:
            return []
        try:
            polygons = fit.region_polygons(self.polygons)
        except (GeodbkError, OSError):
            return []
        return [ring for geometry in polygons.geometry for ring in outline_paths(geometry)]

    def _reference_marker(self, x: float | None, y: float | None) -> hv.Points:
        """A cross at the kernel slice's reference point (the last click)."""
        fit = self.fit
        if fit is None:
            return hv.Points(np.empty((0, 2))).opts(color="red", marker="x", size=14, line_width=3)
        lon, lat = self._point(fit, x, y)
        return hv.Points([lonlat_to_mercator(lon, lat)]).opts(color="red", marker="x", size=14, line_width=3)

    # -- what a click shows ------------------------------------------------------------------
    @staticmethod
    def _point(fit: Fit, x: float | None, y: float | None) -> tuple[float, float]:
        """lon/lat of the last click, or the default reference point before the first one."""
        return fit.default_reference() if x is None or y is None else mercator_to_lonlat(x, y)

    def kernel_view(
        self, fit: Fit | None, x: float | None, y: float | None, kind: str, quarter_value: str
    ) -> pn.viewable.Viewable:
        """Kernel slice (correlation or covariance) at the clicked point and the map's quarter,
        and the predictive density there."""
        if fit is None or fit.grid() is None:
            return pn.pane.Markdown("Pick a model run with a saved grid.")
        grid = fit.grid()
        lon, lat = self._point(fit, x, y)
        model = fit.model()
        quarter = self._quarter(fit)  # the quarter the raster shows (None: a time-free model)
        point = PointPrediction.from_prediction(model.predict(np.array([[lon, lat]]), quarter))
        plot = density_plot(point, fit.dataset().units, width=SIDE_WIDTH, height=190)
        density = pn.pane.HoloViews(plot, css_classes=["geodbk-density"])
        if not model.has_kernel:  # the knn and dnn baselines
            return pn.Column(
                self._reference_pane(fit, lon, lat, quarter, point, kind, None),
                pn.pane.Alert(
                    f"{fit.kind} is not a GP: it has no kernel to slice", alert_type="secondary", width=SIDE_WIDTH
                ),
                density,
            )
        lonlat, inside = grid_cells_lonlat(grid)
        var_x = fit.prior_variance(quarter) if kind == "correlation" else None
        values = slice_at_cells(model, lonlat, (lon, lat), quarter, kind, var_x)
        if kind == "correlation":
            label, title = "ρ(x, x_ref)", f"correlation with ({lon:.4f}, {lat:.4f})"
        else:
            label, title = f"k(x, x_ref) [{slice_units(fit.dataset().units)}]", f"k(·, x_ref) at ({lon:.4f}, {lat:.4f})"
        plot = kernel_slice_plot(
            on_cells(grid, inside, values, "k"),
            (lon, lat),
            fit.dataset().region.geometry,
            label=label,
            title=title,
            width=SIDE_WIDTH,
            height=260,
        )
        # text and plots are replaced together, so the text never describes an older click
        return pn.Column(
            self._reference_pane(fit, lon, lat, quarter, point, kind, values),
            pn.pane.HoloViews(plot, css_classes=["geodbk-kernel"]),
            density,
        )

    @staticmethod
    def _reference_pane(
        fit: Fit, lon: float, lat: float, quarter: str | None, point: PointPrediction, kind: str, k: np.ndarray | None
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
            f"**Reference point** lon {lon:.4f}, lat {lat:.4f}" + (f" · {quarter}" if quarter else "") + "  \n"
            f"Predicted median **{point.median:.1f} {units}**, "
            f"95% PI [{point.lower:.1f}, {point.upper:.1f}] {units}  \n"
            f"log10: mean {point.mean:.3f}, sd {point.sd:.3f}, PI width {point.pi_width:.3f}  \n"
            f"{kernel}"
        )
        return pn.pane.Markdown(text, css_classes=["geodbk-ref"], width=SIDE_WIDTH)

    def series_view(
        self, fit: Fit | None, x: float | None, y: float | None, quarter_value: str
    ) -> pn.viewable.Viewable:
        """The predictive median and 95% band at the clicked point over every fitted quarter (one
        ``predict_series`` call), with the observed tiles within NEAR_KM of it."""
        if fit is None:
            return pn.pane.Markdown("")
        model = fit.model()
        quarters = list(model.info.quarters)
        if model.latest_quarter is None or not quarters:
            return pn.pane.Alert(
                f"{fit.kind} is time-free (paper protocol): no time series", alert_type="secondary", width=SIDE_WIDTH
            )
        lon, lat = self._point(fit, x, y)
        series = Series.from_predictions(quarters, model.predict_series(np.array([[lon, lat]]), quarters))
        dataset = fit.dataset()
        observed = observed_near(dataset.frame, lon, lat)
        title = f"time series at ({lon:.4f}, {lat:.4f}): {len(quarters)} quarters"
        plot = series_plot(
            series,
            observed,
            target=dataset.target,
            units=dataset.units,
            title=title,
            current=self._quarter(fit),
            width=SIDE_WIDTH,
            height=300,
        )
        text = (
            f"**Time series** at lon {lon:.4f}, lat {lat:.4f}: {len(quarters)} quarters "
            f"({quarters[0]}–{quarters[-1]}), median {series.median[0]:.1f} → {series.median[-1]:.1f} {dataset.units}; "
            f"{len(observed)} observed tile-quarters within {NEAR_KM:g} km"
        )
        return pn.Column(
            pn.pane.HoloViews(plot, css_classes=["geodbk-series"]),
            pn.pane.Markdown(text, css_classes=["geodbk-series-text"], width=SIDE_WIDTH),
        )

    # -- tables and class comparison ---------------------------------------------------------
    def metrics_view(self, fit: Fit | None) -> pn.viewable.Viewable:
        if fit is None:
            return pn.pane.Markdown("")
        path = fit.files.metrics_csv
        if not path.exists():
            return pn.pane.Markdown(f"No `metrics.csv` in `{fit.run}`.")
        mine, table = metrics_tables(path, fit.kind)
        return pn.Column(
            pn.pane.Markdown(f"**Test metrics of {fit.kind} by class** (log10 {fit.target})"),
            pn.pane.DataFrame(mine, sizing_mode="stretch_width", css_classes=["geodbk-metrics"]),
            pn.pane.Markdown("**All models in this run**"),
            pn.pane.DataFrame(table, sizing_mode="stretch_width", max_rows=60),
            width=SIDE_WIDTH,
        )

    def summary_view(self, fit: Fit | None, quarter_value: str) -> pn.viewable.Viewable:
        """The area summary table of the selected model over the polygon file, at the map's quarter."""
        if fit is None or self.polygons is None:
            return pn.pane.Markdown("", visible=False)
        name = self.polygons.name
        if not fit.model().has_kernel:
            return pn.pane.Alert(
                f"Area summaries over `{name}` need a GP model (the joint posterior); {fit.kind} is not one.",
                alert_type="secondary",
                width=PANEL_WIDTH,
                css_classes=["geodbk-summary-note"],
            )
        quarter = self._quarter(fit)
        try:
            if len(fit.region_polygons(self.polygons)) == 0:
                return pn.pane.Alert(
                    f"No polygon of `{name}` meets the region of this run.",
                    alert_type="secondary",
                    width=PANEL_WIDTH,
                    css_classes=["geodbk-summary-note"],
                )
            summary = fit.polygon_summary(self.polygons, quarter)
        except (GeodbkError, OSError) as err:
            return pn.pane.Alert(
                f"No area summary: {err}", alert_type="warning", width=PANEL_WIDTH, css_classes=["geodbk-summary-note"]
            )
        units = fit.dataset().units
        threshold = summary["threshold"].iloc[0] if "threshold" in summary else None
        below = f"; share_below = expected share of the area under {threshold:g} {units}" if threshold else ""
        heading = (
            f"**Area summary** · {len(summary)} polygons of `{name}` · {fit.kind} · {quarter or 'all quarters'}  \n"
            f"<small>area median and 95% interval in {units} (joint posterior){below}</small>"
        )
        return pn.Column(
            pn.pane.Markdown(heading, css_classes=["geodbk-summary-title"]),
            pn.pane.DataFrame(
                summary_table(summary, units),
                index=False,
                width=PANEL_WIDTH,
                max_height=320,
                stylesheets=[":host { overflow-y: auto; }"],
                css_classes=["geodbk-summary"],
            ),
            self.summary_csv,
        )

    def pi_width_view(self, fit: Fit | None) -> pn.viewable.Viewable:
        if fit is None:
            return pn.pane.Markdown("")
        frame = fit.test_tiles()
        violin = hv.Violin(frame, "urban_rural", hv.Dimension("pi_width", label="95% PI width (log10)")).opts(
            violin_fill_color="urban_rural",
            cmap=URBAN_COLOURS,
            inner="box",
            width=PANEL_WIDTH,
            height=260,
            toolbar=None,
            title=f"95% PI width at the test tiles by class ({fit.kind})",
        )
        return pn.pane.HoloViews(violin, css_classes=["geodbk-violin"])

    # -- layout ------------------------------------------------------------------------------
    def view(self) -> pn.viewable.Viewable:
        tap = (self.tap.param.x, self.tap.param.y)
        kernel = pn.bind(self.kernel_view, self.model, *tap, self.slice_kind, self.map_quarter)
        series = pn.bind(self.series_view, self.model, *tap, self.map_quarter)
        controls = pn.Row(
            pn.Column(
                pn.Row(self.target, self.quarter),
                self.model,
                self.map_quarter,
                self.clim,
                self.overlays,
                self.basemap,
            ),
            self.layer,
            pn.Column(self.geotiff, self.test_geojson, self.tiles_geojson),
        )
        return pn.Column(
            pn.pane.Markdown("## geodbk · Deep Basis Kernel GP maps of mobile internet speed", margin=(0, 10)),
            self.notice,
            self.problems,
            controls,
            self.map_title,
            pn.pane.HoloViews(self.map, sizing_mode="stretch_width", css_classes=["geodbk-map"]),
            pn.Row(
                pn.Column(
                    pn.bind(self.summary_view, self.model, self.map_quarter),
                    pn.bind(self.pi_width_view, self.model),
                ),
                pn.Column(
                    self.slice_kind,
                    pn.panel(kernel, defer_load=False),
                    pn.panel(series, defer_load=False),
                    pn.bind(self.metrics_view, self.model),
                ),
            ),
            pn.pane.Markdown(f"<small>{OOKLA_ATTRIBUTION}</small>", width=PANEL_WIDTH + SIDE_WIDTH),
            sizing_mode="stretch_width",
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


def create_app(runs: list[Path], *, basemap: bool, polygons: Path | None = None) -> pn.viewable.Viewable:
    """The page for the given run folders, with or without the basemap (and, optionally, a polygon
    file to summarise over)."""
    catalog = Catalog.scan(runs)
    if not catalog.fits:
        return missing_runs_page(catalog)
    return Dashboard(catalog, basemap=basemap, polygons=polygons).view()


if pn.state.served:
    _args = parse_args(sys.argv[1:])
    create_app(_args.run, basemap=not _args.no_basemap, polygons=_args.polygons).servable(title="geodbk dashboard")
