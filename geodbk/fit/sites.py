"""A fitted model's :class:`~geodbk.fit.posterior.MapPosterior` at a finite set of sites.

:meth:`GeoModel.posterior <geodbk.fit.geomodel.GeoModel.posterior>` calls :func:`map_posterior`:
for points (tiles, grid cells) or the weighted means of groups of points (hexagons,
polygons), at one quarter, for each of the model's targets. The parts:

* **the long-range part, shared by every site:** the basis GP's posterior factor
  ``U_i = sqrt(s F_i) y_std L^T phi(x_i)`` (:meth:`~geodbk.fit.regressor.Regressor.low_rank_factor`;
  s the residual kernel's variance scale, F_i the variance factor of the forecast horizon and
  the local volatility), summed with the group weights for group means: exact. A model with a
  kriging part joins both parts' factors and the difference of their means
  (:func:`~geodbk.fit.averaging.averaged_factor`), the averaged covariance's long-range part.
* **each site's own variance beyond it:** the model's predictive variance (:meth:`GeoModel.predict`,
  or :meth:`GeoModel.predict_areas` for groups, the one combination rule) minus ``||U_i||^2``:
  exact, so every site's marginal is the model's.
* **between nearby sites:** the local residual field's spatial share of its prior,
  ``lambda = local_var / k_local(0)`` (the deep part's field), decaying as ``exp(-d / range) exp(-|dt| / time_scale)``
  and tapered to zero at :data:`CUTOFF_RANGES` ranges (a Wendland function, so the sparse
  matrix stays positive semi-definite), times ``sqrt(v_i v_j)``. This is an approximation:
  the field's exact conditional cross-covariance is available per group
  (:meth:`~geodbk.fit.residuals.ResidualField.area_condition`) but not between groups.
* **the measurement likelihood:** a site's test noise per test (the model's
  ``measurement_sd^2 - sd^2`` at one test) and, for a group mean, the nugget of one visited
  tile's deviation from the group mean (the mean of its points' variances minus the group
  mean's variance, exact in expectation over the group's points).

Two targets are joined with the validation-chosen correlation
(:class:`~geodbk.fit.targets.TargetCorrelation`): with e_a, z_b the two targets' errors as
fitted apart, ``e_b = c z_a + sqrt(1 - rho^2) z_b``, ``c_i = rho sd_b(i) / sd_a(i)``, which keeps
both marginals and gives every site the correlation rho between its two targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree

from geodbk.dataset.inputs import TimeLike
from geodbk.errors import InputDataError, extrapolation_said
from geodbk.fit.averaging import averaged_factor
from geodbk.fit.local_kernel import planar_distance
from geodbk.fit.posterior import MapPosterior
from geodbk.ingest.quadkey import tile_centres
from geodbk.prediction import Prediction

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.fit.geomodel import GeoModel
    from geodbk.fit.targets import TargetCorrelation

#: Nearby sites' local covariance is tapered to zero at this many residual-kernel ranges.
CUTOFF_RANGES = 3.0


def _wendland(r: np.ndarray) -> np.ndarray:
    """Wendland's compactly supported correlation (1 - r)^4 (4 r + 1) for r in [0, 1], 0 beyond."""
    r = np.clip(r, 0.0, 1.0)
    return (1.0 - r) ** 4 * (4.0 * r + 1.0)


def _normalised(groups: np.ndarray, weights: np.ndarray | None, n: int, n_groups: int) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, np.float64).reshape(-1)
    totals = np.bincount(groups, weights=w, minlength=n_groups)
    return w / np.where(totals > 0, totals, 1.0)[groups]


