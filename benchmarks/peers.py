"""Practical peers of the geodbk maps for bench_quality.py: GPBoost and LightGBM.

Each peer is fitted on a dataset's ``train`` rows, stopped early on its ``val`` rows, and
predicts a dataset row (a tile at its own quarter) as a Gaussian in log10 Mbps with the same
two distributions as :class:`geodbk.prediction.Prediction`:

* the tile mean, sd^2 = s0^2 + v_latent;
* a new measurement of the row's ``tests`` tests, measurement_sd^2 = s0^2 + s1^2 / tests + v_latent,

where ``v_latent`` is the model's own predictive variance of the latent mean (the Gaussian
process's for GPBoost; 0 for LightGBM, which has none) and ``(s0, s1)`` are fitted by maximum
likelihood on the validation residuals (:func:`fit_measurement_noise`). Then, as for a geodbk
space-time model, a new measurement's family (Student-t degrees of freedom and sd scale,
:func:`geodbk.fit.tails.fit_measurement_tails`, with its test-count shift of the centre) is chosen
on the same validation rows, unless
:func:`fit_peer` is told ``measurement_tails=False``. So
``evaluate(y, peer.predict_tiles(rows).measurement(), classes)`` scores a peer exactly as
:func:`geodbk.workflow.evaluate_on_test` scores a geodbk model.

Features (:func:`peer_features`), all float64:

* ``x_km``, ``y_km``: tile centre in a Lambert azimuthal equal-area projection centred on the
  dataset's tiles (:class:`geodbk.dataset.coords.ProjectedTransform`), kilometres;
* ``t_years``: middle of the row's quarter in decimal years (2023Q4 -> 2023.875);
* ``log_tests``: natural log of the row's number of tests (>= 1).

Two variants (:data:`VARIANTS`): ``"tests"`` puts all four in the mean; ``"map"`` only the
covariates known when a map is drawn (:data:`MAP_COVARIATES`, x, y and t), which is what
a geodbk map's mean sees. Both variants use the test counts in the noise.

A dataset here is anything with a ``frame`` (a DataFrame of dataset rows with columns
``lon, lat`` (degrees), ``year, quarter, tests, y`` (log10 Mbps) and ``split``), such as
:class:`geodbk.dataset.spatial_dataset.SpatialDataset`.

lightgbm and gpboost are optional (the ``bench`` extra); they are imported when a peer is
fitted, and :func:`missing_peers` says which cannot be.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.density import TestDensityCovariates
from geodbk.fit.tails import MeasurementTails, fit_measurement_tails
from geodbk.prediction import Prediction
from geodbk.quarters import quarter_years

#: Peer name -> module it needs.
PEER_MODULES: dict[str, str] = {"gpboost": "gpboost", "lightgbm": "lightgbm"}
PEERS: tuple[str, ...] = tuple(PEER_MODULES)

#: Covariate name -> function of (rows, projection) giving an (n,) float64 column.
COVARIATES: dict[str, Callable[[pd.DataFrame, ProjectedTransform], np.ndarray]] = {
    "x_km": lambda rows, projection: _lonlat_km(rows, projection)[:, 0],
    "y_km": lambda rows, projection: _lonlat_km(rows, projection)[:, 1],
    "t_years": lambda rows, projection: quarter_years(rows["year"], rows["quarter"]),
    "log_tests": lambda rows, projection: np.log(rows["tests"].to_numpy(np.float64)),
}

#: Covariates known at map time (a place and a quarter). Add a map-time covariate here (and
#: its function to :data:`COVARIATES`) and both variants of both peers use it.
MAP_COVARIATES: tuple[str, ...] = ("x_km", "y_km", "t_years")

#: Variant name -> covariates of the mean.
VARIANTS: dict[str, tuple[str, ...]] = {
    "tests": (*MAP_COVARIATES, "log_tests"),
    "map": MAP_COVARIATES,
}

#: Columns of the Gaussian process coordinates of GPBoost, time first (its
#: ``matern_space_time`` covariance reads column 0 as time).
GP_COORDINATES: tuple[str, ...] = ("t_years", "x_km", "y_km")

#: OpenMP threads of both peers. One: on a machine whose cores are busy with other work,
#: LightGBM's spinning OpenMP threads made 100 rounds on PR take 122 s with 2 threads on
#: 2 busy cores against 0.4 s with 1.
THREADS = 1

#: LightGBM settings: L2 regression, early stopping on the validation rows.
LIGHTGBM_PARAMS: dict[str, Any] = {
    "objective": "regression",
    "metric": "l2",
    "learning_rate": 0.05,
    "num_leaves": 63,
    "min_data_in_leaf": 20,
    "verbose": -1,
}
LIGHTGBM_ROUNDS = 5000
LIGHTGBM_PATIENCE = 100

#: GPBoost settings (see :func:`fit_gpboost`).
GPBOOST_NEIGHBOURS = 20
GPBOOST_COV_ROWS = 20_000
GPBOOST_PARAMS: dict[str, Any] = {
    "objective": "regression_l2",
    "metric": "l2",
    "learning_rate": 0.1,
    "max_depth": 5,
    "verbose": -1,
}
GPBOOST_ROUNDS = 1000
GPBOOST_PATIENCE = 10
#: rho of the GPBoost noise weights w = 1 / (rho + 1 / tests): the nugget of a row is
#: sigma^2 (rho + 1 / tests), a floor plus a part that shrinks with the test count.
GPBOOST_WEIGHT_RHO = 0.5


class HasFrame(Protocol):
    """A dataset: ``frame`` holds its rows (columns lon, lat, year, quarter, tests, y, split)."""

    frame: pd.DataFrame


def _lonlat_km(rows: pd.DataFrame, projection: ProjectedTransform) -> np.ndarray:
    """(n, 2) projected x, y of the rows' lon/lat, kilometres."""
    return projection.to_metres(rows[["lon", "lat"]].to_numpy(np.float64)) / 1000.0


