"""Training objectives on the parameters of a :class:`~geodbk.models.basis_gp.BasisGP`.

Every objective is a loss to *minimise*, on the per-datum scale (divided by the
training size n), evaluated on a batch ``(x, y)`` of size b with targets standardised, and
optionally the rows' test counts ``tests`` (b,), which make s2 per row (see
:class:`~geodbk.models.base.Noise`):

=========  =================================================================================
dPPGP      (1/b) sum -log N(y; mu, var_f + s2) + alpha (1/b) sum (k_b - ||phi||^2) / (2 s2)
           + (beta / n) KL,   k_b = max_batch ||phi||^2                     (method, eq. 15)
SVGP       (1/b) sum [-log N(y; mu, s2) + var_f / (2 s2)] + (beta / n) KL          (eq. 5)
PPGP       (1/b) sum -log N(y; mu, var_f + s2) + (beta / n) KL                     (eq. 6)
VBLL       the SVGP form on a basis without a residual (beta = 1)          (appendix B)
exact MML  -(1/n) log N(y - c; 0, Phi Phi^T + D) by Woodbury, D = diag(s2)  (eq. 11), full batch
MSE        (1/b) sum (y - mu)^2; s2 set to the training MSE after each epoch
=========  =================================================================================

with mu = <m, phi> + c, var_f = ||L^T phi||^2 (+ the Nystrom residual for SVGP-type
models), s2 = sigma^2 and KL = KL(N(m, L L^T) || N(0, I_r)).

To add an objective, subclass :class:`Objective`, parametrised by the model type it scores
(``Objective[VariationalModel]`` for one that reads the KL term), and return it from a model
spec's ``objective`` factory (see :mod:`geodbk.models.zoo`).
"""

from __future__ import annotations

import math
from typing import Generic, TypeVar

import torch

from geodbk.models.base import VariationalModel, ZooModel
from geodbk.models.basis_gp import BasisGP, PointNetwork
from geodbk.models.expansions import jittered_cholesky
from geodbk.models.fused import row_squared_norm

_LOG_2PI = math.log(2.0 * math.pi)

#: The model type an objective scores. Contravariant: an objective of every zoo model may stand
#: where an objective of a narrower type is asked for.
ModelT = TypeVar("ModelT", bound=ZooModel, contravariant=True)


