"""Fixed-basis expansions of the Gaussian kernel for Deep Fourier / Deep Mercer GPs.

Both layers approximate the ARD Gaussian (RBF) kernel on a low-dimensional embedding z:

    k(z, z') = s^2 exp(-0.5 sum_j (z_j - z'_j)^2 / l_j^2)

* :class:`RandomFourierExpansion` (DFGP): r/2 frequencies omega = eps / l with eps ~ N(0, I)
  drawn once and kept fixed, ``phi(z) = s sqrt(2/r) [cos(omega^T z), sin(omega^T z)]``;
  E[phi(z).phi(z')] = k(z, z') and ||phi(z)||^2 = s^2 exactly.
* :class:`MercerExpansion` (DMGP): the truncated Mercer (Hermite) eigen-expansion of the
  Gaussian kernel under the standard-normal measure (alpha = 1/sqrt(2)), m eigenfunctions
  per dimension and their tensor product, r = m^d.

Convention for the Mercer formulas. They are written for ``exp(-eps^2 (z - z')^2)``; the
kernel above has ``eps_j^2 = 1 / (2 l_j^2)``. Per dimension, with alpha = 1/sqrt(2),

    beta    = (1 + (2 eps / alpha)^2)^(1/4),   delta^2 = alpha^2 (beta^2 - 1) / 2
    e_n(z)  = sqrt(beta / (2^n n!)) exp(-delta^2 z^2) H_n(alpha beta z)      (n = 0, 1, ...)
    lambda_n = sqrt(alpha^2 / (alpha^2 + delta^2 + eps^2))
               * (eps^2 / (alpha^2 + delta^2 + eps^2))^n

and phi_n(z) = s sqrt(lambda_n) e_n(z). The normalised Hermite functions are evaluated by
their stable three-term recurrence (never through H_n itself, which overflows).

:class:`StandardizedEmbedding` is the backbone wrapper that produces z: a linear map from
the backbone's width h to d, standardised per dimension (batch statistics while training,
running statistics in eval mode), as the DMGP paper standardises the network outputs.
:class:`EmbeddingExactMML` is the exact-marginal-likelihood objective that keeps those
statistics consistent between the exact posterior and prediction.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from geodbk.models.basis_gp import BasisGP
from geodbk.models.expansions import ard_rbf
from geodbk.models.objectives import ExactMarginalLikelihood

#: The Gaussian measure of the Mercer expansion: rho(z) = alpha/sqrt(pi) exp(-alpha^2 z^2).
MERCER_ALPHA = 1.0 / math.sqrt(2.0)


class RandomFourierExpansion(nn.Module):
    """Random Fourier features of the ARD RBF kernel with fixed base frequencies.

    Args:
        input_dim: d, the embedding width.
        rank: r, the number of features (even; r/2 frequencies).
        seed: seed for the fixed base frequencies eps ~ N(0, I) (stored as a buffer, so
            they are saved with the model and never trained).

    Learnable: ARD lengthscales l (init 1, stored as logs) and the outputscale s^2 (init 1).
    Shapes: ``(n, d) -> (n, r)``.
    """

    base_frequencies: torch.Tensor  # buffer, (r/2, d)

    def __init__(self, input_dim: int, rank: int, seed: int | None = 0) -> None:
        super().__init__()
        if rank < 2 or rank % 2:
            raise ValueError(f"random Fourier features need an even rank >= 2, got {rank}")
        self.input_dim = input_dim
        self.output_dim = rank
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self.register_buffer("base_frequencies", torch.randn(rank // 2, input_dim, generator=gen))
        self.log_lengthscale = nn.Parameter(torch.zeros(input_dim))
        self.log_outputscale = nn.Parameter(torch.zeros(()))

    @property
    def outputscale(self) -> torch.Tensor:
        """s^2."""
        return self.log_outputscale.exp()

    def frequencies(self) -> torch.Tensor:
        """omega = eps / l, (r/2, d)."""
        return self.base_frequencies / self.log_lengthscale.exp()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        proj = z @ self.frequencies().T  # (n, r/2)
        scale = (self.outputscale * 2.0 / self.output_dim).sqrt()
        return scale * torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1)

    def base_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The exact ARD RBF kernel that the features approximate: (n, k)."""
        return ard_rbf(a, b, self.log_lengthscale.exp(), self.outputscale)

    def prior_variance(self, z: torch.Tensor) -> torch.Tensor:
        """k(z, z) = s^2 for every row: (n,)."""
        return self.outputscale.expand(z.shape[0])