def projection_of(dataset: HasFrame) -> ProjectedTransform:
    """The LAEA projection centred on all of the dataset's tiles (every split)."""
    return ProjectedTransform.from_lonlat(dataset.frame[["lon", "lat"]].to_numpy(np.float64))


def projection_and_density(
    dataset: HasFrame, density_tiles: pd.DataFrame | None
) -> tuple[ProjectedTransform, TestDensityCovariates | None]:
    """:func:`projection_of` the dataset, and the density layer of ``density_tiles`` in it (or None)."""
    projection = projection_of(dataset)
    return projection, None if density_tiles is None else TestDensityCovariates.from_tiles(density_tiles, projection)


def peer_features(
    frame: pd.DataFrame,
    projection: ProjectedTransform,
    covariates: Sequence[str] | str = "tests",
    density: TestDensityCovariates | None = None,
) -> pd.DataFrame:
    """The peers' inputs for dataset rows.

    Args:
        frame: (n rows) with columns lon, lat (degrees), year, quarter, and tests when a
            covariate needs it.
        projection: the dataset's LAEA projection (:func:`projection_of`).
        covariates: a variant name of :data:`VARIANTS` or covariate names of :data:`COVARIATES`.
        density: another layer's test density (:mod:`geodbk.dataset.density`), whose columns
            follow, as dbk-rbf's inputs have them.

    Returns:
        (n, k) float64 DataFrame, one column per covariate in the given order, on ``frame``'s
        index: x_km, y_km (km), t_years (decimal years), log_tests (ln tests), then the
        density's columns.
    """
    names = VARIANTS[covariates] if isinstance(covariates, str) else tuple(covariates)
    unknown = [name for name in names if name not in COVARIATES]
    if unknown:
        raise ValueError(f"unknown covariates {unknown}; known: {sorted(COVARIATES)}")
    columns = {name: np.asarray(COVARIATES[name](frame, projection), dtype=np.float64) for name in names}
    if density is not None:
        lonlat = frame[["lon", "lat"]].to_numpy(np.float64)
        columns.update(zip(density.names, density.columns(projection.to_metres(lonlat)).T, strict=True))
    return pd.DataFrame(columns, index=frame.index)


