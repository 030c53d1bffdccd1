"""The distribution of a new measurement: :class:`MeasurementTails`, chosen on validation rows.

A tile's latent speed f is Gaussian under every GP kind, and so are the maps of the tile mean.
A new measurement y = f + noise is not: a single speed test has a long lower tail. On HI's
held-out blocks, the standardised errors of dbk-rbf's validation rows have mean 0.01 and median
+0.12, with 5% and 95% quantiles at -1.72 and +1.37, and for one-test tiles the median is +0.22.
So a new measurement gets a sinh-arcsinh normal :class:`~geodbk.shape.Shape` with the Gaussian
one's mean (its median above the mean, its lower tail long), and the Gaussian one's variance
with its noise part (what a measurement of k tests adds to the tile mean's variance) scaled by
``noise_scale^2``; the skew, the tail weight and the scale are chosen together by the NLL of the
validation rows. Scaling only the noise part keeps a measurement at least as uncertain as the
tile mean it measures. It changes the scoring of new measurements (NLL, CRPS, their 95%
interval, P(meets) of a tile's next measurement) and nothing on a map.

A measurement's centre moves with its test count. An Ookla tile's speed is the mean of its k
tests' speeds, and the log of a mean of k skewed speeds grows with k (Jensen's inequality: for
lognormal speeds of log-variance s^2 it rises by up to s^2 / 2), while busy tiles also sit where
the network is better. The GP's mean at a place is an average over tiles of every test count,
so, at unseen places (HI's spatial-block validation rows), one-test tiles come out 0.13 log10
below it and tiles of 9 or more tests 0.2 above. A new measurement of k tests therefore has
mean ``mean + tests_shift (1/k - tests_centre)``, with ``tests_centre`` the training rows'
mean 1/k (so that the shift is zero on average where the model was fitted) and ``tests_shift``
chosen with the shape and scale by the validation rows' NLL.
It too changes only the scoring of new measurements, never a map of tile means.

The family is fitted after the model, on rows the model did not train on, as a calibration
layer; the model's own likelihood stays Gaussian, so that every joint-posterior formula stays
closed-form. Model files written before 2026-11-27 hold a symmetric Student-t instead (the
robust likelihood of GP software, GPyTorch's ``StudentTLikelihood``), and load as one. On the
same fits the sinh-arcsinh family lowered the test NLL of a new measurement by 0.02-0.07 against
the t on PR and HI, every split (docs/decision-calibration.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import minimize

from geodbk.fit.metrics import nll
from geodbk.prediction import Prediction
from geodbk.shape import GAUSSIAN, Shape

#: Bounds of ``noise_scale``.
NOISE_SCALE_BOUNDS = (0.25, 4.0)
#: Bounds of ``tests_shift`` (log10 units per unit of 1/tests; PR's and HI's fits choose -0.03 to -0.3).
TESTS_SHIFT_BOUNDS = (-1.0, 1.0)
#: Bounds of the shape's skew (PR's and HI's fits choose -0.2 to -0.45).
SKEW_BOUNDS = (-2.0, 2.0)
#: Bounds of the shape's tail weight (PR's and HI's fits choose 0.76-0.98).
TAILWEIGHT_BOUNDS = (0.2, 5.0)
#: The prior that holds the family near what the shipped regions choose when validation rows
#: are few: independent Gaussians on (log noise_scale, tests_shift, skew, log tailweight) with
#: these centres and sds. It is one more term of the rows' total log-likelihood, so its pull
#: on the mean NLL falls as 1 / rows: negligible on PR's and HI's 3,000-15,000 validation rows,
#: decisive on a small island's 100 (where the unheld fit once chose a skew of -2 with tail
#: weight 1.7 and raised the test NLL from 0.68 to 0.95). The centres sit among PR's and HI's
#: choices; the sds' strength was chosen by 5-fold cross-validation on the validation rows of
#: six cropped regions (docs/small-regions.md). The tail weight's centre, 0.8 (heavier tails than
#: the Gaussian's), was chosen on those crops' nested validation rows (``bench_regions.py --eval
#: nested``) over 0.7-1.0: -0.007 (random) and -0.001 (spatial-block) against 1.0 for dbk-rbf,
#: and as much for GPBoost and LightGBM, whose families are chosen the same way; PR and HI, with
#: 2,800-15,000 validation rows, moved by 0.0003 or less (HI forecast -0.001).
PRIOR_CENTRE = (0.0, -0.15, -0.35, math.log(0.8))
PRIOR_SD = (0.16, 0.08, 0.16, 0.08)


def tests_term(tests: np.ndarray, centre: float) -> np.ndarray:
    """(n,) ``1 / tests - centre`` for rows of ``tests`` (n,) tests: the regressor of a test count's
    effect on a tile's log speed, zero at ``centre`` (the training rows' mean 1/tests,
    :func:`mean_inverse_tests`)."""
    return 1.0 / np.asarray(tests, dtype=np.float64) - centre


def mean_inverse_tests(tests: np.ndarray) -> float:
    """The mean 1/tests of rows of ``tests`` (n,) tests, where :func:`tests_term` is zero."""
    return float(np.mean(1.0 / np.asarray(tests, dtype=np.float64)))


@dataclass(frozen=True)
class MeasurementTails:
    """A new measurement's family: ``shape`` (a sinh-arcsinh normal, or the Student-t of older
    files) with variance ``sd^2 + noise_scale^2 (measurement_sd^2 - sd^2)`` from a Gaussian
    :class:`~geodbk.prediction.Prediction`'s tile-mean ``sd`` and ``measurement_sd``.

    Attributes:
        shape: the standardised shape of a new measurement.
        noise_scale: the factor on the sd of the measurement's noise beyond the tile mean (> 0).
        validation_nll: the mean NLL of the rows it was chosen on (NaN when not fitted).
        tests_shift: log10 units that a measurement's mean moves per unit of 1/k - tests_centre
            (k its test count; negative: fewer tests, lower mean); 0 keeps the GP's mean.
        tests_centre: the training rows' mean 1/k, where the shift is zero.
    """

    shape: Shape = GAUSSIAN
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
        return replace(prediction, measurement_sd=measurement_sd, measurement_shape=self.shape,
                       measurement_shift=self.measurement_shift(tests))

    def measurement_shift(self, tests: np.ndarray | None) -> np.ndarray | None:
        """(n,) a new measurement's mean minus the tile mean, log10 units, for measurements of
        ``tests`` (n,) tests: ``tests_shift (1 / tests - tests_centre)``; ``None`` (no shift) for
        no tests or a zero ``tests_shift``."""
        if tests is None or self.tests_shift == 0.0:
            return None
        return self.tests_shift * tests_term(tests, self.tests_centre)

    def to_payload(self) -> dict[str, float]:
        return {**self.shape.to_payload(), "noise_scale": self.noise_scale, "validation_nll": self.validation_nll,
                "tests_shift": self.tests_shift, "tests_centre": self.tests_centre}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> MeasurementTails:
        """The family of :meth:`to_payload` (files written before the test-count shift have none: 0;
        those before the sinh-arcsinh shape hold a Student-t's ``df`` only)."""
        shape = Shape(float(payload["df"]), float(payload.get("skew", 0.0)), float(payload.get("tailweight", 1.0)))
        return cls(shape, float(payload["noise_scale"]), float(payload["validation_nll"]),
                   float(payload.get("tests_shift", 0.0)), float(payload.get("tests_centre", 0.0)))


def fit_measurement_tails(
    y: np.ndarray, prediction: Prediction, tests: np.ndarray | None = None, train_tests: np.ndarray | None = None
) -> MeasurementTails:
    """The :class:`MeasurementTails` with the lowest mean NLL of ``y`` (n,) under the new-measurement
    distribution it gives the Gaussian ``prediction`` (whose ``measurement_sd`` it scales; without
    one there is no noise part).

    The shape's skew and tail weight (within :data:`SKEW_BOUNDS` and :data:`TAILWEIGHT_BOUNDS`),
    ``noise_scale`` (within :data:`NOISE_SCALE_BOUNDS`) and, given the rows' ``tests`` (n,) and
    the training rows' ``train_tests`` (m,) (their mean 1/tests is ``tests_centre``),
    ``tests_shift`` (within :data:`TESTS_SHIFT_BOUNDS`) are chosen together by bounded L-BFGS-B
    (scales and tail weight in log space), at the posterior mode under :data:`PRIOR_CENTRE` and
    :data:`PRIOR_SD` (``validation_nll`` is the rows' mean NLL there, without the prior). The
    family's own likelihood chooses the shift, so that a few very slow one-test rows do not pull
    it as they would a least-squares slope. The shift has no intercept of its own (zero at the
    training rows' mean 1/tests), and rows whose test counts are all equal get none.
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    shifted = (tests is not None and train_tests is not None and prediction.measurement_sd is not None
               and np.ptp(np.asarray(tests, dtype=np.float64)) > 0)  # equal counts: a shift would be an offset
    centre = mean_inverse_tests(train_tests) if shifted and train_tests is not None else 0.0

    def family(params: np.ndarray) -> MeasurementTails:
        shape = Shape(skew=float(params[2]), tailweight=math.exp(params[3]))
        return MeasurementTails(shape, math.exp(params[0]), tests_shift=float(params[1]) if shifted else 0.0,
                                tests_centre=centre)

    def mean_nll(params: np.ndarray) -> float:
        return nll(y, family(params).apply(prediction, tests).measurement())

    prior_centre, prior_sd = np.asarray(PRIOR_CENTRE), np.asarray(PRIOR_SD)
    free = np.array([True, shifted, True, True])  # a fixed shift has no prior term

    def posterior(params: np.ndarray) -> float:
        return mean_nll(params) + float(np.sum((((params - prior_centre) / prior_sd) ** 2)[free])) / (2.0 * len(y))

    bounds = [tuple(math.log(b) for b in NOISE_SCALE_BOUNDS), TESTS_SHIFT_BOUNDS if shifted else (0.0, 0.0),
              SKEW_BOUNDS, tuple(math.log(b) for b in TAILWEIGHT_BOUNDS)]
    found = minimize(posterior, np.where(free, prior_centre, 0.0), method="L-BFGS-B", bounds=bounds)
    return replace(family(found.x), validation_nll=mean_nll(found.x))
