"""Interactive Panel dashboard over one or more geodbk run folders.

Serve it with ``geodbk serve --run outputs/demo`` or
``panel serve apps/dashboard.py --args --run outputs/demo``.

A run folder is what ``geodbk demo`` writes (see ``docs/architecture.md``): the dataset,
one fitted :class:`geodbk.fit.geomodel.GeoModel` per model kind, the metrics table and the
prebuilt prediction grids. Nothing is trained when the page opens: the map layers come from
the saved grids (one map per fitted quarter, chosen with the quarter slider, plus the change
between two quarters), and only what follows a click is computed live: the map model's
correlation with the clicked point over the grid cells, after the data (``GeoModel.posterior``)
or before (``GeoModel.kernel_slice``), with the distance at which it falls to 0.5, or the prior
covariance; the predictive distribution there and its time series over every fitted quarter
(one ``GeoModel.predict_series``).

A "Decisions" tab beside the map shows, for a model of download and upload whose run folder
has a hexagon table (``decisions/<kind>_h3.parquet``), its H3 hexagons coloured by P(meets) of
a benchmark chosen among 5/1, 7/1 and 35/3 Mbps (recomputed from the table), with a hover
readout, and the plan's next visits (``decisions/<kind>_plan.parquet``) outlined and ranked
(``apps/dashboard_decisions.py``); for any other model a one-line note says how to get one.

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
:mod:`geodbk.viewer` (run-folder catalog, grid cells, kernel slices, units, layers); the map
layers and panels are the methods of ``apps/dashboard_panels.py``'s ``DashboardViews``, and
their HoloViews plots are built in ``apps/dashboard_views.py``.
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
import panel as pn
import xarray as xr
from dashboard_decisions import DecisionViews
from dashboard_panels import (
    DEFAULT_RUN,
    MAP_MAX_HEIGHT,
    MAP_MIN_HEIGHT,
    OOKLA_ATTRIBUTION,
    PANEL_WIDTH,
    SIDE_WIDTH,
    SLICE_KINDS,
    TARGETS,
    DashboardViews,
)
from dashboard_views import (
    basemap_tiles,
)
from holoviews import streams

from geodbk.errors import GeodbkError
from geodbk.quarters import Quarter
from geodbk.viewer import (
    ALL_QUARTERS,
    BENCHMARK_CHOICES,
    DEFAULT_LAYER,
    LAYER_BY_KEY,
    Catalog,
    Fit,
    Layer,
    change_span,
    colour_limits,
    grid_quarters,
    layer_label,
    layer_options,
    layer_variable,
    resolve_layer,
    shown_quarter,
    tiles_geojson,
    tiles_in_quarter,
)

hv.extension("bokeh")
pn.extension(notifications=False)

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
class Dashboard(DashboardViews, DecisionViews):
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
            name="Kernel slice", options=list(SLICE_KINDS), value=SLICE_KINDS[0], width=SIDE_WIDTH,
            css_classes=["geodbk-slice-kind"],
        )  # fmt: skip
        self.benchmark = pn.widgets.RadioButtonGroup(
            name="Benchmark", options=list(BENCHMARK_CHOICES), value="35/3", css_classes=["geodbk-benchmark"]
        )
        self.decision_text = pn.pane.Markdown("", css_classes=["geodbk-decisions-text"])
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
        self.benchmark.param.watch(self._recolour, "value")
        self._on_target()

    # -- state that follows the widgets ------------------------------------------------------
    @property
    def fit(self) -> Fit | None:
        return self.model.value

    def _quarter(self, fit: Fit | None) -> Quarter | None:
        """The quarter the map shows: the slider's, if the grid has it, else the grid's last
        (``None`` for a time-free model)."""
        if fit is None:
            return None
        label = self.map_quarter.value  # the slider's options are quarter labels, or "latest" alone
        wanted = None if label == "latest" else Quarter.parse(label)
        return shown_quarter(fit.grid(), wanted, fit.model().latest_quarter)

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
        quarters = [str(quarter) for quarter in fit.dataset().quarters]  # the widget's labels
        self.quarter.options = [ALL_QUARTERS] + quarters
        if self.quarter.value not in self.quarter.options:
            self.quarter.value = quarters[-1] if quarters else ALL_QUARTERS
        self._follow_benchmark_options(fit)
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
        """The slider's quarters are the grid's (its model's fitted quarters, for a run's map), as
        labels; hidden for a 2-D grid (one quarter or time-free)."""
        quarters = [str(quarter) for quarter in grid_quarters(grid)]
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
        click = "click the map to see which places inform it (correlation) and its time series"
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
            pn.Tabs(
                (
                    "Speed map",
                    pn.Column(
                        self.map_title,
                        pn.pane.HoloViews(self.map, sizing_mode="stretch_width", css_classes=["geodbk-map"]),
                        sizing_mode="stretch_width",
                    ),
                ),
                ("Decisions", pn.panel(pn.bind(self.decision_view, self.model), lazy=True, defer_load=False)),
                dynamic=True,
                sizing_mode="stretch_width",
                css_classes=["geodbk-tabs"],
            ),
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