def missing_peers(names: Sequence[str]) -> dict[str, str]:
    """Peers among ``names`` whose package cannot be imported: name -> the import error."""
    out = {}
    for name in names:
        if name in PEER_MODULES:
            try:
                importlib.import_module(PEER_MODULES[name])
            except Exception as err:  # ImportError, or a broken shared library (OSError)
                out[name] = f"{type(err).__name__}: {err}"
    return out


def fit_measurement_noise(
    residual: np.ndarray, tests: np.ndarray, latent_var: np.ndarray | float = 0.0
) -> tuple[float, float]:
    """Maximum-likelihood ``(s0, s1)`` of residual ~ N(0, latent_var + s0^2 + s1^2 / tests).

    Args:
        residual: (n,) y - predicted mean on held-out rows, log10 units.
        tests: (n,) the rows' test counts (>= 1).
        latent_var: (n,) or scalar predictive variance of the mean, (log10 units)^2, held fixed.

    Returns:
        ``(s0, s1)`` in log10 units, from L-BFGS-B on ``(log s0^2, log s1^2)``.
    """
    r2 = np.asarray(residual, dtype=np.float64) ** 2
    inv_tests = 1.0 / np.asarray(tests, dtype=np.float64)
    latent = np.broadcast_to(np.asarray(latent_var, dtype=np.float64), r2.shape)

    def nll(log_var: np.ndarray) -> tuple[float, np.ndarray]:
        a, b = np.exp(log_var)
        var = latent + a + b * inv_tests
        d_var = 0.5 * (1.0 / var - r2 / var**2)  # d nll / d var per row
        value = 0.5 * float(np.sum(np.log(var) + r2 / var))
        return value, np.array([np.sum(d_var) * a, np.sum(d_var * inv_tests) * b])

    start = np.log(np.full(2, max(float(np.mean(r2)), 1e-6) / 2.0))
    result = minimize(nll, start, jac=True, method="L-BFGS-B", bounds=[(-25.0, 5.0)] * 2)
    a, b = np.exp(result.x)
    return math.sqrt(a), math.sqrt(b)


