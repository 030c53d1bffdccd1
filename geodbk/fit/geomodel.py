"""A fitted model in geographic terms: :class:`GeoModel` = Regressor + InputSpace (+ ResidualField).

Inputs are lon/lat in degrees (EPSG:4326) and, for space-time models, a quarter; the
:class:`~geodbk.dataset.inputs.InputSpace` maps them to what the regressor was fitted on. Space-time
GP kinds add tile-scale detail from a :class:`~geodbk.fit.residuals.ResidualField` (a local
kernel conditioned on their training residuals), and space-time models score a new measurement
with the skewed family of :class:`~geodbk.fit.tails.MeasurementTails`. A space-time GP fit also
holds a kriging part (:attr:`GeoModel.kriging`), whose distribution every product averages with
the deep part's (:mod:`geodbk.fit.averaging`). Outputs are in
the target's log10 units. Asking about places or quarters outside the fitted domain warns with
an :class:`~geodbk.errors.ExtrapolationWarning`.

Size: one class over 450 lines, because every method reads the same fitted parts (the
regressor, its inputs, the residual field's one combination rule); the map-facing helpers
(quarters, change spans, domain checks) are thin and sit beside the ``grid`` they serve, and the
decision-facing ones (targets, posterior, condition) hand over to :mod:`geodbk.fit.sites` and
:mod:`geodbk.fit.updates`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import pandas as pd
import pyproj
import shapely
import torch
import xarray as xr
from scipy.spatial import cKDTree

from geodbk.dataset.coords import CoordinateTransform, ProjectedTransform
from geodbk.dataset.domain import DomainReport, fitted_area
from geodbk.dataset.inputs import InputSpace, TimeLike, parse_time
from geodbk.dataset.model_info import ModelInfo
from geodbk.errors import ExtrapolationWarning, InputDataError, extrapolation_said
from geodbk.fit.averaging import average_changes, average_predictions
from geodbk.fit.posterior import MapPosterior
from geodbk.fit.regressor import Regressor, read_payload, write_payload
from geodbk.fit.residuals import ResidualField
from geodbk.fit.sites import map_posterior
from geodbk.fit.tails import MeasurementTails
from geodbk.fit.targets import TargetCorrelation
from geodbk.fit.updates import condition_on_rows
from geodbk.ingest.quadkey import OOKLA_ZOOM
from geodbk.ingest.regions import Region
from geodbk.maps.geometry import RegionLike, RegularGrid
from geodbk.maps.plan import MapPlan, refuse_outside
from geodbk.maps.predict import predict_plan
from geodbk.maps.thresholds import DEFAULT, Benchmark
from geodbk.models.zoo import get_model_spec
from geodbk.prediction import ChangePrediction, Prediction
from geodbk.quarters import Quarter, quarter_years

if TYPE_CHECKING:  # pragma: no cover - typing only
    from distributed import Client

_FORMAT = "geodbk.fit.geomodel/2"
#: What :meth:`GeoModel.map_time` reads: ``"latest"``, ``"all"``, one quarter or a list of them
#: (:class:`Quarter` values or ``"2023Q4"`` labels).
QuartersLike = str | Quarter | Sequence[Quarter | str]


def _lonlat(a: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 1 and arr.shape[0] == 2:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InputDataError(f"{name} must have shape (n, 2) as (lon, lat) degrees, got {arr.shape}")
    return arr


@dataclass
class GeoModel:
    """A regressor plus what is needed to use it on a map.

    Attributes:
        regressor: the fitted model on the input space's coordinates.
        inputs: lon/lat (+ quarter) -> model inputs, and the fitted domain.
        info: what the model was fitted on: kind, target, units, region (its name and polygon,
            see :meth:`fitted_region`), quarters, protocol, split.
        support: (m, 2) lon/lat degrees of the distinct training tiles (for
            :meth:`distance_to_data`), or ``None``.
        residuals: the local residual field added to the regressor's predictions, or ``None``.
        tails: the family of a new measurement (chosen on validation rows), or ``None``: Gaussian.
        others: the models of the dataset's other targets (upload beside download), fitted on the
            same rows; empty for a one-target model. See :attr:`targets`.
        correlation: the correlation of the two targets' errors (chosen on validation rows), or
            ``None`` for a one-target model.
        kriging: the kriging part, or ``None``: a map model of the same rows (its own regressor,
            reading the quarter alone, and residual field; no tails) whose distribution every
            prediction averages with this one's (:mod:`geodbk.fit.averaging`).
    """

    regressor: Regressor
    inputs: InputSpace
    info: ModelInfo
    support: np.ndarray | None = None
    residuals: ResidualField | None = None
    tails: MeasurementTails | None = None
    others: dict[str, GeoModel] = field(default_factory=dict)
    correlation: TargetCorrelation | None = None
    kriging: GeoModel | None = None
    _support_index: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return self.regressor.kind

    @property
    def targets(self) -> tuple[str, ...]:
        """The targets this model predicts: ``("download",)``, or ``("download", "upload")`` for a
        model fitted on a two-target dataset (``geodbk ingest --target download,upload``)."""
        return (self.info.target, *self.others)

    def for_target(self, target: str) -> GeoModel:
        """The one-target model of ``target`` (this model for its own target).

        Raises:
            InputDataError: for a target the model was not fitted on.
        """
        if target == self.info.target:
            return self if not self.others else replace(self, others={}, correlation=None)
        if target not in self.others:
            raise InputDataError(f"the {self.kind} model predicts {', '.join(self.targets)}, not {target!r}")
        return self.others[target]

    def posterior(
        self, lonlat: np.ndarray, time: TimeLike = None, *, groups: np.ndarray | None = None,
        n_groups: int | None = None, weights: np.ndarray | None = None, covariance: bool = True,
    ) -> MapPosterior:
        """The joint Gaussian of the model's targets (log10 units) at points ``lonlat`` (n, 2)
        degrees and one quarter ``time``, or at the weighted means of their ``groups`` (n,)
        integers in [0, n_groups) (hexagons, polygons): a :class:`~geodbk.fit.posterior.MapPosterior`
        with the measurement likelihood of new tests there (:mod:`geodbk.fit.sites`).
        ``covariance=False`` keeps each site's own distribution only (cheap, for marginals)."""
        self._require_kernel()
        return map_posterior(self, lonlat, time, groups=groups, n_groups=n_groups, weights=weights,
                             covariance=covariance)

    def condition(self, rows: pd.DataFrame) -> GeoModel:
        """This model conditioned on new tile rows without a refit (:func:`~geodbk.fit.updates.condition_on_rows`):
        ``rows`` has columns lon, lat, year, quarter, tests and ``y`` (log10 of the first target;
        ``y_<target>`` for the others). Returns a new model; this one is unchanged."""
        return condition_on_rows(self, rows)

    @property
    def has_kernel(self) -> bool:
        """Whether :meth:`kernel_slice` and :meth:`prior_variance` exist (GP kinds; not knn or dnn)."""
        return self.regressor.has_kernel

    @property
    def latest_quarter(self) -> Quarter | None:
        """The last fitted quarter (:attr:`ModelInfo.last_fitted_quarter
        <geodbk.dataset.model_info.ModelInfo.last_fitted_quarter>`, the default of every ``time``
        argument), or None for a time-free model."""
        return None if self.inputs.time is None else self.info.last_fitted_quarter

    def domain_report(self, lonlat: np.ndarray, times: Sequence[TimeLike] = (None,)) -> DomainReport:
        """How far ``lonlat`` (n, 2) degrees (e.g. a sample of a map's cells) at each quarter of
        ``times`` (as in :meth:`features`; None = the latest fitted) leave the fitted domain
        (:meth:`InputSpace.domain`, named after this model). Quarters are ignored by a time-free model."""
        area = fitted_area(self.info.region_wkb_hex)  # inside the fitted region is not extrapolation
        report = self.inputs.domain(_lonlat(lonlat, "lonlat"), times, region=area)
        return replace(report, kind=self.kind, region=self.info.region)

    def features(self, lonlat: np.ndarray, time: TimeLike = None, *, name: str = "lonlat") -> np.ndarray:
        """Model inputs (n, d) for ``lonlat`` (n, 2) degrees at ``time``; warns when extrapolating.

        ``time``: ``"2023Q4"``, decimal years (scalar or (n,)), or ``None`` = the latest
        fitted quarter; ignored by a time-free (paper protocol) model.
        """
        lonlat = _lonlat(lonlat, name)
        X = self.inputs.features(lonlat, time)
        area = fitted_area(self.info.region_wkb_hex)  # inside the fitted region is not extrapolation
        problem = self.inputs.extrapolation(lonlat, time, xy=X[:, :2], region=area)  # xy: not projected again
        if problem is not None:
            warnings.warn(f"{self.kind}: {problem}", ExtrapolationWarning, stacklevel=3)
        return X

    def _years(self, when: TimeLike, n: int) -> np.ndarray:
        """(n,) decimal years of ``when`` for a model with time (every model with a residual field)."""
        years = self.inputs.years(when, n)
        assert years is not None  # residual fields come with a time axis
        return years

    def predict(
        self, lonlat: np.ndarray, time: TimeLike = None, *, tests: np.ndarray | None = None, batch_size: int = 65536
    ) -> Prediction:
        """Predictive distribution of log10(value) at ``lonlat`` (n, 2) degrees and ``time``.

        ``sd`` is the tile-mean distribution; ``tests`` (n,) adds ``measurement_sd`` (and
        ``measurement_shape``, from :attr:`tails`) for new measurements of that many tests (see
        :class:`~geodbk.prediction.Prediction`).
        """
        lonlat = _lonlat(lonlat, "lonlat")  # features here, so that a warning names the caller's line
        return self._predict(lonlat, self.features(lonlat, time), time, tests, batch_size)[0]

    def predict_with_parts(
        self, lonlat: np.ndarray, time: TimeLike = None, *, tests: np.ndarray | None = None, batch_size: int = 65536
    ) -> tuple[Prediction, tuple[Prediction, Prediction] | None]:
        """:meth:`predict`, and from the same pass the deep part's and the :attr:`kriging` part's own
        predictions that it averages (before the tails), or ``None`` for a model without a kriging part."""
        lonlat = _lonlat(lonlat, "lonlat")
        return self._predict(lonlat, self.features(lonlat, time), time, tests, batch_size)

    def _predict(
        self, lonlat: np.ndarray, X: np.ndarray, time: TimeLike, tests: np.ndarray | None, batch_size: int
    ) -> tuple[Prediction, tuple[Prediction, Prediction] | None]:
        """:meth:`predict_with_parts` at ``lonlat`` (n, 2) degrees, whose model inputs are ``X``."""
        prediction = self.regressor.predict(X, tests=tests, batch_size=batch_size)
        if self.residuals is not None:
            years = self._years(time, len(lonlat))
            factor = self.residuals.variance_factor(lonlat, years)
            prediction = self._with_residuals(prediction, *self.residuals.condition(lonlat, years), factor)
        parts = None
        if self.kriging is not None:
            with extrapolation_said():
                parts = (prediction, self.kriging.predict(lonlat, time, tests=tests, batch_size=batch_size))
            prediction = average_predictions(*parts)
        return (prediction if self.tails is None else self.tails.apply(prediction, tests)), parts

    @property
    def deep_part(self) -> GeoModel:
        """This model without its :attr:`kriging` part and tails (itself when it has no kriging part)."""
        return self if self.kriging is None else replace(self, kriging=None, tails=None)

    def _combine(
        self, gp_var: np.ndarray, local_var: np.ndarray | float, factor: np.ndarray | float = 1.0,
        test_noise: np.ndarray | float = 0.0,
    ) -> np.ndarray:
        """The map model's (co)variance, the one rule: F (s var_GP + local var + s_t test noise),
        F the variance factor (:meth:`~geodbk.fit.residuals.ResidualField.variance_factor`: the
        forecast horizon's times the local volatility; a covariance of two points takes the square
        root of the product of theirs) and s, s_t the residual kernel's scales (the local field's
        mean shift adds to mu_GP)."""
        assert self.residuals is not None  # only called with a residual field
        return factor * self.residuals.kernel.combine(gp_var, local_var, test_noise)

    def _with_residuals(
        self, prediction: Prediction, shift: np.ndarray, var: np.ndarray, factor: np.ndarray
    ) -> Prediction:
        """The GP's prediction plus the local field's kriged residual ``shift`` and its conditional
        ``var``, with the points' variance ``factor`` (:meth:`_combine`; a measurement adds the
        test-count noise)."""
        tile_var = prediction.sd**2
        measurement_sd = None if prediction.measurement_sd is None else np.sqrt(
            self._combine(tile_var, var, factor, prediction.measurement_sd**2 - tile_var))
        return Prediction(prediction.mean + shift, np.sqrt(self._combine(tile_var, var, factor)), measurement_sd)

    def predict_series(
        self, lonlat: np.ndarray, times: Sequence[TimeLike], *, batch_size: int = 65536
    ) -> list[Prediction]:
        """Tile-mean predictions at ``lonlat`` (n, 2) degrees for each of several quarters, one
        :class:`Prediction` per entry of ``times``: :meth:`predict` at each (the local residual
        field conditions each quarter on its own nearest rows in space and time)."""
        lonlat = _lonlat(lonlat, "lonlat")
        return [self.predict(lonlat, when, batch_size=batch_size) for when in times]

    def predict_tiles(self, tiles: pd.DataFrame) -> Prediction:
        """Predictions for dataset rows (columns lon, lat, year, quarter, tests): each at its own
        quarter, with ``measurement_sd`` for its own test count."""
        lonlat, years = tiles[["lon", "lat"]].to_numpy(np.float64), quarter_years(tiles["year"], tiles["quarter"])
        return self.predict(lonlat, years, tests=tiles["tests"].to_numpy(np.float64))

    def predict_change(self, lonlat: np.ndarray, time_from: TimeLike, time_to: TimeLike = None) -> ChangePrediction:
        """The change of the latent log10 surface at ``lonlat`` (n, 2) degrees from quarter
        ``time_from`` to ``time_to`` (default the latest fitted), with its joint-posterior sd.

        Var = s ||L^T (phi(x, t_to) - phi(x, t_from))||^2 (+ the residual covariance of
        inducing-point kinds) + the local residual field's joint variance of the change
        (:meth:`~geodbk.fit.residuals.ResidualField.change_variance`). The tile-quarter noise
        sigma0^2 is not part of the latent surface, so it is not in the change. A quarter after
        the fitted ones has its covariances scaled by the forecast factor F(t) (as in
        :meth:`predict`): Var = F_to v_to + F_from v_from - 2 sqrt(F_to F_from) Cov.
        """
        self._require_kernel()
        if self.inputs.time is None:
            raise InputDataError(
                f"the {self.kind} model is time-free ({self.inputs.protocol} protocol); it has no change"
            )
        if self.kriging is not None:
            deep = self.deep_part.predict_change(lonlat, time_from, time_to)
            with extrapolation_said():
                return average_changes(deep, self.kriging.predict_change(lonlat, time_from, time_to))
        lonlat = _lonlat(lonlat, "lonlat")
        X_from, X_to = self.features(lonlat, time_from), self.features(lonlat, time_to)
        before, after = self.predict_series(lonlat, [time_from, time_to])
        var = self.regressor.difference_variance(X_from, X_to)
        nugget_from, nugget_to = (self.regressor.tile_noise_variance(X) for X in (X_from, X_to))  # not in f
        factor_from = factor_to = np.ones(len(lonlat))
        if self.residuals is not None:
            years_from = self._years(time_from, len(lonlat))
            years_to = self._years(time_to, len(lonlat))
            var = self._combine(var, self.residuals.change_variance(lonlat, years_from, years_to))
            nugget_from, nugget_to = self._combine(nugget_from, 0.0), self._combine(nugget_to, 0.0)
            factor_from = self.residuals.variance_factor(lonlat, years_from)
            factor_to = self.residuals.variance_factor(lonlat, years_to)
        v_from = np.maximum(before.sd**2 / factor_from - nugget_from, 0.0)
        v_to = np.maximum(after.sd**2 / factor_to - nugget_to, 0.0)
        covariance = 0.5 * (v_from + v_to - var)
        var = factor_to * v_to + factor_from * v_from - 2.0 * np.sqrt(factor_from * factor_to) * covariance
        change = after.mean - before.mean
        return ChangePrediction(change, np.sqrt(np.maximum(var, 0.0)), before.mean, after.mean,
                                np.sqrt(factor_from * v_from), np.sqrt(factor_to * v_to))

    @overload
    def predict_areas(
        self, lonlat: np.ndarray, groups: np.ndarray, n_groups: int | None = None, time: TimeLike = None, *,
        weights: np.ndarray | None = None, return_cells: Literal[False] = False,
    ) -> Prediction: ...

    @overload
    def predict_areas(
        self, lonlat: np.ndarray, groups: np.ndarray, n_groups: int | None = None, time: TimeLike = None, *,
        weights: np.ndarray | None = None, return_cells: Literal[True],
    ) -> tuple[Prediction, Prediction]: ...

    def predict_areas(
        self,
        lonlat: np.ndarray,
        groups: np.ndarray,
        n_groups: int | None = None,
        time: TimeLike = None,
        *,
        weights: np.ndarray | None = None,
        return_cells: bool = False,
    ) -> Prediction | tuple[Prediction, Prediction]:
        """Averages of the tile-mean log10 value over groups of points (e.g. the grid cells in
        each polygon), with their joint-posterior sd: ``Prediction`` of shape (n_groups,), and
        with ``return_cells`` also the points' own tile-mean predictions, (n,), as
        :meth:`predict` gives them (from the same pass: a summary predicts each cell once).

        Args:
            lonlat: (n, 2) degrees.
            groups: (n,) integers in [0, n_groups): the group of each point.
            n_groups: default ``groups.max() + 1``.
            time: one quarter (as in :meth:`features`).
            weights: (n,) weights within each group (default equal); they are normalised to
                sum to 1 per group.

        The variance is exact for the GP: ``s (||L^T sum_i w_i phi_i||^2 + sigma0^2 sum_i w_i^2)``
        for a basis GP (each cell's tile-quarter noise is independent), with the Nystrom
        residual of inducing-point kinds added pairwise. The local residual field adds
        :meth:`~geodbk.fit.residuals.ResidualField.area_condition`. Each point's variance factor
        F_i (:meth:`~geodbk.fit.residuals.ResidualField.variance_factor`) scales the covariances,
        so the variance is that of ``sum_i w_i sqrt(F_i) f_i``. A group without points gets NaN.
        With a :attr:`kriging` part, both parts' areas and cells are averaged.
        """
        self._require_kernel()
        if self.kriging is not None:
            deep = self.deep_part.predict_areas(lonlat, groups, n_groups, time, weights=weights, return_cells=True)
            with extrapolation_said():
                other = self.kriging.predict_areas(lonlat, groups, n_groups, time, weights=weights, return_cells=True)
            areas, cells = (average_predictions(a, b) for a, b in zip(deep, other, strict=True))
            return (areas, cells) if return_cells else areas
        lonlat = _lonlat(lonlat, "lonlat")
        groups = np.asarray(groups, dtype=np.int64).reshape(-1)
        if len(groups) != len(lonlat):
            raise InputDataError(f"groups has {len(groups)} values for {len(lonlat)} points")
        n_groups = int(groups.max()) + 1 if n_groups is None and len(groups) else int(n_groups or 0)
        w = np.ones(len(lonlat)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(w) != len(lonlat) or not (np.isfinite(w).all() and (w >= 0).all()):
            raise InputDataError("weights must be one finite, non-negative value per point")
        totals = np.bincount(groups, weights=w, minlength=n_groups)
        w = w / np.where(totals > 0, totals, 1.0)[groups]
        X = self.features(lonlat, time)
        cells = self.regressor.predict(X)
        # the variance of sum_i w_i f_i under Cov' = sqrt(F_i F_j) Cov is that of sum_i u_i f_i under
        # Cov, with u_i = w_i sqrt(F_i)
        factor = np.ones(len(lonlat))
        if self.residuals is not None:
            years = self._years(time, len(lonlat))
            factor = self.residuals.variance_factor(lonlat, years)
        u = w * np.sqrt(factor)
        var = self.regressor.weighted_sum_variance(X, u, groups, n_groups)
        var += np.bincount(groups, weights=u**2 * self.regressor.tile_noise_variance(X), minlength=n_groups)
        if self.residuals is not None:
            shift, cell_var, local = self.residuals.area_condition(lonlat, years, u, groups, n_groups)
            cells = self._with_residuals(cells, shift, cell_var, factor)
            var = self._combine(var, local)
        empty = totals <= 0
        area_mean = np.where(empty, np.nan, np.bincount(groups, weights=w * cells.mean, minlength=n_groups))
        areas = Prediction(area_mean, np.where(empty, np.nan, np.sqrt(var)))
        return (areas, cells) if return_cells else areas

    def kernel_slice(
        self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: Quarter | str | float | None = None
    ) -> np.ndarray:
        """Prior kernel k((x, t), (x_ref, t)), (n, k), in (log10 units)^2, all at one quarter ``time``.

        The kernel of the model the maps use: with a local residual field,
        ``s k_GP + k_local`` (the same tile, then decaying over its range), so a slice shows both
        the deep kernel's long-range structure and the tile-scale part; with a :attr:`kriging`
        part, the average of both parts' kernels. Inputs in degrees;
        ``time`` as in :meth:`features` but a single quarter.
        """
        self._require_kernel()
        parsed = parse_time(time)
        if parsed is not None and np.ndim(parsed) > 0:
            raise InputDataError("a kernel slice is taken at one quarter; give time as '2023Q4' or one decimal year")
        lonlat, ref_lonlat = _lonlat(lonlat, "lonlat"), _lonlat(ref_lonlat, "ref_lonlat")
        gp = self.regressor.kernel(self.features(lonlat, time), self.inputs.features(ref_lonlat, time))
        if self.residuals is not None:
            gp = self.residuals.kernel.combine(gp, self.residuals.prior_covariance(lonlat, ref_lonlat))
        if self.kriging is None:
            return gp
        with extrapolation_said():
            return 0.5 * (gp + self.kriging.kernel_slice(lonlat, ref_lonlat, time))

    def prior_variance(self, lonlat: np.ndarray, time: TimeLike = None) -> np.ndarray:
        """Prior variance k(x, x), (n,), in (log10 units)^2; the diagonal of :meth:`kernel_slice`."""
        self._require_kernel()
        gp = self.regressor.kernel(self.features(lonlat, time), diag=True)
        if self.residuals is not None:
            gp = self.residuals.kernel.combine(gp, np.full_like(gp, self.residuals.kernel.prior_var))
        if self.kriging is None:
            return gp
        with extrapolation_said():
            return 0.5 * (gp + self.kriging.prior_variance(lonlat, time))

    def _require_kernel(self) -> None:
        if not self.has_kernel:
            raise InputDataError(f"the {self.kind} model is not a GP and has no kernel (check GeoModel.has_kernel)")

    def distance_to_data(self, lonlat: np.ndarray) -> np.ndarray:
        """(n,) metres from each point to the nearest training tile centre.

        Raises:
            InputDataError: for a model saved without its training tile locations.
        """
        if self.support is None:
            raise InputDataError(f"the {self.kind} model was saved without its training tile locations")
        if self._support_index is None:
            projection = ProjectedTransform.from_lonlat(self.support)
            self._support_index = (projection, cKDTree(projection.to_metres(self.support)))
        projection, tree = self._support_index
        distance, _ = tree.query(projection.to_metres(_lonlat(lonlat, "lonlat")))
        return distance

    def fitted_region(self) -> Region:
        """The lon/lat region the model was fitted on, the default of :meth:`grid`.

        The dataset's region polygon, stored at fit time in ``info``; for a model file written
        before that, the bounding box of the training tile centres grown
        by half a zoom-16 tile (an antimeridian-crossing region then gets a box around the world).

        Raises:
            InputDataError: for a model saved with neither (give :meth:`grid` a region).
        """
        if self.info.fitted_region is not None:
            return self.info.fitted_region
        if self.support is None or len(self.support) == 0:
            raise InputDataError(f"the {self.kind} model was saved without its region or training tiles; give a region")
        half_tile = 180.0 / 2**OOKLA_ZOOM  # degrees of longitude
        west, south = self.support.min(axis=0) - half_tile
        east, north = self.support.max(axis=0) + half_tile
        return Region(self.info.region, shapely.box(west, south, east, north))

    def map_time(self, quarters: QuartersLike = "latest") -> Quarter | list[Quarter] | None:
        """The quarters a map shows: ``"latest"`` (:attr:`latest_quarter`, a 2-D map; ``None``
        for a time-free model), ``"all"`` (every one of ``info.fitted_quarters`` along a ``time``
        dimension), one quarter (a :class:`Quarter` or ``"2023Q4"``, 2-D) or a list of quarters
        (a ``time`` dimension). A quarter after the fitted ones (a forecast split's test quarter)
        is mapped when asked for by name (:meth:`check_domain` says how far ahead is allowed)."""
        if isinstance(quarters, str) and quarters.strip().lower() in ("latest", "all"):
            if quarters.strip().lower() == "latest" or not self.info.fitted_quarters:
                return self.latest_quarter
            return list(self.info.fitted_quarters)
        if isinstance(quarters, Quarter | str):
            return Quarter.parse(quarters)
        parsed = Quarter.parse_list(quarters)
        if not parsed:
            fitted = ", ".join(map(str, self.info.fitted_quarters)) or "none"
            raise InputDataError(f"no quarter to map (the model has {fitted})")
        return parsed

    def change_span(
        self, change: str | tuple[Quarter | str, Quarter | str] | None
    ) -> tuple[Quarter, Quarter] | None:
        """The ``(from, to)`` quarters of a change map: ``"last-year"`` is the year to the latest
        fitted quarter (from the first fitted quarter when fewer than five are fitted; both of
        ``info.fitted_quarters``); a pair or ``"2022Q4:2023Q4"`` as given; ``None`` for no change map."""
        if change is None:
            return None
        if isinstance(change, str) and change.strip().lower() == "last-year":
            fitted = self.info.fitted_quarters
            if len(fitted) < 2:
                raise InputDataError(f"a change map needs two fitted quarters; the {self.kind} model has "
                                     f"{len(fitted)}")
            return max(fitted[-1].shift(-4), fitted[0]), fitted[-1]
        pair = Quarter.parse_span(change) if isinstance(change, str) else [Quarter.parse(q) for q in change]
        if len(pair) != 2:
            raise InputDataError(f"a change is between two quarters, from and to; got {change!r}")
        return pair[0], pair[1]

    def check_domain(
        self, geometry: shapely.Geometry, quarters: QuartersLike = "latest",
        change: str | tuple[Quarter | str, Quarter | str] | None = None,
    ) -> None:
        """Refuse to map an area (lon/lat shapely geometry) mostly outside the fitted extent, or
        quarters beyond the forecast allowance (:meth:`~geodbk.dataset.domain.DomainReport.problem`).

        Raises:
            InputDataError: naming the problem.
        """
        shown = self.map_time(quarters)
        asked = [shown] if shown is None or isinstance(shown, Quarter) else list(shown)
        refuse_outside(self.domain_report, geometry, [*asked, *(self.change_span(change) or ())])

    def plan(
        self,
        resolution: float | str,
        region: RegionLike | None = None,
        quarters: QuartersLike = "latest",
        change: str | tuple[Quarter | str, Quarter | str] | None = None,
        *,
        crs: str | int | pyproj.CRS | None = None,
        allow_extrapolation: bool = True,
        refs: Mapping[str, tuple[float, float]] | None = None,
        threshold: float | str | None = DEFAULT,
        benchmark: str | Benchmark | None = "auto",
        max_distance: float | None = None,
        chunk_rows: int | None = None,
        store: str | Path | None = None,
        progress: bool = True,
        client: Client | str | None = None,
        overwrite: bool = False,
    ) -> MapPlan:
        """A map of the model on a regular grid, resolved but not predicted: its grid, layers and
        store (:class:`~geodbk.maps.plan.MapPlan`). ``plan.describe()`` says what it holds and costs,
        ``plan.check()`` refuses what cannot be mapped, and :meth:`grid` predicts it.

        Args:
            resolution: cell side in the grid CRS units (degrees by default), or ``"500m"``,
                ``"2km"``, ``"0.01deg"``.
            region: a Region, lon/lat ``(west, south, east, north)`` bbox or lon/lat shapely
                geometry; cells outside it are NaN. Default the :meth:`fitted_region`.
            quarters: as in :meth:`map_time`: ``"latest"``, ``"all"``, a quarter or a list.
            change: as in :meth:`change_span`: ``None``, ``"last-year"``, ``(from, to)``.
            crs: default EPSG:4326, or the region's UTM zone for a resolution in metres.
            allow_extrapolation: ``False`` makes ``check`` refuse an area or quarter outside the
                fitted domain; ``True`` predicts there, with a warning.
            refs: ``{name: (lon, lat)}`` degrees of the ``kernel_slice`` layer (GP kinds).
            threshold: Mbps of the ``p_below`` layer; default the FCC benchmark; ``None``: none.
            benchmark: the download/upload pair of the ``p_meets`` layers (``"35/3"``,
                ``"default"``: the service's FCC pair); ``"auto"``: the FCC pair for a model of
                download and upload, none for a one-target model; ``None``: no such layers.
            max_distance: leave cells farther than this many metres from a training tile NaN.
            chunk_rows, store, progress, client, overwrite: as in
                :func:`geodbk.maps.predict.predict_grid`.

        Raises:
            InputDataError: a resolution, region, CRS, quarter, change or option that cannot be
                mapped (the refusals of ``check`` come from ``check``).
        """
        grid = RegularGrid.over(self.fitted_region() if region is None else region, resolution, crs=crs)
        if benchmark == "auto":
            benchmark = DEFAULT if self.targets == ("download", "upload") else None
        return MapPlan.over(
            self, grid, refs=refs, time=self.map_time(quarters), change=self.change_span(change), threshold=threshold,
            benchmark=benchmark, max_distance=max_distance, chunk_rows=chunk_rows, store=store, progress=progress,
            client=client, overwrite=overwrite, domain=None if allow_extrapolation else self.domain_report,
        )

    def grid(
        self,
        resolution: float | str | MapPlan,
        region: RegionLike | None = None,
        quarters: QuartersLike = "latest",
        change: str | tuple[Quarter | str, Quarter | str] | None = None,
        **options: Any,
    ) -> xr.Dataset:
        """Map the model on a regular grid, by default over its :meth:`fitted_region` (verde's ``grid``).

        ``grid(plan)`` checks and predicts a :meth:`plan` of this model
        (:func:`geodbk.maps.predict.predict_plan`); ``grid(resolution, region, quarters, change,
        **options)`` is ``grid(plan(resolution, region, quarters, change, **options))``, the
        arguments as in :meth:`plan`.

        Returns:
            float32 layers of dims ``(y, x)`` or ``(time, y, x)``, CRS in ``spatial_ref``
            (:mod:`geodbk.maps.schema` lists them); lazily opened from ``store`` when given.

        Raises:
            InputDataError: a plan of another model, or what :meth:`plan` and
                :meth:`~geodbk.maps.plan.MapPlan.check` refuse.
        """
        if not isinstance(resolution, MapPlan):
            return self.grid(self.plan(resolution, region, quarters, change, **options))
        if resolution.model is not self:
            raise InputDataError(f"the plan maps another model ({resolution.model.kind}); plan it with this one")
        return predict_plan(resolution)

    def save(self, path: str | Path) -> None:
        """Write the model, input space, meta and training tile locations (and those of the other
        targets, with their correlation) to one torch file."""
        write_payload(self._payload(), path)

    def _payload(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "regressor": self.regressor.to_payload(),
            "inputs": self.inputs.to_dict(),
            "meta": self.info.to_dict(),
            "support": None if self.support is None else torch.tensor(np.array(self.support), dtype=torch.float64),
            "residuals": None if self.residuals is None else self.residuals.to_payload(),
            "tails": None if self.tails is None else self.tails.to_payload(),
            "others": {target: model._payload() for target, model in self.others.items()},
            "correlation": None if self.correlation is None else self.correlation.to_dict(),
            "kriging": None if self.kriging is None else self.kriging._payload(),
        }

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> GeoModel:
        """Read a file written by :meth:`save` (or a first-format, time-free model file), checked as
        :meth:`_from_payload` says.

        Raises:
            InputDataError: in one line naming ``path``, for a file that is not a geodbk model, or
                is damaged, tampered or relabelled.
        """
        payload = read_payload(path, device)
        try:
            return cls._from_payload(payload, device)
        except InputDataError as err:
            raise InputDataError(f"model file {path}: {err}") from None

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], device: str | torch.device) -> GeoModel:
        """The model of ``payload`` (and of its other targets'), checked: the regressor as
        :meth:`Regressor.from_payload` checks it, the same kind in the facts as in the weights, a
        conjugate posterior only where the kind has one, and a target scaling that describes values
        ingest keeps (:meth:`~geodbk.dataset.model_info.ModelInfo.check_scaling`)."""
        kind = payload.get("format")
        if kind == "geodbk.fit.geomodel/1":
            inputs = InputSpace(CoordinateTransform.from_dict(payload["transform"]), None, "paper")
        elif kind == _FORMAT:
            inputs = InputSpace.from_dict(payload["inputs"])
        else:
            raise InputDataError("not a geodbk GeoModel file")
        missing = [key for key in ("regressor", "meta") if not isinstance(payload.get(key), dict)]
        if missing:
            raise InputDataError(f"it has no {' or '.join(missing)} table: it is damaged")
        regressor = Regressor.from_payload(payload["regressor"], device)
        info = ModelInfo.from_dict({"kind": regressor.kind, **payload["meta"]})
        if info.kind != regressor.kind:
            raise InputDataError(f"its facts name kind {info.kind} and its weights {regressor.kind}: its kind was "
                                 "changed")
        if info.posterior == "conjugate" and not get_model_spec(info.kind).conjugate_posterior:
            raise InputDataError(f"its {info.kind} weights have a conjugate posterior, which {info.kind} fits never "
                                 "have: its kind was changed")
        info.check_scaling(regressor.y_mean, regressor.y_std)
        support, residuals, tails = payload.get("support"), payload.get("residuals"), payload.get("tails")
        correlation = payload.get("correlation")  # None for a one-target model
        kriging = payload.get("kriging")  # None for a model without a kriging part, or written before it
        return cls(
            regressor=regressor,
            inputs=inputs,
            info=info,
            support=None if support is None else support.cpu().numpy(),
            residuals=None if residuals is None else ResidualField.from_payload(residuals),
            tails=None if tails is None else MeasurementTails.from_payload(tails),
            others={target: cls._from_payload(other, device) for target, other in payload.get("others", {}).items()},
            correlation=None if correlation is None else TargetCorrelation.from_dict(correlation),
            kriging=None if kriging is None else cls._from_payload(kriging, device),
        )