def target_posterior(
    model: GeoModel, lonlat: np.ndarray, time: TimeLike = None, *, groups: np.ndarray | None = None,
    n_groups: int | None = None, weights: np.ndarray | None = None, covariance: bool = True,
) -> MapPosterior:
    """One target's :class:`MapPosterior` (T = 1) at points ``lonlat`` (n, 2) degrees, or at the
    weighted means of their ``groups`` (n,) integers in [0, n_groups); see the module text.
    ``covariance=False`` leaves out what sites share (marginals and per-site parts only)."""
    lonlat = np.asarray(lonlat, np.float64).reshape(-1, 2)
    n = len(lonlat)
    one_test, parts = model.predict_with_parts(lonlat, time, tests=np.ones(n))
    assert one_test.measurement_sd is not None  # asked with tests
    point_per_test = np.maximum(one_test.measurement_sd**2 - one_test.sd**2, 0.0)
    if groups is None:
        mean, var, per_test, nugget = one_test.mean, one_test.var, point_per_test, np.zeros(n)
        site_lonlat, member_w, site_of = lonlat, np.ones(n), np.arange(n)
        n_sites = n
    else:
        site_of = np.asarray(groups, np.int64).reshape(-1)
        n_sites = int(site_of.max()) + 1 if n_groups is None else int(n_groups)
        member_w = _normalised(site_of, weights, n, n_sites)
        areas = model.predict_areas(lonlat, site_of, n_sites, time, weights=member_w)
        mean, var = areas.mean, areas.var
        per_test = np.bincount(site_of, weights=member_w * point_per_test, minlength=n_sites)
        nugget = np.maximum(np.bincount(site_of, weights=member_w * one_test.var, minlength=n_sites) - var, 0.0)
        site_lonlat = np.column_stack([np.bincount(site_of, weights=member_w * lonlat[:, k], minlength=n_sites)
                                       for k in (0, 1)])
    factor = np.zeros((n_sites, 0))
    if covariance and model.has_kernel:
        point_factor = _point_factor(model, lonlat, time, parts)
        factor = np.zeros((n_sites, point_factor.shape[1]))
        np.add.at(factor, site_of, member_w[:, None] * point_factor)
    own = np.maximum(var - (factor**2).sum(1), 0.0)
    local = sp.diags(own).tocsr()
    if covariance and model.residuals is not None:
        local = local + _nearby(model, site_lonlat, own)
    return MapPosterior(
        targets=(model.info.target,), mean=mean[:, None], factor=factor[:, None, :], local=local.tocsr(),
        nugget=nugget[:, None, None], per_test=per_test[:, None, None],
    )


def _point_factor(
    model: GeoModel, lonlat: np.ndarray, time: TimeLike, parts: tuple[Prediction, Prediction] | None = None
) -> np.ndarray:
    """The long-range part's factor at the points, (n, k): the basis GP's, scaled as the module text
    says; with a kriging part, both parts' joined as their average's
    (:func:`~geodbk.fit.averaging.averaged_factor`), from the ``parts``' own predictions there
    (:meth:`GeoModel.predict_with_parts`)."""
    if model.kriging is not None:
        assert parts is not None  # predict_with_parts gives them for a model with a kriging part
        with extrapolation_said():  # the deep part warns about the places, once
            kriging_factor = _point_factor(model.kriging, lonlat, time)
        return averaged_factor(_point_factor(model.deep_part, lonlat, time), kriging_factor,
                               parts[0].mean, parts[1].mean)
    factor = model.regressor.low_rank_factor(model.features(lonlat, time))
    if model.residuals is not None:
        years = model.inputs.years(time, len(lonlat))
        assert years is not None  # a model with a residual field has a time axis
        scale = model.residuals.kernel.variance_scale * model.residuals.variance_factor(lonlat, years)
        factor *= np.sqrt(scale)[:, None]
    return factor


