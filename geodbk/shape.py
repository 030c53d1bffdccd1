"""The standardised shape of a predictive distribution: :class:`Shape`.

A :class:`~geodbk.prediction.Prediction` gives a mean and an sd per point; its shape says how
the standardised value Z = (Y - mean) / sd is distributed. Z always has mean 0 and sd 1:

* the Gaussian (:data:`GAUSSIAN`), as every tile mean and map layer is;
* a Student-t with ``df`` > 2 degrees of freedom, scaled to sd 1 (the new-measurement family
  of model files written before 2026-11-27);
* a sinh-arcsinh normal (Jones and Pewsey 2009): X = sinh((asinh(N) + skew) / tailweight)
  with N standard normal, moved and scaled to mean 0 and sd 1. ``skew`` < 0 gives a long
  lower tail (a single speed test's), ``tailweight`` < 1 heavier tails than the Gaussian's,
  > 1 lighter. ``skew = 0, tailweight = 1`` is the Gaussian.

The sinh-arcsinh family is kept mean-preserving on purpose: a GP fitted with a Gaussian
likelihood estimates the conditional mean, so a new measurement keeps that mean and only its
median and tails move. Its moments are closed-form (Jones and Pewsey's P_q, from modified
Bessel functions of the second kind), its cdf is Phi(sinh(tailweight asinh(x) - skew)) and its
quantiles invert that, so the Gaussian copula of two such marginals (P(meets) of a download and
upload pair) is exact through :meth:`Shape.normal_score`.

Torch-free. scipy has neither a sinh-arcsinh distribution nor its CRPS, hence this module; the
CRPS is integrated over a fixed grid of quantile levels (:data:`CRPS_LEVELS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.special import betaln, gammaln, kv, ndtr, ndtri, stdtr, stdtrit

#: Quantile levels of the numerical CRPS of a sinh-arcsinh shape (midpoints of 1,000 equal parts;
#: the error against the exact integral is below 1e-4 sd for the shapes fits choose).
CRPS_LEVELS = (np.arange(1000) + 0.5) / 1000.0
#: Rows per block of the numerical CRPS (rows x levels float64 values in memory at once).
CRPS_BLOCK_ROWS = 4096


def _bessel_moment(q: float) -> float:
    """Jones and Pewsey's P_q = e^(1/4) / sqrt(8 pi) [K_((q+1)/2)(1/4) + K_((q-1)/2)(1/4)]."""
    return math.exp(0.25) / math.sqrt(8.0 * math.pi) * (kv(0.5 * (q + 1.0), 0.25) + kv(0.5 * (q - 1.0), 0.25))


