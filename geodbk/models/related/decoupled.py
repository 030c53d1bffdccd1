"""Decoupled-conditional SVGP (Zhu, Wu, Maus, Gardner, Bindel, "Variational Gaussian
Processes with Decoupled Conditionals"): DCSVGP and its predictive-likelihood twin DCPPGP.

Two RBF kernels share the inducing points Z (M, d) and the outputscale s^2 but not the
lengthscale: the *mean* kernel Q (l_mean) and the *covariance* kernel K (l_covar).
With Q-whitening (the paper's default), q(u_bar) = N(m_bar, S_bar), S_bar = L_S L_S^T::

    phi_Q(x)   = L_Q^{-1} Q_Zx                         (L_Q = chol Q_ZZ)
    mu(x)      = phi_Q(x)^T m_bar + c
    var_f(x)   = Ktilde_xx + ||L_S^T phi_Q(x)||^2,      Ktilde_xx = K_xx - K_xZ K_ZZ^{-1} K_Zx
    KL         = KL(N(m_bar, S_bar) || N(0, Kbar)),     Kbar = L_Q^{-1} K_ZZ L_Q^{-T}
    Omega_b    = 1/2 ||L_s^{-1} D L_S||_F^2 + 1/2 ||L_s^{-1} D m_bar||^2     (batch only)
                 D = Q_bZ L_Q^{-T} - K_bZ K_ZZ^{-1} L_Q,   L_s = chol(Ktilde_bb)

Loss per datum (the authors' implementation: Omega on the batch, not rescaled by n/b)::

    DCSVGP: (1/b) sum [-log N(y; mu, s2) + var_f / (2 s2)] + (beta1 KL + beta2 Omega_b) / n
    DCPPGP: (1/b) sum  -log N(y; mu, var_f + s2)           + (beta1 KL + beta2 Omega_b) / n

beta2 = 1e-3 by default (the paper's main tables); beta2 -> inf recovers SVGP.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from geodbk.models.base import GPOutput, Noise, PosteriorFactors, VariationalModel
from geodbk.models.expansions import ard_rbf, default_jitter, jittered_cholesky
from geodbk.models.objectives import Objective, gaussian_nll


class DecoupledSVGP(VariationalModel):
    """Inducing-point GP with decoupled mean / covariance lengthscales on raw inputs.

    Args:
        input_dim: d.
        num_inducing: M, inducing points initialised U[-1, 1]^d (inputs scaled to [-1, 1]).
        ard: one lengthscale per input dimension (``False``: one shared lengthscale per
            kernel, as in the paper's main results).
        lengthscale_init: initial l_mean = l_covar (default sqrt(d)).
        jitter: relative diagonal jitter on Q_ZZ, K_ZZ and Ktilde_bb (``None``: 1e-4 in
            float32, 1e-6 in float64).
        noise_init, noise_floor: sigma^2 initial value and lower bound.

    q(u_bar): m_bar = 0, L_S = I at initialisation.
    """

    #: The Omega term's weight, read by :class:`DecoupledELBO` when its ``beta2`` is None;
    #: the zoo builder sets it from ``ModelConfig.options["beta2"]``.
    omega_weight: float = 1e-3

    def __init__(
        self,
        input_dim: int,
        num_inducing: int,
        *,
        ard: bool = False,
        lengthscale_init: float | None = None,
        jitter: float | None = None,
        noise_init: float = 1e-2,
        noise_floor: float = 1e-6,
    ) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.num_inducing = num_inducing
        self.jitter = jitter
        n_scales = input_dim if ard else 1
        log_l = math.log(lengthscale_init if lengthscale_init is not None else math.sqrt(input_dim))
        self.inducing = nn.Parameter(torch.rand(num_inducing, input_dim) * 2.0 - 1.0)
        self.log_lengthscale_mean = nn.Parameter(torch.full((n_scales,), log_l))
        self.log_lengthscale_covar = nn.Parameter(torch.full((n_scales,), log_l))
        self.log_outputscale = nn.Parameter(torch.zeros(()))
        self.constant_mean = nn.Parameter(torch.zeros(()))
        self.noise = Noise(noise_init, noise_floor)
        self.variational_mean = nn.Parameter(torch.zeros(num_inducing))
        self.variational_log_diag = nn.Parameter(torch.zeros(num_inducing))
        self.variational_offdiag = nn.Parameter(torch.zeros(num_inducing, num_inducing))

    # --- kernels ---------------------------------------------------------------------------
    @property
    def outputscale(self) -> torch.Tensor:
        return self.log_outputscale.exp()

    def mean_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Q(a, b), (n, k)."""
        return ard_rbf(a, b, self.log_lengthscale_mean.exp(), self.outputscale)

    def covar_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """K(a, b), (n, k): the prior kernel of the model."""
        return ard_rbf(a, b, self.log_lengthscale_covar.exp(), self.outputscale)

    def _jitter(self) -> float:
        rel = self.jitter if self.jitter is not None else default_jitter(self.inducing.dtype)
        return rel * float(self.outputscale.detach())

    @property
    def chol_factor(self) -> torch.Tensor:
        """L_S, (M, M) lower-triangular root of S_bar with a positive diagonal."""
        return torch.tril(self.variational_offdiag, -1) + torch.diag(self.variational_log_diag.exp())

    def _inducing_cholesky(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(L_Q, L_K): lower Cholesky factors of the jittered Q_ZZ and K_ZZ."""
        z = self.inducing
        chol_q = jittered_cholesky(self.mean_kernel(z, z), self._jitter())
        chol_k = jittered_cholesky(self.covar_kernel(z, z), self._jitter())
        return chol_q, chol_k

    def _terms(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = self.inducing
        chol_q, chol_k = self._inducing_cholesky()
        phi_q = torch.linalg.solve_triangular(chol_q, self.mean_kernel(z, x), upper=False).T  # (b, M)
        a_k = torch.linalg.solve_triangular(chol_k, self.covar_kernel(z, x), upper=False)  # (M, b)
        ktilde = (self.outputscale - a_k.pow(2).sum(0)).clamp_min(0.0)
        return {"chol_q": chol_q, "chol_k": chol_k, "phi_q": phi_q, "a_k": a_k, "ktilde": ktilde}

    # --- model -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        return self._output(self._terms(x))

    def _output(self, t: dict[str, torch.Tensor]) -> GPOutput:
        phi_q = t["phi_q"]
        mean = phi_q @ self.variational_mean + self.constant_mean
        var_f = t["ktilde"] + (phi_q @ self.chol_factor).pow(2).sum(-1)
        return GPOutput(mean=mean, var_f=var_f, noise=self.noise(), phi=phi_q, residual=t["ktilde"])

    def posterior_factors(self, x: torch.Tensor) -> PosteriorFactors:
        """Cov(f(x), f(x')) = K(x, x') - a_K . a_K' + (L_S^T phi_Q) . (L_S^T phi_Q'), with
        a_K = L_K^{-1} K_Zx: see :class:`~geodbk.models.base.PosteriorFactors`."""
        t = self._terms(x)
        return PosteriorFactors(
            plus=t["phi_q"] @ self.chol_factor,
            minus=t["a_k"].T,
            rbf_inputs=x / self.log_lengthscale_covar.exp(),
            rbf_outputscale=self.outputscale,
        )

    def kl_divergence(self) -> torch.Tensor:
        """KL(N(m_bar, S_bar) || N(0, Kbar)) with Kbar = B B^T, B = L_Q^{-1} L_K."""
        return self._kl(*self._inducing_cholesky())

    def _kl(self, chol_q: torch.Tensor, chol_k: torch.Tensor) -> torch.Tensor:
        b = torch.linalg.solve_triangular(chol_q, chol_k, upper=False)  # lower-triangular
        ls = self.chol_factor
        trace = torch.linalg.solve_triangular(b, ls, upper=False).pow(2).sum()
        maha = torch.linalg.solve_triangular(b, self.variational_mean.unsqueeze(-1), upper=False).pow(2).sum()
        log_det_kbar = 2.0 * torch.log(torch.diagonal(b).abs()).sum()
        log_det_s = 2.0 * self.variational_log_diag.sum()
        return 0.5 * (trace + maha - self.num_inducing + log_det_kbar - log_det_s)

    def omega(self, x: torch.Tensor, terms: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The decoupling penalty Omega on the batch ``x`` (b, d): a scalar."""
        t = terms if terms is not None else self._terms(x)
        chol_q, chol_k, a_k = t["chol_q"], t["chol_k"], t["a_k"]
        k_bb = self.covar_kernel(x, x) - a_k.T @ a_k
        chol_s = jittered_cholesky(0.5 * (k_bb + k_bb.T), self._jitter())
        proj = torch.linalg.solve_triangular(chol_k, chol_q, upper=False)  # L_K^{-1} L_Q
        delta = t["phi_q"] - a_k.T @ proj  # (b, M) = A_b L_Q
        rhs = torch.cat([delta @ self.chol_factor, (delta @ self.variational_mean).unsqueeze(-1)], dim=-1)
        return 0.5 * torch.linalg.solve_triangular(chol_s, rhs, upper=False).pow(2).sum()

    def loss_terms(self, x: torch.Tensor) -> tuple[GPOutput, torch.Tensor, torch.Tensor]:
        """(output, KL, Omega_b) for a batch, sharing one set of Cholesky factors."""
        t = self._terms(x)
        return self._output(t), self._kl(t["chol_q"], t["chol_k"]), self.omega(x, t)

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, diag: bool = False) -> torch.Tensor:
        """The prior (covariance) kernel K(x1, x2), (n, m); with ``diag`` its diagonal, s^2 for
        every row of x1 (a stationary kernel), (n,). No network, so nothing takes weight decay."""
        if diag:
            self.diagonal_only(x2)
            return self.outputscale.expand(x1.shape[0])
        return self.covar_kernel(x1, x1 if x2 is None else x2)


class DecoupledELBO(Objective[DecoupledSVGP]):
    """DCSVGP (``predictive=False``) or DCPPGP (``predictive=True``) loss per datum.

    Args:
        beta1: KL weight (1).
        beta2: Omega weight; ``None`` reads the model's ``omega_weight`` (1e-3 unless the zoo
            builder set it from ``ModelConfig.options["beta2"]``).
        predictive: use the PPGP predictive likelihood instead of the ELBO data term.
    """

    def __init__(self, beta1: float = 1.0, beta2: float | None = None, predictive: bool = False) -> None:
        self.beta1 = beta1
        self.beta2 = beta2
        self.predictive = predictive

    @property
    def name(self) -> str:  # type: ignore[override]
        return "DCPPGP" if self.predictive else "DCSVGP"

    def __call__(
        self, model: DecoupledSVGP, x: torch.Tensor, y: torch.Tensor, n: int, tests: torch.Tensor | None = None
    ) -> torch.Tensor:
        out, kl, omega = model.loss_terms(x)
        if self.predictive:
            fit = gaussian_nll(y, out.mean, out.predictive_var)
        else:
            fit = gaussian_nll(y, out.mean, out.noise) + out.var_f / (2.0 * out.noise)
        beta2 = self.beta2 if self.beta2 is not None else model.omega_weight
        return fit.mean() + (self.beta1 * kl + beta2 * omega) / n
