"""Map layers of a saved grid: which variable each shows, and how it is labelled and coloured.

A grid is a :mod:`geodbk.maps.schema` dataset; its ``target`` and ``units`` attributes
(``"download"``, ``"Mbps"``) name the variables in data units (``mean_mbps``, ``change_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr


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
LAYER_BY_KEY: dict[str, Layer] = {layer.key: layer for layer in LAYERS}
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
    (any shape; all quarters, so that the colours mean the same on every quarter), in the
    variable's units; ``None`` if all NaN.

    Probabilities get 0..1; changes a range symmetric about 0 (the 98th percentile of ``|v|``);
    other layers their range, with the 2nd-98th percentiles selected.
    """
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
