"""Building blocks of the dashboard (``apps/dashboard.py``) that hold no widget state.

Map layers and their colour scales, Web Mercator helpers, per-quarter selection from a
saved grid, the time series at a clicked point and the polygon summary table. Everything
here takes plain values (grids, frames, arrays) and returns HoloViews elements, xarray
objects or frames, so the page class only wires widgets to these functions.

A grid comes in one of two layouts (see :mod:`geodbk.maps.schema`): per-quarter variables with
dims ``(time, y, x)`` and a ``quarter`` label coordinate (the default of ``geodbk demo``),
or 2-D ``(y, x)`` variables with the mapped quarter in the ``quarter`` attribute (``geodbk
demo --quarter``, or a time-free model without it).
"""

from __future__ import annotations

from dataclasses import dataclass

import holoviews as hv
import numpy as np
import pandas as pd
import pyproj
import rioxarray  # noqa: F401  (registers the .rio accessor used to reproject grids)
import shapely
import xarray as xr
from bokeh.models import CustomJSHover

from geodbk.prediction import Z95, to_data_units

#: Observed tiles within this distance of a clicked point are drawn on its time series.
NEAR_KM = 1.0
#: The observed-tiles quarter choice that shows every quarter.
ALL_QUARTERS = "all quarters"
URBAN_COLOURS = {"urban": "#d95f02", "rural": "#1b9e77"}
#: Mean Earth radius (km), for great-circle distances.
EARTH_RADIUS_KM = 6371.0088


