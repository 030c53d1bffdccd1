"""Each site's expected chance of a wrong "meets / does not meet" decision once observations not
yet made are in: :func:`expected_wrong_after`, the term a visit planner sums.

A site's decision is "meets" when p = P(f >= levels) >= 0.5; it is wrong with probability
min(p, 1 - p). With p' the probability after observing, the term is E[min(p', 1 - p')] over the
observations' values, which is exact (the preposterior): observations leave the covariance at
what ``MapPosterior.condition(values=None)`` gives whatever the values, and move the site's
posterior mean by a Gaussian whose covariance is the variance removed, R = Sigma - Sigma'. So
the term is a Gaussian expectation:

* one target: E[Phi(-|X| / s')], X ~ N(mean - level, R), in closed form from a bivariate normal
  probability (:func:`~geodbk.prediction.probability_both_above`);
* two targets, where the visits moved more than :data:`STRONG_FRACTION` of a target's variance: a
  :data:`HERMITE_NODES`^2 Gauss-Hermite rule over the 2-D shift. min(p', 1 - p') has a kink at
  p' = 0.5 that costs Gauss-Hermite accuracy, so the rule integrates only what is left after a
  control variate, the same quantity for the probit of p' linearised at the current mean, whose
  expectation is the one-target closed form. On realistic blocks (sd 0.1 to 0.3 log10, a 5-test
  observation) this takes the error of a visited site's term from 0.005 (mean; 0.055 at most)
  to 0.002 (0.023 at most), against a 2-D trapezoid rule of 201^2 nodes;
* two targets elsewhere (the many sites a long-range field links weakly to a visit): the delta
  method, p' ~ N(p, g^T R g), g the gradient of P(meets) at the covariance after, so that the
  term is min(p, 1 - p) - (E|N(p - 1/2, s^2)| - |p - 1/2|). On those blocks its error summed
  over sites is 0.1% of the drop at 6% of the variance moved and 1.5% at 16% (4% per site).
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import ndtr, ndtri

from geodbk.blocks import blocks
from geodbk.errors import InputDataError
from geodbk.fit.posterior import meets_probability
from geodbk.prediction import MAX_CORRELATION, probability_both_above

#: Two targets: where the visits move more than this fraction of some target's variance, the
#: quadrature; elsewhere the delta method.
STRONG_FRACTION = 0.25
#: Gauss-Hermite nodes per axis of the two-target quadrature.
HERMITE_NODES = 8
#: Sites per block of the two-target quadrature (bounds its temporaries to about 100 MB).
_PAIR_BLOCK = 8192

_NODES, _WEIGHTS = hermegauss(HERMITE_NODES)
_GRID = np.stack(np.meshgrid(_NODES, _NODES, indexing="ij"), axis=-1).reshape(-1, 2)
_GRID_WEIGHTS = np.outer(_WEIGHTS, _WEIGHTS).ravel() / _WEIGHTS.sum() ** 2


def expected_wrong_after(mean: np.ndarray, prior: np.ndarray, after: np.ndarray, levels: tuple[float, ...],
                         meets: np.ndarray | None = None) -> np.ndarray:
    """Each site's expected chance of a wrong decision once observations not yet made are in.

    Args:
        mean: (p, T) current means, log10 units.
        prior: (p, T, T) current covariance blocks.
        after: (p, T, T) the blocks after the observations (``condition(values=None)``); the mean
            then moves by N(0, prior - after).
        levels: T levels, log10 units.
        meets: (p,) the current P(meets) if known, to save computing it.

    Returns:
        (p,) E[min(p', 1 - p')]: in closed form for T = 1; for T = 2 by quadrature where the
        observations move more than :data:`STRONG_FRACTION` of a target's variance and by the
        delta method elsewhere (see the module docstring).
    """
    mean, prior, after = (np.asarray(array, dtype=np.float64) for array in (mean, prior, after))
    if len(levels) != mean.shape[-1]:
        raise InputDataError(f"levels must give one level per target, got {len(levels)} for {mean.shape[-1]}")
    if len(levels) == 1:
        return wrong_exact(mean, prior, after, levels)
    p = meets_probability(mean, prior, levels) if meets is None else np.asarray(meets, dtype=np.float64)
    out = wrong_by_delta(mean, prior, after, levels, p)
    strong = np.flatnonzero(moved_strongly(prior, after))
    out[strong] = wrong_exact(mean[strong], prior[strong], after[strong], levels)
    return out


def wrong_by_delta(mean: np.ndarray, prior: np.ndarray, after: np.ndarray, levels: tuple[float, ...],
                   meets: np.ndarray) -> np.ndarray:
    """(p,) E[min(p', 1 - p')] by the delta method: p' ~ N(p, g^T (prior - after) g), g the gradient of
    P(meets) at the covariance after and p = ``meets`` the current probability (the mean of p', exactly)."""
    return delta_wrong(meets, _spread(meets_gradient(mean, after, levels), prior - after))


def wrong_exact(mean: np.ndarray, prior: np.ndarray, after: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """(p,) E[min(p', 1 - p')] without the delta method: the closed form (T = 1) or the quadrature (T = 2)."""
    removed = prior - after
    if len(levels) == 1:
        return _one_target_wrong(mean[:, 0] - levels[0], removed[:, 0, 0], prior[:, 0, 0])
    out = np.empty(len(mean))
    for part in blocks(len(mean), _PAIR_BLOCK):
        out[part] = _two_target_wrong(mean[part], removed[part], after[part], levels)
    return out


def moved_strongly(prior: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(...) whether observations moved more than :data:`STRONG_FRACTION` of some target's variance."""
    moved = np.diagonal(prior - after, axis1=-2, axis2=-1) > STRONG_FRACTION * np.diagonal(prior, axis1=-2, axis2=-1)
    return np.asarray(moved.any(axis=-1))


def _spread(slope: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """(...) sd of p' by the delta method, sqrt(g^T R g), for gradients ``slope`` (..., T) and R (..., T, T)."""
    return np.sqrt(np.maximum(np.einsum("...a,...ab,...b->...", slope, removed, slope), 0.0))


def delta_wrong(meets: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """(...) E[min(p', 1 - p')] for p' ~ N(meets, spread^2): min(p, 1 - p) - h, the drop h =
    E|N(m, s^2)| - m = 2 s (phi(x) - x Phi(-x)), m = |p - 1/2|, x = m / s."""
    margin = np.abs(meets - 0.5)
    x = np.minimum(margin / np.maximum(spread, 1e-300), 40.0)  # drop < 1e-300 beyond
    drop = 2.0 * spread * (_density(x) - x * ndtr(-x))
    return 0.5 - margin - np.maximum(drop, 0.0)


def delta_drop_slope(margin: np.ndarray, before: np.ndarray, added: np.ndarray) -> np.ndarray:
    """(...) the steepest the delta method's drop h(v) (:func:`delta_wrong`) rises with the variance v
    of p' over [before, before + added]: h'(v) = phi(m / sqrt v) / sqrt v rises up to v = m^2,
    where it is phi(1) / m, and falls after. So h(before + added) - h(before) <= added times this."""

    def slope(variance: np.ndarray) -> np.ndarray:
        sd = np.sqrt(np.maximum(variance, 1e-300))
        return _density(np.minimum(margin / sd, 40.0)) / sd

    peak = (before < margin**2) & (margin**2 < before + added)
    top = _density(1.0) / np.maximum(margin, 1e-300)
    return np.where(peak, top, np.maximum(slope(before), slope(before + added)))


def _density(x: np.ndarray | float) -> np.ndarray:
    """phi(x), the standard normal density."""
    return np.exp(-0.5 * np.square(x)) / np.sqrt(2.0 * np.pi)


def _one_target_wrong(distance: np.ndarray, removed: np.ndarray, total: np.ndarray) -> np.ndarray:
    """(p,) E[Phi(-|X| / s')] for X ~ N(distance, removed), s'^2 = total - removed: one target's
    expected wrong decisions. With U = X + s' Z (Z standard normal, so U ~ N(distance, total) and
    corr(X, U) = sqrt(removed / total)) it is P(X > 0, U < 0) + P(X < 0, U > 0) =
    Phi(a) + Phi(b) - 2 P(X >= 0, U >= 0), a = distance / sqrt(removed), b = distance / sqrt(total)."""
    moved = removed > 1e-12 * total
    removed = np.where(moved, np.minimum(removed, total), total)
    sd_moved, sd_total = np.sqrt(removed), np.sqrt(total)
    both = probability_both_above(distance, sd_moved, distance, sd_total, sd_moved / sd_total, 0.0, 0.0)
    value = ndtr(distance / sd_moved) + ndtr(distance / sd_total) - 2.0 * both
    return np.where(moved, value, ndtr(-np.abs(distance) / sd_total))


def _two_target_wrong(mean: np.ndarray, removed: np.ndarray, after: np.ndarray,
                      levels: tuple[float, ...]) -> np.ndarray:
    """(p,) E[min(p', 1 - p')] over the mean shift N(0, removed) (p, 2, 2), p' at covariance ``after``."""
    value, vector = np.linalg.eigh(removed)
    shift = np.einsum("pab,qb->pqa", vector * np.sqrt(np.clip(value, 0.0, None))[:, None, :], _GRID)
    p = meets_probability(mean[:, None, :] + shift, after[:, None], levels)
    # the control variate: the probit of p' linearised at the current mean, q = q0 + g^T shift
    probit = np.clip(ndtri(meets_probability(mean, after, levels)), -8.0, 8.0)
    slope = meets_gradient(mean, after, levels) / _density(probit)[:, None]
    linear = probit[:, None] + np.einsum("pqa,pa->pq", shift, slope)
    spread = np.einsum("pa,pab,pb->p", slope, removed, slope)
    residual = (np.minimum(p, 1.0 - p) - ndtr(-np.abs(linear))) @ _GRID_WEIGHTS
    return residual + _one_target_wrong(probit, spread, 1.0 + spread)


def meets_gradient(mean: np.ndarray, covariance: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """(..., T) the gradient of P(meets) in the means, T = 1 or 2: phi(h) / sd for one target;
    phi(h) Phi((k - rho h) / sqrt(1 - rho^2)) / sd_a and its mirror for two, h and k the
    standardised distances above the levels."""
    sd = np.sqrt(np.diagonal(covariance, axis1=-2, axis2=-1))
    h = (mean - np.asarray(levels)) / sd
    density = _density(h) / sd
    if len(levels) == 1:
        return density
    rho = np.clip(covariance[..., 0, 1] / (sd[..., 0] * sd[..., 1]), -MAX_CORRELATION, MAX_CORRELATION)[..., None]
    return density * ndtr((h[..., ::-1] - rho * h) / np.sqrt(1.0 - rho**2))
