"""A fitted model in geographic terms: :class:`GeoModel` = Regressor + InputSpace (+ ResidualField).

Inputs are lon/lat in degrees (EPSG:4326) and, for space-time models, a quarter; the
:class:`~geodbk.dataset.inputs.InputSpace` maps them to what the regressor was fitted on. Space-time
GP kinds add tile-scale detail from a :class:`~geodbk.fit.residuals.ResidualField` (a local
kernel conditioned on their training residuals). Outputs are in the target's log10 units.
Asking about places or quarters outside the fitted domain warns with an
:class:`~geodbk.errors.ExtrapolationWarning`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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
from geodbk.dataset.quarters import quarter_years
from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.fit.protocol import MIN_WAVELENGTH_M, map_model_config, with_encoding_wavelength
from geodbk.fit.regressor import Regressor, read_payload, write_payload
from geodbk.fit.residuals import ResidualField
from geodbk.fit.train import fit_arrays
from geodbk.ingest.quadkey import OOKLA_ZOOM
from geodbk.ingest.regions import Region
from geodbk.maps.geometry import RegionLike
from geodbk.maps.predict import predict_region
from geodbk.models.config import ModelConfig, TrainConfig
from geodbk.models.zoo import get_model_spec
from geodbk.prediction import ChangePrediction, Prediction

_FORMAT = "geodbk.fit.geomodel/2"


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
        meta: JSON-able facts: target, units, region (its name; ``region_wkb_hex`` its
            polygon, see :meth:`fitted_region`), kind, quarters, protocol, split.
        support: (m, 2) lon/lat degrees of the distinct training tiles (for
            :meth:`distance_to_data`), or ``None``.
        residuals: the local residual field added to the regressor's predictions, or ``None``.
    """

    regressor: Regressor
    inputs: InputSpace
    meta: dict[str, Any] = field(default_factory=dict)
    support: np.ndarray | None = None
    residuals: ResidualField | None = None
    _support_index: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return self.regressor.kind

    @property
    def has_kernel(self) -> bool:
        """Whether :meth:`kernel_slice` and :meth:`prior_variance` exist (GP kinds; not knn or dnn)."""
        return self.regressor.has_kernel

    @property
    def latest_quarter(self) -> str | None:
        """The last fitted quarter (the default of every ``time`` argument), or None if time-free."""
        return self.inputs.latest

    def domain_report(self, lonlat: np.ndarray, times: Sequence[TimeLike] = (None,)) -> DomainReport:
        """How far ``lonlat`` (n, 2) degrees (e.g. a sample of a map's cells) at each quarter of
        ``times`` (as in :meth:`features`; None = the latest fitted) leave the fitted domain
        (:meth:`InputSpace.domain`, named after this model). Quarters are ignored by a time-free model."""
        area = fitted_area(self.meta.get("region_wkb_hex"))  # inside the fitted region is not extrapolation
        report = self.inputs.domain(_lonlat(lonlat, "lonlat"), times, region=area)
        return replace(report, kind=self.kind, region=self.meta.get("region"))

    def features(self, lonlat: np.ndarray, time: TimeLike = None, *, name: str = "lonlat") -> np.ndarray:
        """Model inputs (n, d) for ``lonlat`` (n, 2) degrees at ``time``; warns when extrapolating.

        ``time``: ``"2023Q4"``, decimal years (scalar or (n,)), or ``None`` = the latest
        fitted quarter; ignored by a time-free (paper protocol) model.
        """
        lonlat = _lonlat(lonlat, name)
        X = self.inputs.features(lonlat, time)
        area = fitted_area(self.meta.get("region_wkb_hex"))  # inside the fitted region is not extrapolation
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

        ``sd`` is the tile-mean distribution; ``tests`` (n,) adds ``measurement_sd`` for new
        measurements of that many tests (see :class:`~geodbk.prediction.Prediction`).
        """
        lonlat = _lonlat(lonlat, "lonlat")
        prediction = self.regressor.predict(self.features(lonlat, time), tests=tests, batch_size=batch_size)
        if self.residuals is None:
            return prediction
        years = self._years(time, len(lonlat))
        return self._with_residuals(prediction, *self.residuals.condition(lonlat, years), years)

    def _with_residuals(
        self, prediction: Prediction, shift: np.ndarray, var: np.ndarray, years: np.ndarray
    ) -> Prediction:
        """The GP's prediction plus the local field's kriged residual ``shift`` and its conditional
        ``var`` at times ``years``: mean + shift, sd^2 -> F(t) (s sd^2 + var), measurement_sd^2 ->
        F(t) (s sd^2 + s_t (measurement_sd^2 - sd^2) + var), F the forecast horizon's factor
        (:meth:`~geodbk.fit.residuals.ResidualField.horizon_factor`)."""
        assert self.residuals is not None  # only called with a residual field
        kernel, factor, tile_var = self.residuals.kernel, self.residuals.horizon_factor(years), prediction.sd**2
        measurement_sd = None if prediction.measurement_sd is None else np.sqrt(
            factor * kernel.combine(tile_var, var, prediction.measurement_sd**2 - tile_var))
        return Prediction(prediction.mean + shift, np.sqrt(factor * kernel.combine(tile_var, var)), measurement_sd)

    def predict_series(
        self, lonlat: np.ndarray, times: Sequence[TimeLike], *, batch_size: int = 65536
    ) -> list[Prediction]:
        """Tile-mean predictions at ``lonlat`` (n, 2) degrees for each of several quarters, one
        :class:`Prediction` per entry of ``times``. The same as calling :meth:`predict` per
        quarter, but the local residual field solves each neighbourhood once for all of them."""
        lonlat = _lonlat(lonlat, "lonlat")
        gp = [self.regressor.predict(self.features(lonlat, when), batch_size=batch_size) for when in times]
        if self.residuals is None or not gp:
            return gp
        years = np.stack([self._years(when, len(lonlat)) for when in times])
        shift, var = self.residuals.condition(lonlat, years)
        return [self._with_residuals(p, shift[t], var[t], years[t]) for t, p in enumerate(gp)]

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
        lonlat = _lonlat(lonlat, "lonlat")
        X_from, X_to = self.features(lonlat, time_from), self.features(lonlat, time_to)
        before, after = self.predict_series(lonlat, [time_from, time_to])
        var = self.regressor.difference_variance(X_from, X_to)
        nugget_from, nugget_to = (self.regressor.tile_noise_variance(X) for X in (X_from, X_to))  # not in f
        factor_from = factor_to = np.ones(len(lonlat))
        if self.residuals is not None:
            years_from = self._years(time_from, len(lonlat))
            years_to = self._years(time_to, len(lonlat))
            kernel = self.residuals.kernel
            var = kernel.combine(var, self.residuals.change_variance(lonlat, years_from, years_to))
            nugget_from, nugget_to = kernel.variance_scale * nugget_from, kernel.variance_scale * nugget_to
            factor_from, factor_to = self.residuals.horizon_factor(years_from), self.residuals.horizon_factor(years_to)
        v_from = np.maximum(before.sd**2 / factor_from - nugget_from, 0.0)
        v_to = np.maximum(after.sd**2 / factor_to - nugget_to, 0.0)
        covariance = 0.5 * (v_from + v_to - var)
        var = factor_to * v_to + factor_from * v_from - 2.0 * np.sqrt(factor_from * factor_to) * covariance
        change = after.mean - before.mean
        return ChangePrediction(change, np.sqrt(np.maximum(var, 0.0)), before.mean, after.mean,
                                np.sqrt(factor_from * v_from), np.sqrt(factor_to * v_to))

    def predict_areas(
        self,
        lonlat: np.ndarray,
        groups: np.ndarray,
        n_groups: int | None = None,
        time: TimeLike = None,
        *,
        weights: np.ndarray | None = None,
    ) -> Prediction:
        """Averages of the tile-mean log10 value over groups of points (e.g. the grid cells in
        each polygon), with their joint-posterior sd: ``Prediction`` of shape (n_groups,).

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
        :meth:`~geodbk.fit.residuals.ResidualField.area_condition`. A group without points gets NaN.
        """
        self._require_kernel()
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
        gp = self.regressor.predict(X)
        mean = gp.mean
        var = self.regressor.weighted_sum_variance(X, w, groups, n_groups)
        var += np.bincount(groups, weights=w**2 * self.regressor.tile_noise_variance(X), minlength=n_groups)
        if self.residuals is not None:
            years = self._years(time, len(lonlat))
            shift, local = self.residuals.area_condition(lonlat, years, w, groups, n_groups)
            mean, var = mean + shift, self.residuals.kernel.combine(var, local)
            if len(years):  # one quarter: the forecast factor is the same for every point
                var = var * float(self.residuals.horizon_factor(years[0]))
        empty = totals <= 0
        area_mean = np.where(empty, np.nan, np.bincount(groups, weights=w * mean, minlength=n_groups))
        return Prediction(area_mean, np.where(empty, np.nan, np.sqrt(var)))

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: str | float | None = None) -> np.ndarray:
        """Prior kernel k((x, t), (x_ref, t)), (n, k), in (log10 units)^2, all at one quarter ``time``.

        The kernel of the model the maps use: with a local residual field,
        ``s k_GP + k_local`` (the same tile, then decaying over its range), so a slice shows both
        the deep kernel's long-range structure and the tile-scale part. Inputs in degrees;
        ``time`` as in :meth:`features` but a single quarter.
        """
        self._require_kernel()
        parsed = parse_time(time)
        if parsed is not None and np.ndim(parsed) > 0:
            raise InputDataError("a kernel slice is taken at one quarter; give time as '2023Q4' or one decimal year")
        lonlat, ref_lonlat = _lonlat(lonlat, "lonlat"), _lonlat(ref_lonlat, "ref_lonlat")
        gp = self.regressor.kernel(self.features(lonlat, time), self.inputs.features(ref_lonlat, time))
        if self.residuals is None:
            return gp
        return self.residuals.kernel.combine(gp, self.residuals.prior_covariance(lonlat, ref_lonlat))

    def prior_variance(self, lonlat: np.ndarray, time: TimeLike = None) -> np.ndarray:
        """Prior variance k(x, x), (n,), in (log10 units)^2; the diagonal of :meth:`kernel_slice`."""
        self._require_kernel()
        gp = self.regressor.prior_variance(self.features(lonlat, time))
        if self.residuals is None:
            return gp
        return self.residuals.kernel.combine(gp, np.full_like(gp, self.residuals.kernel.prior_var))

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

        The dataset's region polygon, stored at fit time in ``meta["region_wkb_hex"]``; for a
        model file written before that, the bounding box of the training tile centres grown
        by half a zoom-16 tile (an antimeridian-crossing region then gets a box around the world).

        Raises:
            InputDataError: for a model saved with neither (give :meth:`grid` a region).
        """
        name = str(self.meta.get("region", "fitted region"))
        if "region_wkb_hex" in self.meta:
            return Region(name, shapely.from_wkb(self.meta["region_wkb_hex"]))
        if self.support is None or len(self.support) == 0:
            raise InputDataError(f"the {self.kind} model was saved without its region or training tiles; give a region")
        half_tile = 180.0 / 2**OOKLA_ZOOM  # degrees of longitude
        west, south = self.support.min(axis=0) - half_tile
        east, north = self.support.max(axis=0) + half_tile
        return Region(name, shapely.box(west, south, east, north))

    def grid(
        self,
        resolution: float | str,
        region: RegionLike | None = None,
        quarter: str | Sequence[str] | None = None,
        *,
        crs: str | int | pyproj.CRS | None = None,
        **kwargs: Any,
    ) -> xr.Dataset:
        """Map the model on a regular grid, by default over its :meth:`fitted_region` (verde's ``grid``).

        ``resolution``: cell side in the grid CRS units (degrees by default), or ``"500m"``,
        ``"2km"``, ``"0.01deg"``. ``region``: a Region, lon/lat ``(west, south, east, north)``
        bbox or lon/lat shapely geometry; cells outside it are NaN. ``quarter``: ``"2023Q4"``
        (default the latest fitted), or a list of quarters for a ``time`` dimension. ``crs``:
        default EPSG:4326, or the region's UTM zone for a resolution in metres. ``kwargs`` go to
        :func:`geodbk.maps.predict.predict_grid` (``refs``, ``change``, ``threshold``,
        ``max_distance``, ``chunk_rows``, ``store``, ``progress``), whose dataset is returned:
        float32 layers of dims ``(y, x)`` or ``(time, y, x)``, CRS in ``spatial_ref``.
        """
        target = self.fitted_region() if region is None else region
        return predict_region(self, target, resolution, crs=crs, time=quarter, **kwargs)

    def save(self, path: str | Path) -> None:
        """Write the model, input space, meta and training tile locations to one torch file."""
        payload = {
            "format": _FORMAT,
            "regressor": self.regressor.to_payload(),
            "inputs": self.inputs.to_dict(),
            "meta": self.meta,
            "support": None if self.support is None else torch.tensor(np.array(self.support), dtype=torch.float64),
            "residuals": None if self.residuals is None else self.residuals.to_payload(),
        }
        write_payload(payload, path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> GeoModel:
        """Read a file written by :meth:`save` (or a first-format, time-free model file)."""
        payload = read_payload(path, device)
        kind = payload.get("format")
        if kind == "geodbk.fit.geomodel/1":
            inputs = InputSpace(CoordinateTransform.from_dict(payload["transform"]), None, "paper")
        elif kind == _FORMAT:
            inputs = InputSpace.from_dict(payload["inputs"])
        else:
            raise InputDataError(f"{path} is not a geodbk GeoModel file")
        support, residuals = payload.get("support"), payload.get("residuals")
        return cls(
            regressor=Regressor.from_payload(payload["regressor"], device),
            inputs=inputs,
            meta=payload["meta"],
            support=None if support is None else support.cpu().numpy(),
            residuals=None if residuals is None else ResidualField.from_payload(residuals),
        )


def fit_dataset(
    dataset: SpatialDataset,
    kind: str = "dbk-rbf",
    *,
    protocol: str = "space-time",
    model_config: ModelConfig | None = None,
    train_config: TrainConfig | None = None,
    min_wavelength_m: float = MIN_WAVELENGTH_M,
    local_residuals: bool = True,
    conjugate_posterior: bool = True,
) -> GeoModel:
    """Fit ``kind`` on the dataset's train split, selecting on its val split.

    Args:
        dataset: the tiles.
        kind: a model-zoo name.
        protocol: ``"space-time"`` (projected data-scaled coordinates + time, test-count
            noise, positional encoding) or ``"paper"`` (region-box coordinates only).
        model_config: architecture; default :func:`map_model_config` of the protocol.
        train_config: optimisation; default :class:`TrainConfig()`.
        min_wavelength_m: shortest positional-encoding wavelength in metres (space-time
            protocol with an encoding); converted to the data's input units.
        local_residuals: for GP kinds under the space-time protocol, add a
            :class:`~geodbk.fit.residuals.ResidualField` fitted to the training residuals, with
            its hyperparameters chosen on the validation rows.
        conjugate_posterior: under the space-time protocol, for kinds whose
            :class:`~geodbk.models.zoo.ModelSpec` asks for it (dbk-rbf, dbk-silu), replace the
            trained q(w), noise and constant mean by the conjugate posterior given the learned
            basis (:meth:`Regressor.refit_posterior`) before the residual field is fitted, so
            that the covariance behind area, change and exceedance products is a posterior.
    """
    inputs = InputSpace.for_dataset(dataset, protocol)
    config = model_config or map_model_config(protocol)
    config = with_encoding_wavelength(config, inputs, min_wavelength_m)

    def rows(split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        part = dataset.subset(split)
        lonlat, years = part[["lon", "lat"]].to_numpy(np.float64), quarter_years(part["year"], part["quarter"])
        y, tests = part["y"].to_numpy(np.float64), part["tests"].to_numpy(np.float64)
        return inputs.features(lonlat, years), y, tests, lonlat, years

    X, y, tests, lonlat, years = rows("train")
    X_val, y_val, tests_val, lonlat_val, years_val = rows("val")
    regressor = fit_arrays(
        kind, X, y, X_val, y_val, tests=tests, tests_val=tests_val, model_config=config, train_config=train_config
    )
    refit = conjugate_posterior and protocol == "space-time" and get_model_spec(kind).conjugate_posterior
    if refit:
        regressor.refit_posterior(X, y, tests, dataset.subset("train")["quadkey"].to_numpy())
    residuals = None
    if local_residuals and protocol == "space-time" and regressor.has_kernel:
        train_pred, val_pred = regressor.predict(X, tests=tests), regressor.predict(X_val, tests=tests_val)
        residuals = ResidualField.fit(
            lonlat, years, y - train_pred.mean, train_pred.sd**2,
            lonlat_val, years_val, y_val - val_pred.mean, val_pred.sd**2,
            train_test_var=train_pred.measurement().sd**2 - train_pred.sd**2,
            val_test_var=val_pred.measurement().sd**2 - val_pred.sd**2,
        )
    meta = {
        "kind": kind,
        "target": dataset.target,
        "units": dataset.units,
        "service": str(dataset.frame["service"].iloc[0]) if len(dataset.frame) else "mobile",
        "region": dataset.region.name,
        "region_wkb_hex": shapely.to_wkb(dataset.region.geometry, hex=True),
        "quarters": dataset.quarters,
        "protocol": protocol,
        "split": dataset.split_protocol,
        "n_train": int(len(y)),
        "local_residuals": residuals is not None,
        "posterior": "conjugate" if refit else "trained",
    }
    support = dataset.subset("train").drop_duplicates("quadkey")[["lon", "lat"]].to_numpy(np.float64)
    return GeoModel(regressor, inputs, meta, support, residuals)
