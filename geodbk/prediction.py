"""Gaussian predictive distributions: :class:`Prediction` and the 95% quantile.

Torch-free, so that grids, export and the dashboard can use it without importing the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Two-sided 95% standard-normal quantile.
Z95 = 1.959964


@dataclass
class Prediction:
    """Gaussian predictive distributions per point, in target units.

    Two distributions share the mean:

    * the tile mean, N(mean, sd^2), sd^2 = var_f + sigma0^2: what a tile's speed is when
      averaged over many tests; the map layers use it;
    * a new measurement that averages the point's own k tests, N(mean, measurement_sd^2),
      measurement_sd^2 = var_f + sigma0^2 + sigma1^2 / k: what a test tile's observed value
      is scored against (:meth:`measurement`). Without test counts, or for a model with
      homoscedastic noise, it is the tile-mean distribution.

    Attributes:
        mean: (n,) predictive mean.
        sd: (n,) tile-mean predictive standard deviation (function + sigma0^2).
        measurement_sd: (n,) standard deviation of a new k-test measurement, or ``None``.
    """

    mean: np.ndarray
    sd: np.ndarray
    measurement_sd: np.ndarray | None = None

    def measurement(self) -> "Prediction":
        """The distribution of a new measurement with the points' test counts (sd = measurement_sd)."""
        if self.measurement_sd is None:
            return self
        return Prediction(self.mean, self.measurement_sd)

    @property
    def var(self) -> np.ndarray:
        """(n,) predictive variance sd^2."""
        return self.sd**2

    @property
    def lower(self) -> np.ndarray:
        """(n,) lower end of the 95% prediction interval."""
        return self.mean - Z95 * self.sd

    @property
    def upper(self) -> np.ndarray:
        """(n,) upper end of the 95% prediction interval."""
        return self.mean + Z95 * self.sd

    @property
    def pi_width(self) -> np.ndarray:
        """(n,) width of the 95% prediction interval, 2 * 1.959964 * sd."""
        return 2.0 * Z95 * self.sd

    def __len__(self) -> int:
        return len(self.mean)

    def subset(self, index: np.ndarray) -> "Prediction":
        """The predictions at ``index`` (boolean mask or integer positions)."""
        extra = None if self.measurement_sd is None else self.measurement_sd[index]
        return Prediction(self.mean[index], self.sd[index], extra)
