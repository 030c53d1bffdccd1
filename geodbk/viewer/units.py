"""Predictive distributions at a clicked point, in log10 units and in data units (Mbps or ms).

Models predict a Gaussian of log10(value); :func:`geodbk.prediction.to_data_units` is the
one back-transform to the median and 95% interval in data units, and everything here goes
through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geodbk.prediction import Prediction, to_data_units


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
        quarters: ``T`` quarter labels (``"2023Q4"``).
        median, lower, upper: ``(T,)`` ``10**mean`` and the 95% interval, data units.
    """

    quarters: list[str]
    median: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def from_predictions(cls, quarters: Sequence[str], predictions: Sequence[Prediction]) -> Series:
        """From ``GeoModel.predict_series`` output at one point (one prediction per quarter)."""
        mean = np.array([float(p.mean[0]) for p in predictions])
        sd = np.array([float(p.sd[0]) for p in predictions])
        return cls(list(quarters), *to_data_units(mean, sd))
