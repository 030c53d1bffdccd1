"""SVDBK: the weight-space SVI deep basis kernel GP with the variance correction of the
earlier DBK paper (Zhu, Yuchi, Xie, "Scalable Gaussian Processes with Low-Rank Deep Kernel
Decomposition", section 3.3).

Basis: ResNet backbone + a linear output layer (in that paper the r basis functions are the
network's last layer). Weights q(w) = N(m, L L^T) as in :class:`~geodbk.models.BasisGP`.

Objective per datum, for a batch of b points from a training set of size n
(eq. 9 minus the mini-batch trace regulariser, divided by n)::

    (1/b) sum_i [ -log N(y_i; mu_i, s2) + ||L^T phi_i||^2 / (2 s2) ]
  + (1/b) sum_i ( k_b - ||phi_i||^2 ) / (2 s2)          k_b = max_{j in batch} ||phi_j||^2
  + KL(N(m, L L^T) || N(0, I_r)) / n

The trace coefficient is fixed at 1/(2 s2) (no alpha knob in that paper).

Prediction adds the diagonal correction
``c(x*) = max(max_train ||phi||^2, ||phi(x*)||^2) - ||phi(x*)||^2`` to the function variance.
``max_train ||phi||^2`` is stored in the buffer ``max_train_sq_norm`` by
:meth:`SVDBKELBO.refresh`, one pass over the training set before every validation, so the
checkpoint kept by early stopping carries the value that matches its weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from geodbk.models.base import GPOutput, PosteriorFactors
from geodbk.models.basis_gp import BasisGP, BasisMap
from geodbk.models.objectives import Objective, gaussian_nll


class LinearExpansion(nn.Module):
    """phi(g) = W g + b: the network's last layer as the basis, ``(n, h) -> (n, r)``.

    The weights are initialised with standard deviation 1 / sqrt(h r), so that ||phi||^2
    starts at O(1) for an O(1)-per-unit representation g.
    """

    def __init__(self, input_dim: int, rank: int) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = rank
        self.linear = nn.Linear(input_dim, rank)
        with torch.no_grad():
            self.linear.weight.normal_(0.0, 1.0 / math.sqrt(input_dim * rank))
            self.linear.bias.zero_()

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return self.linear(g)


class CorrectedBasisGP(BasisGP):
    """A :class:`BasisGP` whose predictive variance carries the DBK diagonal correction.

    In eval mode ``var_f = ||L^T phi||^2 + c(x)`` with
    ``c(x) = max(max_train_sq_norm, ||phi(x)||^2) - ||phi(x)||^2`` (also returned as
    ``GPOutput.residual``); in training mode the output is the plain BasisGP one, which
    the SVDBK objective scores.

    Args:
        basis: the basis map phi.
        correct: apply the correction at prediction (``False`` = the paper's "-c" ablation).
        noise_init, noise_floor, test_noise: as for :class:`BasisGP`.
    """

    max_train_sq_norm: torch.Tensor  # buffer, ()

    def __init__(
        self,
        basis: BasisMap,
        *,
        correct: bool = True,
        noise_init: float = 1e-2,
        noise_floor: float = 1e-6,
        test_noise: bool = False,
    ) -> None:
        super().__init__(basis, noise_init=noise_init, noise_floor=noise_floor, test_noise=test_noise)
        self.correct = correct
        self.register_buffer("max_train_sq_norm", torch.zeros(()))

    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        out = super().forward(x, tests)
        if self.correct and not self.training:
            assert out.phi is not None  # a BasisGP leaves phi out only for expansions that fold
            sq_norm = out.phi.pow(2).sum(-1)
            correction = torch.clamp(self.max_train_sq_norm - sq_norm, min=0.0)
            out.var_f = out.var_f + correction
            out.residual = correction
        return out

    def posterior_factors(self, x: torch.Tensor) -> PosteriorFactors:
        """The BasisGP factors plus, in eval mode, the correction c(x) as an independent diagonal."""
        factors = super().posterior_factors(x)
        if self.correct and not self.training:
            sq_norm = self.basis(x).pow(2).sum(-1)
            factors.diagonal = torch.clamp(self.max_train_sq_norm - sq_norm, min=0.0)
        return factors

    @torch.no_grad()
    def set_max_train_sq_norm(self, x: torch.Tensor, chunk_size: int = 65536) -> None:
        """Store max_i ||phi(x_i)||^2 over the training inputs ``x`` (n, d)."""
        best = max(float(self.basis(chunk).pow(2).sum(-1).max()) for chunk in x.split(chunk_size))
        self.max_train_sq_norm.fill_(best)


class SVDBKELBO(Objective[CorrectedBasisGP]):
    """Negative SVDBK objective per datum (ELBO eq. 9 + the trace regulariser, see module doc).

    ``refresh`` stores max_train ||phi||^2 in the model for the prediction correction.

    Args:
        trace: include the trace regulariser (``False``: plain ELBO eq. 9, the "-c" ablation).
        chunk_size: rows per chunk in the pass over the training set.
    """

    name = "SVDBK"

    def __init__(self, trace: bool = True, chunk_size: int = 65536) -> None:
        self.trace = trace
        self.chunk_size = chunk_size

    def __call__(
        self, model: CorrectedBasisGP, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = model(x, tests)
        fit = gaussian_nll(y, out.mean, out.noise) + out.var_f / (2.0 * out.noise)
        loss = fit.mean() + model.kl_divergence() / n
        if self.trace:
            assert out.phi is not None  # a basis model in training returns its basis values
            sq_norm = out.phi.pow(2).sum(-1)
            loss = loss + ((sq_norm.max() - sq_norm) / (2.0 * out.noise)).mean()
        return loss

    def refresh(
        self, model: CorrectedBasisGP, x: torch.Tensor, y: torch.Tensor, tests: torch.Tensor | None = None
    ) -> None:
        model.set_max_train_sq_norm(x, self.chunk_size)
