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
    """Gaussian predictive distribution N(mean, sd^2) per point, in target units.

    Attributes:
        mean: (n,) predictive mean.
        sd: (n,) predictive standard deviation (function + observation noise).
    """

    mean: np.ndarray
    sd: np.ndarray

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
        return Prediction(self.mean[index], self.sd[index])