def _nearby(model: GeoModel, site_lonlat: np.ndarray, own: np.ndarray) -> sp.csr_matrix:
    """The local field's covariance between distinct nearby sites (one quarter), sparse (n, n)."""
    field = model.residuals
    assert field is not None
    kernel = field.kernel
    share = kernel.local_var / kernel.prior_var
    cutoff = CUTOFF_RANGES * kernel.range_m
    xy = field.projection.to_metres(tile_centres(site_lonlat))
    pairs = cKDTree(xy).query_pairs(cutoff, output_type="ndarray")
    if len(pairs) == 0:
        return sp.csr_matrix((len(own), len(own)))
    i, j = pairs[:, 0], pairs[:, 1]
    distance = planar_distance(xy[i], xy[j])
    values = share * np.sqrt(own[i] * own[j]) * np.exp(-distance / kernel.range_m) * _wendland(distance / cutoff)
    upper = sp.coo_matrix((values, (i, j)), shape=(len(own), len(own)))
    return (upper + upper.T).tocsr()


def join_targets(first: MapPosterior, second: MapPosterior, correlation: TargetCorrelation) -> MapPosterior:
    """The T = 2 posterior of two targets fitted apart (T = 1 each, the same sites), their errors
    correlated at ``correlation.tile`` at every site and their test noise at ``correlation.noise``
    (see the module text)."""
    n = first.n_sites
    rho = correlation.tile
    sd_a, sd_b = first.sd()[:, 0], second.sd()[:, 0]
    c = rho * sd_b / np.where(sd_a > 0, sd_a, 1.0)
    keep = np.sqrt(1.0 - rho**2)
    k_a, k_b = first.factor.shape[2], second.factor.shape[2]
    factor = np.zeros((n, 2, k_a + k_b))
    factor[:, 0, :k_a] = first.factor[:, 0]
    factor[:, 1, :k_a] = c[:, None] * first.factor[:, 0]
    factor[:, 1, k_a:] = keep * second.factor[:, 0]
    # [e_a; e_b] = M [z_a; z_b] with M = [[I, 0], [diag(c), keep I]], then sites interleaved
    eye = sp.identity(n, format="csr")
    mixing = sp.bmat([[eye, None], [sp.diags(c), keep * eye]], format="csr")
    stacked = mixing @ sp.block_diag([first.local, second.local], format="csr") @ mixing.T
    order = np.column_stack([np.arange(n), n + np.arange(n)]).reshape(-1)  # site-major: (site, target)
    local = stacked.tocsr()[order][:, order].tocsr()

    def pair(block_a: np.ndarray, block_b: np.ndarray, r: float) -> np.ndarray:
        a, b = block_a[:, 0, 0], block_b[:, 0, 0]
        cross = r * np.sqrt(a * b)
        return np.stack([np.stack([a, cross], -1), np.stack([cross, b], -1)], -2)

    if first.downdate.shape[2] or second.downdate.shape[2]:
        raise InputDataError("join the two targets before conditioning them")
    return MapPosterior(
        targets=(first.targets[0], second.targets[0]),
        mean=np.column_stack([first.mean[:, 0], second.mean[:, 0]]),
        factor=factor,
        local=local,
        nugget=pair(first.nugget, second.nugget, rho),
        per_test=pair(first.per_test, second.per_test, correlation.noise),
    )


def map_posterior(
    model: GeoModel, lonlat: np.ndarray, time: TimeLike = None, *, groups: np.ndarray | None = None,
    n_groups: int | None = None, weights: np.ndarray | None = None, covariance: bool = True,
) -> MapPosterior:
    """The model's :class:`MapPosterior` over its targets (one, or download and upload together)
    at the sites (see :func:`target_posterior`)."""
    parts = [
        target_posterior(model.for_target(target), lonlat, time, groups=groups, n_groups=n_groups,
                         weights=weights, covariance=covariance)
        for target in model.targets
    ]
    if len(parts) == 1:
        return parts[0]
    assert model.correlation is not None  # every multi-target model has one
    return join_targets(parts[0], parts[1], model.correlation)


__all__ = ["CUTOFF_RANGES", "join_targets", "map_posterior", "target_posterior"]
