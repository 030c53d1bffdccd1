"""HoloViews plots of the dashboard (``apps/dashboard.py``): the basemap, the map's hover readout
and vector layers, the kernel slice, the predictive density and the time series at a clicked point.

Each takes plain values (grids, frames, :mod:`geodbk.viewer` objects) and returns HoloViews
elements; the logic behind them (catalog, cells, units, layers) is in :mod:`geodbk.viewer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import holoviews as hv
import numpy as np
import pandas as pd
import shapely
import xarray as xr
from bokeh.models import CustomJSHover
from holoviews.plotting.bokeh.element import ElementPlot

from geodbk.quarters import Quarter
from geodbk.viewer import NEAR_KM, READOUT_VARIABLES, PointPrediction, Series, quarter_dates
from geodbk.viewer.mercator import circle_mercator, lonlat_to_mercator, mercator_raster, outline_paths, with_mercator

URBAN_COLOURS = {"urban": "#d95f02", "rural": "#1b9e77"}


def raster_hover(label: str, readout: Sequence[tuple[str, str]] = ()) -> dict:
    """Hover options for a Web Mercator ``hv.Image``: lon/lat in degrees (not metres), the value,
    then the ``readout`` lines (see :func:`readout_tooltips`)."""
    radius = 6378137.0  # the spherical Web Mercator radius, metres
    to_degrees = {
        "$x": CustomJSHover(code=f"return (value / {radius} * 180 / Math.PI).toFixed(4)"),
        "$y": CustomJSHover(
            code=f"return ((2 * Math.atan(Math.exp(value / {radius})) - Math.PI / 2) * 180 / Math.PI).toFixed(4)"
        ),
    }
    return {
        "tools": ["hover"],
        "hover_tooltips": [("lon", "$x{custom}"), ("lat", "$y{custom}"), (label, "@image{0.000}"), *readout],
        "hover_formatters": to_degrees,
    }


def readout_tooltips(
    readout: xr.Dataset, *, units: str, quarter: str | None, p_below_label: str
) -> list[tuple[str, str]]:
    """Hover lines of a :func:`geodbk.viewer.units.cell_readout`, carried by the map's raster as
    extra value dimensions: the median and 95% interval in ``units`` (Mbps or ms) at ``quarter``,
    and P(below the threshold) when the readout has it."""
    median, lower, upper, p_below = READOUT_VARIABLES
    when = f" ({quarter})" if quarter else ""
    lines = [
        (f"median{when}", f"@{median}{{0.0}} {units}"),
        ("95% interval", f"@{lower}{{0.0}} – @{upper}{{0.0}} {units}"),
    ]
    if p_below in readout:
        lines.append((p_below_label, f"@{p_below}{{0.00}}"))
    return lines


def basemap_tiles(shown: bool) -> hv.Tiles:
    """CARTO's light OpenStreetMap tiles under the map; when not ``shown`` their renderer is
    hidden (not drawn). Offline, serve with ``--no-basemap``: BokehJS still fetches a hidden
    layer's tiles."""

    def show(plot: ElementPlot, element: hv.Tiles) -> None:
        plot.handles["glyph_renderer"].visible = shown

    return hv.element.tiles.CartoLight().opts(hooks=[show])


# --- plots ----------------------------------------------------------------------------------
def vector_overlay(
    *, urban: pd.DataFrame, observed: pd.DataFrame, outline: list, polygons: list, label: str
) -> hv.Overlay:
    """The map's vector layers: urban/rural tiles, observed tiles (coloured by value), the region
    outline and the summary polygons' outlines. Always the same four layers (hidden ones empty),
    as a DynamicMap cannot add layers after its first frame."""
    value = hv.Dimension("value", label=label)
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
                hover_tooltips=[(label, "@value"), ("class", "@urban_rural"), ("lon", "@lon"), ("lat", "@lat")],
            ),
            hv.Path(outline).opts(color="black", line_width=1.2),
            hv.Path(polygons).opts(color="#404040", line_width=0.8, line_dash="dashed"),
        ]
    )


def kernel_slice_plot(
    k_slice: xr.DataArray,
    ref: tuple[float, float],
    region: shapely.Geometry,
    *,
    label: str,
    title: str,
    width: int,
    height: int,
    radius_km: float | None = None,
    correlation: bool = False,
) -> hv.Overlay:
    """A kernel slice (2-D grid variable) with the region outline and its reference point: a
    correlation on a diverging map from -1 to 1; a covariance on a diverging map centred on 0
    when it changes sign, else a sequential one; with
    ``radius_km``, a dashed circle of that radius around the point (where a correlation falls to 0.5)."""
    signed = bool(np.nanmin(k_slice.to_numpy()) < 0)
    image = hv.Image(mercator_raster(k_slice), kdims=["x", "y"], vdims=[hv.Dimension("k", label=label)])
    if correlation:  # one scale for every correlation, so that prior and posterior compare
        image = image.opts(cmap="RdBu_r", clim=(-1.0, 1.0), colorbar=True, **raster_hover(label))
    else:
        image = image.opts(
            cmap="RdBu_r" if signed else "viridis", symmetric=signed, colorbar=True, **raster_hover(label)
        )
    marker = hv.Points([lonlat_to_mercator(*ref)]).opts(color="red", marker="x", size=12, line_width=3)
    outline = hv.Path(outline_paths(region)).opts(color="black", line_width=0.8)
    circle = hv.Path([circle_mercator(*ref, radius_km)] if radius_km else []).opts(
        color="red", line_width=1.5, line_dash="dashed"
    )
    return (image * outline * circle * marker).opts(
        width=width, height=height, xaxis=None, yaxis=None, data_aspect=1, toolbar=None, title=title
    )


