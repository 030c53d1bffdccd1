"""Predictive distributions: :class:`Prediction` and the 95% quantile.

A tile mean is Gaussian. A new measurement may be a Student-t with the same mean and sd
(:class:`~geodbk.fit.tails.MeasurementTails`): speed tests have a heavy lower tail.

Torch-free, so that grids, export and the dashboard can use it without importing the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, owens_t, stdtrit

#: Two-sided 95% standard-normal quantile.
Z95 = 1.959964


def t_scale_per_sd(df: float) -> float:
    """The scale of a Student-t with ``df`` > 2 degrees of freedom and sd 1, sqrt((df - 2) / df)
    (its variance is scale^2 df / (df - 2))."""
    return math.sqrt((df - 2.0) / df)


def quantile95(df: float) -> float:
    """The half-width of the central 95% interval of a Student-t with ``df`` > 2 degrees of
    freedom and sd 1, t_{0.975, df} :func:`t_scale_per_sd`; :data:`Z95` for ``df = inf`` (Gaussian)."""
    if math.isinf(df):
        return Z95
    return float(stdtrit(df, 0.975) * t_scale_per_sd(df))


@dataclass
class Prediction:
    """Predictive distributions per point, in target units.

    Two distributions share the mean:

    * the tile mean, N(mean, sd^2), sd^2 = var_f + sigma0^2: what a tile's speed is when
      averaged over many tests; the map layers use it;
    * a new measurement that averages the point's own k tests, centred at ``mean +
      measurement_shift`` (the test count's shift, chosen on validation rows: the log of a mean
      of k speeds grows with k), with sd ``measurement_sd`` (measurement_sd^2 = var_f + sigma0^2
      + sigma1^2 / k, times a scale chosen on validation rows) and ``measurement_df`` degrees of
      freedom (a Student-t; ``inf``: Gaussian): what a test tile's observed value is scored
      against (:meth:`measurement`). Without test counts, or for a model with homoscedastic
      noise, it is the tile-mean distribution.

    Attributes:
        mean: (n,) predictive mean.
        sd: (n,) standard deviation (the tile mean's: function + sigma0^2).
        measurement_sd: (n,) standard deviation of a new k-test measurement, or ``None``.
        df: degrees of freedom of this distribution, > 2 (``inf``: Gaussian, as a tile mean is).
        measurement_df: degrees of freedom of a new measurement.
        measurement_shift: (n,) a new measurement's mean minus ``mean`` (log10 units), or ``None``: 0.
    """

    mean: np.ndarray
    sd: np.ndarray
    measurement_sd: np.ndarray | None = None
    df: float = math.inf
    measurement_df: float = math.inf
    measurement_shift: np.ndarray | None = None

    def measurement(self) -> Prediction:
        """The distribution of a new measurement with the points' test counts (mean + measurement_shift,
        sd = measurement_sd, df = measurement_df)."""
        if self.measurement_sd is None:
            return self
        mean = self.mean if self.measurement_shift is None else self.mean + self.measurement_shift
        return Prediction(mean, self.measurement_sd, df=self.measurement_df)

    @property
    def var(self) -> np.ndarray:
        """(n,) predictive variance sd^2."""
        return self.sd**2

    @property
    def lower(self) -> np.ndarray:
        """(n,) lower end of the central 95% prediction interval, mean - quantile95(df) sd."""
        return self.mean - quantile95(self.df) * self.sd

    @property
    def upper(self) -> np.ndarray:
        """(n,) upper end of the central 95% prediction interval."""
        return self.mean + quantile95(self.df) * self.sd

    @property
    def pi_width(self) -> np.ndarray:
        """(n,) width of the 95% prediction interval, 2 quantile95(df) sd (2 * 1.959964 * sd when Gaussian)."""
        return 2.0 * quantile95(self.df) * self.sd

    def __len__(self) -> int:
        return len(self.mean)

    def subset(self, index: np.ndarray) -> Prediction:
        """The predictions at ``index`` (boolean mask or integer positions)."""
        extra = None if self.measurement_sd is None else self.measurement_sd[index]
        shift = None if self.measurement_shift is None else self.measurement_shift[index]
        return Prediction(self.mean[index], self.sd[index], extra, self.df, self.measurement_df, shift)


def to_data_units(
    mean: np.ndarray, sd: np.ndarray, df: float = math.inf
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Back-transform a log10 Gaussian (or Student-t with ``df`` and this sd) to data units (Mbps
    or ms): ``(median, lower, upper)``, ``10**mean`` and the 95% interval
    ``10**(mean -/+ quantile95(df) sd)`` (1.959964 sd when Gaussian), each shaped like ``mean``."""
    mean, sd = np.asarray(mean, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    half = quantile95(df) * sd
    return 10.0**mean, 10.0 ** (mean - half), 10.0 ** (mean + half)


def probability_below(mean: np.ndarray, sd: np.ndarray, level: float) -> np.ndarray:
    """P(Y < level) for Y ~ N(mean, sd^2), elementwise; ``level`` in the same (log10) units."""
    return ndtr((level - np.asarray(mean, dtype=np.float64)) / np.asarray(sd, dtype=np.float64))


#: Correlations are clipped to this magnitude in :func:`probability_both_above` (|rho| = 1 is
#: a degenerate pair; the probability is continuous there).
MAX_CORRELATION = 1.0 - 1e-9


def probability_both_above(
    mean_a: np.ndarray, sd_a: np.ndarray, mean_b: np.ndarray, sd_b: np.ndarray,
    correlation: np.ndarray | float, level_a: float, level_b: float,
) -> np.ndarray:
    """P(A >= level_a and B >= level_b) for (A, B) bivariate normal, elementwise: the chance
    that a place meets a two-speed benchmark (download and upload together).

    Args:
        mean_a, sd_a, mean_b, sd_b: (n,) means and sds of A and B (log10 units).
        correlation: (n,) or scalar, the correlation of A and B.
        level_a, level_b: the levels in the same (log10) units.

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
