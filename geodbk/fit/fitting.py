"""Fit a model zoo kind on a dataset: :func:`fit_dataset` -> :class:`~geodbk.fit.geomodel.GeoModel`.

The one place where a fit's settings are assembled: the protocol's defaults
(:class:`~geodbk.dataset.protocols.Protocol`), then the preset's size and schedule, then the
caller's overrides. The CLI, the demo and the benchmarks pass their options through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import shapely

from geodbk.dataset.density import DensitySource, read_density_tiles
from geodbk.dataset.inputs import InputSpace
from geodbk.dataset.model_info import ModelInfo
from geodbk.dataset.protocols import MIN_WAVELENGTH_M, Protocol, get_protocol
from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.dataset.targets import target_column
from geodbk.errors import InputDataError
from geodbk.fit.geomodel import GeoModel
from geodbk.fit.protocol import fit_configs
from geodbk.fit.regressor import Regressor
from geodbk.fit.residuals import ResidualField
from geodbk.fit.tails import fit_measurement_tails
from geodbk.fit.targets import fit_target_correlation
from geodbk.fit.train import fit_arrays
from geodbk.fit.validation_areas import AreaGroups, square_areas
from geodbk.models.config import ModelConfig, TrainConfig
from geodbk.models.zoo import get_model_spec
from geodbk.quarters import quarter_years

#: The kriging part's share of the deep part's epochs. Its network reads the quarter alone, so it
#: learns little after the first few: on the six crops under 7k rows of benchmarks/bench_regions.py
#: (--eval nested, three draws of each split), a quarter of the epochs moved the NLL by +0.0002
#: (random) and +0.0002 (spatial-block) and cut the fits' time from 274 s to 219 s; on PR and HI
#: (one seed, validation rows) by -0.0003 to +0.0007, PR's random fit 40 s -> 33 s on one thread
#: (docs/fit-time.md).
KRIGING_EPOCH_SHARE = 0.25


def fit_dataset(
    dataset: SpatialDataset,
    kind: str = "dbk-rbf",
    *,
    targets: Sequence[str] | None = None,
    protocol: str | Protocol = "space-time",
    preset: str = "cpu",
    min_wavelength_m: float = MIN_WAVELENGTH_M,
    coordinate_jitter_m: float | None = None,
    local_residuals: bool = True,
    area_criterion: bool = True,
    conjugate_posterior: bool = True,
    measurement_tails: bool = True,
    kriging_average: bool = True,
    density_tiles: DensitySource | None = None,
    **overrides: Any,
) -> GeoModel:
    """Fit ``kind`` on the dataset's train split, selecting on its val split.

    Args:
        dataset: the tiles.
        kind: a model-zoo name.
        targets: which of the dataset's targets to fit (default all of them). With two
            (download and upload), each is fitted as one is, on the same rows, and the
            correlation of their errors is chosen on the validation rows
            (:func:`~geodbk.fit.targets.fit_target_correlation`): one :class:`GeoModel` with
            :attr:`~GeoModel.others` and :attr:`~GeoModel.correlation`.
        protocol: ``"space-time"`` (projected data-scaled coordinates + time, test-count
            noise, positional encoding, local residual field, conjugate posterior) or
            ``"paper"`` (region-box coordinates only); see :mod:`geodbk.dataset.protocols`.
        preset: size and schedule, ``"cpu"`` (the default) or ``"paper"``.
        min_wavelength_m: shortest positional-encoding wavelength in metres (protocols with an
            encoding); converted to the data's input units.
        coordinate_jitter_m: sd of the noise added to the training batches' places, metres
            (``None`` = the protocol's: 3 km for space-time, none for paper); see
            :attr:`~geodbk.models.config.TrainConfig.coordinate_jitter`.
        local_residuals: for GP kinds, add a :class:`~geodbk.fit.residuals.ResidualField`
            fitted to the training residuals (hyperparameters chosen on the validation rows),
            where the protocol has one. ``False`` is an ablation.
        area_criterion: choose the residual field's kernel on the validation areas' mean
            residuals as well as on the tiles (:func:`~geodbk.fit.validation_areas.square_areas`), so
            that area sds are calibrated too. ``False`` is an ablation.
        conjugate_posterior: for kinds whose :class:`~geodbk.models.zoo.ModelSpec` asks for it
            (dbk-rbf, dbk-silu), replace the trained q(w), noise and constant mean by the
            conjugate posterior given the learned basis (:meth:`Regressor.refit_posterior`)
            before the residual field is fitted, where the protocol does, so that the covariance
            behind area, change and exceedance products is a posterior. ``False`` is an ablation.
        measurement_tails: choose a new measurement's family on the validation rows (a skewed
            shape, scale and test-count shift, :func:`~geodbk.fit.tails.fit_measurement_tails`),
            where the protocol does; maps of the tile mean do not change. ``False`` keeps it Gaussian (an ablation).
        kriging_average: where the model has a residual field, fit a second map model on the same
            rows whose network reads the quarter alone (the field kriged around each quarter's
            level, :attr:`GeoModel.kriging`) and average the two (:mod:`geodbk.fit.averaging`);
            the measurement family is chosen on the average. ``False`` is an ablation.
        density_tiles: another Ookla layer's tiles over the region (the fixed-broadband tiles,
            say): a frame, or files/URLs read by :func:`~geodbk.dataset.density.read_density_tiles`.
            Their test density and speed around each place become model inputs known at every map cell
            (:mod:`geodbk.dataset.density`); space-time protocol. ``None``: coordinates and time only.
        overrides: fields of :class:`~geodbk.models.config.ModelConfig` or
            :class:`~geodbk.models.config.TrainConfig` (``hidden=16``, ``epochs=5``,
            ``progress=False``, ...); ``None`` values are ignored.
    """
    chosen = dataset.targets if targets is None else tuple(targets)
    if not chosen or len(chosen) > 2 or any(t not in dataset.targets for t in chosen):
        raise InputDataError(f"targets must be one or two of the dataset's {', '.join(dataset.targets)}, "
                             f"got {', '.join(chosen) or 'none'}")
    settings = dict(
        protocol=protocol, preset=preset, min_wavelength_m=min_wavelength_m, coordinate_jitter_m=coordinate_jitter_m,
        local_residuals=local_residuals, area_criterion=area_criterion, conjugate_posterior=conjugate_posterior,
        measurement_tails=measurement_tails, kriging_average=kriging_average, density_tiles=density_tiles,
        **overrides,
    )
    models = [_fit_target(dataset.for_target(target), kind, **settings) for target in chosen]
    if len(models) == 1:
        return models[0]
    val = dataset.subset("val")
    first, second = models
    y_first, y_second = (val[target_column(dataset.target, t)].to_numpy(np.float64) for t in chosen)
    correlation = fit_target_correlation(
        (chosen[0], chosen[1]), y_first, first.predict_tiles(val), y_second, second.predict_tiles(val))
    return replace(first, others={chosen[1]: second}, correlation=correlation)


def _fit_target(
    dataset: SpatialDataset,
    kind: str,
    *,
    protocol: str | Protocol,
    preset: str,
    min_wavelength_m: float,
    coordinate_jitter_m: float | None,
    local_residuals: bool,
    area_criterion: bool,
    conjugate_posterior: bool,
    measurement_tails: bool,
    kriging_average: bool,
    density_tiles: DensitySource | None,
    **overrides: Any,
) -> GeoModel:
    """:func:`fit_dataset` of a one-target dataset."""
    rules = get_protocol(protocol)
    density = None if density_tiles is None else read_density_tiles(
        density_tiles, dataset.region, buffer_deg=dataset.buffer_deg
    )
    inputs = rules.input_space(dataset, density)
    train, val = dataset.subset("train"), dataset.subset("val")  # one copy of the training rows (9.7M in the US)
    model_config, train_config = fit_configs(
        rules, inputs, preset, n_rows=len(train), min_wavelength_m=min_wavelength_m,
        coordinate_jitter_m=coordinate_jitter_m, **overrides,
    )
    refit = conjugate_posterior and rules.conjugate_posterior and get_model_spec(kind).conjugate_posterior
    fields = local_residuals and rules.local_residuals
    part = partial(_fit_map_model, dataset, kind, train, val, refit=refit, fields=fields, area_criterion=area_criterion)
    model = part(inputs, model_config, train_config)
    if kriging_average and model.residuals is not None:
        quarter_only = rules.input_space(dataset, None)  # no density layer: the kriging part reads the quarter
        model.kriging = part(
            quarter_only,
            replace(model_config, input_columns=(quarter_only.feature_names.index("t"),), encoding_scales=0),
            _kriging_schedule(train_config),
        )
    if measurement_tails and rules.measurement_tails:
        tests_val = val["tests"].to_numpy(np.float64)
        model.tails = fit_measurement_tails(val["y"].to_numpy(np.float64), model.predict_tiles(val), tests_val,
                                           train_tests=train["tests"].to_numpy(np.float64))
    return model


def _kriging_schedule(config: TrainConfig) -> TrainConfig:
    """The deep part's schedule for the kriging part: :data:`KRIGING_EPOCH_SHARE` of its epochs (at
    least one), no coordinate jitter (it reads no places), and its own checkpoint file beside the
    deep part's (``<checkpoint>.kriging``), resumed from when the deep part is and that file exists."""
    checkpoint = None if config.checkpoint_path is None else f"{config.checkpoint_path}.kriging"
    resume = None if config.resume_from is None else f"{config.resume_from}.kriging"
    return replace(config, epochs=max(1, round(config.epochs * KRIGING_EPOCH_SHARE)), coordinate_jitter=0.0,
                   checkpoint_path=checkpoint,
                   resume_from=resume if resume is not None and Path(resume).is_file() else None)


