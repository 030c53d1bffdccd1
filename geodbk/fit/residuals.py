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

A row's residual also carries its test count: the log of a mean of k skewed speeds rises with
k, so one-test rows sit below busier rows of the same place (the slope a new measurement's
family shifts by, :mod:`geodbk.fit.tails`). Kriged as they are, the residuals of a
neighbourhood of mostly one-test rows would pull its tiles down. So the field first takes out
the training residuals' least-squares slope in 1/tests about their mean 1/tests,
r - b (1/k - c) (:attr:`ResidualField.tests_slope`), from the training and validation rows
alike, and spreads tile means at the training rows' mean test count. On the six crops under
7k rows of ``benchmarks/bench_regions.py`` this lowered dbk-rbf's NLL at known places by
0.005 on nested validation rows and 0.008 on test rows (docs/small-regions.md, 2026-11-28).

Queries are snapped to the centre of their zoom-16 tile, so a map cell takes its tile's
value. Places far from any training tile get no correction and a larger variance.

This module is the predictor: :class:`ResidualField` conditions on its rows at points, leaves
each training row out, and gives change variances, given its kernel. Beside it: the
kernel and the batched kriging solve (:mod:`geodbk.fit.local_kernel`); the choice of the
hyperparameters on validation rows (:mod:`geodbk.fit.residual_choice`, with the kernel's
criterion in :mod:`geodbk.fit.kernel_search`); the variance of an area's mean
(:mod:`geodbk.fit.area_variance`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy.spatial import cKDTree

from geodbk.blocks import blocks
from geodbk.dataset.coords import ProjectedTransform
from geodbk.fit.area_variance import grouped_local_variance
from geodbk.fit.local_kernel import LocalKernel, Neighbourhoods, krige, planar_distance
from geodbk.fit.residual_choice import ValidationRows, choose_kernel, choose_volatility, pseudo_forecast_rate
from geodbk.fit.tails import mean_inverse_tests, tests_term
from geodbk.fit.validation_areas import AreaGroups
from geodbk.fit.volatility import LocalVolatility
from geodbk.ingest.quadkey import tile_centres

#: Training rows each prediction is conditioned on.
NEIGHBOURS = 16
#: Rows per batched solve (bounds the (rows, m, m) temporaries to about 30 MB).
_CHUNK = 16384
#: How many metres one year apart counts as when neighbours are chosen (space-time nearest
#: rows). Validation and test NLL of dbk-rbf, one fit each, against choosing by distance alone
#: (ties broken arbitrarily): HI random -0.014 / -0.009, PR random -0.010 / -0.009, PR
#: spatial-block -0.001 / -0.002, HI spatial-block -0.001 / -0.002, forecast -0.005 to -0.009 /
#: +0.001 to +0.002 (the forecast split's validation rows are inside the training quarters).
#: On the random splits' validation rows, 500 m was 0.002 better on PR and 0.001 worse on HI;
#: 100 and 1,000 m were worse on both, 2,000 m on HI.
NEIGHBOUR_METRES_PER_YEAR = 250.0


def fit_tests_slope(residual: np.ndarray, tests: np.ndarray) -> tuple[float, float]:
    """(b, c): the least-squares slope b of ``residual`` (n,) on 1/tests - c for rows of ``tests``
    (n,) tests, with c their mean 1/tests; b = 0 when every row has the same count."""
    centre = mean_inverse_tests(tests)
    if np.ptp(np.asarray(tests, dtype=np.float64)) == 0:  # 1/tests - c is rounding noise, not a regressor
        return 0.0, centre
    term = tests_term(tests, centre)
    return float(np.sum(term * np.asarray(residual, np.float64)) / np.sum(term * term)), centre


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
            training time (see :meth:`horizon_factor` and
            :func:`~geodbk.fit.residual_choice.pseudo_forecast_rate`).
        test_var: (n,) the GP's test-count noise sigma1^2 / tests at the training rows (their
            measurement variance is ``noise_var + test_var``); zeros for fields saved before it
            existed, whose ``noise_var`` is the whole measurement variance.
        metres_per_year: how far, in metres, a year between a query and a training row counts
            when the nearest rows are chosen (0: by distance alone, as fields saved before it).
        volatility: the local variance factor V(x) (:mod:`geodbk.fit.volatility`), or ``None``
            (V = 1, as fields saved before it).
        tests_slope: b, log10 units per unit of 1/tests, taken out of every row's residual
            before kriging (:meth:`adjusted`); 0 for fields saved before it.
        tests_centre: c, the training rows' mean 1/tests, where the slope takes nothing out.
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
    tests_slope: float = 0.0
    tests_centre: float = 0.0

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
        if len(xy) == 0:  # no queries (a tiny validation set may hold no area): scipy cannot reshape its answer
            return np.zeros((0, k)), np.zeros((0, k), np.int64)
        _, index = self._tree.query(np.column_stack([xy, self.metres_per_year * years]), k=k)
        index = index.reshape(len(xy), -1)
        return planar_distance(self.xy_m[index], xy[:, None, :]), index

    def condition(self, lonlat: np.ndarray, years: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Kriged residual and its conditional variance k(x,x) - k_m^T A^{-1} k_m, (n,), at
        ``lonlat`` (n, 2) degrees and ``years`` (n,) (or one time for all)."""
        years = np.broadcast_to(np.asarray(years, dtype=np.float64), (len(lonlat),))
        mean, var = np.empty(len(lonlat)), np.empty(len(lonlat))
        for rows in blocks(len(lonlat), _CHUNK):
            mean[rows], var[rows], _ = self._solve(self.neighbourhoods(lonlat[rows], years[rows]), self.kernel)
        return mean, var

    def adjusted(self, residual: np.ndarray, tests: np.ndarray) -> np.ndarray:
        """Residuals y - mu_GP (n,) of rows of ``tests`` (n,) tests as the field holds them:
        ``residual - tests_slope (1 / tests - tests_centre)``."""
        return np.asarray(residual, np.float64) - self.tests_slope * tests_term(tests, self.tests_centre)

    def with_rows(
        self, lonlat: np.ndarray, years: np.ndarray, residual: np.ndarray, noise_var: np.ndarray,
        test_var: np.ndarray, tests: np.ndarray,
    ) -> ResidualField:
        """A new field conditioned on these rows too, with the same kernel, forecast rate,
        volatility and test-count slope: what :meth:`fit` builds from training rows, given the new
        rows' tile centres (n, 2) degrees, years (n,), residuals y - mu_GP, tile-mean and
        test-count variances and test counts (n,)."""
        assert self.test_var is not None  # set by __post_init__
        residual = self.adjusted(residual, tests)
        xy = self.projection.to_metres(tile_centres(np.asarray(lonlat, np.float64).reshape(-1, 2)))

        def joined(old: np.ndarray, new: np.ndarray) -> np.ndarray:
            return np.concatenate([old, np.asarray(new, np.float64).reshape(-1)])

        return ResidualField(
            self.kernel, self.projection, np.concatenate([self.xy_m, xy]), joined(self.years, years),
            joined(self.residual, residual), joined(self.noise_var, noise_var),
            NEIGHBOURS if self.neighbours == len(self.residual) else self.neighbours,
            self.horizon_rate, joined(self.test_var, test_var), self.metres_per_year, self.volatility,
            self.tests_slope, self.tests_centre,
        )

    def on_rows(self, keep: np.ndarray) -> ResidualField:
        """A new field conditioned on the training rows ``keep`` only (a boolean mask (n,) or row
        numbers), with the same kernel, neighbours, forecast rate and volatility."""
        assert self.test_var is not None  # set by __post_init__
        return ResidualField(
            self.kernel, self.projection, self.xy_m[keep], self.years[keep], self.residual[keep],
            self.noise_var[keep], self.neighbours, self.horizon_rate, self.test_var[keep], self.metres_per_year,
            self.volatility, self.tests_slope, self.tests_centre,
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
        for block in blocks(n, _CHUNK):
            rows = np.arange(block.start, block.stop)
            distance, found = self._nearest(self.xy_m[rows], self.years[rows], k)
            own = found == rows[:, None]  # the row itself, unless a tie pushed it out: then drop the last
            keep = np.where(own.any(1)[:, None], ~own, np.arange(k)[None, :] < k - 1)
            hoods = Neighbourhoods.around(self.xy_m, self.years, distance[keep].reshape(len(rows), k - 1),
                                          found[keep].reshape(len(rows), k - 1), self.years[rows])
            kriged, conditional, _ = self._solve(hoods, self.kernel)
            error[rows] = self.residual[rows] - kriged
            var[rows] = conditional + self._row_noise(rows, self.kernel)
        return error, var

    def neighbourhoods(self, lonlat: np.ndarray, years: np.ndarray) -> Neighbourhoods:
        """The :class:`~geodbk.fit.local_kernel.Neighbourhoods` of the tiles of ``lonlat`` (n, 2)
        degrees at ``years`` (n,): their m nearest training rows in space and time."""
        distance, index = self._neighbourhoods(lonlat, years)
        return Neighbourhoods.around(self.xy_m, self.years, distance, index, years)

    def _row_noise(self, index: np.ndarray, kernel: LocalKernel) -> np.ndarray:
        """The noise of training rows ``index`` (any shape): their rescaled GP variances
        ``s noise_var + s_t test_var``."""
        assert self.test_var is not None  # set by __post_init__
        return np.asarray(kernel.combine(self.noise_var[index], 0.0, self.test_var[index]))

    def _solve(self, hoods: Neighbourhoods, kernel: LocalKernel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Kriged mean and conditional variance at the queries, (n,), and the kriging weights
        A^{-1} k_m, (n, m) (:func:`~geodbk.fit.local_kernel.krige` of this field's rows)."""
        with torch.no_grad():
            solved = krige(kernel, hoods, torch.as_tensor(self.residual[hoods.index]),
                           torch.as_tensor(self._row_noise(hoods.index, kernel)))
        mean, var, weights = (t.numpy() for t in solved)
        return mean, var, weights

    def prior_covariance(self, lonlat: np.ndarray, ref_lonlat: np.ndarray) -> np.ndarray:
        """k_local between the tiles of ``lonlat`` (n, 2) and ``ref_lonlat`` (k, 2) degrees at one
        time, (n, k), in (log10 units)^2 (the local part of a kernel slice)."""
        a = self.projection.to_metres(tile_centres(np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)))
        b = self.projection.to_metres(tile_centres(np.asarray(ref_lonlat, dtype=np.float64).reshape(-1, 2)))
        distance = planar_distance(a[:, None, :], b[None, :, :])
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
        for rows in blocks(n, _CHUNK):
            hoods_a = self.neighbourhoods(lonlat[rows], years_from[rows])
            hoods_b = self.neighbourhoods(lonlat[rows], years_to[rows])
            _, var_a, z_a = self._solve(hoods_a, kernel)
            _, var_b, z_b = self._solve(hoods_b, kernel)
            index_a, distance_a, lag_a = hoods_a.index, hoods_a.distance, hoods_a.lag
            index_b, distance_b, lag_b = hoods_b.index, hoods_b.distance, hoods_b.lag
            step = (years_to[rows] - years_from[rows])[:, None]
            # k(y_a, r_b) and k(y_b, r_a): the lags are from each neighbourhood's rows to the other time
            cross = (z_a * kernel(distance_a, lag_a + step)).sum(-1) + (z_b * kernel(distance_b, lag_b - step)).sum(-1)
            between = planar_distance(self.xy_m[index_a][:, :, None, :], self.xy_m[index_b][:, None, :, :])
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
        sum_{i in g} w_i r_i for each group g, (n_groups,), in (log10 units)^2
        (:func:`~geodbk.fit.area_variance.grouped_local_variance`). ``weights`` (n,), ``groups``
        (n,) integers in [0, n_groups). Each point is conditioned on its own m neighbours, as in
        :meth:`condition`.
        """
        lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
        years = np.broadcast_to(np.asarray(years, dtype=np.float64), (len(lonlat),))
        shift, var = np.empty(len(lonlat)), np.empty(len(lonlat))
        index, kriging = np.empty((len(lonlat), self.neighbours), np.int64), np.empty((len(lonlat), self.neighbours))
        for rows in blocks(len(lonlat), _CHUNK):
            hoods = self.neighbourhoods(lonlat[rows], years[rows])
            shift[rows], var[rows], kriging[rows] = self._solve(hoods, self.kernel)
            index[rows] = hoods.index
        local = grouped_local_variance(
            self.kernel, self.projection.to_metres(tile_centres(lonlat)), years, weights, groups, n_groups,
            neighbours=index, kriging=kriging, train_xy=self.xy_m, train_years=self.years,
        )
        return shift, var, local

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
        train_tests: np.ndarray | None = None,
        val_tests: np.ndarray | None = None,
        val_areas: AreaGroups | None = None,
        neighbours: int = NEIGHBOURS,
        seed: int = 0,
    ) -> ResidualField:
        """A field conditioned on the training rows, its hyperparameters chosen on the validation
        rows (:mod:`geodbk.fit.residual_choice`): the kernel by the validation NLL of tiles and,
        with ``val_areas``, of areas (:func:`~geodbk.fit.residual_choice.choose_kernel`); then the
        forecast variance rate (:func:`~geodbk.fit.residual_choice.pseudo_forecast_rate`); then
        the local volatility (:func:`~geodbk.fit.residual_choice.choose_volatility`).

        Args:
            train_*: the training rows' tile centres (n, 2) degrees, decimal years (n,), residuals
                y - mu_GP (n,) and the GP's tile-mean variances (n,), log10 units.
            val_*: the same for validation rows (at most
                :data:`~geodbk.fit.residual_choice.FIT_ROWS` are used for the tile NLL).
            train_test_var, val_test_var: the GP's test-count noise sigma1^2 / tests of those
                rows (default zeros: ``*_var`` is then the whole measurement variance).
            train_tests, val_tests: the rows' test counts (n,), both or neither: the training
                residuals' slope in 1/tests (:func:`fit_tests_slope`) is taken out of both sets'
                residuals (:meth:`adjusted`); without them, none is.
            val_areas: areas of validation rows
                (:func:`~geodbk.fit.validation_areas.square_areas`) and their GP variance.
            neighbours: m, training rows per prediction.
            seed: of the random subsets of validation rows.
        """
        if (train_tests is None) != (val_tests is None):
            raise ValueError("give the test counts of both the training and the validation rows, or of neither")
        slope, centre = (0.0, 0.0) if train_tests is None else fit_tests_slope(train_residual, train_tests)
        projection = ProjectedTransform.from_lonlat(train_lonlat)
        field = cls(
            LocalKernel(), projection, projection.to_metres(train_lonlat), np.asarray(train_years, np.float64),
            np.asarray(train_residual, np.float64), np.asarray(train_var, np.float64), neighbours,
            test_var=None if train_test_var is None else np.asarray(train_test_var, np.float64),
            tests_slope=slope, tests_centre=centre,
        )
        if train_tests is not None and val_tests is not None:
            field.residual = field.adjusted(field.residual, train_tests)
            val_residual = field.adjusted(val_residual, val_tests)
        val = ValidationRows.of(val_lonlat, val_years, val_residual, val_var, val_test_var)
        field.kernel = choose_kernel(field, val, val_areas, seed)
        field.horizon_rate = pseudo_forecast_rate(field, val)
        field.volatility = choose_volatility(field, val, seed)
        return field

    def to_payload(self) -> dict[str, Any]:
        """Torch-saveable dict (tensors and plain values)."""
        return {
            "kernel": asdict(self.kernel),
            "projection": self.projection.to_dict(),
            "neighbours": self.neighbours,
            "horizon_rate": self.horizon_rate,
            "metres_per_year": self.metres_per_year,
            "volatility": None if self.volatility is None else self.volatility.to_payload(),
            "tests_slope": self.tests_slope,
            "tests_centre": self.tests_centre,
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
            tests_slope=float(payload.get("tests_slope", 0.0)),  # fields saved before it took none out
            tests_centre=float(payload.get("tests_centre", 0.0)),
        )
