"""The distribution of a new measurement: :class:`MeasurementTails`, chosen on validation rows.

A tile's latent speed f is Gaussian under every GP kind, and so are the maps of the tile mean.
A new measurement y = f + noise is not: speed tests have a heavy lower tail (a tile whose few
tests came from a phone in a basement). On HI's random split, 1.2% of dbk-rbf's test rows
lie more than 3 Gaussian sds from the mean, down to -7 sds, and carry 0.11 of the 0.65 nats of
its test NLL. So the new-measurement distribution is a Student-t with the Gaussian one's mean,
the sd ``sd_scale`` times the Gaussian one's, and ``df`` degrees of freedom, both chosen by
the NLL of the validation rows (``df = inf`` keeps it Gaussian). It changes the scoring of new
measurements (NLL, CRPS, their 95% interval) and nothing on a map.

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
from scipy.optimize import minimize_scalar

from geodbk.fit.metrics import nll
from geodbk.prediction import Prediction

#: Degrees of freedom tried (inf = Gaussian). Below 3 the variance is infinite or nearly so.
DF_GRID = (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, math.inf)
#: Bounds of ``sd_scale``.
SD_SCALE_BOUNDS = (0.5, 2.0)


@dataclass(frozen=True)
class MeasurementTails:
    """A new measurement's family: Student-t with ``df`` degrees of freedom and the Gaussian
    measurement sd times ``sd_scale`` (``df = inf``: Gaussian).

    Attributes:
        df: degrees of freedom, > 2, or ``inf``.
        sd_scale: the factor on the measurement sd (> 0).
        validation_nll: the mean NLL of the rows it was chosen on (NaN when not fitted).
    """

    df: float = math.inf
    sd_scale: float = 1.0
    validation_nll: float = math.nan

    def apply(self, prediction: Prediction) -> Prediction:
        """``prediction`` with its new-measurement distribution set to this family (a prediction
        without ``measurement_sd`` is returned as it is; the tile-mean distribution never changes)."""
        if prediction.measurement_sd is None:
            return prediction
        return replace(prediction, measurement_sd=prediction.measurement_sd * self.sd_scale, measurement_df=self.df)

    def to_payload(self) -> dict[str, float]:
        return {"df": self.df, "sd_scale": self.sd_scale, "validation_nll": self.validation_nll}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> MeasurementTails:
        return cls(float(payload["df"]), float(payload["sd_scale"]), float(payload["validation_nll"]))


def fit_measurement_tails(y: np.ndarray, prediction: Prediction) -> MeasurementTails:
    """The :class:`MeasurementTails` with the lowest mean NLL of ``y`` (n,) under the new-measurement
    distribution of ``prediction`` (its ``measurement_sd``, else ``sd``): for each ``df`` of
    :data:`DF_GRID`, ``sd_scale`` by bounded scalar minimisation in log space."""
    measured = prediction.measurement()
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    best = MeasurementTails(validation_nll=math.inf)
    for df in DF_GRID:

        def score(log_scale: float, df: float = df) -> float:
            return nll(y, Prediction(measured.mean, measured.sd * math.exp(log_scale), df=df))

        found = minimize_scalar(score, bounds=tuple(math.log(b) for b in SD_SCALE_BOUNDS), method="bounded",
                                options={"xatol": 1e-4})
        if found.fun < best.validation_nll:
            best = MeasurementTails(df, math.exp(found.x), float(found.fun))
    return best
