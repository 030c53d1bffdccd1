"""Predictive distributions: :class:`Prediction` and the 95% quantile.

A tile mean is Gaussian. A new measurement has a :class:`~geodbk.shape.Shape` chosen on
validation rows (:class:`~geodbk.fit.tails.MeasurementTails`): a single speed test's speed has
a long lower tail.

Torch-free, so that grids, export and the dashboard can use it without importing the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri, owens_t

from geodbk.shape import GAUSSIAN, Shape

#: Two-sided 95% standard-normal quantile, 1.959964 (the Gaussian shape's 0.975 quantile, exactly).
Z95 = float(ndtri(0.975))


@dataclass
class Prediction:
    """Predictive distributions per point, in target units.

    Two distributions share the mean:

    * the tile mean, N(mean, sd^2), sd^2 = var_f + sigma0^2: what a tile's speed is when
      averaged over many tests; the map layers use it;
    * a new measurement that averages the point's own k tests, with mean ``mean +
      measurement_shift`` (the test count's shift, chosen on validation rows: the log of a mean
      of k speeds grows with k), sd ``measurement_sd`` (measurement_sd^2 = var_f + sigma0^2
      + sigma1^2 / k, times a scale chosen on validation rows) and ``measurement_shape`` (a
      single test's long lower tail): what a test tile's observed value is scored against
      (:meth:`measurement`). Without test counts, or for a model with homoscedastic noise, it is
      the tile-mean distribution.

    Attributes:
        mean: (n,) predictive mean.
        sd: (n,) standard deviation (the tile mean's: function + sigma0^2).
        measurement_sd: (n,) standard deviation of a new k-test measurement, or ``None``.
        shape: the shape of (y - mean) / sd (:data:`~geodbk.shape.GAUSSIAN` for a tile mean).
        measurement_shape: the shape of a new measurement.
        measurement_shift: (n,) a new measurement's mean minus ``mean`` (log10 units), or ``None``: 0.
    """

    mean: np.ndarray
    sd: np.ndarray
    measurement_sd: np.ndarray | None = None
    shape: Shape = GAUSSIAN
    measurement_shape: Shape = GAUSSIAN
    measurement_shift: np.ndarray | None = None

    def measurement(self) -> Prediction:
        """The distribution of a new measurement with the points' test counts (mean + measurement_shift,
        sd = measurement_sd, shape = measurement_shape)."""
        if self.measurement_sd is None:
            return self
        mean = self.mean if self.measurement_shift is None else self.mean + self.measurement_shift
        return Prediction(mean, self.measurement_sd, shape=self.measurement_shape)

    @property
    def var(self) -> np.ndarray:
        """(n,) predictive variance sd^2."""
        return self.sd**2

    def quantile(self, level: float) -> np.ndarray:
        """(n,) the ``level`` quantile, mean + sd Q(level), Q the shape's (a Gaussian's: ndtri)."""
        return self.mean + float(self.shape.quantile(level)) * self.sd

    @property
    def lower(self) -> np.ndarray:
        """(n,) lower end of the central 95% prediction interval (mean - 1.959964 sd when Gaussian)."""
        return self.quantile(0.025)

    @property
    def upper(self) -> np.ndarray:
        """(n,) upper end of the central 95% prediction interval."""
        return self.quantile(0.975)

    @property
    def pi_width(self) -> np.ndarray:
        """(n,) width of the 95% prediction interval (2 * 1.959964 * sd when Gaussian)."""
        return self.upper - self.lower

    def probability_above(self, level: float) -> np.ndarray:
        """(n,) P(Y >= level), ``level`` in the same (log10) units."""
        return ndtr(-self.normal_score(level))

    def normal_score(self, level: np.ndarray | float) -> np.ndarray:
        """(n,) Phi^-1(P(Y <= level)): ``level`` standardised through the shape onto a standard
        normal (for a Gaussian, (level - mean) / sd), as a Gaussian copula joins two targets."""
        return self.shape.normal_score((level - self.mean) / self.sd)

    def __len__(self) -> int:
        return len(self.mean)

    def subset(self, index: np.ndarray) -> Prediction:
        """The predictions at ``index`` (boolean mask or integer positions)."""
        extra = None if self.measurement_sd is None else self.measurement_sd[index]
        shift = None if self.measurement_shift is None else self.measurement_shift[index]
        return Prediction(self.mean[index], self.sd[index], extra, self.shape, self.measurement_shape, shift)


def to_data_units(
    mean: np.ndarray, sd: np.ndarray, shape: Shape = GAUSSIAN
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Back-transform a log10 distribution with this mean, sd and ``shape`` (Gaussian by default)
    to data units (Mbps or ms): ``(median, lower, upper)``, 10 to the power of its median and of
    its central 95% interval (``10**mean`` and ``10**(mean -/+ 1.959964 sd)`` when Gaussian),
    each shaped like ``mean``."""
    mean, sd = np.asarray(mean, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    median, lower, upper = (float(shape.quantile(u)) for u in (0.5, 0.025, 0.975))
    return 10.0 ** (mean + median * sd), 10.0 ** (mean + lower * sd), 10.0 ** (mean + upper * sd)


def probability_below(mean: np.ndarray, sd: np.ndarray, level: float) -> np.ndarray:
    """P(Y < level) for Y ~ N(mean, sd^2), elementwise; ``level`` in the same (log10) units."""
    return ndtr((level - np.asarray(mean, dtype=np.float64)) / np.asarray(sd, dtype=np.float64))


#: Correlations are clipped to this magnitude in :func:`probability_both_above` (|rho| = 1 is
#: a degenerate pair; the probability is continuous there).
MAX_CORRELATION = 1.0 - 1e-9


def probability_both_above(
    mean_a: np.ndarray, sd_a: np.ndarray, mean_b: np.ndarray, sd_b: np.ndarray,
    correlation: np.ndarray | float, level_a: np.ndarray | float, level_b: np.ndarray | float,
) -> np.ndarray:
    """P(A >= level_a and B >= level_b) for (A, B) bivariate normal, elementwise: the chance
    that a place meets a two-speed benchmark (download and upload together).

    Args:
        mean_a, sd_a, mean_b, sd_b: (n,) means and sds of A and B (log10 units).
        correlation: (n,) or scalar, the correlation of A and B.
        level_a, level_b: the levels in the same (log10) units, scalars or (n,).

    Owen's (1956) reduction of the bivariate normal CDF to his T function (``scipy.special.owens_t``),
    which is exact and vectorised; ``scipy.stats.multivariate_normal.cdf`` integrates one
    correlation at a time and is about 10,000 times slower for a map. With h, k the standardised
    distances above the levels, Phi_2(h, k; rho) = (Phi(h) + Phi(k)) / 2 - T(h, a_h) - T(k, a_k) - beta,
    a_h = (k - rho h) / (h sqrt(1 - rho^2)), a_k likewise, beta = 1/2 when h k < 0 and 0 otherwise.
    """
    h = (np.asarray(mean_a, dtype=np.float64) - level_a) / np.asarray(sd_a, dtype=np.float64)
    k = (np.asarray(mean_b, dtype=np.float64) - level_b) / np.asarray(sd_b, dtype=np.float64)
    rho = np.clip(np.asarray(correlation, dtype=np.float64), -MAX_CORRELATION, MAX_CORRELATION)
    h, k, rho = np.broadcast_arrays(h, k, rho)
    # the formula divides by h and k; Phi_2 is continuous, so a zero moves to a tiny value of the
    # other's sign (the limit from that side)
    tiny = 1e-300
    h = np.where(h == 0.0, np.where(k < 0.0, -tiny, tiny), h)
    k = np.where(k == 0.0, np.where(h < 0.0, -tiny, tiny), k)
    root = np.sqrt(1.0 - rho**2)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        a_h = (k - rho * h) / (h * root)
        a_k = (h - rho * k) / (k * root)
    beta = np.where(h * k < 0.0, 0.5, 0.0)
    p = 0.5 * (ndtr(h) + ndtr(k)) - owens_t(h, a_h) - owens_t(k, a_k) - beta
    return np.clip(p, 0.0, np.minimum(ndtr(h), ndtr(k)))


def probability_pair_above(
    first: Prediction, second: Prediction, correlation: np.ndarray | float, level_first: float, level_second: float
) -> np.ndarray:
    """(n,) P(A >= level_first and B >= level_second) for A and B distributed as ``first`` and
    ``second`` (each with its own mean, sd and :class:`~geodbk.shape.Shape`) and joined by a
    Gaussian copula of ``correlation`` ((n,) or scalar): their normal scores
    (:meth:`Prediction.normal_score`) go to :func:`probability_both_above`. For two Gaussians
    it is their bivariate normal probability."""
    score_a, score_b = first.normal_score(level_first), second.normal_score(level_second)
    zero, one = np.zeros_like(score_a), np.ones_like(score_a)
    return probability_both_above(zero, one, zero, one, correlation, score_a, score_b)


@dataclass
class ChangePrediction:
    """The joint-posterior change of the latent log10 surface between two quarters, per point.

    Attributes:
        mean: (n,) E[f(x, t_to) - f(x, t_from)], log10 units.
        sd: (n,) its standard deviation under the joint posterior (not the difference of
            two marginal sds: the two quarters' errors are strongly correlated).
        mean_from, mean_to: (n,) E[f] at the two quarters, log10 units.
        sd_from, sd_to: (n,) sd of the latent f at each quarter (the tile-mean sd without the
            tile-quarter noise), so that ``sqrt(sd_from**2 + sd_to**2)`` is the sd the change
            would have if the quarters were independent.
    """

    mean: np.ndarray
    sd: np.ndarray
    mean_from: np.ndarray
    mean_to: np.ndarray
    sd_from: np.ndarray
    sd_to: np.ndarray

    @property
    def correlation(self) -> np.ndarray:
        """(n,) posterior correlation of f at the two quarters implied by the three variances."""
        return (self.sd_from**2 + self.sd_to**2 - self.sd**2) / (2.0 * self.sd_from * self.sd_to)

    @property
    def p_increase(self) -> np.ndarray:
        """(n,) P(f(x, t_to) > f(x, t_from))."""
        return 1.0 - probability_below(self.mean, self.sd, 0.0)

    @property
    def median_change(self) -> np.ndarray:
        """(n,) 10**mean_to - 10**mean_from: the change of the median in data units (Mbps or ms)."""
        return 10.0**self.mean_to - 10.0**self.mean_from

    def __len__(self) -> int:
        return len(self.mean)
