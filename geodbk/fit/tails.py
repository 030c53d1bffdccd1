"""The distribution of a new measurement: :class:`MeasurementTails`, chosen on validation rows.

A tile's latent speed f is Gaussian under every GP kind, and so are the maps of the tile mean.
A new measurement y = f + noise is not: speed tests have a heavy lower tail. On HI's random
split, 1.2% of dbk-rbf's test rows lie more than 3 Gaussian sds from the mean, down to -7
sds, and carry 0.11 of the 0.65 nats of its test NLL. So the new-measurement distribution is
a Student-t with the Gaussian one's mean, ``df`` degrees of freedom, and the Gaussian one's
variance with its noise part (what a measurement of k tests adds to the tile mean's variance)
scaled by ``noise_scale^2``, both chosen by the NLL of the validation rows (``df = inf`` keeps
it Gaussian). Scaling only the noise part keeps a measurement at least as uncertain as the
tile mean it measures. It changes the scoring of new measurements (NLL, CRPS, their 95%
interval) and nothing on a map.

A measurement's centre moves with its test count. An Ookla tile's speed is the mean of its k
tests' speeds, and the log of a mean of k skewed speeds grows with k (Jensen's inequality: for
lognormal speeds of log-variance s^2 it rises by up to s^2 / 2), while busy tiles also sit where
the network is better. The GP's mean at a place is an average over tiles of every test count,
so, at unseen places (HI's spatial-block validation rows), one-test tiles come out 0.13 log10
below it and tiles of 9 or more tests 0.2 above. A new measurement of k tests is therefore
centred at ``mean + tests_shift (1/k - tests_centre)``, with ``tests_centre`` the training rows'
mean 1/k (so that the shift is zero on average where the model was fitted) and ``tests_shift``
chosen with the t's scale by the validation rows' NLL.
It too changes only the scoring of new measurements, never a map of tile means.

A t is the marginal of a Gaussian whose variance is drawn from an inverse gamma, the usual
robust likelihood in GP software (GPyTorch's ``StudentTLikelihood``). Here it is fitted after
the model, on rows the model did not train on, as a calibration layer; the model's own
likelihood stays Gaussian, so that every joint-posterior formula stays closed-form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import minimize

from geodbk.fit.metrics import nll
from geodbk.prediction import Prediction

#: Degrees of freedom tried (inf = Gaussian). Below 3 the variance is infinite or nearly so.
DF_GRID = (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, math.inf)
#: Bounds of ``noise_scale``.
NOISE_SCALE_BOUNDS = (0.25, 4.0)
#: Bounds of ``tests_shift`` (log10 units per unit of 1/tests; HI's and PR's fits choose -0.1 to -0.4).
TESTS_SHIFT_BOUNDS = (-1.0, 1.0)


@dataclass(frozen=True)
class MeasurementTails:
    """A new measurement's family: Student-t with ``df`` degrees of freedom (``inf``: Gaussian)
    and variance ``sd^2 + noise_scale^2 (measurement_sd^2 - sd^2)`` from a Gaussian
    :class:`~geodbk.prediction.Prediction`'s tile-mean ``sd`` and ``measurement_sd``.

    Attributes:
        df: degrees of freedom, > 2, or ``inf``.
        noise_scale: the factor on the sd of the measurement's noise beyond the tile mean (> 0).
        validation_nll: the mean NLL of the rows it was chosen on (NaN when not fitted).
        tests_shift: log10 units that a measurement's centre moves per unit of 1/k - tests_centre
            (k its test count; negative: fewer tests, lower centre); 0 keeps the GP's mean.
        tests_centre: the training rows' mean 1/k, where the shift is zero.
    """

    df: float = math.inf
    noise_scale: float = 1.0
    validation_nll: float = math.nan
    tests_shift: float = 0.0
    tests_centre: float = 0.0

    def apply(self, prediction: Prediction, tests: np.ndarray | None = None) -> Prediction:
        """``prediction`` with its new-measurement distribution set to this family, for
        measurements of ``tests`` (n,) tests (``None``: no shift). A prediction without
        ``measurement_sd`` is returned as it is; the tile-mean distribution never changes."""
        if prediction.measurement_sd is None:
            return prediction
        noise_var = np.maximum(prediction.measurement_sd**2 - prediction.sd**2, 0.0)
        measurement_sd = np.sqrt(prediction.sd**2 + self.noise_scale**2 * noise_var)
        shift = None if tests is None or self.tests_shift == 0.0 else self.tests_shift * (
            1.0 / np.asarray(tests, dtype=np.float64) - self.tests_centre)
        return replace(prediction, measurement_sd=measurement_sd, measurement_df=self.df, measurement_shift=shift)

    def to_payload(self) -> dict[str, float]:
        return {"df": self.df, "noise_scale": self.noise_scale, "validation_nll": self.validation_nll,
                "tests_shift": self.tests_shift, "tests_centre": self.tests_centre}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> MeasurementTails:
        """The family of :meth:`to_payload` (files written before the test-count shift have none: 0)."""
        return cls(float(payload["df"]), float(payload["noise_scale"]), float(payload["validation_nll"]),
                   float(payload.get("tests_shift", 0.0)), float(payload.get("tests_centre", 0.0)))


def fit_measurement_tails(
    y: np.ndarray, prediction: Prediction, tests: np.ndarray | None = None, train_tests: np.ndarray | None = None
) -> MeasurementTails:
    """The :class:`MeasurementTails` with the lowest mean NLL of ``y`` (n,) under the new-measurement
    distribution it gives the Gaussian ``prediction`` (whose ``measurement_sd`` it scales; without
    one there is no noise part and only ``df`` matters).

    For each ``df`` of :data:`DF_GRID`, ``noise_scale`` (log space, within
    :data:`NOISE_SCALE_BOUNDS`) and, given the rows' ``tests`` (n,) and the training rows'
    ``train_tests`` (m,) (their mean 1/tests is ``tests_centre``), ``tests_shift`` (within
    :data:`TESTS_SHIFT_BOUNDS`) are chosen together by bounded L-BFGS-B; the t's own likelihood
    chooses the shift, so that a few very slow one-test rows do not pull it as they would a
    least-squares slope. The shift has no
    intercept of its own (zero at the training rows' mean 1/tests), and rows whose test counts
    are all equal get none.
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    shifted = (tests is not None and train_tests is not None and prediction.measurement_sd is not None
               and np.ptp(np.asarray(tests, dtype=np.float64)) > 0)  # equal counts: a shift would be an offset
    centre = 0.0
    if shifted and train_tests is not None:
        centre = float(np.mean(1.0 / np.asarray(train_tests, dtype=np.float64)))
    log_bounds = tuple(math.log(b) for b in NOISE_SCALE_BOUNDS)
    best = MeasurementTails(validation_nll=math.inf)
    for df in DF_GRID:

        def score(params: np.ndarray, df: float = df) -> float:
            family = MeasurementTails(df, math.exp(params[0]), tests_shift=float(params[1]) if shifted else 0.0,
                                      tests_centre=centre)
            return nll(y, family.apply(prediction, tests).measurement())

        found = minimize(score, np.zeros(2), method="L-BFGS-B",
                         bounds=[log_bounds, TESTS_SHIFT_BOUNDS if shifted else (0.0, 0.0)])
        if found.fun < best.validation_nll:
            best = MeasurementTails(df, math.exp(found.x[0]), float(found.fun), float(found.x[1]), centre)
    return best