@dataclass(frozen=True)
class Shape:
    """The distribution of Z = (Y - mean) / sd, mean 0 and sd 1.

    Attributes:
        df: Student-t degrees of freedom, > 2 (``inf``: not a t).
        skew: the sinh-arcsinh skew epsilon (0: symmetric; < 0: a long lower tail).
        tailweight: the sinh-arcsinh tail weight delta, > 0 (1: Gaussian tails; < 1: heavier).

    A t (finite ``df``) has no skew and tail weight 1.
    """

    df: float = math.inf
    skew: float = 0.0
    tailweight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.df > 2.0 and self.tailweight > 0.0 and math.isfinite(self.skew)):
            raise ValueError(f"a shape needs df > 2, tailweight > 0 and a finite skew, got {self}")
        if math.isfinite(self.df) and not self.is_untransformed:
            raise ValueError("a Student-t shape has no skew or tail weight")

    @property
    def is_untransformed(self) -> bool:
        """True when there is no sinh-arcsinh transform, skew = 0 and tailweight = 1 (a Gaussian or a plain t)."""
        return self.skew == 0.0 and self.tailweight == 1.0

    @property
    def is_gaussian(self) -> bool:
        return math.isinf(self.df) and self.is_untransformed

    @property
    def is_t(self) -> bool:
        return math.isfinite(self.df)

    @cached_property
    def _location_scale(self) -> tuple[float, float]:
        """(m, s): the raw variable X (sinh-arcsinh of a normal, or the unit-scale t) is m + s Z."""
        if self.is_t:
            return 0.0, math.sqrt(self.df / (self.df - 2.0))
        if self.is_gaussian:
            return 0.0, 1.0
        ratio = self.skew / self.tailweight
        mean = math.sinh(ratio) * _bessel_moment(1.0 / self.tailweight)
        second = 0.5 * (math.cosh(2.0 * ratio) * _bessel_moment(2.0 / self.tailweight) - 1.0)
        return mean, math.sqrt(second - mean**2)

    def _raw(self, z: np.ndarray) -> np.ndarray:
        m, s = self._location_scale
        return m + s * np.asarray(z, dtype=np.float64)

    def _standard(self, x: np.ndarray) -> np.ndarray:
        m, s = self._location_scale
        return (x - m) / s

    def normal_score(self, z: np.ndarray) -> np.ndarray:
        """Phi^-1(F(z)): the standard normal quantile of the same probability. Exact for the
        sinh-arcsinh normal, sinh(tailweight asinh(x) - skew); for a t, through its cdf (by the
        lower tail on each side, so that it stays finite far out)."""
        x = self._raw(z)
        if self.is_gaussian:
            return x
        if not self.is_t:
            return np.sinh(self.tailweight * np.arcsinh(x) - self.skew)
        lower = stdtr(self.df, -np.abs(x))
        return -np.sign(x) * ndtri(lower)

    def cdf(self, z: np.ndarray) -> np.ndarray:
        """P(Z <= z)."""
        return ndtr(self.normal_score(z))

    def quantile(self, u: np.ndarray | float) -> np.ndarray:
        """The z with P(Z <= z) = u, for u in (0, 1)."""
        u = np.asarray(u, dtype=np.float64)
        if self.is_gaussian:
            return ndtri(u)
        if self.is_t:
            return self._standard(stdtrit(self.df, u))
        return self._standard(np.sinh((np.arcsinh(ndtri(u)) + self.skew) / self.tailweight))

    def log_density(self, z: np.ndarray) -> np.ndarray:
        """log f(z) of Z (its density per unit of z, i.e. of sd)."""
        x = self._raw(z)
        log_scale = math.log(self._location_scale[1])
        if self.is_t:
            df = self.df
            constant = gammaln(0.5 * (df + 1.0)) - gammaln(0.5 * df) - 0.5 * math.log(df * math.pi)
            return log_scale + constant - 0.5 * (df + 1.0) * np.log1p(x**2 / df)
        w = self.tailweight * np.arcsinh(x) - self.skew
        normal = -0.5 * np.sinh(w) ** 2 - 0.5 * math.log(2.0 * math.pi)
        return log_scale + normal + math.log(self.tailweight) + np.log(np.cosh(w)) - 0.5 * np.log1p(x**2)

    def crps(self, z: np.ndarray) -> np.ndarray:
        """(n,) the CRPS of the standardised values ``z`` (multiply by sd for the CRPS of Y).

        Gaussian: z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi). Student-t (Jordan, Krueger and Lerch
        2019, the scoringRules paper), with x = z / c the unit-scale value and c = sqrt((df-2)/df):
        c [x (2 F(x) - 1) + 2 f(x) (df + x^2) / (df - 1) - 2 sqrt(df) B(1/2, df - 1/2) / ((df - 1) B(1/2, df/2)^2)].
        Sinh-arcsinh: 2 int_0^1 (1{z < Q(u)} - u) (Q(u) - z) du over :data:`CRPS_LEVELS`.
        """
        z = np.asarray(z, dtype=np.float64)
        if self.is_gaussian:
            density = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
            return z * (2.0 * ndtr(z) - 1.0) + 2.0 * density - 1.0 / math.sqrt(math.pi)
        if self.is_t:
            df, scale = self.df, 1.0 / self._location_scale[1]
            x = z / scale
            spread = 2.0 * math.sqrt(df) * math.exp(betaln(0.5, df - 0.5) - 2.0 * betaln(0.5, 0.5 * df)) / (df - 1.0)
            density = np.exp(self.log_density(z) + math.log(scale))
            return scale * (x * (2.0 * stdtr(df, x) - 1.0) + 2.0 * density * (df + x**2) / (df - 1.0) - spread)
        levels = self.quantile(CRPS_LEVELS)
        out = np.empty(z.shape, dtype=np.float64)
        flat, result = z.reshape(-1), out.reshape(-1)
        for start in range(0, len(flat), CRPS_BLOCK_ROWS):
            block = flat[start:start + CRPS_BLOCK_ROWS, None]
            pinball = ((block < levels).astype(np.float64) - CRPS_LEVELS) * (levels - block)
            result[start:start + CRPS_BLOCK_ROWS] = 2.0 * pinball.mean(axis=1)
        return out

    def to_payload(self) -> dict[str, float]:
        return {"df": self.df, "skew": self.skew, "tailweight": self.tailweight}


#: The standard normal.
GAUSSIAN = Shape()
