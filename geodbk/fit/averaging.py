"""The map model as an equal-weight average of two: the deep kernel's and the kriging one.

A space-time GP fit (:func:`geodbk.fit.fitting.fit_dataset`) fits two map models on the same rows,
each with its own local residual field (:mod:`geodbk.fit.residuals`):

* the **deep part**: the deep kernel on the places, the quarter and the density layer;
* the **kriging part**: the same kind whose network reads the quarter alone, so that its map is
  the residual field kriged around each quarter's level.

Their distributions are averaged with equal weights and moment-matched: for each quantity q
(a tile, an area mean, a change) with means m_a, m_b and variances v_a, v_b,

    E[q] = (m_a + m_b) / 2,    Var[q] = (v_a + v_b) / 2 + (m_a - m_b)^2 / 4,

the mean and variance of the 50/50 mixture. Jointly, Cov = (C_a + C_b) / 2 + d d^T / 4 with d the
difference of the two means (:func:`averaged_factor`), so every product keeps one Gaussian.

Why: on the small regions of ``benchmarks/bench_regions.py`` the kriging part alone was as good
as the full model at known places and better at new ones, and the average was better than both,
on nested validation rows (what the choice was made on) and on test rows; on PR and HI it lost
nothing (docs/small-regions.md, 2026-11-28). A choice between the two on the validation rows was
worse than either: those rows are too few to tell them apart.
"""

from __future__ import annotations

import numpy as np

from geodbk.prediction import ChangePrediction, Prediction


def _variance(var_a: np.ndarray, var_b: np.ndarray, mean_a: np.ndarray, mean_b: np.ndarray) -> np.ndarray:
    """The 50/50 mixture's variance, (v_a + v_b) / 2 + (m_a - m_b)^2 / 4."""
    return 0.5 * (var_a + var_b) + 0.25 * (mean_a - mean_b) ** 2


def average_predictions(a: Prediction, b: Prediction) -> Prediction:
    """The moment-matched average of two Gaussian predictions of the same points, (n,) each: the
    tile mean and, where both have it, a new measurement (whose mean is the tile mean's)."""
    sd = np.sqrt(_variance(a.var, b.var, a.mean, b.mean))
    measurement_sd = None
    if a.measurement_sd is not None and b.measurement_sd is not None:
        measurement_sd = np.sqrt(_variance(a.measurement_sd**2, b.measurement_sd**2, a.mean, b.mean))
    return Prediction(0.5 * (a.mean + b.mean), sd, measurement_sd)


def average_changes(a: ChangePrediction, b: ChangePrediction) -> ChangePrediction:
    """The moment-matched average of two change predictions of the same points, (n,) each."""
    return ChangePrediction(
        0.5 * (a.mean + b.mean),
        np.sqrt(_variance(a.sd**2, b.sd**2, a.mean, b.mean)),
        0.5 * (a.mean_from + b.mean_from),
        0.5 * (a.mean_to + b.mean_to),
        np.sqrt(_variance(a.sd_from**2, b.sd_from**2, a.mean_from, b.mean_from)),
        np.sqrt(_variance(a.sd_to**2, b.sd_to**2, a.mean_to, b.mean_to)),
    )


def averaged_factor(
    factor_a: np.ndarray, factor_b: np.ndarray, mean_a: np.ndarray, mean_b: np.ndarray
) -> np.ndarray:
    """The low-rank factor of the averaged covariance's long-range part, (n, k_a + k_b + 1):
    ``[F_a / sqrt 2, F_b / sqrt 2, (m_a - m_b) / 2]`` for the parts' factors F_a (n, k_a), F_b
    (n, k_b) and means (n,), so that F F^T = (F_a F_a^T + F_b F_b^T) / 2 + d d^T / 4."""
    half = np.sqrt(0.5)
    return np.column_stack([half * factor_a, half * factor_b, 0.5 * (mean_a - mean_b)])


__all__ = ["average_changes", "average_predictions", "averaged_factor"]
