"""The map model's joint distribution at a finite set of sites: :class:`MapPosterior`.

Sites are whatever a decision is about: tiles, grid cells, hexagon means, or the same places at
two quarters. At n sites and T targets (``("download",)`` or ``("download", "upload")``, log10
units) the latent values f (n, T) are Gaussian with mean ``mean`` and covariance

    Cov(f) = F F^T + S - G G^T

on the flat index ``site * T + target``: F (n T, k) the long-range low-rank part, S a sparse
symmetric PSD matrix (each site's own T x T block beyond F and the short-range covariance of
nearby sites), and G (n T, m) what conditioning on observations removed. No (n T) x (n T) matrix
is formed except by :meth:`MapPosterior.dense_covariance`, so a map of 10^4 to 10^5 sites costs
O(n T (k + m)) memory.

Beside the distribution it keeps the measurement likelihood, as GPyTorch keeps a likelihood
beside a model: an observation of K tests at site j is y_j = f_j + e with Cov(e) =
``nugget[j] + per_test[j] / K`` (the tile-quarter noise, which more tests do not shrink, and the
tests' own noise), independent between observations.

Torch-free (numpy and scipy.sparse), so that planners and summaries run without the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
from scipy import linalg, sparse
from scipy.special import ndtr

from geodbk.errors import InputDataError
from geodbk.prediction import probability_both_above

#: Largest n T for which :meth:`MapPosterior.dense_covariance` forms the dense matrix (3.2 GB).
DENSE_LIMIT = 20_000


def meets_probability(mean: np.ndarray, covariance: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """P(f_t >= levels[t] for every target t) for f ~ N(mean, covariance), elementwise.

    Args:
        mean: (..., T) means, log10 units, T = 1 or 2.
        covariance: (..., T, T) covariances, broadcastable against ``mean``.
        levels: T levels in the same units.

    Returns:
        (...) probabilities: ``ndtr`` for T = 1, :func:`~geodbk.prediction.probability_both_above`
        for T = 2.
    """
    mean, covariance = np.asarray(mean, dtype=np.float64), np.asarray(covariance, dtype=np.float64)
    n_targets = mean.shape[-1]
    if len(levels) != n_targets or n_targets not in (1, 2):
        raise InputDataError(f"levels must give one level per target (1 or 2), got {len(levels)} for {n_targets}")
    sd = np.sqrt(np.maximum(np.diagonal(covariance, axis1=-2, axis2=-1), 0.0))
    if n_targets == 1:
        return ndtr((mean[..., 0] - levels[0]) / sd[..., 0])
    scale = sd[..., 0] * sd[..., 1]
    correlation = np.divide(covariance[..., 0, 1], scale, out=np.zeros(np.shape(scale)), where=scale > 0.0)
    return probability_both_above(mean[..., 0], sd[..., 0], mean[..., 1], sd[..., 1], correlation, *levels)


def _indices(values: np.ndarray, upper: int, name: str) -> np.ndarray:
    """``values`` as a 1-D int64 array of positions in [0, upper), or a one-line InputDataError."""
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise InputDataError(f"{name} must be a 1-D array of integer positions, got shape {array.shape}")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() >= upper):
        raise InputDataError(f"{name} must lie in [0, {upper}), got [{array.min()}, {array.max()}]")
    return array


def _blocks(values: np.ndarray, n: int, n_targets: int, name: str) -> np.ndarray:
    """``values`` checked to be (n, T, T) finite covariance blocks, as float64."""
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (n, n_targets, n_targets) or not np.isfinite(array).all():
        raise InputDataError(f"{name} must be finite and shaped {(n, n_targets, n_targets)}, got {array.shape}")
    return array


@dataclass(frozen=True, kw_only=True)
class MapPosterior:
    """A finite joint Gaussian over n sites x T targets, with the measurement likelihood beside it.

    Attributes:
        targets: the T target names, e.g. ``("download", "upload")``.
        mean: (n, T) posterior mean, log10 units (NaN for a site with no data, such as an empty group).
        factor: (n, T, k) the long-range low-rank part F: Cov_lr = F F^T with F read as (n T, k).
        local: (n T, n T) sparse symmetric PSD S: each site's own T x T block beyond F and the
            short-range covariance between nearby sites.
        downdate: (n, T, m) G, what conditioning removed (default none, m = 0).
        nugget: (n, T, T) covariance of a new observation's tile-quarter noise at each site.
        per_test: (n, T, T) covariance of one test's noise; K tests average to ``per_test / K``.

    All covariances are in (log10 units)^2.
    """

    targets: tuple[str, ...]
    mean: np.ndarray
    factor: np.ndarray
    local: sparse.csr_matrix
    downdate: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    nugget: np.ndarray
    per_test: np.ndarray

    def __post_init__(self) -> None:
        targets = tuple(self.targets)
        if not targets or not all(isinstance(name, str) for name in targets):
            raise InputDataError(f"targets must be a non-empty tuple of names, got {self.targets!r}")
        mean = np.asarray(self.mean, dtype=np.float64)
        if mean.ndim != 2 or mean.shape[1] != len(targets):
            raise InputDataError(f"mean must be shaped (n, {len(targets)}), got {mean.shape}")
        n, n_targets = mean.shape
        factor = np.asarray(self.factor, dtype=np.float64)
        downdate = np.asarray(self.downdate, dtype=np.float64)
        if downdate.size == 0:
            downdate = np.zeros((n, n_targets, 0))
        for name, array in (("factor", factor), ("downdate", downdate)):
            if array.ndim != 3 or array.shape[:2] != (n, n_targets) or not np.isfinite(array).all():
                raise InputDataError(f"{name} must be finite and shaped ({n}, {n_targets}, k), got {array.shape}")
        if not sparse.issparse(self.local) or self.local.shape != (n * n_targets,) * 2:
            raise InputDataError(f"local must be a sparse ({n * n_targets}, {n * n_targets}) matrix")
        local = sparse.csr_matrix(self.local, dtype=np.float64)
        if not np.isfinite(local.data).all():
            raise InputDataError("local must be finite")
        asymmetry = abs(local - local.T)
        if asymmetry.nnz and asymmetry.max() > 1e-10 * max(abs(local).max(), 1e-300):
            raise InputDataError("local must be symmetric")
        for name, value in (("targets", targets), ("mean", mean), ("factor", factor), ("local", local),
                            ("downdate", downdate), ("nugget", _blocks(self.nugget, n, n_targets, "nugget")),
                            ("per_test", _blocks(self.per_test, n, n_targets, "per_test"))):
            object.__setattr__(self, name, value)

    @property
    def n_sites(self) -> int:
        """n, the number of sites."""
        return int(self.mean.shape[0])

    def _flat(self, sites: np.ndarray) -> np.ndarray:
        """(len(sites) T,) flat indices ``site * T + target`` of ``sites``, target fastest."""
        n_targets = len(self.targets)
        return (sites[:, None] * n_targets + np.arange(n_targets)).reshape(-1)

    def variance(self) -> np.ndarray:
        """(n, T) the diagonal of the full covariance."""
        shape = self.mean.shape
        return (self.factor**2).sum(-1) + self.local.diagonal().reshape(shape) - (self.downdate**2).sum(-1)

    def sd(self) -> np.ndarray:
        """(n, T) posterior standard deviations (log10 units)."""
        return np.sqrt(np.maximum(self.variance(), 0.0))

    def site_covariance(self, sites: np.ndarray | None = None) -> np.ndarray:
        """(n, T, T) each site's own T x T block of the full covariance (of ``sites`` (p,) only: (p, T, T))."""
        picked = np.arange(self.n_sites) if sites is None else _indices(sites, self.n_sites, "sites")
        downdate = self.downdate[picked]
        return self._unconditioned_blocks()[picked] - np.einsum("iak,ibk->iab", downdate, downdate)

    def _unconditioned_blocks(self) -> np.ndarray:
        """(n, T, T) each site's block of F F^T + S, which conditioning leaves as it is: worked out
        once and shared with the posteriors :meth:`condition` makes from this one (a planner asks
        for every site's block once a visit; recomputing it took 10 of a 50-visit plan's 65 s)."""
        blocks = self.__dict__.get("_blocks")
        if blocks is None:
            n_targets = len(self.targets)
            rows = self._flat(np.arange(self.n_sites)).reshape(-1, n_targets)
            own = np.asarray(self.local[np.repeat(rows, n_targets, axis=1).ravel(), np.tile(rows, n_targets).ravel()])
            blocks = np.einsum("iak,ibk->iab", self.factor, self.factor) + own.reshape(-1, n_targets, n_targets)
            object.__setattr__(self, "_blocks", blocks)
        return blocks

    def correlation(self) -> np.ndarray:
        """(n,) correlation of the two targets at each site (T = 2 only)."""
        if len(self.targets) != 2:
            raise InputDataError(f"correlation needs two targets, this posterior has {self.targets}")
        block = self.site_covariance()
        return block[:, 0, 1] / np.sqrt(block[:, 0, 0] * block[:, 1, 1])

    def covariance(self, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        """(len(rows), len(cols)) dense block of the full covariance between flat indices
        (``None``: all n T of them)."""
        return self._covariance(rows, cols)

    def _covariance(self, rows: np.ndarray | None, cols: np.ndarray | None,
                    right: sparse.csr_matrix | None = None) -> np.ndarray:
        """C[rows, cols] @ right^T (``right`` (q, len(cols)) sparse, default the identity), the map
        applied to the column side before the one dense matrix product."""
        size = self.local.shape[0]
        rows, cols = (None if index is None else _indices(index, size, "flat indices") for index in (rows, cols))
        low_rank, removed = self.factor.reshape(size, -1), self.downdate.reshape(size, -1)

        def side(array: np.ndarray, index: np.ndarray | None, mapped: bool) -> np.ndarray:
            part = array if index is None else array[index]
            return np.asarray(right @ part) if mapped and right is not None else part

        out = side(low_rank, rows, False) @ side(low_rank, cols, True).T
        if removed.shape[1]:
            out -= side(removed, rows, False) @ side(removed, cols, True).T
        # S is symmetric: S[rows, cols] right^T = (right S[cols, rows])^T, and csr slices rows fast
        local = self.local if cols is None else self.local[cols]
        local = local if rows is None else local[:, rows]
        local = sparse.coo_matrix((local if right is None else right @ local).T)
        out[local.row, local.col] += local.data
        return out

    def dense_covariance(self) -> np.ndarray:
        """(n T, n T) the full covariance, for tests and small cases (refused above :data:`DENSE_LIMIT`)."""
        if self.local.shape[0] > DENSE_LIMIT:
            raise InputDataError(f"a dense covariance of {self.local.shape[0]} flat entries exceeds {DENSE_LIMIT}")
        return self.covariance(None, None)

    def select(self, sites: np.ndarray) -> MapPosterior:
        """The joint distribution at ``sites`` (p,) (positions; repeats allowed), cross-covariances kept."""
        sites = _indices(sites, self.n_sites, "sites")
        return self._mapped(sparse.csr_matrix((np.ones(len(sites)), (np.arange(len(sites)), sites)),
                                              shape=(len(sites), self.n_sites)))

    def grouped(self, groups: np.ndarray, n_groups: int | None = None,
                weights: np.ndarray | None = None) -> MapPosterior:
        """The joint distribution of weighted group means (hexagons from tiles, districts from hexagons).

        Args:
            groups: (n,) each site's group in [0, n_groups).
            n_groups: number of groups (default ``groups.max() + 1``).
            weights: (n,) non-negative weights (default 1), normalised to sum 1 within each group.

        Returns:
            A posterior over the n_groups means, A f with A (n_groups, n) the normalised weights: its
            mean, factor, downdate and local part are A mean, A F, A G and A S A^T exactly. A new
            observation's nugget and per-test covariances are the weighted means of the members'.
            An empty group (or one of zero total weight) has a NaN mean.
        """
        groups = _indices(groups, np.iinfo(np.int64).max, "groups")
        if len(groups) != self.n_sites:
            raise InputDataError(f"groups must give one group per site ({self.n_sites}), got {len(groups)}")
        count = int(groups.max()) + 1 if n_groups is None and len(groups) else int(n_groups or 0)
        if len(groups) and groups.max() >= count:
            raise InputDataError(f"groups must lie in [0, {count}), got a group {groups.max()}")
        weight = np.ones(self.n_sites) if weights is None else np.asarray(weights, dtype=np.float64)
        if weight.shape != (self.n_sites,) or not np.isfinite(weight).all() or (weight < 0).any():
            raise InputDataError(f"weights must be {self.n_sites} finite non-negative numbers")
        total = np.bincount(groups, weight, minlength=count)
        share = np.divide(weight, total[groups], out=np.zeros(self.n_sites), where=total[groups] > 0.0)
        mapped = self._mapped(sparse.csr_matrix((share, (groups, np.arange(self.n_sites))),
                                                shape=(count, self.n_sites)))
        mapped.mean[total == 0.0] = np.nan
        return mapped

    def difference(self, first: np.ndarray, second: np.ndarray) -> MapPosterior:
        """The joint distribution of f[second] - f[first] (p,) pairs of sites: the change between two
        quarters when the sites hold the same places at both. A new observation of a difference
        is the difference of two independent observations, so its nugget and per-test covariances
        are the sums of the pair's."""
        first, second = _indices(first, self.n_sites, "first"), _indices(second, self.n_sites, "second")
        if len(first) != len(second):
            raise InputDataError(f"first and second must pair up, got {len(first)} and {len(second)} sites")
        rows = np.tile(np.arange(len(first)), 2)
        signs = np.concatenate([-np.ones(len(first)), np.ones(len(second))])
        cols = np.concatenate([first, second])
        shape = (len(first), self.n_sites)
        return self._mapped(sparse.csr_matrix((signs, (rows, cols)), shape=shape),
                            sparse.csr_matrix((np.abs(signs), (rows, cols)), shape=shape))

    def _mapped(self, linear: sparse.csr_matrix, noise: sparse.csr_matrix | None = None) -> MapPosterior:
        """The posterior of ``linear @ f`` (p, n), the same map for every target; observation noise
        blocks mapped by ``noise`` (default ``linear``)."""
        flat = sparse.kron(linear, sparse.identity(len(self.targets)), format="csr")

        def apply(matrix: sparse.csr_matrix, array: np.ndarray) -> np.ndarray:
            return np.asarray(matrix @ array.reshape(self.n_sites, -1)).reshape((matrix.shape[0],) + array.shape[1:])

        noise = linear if noise is None else noise
        return MapPosterior(
            targets=self.targets, mean=apply(linear, self.mean), factor=apply(linear, self.factor),
            local=sparse.csr_matrix(flat @ self.local @ flat.T), downdate=apply(linear, self.downdate),
            nugget=apply(noise, self.nugget), per_test=apply(noise, self.per_test),
        )

    def condition(self, sites: np.ndarray, values: np.ndarray | None = None,
                  tests: float | np.ndarray = 1) -> MapPosterior:
        """Exact Gaussian conditioning on new observations of ``sites``.

        Args:
            sites: (m,) observed sites; a site may appear more than once (two visits).
            values: (m, T) observed log10 values on the tile mean's scale, or ``None`` for a
                hypothetical observation: the mean is kept and the covariance is the preposterior
                one, which does not depend on the values. A measurement of K tests sits
                ``tails.measurement_shift(K)`` of that target's
                :class:`~geodbk.fit.geomodel.GeoModel` away from the tile mean (the log of a mean
                of K skewed speeds; :mod:`geodbk.fit.tails`): subtract it before passing the
                value. (``GeoModel.condition`` takes dataset rows in through the residual field,
                which removes its own slope in 1/tests.)
            tests: K, the number of tests each observation averages, scalar or (m,), > 0.

        Returns:
            The posterior given the observations: with C the current covariance, o the observed
            flat indices and L L^T = C_oo + noise, the downdate gains the m T columns
            C_{:,o} L^{-T} and the mean moves by C_{:,o} L^{-T} L^{-1} (y - mean_o).
        """
        sites = _indices(sites, self.n_sites, "sites")
        n_targets = len(self.targets)
        count = np.broadcast_to(np.asarray(tests, dtype=np.float64), sites.shape)
        observed = self._flat(sites)
        cross = self.covariance(None, observed)
        noise = np.zeros((len(sites), n_targets, len(sites), n_targets))
        noise[np.arange(len(sites)), :, np.arange(len(sites)), :] = self.observation_noise(sites, count)
        try:
            chol = linalg.cholesky(cross[observed] + noise.reshape(len(observed), -1), lower=True)
        except linalg.LinAlgError:
            raise InputDataError("the observations' covariance is singular: give the sites a positive "
                                 "nugget or per-test noise") from None
        gain = linalg.solve_triangular(chol, cross.T, lower=True).T
        mean = self.mean
        if values is not None:
            y = np.asarray(values, dtype=np.float64)
            if y.shape != (len(sites), n_targets) or not np.isfinite(y).all():
                raise InputDataError(f"values must be finite and shaped {(len(sites), n_targets)}, got {y.shape}")
            residual = linalg.solve_triangular(chol, (y - self.mean[sites]).reshape(-1), lower=True)
            mean = self.mean + (gain @ residual).reshape(self.mean.shape)
        downdate = np.concatenate([self.downdate, gain.reshape(self.n_sites, n_targets, -1)], axis=2)
        return self._moved_to(mean, downdate)

    def _moved_to(self, mean: np.ndarray, downdate: np.ndarray) -> MapPosterior:
        """This posterior with ``mean`` (n, T) and ``downdate`` (n, T, m) replaced, its other parts
        shared and not checked again: they were checked when this one was built, and the symmetry
        check of ``local`` took 23 of a 50-visit plan's 107 s on PR's 17,700 hexagons."""
        moved = object.__new__(MapPosterior)
        for part in fields(self):
            object.__setattr__(moved, part.name, getattr(self, part.name))
        if "_blocks" in self.__dict__:
            object.__setattr__(moved, "_blocks", self.__dict__["_blocks"])
        object.__setattr__(moved, "mean", mean)
        object.__setattr__(moved, "downdate", downdate)
        return moved

    def visit_gain(self, sites: np.ndarray, tests: float = 1, rows: np.ndarray | None = None) -> np.ndarray:
        """The downdate columns that one visit would add, for each of ``sites`` separately (a
        planner's candidates; :meth:`condition` observes a set of sites jointly).

        Args:
            sites: (b,) candidate sites, each observed alone with K = ``tests`` tests.
            tests: K, > 0.
            rows: (r,) the sites whose rows are wanted (default all n).

        Returns:
            (r, T, b, T) W with W[:, :, j, :] = C_{rows,j} L_j^{-T}, L_j L_j^T = C_jj + nugget_j +
            per_test_j / K: ``condition([sites[j]], tests=K)`` appends exactly these T columns, and
            removes W[i, :, j, :] W[i, :, j, :]^T from site i's block.
        """
        sites = _indices(sites, self.n_sites, "sites")
        inverse = sparse.block_diag(list(np.linalg.inv(self._visit_noise_cholesky(sites, tests))), format="csr")
        picked = None if rows is None else self._flat(_indices(rows, self.n_sites, "rows"))
        gain = self._covariance(picked, self._flat(sites), right=inverse)
        n_targets = len(self.targets)
        return gain.reshape(-1, n_targets, len(sites), n_targets)

    def total_variance_removed(self, directions: np.ndarray, weights: np.ndarray, sites: np.ndarray,
                               tests: float = 1, dtype: type = np.float64) -> np.ndarray:
        """(b,) what one visit at each of ``sites`` (b,) (separately, K = ``tests``) would remove from
        sum_i w_i Var(d_i^T f_i), ``directions`` d (n, T) and ``weights`` w (n,): sum_i w_i
        ||L_j^{-1} C_{j,i} d_i||^2 (L_j as in :meth:`visit_gain`), in O((n + b) (k + m)^2) without a
        site x candidate matrix. With H = [F, G], z_i = [F_i^T d_i; -G_i^T d_i] and s_ji = S_{j,i} d_i,
        C_{j,i} d_i = H_j z_i + s_ji and the sum is tr((L_j L_j^T)^{-1} Q_j), Q_j = H_j P H_j^T +
        H_j X_j^T + X_j H_j^T + Y_j, P = sum_i w_i z_i z_i^T, X_j = sum_i w_i s_ji z_i^T, Y_j =
        sum_i w_i s_ji s_ji^T. ``dtype`` is that of the products with the factors, the sum's
        largest steps (``np.float32`` takes 0.6 of the time; relative error about 1e-6, enough for
        a planner's ranking of candidates)."""
        sites = _indices(sites, self.n_sites, "sites")
        n_targets = len(self.targets)
        d = np.asarray(directions, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        if d.shape != self.mean.shape or w.shape != (self.n_sites,):
            raise InputDataError(f"directions must be shaped {self.mean.shape} and weights ({self.n_sites},)")
        factor: np.ndarray = np.asarray(self.factor, dtype=dtype)
        downdate: np.ndarray = np.asarray(self.downdate, dtype=dtype)
        d_low: np.ndarray = np.asarray(d, dtype=dtype)
        z = np.concatenate([np.einsum("ia,iak->ik", d_low, factor), -np.einsum("ia,iak->ik", d_low, downdate)], 1)
        weighted_z = z * w.astype(dtype)[:, None]
        every = len(sites) == self.n_sites and bool((sites == np.arange(self.n_sites)).all())
        low_rank, removed = ((array if every else array[sites]).reshape(len(sites) * n_targets, -1)
                             for array in (factor, downdate))
        # the local part: near[(j, a), i] = (S_{j,i} d_i)_a
        spread = sparse.csr_matrix((d.ravel(), (np.arange(d.size), np.repeat(np.arange(self.n_sites), n_targets))),
                                   shape=(d.size, self.n_sites))
        near = sparse.csr_matrix((self.local if every else self.local[self._flat(sites)]) @ spread)
        # tr(A^{-1} (H P H^T + H X^T + X H^T)) = tr(A^{-1} H (P H^T + 2 X^T)) for a symmetric A
        outer = weighted_z.T @ z
        k = low_rank.shape[1]
        x_rows = np.asarray(near.astype(dtype, copy=False) @ weighted_z)
        right = low_rank @ outer[:k] + removed @ outer[k:] + 2.0 * x_rows  # x_rows: the rows of every X_j

        def pairwise(left: np.ndarray, right: np.ndarray) -> np.ndarray:
            return np.einsum("jak,jbk->jab", left.reshape(len(sites), n_targets, -1),
                             right.reshape(len(sites), n_targets, -1))

        # Y_j's own part sum_i w_i (S_{j,i} d_i)_a (S_{j,i} d_i)_b: squares row by row, each cross
        # pair once (Y_j is symmetric), without copying near's rows four times
        own = np.zeros((len(sites), n_targets, n_targets))
        rows = np.repeat(np.arange(near.shape[0]), np.diff(near.indptr))
        own[:, np.arange(n_targets), np.arange(n_targets)] = np.bincount(
            rows, near.data**2 * w[near.indices], minlength=near.shape[0]).reshape(len(sites), n_targets)
        by_target = [near[a::n_targets] for a in range(n_targets)]
        for a, b in zip(*np.triu_indices(n_targets, 1), strict=True):
            other = by_target[b]
            weighted = sparse.csr_matrix((other.data * w[other.indices], other.indices, other.indptr),
                                         shape=other.shape)
            own[:, a, b] = own[:, b, a] = np.asarray(by_target[a].multiply(weighted).sum(axis=1)).ravel()
        total = pairwise(low_rank, right[:, :k]) + pairwise(removed, right[:, k:]) + own
        chol = self._visit_noise_cholesky(sites, tests)
        return np.einsum("jab,jba->j", np.linalg.inv(chol @ chol.transpose(0, 2, 1)), total)

    def observation_noise(self, sites: np.ndarray, tests: float | np.ndarray = 1) -> np.ndarray:
        """(m, T, T) Cov(e) of an observation of K = ``tests`` (scalar or (m,), > 0) tests at each of
        ``sites`` (m,): ``nugget + per_test / K``."""
        count = np.broadcast_to(np.asarray(tests, dtype=np.float64), np.shape(sites))
        if not (np.isfinite(count).all() and (count > 0).all()):
            raise InputDataError("tests must be positive finite numbers, one per observation or one for all")
        return self.nugget[sites] + self.per_test[sites] / count[:, None, None]

    def _visit_noise_cholesky(self, sites: np.ndarray, tests: float) -> np.ndarray:
        """(b, T, T) L_j, L_j L_j^T = C_jj + nugget_j + per_test_j / K: one visit's covariance at each site."""
        try:
            return np.linalg.cholesky(self.site_covariance(sites) + self.observation_noise(sites, tests))
        except np.linalg.LinAlgError:
            raise InputDataError("an observation's covariance is singular: give the sites a positive "
                                 "nugget or per-test noise") from None

    def probability_meets(self, levels: tuple[float, ...]) -> np.ndarray:
        """(n,) P(f_t >= levels[t] for every target): for T = 2, P(download >= levels[0] and upload
        >= levels[1]) under the sites' joint 2 x 2 covariance (:func:`meets_probability`). Levels
        in log10 units; the probability is of the latent f, without a new observation's noise."""
        return meets_probability(self.mean, self.site_covariance(), tuple(levels))

    def expected_wrong(self, levels: tuple[float, ...]) -> np.ndarray:
        """(n,) min(p, 1 - p), p = :meth:`probability_meets`: the chance that the decision "meets"
        (taken when p >= 0.5) or "does not meet" is wrong."""
        p = self.probability_meets(levels)
        return np.minimum(p, 1.0 - p)
