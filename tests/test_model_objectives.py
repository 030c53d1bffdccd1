"""Objectives against direct, independently written evaluations of their formulas."""

import math

import pytest
import torch
from torch.distributions import MultivariateNormal, Normal, kl_divergence

from geodbk.models import (
    DPPGP,
    PPGP,
    SVGPELBO,
    VBLLELBO,
    ExactMarginalLikelihood,
    ModelConfig,
    exact_posterior,
    get_model_spec,
    woodbury_log_marginal,
)
from geodbk.models.config import TrainConfig

N_TOTAL = 500  # the notional training-set size n in the KL weights


def _model(kind, d=3, seed=0):
    torch.manual_seed(seed)
    model = get_model_spec(kind).build(d, ModelConfig(hidden=8, rank=6, dtype="float64")).double()
    if kind == "dnn":
        return model
    with torch.no_grad():  # move q(w) and the mean away from their init so every term matters
        model.variational_mean.normal_(0, 0.5)
        model.variational_offdiag.normal_(0, 0.3)
        model.variational_log_diag.normal_(-0.5, 0.2)
        model.constant_mean.fill_(0.3)
        model.noise.set_(0.2)
    return model


def _batch(d=3, b=17, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, d, generator=g, dtype=torch.float64) * 2 - 1, torch.randn(b, generator=g, dtype=torch.float64)


def _reference_terms(model, x):
    """phi, mean, ||L^T phi||^2, sigma^2 and KL computed without the model's forward."""
    phi = model.basis(x)
    L = torch.tril(model.chol_factor)
    mean = phi @ model.variational_mean + model.constant_mean
    var_f = torch.einsum("ni,ij,nj->n", phi, L @ L.T, phi)
    noise = model.noise()
    r = phi.shape[1]
    kl = kl_divergence(
        MultivariateNormal(model.variational_mean, scale_tril=L),
        MultivariateNormal(torch.zeros(r, dtype=phi.dtype), torch.eye(r, dtype=phi.dtype)),
    )
    return phi, mean, var_f, noise, kl


def _nystrom_residual(model, x):
    exp = model.basis.expansion
    g = model.basis.backbone(x)
    kzz = exp.base_kernel(exp.inducing, exp.inducing)
    jitter = 1e-6 * float(exp.outputscale)
    kzz = kzz + jitter * torch.eye(len(kzz), dtype=kzz.dtype)
    kz = exp.base_kernel(exp.inducing, g)
    q = (kz * torch.linalg.solve(kzz, kz)).sum(0)
    return exp.outputscale - q


def test_dppgp_matches_formula():
    model, (x, y) = _model("dbk-silu"), _batch()
    alpha, beta = 0.3, 0.05
    phi, mean, var_f, noise, kl = _reference_terms(model, x)
    sq = (phi**2).sum(1)
    expected = (
        -Normal(mean, (var_f + noise).sqrt()).log_prob(y).mean()
        + alpha * ((sq.max() - sq) / (2 * noise)).mean()
        + beta / N_TOTAL * kl
    )
    got = DPPGP(alpha, beta)(model, x, y, N_TOTAL)
    assert float(got) == pytest.approx(float(expected), rel=1e-10)


def test_svgp_matches_formula_with_nystrom_residual():
    model, (x, y) = _model("sv-dkl"), _batch()
    phi, mean, var_f, noise, kl = _reference_terms(model, x)
    var_tilde = var_f + _nystrom_residual(model, x)
    expected = (-Normal(mean, noise.sqrt()).log_prob(y) + var_tilde / (2 * noise)).mean() + kl / N_TOTAL
    got = SVGPELBO()(model, x, y, N_TOTAL)
    assert float(got) == pytest.approx(float(expected), rel=1e-8)
    assert float(model(x).residual.min()) >= 0.0


def test_ppgp_matches_formula_with_nystrom_residual():
    model, (x, y) = _model("pp-dkl"), _batch()
    phi, mean, var_f, noise, kl = _reference_terms(model, x)
    var_tilde = var_f + _nystrom_residual(model, x)
    expected = -Normal(mean, (var_tilde + noise).sqrt()).log_prob(y).mean() + 0.07 / N_TOTAL * kl
    got = PPGP(beta=0.07)(model, x, y, N_TOTAL)
    assert float(got) == pytest.approx(float(expected), rel=1e-8)


