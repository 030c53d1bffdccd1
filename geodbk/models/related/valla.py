"""Variational linearized Laplace (Ortega, Rodriguez Santana, Hernandez-Lobato, "Variational
Linearized Laplace Approximation for Bayesian Deep Learning"), last-layer form.

The predictive mean is a trained network g(x) = head(h(x)) (geodbk's ``dnn`` kind), kept
fixed. Its last-layer Jacobian phi(x) = [h(x), 1] defines the prior kernel of the
linearised model, kappa(x, x') = sigma_0^2 phi(x).phi(x'). VaLLA learns a sparse
covariance with M inducing inputs Z and A = L L^T (M x M)::

    K*(x, x) = kappa(x, x) - kappa(x, Z) (A^{-1} + K_Z)^{-1} kappa(Z, x)
             = kappa(x, x) - ||C^{-1} L^T kappa(Z, x)||^2,     C = chol(I + L^T K_Z L)
    predictive: N(y | g(x), K*(x, x) + sigma^2)

Objective: the black-box alpha energy (alpha = 1 by default, where it is the predictive
log-likelihood) plus the KL of the decoupled-basis sparse GP (the mean term is constant)::

    E_alpha(y_i) = (1/alpha) [ log N(y_i | g(x_i), K*_ii + sigma^2 / alpha) + log C_alpha ]
    C_alpha      = sqrt(2 pi sigma^2 / alpha) / (2 pi sigma^2)^(alpha / 2)
    KL           = 1/2 log|I + L^T K_Z L| - 1/2 tr( K_Z L (I + L^T K_Z L)^{-1} L^T )
    loss / n     = -(1/b) sum_i E_alpha(y_i) + KL / n

Learnable: Z, L (init I), sigma_0 and sigma^2. The network is fitted first by
:func:`prepare_valla` (the ``dnn`` kind's MSE training, with its own early stopping) and is
frozen; Z starts at a random subset of the training inputs (the paper uses k-means);
sigma^2 starts at the network's fitted noise. Early stopping on validation NLL, as the
paper requires, comes from :func:`geodbk.fit.train.fit_arrays`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from geodbk.models.base import GPOutput, Noise, PosteriorFactors, VariationalModel
from geodbk.models.basis_gp import PointNetwork
from geodbk.models.config import ModelConfig
from geodbk.models.expansions import jittered_cholesky
from geodbk.models.objectives import _LOG_2PI, Objective, gaussian_nll


class LastLayerVaLLA(VariationalModel):
    """VaLLA on the last-layer Jacobian of a frozen network.

    Args:
        network: the MAP network (backbone h + linear head); frozen by :meth:`freeze_network`.
        num_inducing: M, the number of inducing inputs Z (M, d).
        noise_init, noise_floor: sigma^2 initial value and lower bound.

    ``forward`` returns a :class:`GPOutput` whose ``phi`` is sigma_0 [h(x), 1] (the
    features of the prior kernel) and whose ``var_f`` is K*(x, x).
    """

    def __init__(
        self, network: PointNetwork, num_inducing: int, noise_init: float = 1e-2, noise_floor: float = 1e-6
    ) -> None:
        super().__init__()
        self.network = network
        self.input_dim = cast(int, network.backbone.input_dim)
        self.num_inducing = num_inducing
        self.inducing = nn.Parameter(torch.rand(num_inducing, self.input_dim) * 2.0 - 1.0)
        self.log_prior_sd = nn.Parameter(torch.zeros(()))
        self.noise = Noise(noise_init, noise_floor)
        self.variational_log_diag = nn.Parameter(torch.zeros(num_inducing))
        self.variational_offdiag = nn.Parameter(torch.zeros(num_inducing, num_inducing))
        self.freeze_network()

    def freeze_network(self) -> None:
        """Stop gradients into the mean network (its weights stay the MAP estimate)."""
        for p in self.network.parameters():
            p.requires_grad_(False)

    @property
    def prior_sd(self) -> torch.Tensor:
        """sigma_0, the prior standard deviation of the last-layer weights."""
        return self.log_prior_sd.exp()

    @property
    def chol_factor(self) -> torch.Tensor:
        """L, (M, M) lower-triangular with a positive diagonal; A = L L^T."""
        return torch.tril(self.variational_offdiag, -1) + torch.diag(self.variational_log_diag.exp())

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """sigma_0 [h(x), 1], (n, h + 1): kappa(x, x') = features(x) . features(x')."""
        with torch.no_grad():
            h = self.network.backbone(x)
        ones = torch.ones(h.shape[0], 1, dtype=h.dtype, device=h.device)
        return self.prior_sd * torch.cat([h, ones], dim=-1)

    def _inducing_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, W): C = chol(I + L^T K_Z L), W = C^{-1} L^T G with K_Z = G G^T."""
        g = self.features(self.inducing)  # (M, P)
        lt_g = self.chol_factor.T @ g  # (M, P)
        eye = torch.eye(self.num_inducing, dtype=g.dtype, device=g.device)
        jitter = 1e-10 if g.dtype == torch.float64 else 1e-6
        chol = jittered_cholesky(eye + lt_g @ lt_g.T, jitter)
        return chol, torch.linalg.solve_triangular(chol, lt_g, upper=False)

    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        with torch.no_grad():
            mean = self.network(x).mean
        phi = self.features(x)
        _, w = self._inducing_terms()
        var_f = (phi.pow(2).sum(-1) - (phi @ w.T).pow(2).sum(-1)).clamp_min(0.0)
        return GPOutput(mean=mean, var_f=var_f, noise=self.noise(), phi=phi)

    def posterior_factors(self, x: torch.Tensor) -> PosteriorFactors:
        """Cov(f(x), f(x')) = kappa(x, x') - (W phi) . (W phi'): the prior features minus
        their projection (see :class:`~geodbk.models.base.PosteriorFactors`)."""
        phi = self.features(x)
        _, w = self._inducing_terms()
        return PosteriorFactors(plus=phi, minus=phi @ w.T)

    def kl_divergence(self) -> torch.Tensor:
        """1/2 log|I + L^T K_Z L| - 1/2 tr(K_Z L (I + L^T K_Z L)^{-1} L^T)."""
        chol, w = self._inducing_terms()
        return torch.log(torch.diagonal(chol)).sum() - 0.5 * w.pow(2).sum()

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, diag: bool = False) -> torch.Tensor:
        """Prior kernel kappa(x1, x2) = sigma_0^2 [h(x1), 1].[h(x2), 1], (n, m); with ``diag``
        kappa(x1, x1) per row, (n,). (The frozen network takes no weight decay.)"""
        phi1 = self.features(x1)
        if diag:
            self.diagonal_only(x2)
            return phi1.pow(2).sum(-1)
        return phi1 @ (phi1 if x2 is None else self.features(x2)).T


