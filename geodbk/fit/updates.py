"""New tests without a refit: a fitted model conditioned on new tile rows.

A GP kind's map model is the deep kernel's posterior plus the local residual field conditioned
on the training rows' residuals (:mod:`geodbk.fit.residuals`). A new row enters as a training
row does at fit time: its residual against the deep kernel's mean, less the field's slope in
1/tests, with the GP's tile-mean and test-count variances there, is added to the field's rows,
and every later prediction is conditioned on its nearest rows, old and new. Given the same deep
kernel, the result is exactly the field the fit would have built with those rows among its
training rows and the same slope (a test checks it). A model's kriging part
(:mod:`geodbk.fit.averaging`) is conditioned the same way, on its own residuals. The deep
kernel's weights, the field's kernel, its slope in 1/tests, the forecast rate and the local
volatility stay as fitted: they are chosen on the fit's rows, and a refit (``geodbk fit``)
re-chooses them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from geodbk.dataset.targets import target_column
from geodbk.errors import InputDataError, extrapolation_said
from geodbk.quarters import quarter_years

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.fit.geomodel import GeoModel

#: Columns every new row needs besides its targets' ``y`` columns.
ROW_COLUMNS = ("lon", "lat", "year", "quarter", "tests")


def condition_on_rows(model: GeoModel, rows: pd.DataFrame) -> GeoModel:
    """``model`` conditioned on ``rows`` (columns :data:`ROW_COLUMNS` and each target's
    :func:`~geodbk.dataset.spatial_dataset.target_column`), for every target; see the module text.

    Raises:
        InputDataError: for a model without a residual field, missing columns, no rows or
            values that are not finite.
    """
    needed = [*ROW_COLUMNS, *(target_column(model.info.target, target) for target in model.targets)]
    missing = [name for name in needed if name not in rows.columns]
    if missing:
        raise InputDataError(f"new rows need the columns {', '.join(missing)}")
    if len(rows) == 0:
        raise InputDataError("there are no new rows to condition on")
    lonlat = rows[["lon", "lat"]].to_numpy(np.float64)
    years = quarter_years(rows["year"], rows["quarter"])
    tests = rows["tests"].to_numpy(np.float64)
    if not (np.isfinite(lonlat).all() and (tests >= 1).all()):
        raise InputDataError("new rows need finite lon/lat and at least one test each")
    updated = {target: _condition_target(model.for_target(target), lonlat, years, tests,
                                         rows[target_column(model.info.target, target)].to_numpy(np.float64))
               for target in model.targets}
    first = updated.pop(model.info.target)
    return replace(first, others=updated, correlation=model.correlation)


def _condition_target(
    model: GeoModel, lonlat: np.ndarray, years: np.ndarray, tests: np.ndarray, y: np.ndarray
) -> GeoModel:
    if model.residuals is None:
        raise InputDataError(f"the {model.kind} model has no local residual field to condition on new rows")
    if not np.isfinite(y).all():
        raise InputDataError(f"new rows have {int((~np.isfinite(y)).sum())} {model.info.target} values that are "
                             "not finite (log10 of a positive speed)")
    gp = model.regressor.predict(model.features(lonlat, years), tests=tests)
    field = model.residuals.with_rows(lonlat, years, y - gp.mean, gp.sd**2, gp.measurement().sd**2 - gp.sd**2, tests)
    support = lonlat if model.support is None else np.unique(np.concatenate([model.support, lonlat]), axis=0)
    info = replace(model.info, n_train=model.info.n_train + len(y))
    kriging = None
    if model.kriging is not None:
        with extrapolation_said():  # its places are the deep part's, which warned
            kriging = _condition_target(model.kriging, lonlat, years, tests, y)
    return replace(model, residuals=field, support=support, info=info, kriging=kriging)


__all__ = ["ROW_COLUMNS", "condition_on_rows"]