def density_plot(point: PointPrediction, units: str, *, width: int, height: int) -> hv.Overlay:
    """The Gaussian predictive density of log10(value) at a point, its 95% interval shaded."""
    mean, sd = point.mean, point.sd
    grid = np.linspace(mean - 4 * sd, mean + 4 * sd, 200)
    density = np.exp(-0.5 * ((grid - mean) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
    xdim = hv.Dimension("log10_value", label=f"log10({units})")
    inner = (grid >= point.log_lower) & (grid <= point.log_upper)
    band = hv.Area((grid[inner], density[inner]), xdim, "density").opts(color="#9ecae1", line_alpha=0)
    curve = hv.Curve((grid, density), xdim, "density").opts(color="#08519c")
    centre = hv.VLine(mean).opts(color="#08519c", line_dash="dashed")
    return (band * curve * centre).opts(
        width=width,
        height=height,
        toolbar=None,
        title=f"predictive: median {point.median:.1f} {units}, 95% PI [{point.lower:.1f}, {point.upper:.1f}]",
    )


def series_plot(
    series: Series,
    observed: pd.DataFrame,
    *,
    target: str,
    units: str,
    title: str,
    current: Quarter | None,
    width: int,
    height: int,
) -> hv.Overlay:
    """Median and 95% band over quarters, the observed tiles as points, the map's quarter as a line.

    The bokeh data columns are named ``series_median`` (one row per quarter) and
    ``observed_value`` (one row per observed tile), which the browser tests read.
    """
    x = hv.Dimension("quarter_start", label="quarter")
    y_label = f"{target} [{units}]"
    dates = quarter_dates(series.quarters)
    labels = np.asarray([str(quarter) for quarter in series.quarters], dtype=object)
    band = hv.Area(
        (dates, series.lower, series.upper),
        x,
        [hv.Dimension("series_lower", label=y_label), "series_upper"],
        label="95% PI",
    ).opts(color="#9ecae1", alpha=0.6, line_alpha=0)
    hover = [
        ("quarter", "@quarter"),
        ("median", "@series_median{0.0}"),
        ("95% PI", "@series_lower{0.0} - @series_upper{0.0}"),
    ]
    curve = hv.Curve(
        (dates, series.median, labels, series.lower, series.upper),
        x,
        [hv.Dimension("series_median", label=y_label), "quarter", "series_lower", "series_upper"],
        label="predictive median",
    ).opts(color="#08519c", line_width=2, tools=["hover"], hover_tooltips=hover)
    points = hv.Scatter(
        observed,
        x,
        [hv.Dimension("observed_value", label=y_label), "quarter_label", "tests", "split", "distance_km"],
        label=f"observed tiles within {NEAR_KM:g} km",
    ).opts(
        color="#d95f02",
        size=5,
        alpha=0.8,
        tools=["hover"],
        hover_tooltips=[
            ("quarter", "@quarter_label"),
            (y_label, "@observed_value{0.0}"),
            ("tests", "@tests"),
            ("split", "@split"),
            ("distance", "@distance_km{0.00} km"),
        ],
    )
    layers = band * curve * points
    if current in series.quarters:
        layers = layers * hv.VLine(quarter_dates([current])[0]).opts(color="grey", line_dash="dotted")
    values = np.concatenate([series.lower, series.upper, observed["observed_value"].to_numpy(np.float64)])
    low, high = float(values.min()) / 1.25, float(values.max()) * 1.25
    pad = pd.Timedelta(days=45)
    step = max(1, int(np.ceil(len(dates) / 6)))  # at most about six quarter labels
    xticks = [
        (date.value / 1e6, label) for date, label in zip(dates[::-step][::-1], labels[::-step][::-1], strict=True)
    ]
    return layers.opts(
        width=width,
        height=height,
        logy=True,
        toolbar=None,
        title=title,
        show_legend=True,
        legend_position="bottom",
        legend_cols=3,
        ylabel=y_label,
        xticks=xticks,
        yticks=log_ticks(low, high),
        xlim=(dates.min() - pad, dates.max() + pad),
        ylim=(low, high),
    )


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks from ``low`` to ``high`` (positive) for a log axis: 10, 20, 50, 100, ..."""
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    candidates = (float(f"{m}e{d}") for d in decades for m in (1, 2, 5))
    ticks = [tick for tick in candidates if low <= tick <= high]
    return ticks or [low, high]
