"""Download and upload together: the correlation of the two targets' errors.

One place's download and upload speeds move together: on Puerto Rico's tiles, each tile's
two speeds minus the mean of its 40 nearest tiles in the same quarter correlate at 0.64
(0.59 for one-test tiles, 0.71 for 21 or more). A probability that both speeds reach a
benchmark (the FCC's 35/3 Mbps) taken from two separate models as if they were independent
is then biased, most where the decision is close.

geodbk fits each target's GP as it fits one (:func:`~geodbk.fit.fitting.fit_dataset`), then
chooses the correlation of their errors on the validation rows. A validation row's error in
each target is its tile-mean error (sd the tile-mean ``sd``) plus the test noise of its own
``tests`` (sd ``sqrt(measurement_sd^2 - sd^2)``), and the two parts of the two targets
correlate separately:

    Cov(e_download, e_upload) = rho_tile sd_d sd_u + rho_noise noise_d noise_u,

so that the correlation of a tile mean (what maps and hexagon decisions use, ``rho_tile``) is
told apart from that of a one-test measurement. Both are chosen by the bivariate Gaussian
likelihood of the rows (bounded L-BFGS-B, two parameters). One global pair: the sample's
correlation hardly moves between urban and rural rows (see the README's Decisions section).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import minimize

from geodbk.errors import InputDataError
from geodbk.prediction import Prediction

#: Bound on |rho| while fitting (a correlation of 1 is a degenerate pair).
_MAX_RHO = 0.99
#: Fewest validation rows with both targets from which a correlation is estimated.
MIN_ROWS = 30


@dataclass(frozen=True)
class TargetCorrelation:
    """The correlation of two targets' errors at one place (see the module text).

    Attributes:
        first, second: the targets, e.g. ``"download"``, ``"upload"``.
        tile: correlation of the two tile-mean errors (the maps' distribution).
        noise: correlation of the two targets' test noise in one measurement.
        rows: validation rows it was estimated on.
    """

    first: str
    second: str
    tile: float
    noise: float
    rows: int = 0

    def measurement(self, first: Prediction, second: Prediction) -> np.ndarray:
        """(n,) correlation of a new measurement's two values, for the two targets'
        predictions with ``measurement_sd`` (their own test counts)."""
        sd_a, noise_a, total_a = _parts(first)
        sd_b, noise_b, total_b = _parts(second)
        return (self.tile * sd_a * sd_b + self.noise * noise_a * noise_b) / (total_a * total_b)

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TargetCorrelation:
        return cls(**values)


def _parts(prediction: Prediction) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tile-mean sd, test-noise sd and measurement sd, (n,) each, of a prediction with test counts."""
    if prediction.measurement_sd is None:
        raise InputDataError("a measurement correlation needs predictions made with the rows' test counts")
    total = prediction.measurement_sd
    return prediction.sd, np.sqrt(np.maximum(total**2 - prediction.sd**2, 0.0)), total


def fit_target_correlation(
    names: tuple[str, str], y_first: np.ndarray, first: Prediction, y_second: np.ndarray, second: Prediction
) -> TargetCorrelation:
    """Choose ``rho_tile`` and ``rho_noise`` by the bivariate Gaussian likelihood of validation
    rows' errors (see the module text).

    Args:
        names: the two targets.
        y_first, y_second: (n,) the rows' observed log10 values.
        first, second: (n,) each target's predictions at the rows, made with their test counts.

    Raises:
        InputDataError: with fewer than :data:`MIN_ROWS` rows.
    """
    y_first, y_second = np.asarray(y_first, np.float64), np.asarray(y_second, np.float64)
    if len(y_first) < MIN_ROWS:
        raise InputDataError(f"{len(y_first)} validation rows are too few to estimate the correlation of "
                             f"{names[0]} and {names[1]} (at least {MIN_ROWS})")
    r_a, r_b = y_first - first.measurement().mean, y_second - second.measurement().mean
    sd_a, noise_a, total_a = _parts(first)
    sd_b, noise_b, total_b = _parts(second)
    shared_tile, shared_noise = sd_a * sd_b, noise_a * noise_b
    var_a, var_b = total_a**2, total_b**2

    def negative_log_likelihood(rho: np.ndarray) -> float:
        c = rho[0] * shared_tile + rho[1] * shared_noise
        det = var_a * var_b - c**2
        quadratic = (var_b * r_a**2 - 2.0 * c * r_a * r_b + var_a * r_b**2) / det
        return float(0.5 * np.mean(np.log(det) + quadratic))

    best = minimize(negative_log_likelihood, np.zeros(2), method="L-BFGS-B", bounds=[(-_MAX_RHO, _MAX_RHO)] * 2)
    return TargetCorrelation(names[0], names[1], float(best.x[0]), float(best.x[1]), len(y_first))


__all__ = ["MIN_ROWS", "TargetCorrelation", "fit_target_correlation"]
