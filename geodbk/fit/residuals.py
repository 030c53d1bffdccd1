"""Tile-scale detail: local space-time kriging of a fitted GP's training residuals.

A tile keeps much of its offset from its neighbourhood from quarter to quarter (a mast, a
building), and neighbouring tiles share some of it. A low-rank deep kernel cannot hold
30,000 tile offsets, so the map model adds a second, local kernel to it:

    k((x, t), (x', t')) = k_GP((x, t), (x', t'))
                          + [same tile] (tile_var + tile_time_var exp(-|t - t'| / time_scale))
                          + local_var exp(-d(x, x') / range_m) exp(-|t - t'| / time_scale)

and conditions the local part on the residuals ``r = y - mu_GP`` of the training rows, with
each row's noise the GP's own measurement variance rescaled part by part: ``variance_scale``
s times its tile-mean variance (the share the local kernel does not explain) plus
``test_noise_scale`` s_t times its test-count noise sigma1^2 / tests. Two scales, because one
left busy tiles' intervals too wide and one-test tiles' too narrow (PR random test rows, z sd
1.03 at 1 test, 0.82 at 20 or more). Conditioning uses the ``neighbours`` nearest
training rows only (the nearest-neighbour / Vecchia approximation that NNGP and local
kriging tools use), so a prediction costs O(m^3) with m = ``neighbours``. Nearest in space
and time: a row a year away from the query counts as ``metres_per_year`` metres away
(:data:`NEIGHBOUR_METRES_PER_YEAR`). By distance alone, a tile's own rows all tie at
distance 0 and the neighbourhood held whichever of its quarters the tree returned first; a
well-observed tile's 16 rows filled it and no neighbouring tile was seen. The result adds
the kriged residual to the mean and its conditional variance to the predictive variance:

    mean = mu_GP + k_m^T (K_mm + D_m)^{-1} r_m,   D_m = s V_m + s_t T_m
    var  = s var_GP + k(x, x) - k_m^T (K_mm + D_m)^{-1} k_m   (+ s_t sigma1^2 / tests for a measurement)

Queries are snapped to the centre of their zoom-16 tile, so a map cell takes its tile's
value. The seven hyperparameters are chosen by the Gaussian NLL on validation rows plus that
of validation areas' mean residuals (2 and 5 km squares of one quarter,
:func:`~geodbk.fit.validation_areas.square_areas`), by bounded L-BFGS-B in log space with
finite-difference gradients (run to convergence, a few hundred evaluations), in the spirit
of the ``knn`` baseline's k. The tiles fix each row's variance; the areas fix how much of it
neighbouring tiles share.
Places far from any training tile get no correction and a larger variance.

Size: conditioning, change and area variances, and the fit's tile and area criteria all read
the one neighbourhood geometry and batched solve (:meth:`ResidualField._geometry`,
:meth:`ResidualField._solve`); split apart, they would reach into each other's private parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize, minimize_scalar
from scipy.spatial import cKDTree

from geodbk.dataset.coords import ProjectedTransform
from geodbk.fit.metrics import nll
from geodbk.fit.validation_areas import AreaGroups
from geodbk.fit.volatility import FIT_ROWS as VOLATILITY_FIT_ROWS
from geodbk.fit.volatility import LocalVolatility
from geodbk.ingest.quadkey import SAME_TILE_M, tile_centres
from geodbk.prediction import Prediction

#: Training rows each prediction is conditioned on.
NEIGHBOURS = 16
#: Validation rows used to choose the hyperparameters, and the optimiser's iteration cap.
#: L-BFGS-B converges in 30-45 iterations (260-430 evaluations) on PR and HI. Nelder-Mead,
#: used before, had not converged at 200 iterations, so its answer moved with 1e-5 changes
#: in the GP (a two-process fit against a one-process one: NLL 0.002 apart).
FIT_ROWS = 3000
FIT_ITERATIONS = 200
#: Validation rows of the last training quarter needed to estimate the forecast variance.
MIN_FORECAST_ROWS = 30
#: Rows per batched solve (bounds the (rows, m, m) temporaries to about 30 MB).
_CHUNK = 16384
#: Pairs of points farther apart than this many ranges are left out of area variances.
AREA_CUTOFF_RANGES = 4.0
#: Query points per block of an area variance's pair sums (bounds their memory).
_QUERY_BLOCK = 2048
#: How many metres one year apart counts as when neighbours are chosen (space-time nearest
#: rows). Validation and test NLL of dbk-rbf, one fit each, against choosing by distance alone
#: (ties broken arbitrarily): HI random -0.014 / -0.009, PR random -0.010 / -0.009, PR
#: spatial-block -0.001 / -0.002, HI spatial-block -0.001 / -0.002, forecast -0.005 to -0.009 /
#: +0.001 to +0.002 (the forecast split's validation rows are inside the training quarters).
#: On the random splits' validation rows, 500 m was 0.002 better on PR and 0.001 worse on HI;
#: 100 and 1,000 m were worse on both, 2,000 m on HI.
NEIGHBOUR_METRES_PER_YEAR = 250.0
#: Bounds of the hyperparameters in :meth:`ResidualField.fit` (LocalKernel field order): no
#: variance above 1 (a factor of 10 in speed at one sd), time scales between a quarter and 20
#: years. Without them a validation set whose tiles all have training rows leaves an unseen
#: tile's variance free to run off. Ranges between a tile and 10 km: the field is local, and
#: longer-range structure belongs to the deep kernel. The validation NLL hardly tells ranges
#: apart (HI random: 0.6319 at 45 km, 0.6325 at 4 km), but 16 nearest rows cannot pin down a
#: long-range part, so an area's variance then keeps it: HI validation county z sd 0.62 with
#: the earlier 50 km bound, 0.82 with 10 km (PR 0.98 and 1.00).
_BOUNDS = ((0.05, 2.0), (1e-5, 1.0), (1e-5, 1.0), (0.25, 20.0), (1e-5, 1.0), (50.0, 10_000.0), (0.05, 4.0))


@dataclass(frozen=True)
class LocalKernel:
    """Hyperparameters of the local residual kernel (variances in (log10 units)^2).

    Attributes:
        variance_scale: s, the factor on the GP's own variance (0 < s, usually < 1).
        tile_var: variance of a tile's persistent offset.
        tile_time_var: variance of a tile's offset that decays with time.
        time_scale: years over which the decaying parts forget.
        local_var: variance of the short-range spatial part.
        range_m: its range, metres.
        test_noise_scale: s_t, the factor on the GP's test-count noise sigma1^2 / tests.
    """

    variance_scale: float = 0.7
    tile_var: float = 0.03
    tile_time_var: float = 0.04
    time_scale: float = 1.5
    local_var: float = 0.02
    range_m: float = 1500.0
    test_noise_scale: float = 0.7

    def to_vector(self) -> np.ndarray:
        return np.log(np.array(list(asdict(self).values())))

    @classmethod
    def from_vector(cls, v: np.ndarray) -> LocalKernel:
        return cls(*map(float, np.exp(v)))

    @property
    def prior_var(self) -> float:
        """k_local(x, x)."""
        return self.tile_var + self.tile_time_var + self.local_var

    def combine(self, gp: np.ndarray, local: np.ndarray | float, test_noise: np.ndarray | float = 0.0) -> np.ndarray:
        """The map model's (co)variance from its parts: ``s * gp + local``, plus ``s_t * test_noise``
        for a measurement (``test_noise`` the GP's sigma1^2 / tests)."""
        return self.variance_scale * gp + local + self.test_noise_scale * np.asarray(test_noise)

    def __call__(self, distance_m: np.ndarray, dt_years: np.ndarray) -> np.ndarray:
        """k_local for arrays of distances (metres) and time lags (years) of the same shape."""
        decay = np.exp(-np.abs(dt_years) / self.time_scale)
        same = distance_m < SAME_TILE_M
        local = self.local_var * np.exp(-distance_m / self.range_m) * decay
        return same * (self.tile_var + self.tile_time_var * decay) + local


@dataclass
class ResidualField:
    """The training residuals of a GP and the local kernel that spreads them.

    Attributes:
        kernel: the local kernel's hyperparameters.
        projection: lon/lat -> metres for distances.
        xy_m: (n, 2) training tile centres, metres.
        years: (n,) training rows' times, decimal years.
        residual: (n,) y - mu_GP at the training rows, log10 units.
        noise_var: (n,) the GP's tile-mean variance at the training rows, (log10 units)^2.
        neighbours: m, training rows per prediction.
        horizon_rate: relative growth per year of a forecast's predictive variance after the last
            training time (see :meth:`horizon_factor` and :meth:`fit`).
        test_var: (n,) the GP's test-count noise sigma1^2 / tests at the training rows (their
            measurement variance is ``noise_var + test_var``); zeros for fields saved before it
            existed, whose ``noise_var`` is the whole measurement variance.
        metres_per_year: how far, in metres, a year between a query and a training row counts
            when the nearest rows are chosen (0: by distance alone, as fields saved before it).
        volatility: the local variance factor V(x) (:mod:`geodbk.fit.volatility`), or ``None``
            (V = 1, as fields saved before it).
    """

    kernel: LocalKernel
    projection: ProjectedTransform
    xy_m: np.ndarray
    years: np.ndarray
    residual: np.ndarray
    noise_var: np.ndarray
    neighbours: int = NEIGHBOURS
    horizon_rate: float = 0.0
    test_var: np.ndarray | None = None
    metres_per_year: float = NEIGHBOUR_METRES_PER_YEAR
    volatility: LocalVolatility | None = None

    def __post_init__(self) -> None:
        self.neighbours = int(min(self.neighbours, len(self.residual)))
        if self.test_var is None:
            self.test_var = np.zeros_like(self.noise_var)
        self._tree = cKDTree(np.column_stack([self.xy_m, self.metres_per_year * self.years]))

    def _neighbourhoods(self, lonlat: np.ndarray, years: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distances in metres and indices, (n, m), of the m training rows nearest in space and
        time (:attr:`metres_per_year`) to the tiles of ``lonlat`` (n, 2) degrees at ``years`` (n,)."""
        xy = self.projection.to_metres(tile_centres(np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)))
        return self._nearest(xy, years, self.neighbours)

    def _nearest(self, xy: np.ndarray, years: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Distances in metres and indices, (n, k), of the k training rows nearest in space and
        time to points ``xy`` (n, 2) metres at ``years`` (n,)."""
        _, index = self._tree.query(np.column_stack([xy, self.metres_per_year * years]), k=k)
        index = index.reshape(len(xy), -1)
        return np.sqrt(((self.xy_m[index] - xy[:, None, :]) ** 2).sum(-1)), index

    def condition(self, lonlat: np.ndarray, years: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Kriged residual and its conditional variance k(x,x) - k_m^T A^{-1} k_m, (n,), at
        ``lonlat`` (n, 2) degrees and ``years`` (n,) (or one time for all)."""
        years = np.broadcast_to(np.asarray(years, dtype=np.float64), (len(lonlat),))
        mean, var = np.empty(len(lonlat)), np.empty(len(lonlat))
        for start in range(0, len(lonlat), _CHUNK):
            rows = slice(start, start + _CHUNK)
            mean[rows], var[rows], _ = self._solve(self._geometry(lonlat[rows], years[rows]), self.kernel)
        return mean, var

    def with_rows(
        self, lonlat: np.ndarray, years: np.ndarray, residual: np.ndarray, noise_var: np.ndarray, test_var: np.ndarray
    ) -> ResidualField:
        """A new field conditioned on these rows too, with the same kernel, forecast rate and
        volatility: what :meth:`fit` builds from training rows, given the new rows' tile centres
        (n, 2) degrees, years (n,), residuals y - mu_GP, tile-mean and test-count variances (n,)."""
        assert self.test_var is not None  # set by __post_init__
        xy = self.projection.to_metres(tile_centres(np.asarray(lonlat, np.float64).reshape(-1, 2)))

        def joined(old: np.ndarray, new: np.ndarray) -> np.ndarray:
            return np.concatenate([old, np.asarray(new, np.float64).reshape(-1)])

        return ResidualField(
            self.kernel, self.projection, np.concatenate([self.xy_m, xy]), joined(self.years, years),
            joined(self.residual, residual), joined(self.noise_var, noise_var),
            NEIGHBOURS if self.neighbours == len(self.residual) else self.neighbours,
            self.horizon_rate, joined(self.test_var, test_var), self.metres_per_year, self.volatility,
        )

    def horizon_factor(self, years: np.ndarray | float) -> np.ndarray:
        """``1 + horizon_rate * max(t - t_last, 0)`` for times ``years`` (any shape), decimal years:
        the factor on a forecast's predictive (co)variance, 1 inside the training period and
        growing linearly with the horizon. Scaling the covariance of (x, t) and (x', t') by
        ``sqrt(F(t) F(t'))`` keeps it a covariance."""
        ahead = np.maximum(np.asarray(years, dtype=np.float64) - float(self.years.max()), 0.0)
        return 1.0 + self.horizon_rate * ahead

    def variance_factor(self, lonlat: np.ndarray, years: np.ndarray | float) -> np.ndarray:
        """The factor (n,) on the map model's (co)variance at ``lonlat`` (n, 2) degrees and
        ``years`` (n,) (or one time): the forecast horizon's :meth:`horizon_factor` times the local
        volatility V(x) (:class:`~geodbk.fit.volatility.LocalVolatility`). The covariance of two
        points is scaled by the square root of the product of their factors."""
        n = len(lonlat)
        factor = np.broadcast_to(self.horizon_factor(years), (n,)).astype(np.float64)
        return factor if self.volatility is None else factor * self.volatility.factor(lonlat)

    def leave_one_out(self) -> tuple[np.ndarray, np.ndarray]:
        """Each training row's error against the field conditioned on its m nearest other rows
        and that error's variance under the map model (``s noise_var + s_t test_var`` plus the
        conditional variance), (n,) each. In blocks of rows, so memory stays bounded."""
        n = len(self.residual)
        k = min(self.neighbours + 1, n)
        error, var = np.empty(n), np.empty(n)
        for start in range(0, n, _CHUNK):
            rows = np.arange(start, min(start + _CHUNK, n))
            distance, found = self._nearest(self.xy_m[rows], self.years[rows], k)
            own = found == rows[:, None]  # the row itself, unless a tie pushed it out: then drop the last
            keep = np.where(own.any(1)[:, None], ~own, np.arange(k)[None, :] < k - 1)
            geometry = self._around(
                distance[keep].reshape(len(rows), k - 1), found[keep].reshape(len(rows), k - 1), self.years[rows])
            kriged, conditional, _ = self._solve(geometry, self.kernel)
            error[rows] = self.residual[rows] - kriged
            var[rows] = conditional + self._row_noise(rows, self.kernel)
        return error, var

    def _geometry(self, lonlat: np.ndarray, years: np.ndarray) -> tuple[np.ndarray, ...]:
        """What conditioning needs besides the kernel: neighbour indices (n, m), query-neighbour
        distances and lags (n, m), and neighbour-neighbour distances and lags (n, m, m)."""
        return self._around(*self._neighbourhoods(lonlat, years), years)

    def _around(self, distance: np.ndarray, index: np.ndarray, years: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`_geometry` of queries at ``years`` (n,) from their neighbours' distances in
        metres and indices, (n, m), as :meth:`_nearest` gives them."""
        xy, t = self.xy_m[index], self.years[index]  # (n, m, 2), (n, m)
        pairwise = np.sqrt(((xy[:, :, None, :] - xy[:, None, :, :]) ** 2).sum(-1))
        return index, distance, years[:, None] - t, pairwise, t[:, :, None] - t[:, None, :]

    def _gram(
        self, index: np.ndarray, pairwise: np.ndarray, pairwise_lag: np.ndarray, kernel: LocalKernel
    ) -> np.ndarray:
        """A = K_mm + D_m, (n, m, m): the neighbours' local kernel plus their rescaled noise."""
        gram = kernel(pairwise, pairwise_lag)
        diagonal = np.arange(index.shape[1])
        gram[:, diagonal, diagonal] += self._row_noise(index, kernel)
        return gram

    def _row_noise(self, index: np.ndarray, kernel: LocalKernel) -> np.ndarray:
        """The noise of training rows ``index`` (any shape): their rescaled GP variances
        ``s noise_var + s_t test_var``."""
        assert self.test_var is not None  # set by __post_init__
        return kernel.combine(self.noise_var[index], 0.0, self.test_var[index])

    def _solve(
        self, geometry: tuple[np.ndarray, ...], kernel: LocalKernel
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Kriged mean and conditional variance at the geometry's queries, (n,), and the kriging
        weights A^{-1} k_m, (n, m)."""
        index, distance, lag, pairwise, pairwise_lag = geometry
        cross = kernel(distance, lag)  # (n, m)
        rhs = np.stack([self.residual[index], cross], axis=-1)
        solved = np.linalg.solve(self._gram(index, pairwise, pairwise_lag, kernel), rhs)  # (n, m, 2)
        mean = (cross * solved[..., 0]).sum(-1)
        var = np.maximum(kernel.prior_var - (cross * solved[..., 1]).sum(-1), 0.0)
        return mean, var, solved[..., 1]

    def prior_covariance(self, lonlat: np.ndarray, ref_lonlat: np.ndarray) -> np.ndarray:
        """k_local between the tiles of ``lonlat`` (n, 2) and ``ref_lonlat`` (k, 2) degrees at one
        time, (n, k), in (log10 units)^2 (the local part of a kernel slice)."""
        a = self.projection.to_metres(tile_centres(np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)))
        b = self.projection.to_metres(tile_centres(np.asarray(ref_lonlat, dtype=np.float64).reshape(-1, 2)))
        distance = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
        return self.kernel(distance, np.zeros_like(distance))

    def change_variance(self, lonlat: np.ndarray, years_from: np.ndarray, years_to: np.ndarray) -> np.ndarray:
        """Error variance (n,) of the kriged change at ``lonlat`` (n, 2) degrees between
        ``years_from`` and ``years_to`` (n,): Var[(r_b - z_b^T y_b) - (r_a - z_a^T y_a)], with
        r_a = r(x, t_from), r_b = r(x, t_to), y_a, y_b the noisy residuals of each time's own
        nearest rows and z_a, z_b their kriging weights (so the kriged change is the
        difference of :meth:`condition` at the two times, and this is its exact error variance).

        It is ``v_a + v_b - 2 c_ab`` with v the two conditional variances and
        ``c_ab = k(r_a, r_b) - z_a^T k(y_a, r_b) - z_b^T k(y_b, r_a) + z_a^T Cov(y_a, y_b) z_b``,
        Cov(y_a, y_b) the kernel between the two neighbourhoods plus the noise of the rows they
        share. With one shared neighbourhood it is the joint conditioning of the pair,
        2 (k(0, 0) - k(0, dt)) - d^T A^{-1} d with d = k_to - k_from.
        """
        n = len(lonlat)
        years_from = np.broadcast_to(np.asarray(years_from, dtype=np.float64), (n,))
        years_to = np.broadcast_to(np.asarray(years_to, dtype=np.float64), (n,))
        kernel = self.kernel
        var = np.empty(n)
        for start in range(0, n, _CHUNK):
            rows = slice(start, start + _CHUNK)
            geometry_a = self._geometry(lonlat[rows], years_from[rows])
            geometry_b = self._geometry(lonlat[rows], years_to[rows])
            _, var_a, z_a = self._solve(geometry_a, kernel)
            _, var_b, z_b = self._solve(geometry_b, kernel)
            (index_a, distance_a, lag_a), (index_b, distance_b, lag_b) = geometry_a[:3], geometry_b[:3]
            step = (years_to[rows] - years_from[rows])[:, None]
            # k(y_a, r_b) and k(y_b, r_a): the lags are from each neighbourhood's rows to the other time
            cross = (z_a * kernel(distance_a, lag_a + step)).sum(-1) + (z_b * kernel(distance_b, lag_b - step)).sum(-1)
            between = np.sqrt(((self.xy_m[index_a][:, :, None, :] - self.xy_m[index_b][:, None, :, :]) ** 2).sum(-1))
            shared = index_a[:, :, None] == index_b[:, None, :]
            noise = self._row_noise(index_a, kernel)[:, :, None]
            lag_ab = self.years[index_a][:, :, None] - self.years[index_b][:, None, :]
            covariance = kernel(between, lag_ab) + shared * noise
            together = kernel(np.zeros(len(step)), step[:, 0]) - cross + np.einsum("nm,nmk,nk->n", z_a, covariance, z_b)
            var[rows] = np.maximum(var_a + var_b - 2.0 * together, 0.0)
        return var

    def area_condition(
        self, lonlat: np.ndarray, years: np.ndarray, weights: np.ndarray, groups: np.ndarray, n_groups: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Kriged residuals (n,) and their conditional variances (n,) at ``lonlat`` (n, 2) degrees
        and ``years`` (n,) (as :meth:`condition` gives them), and the conditional variance of
        sum_{i in g} w_i r_i for each group g, (n_groups,).

        Each point is conditioned on its own m neighbours, as in :meth:`condition`. The
        conditional covariance of two points i, j is taken from i's neighbourhood,
        ``c_ij = k(x_i, x_j) - z_i^T k(N_i, x_j)`` with z_i = A_i^{-1} k(N_i, x_i) the kriging
        weights, averaged with j's: exact when both neighbourhoods hold every training row, the
        same tile's points fully correlated, and the variance of each point its own conditional
        variance v_i. Summed over a group's pairs this is

            sum_ij w_i w_j c_ij = w^T K w - sum_i w_i z_i^T F(N_i),   F(y) = sum_j w_j k(y, x_j),

        one kernel value per pair of points and per (training neighbour, point) pair, where the
        pairwise form took 2m + 1 per pair of points (16 times the time; all US counties at 1 km
        did not finish in an hour). Pairs farther apart than :data:`AREA_CUTOFF_RANGES` ranges are
        left out. ``weights`` (n,), ``groups`` (n,) integers in [0, n_groups).
        """
        lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
        years = np.broadcast_to(np.asarray(years, dtype=np.float64), (len(lonlat),))
        shift, var = np.empty(len(lonlat)), np.empty(len(lonlat))
        index, kriging = np.empty((len(lonlat), self.neighbours), np.int64), np.empty((len(lonlat), self.neighbours))
        for start in range(0, len(lonlat), _CHUNK):
            rows = slice(start, start + _CHUNK)
            geometry = self._geometry(lonlat[rows], years[rows])
            shift[rows], var[rows], kriging[rows] = self._solve(geometry, self.kernel)
            index[rows] = geometry[0]
        xy = self.projection.to_metres(tile_centres(lonlat))
        w, groups = np.asarray(weights, np.float64), np.asarray(groups, dtype=np.int64)
        out = np.zeros(n_groups)
        cutoff = AREA_CUTOFF_RANGES * self.kernel.range_m
        for g in np.unique(groups):
            members = np.flatnonzero(groups == g)
            group = (cKDTree(xy[members]), years[members], w[members], cutoff)
            training = np.unique(index[members])
            at_training = self._weighted_field(*group, self.xy_m[training], self.years[training])
            explained = (kriging[members] * at_training[np.searchsorted(training, index[members])]).sum(-1)
            prior = self._weighted_field(*group, xy[members], years[members])  # w^T K w = sum_i w_i F(x_i)
            out[g] = float((w[members] * (prior - explained)).sum())
        return shift, var, np.maximum(out, 0.0)

    def _weighted_field(
        self, tree: cKDTree, years: np.ndarray, w: np.ndarray, cutoff: float, at: np.ndarray, at_years: np.ndarray
    ) -> np.ndarray:
        """F(y) = sum_j w_j k(y, x_j) over a group's points (``tree`` over their tile centres in
        metres, ``years`` (n,), weights ``w`` (n,)) within ``cutoff`` metres of each query ``at``
        (q, 2) metres at ``at_years`` (q,): (q,). Queries go in blocks, so memory stays bounded."""
        field = np.zeros(len(at))
        for start in range(0, len(at), _QUERY_BLOCK):
            rows = slice(start, start + _QUERY_BLOCK)
            pairs = cKDTree(at[rows]).sparse_distance_matrix(tree, cutoff, output_type="ndarray")
            q, j = pairs["i"], pairs["j"]
            values = w[j] * self.kernel(pairs["v"], years[j] - at_years[rows][q])
            field[rows] = np.bincount(q, weights=values, minlength=len(at_years[rows]))
        return field

    @classmethod
    def fit(
        cls,
        train_lonlat: np.ndarray,
        train_years: np.ndarray,
        train_residual: np.ndarray,
        train_var: np.ndarray,
        val_lonlat: np.ndarray,
        val_years: np.ndarray,
        val_residual: np.ndarray,
        val_var: np.ndarray,
        *,
        train_test_var: np.ndarray | None = None,
        val_test_var: np.ndarray | None = None,
        val_areas: AreaGroups | None = None,
        neighbours: int = NEIGHBOURS,
        seed: int = 0,
    ) -> ResidualField:
        """Choose the kernel by the validation NLL of ``mu_GP + kriged residual`` under
        ``N(., s var_GP + s_t test_var + conditional var)``, plus, with ``val_areas``, the NLL of
        those areas' mean residuals under their joint variance (as
        :meth:`area_condition` gives it); then the forecast variance rate
        (:meth:`_pseudo_forecast_rate`) on all validation rows of the last training quarter;
        then the local volatility (:meth:`LocalVolatility.fit
        <geodbk.fit.volatility.LocalVolatility.fit>`) from the training rows'
        :meth:`leave_one_out` errors, on up to :data:`~geodbk.fit.volatility.FIT_ROWS` validation rows.

        Tiles alone cannot tell how much of the local variance neighbouring tiles share: with
        the 3 km coordinate jitter, the tile NLL chose a local part twice as large and twice as
        long-ranged, and PR's area sds came out too wide (test 2 km squares z sd 0.80).

        Args:
            train_*: the training rows' tile centres (n, 2) degrees, decimal years (n,), residuals
                y - mu_GP (n,) and the GP's tile-mean variances (n,), log10 units.
            val_*: the same for validation rows (at most :data:`FIT_ROWS` are used for the tile
                NLL).
            train_test_var, val_test_var: the GP's test-count noise sigma1^2 / tests of those
                rows (default zeros: ``*_var`` is then the whole measurement variance).
            val_areas: areas of validation rows
                (:func:`~geodbk.fit.validation_areas.square_areas`) and their GP variance.
        """
        projection = ProjectedTransform.from_lonlat(train_lonlat)
        field = cls(
            LocalKernel(), projection, projection.to_metres(train_lonlat), np.asarray(train_years, np.float64),
            np.asarray(train_residual, np.float64), np.asarray(train_var, np.float64), neighbours,
            test_var=None if train_test_var is None else np.asarray(train_test_var, np.float64),
        )
        val_test_var = np.zeros(len(val_residual)) if val_test_var is None else np.asarray(val_test_var, np.float64)
        pick = np.random.default_rng(seed).permutation(len(val_residual))[:FIT_ROWS]
        lonlat, years = np.asarray(val_lonlat)[pick], np.asarray(val_years, np.float64)[pick]
        residual, var, test_var = np.asarray(val_residual)[pick], np.asarray(val_var)[pick], val_test_var[pick]
        geometry = field._geometry(lonlat, years)

        area_nll = None if val_areas is None else field._area_nll(
            val_areas, np.asarray(val_lonlat, np.float64), np.asarray(val_years, np.float64),
            np.asarray(val_residual, np.float64), val_test_var,
        )

        def criterion(vector: np.ndarray) -> float:
            kernel = LocalKernel.from_vector(vector)
            mean, cond, _ = field._solve(geometry, kernel)
            total = kernel.combine(var, cond, test_var)
            tiles = nll(residual, Prediction(mean, np.sqrt(total)))
            return tiles if area_nll is None else tiles + area_nll(kernel)

        bounds = [(np.log(low), np.log(high)) for low, high in _BOUNDS]
        best = minimize(
            criterion, LocalKernel().to_vector(), method="L-BFGS-B", bounds=bounds, options={"maxiter": FIT_ITERATIONS}
        )
        field.kernel = LocalKernel.from_vector(best.x)
        field.horizon_rate = field._pseudo_forecast_rate(
            np.asarray(val_lonlat, np.float64), np.asarray(val_years, np.float64),
            np.asarray(val_residual, np.float64), np.asarray(val_var, np.float64), val_test_var,
        )
        error, error_var = field.leave_one_out()
        pick = np.random.default_rng(seed).permutation(len(val_residual))[:VOLATILITY_FIT_ROWS]
        lonlat, years = np.asarray(val_lonlat, np.float64)[pick], np.asarray(val_years, np.float64)[pick]
        kriged, conditional = field.condition(lonlat, years)
        field.volatility = LocalVolatility.fit(
            projection, field.xy_m, error**2 / error_var, lonlat, np.asarray(val_residual, np.float64)[pick] - kriged,
            field.kernel.combine(np.asarray(val_var, np.float64)[pick], conditional, val_test_var[pick]),
        )
        return field

    def _area_nll(
        self, areas: AreaGroups, lonlat: np.ndarray, years: np.ndarray, residual: np.ndarray, test_var: np.ndarray
    ) -> Callable[[LocalKernel], float]:
        """The NLL of the areas' mean residuals as a function of the local kernel: their kriged
        mean and ``s gp_var + local + s_t sum_i w_i^2 test_var_i`` with ``local`` the sum of
        each pair's conditional covariance, as in :meth:`area_condition`. The geometry of every
        ordered pair of rows in an area (and of one's neighbours to the other) is set up once.
        ``lonlat`` (n, 2), ``years``, ``residual``, ``test_var`` (n,): the validation rows."""
        unique, member = np.unique(areas.rows, return_inverse=True)
        member = member.reshape(-1)
        geometry = self._geometry(lonlat[unique], years[unique])
        neighbours = geometry[0]
        xy = self.projection.to_metres(tile_centres(lonlat[unique]))
        order = np.argsort(areas.groups, kind="stable")
        starts = np.searchsorted(areas.groups[order], np.arange(areas.n_areas + 1))
        first, second = [], []
        for g in range(areas.n_areas):
            inside = order[starts[g]:starts[g + 1]]
            first.append(np.repeat(inside, len(inside)))
            second.append(np.tile(inside, len(inside)))
        a, b = member[np.concatenate(first)], member[np.concatenate(second)]
        pair_group = areas.groups[np.concatenate(first)]
        distance = np.sqrt(((xy[a] - xy[b]) ** 2).sum(-1))
        lag = years[unique][a] - years[unique][b]
        to_other = np.sqrt(((self.xy_m[neighbours[a]] - xy[b][:, None, :]) ** 2).sum(-1))  # (pairs, m)
        to_other_lag = self.years[neighbours[a]] - years[unique][b][:, None]
        size = np.bincount(areas.groups, minlength=areas.n_areas).astype(np.float64)
        w = 1.0 / size[areas.groups]
        pair_w = 1.0 / size[pair_group] ** 2
        observed = np.bincount(areas.groups, weights=w * residual[areas.rows], minlength=areas.n_areas)
        noise = np.bincount(areas.groups, weights=w**2 * test_var[areas.rows], minlength=areas.n_areas)

        def area_criterion(kernel: LocalKernel) -> float:
            mean, _, kriging = self._solve(geometry, kernel)
            covariance = kernel(distance, lag) - (kriging[a] * kernel(to_other, to_other_lag)).sum(-1)
            local = np.maximum(np.bincount(pair_group, weights=pair_w * covariance, minlength=areas.n_areas), 0.0)
            area_mean = np.bincount(areas.groups, weights=w * mean[member], minlength=areas.n_areas)
            var = kernel.combine(areas.gp_var, local, noise)
            return nll(observed, Prediction(area_mean, np.sqrt(var)))

        return area_criterion

    def _pseudo_forecast_rate(
        self, lonlat: np.ndarray, years: np.ndarray, residual: np.ndarray, gp_var: np.ndarray, test_var: np.ndarray
    ) -> float:
        """:attr:`horizon_rate`, from a forecast of the last training quarter's validation rows by
        the field conditioned on the earlier quarters only.

        The relative excess kappa >= 0 of those rows' variance over the field's own prediction
        (``N(r - kriged; 0, (1 + kappa)(s gp_var + s_t test_var + conditional var))``, maximum likelihood) is what
        a quarter ahead adds beyond the local kernel's time decay (a level change the GP's trend
        does not foresee); divided by the gap between the last two training quarters it is the
        rate per year. A relative excess, not an additive one: on HI's forecast split
        (validation-chosen, scored on the test quarter) it widens rural tiles, whose variance is
        larger, more than urban ones, and 95% coverage is 95.7% urban / 94.3% rural (additive:
        94.7% / 92.8%, no widening: 92.4% / 90.8%). Zero with one training quarter or fewer than
        :data:`MIN_FORECAST_ROWS` such rows.
        """
        times = np.unique(self.years)
        last_rows = np.abs(years - times[-1]) < 1e-6
        if len(times) < 2 or last_rows.sum() < MIN_FORECAST_ROWS:
            return 0.0
        earlier = self.years < times[-1] - 1e-6
        assert self.test_var is not None  # set by __post_init__
        past = ResidualField(self.kernel, self.projection, self.xy_m[earlier], self.years[earlier],
                             self.residual[earlier], self.noise_var[earlier], self.neighbours,
                             test_var=self.test_var[earlier], metres_per_year=self.metres_per_year)
        kriged, conditional = past.condition(lonlat[last_rows], years[last_rows])
        error = residual[last_rows] - kriged
        total = self.kernel.combine(gp_var[last_rows], conditional, test_var[last_rows])

        def criterion(kappa: float) -> float:
            return nll(error, Prediction(np.zeros_like(error), np.sqrt((1.0 + kappa) * total)))

        kappa = minimize_scalar(criterion, bounds=(0.0, 10.0), method="bounded").x
        return float(kappa) / float(times[-1] - times[-2])

    def to_payload(self) -> dict[str, Any]:
        """Torch-saveable dict (tensors and plain values)."""
        return {
            "kernel": asdict(self.kernel),
            "projection": self.projection.to_dict(),
            "neighbours": self.neighbours,
            "horizon_rate": self.horizon_rate,
            "metres_per_year": self.metres_per_year,
            "volatility": None if self.volatility is None else self.volatility.to_payload(),
            **{
                name: torch.tensor(np.array(getattr(self, name)))
                for name in ("xy_m", "years", "residual", "noise_var", "test_var")
            },
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> ResidualField:
        xy_m, years, residual, noise_var = (
            payload[name].cpu().numpy() for name in ("xy_m", "years", "residual", "noise_var")
        )
        test_var = payload["test_var"].cpu().numpy() if "test_var" in payload else None
        volatility = payload.get("volatility")  # None for fields saved before it
        # a field saved before the test-count scale: its noise_var is the whole measurement variance
        kernel = {"test_noise_scale": payload["kernel"]["variance_scale"], **payload["kernel"]}
        return cls(
            LocalKernel(**kernel),
            ProjectedTransform.from_dict(payload["projection"]),
            xy_m, years, residual, noise_var,
            test_var=test_var,
            neighbours=int(payload["neighbours"]),
            horizon_rate=float(payload.get("horizon_rate", 0.0)),
            metres_per_year=float(payload.get("metres_per_year", 0.0)),  # older fields chose by distance
            volatility=None if volatility is None else LocalVolatility.from_payload(volatility),
        )
