"""Predictive distributions at a clicked point and at the map's cells, in log10 units and in
data units (Mbps or ms).

Models predict a Gaussian of log10(value); :func:`geodbk.prediction.to_data_units` is the
one back-transform to the median and 95% interval in data units, and everything here goes
through it (for grids, through the ``.dbk`` accessor that wraps it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

import geodbk.io.accessor  # noqa: F401  (registers the .dbk accessor used by cell_readout)
from geodbk.prediction import Prediction, to_data_units
from geodbk.quarters import Quarter

#: Variables of :func:`cell_readout`: the median, the 95% interval (data units) and P(below).
READOUT_VARIABLES = ("readout_median", "readout_lower", "readout_upper", "readout_p_below")


def slice_units(units: str) -> str:
    """Units of a kernel (covariance) value: ``"log10(Mbps)²"``."""
    return f"log10({units})²"


@dataclass(frozen=True)
class PointPrediction:
    """The predictive distribution at one point.

    Attributes:
        mean, sd: log10 mean and standard deviation.
        log_lower, log_upper, pi_width: the 95% interval and its width, log10 units.
        median, lower, upper: ``10**mean`` and the 95% interval in data units (Mbps or ms).
    """

    mean: float
    sd: float
    log_lower: float
    log_upper: float
    pi_width: float
    median: float
    lower: float
    upper: float

    @classmethod
    def from_prediction(cls, prediction: Prediction, index: int = 0) -> PointPrediction:
        """Point ``index`` of a prediction (e.g. ``GeoModel.predict`` at one lon/lat)."""
        point = prediction.subset(np.array([index]))
        data = to_data_units(point.mean, point.sd)
        log10 = (point.mean, point.sd, point.lower, point.upper, point.pi_width)
        return cls(*(float(v[0]) for v in (*log10, *data)))


@dataclass(frozen=True)
class Series:
    """The predictive distribution at one point over quarters, in data units.

    Attributes:
        quarters: the ``T`` quarters.
        median, lower, upper: ``(T,)`` ``10**mean`` and the 95% interval, data units.
    """

    quarters: list[Quarter]
    median: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def from_predictions(cls, quarters: Sequence[Quarter], predictions: Sequence[Prediction]) -> Series:
        """From ``GeoModel.predict_series`` output at one point (one prediction per quarter)."""
        mean = np.array([float(p.mean[0]) for p in predictions])
        sd = np.array([float(p.sd[0]) for p in predictions])
        return cls(list(quarters), *to_data_units(mean, sd))


def cell_readout(cells: xr.Dataset) -> xr.Dataset:
    """What the map's hover shows at each cell: the predictive median, the 95% interval and
    P(tile-mean value < the grid's threshold).

    Args:
        cells: ``mean`` and ``sd`` of log10(value) at one quarter, any shape (e.g. a grid at
            one quarter warped to Web Mercator), with the grid's attributes: ``units``
            (``"Mbps"`` or ``"ms"``) and, when it has a ``p_below`` layer, ``threshold``
            (data units).

    Returns:
        :data:`READOUT_VARIABLES`, shaped like ``mean``: ``readout_median``,
        ``readout_lower`` and ``readout_upper`` in data units (``.dbk.to_data_units``) and
        ``readout_p_below``, a probability (``.dbk.p_below``; left out without a threshold).
    """
    median, lower, upper, p_below = READOUT_VARIABLES
    key = cells.dbk.units.lower()
    data = cells.dbk.to_data_units()
    readout = {median: data[f"mean_{key}"], lower: data[f"lower_{key}"], upper: data[f"upper_{key}"]}
    if "threshold" in cells.attrs:
        readout[p_below] = cells.dbk.p_below()
    return xr.Dataset(readout)
