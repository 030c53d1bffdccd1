"""The dashboard's views: the map layers and the panels beside and under it, as methods of
:class:`DashboardViews`, which :class:`dashboard.Dashboard` (widgets, state and layout) inherits.

Kept apart from ``apps/dashboard.py`` so that each module stays under 450 lines; like the rest
of the page, the views compute nothing themselves: they call :mod:`geodbk.viewer` and build
HoloViews plots with ``apps/dashboard_views.py``.
"""

from __future__ import annotations

from pathlib import Path

import holoviews as hv
import numpy as np
import pandas as pd
import panel as pn
import xarray as xr
from dashboard_views import (
    URBAN_COLOURS,
    density_plot,
    kernel_slice_plot,
    raster_hover,
    readout_tooltips,
    series_plot,
    vector_overlay,
)

from geodbk.errors import GeodbkError
from geodbk.viewer import (
    LAYER_BY_KEY,
    NEAR_KM,
    Fit,
    HalfDistance,
    PointPrediction,
    Series,
    cell_km,
    cell_readout,
    distance_km,
    grid_cells_lonlat,
    grid_units,
    half_distance,
    layer_cmap,
    layer_label,
    layer_variable,
    lonlat_to_mercator,
    mercator_to_lonlat,
    metrics_tables,
    observed_near,
    on_cells,
    outline_paths,
    resolve_layer,
    slice_at_cells,
    slice_units,
    summary_table,
    tiles_in_quarter,
)

DEFAULT_RUN = Path("outputs/demo")
TARGETS = ("download", "upload", "latency")
PANEL_WIDTH = 620  # pixels: the area summary and the PI-width violin (the map fills the page width)
MAP_MIN_HEIGHT, MAP_MAX_HEIGHT = 300, 720  # pixels: the map's height follows its width and the region's shape
SIDE_WIDTH = 430
#: What the slice under the map shows of the map model's covariance with the clicked point.
POSTERIOR, PRIOR, COVARIANCE = "posterior correlation", "prior correlation", "prior covariance"
SLICE_KINDS = (POSTERIOR, PRIOR, COVARIANCE)
OOKLA_ATTRIBUTION = (
    "Speedtest® by Ookla® Global Fixed and Mobile Network Performance Maps. Based on analysis "
    "by Ookla of Speedtest Intelligence® data. Ookla trademarks used under license."
)



class DashboardViews:
    """The map layers and panels of :class:`dashboard.Dashboard`, which owns the widgets and state
    (``self.catalog``, ``self.polygons``, ``self.basemap`` and the widgets) that they read."""

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
        """The map model's covariance with the clicked point at the map's quarter, as a posterior
        or prior correlation (with the distance at which it falls to 0.5) or a prior covariance,
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
        half = None
        if kind == COVARIANCE:
            values = slice_at_cells(model, lonlat, (lon, lat), quarter, "covariance")
            label, title = f"k(x, x_ref) [{slice_units(fit.dataset().units)}]", f"k(·, x_ref) at ({lon:.4f}, {lat:.4f})"
        else:
            if kind == POSTERIOR:
                values = fit.posterior_correlation((lon, lat), quarter)
            else:
                values = slice_at_cells(model, lonlat, (lon, lat), quarter, "correlation", fit.prior_variance(quarter))
            distance = distance_km(lonlat[:, 0], lonlat[:, 1], lon, lat)
            half = half_distance(distance, values, cell_km(lonlat))
            label, title = "ρ(x, x_ref)", f"{kind} with ({lon:.4f}, {lat:.4f})"
        plot = kernel_slice_plot(
            on_cells(grid, inside, values, "k"),
            (lon, lat),
            fit.dataset().region.geometry,
            label=label,
            title=title,
            width=SIDE_WIDTH,
            height=260,
            radius_km=half.km if half is not None else None,
            correlation=kind != COVARIANCE,
        )
        # text and plots are replaced together, so the text never describes an older click
        return pn.Column(
            self._reference_pane(fit, lon, lat, quarter, point, kind, values, half),
            pn.pane.HoloViews(plot, css_classes=["geodbk-kernel"]),
            density,
        )

    @staticmethod
    def _reference_pane(
        fit: Fit,
        lon: float,
        lat: float,
        quarter: str | None,
        point: PointPrediction,
        kind: str,
        k: np.ndarray | None,
        half: HalfDistance | None = None,
    ) -> pn.pane.Markdown:
        """The clicked point, its predictive distribution in data and log10 units, the slice's
        range and, for a correlation, the distance at which it falls to 0.5."""
        units = fit.dataset().units
        if k is None:
            kernel = "no kernel (not a GP)"
        else:
            kernel = (
                f"{kind} over the grid: min {np.nanmin(k):.4f}, median {np.nanmedian(k):.4f}, max {np.nanmax(k):.4f}"
            )
        if half is not None:
            reach = "the dashed circle: the cells a visit here informs most" if half.km is not None else ""
            kernel += f"  \n{half.text()}" + (f"; {reach}" if reach else "")
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
        """The predictive median and 95% band at the clicked point over every fitted quarter
        (``model.info.fitted_quarters``, one ``predict_series`` call), with the observed tiles
        within NEAR_KM of it."""
        if fit is None:
            return pn.pane.Markdown("")
        model = fit.model()
        quarters = list(model.info.fitted_quarters)
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
        mine, table = metrics_tables(path, fit.kind, fit.target)
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