def mercer_eigenpairs(
    z: torch.Tensor, lengthscale: torch.Tensor, n_eig: int, alpha: float = MERCER_ALPHA
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension Mercer eigenfunctions and eigenvalues of exp(-0.5 (z - z')^2 / l^2).

    Args:
        z: (n, d) inputs.
        lengthscale: (d,) positive lengthscales.
        n_eig: m, eigenpairs per dimension.
        alpha: scale of the Gaussian measure.

    Returns:
        e: (n, d, m) eigenfunctions e_k(z_j), k = 0..m-1.
        lam: (d, m) eigenvalues lambda_k for each dimension.
    """
    eps2 = 0.5 / lengthscale.pow(2)  # (d,)
    a2 = alpha * alpha
    beta = (1.0 + 4.0 * eps2 / a2).pow(0.25)
    delta2 = 0.5 * a2 * (beta.pow(2) - 1.0)
    t = alpha * beta * z  # (n, d)
    rows = [beta.sqrt().expand_as(z)]
    if n_eig > 1:
        rows.append(math.sqrt(2.0) * t * rows[0])
    for k in range(1, n_eig - 1):
        rows.append(t * math.sqrt(2.0 / (k + 1)) * rows[k] - math.sqrt(k / (k + 1)) * rows[k - 1])
    hermite = torch.stack(rows, dim=-1)  # (n, d, m)
    e = torch.exp(-delta2 * z.pow(2)).unsqueeze(-1) * hermite
    denom = a2 + delta2 + eps2  # (d,)
    powers = torch.arange(n_eig, dtype=z.dtype, device=z.device)
    lam = (a2 / denom).sqrt().unsqueeze(-1) * (eps2 / denom).unsqueeze(-1).pow(powers)
    return e, lam


class MercerExpansion(nn.Module):
    """Truncated Mercer (Hermite) features of the ARD Gaussian kernel, r = m^d.

    Args:
        input_dim: d, the embedding width (keep it small: the rank grows as m^d).
        per_dim: m, eigenfunctions per dimension.

    Inputs are expected to be roughly standardised (the measure is N(0, 1/(2 alpha^2)) =
    N(0, 1)); the expansion is exact in the limit m -> inf for any z but converges fastest
    near the origin. Learnable: lengthscales (init 1) and outputscale s^2 (init 1).
    Shapes: ``(n, d) -> (n, m^d)``; feature index = the row-major multi-index (n_1..n_d).
    """

    def __init__(self, input_dim: int, per_dim: int) -> None:
        super().__init__()
        if per_dim < 1:
            raise ValueError(f"per_dim must be >= 1, got {per_dim}")
        self.input_dim = input_dim
        self.per_dim = per_dim
        self.output_dim = per_dim**input_dim
        self.log_lengthscale = nn.Parameter(torch.zeros(input_dim))
        self.log_outputscale = nn.Parameter(torch.zeros(()))

    @property
    def outputscale(self) -> torch.Tensor:
        """s^2."""
        return self.log_outputscale.exp()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        e, lam = mercer_eigenpairs(z, self.log_lengthscale.exp(), self.per_dim)
        per_dim = e * lam.sqrt()  # (n, d, m)
        phi = per_dim[:, 0, :]
        for j in range(1, self.input_dim):
            phi = (phi.unsqueeze(-1) * per_dim[:, j, :].unsqueeze(1)).flatten(1)
        return self.outputscale.sqrt() * phi

    @torch.no_grad()
    def eigenvalues(self) -> torch.Tensor:
        """(m^d,) eigenvalues s^2 prod_j lambda_{n_j}, in feature order."""
        dummy = torch.zeros(1, self.input_dim, dtype=self.log_lengthscale.dtype)
        _, lam = mercer_eigenpairs(dummy, self.log_lengthscale.exp(), self.per_dim)
        values = lam[0]
        for j in range(1, self.input_dim):
            values = (values.unsqueeze(-1) * lam[j].unsqueeze(0)).flatten()
        return self.outputscale * values

    def base_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The exact ARD RBF kernel that the expansion truncates: (n, k)."""
        return ard_rbf(a, b, self.log_lengthscale.exp(), self.outputscale)


class StandardizedEmbedding(nn.Module):
    """z = standardise(W g(x) + b): a backbone followed by a low-dimensional embedding.

    Args:
        backbone: network g with ``output_dim`` h.
        embed_dim: d, the width of z (1 for DMGP, 4 for DFGP in the paper).
        standardize: standardise each coordinate of z (BatchNorm without affine terms:
            batch statistics in training, running averages in eval mode).

    Shapes: ``(n, D) -> (n, d)``.
    """

    def __init__(self, backbone: nn.Module, embed_dim: int, standardize: bool = True) -> None:
        super().__init__()
        self.backbone = backbone
        self.input_dim = backbone.input_dim
        self.output_dim = embed_dim
        self.project = nn.Linear(cast(int, backbone.output_dim), embed_dim)
        self.standardize = nn.BatchNorm1d(embed_dim, affine=False) if standardize else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.standardize(self.project(self.backbone(x)))


class EmbeddingExactMML(ExactMarginalLikelihood):
    """Exact marginal likelihood (Woodbury) for a basis on a :class:`StandardizedEmbedding`.

    Training steps are the core's full-batch MML. :meth:`refresh` first sets the
    embedding's standardisation to the statistics of the whole training set, then computes
    the exact weight posterior in eval mode, so prediction uses the same z as the posterior.
    """

    @torch.no_grad()
    def refresh(self, model: BasisGP, x: torch.Tensor, y: torch.Tensor, tests: torch.Tensor | None = None) -> None:
        embedding = model.basis.backbone
        assert isinstance(embedding, StandardizedEmbedding)  # the dfgp and dmgp builders put it there
        was_training = model.training
        model.eval()
        if isinstance(embedding.standardize, nn.BatchNorm1d):
            raw = torch.cat([embedding.project(embedding.backbone(c)) for c in x.split(self.chunk_size)])
            running_mean, running_var = embedding.standardize.running_mean, embedding.standardize.running_var
            assert running_mean is not None and running_var is not None  # track_running_stats is on
            running_mean.copy_(raw.mean(0))
            running_var.copy_(raw.var(0, unbiased=False))
        super().refresh(model, x, y, tests)
        model.train(was_training)