def test_vbll_matches_formula():
    model, (x, y) = _model("vbll"), _batch()
    phi, mean, var_f, noise, kl = _reference_terms(model, x)
    expected = (-Normal(mean, noise.sqrt()).log_prob(y) + var_f / (2 * noise)).mean() + kl / N_TOTAL
    got = VBLLELBO()(model, x, y, N_TOTAL)
    assert float(got) == pytest.approx(float(expected), rel=1e-10)


@pytest.mark.parametrize("kind", ["dbk-rbf", "dbk-silu", "exact-dbk", "sv-rbf", "sv-dkl", "pp-dkl", "vbll", "dnn"])
def test_gradients_reach_every_parameter(kind):
    model, (x, y) = _model(kind), _batch()
    loss = get_model_spec(kind).objective(TrainConfig())(model, x, y, N_TOTAL)
    loss.backward()
    skipped = set()
    if kind == "exact-dbk":  # q(w) is set in closed form, not by gradients
        skipped = {"variational_mean", "variational_log_diag", "variational_offdiag"}
    if kind == "dnn":  # sigma^2 is set in closed form by refresh()
        skipped = {"noise.raw"}
    for name, p in model.named_parameters():
        if name in skipped:
            continue
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_woodbury_marginal_matches_dense_gaussian():
    g = torch.Generator().manual_seed(3)
    n, r = 40, 7
    phi = torch.randn(n, r, generator=g, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    noise = torch.tensor(0.37, dtype=torch.float64)
    cov = phi @ phi.T + noise * torch.eye(n, dtype=torch.float64)
    dense = MultivariateNormal(torch.zeros(n, dtype=torch.float64), cov).log_prob(y)
    assert float(woodbury_log_marginal(phi, y, noise)) == pytest.approx(float(dense), abs=1e-6)


def test_exact_posterior_matches_dense_gp_prediction():
    g = torch.Generator().manual_seed(4)
    n, m, r = 40, 9, 7
    phi = torch.randn(n, r, generator=g, dtype=torch.float64)
    phi_star = torch.randn(m, r, generator=g, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    noise = torch.tensor(0.21, dtype=torch.float64)
    # dense function-space GP with kernel phi phi^T
    K = phi @ phi.T + noise * torch.eye(n, dtype=torch.float64)
    k_star = phi_star @ phi.T
    dense_mean = k_star @ torch.linalg.solve(K, y)
    dense_cov = phi_star @ phi_star.T - k_star @ torch.linalg.solve(K, k_star.T)
    mean, factor = exact_posterior(phi, y, noise)
    assert torch.allclose(phi_star @ mean, dense_mean, atol=1e-6)
    assert torch.allclose(phi_star @ factor @ factor.T @ phi_star.T, dense_cov, atol=1e-6)
    assert torch.equal(factor, torch.tril(factor))


def test_exact_mml_objective_and_refresh_match_dense_computation():
    model = _model("exact-dbk")
    x, y = _batch(b=30)
    phi = model.basis(x).detach()
    c, noise = model.constant_mean.detach(), model.noise().detach()
    cov = phi @ phi.T + noise * torch.eye(len(y), dtype=torch.float64)
    dense = MultivariateNormal(c.expand(len(y)), cov).log_prob(y)
    objective = ExactMarginalLikelihood(chunk_size=7)  # refresh works in chunks
    assert float(objective(model, x, y, len(y))) == pytest.approx(-float(dense) / len(y), abs=1e-6)
    objective.refresh(model, x, y)
    x_star, _ = _batch(b=5, seed=9)
    out = model(x_star)
    k_star = model.basis(x_star).detach() @ phi.T
    dense_mean = c + k_star @ torch.linalg.solve(cov, y - c)
    dense_var = (model.basis(x_star).detach() ** 2).sum(1) - (k_star * torch.linalg.solve(cov, k_star.T).T).sum(1)
    assert torch.allclose(out.mean.detach(), dense_mean, atol=1e-6)
    assert torch.allclose(out.var_f.detach(), dense_var, atol=1e-6)
    assert math.isclose(float(out.noise), float(noise))
