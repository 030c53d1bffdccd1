"""Related models (issue 6): feature-expansion math, each loss against its formula written
out densely, recovery of a smooth function, and persistence through the zoo."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from geodbk.models import ModelConfig, available_models, get_model_spec
from geodbk.models.related import (
    BlackBoxAlpha,
    DecoupledELBO,
    DecoupledSVGP,
    EmbeddingExactMML,
    MercerExpansion,
    RandomFourierExpansion,
    SVDBKELBO,
    mercer_eigenpairs,
)
from geodbk.models.related.zoo import build_dfgp, build_dmgp, build_svdbk, build_valla
from geodbk.fit.regressor import Regressor, build_model
from geodbk.fit.train import fit_arrays
from geodbk.models.config import TrainConfig

RELATED = ["svdbk", "svdbk-c", "dfgp", "dmgp", "dcsvgp", "dcppgp", "valla"]


def rbf(a, b, lengthscale, outputscale=1.0):
    sq = ((a[:, None, :] - b[None, :, :]) / lengthscale).pow(2).sum(-1)
    return outputscale * torch.exp(-0.5 * sq)


def gauss_logpdf(y, mean, var):
    return -0.5 * (math.log(2 * math.pi) + torch.log(var) + (y - mean) ** 2 / var)


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


def test_related_kinds_are_registered():
    assert set(RELATED) <= set(available_models())


# --- feature expansions ------------------------------------------------------------------------
@pytest.mark.parametrize("lengthscale", [0.5, 1.0, 2.0])
def test_mercer_expansion_reconstructs_the_half_convention_gaussian_kernel(lengthscale):
    z = torch.linspace(-2.5, 2.5, 41)[:, None]
    layer = MercerExpansion(1, per_dim=60)
    with torch.no_grad():
        layer.log_lengthscale.fill_(math.log(lengthscale))
        layer.log_outputscale.fill_(math.log(1.7))
    phi = layer(z)
    exact = rbf(z, z, lengthscale, 1.7)  # 1.7 exp(-(z - z')^2 / (2 l^2))
    assert (phi @ phi.T - exact).abs().max() < 1e-6
    # the other convention, exp(-(z - z')^2 / l^2), is clearly not what it builds
    assert (phi @ phi.T - 1.7 * torch.exp(-((z - z.T) / lengthscale) ** 2)).abs().max() > 0.05


def test_mercer_expansion_in_two_dimensions_is_the_tensor_product():
    z = torch.randn(30, 2)
    layer = MercerExpansion(2, per_dim=25)
    with torch.no_grad():
        layer.log_lengthscale.copy_(torch.log(torch.tensor([0.8, 1.5])))
    phi = layer(z)
    assert phi.shape == (30, 625)
    assert (phi @ phi.T - rbf(z, z, torch.tensor([0.8, 1.5]))).abs().max() < 1e-5
    # truncation at m = 4 per dimension loses accuracy
    small = MercerExpansion(2, per_dim=4)
    with torch.no_grad():
        small.log_lengthscale.copy_(layer.log_lengthscale)
    assert (small(z) @ small(z).T - rbf(z, z, torch.tensor([0.8, 1.5]))).abs().max() > 1e-3


def test_mercer_eigenfunctions_are_orthonormal_under_the_standard_normal():
    nodes, weights = np.polynomial.hermite_e.hermegauss(150)  # weight exp(-z^2 / 2)
    z = torch.tensor(nodes)[:, None]
    w = torch.tensor(weights) / math.sqrt(2 * math.pi)
    e, lam = mercer_eigenpairs(z, torch.tensor([0.7]), n_eig=12)
    gram = torch.einsum("n,ni,nj->ij", w, e[:, 0, :], e[:, 0, :])
    torch.testing.assert_close(gram, torch.eye(12), atol=1e-8, rtol=0)
    assert torch.all(lam[0, 1:] < lam[0, :-1])  # eigenvalues decay geometrically
    layer = MercerExpansion(1, 12)
    with torch.no_grad():
        layer.log_lengthscale.fill_(math.log(0.7))
    torch.testing.assert_close(layer.eigenvalues(), lam[0])


def test_random_fourier_features_approximate_the_rbf_kernel_better_with_rank():
    z = torch.randn(50, 3)
    errors = []
    for rank in (16, 256, 4096):
        layer = RandomFourierExpansion(3, rank, seed=3)
        with torch.no_grad():
            layer.log_lengthscale.copy_(torch.log(torch.tensor([0.7, 1.0, 2.0])))
            layer.log_outputscale.fill_(math.log(2.0))
        phi = layer(z)
        torch.testing.assert_close(phi.pow(2).sum(-1), torch.full((50,), 2.0))  # ||phi||^2 = s^2
        errors.append((phi @ phi.T - layer.base_kernel(z, z)).abs().mean().item())
    assert errors[0] > 3 * errors[1] > 9 * errors[2]  # ~ 1/sqrt(r): x4 per x16 rank
    assert errors[2] < 0.05  # Monte Carlo error ~ s^2 sqrt(2 / r) / 2


def test_random_fourier_frequencies_are_fixed_and_lengthscale_scaled():
    layer = RandomFourierExpansion(2, 8, seed=0)
    base = layer.base_frequencies.clone()
    assert not layer.base_frequencies.requires_grad
    with torch.no_grad():
        layer.log_lengthscale.fill_(math.log(2.0))
    torch.testing.assert_close(layer.frequencies(), base / 2.0)
    with pytest.raises(ValueError, match="even"):
        RandomFourierExpansion(2, 7)


# --- losses against their formulas -------------------------------------------------------------
def _dense_kl_to_standard(m, L):
    S = L @ L.T
    return 0.5 * (torch.trace(S) + m @ m - len(m) - torch.logdet(S))


def test_svdbk_loss_and_corrected_variance_match_the_formulas():
    model = build_svdbk(2, ModelConfig(hidden=8, rank=6, dtype="float64")).double()
    with torch.no_grad():
        model.variational_mean.normal_()
        model.variational_offdiag.normal_(0, 0.3)
        model.noise.set_(0.2)
    x, y, n = torch.rand(9, 2) * 2 - 1, torch.randn(9), 40
    model.train()
    loss = SVDBKELBO()(model, x, y, n)

    phi = model.basis(x)
    m, L, s2, c = model.variational_mean, model.chol_factor, model.noise(), model.constant_mean
    sq = (phi * phi).sum(-1)
    elbo_terms = gauss_logpdf(y, phi @ m + c, s2) - ((phi @ L) ** 2).sum(-1) / (2 * s2)
    trace_terms = (sq.max() - sq) / (2 * s2)
    # eq. 9 minus the batch trace regulariser, as a per-datum loss: -(1/n)[(n/b) sum ... - KL]
    expected = -((n / 9) * (elbo_terms - trace_terms).sum() - _dense_kl_to_standard(m, L)) / n
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(SVDBKELBO(trace=False)(model, x, y, n), expected - trace_terms.mean())

    X_train = torch.rand(50, 2) * 2 - 1
    SVDBKELBO().refresh(model, X_train, torch.zeros(50))
    train_max = model.basis(X_train).pow(2).sum(-1).max()
    torch.testing.assert_close(model.max_train_sq_norm, train_max.detach())
    model.eval()
    out = model(x)
    correction = torch.maximum(train_max, sq) - sq
    torch.testing.assert_close(out.predictive_var, ((phi @ L) ** 2).sum(-1) + correction + s2)
    assert torch.all(correction >= 0)


@pytest.mark.parametrize("builder", [build_dfgp, build_dmgp])
def test_deep_fourier_and_mercer_use_the_exact_marginal_likelihood(builder):
    cfg = ModelConfig(hidden=8, rank=4, dtype="float64", options={"embed_dim": 2, "per_dim": 4, "n_features": 12})
    model = builder(3, cfg).double()
    with torch.no_grad():
        model.constant_mean.fill_(0.3)
        model.noise.set_(0.1)
    x, y = torch.rand(25, 3) * 2 - 1, torch.randn(25)
    model.train()
    objective = EmbeddingExactMML()
    loss = objective(model, x, y, 25)
    phi = model.basis(x)  # train mode: the embedding is standardised with this batch
    assert phi.shape[1] == (12 if builder is build_dfgp else 16)
    cov = phi @ phi.T + model.noise() * torch.eye(25)
    dense = torch.distributions.MultivariateNormal(torch.full((25,), 0.3), cov).log_prob(y)
    torch.testing.assert_close(loss, -dense / 25)

    # after refresh, eval-mode prediction is the exact GP posterior of the kernel phi.phi'
    objective.refresh(model, x, y)
    model.eval()
    x_new = torch.rand(5, 3) * 2 - 1
    out = model(x_new)
    k_star = phi @ model.basis(x_new).T
    solve = torch.linalg.solve(cov, torch.cat([y[:, None] - 0.3, k_star], 1))
    mean = 0.3 + k_star.T @ solve[:, 0]
    phi_new = model.basis(x_new)
    var = (phi_new**2).sum(-1) - (k_star * solve[:, 1:]).sum(0)
    torch.testing.assert_close(out.mean, mean.detach())
    torch.testing.assert_close(out.var_f, var.detach())


def _dense_decoupled_loss(model, x, y, n, beta2, predictive):
    z, s2 = model.inducing, model.noise()
    Q = lambda a, b: rbf(a, b, model.log_lengthscale_mean.exp(), model.outputscale)  # noqa: E731
    K = lambda a, b: rbf(a, b, model.log_lengthscale_covar.exp(), model.outputscale)  # noqa: E731
    Qi, Ki = torch.linalg.inv(Q(z, z)), torch.linalg.inv(K(z, z))
    Lq = torch.linalg.cholesky(Q(z, z))
    m = Lq @ model.variational_mean  # un-whitened q(u) = N(m, S)
    S = Lq @ model.chol_factor @ model.chol_factor.T @ Lq.T
    mu = Q(x, z) @ Qi @ m + model.constant_mean
    Kt = K(x, x) - K(x, z) @ Ki @ K(z, x)
    var = torch.diagonal(Kt) + torch.diagonal(Q(x, z) @ Qi @ S @ Qi @ Q(z, x))
    if predictive:
        fit = -gauss_logpdf(y, mu, var + s2)
    else:
        fit = -gauss_logpdf(y, mu, s2) + var / (2 * s2)
    Kzz = K(z, z)
    M = len(m)
    kl = 0.5 * (torch.trace(torch.linalg.solve(Kzz, S)) + m @ torch.linalg.solve(Kzz, m) - M
                + torch.logdet(Kzz) - torch.logdet(S))
    A = Q(x, z) @ Qi - K(x, z) @ Ki
    T = A.T @ torch.linalg.solve(Kt, A)
    omega = 0.5 * (torch.trace(T @ S) + m @ T @ m)
    return fit.mean() + (kl + beta2 * omega) / n


@pytest.mark.parametrize("predictive", [False, True])
def test_decoupled_svgp_loss_matches_the_dense_formula(predictive):
    model = DecoupledSVGP(2, 4, jitter=1e-12)
    with torch.no_grad():
        model.inducing.copy_(torch.tensor([[-0.8, -0.8], [-0.8, 0.8], [0.8, -0.8], [0.8, 0.8]]))
        model.log_lengthscale_mean.fill_(math.log(0.6))
        model.log_lengthscale_covar.fill_(math.log(1.1))
        model.log_outputscale.fill_(math.log(1.3))
        model.variational_mean.normal_()
        model.variational_offdiag.normal_(0, 0.3)
        model.variational_log_diag.normal_(0, 0.2)
        model.noise.set_(0.05)
    x = torch.tensor([[0.0, 0.1], [0.3, -0.4], [-0.5, 0.2], [0.1, 0.6], [-0.2, -0.3]])
    y = torch.randn(5)
    loss = DecoupledELBO(beta2=0.5, predictive=predictive)(model, x, y, 30)
    expected = _dense_decoupled_loss(model, x, y, 30, 0.5, predictive)
    torch.testing.assert_close(loss, expected, rtol=1e-7, atol=1e-9)
    # prediction uses the same mean and variance as the loss
    out = model(x)
    assert out.var_f.shape == (5,) and torch.all(out.var_f > 0)


def test_decoupled_svgp_with_equal_lengthscales_has_no_omega():
    model = DecoupledSVGP(1, 5, jitter=1e-10)
    with torch.no_grad():
        model.inducing.copy_(torch.linspace(-1, 1, 5)[:, None])
        model.variational_mean.normal_()
    x = torch.linspace(-0.9, 0.9, 7)[:, None]
    _, kl, omega = model.loss_terms(x)
    assert abs(float(omega.detach())) < 1e-8
    # Q = K: the KL is the whitened KL(N(m_bar, S_bar) || N(0, I)) of a standard SVGP
    expected = _dense_kl_to_standard(model.variational_mean, model.chol_factor)
    torch.testing.assert_close(kl, expected)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_valla_loss_matches_the_black_box_alpha_formula(alpha):
    model = build_valla(2, ModelConfig(hidden=6, rank=4, dtype="float64", options={"num_inducing": 4})).double()
    with torch.no_grad():
        model.log_prior_sd.fill_(math.log(0.7))
        model.variational_offdiag.normal_(0, 0.3)
        model.variational_log_diag.normal_(0, 0.2)
        model.noise.set_(0.1)
    x, y, n = torch.rand(6, 2) * 2 - 1, torch.randn(6), 50
    loss = BlackBoxAlpha(alpha)(model, x, y, n)

    def jac(a):  # last-layer Jacobian of g(a) = head(h(a))
        return torch.cat([model.network.backbone(a), torch.ones(len(a), 1)], 1)

    s0sq, s2 = 0.49, model.noise().detach()
    kappa = lambda a, b: s0sq * jac(a) @ jac(b).T  # noqa: E731
    z = model.inducing
    A = model.chol_factor @ model.chol_factor.T
    middle = torch.linalg.inv(torch.linalg.inv(A) + kappa(z, z))
    var = torch.diagonal(kappa(x, x) - kappa(x, z) @ middle @ kappa(z, x))
    g = model.network(x).mean
    log_c = math.log(math.sqrt(2 * math.pi * s2 / alpha) / (2 * math.pi * s2) ** (alpha / 2))
    energy = (gauss_logpdf(y, g, var + s2 / alpha) + log_c) / alpha
    Kz = kappa(z, z)
    kl = 0.5 * torch.logdet(torch.eye(4) + Kz @ A) - 0.5 * torch.trace(Kz @ middle)
    torch.testing.assert_close(loss, -energy.mean() + kl / n)
    torch.testing.assert_close(model(x).var_f, var)
    if alpha == 1.0:  # alpha = 1 is the predictive log-likelihood
        torch.testing.assert_close(loss, -gauss_logpdf(y, g, var + s2).mean() + kl / n)


# --- recovery of a smooth function -----------------------------------------------------------
def _toy(n, rng):
    X = rng.uniform(-1, 1, (n, 2))
    f = np.sin(2.5 * X[:, 0]) * np.cos(1.5 * X[:, 1]) + 0.5 * X[:, 1]
    return X, f + 0.1 * rng.normal(size=n)


def _nll(pred, y):
    return float(np.mean(0.5 * np.log(2 * np.pi * pred.var) + (y - pred.mean) ** 2 / (2 * pred.var)))


@pytest.mark.parametrize("kind", RELATED)
def test_each_related_model_recovers_a_smooth_function(kind):
    rng = np.random.default_rng(1)
    (X, y), (Xv, yv), (Xt, yt) = _toy(300, rng), _toy(100, rng), _toy(300, rng)
    mcfg = ModelConfig(hidden=32, rank=32, options={"num_inducing": 32, "embed_dim": 2, "per_dim": 6})
    steps = 300 if get_model_spec(kind).full_batch else 80  # full-batch kinds: one step per epoch
    tcfg = TrainConfig(epochs=steps, batch_size=64, lr=1e-2, progress=False, device="cpu", patience=None)
    torch.set_default_dtype(torch.float32)
    fitted = fit_arrays(kind, X, y, Xv, yv, model_config=mcfg, train_config=tcfg)
    untrained = Regressor(kind, build_model(kind, 2, mcfg).eval(), mcfg, 2, float(y.mean()), float(y.std()))
    pred, prior = fitted.predict(Xt), untrained.predict(Xt)
    constant_mse, constant_nll = float(np.var(yt)), 0.5 * math.log(2 * math.pi * math.e * np.var(y))
    assert np.mean((pred.mean - yt) ** 2) < 0.1 * constant_mse
    assert _nll(pred, yt) < min(_nll(prior, yt), constant_nll) - 1.0
    assert _nll(pred, yt) < 0.0  # noise sd 0.1: the ideal is -0.88


def test_related_models_save_and_load(tmp_path):
    rng = np.random.default_rng(2)
    (X, y), (Xv, yv) = _toy(120, rng), _toy(40, rng)
    torch.set_default_dtype(torch.float32)
    tcfg = TrainConfig(lr=1e-3, epochs=5, batch_size=64, progress=False, device="cpu")
    for kind in ("svdbk", "valla", "dmgp"):
        mcfg = ModelConfig(hidden=16, rank=8, options={"num_inducing": 8})
        fitted = fit_arrays(kind, X, y, Xv, yv, model_config=mcfg, train_config=tcfg)
        fitted.save(tmp_path / f"{kind}.pt")
        loaded = Regressor.load(tmp_path / f"{kind}.pt")
        a, b = fitted.predict(Xv), loaded.predict(Xv)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-6)
        np.testing.assert_allclose(a.sd, b.sd, rtol=1e-6)
        if kind == "svdbk":  # the stored max_train ||phi||^2 travels with the weights
            assert float(loaded.model.max_train_sq_norm) > 0