class BlackBoxAlpha(Objective[VariationalModel]):
    """VaLLA loss per datum: -(1/b) sum E_alpha(y_i) + KL / n (alpha > 0; 1 = predictive)."""

    name = "BB-alpha"

    def __init__(self, alpha: float = 1.0) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        self.alpha = alpha

    def __call__(
        self, model: VariationalModel, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = model(x, tests)
        a, s2 = self.alpha, out.noise
        log_c = 0.5 * (_LOG_2PI + torch.log(s2) - math.log(a)) - 0.5 * a * (_LOG_2PI + torch.log(s2))
        energy = (-gaussian_nll(y, out.mean, out.var_f + s2 / a) + log_c) / a
        return -energy.mean() + model.kl_divergence() / n


def prepare_valla(
    model: LastLayerVaLLA,
    X: torch.Tensor,
    y: torch.Tensor,
    X_val: torch.Tensor,
    y_val: torch.Tensor,
    model_config: ModelConfig,
    train_config: Any,
    *,
    fit: Callable[..., Any],
) -> None:
    """Fit the mean network by MSE (the ``dnn`` kind) and initialise Z and sigma^2.

    ``X``, ``y`` (and the validation pair) are the standardised training tensors. The
    network takes ``model_config.options["dnn_epochs"]`` epochs (default: the train
    config's epochs) with the same optimiser settings and early stopping. ``fit`` is the
    trainer's ``fit_arrays`` (the trainer passes it in, so the model layer never imports the
    trainer); it must return an object whose ``model`` is the fitted ``dnn`` network.
    """
    from dataclasses import replace

    epochs = int(model_config.options.get("dnn_epochs", train_config.epochs))
    dnn_config = replace(model_config, options={})
    dnn = fit(
        "dnn",
        X.detach().cpu().double().numpy(),
        y.detach().cpu().double().numpy(),
        X_val.detach().cpu().double().numpy(),
        y_val.detach().cpu().double().numpy(),
        model_config=dnn_config,
        train_config=replace(train_config, epochs=epochs, checkpoint_path=None, resume_from=None),
    ).model
    with torch.no_grad():
        # fit_arrays re-standardises y, which is already standardised up to rounding: fold
        # its scaling into the head so the network predicts on the caller's scale.
        y_np = y.detach().cpu().double()
        shift, scale = float(y_np.mean()), float(y_np.std(unbiased=False))
        model.network.load_state_dict(dnn.state_dict())
        model.network.head.weight.mul_(scale)
        model.network.head.bias.mul_(scale).add_(shift)
        model.noise.set_(float(dnn.noise()) * scale**2)
        generator = torch.Generator().manual_seed(train_config.seed)
        order = torch.randperm(len(X), generator=generator)
        pick = order[torch.arange(model.num_inducing) % len(X)]
        model.inducing.copy_(X[pick.to(X.device)])
    model.freeze_network()
