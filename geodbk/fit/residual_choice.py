"""Choosing the residual field's hyperparameters on validation rows.

:meth:`ResidualField.fit <geodbk.fit.residuals.ResidualField.fit>` conditions a field on the
GP's training residuals and then chooses, in this order and each given the ones before:

1. the local kernel's seven hyperparameters (:func:`choose_kernel`), by the Gaussian NLL on
   validation rows plus that of validation areas' mean residuals (2 and 5 km squares of one
   quarter, :func:`~geodbk.fit.validation_areas.square_areas`), by bounded L-BFGS-B in log
   space with the criterion's exact gradient (:mod:`geodbk.fit.kernel_search`), in the spirit
   of the ``knn`` baseline's k. The tiles fix each row's variance; the areas fix how much of
   it neighbouring tiles share;
2. the forecast variance rate (:func:`pseudo_forecast_rate`), on all validation rows of the
   last training quarter;
3. the local volatility (:func:`choose_volatility`), from the training rows' leave-one-out
   errors, on up to :data:`~geodbk.fit.volatility.FIT_ROWS` validation rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from geodbk.fit.kernel_search import AreaTerm, KernelCriterion, TileTerm, search_kernel
from geodbk.fit.local_kernel import LocalKernel
from geodbk.fit.metrics import nll
from geodbk.fit.validation_areas import AreaGroups
from geodbk.fit.volatility import FIT_ROWS as VOLATILITY_FIT_ROWS
from geodbk.fit.volatility import LocalVolatility
from geodbk.prediction import Prediction

if TYPE_CHECKING:
    from geodbk.fit.residuals import ResidualField

#: Validation rows of the tile NLL the kernel is chosen by (:mod:`geodbk.fit.kernel_search`).
FIT_ROWS = 3000
#: Validation rows of the last training quarter needed to estimate the forecast variance.
MIN_FORECAST_ROWS = 30


@dataclass(frozen=True)
class ValidationRows:
    """The validation rows the hyperparameters are chosen on, in log10 units.

    Attributes:
        lonlat: (n, 2) tile centres, degrees.
        years: (n,) decimal years.
        residual: (n,) y - mu_GP.
        gp_var: (n,) the GP's tile-mean variances.
        test_var: (n,) the GP's test-count noise sigma1^2 / tests (zeros: ``gp_var`` is then the
            whole measurement variance).
    """

    lonlat: np.ndarray
    years: np.ndarray
    residual: np.ndarray
    gp_var: np.ndarray
    test_var: np.ndarray

    @classmethod
    def of(cls, lonlat: np.ndarray, years: np.ndarray, residual: np.ndarray, gp_var: np.ndarray,
           test_var: np.ndarray | None = None) -> ValidationRows:
        """The rows as float64 arrays; ``test_var`` defaults to zeros."""
        residual = np.asarray(residual, np.float64)
        return cls(np.asarray(lonlat, np.float64), np.asarray(years, np.float64), residual,
                   np.asarray(gp_var, np.float64),
                   np.zeros(len(residual)) if test_var is None else np.asarray(test_var, np.float64))

    def sample(self, size: int, seed: int) -> ValidationRows:
        """At most ``size`` of the rows, drawn without replacement (the first ``size`` of a random
        permutation by ``seed``, so that two sizes with one seed share their first rows)."""
        pick = np.random.default_rng(seed).permutation(len(self.residual))[:size]
        return ValidationRows(self.lonlat[pick], self.years[pick], self.residual[pick], self.gp_var[pick],
                              self.test_var[pick])


def choose_kernel(field: ResidualField, val: ValidationRows, areas: AreaGroups | None = None,
                  seed: int = 0) -> LocalKernel:
    """The local kernel that minimises the validation NLL of ``mu_GP + kriged residual`` under
    ``N(., s gp_var + s_t test_var + conditional var)`` on up to :data:`FIT_ROWS` of ``val``
    (drawn by ``seed``), plus, with ``areas`` (:func:`~geodbk.fit.validation_areas.square_areas`
    of ``val``'s rows and their GP variance), the NLL of those areas' mean residuals under their
    joint variance (as :meth:`~geodbk.fit.residuals.ResidualField.area_condition` gives it),
    conditioned on ``field``'s training rows.

    Tiles alone cannot tell how much of the local variance neighbouring tiles share: with the
    3 km coordinate jitter, the tile NLL chose a local part twice as large and twice as
    long-ranged, and PR's area sds came out too wide (test 2 km squares z sd 0.80).
    """
    rows = val.sample(FIT_ROWS, seed)
    tiles = TileTerm(field.neighbourhoods(rows.lonlat, rows.years), *(
        torch.as_tensor(values, dtype=torch.float64) for values in (rows.residual, rows.gp_var, rows.test_var)))
    area_term = None if areas is None or areas.n_areas == 0 else AreaTerm.build(
        field, areas, val.lonlat, val.years, val.residual, val.test_var)
    return search_kernel(KernelCriterion(field, tiles, area_term))


def pseudo_forecast_rate(field: ResidualField, val: ValidationRows) -> float:
    """:attr:`~geodbk.fit.residuals.ResidualField.horizon_rate`, per year, from a forecast of
    the last training quarter's validation rows of ``val`` by ``field`` conditioned on the
    earlier quarters only.

    The relative excess kappa >= 0 of those rows' variance over the field's own prediction
    (``N(r - kriged; 0, (1 + kappa)(s gp_var + s_t test_var + conditional var))``, maximum
    likelihood) is what a quarter ahead adds beyond the local kernel's time decay (a level change
    the GP's trend does not foresee); divided by the gap between the last two training quarters
    it is the rate per year. A relative excess, not an additive one: on HI's forecast split
    (validation-chosen, scored on the test quarter) it widens rural tiles, whose variance is
    larger, more than urban ones, and 95% coverage is 95.7% urban / 94.3% rural (additive:
    94.7% / 92.8%, no widening: 92.4% / 90.8%). Zero with one training quarter or fewer than
    :data:`MIN_FORECAST_ROWS` such rows.
    """
    times = np.unique(field.years)
    last_rows = np.abs(val.years - times[-1]) < 1e-6
    if len(times) < 2 or last_rows.sum() < MIN_FORECAST_ROWS:
        return 0.0
    past = field.on_rows(field.years < times[-1] - 1e-6)
    kriged, conditional = past.condition(val.lonlat[last_rows], val.years[last_rows])
    error = val.residual[last_rows] - kriged
    total = field.kernel.combine(val.gp_var[last_rows], conditional, val.test_var[last_rows])

    def criterion(kappa: float) -> float:
        return nll(error, Prediction(np.zeros_like(error), np.sqrt((1.0 + kappa) * total)))

    kappa = minimize_scalar(criterion, bounds=(0.0, 10.0), method="bounded").x
    return float(kappa) / float(times[-1] - times[-2])


def choose_volatility(field: ResidualField, val: ValidationRows, seed: int = 0) -> LocalVolatility | None:
    """The local volatility V(x) (:meth:`LocalVolatility.fit <geodbk.fit.volatility.LocalVolatility.fit>`)
    of ``field``'s training rows' squared standardised :meth:`leave_one_out
    <geodbk.fit.residuals.ResidualField.leave_one_out>` errors, chosen on up to
    :data:`~geodbk.fit.volatility.FIT_ROWS` rows of ``val`` (drawn by ``seed``) by their errors
    against the field; ``None`` when V = 1 does best."""
    error, error_var = field.leave_one_out()
    rows = val.sample(VOLATILITY_FIT_ROWS, seed)
    kriged, conditional = field.condition(rows.lonlat, rows.years)
    return LocalVolatility.fit(
        field.projection, field.xy_m, error**2 / error_var, rows.lonlat, rows.residual - kriged,
        field.kernel.combine(rows.gp_var, conditional, rows.test_var),
    )