# --- map layers -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """A map layer: the grid variable it shows and how it is labelled and coloured.

    Attributes:
        key: stable name (the layer widget's value).
        variable: grid variable; ``{u}`` is the data unit in lower case (``mbps``, ``ms``).
        label: button text; ``{target}``, ``{units}`` and ``{threshold}`` are filled in.
        cmap: colour map.
        scale: ``"range"`` (2nd-98th percentile), ``"probability"`` (0..1) or
            ``"symmetric"`` (centred on 0, for changes).
        logz: logarithmic colour scale.
        per_quarter: the variable has one map per quarter (else it is a change between two).
    """

    key: str
    variable: str
    label: str
    cmap: str
    scale: str = "range"
    logz: bool = False
    per_quarter: bool = True


LAYERS: tuple[Layer, ...] = (
    Layer("median", "mean_{u}", "Predictive median", "viridis", logz=True),
    Layer("sd", "sd", "Predictive sd (log10)", "magma"),
    Layer("pi_width", "pi_width", "95% PI width (log10)", "magma"),
    Layer("p_below", "p_below", "P({target} < {threshold} {units})", "YlOrRd", scale="probability"),
    Layer("change", "change", "Change (log10)", "RdBu", scale="symmetric", per_quarter=False),
    Layer("change_units", "change_{u}", "Change in {units}", "RdBu", scale="symmetric", per_quarter=False),
    Layer("change_sd", "change_sd", "Change sd (log10)", "magma", per_quarter=False),
    Layer("p_increase", "p_increase", "P(improvement)", "RdBu", scale="probability", per_quarter=False),
)
LAYER_BY_KEY = {layer.key: layer for layer in LAYERS}
DEFAULT_LAYER = "median"


def grid_units(grid: xr.Dataset) -> tuple[str, str]:
    """``(target, units)`` of a grid, e.g. ``("download", "Mbps")``."""
    return str(grid.attrs.get("target", "download")), str(grid.attrs.get("units", "Mbps"))


def layer_variable(layer: Layer, grid: xr.Dataset) -> str:
    """The grid variable of ``layer`` (``mean_mbps`` for the median of a Mbps grid)."""
    return layer.variable.format(u=grid_units(grid)[1].lower())


def layer_label(layer: Layer, grid: xr.Dataset) -> str:
    """Button text of ``layer`` for this grid: the threshold is read from ``p_below``'s attributes,
    and a latency grid's "improvement" is called an increase (lower latency is better)."""
    target, units = grid_units(grid)
    if layer.key == "p_below" and "p_below" in grid:
        attrs = grid["p_below"].attrs
        threshold = float(attrs.get("threshold", grid.attrs.get("threshold", np.nan)))
        units = str(attrs.get("threshold_units", units))
        return layer.label.format(target=target, units=units, threshold=f"{threshold:g}")
    if layer.key == "p_increase" and target == "latency":
        return "P(increase)"
    return layer.label.format(target=target, units=units, threshold="")


def layer_cmap(layer: Layer, grid: xr.Dataset) -> str:
    """Colour map of ``layer``: for latency the change maps are reversed, so that blue stays better."""
    if grid_units(grid)[0] == "latency" and layer.cmap == "RdBu":
        return "RdBu_r"
    return layer.cmap


def layer_options(grid: xr.Dataset | None) -> dict[str, str]:
    """``{button label: layer key}`` of the layers whose variable this grid has."""
    if grid is None:
        return {LAYER_BY_KEY[DEFAULT_LAYER].label: DEFAULT_LAYER}
    return {layer_label(layer, grid): layer.key for layer in LAYERS if layer_variable(layer, grid) in grid}


def resolve_layer(key: str | None, grid: xr.Dataset) -> Layer:
    """The layer ``key`` if the grid has it, else the predictive median."""
    layer = LAYER_BY_KEY.get(key or "", LAYER_BY_KEY[DEFAULT_LAYER])
    return layer if layer_variable(layer, grid) in grid else LAYER_BY_KEY[DEFAULT_LAYER]


def colour_limits(values: np.ndarray, layer: Layer) -> tuple[float, float, tuple[float, float]] | None:
    """``(slider start, slider end, (low, high))`` colour limits of ``layer`` over ``values``
    (all quarters, so that the colours mean the same on every quarter); ``None`` if all NaN."""
    if layer.scale == "probability":
        return 0.0, 1.0, (0.0, 1.0)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    if layer.scale == "symmetric":
        top = max(float(np.abs(finite).max()), 1e-6)
        edge = max(round(float(np.percentile(np.abs(finite), 98)), 4), 1e-4)
        return -top, top, (-edge, edge)
    lo, hi = (round(float(v), 4) for v in np.percentile(finite, [2, 98]))
    return float(finite.min()), float(finite.max()), (lo, hi)


# --- quarters of a grid ------------------------------------------------------------------
def grid_quarters(grid: xr.Dataset | None) -> list[str]:
    """Quarter labels of a grid: its ``quarter`` coordinate along ``time``, else the mapped
    quarter of a 2-D grid, else ``[]`` (a time-free model)."""
    if grid is None:
        return []
    if "time" in grid.dims and "quarter" in grid.coords:
        return [str(q) for q in grid["quarter"].to_numpy()]
    quarter = grid.attrs.get("quarter")
    return [str(quarter)] if quarter else []


def at_quarter(values: xr.DataArray, quarter: str | None) -> xr.DataArray:
    """The 2-D ``(y, x)`` map of a grid variable at ``quarter`` (the last one when ``quarter``
    is not in the grid), without the time coordinates; a 2-D variable is returned as it is."""
    if "time" in values.dims:
        labels = [str(q) for q in values["quarter"].to_numpy()] if "quarter" in values.coords else []
        values = values.isel(time=labels.index(quarter) if quarter in labels else -1)
    extra = [name for name in values.coords if name not in ("x", "y", "spatial_ref")]
    return values.drop_vars(extra)


def change_span(grid: xr.Dataset) -> str:
    """``"2022Q4 → 2023Q4"``: the quarters of a grid's change layers."""
    attrs = grid["change"].attrs if "change" in grid else {}
    start = attrs.get("quarter_from") or str(grid.attrs.get("change", "?:?")).split(":")[0]
    end = attrs.get("quarter_to") or str(grid.attrs.get("change", "?:?")).split(":")[-1]
    return f"{start} → {end}"


def tiles_in_quarter(frame: pd.DataFrame, quarter: str) -> pd.DataFrame:
    """Dataset rows of ``quarter`` (``"2023Q4"``), or every row for :data:`ALL_QUARTERS`."""
    if quarter == ALL_QUARTERS:
        return frame
    year, q = quarter.split("Q")
    return frame[(frame["year"] == int(year)) & (frame["quarter"] == int(q))]


# --- geometry: the map is drawn in Web Mercator (EPSG:3857), like web basemaps ---------------
TO_LONLAT = pyproj.Transformer.from_crs(3857, 4326, always_xy=True)
TO_MERCATOR = pyproj.Transformer.from_crs(4326, 3857, always_xy=True)


def mercator_to_lonlat(x: float, y: float) -> tuple[float, float]:
    """Web Mercator metres (the map's coordinates) -> lon/lat degrees."""
    lon, lat = TO_LONLAT.transform(x, y)
    return float(lon), float(lat)


def lonlat_to_mercator(lon: float, lat: float) -> tuple[float, float]:
    """lon/lat degrees -> Web Mercator metres."""
    x, y = TO_MERCATOR.transform(lon, lat)
    return float(x), float(y)


def with_mercator(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``easting``/``northing`` (EPSG:3857 metres) from its ``lon``/``lat`` columns."""
    easting, northing = TO_MERCATOR.transform(frame["lon"].to_numpy(), frame["lat"].to_numpy())
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
    """A 2-D grid variable (any CRS, NaN outside the region) warped onto a Web Mercator raster."""
    crs = values.rio.crs or "EPSG:4326"
    warped = values.rio.write_crs(crs).rio.write_nodata(np.nan, encoded=False).rio.reproject("EPSG:3857", nodata=np.nan)
    return warped.drop_vars("spatial_ref", errors="ignore")


def outline_paths(geometry: shapely.Geometry) -> list[np.ndarray]:
    """Rings of a lon/lat (multi)polygon as ``(n, 2)`` Web Mercator arrays."""
    rings = []
    for polygon in getattr(geometry, "geoms", [geometry]):
        for ring in [polygon.exterior, *polygon.interiors]:
            lon, lat = np.asarray(ring.coords).T
            rings.append(np.column_stack(TO_MERCATOR.transform(lon, lat)))
    return rings


def grid_cells_lonlat(grid: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(lonlat (m, 2) of the cells inside the region, inside (ny, nx) bool)``.

    The region mask is the same in every quarter, so the last quarter's is used.
    """
    xx, yy = np.meshgrid(grid["x"].to_numpy(), grid["y"].to_numpy())
    inside = np.isfinite(at_quarter(grid["mean"], None).to_numpy())
    px, py = xx[inside], yy[inside]
    crs = grid.rio.crs
    if crs is not None and not pyproj.CRS.from_user_input(crs).is_geographic:
        px, py = pyproj.Transformer.from_crs(crs, 4326, always_xy=True).transform(px, py)
    return np.column_stack([px, py]), inside


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
    k_slice: xr.DataArray, ref: tuple[float, float], region: shapely.Geometry, *, label: str, title: str,
    width: int, height: int,
) -> hv.Overlay:
    """A kernel slice (2-D grid variable) with the region outline and its reference point: a
    diverging map centred on 0 when the slice changes sign, else a sequential one."""
    signed = bool(np.nanmin(k_slice.to_numpy()) < 0)
    image = hv.Image(mercator_raster(k_slice), kdims=["x", "y"], vdims=[hv.Dimension("k", label=label)]).opts(
        cmap="RdBu_r" if signed else "viridis",
        symmetric=signed,
        colorbar=True,
        **raster_hover(label),
    )
    marker = hv.Points([lonlat_to_mercator(*ref)]).opts(color="red", marker="x", size=12, line_width=3)
    outline = hv.Path(outline_paths(region)).opts(color="black", line_width=0.8)
    return (image * outline * marker).opts(
        width=width, height=height, xaxis=None, yaxis=None, data_aspect=1, toolbar=None, title=title
    )


def density_plot(mean: float, sd: float, units: str, *, width: int, height: int) -> hv.Overlay:
    """The Gaussian predictive density of log10(value), its 95% interval shaded."""
    grid = np.linspace(mean - 4 * sd, mean + 4 * sd, 200)
    density = np.exp(-0.5 * ((grid - mean) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
    xdim = hv.Dimension("log10_value", label=f"log10({units})")
    inner = np.abs(grid - mean) <= Z95 * sd
    band = hv.Area((grid[inner], density[inner]), xdim, "density").opts(color="#9ecae1", line_alpha=0)
    curve = hv.Curve((grid, density), xdim, "density").opts(color="#08519c")
    centre = hv.VLine(mean).opts(color="#08519c", line_dash="dashed")
    median, lower, upper = (float(v) for v in to_data_units(mean, sd))
    return (band * curve * centre).opts(
        width=width,
        height=height,
        toolbar=None,
        title=f"predictive: median {median:.1f} {units}, 95% PI [{lower:.1f}, {upper:.1f}]",
    )


# --- the time series at a point -----------------------------------------------------------
def quarter_dates(labels: list[str] | pd.Series) -> pd.DatetimeIndex:
    """First day of each quarter label (``"2023Q4"`` -> 2023-10-01), the time axis of the series."""
    return pd.PeriodIndex(list(labels), freq="Q").start_time


def distance_km(lon: np.ndarray, lat: np.ndarray, lon0: float, lat0: float) -> np.ndarray:
    """Great-circle distance (km) from ``(lon0, lat0)`` to each point (haversine)."""
    phi, phi0 = np.radians(lat), np.radians(lat0)
    half = np.sin((phi - phi0) / 2) ** 2 + np.cos(phi) * np.cos(phi0) * np.sin(np.radians(lon - lon0) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(half, 0.0, 1.0)))


def observed_near(frame: pd.DataFrame, lon: float, lat: float, radius_km: float = NEAR_KM) -> pd.DataFrame:
    """Observed tiles (every split) whose centre is within ``radius_km`` of the point: columns
    ``quarter_start, quarter_label, observed_value, tests, split, distance_km``."""
    near = frame.assign(distance_km=distance_km(frame["lon"].to_numpy(), frame["lat"].to_numpy(), lon, lat))
    near = near[near["distance_km"] <= radius_km]
    labels = near["year"].astype(int).astype(str) + "Q" + near["quarter"].astype(int).astype(str)
    return pd.DataFrame(
        {
            "quarter_start": quarter_dates(labels) if len(near) else pd.DatetimeIndex([]),
            "quarter_label": labels.to_numpy(),
            "observed_value": near["value"].to_numpy(np.float64),
            "tests": near["tests"].to_numpy() if "tests" in near else np.zeros(len(near)),
            "split": near["split"].astype(str).to_numpy() if "split" in near else np.full(len(near), ""),
            "distance_km": near["distance_km"].to_numpy(),
        }
    )


@dataclass(frozen=True)
class Series:
    """The predictive distribution at one point over quarters, in data units.

    Attributes:
        quarters: quarter labels; median, lower, upper: (T,) 10**mean and the 95% interval.
    """

    quarters: list[str]
    median: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def from_predictions(cls, quarters: list[str], predictions: list) -> "Series":
        """From ``GeoModel.predict_series`` output at one point (one Prediction per quarter)."""
        mean = np.array([float(p.mean[0]) for p in predictions])
        sd = np.array([float(p.sd[0]) for p in predictions])
        return cls(list(quarters), *to_data_units(mean, sd))


def series_plot(
    series: Series,
    observed: pd.DataFrame,
    *,
    target: str,
    units: str,
    title: str,
    current: str | None,
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
    labels = np.asarray(series.quarters, dtype=object)
    band = hv.Area(
        (dates, series.lower, series.upper),
        x,
        [hv.Dimension("series_lower", label=y_label), "series_upper"],
        label="95% PI",
    ).opts(color="#9ecae1", alpha=0.6, line_alpha=0)
    hover = [("quarter", "@quarter"), ("median", "@series_median{0.0}"), ("95% PI", "@series_lower{0.0} - @series_upper{0.0}")]
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
        hover_tooltips=[("quarter", "@quarter_label"), (y_label, "@observed_value{0.0}"), ("tests", "@tests"),
                        ("split", "@split"), ("distance", "@distance_km{0.00} km")],
    )
    layers = band * curve * points
    if current in series.quarters:
        layers = layers * hv.VLine(quarter_dates([current])[0]).opts(color="grey", line_dash="dotted")
    values = np.concatenate([series.lower, series.upper, observed["observed_value"].to_numpy(np.float64)])
    low, high = float(values.min()) / 1.25, float(values.max()) * 1.25
    pad = pd.Timedelta(days=45)
    step = max(1, int(np.ceil(len(dates) / 6)))  # at most about six quarter labels
    xticks = [(date.value / 1e6, label) for date, label in zip(dates[::-step][::-1], labels[::-step][::-1])]
    return layers.opts(
        width=width, height=height, logy=True, toolbar=None, title=title, show_legend=True,
        legend_position="bottom", legend_cols=3, ylabel=y_label, xticks=xticks, yticks=log_ticks(low, high),
        xlim=(dates.min() - pad, dates.max() + pad), ylim=(low, high),
    )


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks from ``low`` to ``high`` (positive) for a log axis: 10, 20, 50, 100, ..."""
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    ticks = [m * 10.0**d for d in decades for m in (1, 2, 5) if low <= m * 10.0**d <= high]
    return ticks or [low, high]


# --- polygon summaries ----------------------------------------------------------------------
#: Columns of the summary table, in order (``{u}`` is the data unit in lower case).
SUMMARY_COLUMNS = ("median_{u}", "lower_{u}", "upper_{u}", "share_below", "sd_log10", "cells", "observed_tiles")
#: Polygon columns tried, in order, as the table's name column.
NAME_COLUMNS = ("NAME", "name", "NAMELSAD", "Name", "GEOID", "geoid", "id")


def name_column(frame: pd.DataFrame) -> str | None:
    """The polygons' name column, if they have one of :data:`NAME_COLUMNS`."""
    return next((c for c in NAME_COLUMNS if c in frame.columns), None)


def summary_table(summary: pd.DataFrame, units: str) -> pd.DataFrame:
    """The summarize_polygons output as shown: one row per polygon, its name, the area's median
    and 95% interval in data units, the share below the threshold and the cell counts, sorted
    from the slowest median up (the quarter is in the table's heading)."""
    key = units.lower()
    columns = [c.format(u=key) for c in SUMMARY_COLUMNS]
    name = name_column(summary)
    table = pd.DataFrame(summary[[c for c in columns if c in summary.columns]])
    if name is not None:
        table.insert(0, name, summary[name].astype(str))
    table = table.sort_values(f"median_{key}") if f"median_{key}" in table else table
    return table.round({f"median_{key}": 1, f"lower_{key}": 1, f"upper_{key}": 1, "share_below": 3, "sd_log10": 3})


__all__ = [
    "LAYERS", "Layer", "Series", "at_quarter", "change_span", "colour_limits", "density_plot", "grid_cells_lonlat",
    "grid_quarters", "kernel_slice_plot", "layer_label", "layer_options", "mercator_raster", "observed_near",
    "series_plot", "summary_table", "tiles_in_quarter", "vector_overlay",
]
