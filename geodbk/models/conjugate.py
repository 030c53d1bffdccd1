"""The conjugate posterior of a basis GP's weights, given its learned basis.

dPPGP fits q(w) = N(m, L L^T) to the marginal predictive likelihood, row by row. That
makes every tile's predictive distribution good, but L L^T is not a posterior: it holds
whatever latent variance the marginals need, shared between all places, so the variance
of a sum or a difference of f (an area mean, a change) is far too large (issue 18:
area z-score sd 0.54-0.65 on real regions).

Once the basis phi is learned, the model is Bayesian linear regression in phi, and the
posterior of w is closed-form. The rows of one tile (its quarters) share an offset that a
rank-r basis cannot hold (30,000 tiles), so the noise has a tile random effect beside the
independent part d_i = sigma0^2 + sigma1^2 / k_i of a row that averages k_i tests
(:class:`Noise`): ``N = D + tau^2 Z Z^T``, Z the (n, tiles) indicator. With the prior
w ~ N(0, a^2 I_r), u = w / a,

    Lambda = I_r + a^2 Phi^T N^{-1} Phi,
    w | y ~ N(a^2 Lambda^{-1} Phi^T N^{-1} (y - c),  a^2 Lambda^{-1}).

N^{-1} is block-diagonal by tile, one rank-one update of D^{-1} per tile (Sherman-Morrison),
so every product costs O(n r^2). The hyperparameters theta = (a^2, sigma0^2, sigma1^2,
tau^2, c) maximise the exact log marginal likelihood log N(y; c, a^2 Phi Phi^T + N)
(type-II maximum likelihood; determinant lemma and Woodbury identity), with phi held fixed,
by scipy's bounded L-BFGS-B on torch gradients. This is the refit of Bayesian last-layer
models: the learned kernel is kept; the weights' distribution and the noise are replaced.
Where dPPGP learned that the fit is worse (rural tiles, say), its q(w) variance
v(x) = ||L^T phi(x)||^2 is large. That shape is kept as independent, input-dependent tile
noise beta v(x) in d_i (beta a sixth hyperparameter), so tile marginals keep it while no
variance is shared between places any more (PR random split, test NLL: 0.484 with it, 0.502
without, 0.485 for the trained q(w)). The tile effect is not part of the model afterwards: the local residual field
(:mod:`geodbk.fit.residuals`) carries tile offsets at prediction time. Without it
(``tiles=None``) sigma0^2 would absorb the offsets, and the residual field, which weighs
each training row by that noise, would learn less from a tile's other quarters (PR random
split, test NLL 0.506 without the tile effect and the variance shape).

After :func:`fit_conjugate_posterior`, Cov(f(x), f(x')) = phi(x)^T a^2 Lambda^{-1} phi(x')
is the exact posterior covariance of the model with kernel a^2 phi(x)^T phi(x'), which is
what :meth:`BasisGP.kernel` then returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize

from geodbk.models.basis_gp import BasisGP
from geodbk.models.expansions import jittered_cholesky
from geodbk.models.objectives import _LOG_2PI

#: Training rows (whole tiles, drawn at random) on which the hyperparameters are estimated;
#: the posterior itself always conditions on every row. On PR's spatial-block training rows
#: (114k, r = 128) 20,000 rows gave sigma0^2, sigma1^2, tau^2 and beta within 5% of the
#: all-rows values in 6 s instead of 37 s; a^2 and c trade off along the basis's near-constant
#: direction and are weakly identified (a^2 1.0 against 2.6, same log likelihood to 1e-3 per row).
HYPERPARAMETER_ROWS = 20_000
#: Rows per chunk when the basis is evaluated and its sums are taken (bounds the (rows, r) blocks).
ROW_CHUNK = 65536
#: L-BFGS-B iterations for the hyperparameters (up to 6 of them).
_ITERATIONS = 200
#: Bounds of log a^2 and of the log noise variances (standardised targets): a prior weight
#: variance between 1e-4 and 1e4 times the training value of 1, noise below 10 target variances.
#: Without a lower bound the gradient in log a^2 vanishes as a^2 -> 0, and a start far from the
#: optimum can stall there.
_LOG_PRIOR_BOUNDS = (math.log(1e-4), math.log(1e4))
_LOG_NOISE_MAX = math.log(10.0)


@dataclass(frozen=True)
class ConjugateFit:
    """What :func:`fit_conjugate_posterior` estimated (standardised target units).

    Attributes:
        weight_prior_variance: a^2, the prior variance of each basis weight.
        tile_noise: sigma0^2.
        per_test_noise: sigma1^2 (0 for a model without the test-count term).
        tile_effect: tau^2, the variance of a tile's offset shared by its rows (0 without tiles).
        variance_shape: beta, the weight of the input-dependent noise beta ||L_trained^T phi(x)||^2
            (0 without it).
        constant_mean: c.
        log_marginal_per_row: log p(y | theta) / n on the estimation rows.
        rows: n, the number of estimation rows.
    """

    weight_prior_variance: float
    tile_noise: float
    per_test_noise: float
    tile_effect: float
    variance_shape: float
    constant_mean: float
    log_marginal_per_row: float
    rows: int


@torch.no_grad()
def basis_values(model: BasisGP, x: torch.Tensor, chunk: int = ROW_CHUNK) -> torch.Tensor:
    """phi(x) of every row of ``x`` (n, d) in float64, computed in chunks: (n, r)."""
    model.eval()
    parts = [model.basis(part).double() for part in x.split(chunk)]
    return torch.cat(parts) if parts else x.new_zeros((0, model.rank), dtype=torch.float64)


@dataclass
class _Terms:
    """The Woodbury pieces of C = Psi Psi^T + N for a scaled basis Psi (n, r).

    Attributes:
        chol: (r, r) Cholesky factor of Lambda = I + Psi^T N^{-1} Psi.
        v: (r,) chol^{-1} Psi^T N^{-1} y.
        log_det_noise: log |N|.
        quadratic: y^T N^{-1} y.
    """

    chol: torch.Tensor
    v: torch.Tensor
    log_det_noise: torch.Tensor
    quadratic: torch.Tensor

    def log_marginal(self) -> torch.Tensor:
        """log N(y; 0, C) = -n/2 log 2 pi - 1/2 log|N| - 1/2 log|Lambda| - 1/2 (y^T N^{-1} y - ||v||^2),
        without the -n/2 log 2 pi."""
        log_det = self.log_det_noise + 2.0 * torch.log(torch.diagonal(self.chol)).sum()
        return -0.5 * log_det - 0.5 * (self.quadratic - self.v.pow(2).sum())


@dataclass
class _Sums:
    """What :class:`_Terms` needs from a set of rows, summed over them, so that rows can come in
    chunks: for a basis phi (n, r), targets y (n,), noise d (n,) and tiles (n,),
    ``sum phi phi^T / d`` (r, r), ``sum phi y / d`` (r,), ``sum y^2 / d``, ``sum log d``, and
    per tile ``sum phi / d`` (n_tiles, r), ``sum y / d`` and ``sum 1 / d`` (n_tiles,) (``None``
    without tiles). Adding returns new sums (no in-place update, so autograd can follow).

    The basis is summed unscaled, and the prior weight variance a^2 enters in :meth:`terms`
    (psi = a phi): the hyperparameter search's gradient then flows through the (n,) noise and
    targets only, not through an (n, r) scaled basis (half the time of an evaluation)."""

    precision: torch.Tensor
    projected: torch.Tensor
    quadratic: torch.Tensor
    log_det_noise: torch.Tensor
    tile_psi: torch.Tensor | None
    tile_y: torch.Tensor | None
    tile_h: torch.Tensor | None

    @classmethod
    def zeros(cls, rank: int, n_tiles: int | None, like: torch.Tensor) -> _Sums:
        """Empty sums for ``rank`` basis functions (and ``n_tiles`` tiles, or ``None``)."""
        zero = like.new_zeros(())
        if n_tiles is None:
            return cls(like.new_zeros(rank, rank), like.new_zeros(rank), zero, zero, None, None, None)
        return cls(like.new_zeros(rank, rank), like.new_zeros(rank), zero, zero,
                   like.new_zeros(n_tiles, rank), like.new_zeros(n_tiles), like.new_zeros(n_tiles))

    def add(self, phi: torch.Tensor, y: torch.Tensor, d: torch.Tensor, tiles: torch.Tensor | None) -> _Sums:
        """These sums plus rows phi (n, r), y (n,), d (n,), tiles (n,) (``None`` without tiles)."""
        scaled = phi / d.unsqueeze(-1)
        out = _Sums(self.precision + scaled.T @ phi, self.projected + scaled.T @ y,
                    self.quadratic + (y * y / d).sum(), self.log_det_noise + torch.log(d).sum(), None, None, None)
        if self.tile_psi is not None and self.tile_y is not None and self.tile_h is not None:
            assert tiles is not None  # tiled sums take tiled rows
            out.tile_psi = self.tile_psi.index_add(0, tiles, scaled)
            out.tile_y = self.tile_y.index_add(0, tiles, y / d)
            out.tile_h = self.tile_h.index_add(0, tiles, 1.0 / d)
        return out

    def terms(self, tau2: torch.Tensor, prior: torch.Tensor) -> _Terms:
        """:class:`_Terms` of the scaled basis psi = sqrt(prior) phi for noise N = diag(d) + tau2 [same tile].

        Per tile g, with h_g = sum_{i in g} 1/d_i and c_g = tau2 / (1 + tau2 h_g),
        ``a^T N^{-1} b = sum_i a_i b_i / d_i - sum_g c_g (sum_{i in g} a_i / d_i)(sum_{i in g} b_i / d_i)``.
        """
        scale = prior.sqrt()
        precision, projected = prior * self.precision, scale * self.projected
        quadratic, log_det_noise = self.quadratic, self.log_det_noise
        if self.tile_psi is not None and self.tile_y is not None and self.tile_h is not None:
            c = tau2 / (1.0 + tau2 * self.tile_h)
            tile_psi = scale * self.tile_psi
            precision = precision - (tile_psi * c.unsqueeze(-1)).T @ tile_psi
            projected = projected - (tile_psi * c.unsqueeze(-1)).T @ self.tile_y
            quadratic = quadratic - (c * self.tile_y * self.tile_y).sum()
            log_det_noise = log_det_noise + torch.log1p(tau2 * self.tile_h).sum()
        eye = torch.eye(precision.shape[0], dtype=precision.dtype, device=precision.device)
        chol = torch.linalg.cholesky(eye + 0.5 * (precision + precision.T))
        v = torch.linalg.solve_triangular(chol, projected.unsqueeze(-1), upper=False).squeeze(-1)
        return _Terms(chol, v, log_det_noise, quadratic)


def fit_conjugate_posterior(
    model: BasisGP,
    x: torch.Tensor,
    y: torch.Tensor,
    tests: torch.Tensor | None = None,
    tiles: torch.Tensor | None = None,
    *,
    variance_shape: bool = True,
    max_rows: int = HYPERPARAMETER_ROWS,
    seed: int = 0,
) -> ConjugateFit:
    """Replace the model's q(w), noise and constant mean by the conjugate posterior given phi.

    Args:
        model: a fitted basis GP without a Nystrom residual (its basis stays as it is).
        x: (n, d) training inputs; y: (n,) standardised targets.
        tests: (n,) test counts, or ``None`` (then sigma1^2 stays as the model has it and is
            not used).
        tiles: (n,) integer tile index of each row (rows of one tile share an offset of
            variance tau^2), or ``None`` for independent rows.
        variance_shape: keep the trained q(w)'s variance v(x) = ||L^T phi(x)||^2 as independent,
            input-dependent tile noise beta v(x) (beta by maximum likelihood): where dPPGP
            learned that the fit is worse (rural tiles), the tile marginal stays wider, but the
            variance is no longer shared between places.
        max_rows: rows on which theta is estimated (a seeded random subset of tiles' rows when
            n is larger: whole tiles are kept together).
        seed: the subset's seed.

    Returns:
        The estimates; the model is updated in place (``weight_prior_variance``,
        ``noise``, ``constant_mean``, ``variational_mean`` and the Cholesky factor of q(w)).

    Raises:
        TypeError: for a model with a Nystrom residual (its posterior is not Bayesian linear
            regression in phi).
    """
    if model.include_residual:
        raise TypeError("the conjugate posterior is for basis GPs without a Nystrom residual")
    with torch.no_grad():
        trained_factor = model.chol_factor.detach().double().clone()
    target = y.double()
    counts = None if tests is None or not model.noise.per_test else tests.double()
    tile_index, n_tiles = None, 0
    if tiles is not None:
        _, tile_index = torch.unique(tiles.to(x.device), return_inverse=True)
        n_tiles = int(tile_index.max()) + 1 if len(tile_index) else 0
    cpu_tiles = None if tile_index is None else tile_index.cpu()
    fit_rows = _estimation_rows(len(target), cpu_tiles, max_rows, seed).to(x.device)
    phi_fit, y_fit = basis_values(model, x[fit_rows]), target[fit_rows]
    shape_fit = (phi_fit @ trained_factor).pow(2).sum(-1)  # the trained q(w)'s variance ||L^T phi||^2
    counts_fit = None if counts is None else counts[fit_rows]
    tiles_fit, n_fit_tiles = None, 0
    if tile_index is not None:
        _, tiles_fit = torch.unique(tile_index[fit_rows], return_inverse=True)
        n_fit_tiles = int(tiles_fit.max()) + 1 if len(tiles_fit) else 0

    with torch.no_grad():
        per_test0 = float(model.noise.per_test_variance())
        tile0 = float(model.noise())
        start = [math.log(float(model.weight_prior_variance)), math.log(tile0), float(model.constant_mean)]
    floor = model.noise.floor
    bounds = [_LOG_PRIOR_BOUNDS, (math.log(floor * 1.01), _LOG_NOISE_MAX), (None, None)]
    names = ["prior", "tile", "constant"]
    if counts_fit is not None:
        start.append(math.log(max(per_test0, 1e-6)))
        bounds.append((math.log(1e-8), _LOG_NOISE_MAX))
        names.append("per_test")
    if tiles_fit is not None:
        start.append(math.log(0.5 * tile0))
        bounds.append((math.log(1e-8), _LOG_NOISE_MAX))
        names.append("tile_effect")
    if variance_shape:
        start.append(math.log(0.5))
        bounds.append((math.log(1e-8), _LOG_NOISE_MAX))
        names.append("shape")

    def unpack(theta: torch.Tensor) -> dict[str, torch.Tensor]:
        values = dict(zip(names, theta, strict=True))
        return {name: (value if name == "constant" else value.exp()) for name, value in values.items()}

    def row_noise(values: dict[str, torch.Tensor], counts_: torch.Tensor | None, shape_: torch.Tensor) -> torch.Tensor:
        noise = values["tile"].expand(len(shape_))
        if "shape" in values:
            noise = noise + values["shape"] * shape_
        return noise if counts_ is None else noise + values["per_test"] / counts_

    def negative_log_marginal(theta: torch.Tensor) -> torch.Tensor:
        values = unpack(theta)
        tau2 = values.get("tile_effect", theta.new_zeros(()))
        sums = _Sums.zeros(model.rank, n_fit_tiles if tiles_fit is not None else None, phi_fit)
        terms = sums.add(phi_fit, y_fit - values["constant"],
                         row_noise(values, counts_fit, shape_fit), tiles_fit).terms(tau2, values["prior"])
        return -terms.log_marginal() / len(y_fit) + 0.5 * _LOG_2PI

    def value_and_grad(vector: np.ndarray) -> tuple[float, np.ndarray]:
        theta = torch.tensor(vector, dtype=torch.float64, device=x.device, requires_grad=True)
        with torch.enable_grad():
            loss = negative_log_marginal(theta)
            loss.backward()
        assert theta.grad is not None
        return float(loss.detach()), theta.grad.cpu().numpy()

    best = minimize(value_and_grad, np.array(start), jac=True, method="L-BFGS-B", bounds=bounds,
                    options={"maxiter": _ITERATIONS, "ftol": 1e-13, "gtol": 1e-9})
    theta = torch.as_tensor(best.x, dtype=torch.float64, device=x.device)
    with torch.no_grad():
        log_marginal = -float(negative_log_marginal(theta))
        values = unpack(theta)
        tau2 = values.get("tile_effect", theta.new_zeros(()))
        scale = float(values["prior"].sqrt())
        c = float(values["constant"])
        # every row, streamed in chunks: phi (n, r) is never held whole (4 KB a row at r = 128)
        sums = _Sums.zeros(model.rank, n_tiles if tile_index is not None else None, trained_factor)
        for rows in torch.arange(len(target), device=x.device).split(ROW_CHUNK):
            phi = basis_values(model, x[rows])
            shape = (phi @ trained_factor).pow(2).sum(-1)
            sums = sums.add(phi, target[rows] - c, row_noise(values, None if counts is None else counts[rows],
                            shape), None if tile_index is None else tile_index[rows])
        terms = sums.terms(tau2, values["prior"])
        mean_u = torch.linalg.solve_triangular(terms.chol.T, terms.v.unsqueeze(-1), upper=True).squeeze(-1)
        cov_u = torch.cholesky_inverse(terms.chol)
        factor_u = jittered_cholesky(0.5 * (cov_u + cov_u.T), 1e-10 * float(torch.diagonal(cov_u).mean()))
        dtype = model.variational_mean.dtype
        model.set_posterior((mean_u * scale).to(dtype), (factor_u * scale).to(dtype))
        tile = max(float(values["tile"]), floor * 1.01)
        per_test = float(values["per_test"]) if "per_test" in values else per_test0
        model.noise.set_(tile, per_test if model.noise.per_test else None)
        model.constant_mean.fill_(c)
        model.weight_prior_variance.fill_(scale**2)
        beta = float(values["shape"]) if "shape" in values else 0.0
        model.set_noise_factor(trained_factor.to(dtype), beta)
    return ConjugateFit(scale**2, tile, per_test if model.noise.per_test else 0.0, float(tau2), beta, c,
                        log_marginal, len(y_fit))


def _estimation_rows(n: int, tiles: torch.Tensor | None, max_rows: int, seed: int) -> torch.Tensor:
    """Indices of at most about ``max_rows`` rows for the hyperparameters: all rows when n is
    small enough, else the rows of randomly drawn tiles (whole tiles, so that the tile effect
    is seen with its rows together) or random rows."""
    generator = torch.Generator().manual_seed(seed)
    if n <= max_rows:
        return torch.arange(n)
    if tiles is None:
        return torch.randperm(n, generator=generator)[:max_rows]
    n_tiles = int(tiles.max()) + 1
    order = torch.randperm(n_tiles, generator=generator)
    rows_per_tile = torch.bincount(tiles, minlength=n_tiles)
    cumulative = torch.cumsum(rows_per_tile[order], 0)
    chosen = order[: int(torch.searchsorted(cumulative, max_rows)) + 1]
    keep = torch.zeros(n_tiles, dtype=torch.bool)
    keep[chosen] = True
    return torch.nonzero(keep[tiles]).squeeze(-1)