@dataclass
class PeerModel:
    """A fitted peer: ``predict_tiles(rows)`` -> :class:`Prediction` in log10 units.

    Attributes:
        name: ``"lightgbm"`` or ``"gpboost"``.
        variant: ``"tests"`` or ``"map"`` (:data:`VARIANTS`).
        covariates: the mean's covariates, in :func:`peer_features` order.
        projection: LAEA projection of the features.
        density: the test density columns of the mean's features, or ``None``.
        s0, s1: validation-fitted noise, log10 units (see the module docstring).
        tails: a new measurement's validation-chosen family, or ``None`` (Gaussian).
        details: fit facts for reports (iterations, covariance parameters, seconds).
    """

    name: str
    variant: str
    covariates: tuple[str, ...]
    projection: ProjectedTransform
    density: TestDensityCovariates | None = None
    s0: float = float("nan")
    s1: float = float("nan")
    tails: MeasurementTails | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def latent(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(n,) predictive mean and (n,) latent predictive variance of the rows."""
        raise NotImplementedError

    def predict_tiles(self, rows: pd.DataFrame) -> Prediction:
        """Rows (columns lon, lat, year, quarter, tests) -> (n,) Gaussians: ``sd`` of the tile
        mean, ``measurement_sd`` of a new measurement with the row's own tests (``None`` when
        the rows have no ``tests`` column)."""
        mean, latent_var = self.latent(rows)
        sd = np.sqrt(latent_var + self.s0**2)
        measurement = None
        if "tests" in rows.columns:
            measurement = np.sqrt(latent_var + self.s0**2 + self.s1**2 / rows["tests"].to_numpy(np.float64))
        prediction = Prediction(mean, sd, measurement)
        tests = rows["tests"].to_numpy(np.float64) if "tests" in rows.columns else None
        return prediction if self.tails is None else self.tails.apply(prediction, tests)

    def fit_noise(self, val: pd.DataFrame) -> None:
        """Set ``s0, s1`` by :func:`fit_measurement_noise` on the validation rows."""
        mean, latent_var = self.latent(val)
        residual = val["y"].to_numpy(np.float64) - mean
        self.s0, self.s1 = fit_measurement_noise(residual, val["tests"].to_numpy(np.float64), latent_var)
        self.details.update(s0=self.s0, s1=self.s1)


@dataclass
class LightGBMPeer(PeerModel):
    """LightGBM trees on the features; no latent variance (``booster``: a ``lightgbm.Booster``)."""

    booster: Any = None

    def latent(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        features = peer_features(rows, self.projection, self.covariates, self.density).to_numpy()
        mean = np.asarray(self.booster.predict(features, num_iteration=self.booster.best_iteration), np.float64)
        return mean, np.zeros(len(mean))


@dataclass
class GPBoostPeer(PeerModel):
    """GPBoost trees plus a Vecchia space-time GP (``booster``: a ``gpboost.Booster`` with its
    ``gp_model``)."""

    booster: Any = None

    def latent(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        features = peer_features(rows, self.projection, self.covariates, self.density).to_numpy()
        coords = peer_features(rows, self.projection, GP_COORDINATES).to_numpy()
        out = self.booster.predict(features, gp_coords_pred=coords, predict_var=True, pred_latent=True)
        mean = np.asarray(out["fixed_effect"], np.float64) + np.asarray(out["random_effect_mean"], np.float64)
        return mean, np.maximum(np.asarray(out["random_effect_cov"], np.float64), 0.0)


def _splits(dataset: HasFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    frame = dataset.frame
    return frame[frame["split"] == "train"], frame[frame["split"] == "val"]


def fit_lightgbm(
    dataset: HasFrame, variant: str = "tests", seed: int = 0, density_tiles: pd.DataFrame | None = None
) -> LightGBMPeer:
    """LightGBM peer: L2 regression of y on the variant's features.

    Training rows only; up to :data:`LIGHTGBM_ROUNDS` rounds of :data:`LIGHTGBM_PARAMS`,
    stopped when the validation L2 has not improved for :data:`LIGHTGBM_PATIENCE` rounds (the
    best round is kept); then ``(s0, s1)`` by maximum likelihood on the validation residuals,
    with no latent variance (trees give none), so its predictive variance is
    s0^2 + s1^2 / tests.
    """
    import lightgbm as lgb

    start = time.perf_counter()
    covariates = VARIANTS[variant]
    projection, density = projection_and_density(dataset, density_tiles)
    train, val = _splits(dataset)
    x_train = peer_features(train, projection, covariates, density)
    x_val = peer_features(val, projection, covariates, density).to_numpy()
    train_set = lgb.Dataset(x_train.to_numpy(), train["y"].to_numpy(np.float64), feature_name=list(x_train.columns))
    val_set = lgb.Dataset(x_val, val["y"].to_numpy(np.float64), reference=train_set)
    booster = lgb.train(
        {**LIGHTGBM_PARAMS, "seed": seed, "num_threads": THREADS},
        train_set,
        num_boost_round=LIGHTGBM_ROUNDS,
        valid_sets=[val_set],
        callbacks=[lgb.early_stopping(LIGHTGBM_PATIENCE, verbose=False)],
    )
    peer = LightGBMPeer("lightgbm", variant, covariates, projection, density, booster=booster)
    peer.fit_noise(val)
    peer.details.update(iterations=booster.best_iteration, seconds=time.perf_counter() - start)
    return peer


def gpboost_weights(tests: np.ndarray, rho: float = GPBOOST_WEIGHT_RHO) -> np.ndarray:
    """(n,) GPBoost sample weights 1 / (rho + 1 / tests) of rows with ``tests`` (n,) tests."""
    return 1.0 / (rho + 1.0 / np.asarray(tests, dtype=np.float64))


def fit_gpboost(
    dataset: HasFrame, variant: str = "tests", seed: int = 0, density_tiles: pd.DataFrame | None = None
) -> GPBoostPeer:
    """GPBoost peer: tree boosting plus a Vecchia space-time GP, in three stages.

    1. Covariance parameters. ``gpboost.GPModel(gp_coords=(t_years, x_km, y_km),
       cov_function="matern_space_time", cov_fct_shape=0.5, likelihood="gaussian",
       gp_approx="vecchia", num_neighbors=20, weights=w)`` is fitted by maximum likelihood
       (``GPModel.fit(y, X)``, gpboost's default L-BFGS) on :data:`GPBOOST_COV_ROWS` random
       training rows, with the variant's features plus an intercept as a linear mean (fixed
       effects). Matern 0.5 is the exponential covariance
       sigma_f^2 exp(-sqrt((dt / range_t)^2 + (d / range_s)^2)); time in years, distance in km.
    2. Boosting. ``gpboost.train(params, Dataset(features, y), gp_model=GPModel(... all
       training rows ...), train_gp_model_cov_pars=False, valid_sets=[validation rows],
       use_gp_model_for_validation=True, early_stopping_rounds=10)`` with the stage-1
       parameters as ``init_cov_pars`` (held fixed), :data:`GPBOOST_PARAMS` (L2, learning
       rate 0.1, max depth 5), at most :data:`GPBOOST_ROUNDS` rounds; the validation L2 of
       trees + GP mean picks the round (``GPModel.set_prediction_data(gp_coords_pred=...)``
       gives the GP the validation coordinates).
    3. Noise. ``Booster.predict(features, gp_coords_pred=..., predict_var=True,
       pred_latent=True)`` gives the tree part, the GP's posterior mean and the GP's latent
       posterior variance v (without the nugget) at the validation rows; ``(s0, s1)`` are fitted
       by maximum likelihood to the residuals with variance v + s0^2 + s1^2 / tests. The
       predictive variance of a measurement is then v + s0^2 + s1^2 / tests and that of the
       tile mean v + s0^2 (GPBoost's own nugget is used for fitting only).

    Test-count weights (``GPModel(weights=...)``): gpboost divides a row's Gaussian nugget by
    its weight, so with ``w = 1 / (rho + 1 / tests)`` (:func:`gpboost_weights`, rho =
    :data:`GPBOOST_WEIGHT_RHO` = 0.5) the nugget is sigma^2 (rho + 1 / tests), the same form as
    the measurement noise (``details["cov_pars"]["nugget"]`` is that sigma^2). The weights
    handed to gpboost are divided by their mean (the parameters rescaled to match), which
    changes nothing but silences its "sum of the weights" message. Why not ``w = tests``
    (rho = 0), which had the higher stage-1 likelihood on PR: gpboost's boosting step fits a
    tree to Psi^{-1} (y - F) with unit Hessian, and that iteration diverges once learning_rate
    / (smallest nugget) exceeds 2; on PR spatial-block it did for rho = 0 and rho = 0.05. With
    rho = 0.5 the smallest nugget is about sigma^2 / 2, and the weights are also capped at
    sigma^2 / learning_rate so that learning_rate / nugget <= 1 on every row
    (``details["capped_rows"]`` counts the capped rows). After 15 rounds on PR spatial-block
    (tests variant), rho = 0.5 had validation L2 0.2890, rho = 0.2 0.2895, no weights 0.2949.
    """
    import gpboost as gpb

    start = time.perf_counter()
    covariates = VARIANTS[variant]
    projection, density = projection_and_density(dataset, density_tiles)
    train, val = _splits(dataset)
    features_train = peer_features(train, projection, covariates, density)
    x_train = features_train.to_numpy()
    coords_train = peer_features(train, projection, GP_COORDINATES).to_numpy()
    y_train = train["y"].to_numpy(np.float64)
    weights = gpboost_weights(train["tests"].to_numpy(np.float64))
    gp_kw: dict[str, Any] = {
        "cov_function": "matern_space_time",
        "cov_fct_shape": 0.5,
        "likelihood": "gaussian",
        "gp_approx": "vecchia",
        "num_neighbors": GPBOOST_NEIGHBOURS,
        "seed": seed,
        "num_parallel_threads": THREADS,
    }

    rows = np.random.default_rng(seed).choice(len(train), min(GPBOOST_COV_ROWS, len(train)), replace=False)
    pilot_weights = weights[rows] / weights[rows].mean()  # sum = n keeps gpboost from logging about it
    pilot = gpb.GPModel(gp_coords=coords_train[rows], weights=pilot_weights, **gp_kw)
    pilot.fit(y=y_train[rows], X=np.column_stack([np.ones(len(rows)), x_train[rows]]))
    cov_pars = np.asarray(pilot.get_cov_pars(), dtype=np.float64).reshape(-1)
    # gpboost's nugget of a row is cov_pars[0] / pilot_weights[row] = nugget / weights[row]
    nugget = cov_pars[0] * weights[rows].mean()
    cov_seconds = time.perf_counter() - start

    capped = np.minimum(weights, nugget / GPBOOST_PARAMS["learning_rate"])  # nugget / w >= learning rate
    scale = capped.mean()
    gp_model = gpb.GPModel(gp_coords=coords_train, weights=capped / scale, **gp_kw)  # nugget / capped[row]
    gp_model.set_optim_params(params={"init_cov_pars": np.array([nugget / scale, *cov_pars[1:]])})
    gp_model.set_prediction_data(gp_coords_pred=peer_features(val, projection, GP_COORDINATES).to_numpy())
    train_set = gpb.Dataset(x_train, y_train, feature_name=list(features_train.columns))
    val_set = gpb.Dataset(
        peer_features(val, projection, covariates, density).to_numpy(), val["y"].to_numpy(np.float64),
        reference=train_set,
    )
    booster = gpb.train(
        {**GPBOOST_PARAMS, "seed": seed, "num_threads": THREADS},
        train_set,
        num_boost_round=GPBOOST_ROUNDS,
        gp_model=gp_model,
        train_gp_model_cov_pars=False,
        use_gp_model_for_validation=True,
        valid_sets=[val_set],
        early_stopping_rounds=GPBOOST_PATIENCE,
        verbose_eval=False,
    )
    peer = GPBoostPeer("gpboost", variant, covariates, projection, density, booster=booster)
    peer.fit_noise(val)
    names = ("nugget", "gp_var", "range_t_years", "range_s_km")
    peer.details.update(
        cov_pars=dict(zip(names, (float(v) for v in (nugget, *cov_pars[1:])), strict=False)),
        capped_rows=int(np.sum(capped < weights)),
        coef=np.asarray(pilot.get_coef(), dtype=np.float64).reshape(-1).tolist(),
        iterations=booster.best_iteration,
        cov_seconds=cov_seconds,
        seconds=time.perf_counter() - start,
    )
    return peer


FITTERS: Mapping[str, Callable[..., PeerModel]] = {"lightgbm": fit_lightgbm, "gpboost": fit_gpboost}


def fit_peer(
    dataset: HasFrame, name: str, variant: str, seed: int = 0, measurement_tails: bool = True,
    density_tiles: pd.DataFrame | None = None,
) -> PeerModel:
    """Fit peer ``name`` (:data:`PEERS`) in ``variant`` (:data:`VARIANTS`); with
    ``measurement_tails``, choose a new measurement's family on the validation rows as geodbk's
    space-time fits do (:func:`geodbk.fit.tails.fit_measurement_tails`); ``density_tiles``
    (another layer's tiles) add their test density to the mean's features, as
    ``geodbk.fit_dataset(density_tiles=)`` adds it to dbk-rbf's inputs."""
    if name not in FITTERS:
        raise ValueError(f"unknown peer {name!r}; known: {sorted(FITTERS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {sorted(VARIANTS)}")
    peer = FITTERS[name](dataset, variant, seed=seed, density_tiles=density_tiles)
    if measurement_tails:
        train, val = _splits(dataset)
        peer.tails = fit_measurement_tails(val["y"].to_numpy(np.float64), peer.predict_tiles(val),
                                           val["tests"].to_numpy(np.float64),
                                           train_tests=train["tests"].to_numpy(np.float64))
        peer.details.update(skew=peer.tails.shape.skew, tailweight=peer.tails.shape.tailweight,
                            noise_scale=peer.tails.noise_scale, tests_shift=peer.tails.tests_shift)
    return peer