def _fit_map_model(
    dataset: SpatialDataset, kind: str, train: pd.DataFrame, val: pd.DataFrame, inputs: InputSpace,
    model_config: ModelConfig, train_config: TrainConfig, *, refit: bool, fields: bool, area_criterion: bool,
) -> GeoModel:
    """One map model of the dataset's ``train`` rows on ``inputs`` (the regressor, its conjugate
    refit where ``refit``, a residual field where ``fields``; no tails), chosen on its ``val``
    rows: the deep part, then the kriging part, of :func:`_fit_target`."""

    def rows(part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lonlat, years = part[["lon", "lat"]].to_numpy(np.float64), quarter_years(part["year"], part["quarter"])
        y, tests = part["y"].to_numpy(np.float64), part["tests"].to_numpy(np.float64)
        return inputs.features(lonlat, years), y, tests, lonlat, years

    X, y, tests, lonlat, years = rows(train)
    X_val, y_val, tests_val, lonlat_val, years_val = rows(val)
    regressor = fit_arrays(
        kind, X, y, X_val, y_val, tests=tests, tests_val=tests_val, model_config=model_config,
        train_config=train_config,
    )
    if refit:
        regressor.refit_posterior(X, y, tests, train["quadkey"].to_numpy())
    residuals = None
    if fields and regressor.has_kernel:
        train_pred, val_pred = regressor.predict(X, tests=tests), regressor.predict(X_val, tests=tests_val)
        areas = _validation_areas(regressor, X_val, lonlat_val, years_val) if area_criterion else None
        residuals = ResidualField.fit(
            lonlat, years, y - train_pred.mean, train_pred.sd**2,
            lonlat_val, years_val, y_val - val_pred.mean, val_pred.sd**2,
            train_test_var=train_pred.measurement().sd**2 - train_pred.sd**2,
            val_test_var=val_pred.measurement().sd**2 - val_pred.sd**2,
            train_tests=tests, val_tests=tests_val,
            val_areas=areas,
        )
    info = ModelInfo(
        kind=kind,
        target=dataset.target,
        units=dataset.units,
        service=str(dataset.frame["service"].iloc[0]) if len(dataset.frame) else ModelInfo.service,
        region=dataset.region.name,
        region_wkb_hex=shapely.to_wkb(dataset.region.geometry, hex=True),
        quarters=tuple(dataset.quarters),
        protocol=inputs.protocol,
        split=dataset.split_protocol,
        n_train=int(len(y)),
        local_residuals=residuals is not None,
        posterior="conjugate" if refit else "trained",
    )
    support = train.drop_duplicates("quadkey")[["lon", "lat"]].to_numpy(np.float64)
    return GeoModel(regressor, inputs, info, support, residuals)


def _validation_areas(
    regressor: Regressor, X_val: np.ndarray, lonlat_val: np.ndarray, years_val: np.ndarray
) -> AreaGroups:
    """Squares of validation rows (:func:`~geodbk.fit.validation_areas.square_areas`) and the GP's
    variance of each one's mean, latent joint posterior plus tile noise, as
    :meth:`GeoModel.predict_areas` has them."""
    rows, groups = square_areas(lonlat_val, years_val)
    n_areas = int(groups.max()) + 1 if len(groups) else 0
    X = X_val[rows]
    w = 1.0 / np.bincount(groups, minlength=n_areas)[groups]
    gp_var = regressor.weighted_sum_variance(X, w, groups, n_areas)
    gp_var += np.bincount(groups, weights=w**2 * regressor.tile_noise_variance(X), minlength=n_areas)
    return AreaGroups(rows, groups, gp_var)