def gaussian_nll(y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """Elementwise -log N(y; mean, var) = 0.5 (log 2 pi + log var + (y - mean)^2 / var), broadcast.

    The one Gaussian NLL of geodbk: the objectives, the knn baseline's choice of k and
    :func:`geodbk.fit.metrics.gaussian_nll` all use it. ``var`` is in the squared units of ``y``.
    """
    return 0.5 * (_LOG_2PI + torch.log(var) + (y - mean).pow(2) / var)


class Objective(Generic[ModelT]):
    """A loss on a batch of a model of type ``ModelT``; subclasses implement :meth:`__call__`.

    Attributes:
        name: short label shown in progress bars.

    Whether a kind trains full batch is set by its :class:`~geodbk.models.zoo.ModelSpec`
    (``full_batch``), not by the objective.
    """

    name = "objective"

    def __call__(
        self, model: ModelT, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Loss () for the batch ``x`` (b, d), ``y`` (b,) standardised, ``tests`` (b,) or None, of
        a training set of size ``n``."""
        raise NotImplementedError

    def refresh(self, model: ModelT, x: torch.Tensor, y: torch.Tensor, tests: torch.Tensor | None = None) -> None:
        """Update closed-form state from the training data before validation (default: none)."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class DPPGP(Objective[VariationalModel]):
    """Decoupled predictive GP loss: predictive NLL + alpha trace term + (beta/n) KL."""

    name = "dPPGP"

    def __init__(self, alpha: float = 0.1, beta: float = 0.01) -> None:
        self.alpha = alpha
        self.beta = beta

    def __call__(
        self, model: VariationalModel, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = model(x, tests)
        assert out.phi is not None  # a basis model in training returns its basis values
        nll = gaussian_nll(y, out.mean, out.predictive_var).mean()
        sq_norm = row_squared_norm(out.phi)
        trace = ((sq_norm.max() - sq_norm) / (2.0 * out.noise)).mean()
        return nll + self.alpha * trace + (self.beta / n) * model.kl_divergence()


class SVGPELBO(Objective[VariationalModel]):
    """Negative SVGP evidence lower bound per datum (eq. 5)."""

    name = "SVGP"

    def __init__(self, beta: float = 1.0) -> None:
        self.beta = beta

    def __call__(
        self, model: VariationalModel, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = model(x, tests)
        fit = gaussian_nll(y, out.mean, out.noise) + out.var_f / (2.0 * out.noise)
        return fit.mean() + (self.beta / n) * model.kl_divergence()


class VBLLELBO(SVGPELBO):
    """Variational Bayesian last layer: the ELBO of a Gaussian last layer with N(0, I) prior."""

    name = "VBLL"


class PPGP(Objective[VariationalModel]):
    """Parametric predictive GP loss: predictive NLL + (beta/n) KL (eq. 6)."""

    name = "PPGP"

    def __init__(self, beta: float = 0.01) -> None:
        self.beta = beta

    def __call__(
        self, model: VariationalModel, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = model(x, tests)
        nll = gaussian_nll(y, out.mean, out.predictive_var).mean()
        return nll + (self.beta / n) * model.kl_divergence()


class MeanSquaredError(Objective[PointNetwork]):
    """MSE for the network; :meth:`refresh` sets sigma^2 to the training MSE (its MLE)."""

    name = "MSE"

    def __call__(
        self, model: PointNetwork, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        return (y - model(x).mean).pow(2).mean()

    @torch.no_grad()
    def refresh(
        self, model: PointNetwork, x: torch.Tensor, y: torch.Tensor, tests: torch.Tensor | None = None,
        chunk_size: int = 65536,
    ) -> None:
        chunks = zip(x.split(chunk_size), y.split(chunk_size), strict=True)
        sq = sum(float((yb - model(xb).mean).pow(2).sum()) for xb, yb in chunks)
        model.noise.set_(sq / len(y))


def woodbury_log_marginal(phi: torch.Tensor, y: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """log N(y; 0, Phi Phi^T + D) in O(n r^2) (eq. 11), D = diag(noise).

    With Lambda = I_r + Phi^T D^{-1} Phi = L_Lam L_Lam^T and v = L_Lam^{-1} Phi^T D^{-1} y:
    ``-n/2 log 2pi - 1/2 sum log d_i - 1/2 log|Lambda| - 1/2 y^T D^{-1} y + 1/2 ||v||^2``
    (matrix determinant lemma and Woodbury identity).

    Args:
        phi: (n, r) basis values. y: (n,) targets (mean already subtracted).
        noise: () sigma^2, or (n,) per-row noise variances d_i.
    """
    n = phi.shape[0]
    d = noise.expand(n)
    chol, v = _precision_terms(phi, y, d)
    log_det = 2.0 * torch.log(torch.diagonal(chol)).sum() + torch.log(d).sum()
    return -0.5 * n * _LOG_2PI - 0.5 * log_det - 0.5 * ((y * y / d).sum() - v.pow(2).sum())


def exact_posterior(phi: torch.Tensor, y: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form weight posterior w | y ~ N(Lambda^{-1} Phi^T D^{-1} y, Lambda^{-1}) (eq. 10).

    Lambda = I_r + Phi^T D^{-1} Phi; ``noise`` is () sigma^2 or (n,) diag(D).

    Returns:
        (mean (r,), lower Cholesky factor (r, r) of the covariance Lambda^{-1}).
    """
    chol, v = _precision_terms(phi, y, noise.expand(phi.shape[0]))
    mean = torch.linalg.solve_triangular(chol.T, v.unsqueeze(-1), upper=True).squeeze(-1)
    cov = torch.cholesky_inverse(chol)
    cov = 0.5 * (cov + cov.T)
    jitter = 1e-10 if cov.dtype == torch.float64 else 1e-7
    return mean, jittered_cholesky(cov, jitter * float(torch.diagonal(cov).mean()))


def _precision_terms(phi: torch.Tensor, y: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cholesky factor of Lambda = I + Phi^T D^{-1} Phi, (r, r), and v = L^{-1} Phi^T D^{-1} y, (r,)."""
    scaled = phi / d.unsqueeze(-1)
    eye = torch.eye(phi.shape[1], dtype=phi.dtype, device=phi.device)
    chol = torch.linalg.cholesky(eye + scaled.T @ phi)
    v = torch.linalg.solve_triangular(chol, (scaled.T @ y).unsqueeze(-1), upper=False).squeeze(-1)
    return chol, v


class ExactMarginalLikelihood(Objective[BasisGP]):
    """Exact DBK: minimise -(1/n) log p(y) by Woodbury; q(w) set to the exact posterior.

    Full batch: each training step sees the whole training set (the trainer caps it at
    ``TrainConfig.full_batch_max`` rows, drawing a fresh random subset per step when
    larger). :meth:`refresh` sets m, L from eq. (10) on the full training set, in
    chunks, before each validation.
    """

    name = "MML"

    def __init__(self, chunk_size: int = 65536) -> None:
        self.chunk_size = chunk_size

    def __call__(
        self, model: BasisGP, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        phi = model.basis(x)
        return -woodbury_log_marginal(phi, y - model.constant_mean, model.noise(tests)) / y.shape[0]

    @torch.no_grad()
    def refresh(self, model: BasisGP, x: torch.Tensor, y: torch.Tensor, tests: torch.Tensor | None = None) -> None:
        phi = torch.cat([model.basis(chunk) for chunk in x.split(self.chunk_size)])
        mean, factor = exact_posterior(phi, y - model.constant_mean, model.noise(tests))
        model.set_posterior(mean, factor)
