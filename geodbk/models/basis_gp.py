"""The low-rank GP on a deep basis and the plain network baseline.

:class:`BasisGP` is the one model behind every GP row of the comparison: a basis map
``phi = expansion(backbone(x))`` in R^r, a constant mean c, noise sigma^2 and a Gaussian
q(w) = N(m, L L^T) over the basis weights. The objectives in
:mod:`geodbk.models.objectives` differ only in how they score its :class:`GPOutput`.

Predictive distribution (O(r^2) per point after phi):
``mean = <m, phi(x)> + c``, ``var_f = ||L^T phi(x)||^2 (+ c(x))``,
``predictive var = var_f + sigma^2(k)``, where an observation that averages k speed tests
has noise ``sigma^2(k) = sigma0^2 + sigma1^2 / k`` (:class:`Noise`; sigma1 = 0 unless the
test-count term is on), plus ``beta ||B^T phi(x)||^2`` after a conjugate refit that keeps the
trained variance's shape as noise (:mod:`geodbk.models.conjugate`). The tile-mean
distribution, the limit k -> infinity, is ``var_f + sigma0^2 (+ beta ||B^T phi||^2)``: the map
layers use it, coverage on test tiles uses their own k.

Folded prediction. In eval mode without autograd, an expansion with ``features`` and
``fold`` (``phi = features(g) @ T``, see :mod:`geodbk.models.expansions`) is evaluated
through weights precomputed once per fitted model, ``a = T m`` and ``B = T L`` (for the
RBF basis ``a = L_ZZ^{-T} m``, ``B = L_ZZ^{-T} L``): ``mean = features(g)^T a + c`` and
``var_f = ||B^T features(g)||^2``, one matrix product per batch and no triangular solve.
The weights are cached on the model and rebuilt when any parameter changes (in place or
replaced) and after every ``train()``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

from geodbk.models.base import GPOutput, Noise, PosteriorFactors, VariationalModel, ZooModel
from geodbk.models.expansions import FoldingExpansion, InducingExpansion
from geodbk.models.fused import row_squared_norm
from geodbk.models.precision import Precision, matmul_precision


class BasisMap(nn.Module):
    """phi(x) = expansion(backbone(x)): (n, d) -> (n, r)."""

    backbone: nn.Module
    #: One of the expansions of :mod:`geodbk.models.expansions`; their extra methods
    #: (``features``, ``fold``, ``prior_variance``, ...) differ, so it is typed loosely.
    expansion: Any

    def __init__(self, backbone: nn.Module, expansion: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.expansion = expansion
        self.rank: int = cast(int, expansion.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.expansion(self.backbone(x))


class BasisGP(VariationalModel):
    """Low-rank GP ``f(x) = <w, phi(x)> + c`` with q(w) = N(m, L L^T).

    Args:
        basis: the basis map phi with rank r.
        include_residual: add the Nystrom residual c(x) = k(x, x) - ||phi(x)||^2 of an
            inducing-point expansion to var_f (the true SVGP / PPGP of SV-RBF, SV-DKL and
            PP-DKL). Requires an expansion with ``prior_variance``.
        noise_init, noise_floor: sigma^2 initial value and lower bound.
        test_noise: learn the sigma1^2 / k test-count term of :class:`Noise`.

    q(w): m starts at 0; L is lower-triangular with diagonal exp(log_diag), log_diag
    initialised to -0.5 log r, and its r (r - 1) / 2 strictly-lower entries stored as a
    vector initialised N(0, 1) / r.
    """

    basis: BasisMap
    _tril_index: torch.Tensor
    _factor_index: torch.Tensor
    weight_prior_variance: torch.Tensor
    noise_factor: torch.Tensor
    noise_factor_scale: torch.Tensor

    def __init__(
        self,
        basis: BasisMap,
        *,
        include_residual: bool = False,
        noise_init: float = 1e-2,
        noise_floor: float = 1e-6,
        test_noise: bool = False,
    ) -> None:
        super().__init__()
        if include_residual and not isinstance(basis.expansion, InducingExpansion):
            raise TypeError(
                f"{type(basis.expansion).__name__} has no prior variance k(x, x), "
                "so it cannot carry a Nystrom residual"
            )
        r = basis.rank
        self.basis = basis
        self.include_residual = include_residual
        self.constant_mean = nn.Parameter(torch.zeros(()))
        self.noise = Noise(noise_init, noise_floor, per_test=test_noise)
        self.variational_mean = nn.Parameter(torch.zeros(r))
        self.variational_log_diag = nn.Parameter(torch.full((r,), -0.5 * math.log(r)))
        self.variational_offdiag = nn.Parameter(torch.randn(r * (r - 1) // 2) / r)
        self.register_buffer("_tril_index", torch.tril_indices(r, r, -1), persistent=False)
        # L's strictly-lower entries, then its diagonal: the places of cat([offdiag, exp(log_diag)])
        diagonal = torch.arange(r).expand(2, r)
        self.register_buffer("_factor_index", torch.cat([self._tril_index, diagonal], dim=1), persistent=False)
        #: a^2, the prior w ~ N(0, a^2 I_r): 1 while training; set by the conjugate refit
        #: (:mod:`geodbk.models.conjugate`), after which the kernel is a^2 phi . phi'.
        self.register_buffer("weight_prior_variance", torch.ones(()))
        #: B (r, r) and beta: input-dependent tile noise beta ||B^T phi(x)||^2 beside sigma0^2 (zero
        #: unless the conjugate refit keeps the trained q(w)'s variance shape as noise).
        self.register_buffer("noise_factor", torch.zeros(r, r))
        self.register_buffer("noise_factor_scale", torch.zeros(()))
        #: whether beta > 0 (kept on the host, so training and prediction without it pay nothing)
        self.has_noise_factor = False
        self._folded: tuple[tuple[Any, ...], torch.Tensor] | None = None
        #: precision of the backbone's products in folded prediction (not saved with the model)
        self.backbone_precision: Precision = "float32"

    @property
    def rank(self) -> int:
        return self.basis.rank

    @property
    def chol_factor(self) -> torch.Tensor:
        """L, (r, r) lower-triangular with a positive diagonal."""
        rows, cols = self._factor_index
        values = torch.cat([self.variational_offdiag, self.variational_log_diag.exp()])
        return values.new_zeros(self.rank, self.rank).index_put((rows, cols), values)

    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        """Outputs at ``x`` (n, d); ``tests`` (n,) test counts set the per-row noise.

        In eval mode with autograd off, expansions that fold use the cached folded weights
        (module docstring); the result is the same distribution up to rounding. There the
        backbone runs at :attr:`backbone_precision` (:mod:`geodbk.models.precision`).
        """
        expansion = self.basis.expansion
        folded = not self.training and not torch.is_grad_enabled() and isinstance(expansion, FoldingExpansion)
        with matmul_precision(self.backbone_precision if folded else "float32", x.device):
            g = self.basis.backbone(x)
        g = g.to(self.variational_mean.dtype)
        if folded:
            r = self.rank
            projected = expansion.features(g) @ self.folded_weights()  # (n, 1 + r [+ r])
            phi = None
            mean = projected[:, 0] + self.constant_mean
            var_f = projected[:, 1 : r + 1].pow(2).sum(-1)
            sq_norm = projected[:, r + 1 : 2 * r + 1].pow(2).sum(-1) if self.include_residual else None
            noise_part = projected[:, -r:] if self.has_noise_factor else None
        else:
            phi = expansion(g)
            mean = phi @ self.variational_mean + self.constant_mean
            var_f = row_squared_norm(phi @ self.chol_factor)  # ||L^T phi||^2 per row
            sq_norm = row_squared_norm(phi) if self.include_residual else None
            noise_part = phi @ self.noise_factor if self.has_noise_factor else None
        excess = 0.0 if noise_part is None else self.noise_factor_scale * noise_part.pow(2).sum(-1)
        residual = None
        if self.include_residual:
            residual = (expansion.prior_variance(g) - sq_norm).clamp_min(0.0)
            var_f = var_f + residual
        return GPOutput(
            mean=mean, var_f=var_f, noise=self.noise(tests) + excess, phi=phi, residual=residual,
            tile_noise=self.noise() + excess,
        )

    def folded_weights(self) -> torch.Tensor:
        """``T [m | L (| I_r) (| B)]``, (r, 1 + r (+ r) (+ r)): I_r for the Nystrom residual, B when
        the model has an input-dependent noise.

        T is the expansion's fixed map (``phi = features(g) @ T``), so ``features(g)`` times
        these columns gives the mean (without c), ``L^T phi``, ``phi`` itself and ``B^T phi``
        (the input-dependent noise). Cached: rebuilt when a parameter's or buffer's storage or
        version changes, and after ``train()``.
        """
        tensors = itertools.chain(self.parameters(), self.buffers())
        key = (self.has_noise_factor, *((p.data_ptr(), p._version) for p in tensors))
        if self._folded is None or self._folded[0] != key:
            with torch.no_grad():
                columns = [self.variational_mean.unsqueeze(-1), self.chol_factor]
                if self.include_residual:
                    columns.append(torch.eye(self.rank, dtype=columns[1].dtype, device=columns[1].device))
                if self.has_noise_factor:
                    columns.append(self.noise_factor.to(columns[1].dtype))
                self._folded = (key, self.basis.expansion.fold(torch.cat(columns, dim=-1)))
        return self._folded[1]

    def train(self, mode: bool = True) -> BasisGP:
        """Switch train/eval mode; entering train mode drops the cached folded weights (a
        captured CUDA-graph step changes parameters without bumping their versions)."""
        if mode:
            self._folded = None
        return super().train(mode)

    def posterior_factors(self, x: torch.Tensor) -> PosteriorFactors:
        """Cov_q(f(x), f(x')) = (L^T phi) . (L^T phi') (+ the Nystrom residual k - phi . phi'):
        see :class:`PosteriorFactors`; ``x`` (n, d)."""
        g = self.basis.backbone(x)
        phi = self.basis.expansion(g)
        factors = PosteriorFactors(plus=phi @ self.chol_factor)
        if self.include_residual:
            expansion = self.basis.expansion
            factors.minus = phi
            factors.rbf_inputs = g / expansion.log_lengthscale.exp()
            factors.rbf_outputscale = expansion.outputscale
        return factors

    def kl_divergence(self) -> torch.Tensor:
        """KL(N(m, L L^T) || N(0, a^2 I_r)) = 0.5 ((||m||^2 + ||L||_F^2) / a^2 - log|L L^T| + r log a^2 - r)
        (a^2 = 1 while training)."""
        m, a2 = self.variational_mean, self.weight_prior_variance
        log_diag = self.variational_log_diag
        # ||L||_F^2 from L's entries, without building L: strictly-lower squares plus exp(log_diag)^2
        frobenius = self.variational_offdiag.pow(2).sum() + (2.0 * log_diag).exp().sum()
        log_det = 2.0 * log_diag.sum()
        return 0.5 * ((m.pow(2).sum() + frobenius) / a2 - log_det + self.rank * torch.log(a2) - self.rank)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Model files written before the conjugate refit have no a^2 (1 there) and no noise factor (0)."""
        state_dict.setdefault(prefix + "weight_prior_variance", torch.ones(()))
        state_dict.setdefault(prefix + "noise_factor", torch.zeros(self.rank, self.rank))
        state_dict.setdefault(prefix + "noise_factor_scale", torch.zeros(()))
        self.has_noise_factor = bool(state_dict[prefix + "noise_factor_scale"] > 0)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.no_grad()
    def set_noise_factor(self, factor: torch.Tensor, scale: float) -> None:
        """Input-dependent tile noise ``scale * ||factor^T phi(x)||^2`` beside sigma0^2: factor (r, r)."""
        self.noise_factor.copy_(factor)
        self.noise_factor_scale.fill_(scale)
        self.has_noise_factor = scale > 0

    @torch.no_grad()
    def set_posterior(self, mean: torch.Tensor, cov_factor: torch.Tensor) -> None:
        """Overwrite q(w) with N(mean, cov_factor cov_factor^T); cov_factor lower-triangular."""
        self.variational_mean.copy_(mean)
        self.variational_log_diag.copy_(torch.diagonal(cov_factor).log())
        rows, cols = self._tril_index
        self.variational_offdiag.copy_(cov_factor[rows, cols])

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, diag: bool = False) -> torch.Tensor:
        """Prior kernel k(x1, x2), (n, m), or with ``diag`` its diagonal k(x1, x1), (n,) in O(n r)
        (see :meth:`~geodbk.models.base.KernelModel.kernel`).

        ``a^2 phi(x1).phi(x2)`` for a deep basis (a^2 = :attr:`weight_prior_variance`); for
        models with the Nystrom residual this is the full base kernel k(g(x1), g(x2)) that
        the SVGP approximates.
        """
        if diag:
            self.diagonal_only(x2)
        if self.include_residual:
            expansion, backbone = self.basis.expansion, self.basis.backbone
            g1 = backbone(x1)
            if diag:
                return expansion.prior_variance(g1)
            return expansion.base_kernel(g1, g1 if x2 is None else backbone(x2))
        phi1 = self.basis(x1)
        if diag:
            return self.weight_prior_variance * phi1.pow(2).sum(-1)
        return self.weight_prior_variance * phi1 @ (phi1 if x2 is None else self.basis(x2)).T

    def backbone_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters that take weight decay (the backbone network only)."""
        return self.basis.backbone.parameters()


class PointNetwork(ZooModel):
    """The DNN baseline: backbone + linear head, with a fitted homoscedastic noise.

    ``forward`` returns a :class:`GPOutput` with var_f = 0, so the predictive
    distribution is N(head(g(x)), sigma^2). The noise stays homoscedastic: the MSE
    objective sets sigma^2 to the training MSE and has no likelihood to learn a
    test-count term from. It is not a GP, so it is a
    :class:`~geodbk.models.base.ZooModel` without a kernel.
    """

    def __init__(self, backbone: nn.Module, noise_init: float = 1e-2, noise_floor: float = 1e-6) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(cast(int, backbone.output_dim), 1)
        self.noise = Noise(noise_init, noise_floor)

    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        mean = self.head(self.backbone(x)).squeeze(-1)
        return GPOutput(mean=mean, var_f=torch.zeros_like(mean), noise=self.noise())

    def backbone_parameters(self) -> Iterator[nn.Parameter]:
        return self.backbone.parameters()
