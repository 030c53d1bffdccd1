"""The conjugate weight posterior of a basis GP (geodbk.models.conjugate) against dense formulas,
recovered synthetic hyperparameters, and calibrated area z-scores on data drawn from the model."""

import math

import numpy as np
import pytest
import torch

from geodbk.fit.regressor import Regressor
from geodbk.models import ModelConfig, get_model_spec
from geodbk.models.conjugate import fit_conjugate_posterior


def _model(seed=0, rank=6, hidden=8, d=3):
    torch.manual_seed(seed)
    config = ModelConfig(hidden=hidden, rank=rank, dtype="float64", test_noise=True)
    return get_model_spec("dbk-rbf").build(d, config).double(), config


def _draw(model, n, *, prior=2.0, tile=0.1, per_test=0.5, tile_effect=0.0, c=0.3, seed=1, d=3, per_tile=3):
    """Rows from the model's own prior, y = c + a phi^T u + tile offset + noise, ``per_tile``
    rows per tile (a tile's rows at one place, as its quarters are): x, tests, tiles, y, w."""
    g = torch.Generator().manual_seed(seed)
    tiles = torch.arange(n) // per_tile
    x = (torch.rand(n // per_tile + 1, d, generator=g, dtype=torch.float64) * 2 - 1)[tiles]
    x[:, -1] = torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1  # the last input is time
    tests = torch.randint(1, 30, (n,), generator=g).double()
    with torch.no_grad():
        phi = model.basis(x)
    w = math.sqrt(prior) * torch.randn(phi.shape[1], generator=g, dtype=torch.float64)
    offsets = math.sqrt(tile_effect) * torch.randn(n // per_tile + 1, generator=g, dtype=torch.float64)
    noise = tile + per_test / tests
    y = c + phi @ w + offsets[tiles] + noise.sqrt() * torch.randn(n, generator=g, dtype=torch.float64)
    return x, tests, tiles, y, w


def _dense_covariance(phi, prior, tile, per_test, tile_effect, shape, tests, tiles, shape_var):
    """a^2 Phi Phi^T + diag(sigma0^2 + sigma1^2 / k + beta v) + tau^2 [same tile], written out."""
    same = (tiles[:, None] == tiles[None, :]).double()
    return prior * phi @ phi.T + torch.diag(tile + per_test / tests + shape * shape_var) + tile_effect * same


def _dense_log_marginal(phi, y, prior, tile, per_test, tile_effect, shape, tests, tiles, shape_var, c):
    cov = _dense_covariance(phi, prior, tile, per_test, tile_effect, shape, tests, tiles, shape_var)
    return torch.distributions.MultivariateNormal(torch.full_like(y, c), cov).log_prob(y)


@pytest.mark.parametrize("row_chunk", [65536, 37])
def test_posterior_equals_the_dense_conjugate_formula(row_chunk, monkeypatch):
    """Also when every row's basis and sums come in chunks (37 rows: chunks split tiles)."""
    from geodbk.models import conjugate

    monkeypatch.setattr(conjugate, "ROW_CHUNK", row_chunk)
    model, _ = _model()
    x, tests, tiles, y, _ = _draw(model, 150, tile_effect=0.2)
    with torch.no_grad():
        shape_var = (model.basis(x) @ model.chol_factor).pow(2).sum(-1)  # the trained q(w)'s variance
    fit = fit_conjugate_posterior(model, x, y, tests, tiles)
    assert fit.tile_effect > 0
    x_star = torch.rand(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 2 - 1
    with torch.no_grad():
        phi, phi_star = model.basis(x), model.basis(x_star)
        a2, c = float(model.weight_prior_variance), float(model.constant_mean)
        k = _dense_covariance(phi, a2, fit.tile_noise, fit.per_test_noise, fit.tile_effect, fit.variance_shape,
                              tests, tiles, shape_var)
        cross = a2 * phi_star @ phi.T
        dense_mean = c + cross @ torch.linalg.solve(k, y - c)
        dense_cov = a2 * phi_star @ phi_star.T - cross @ torch.linalg.solve(k, cross.T)
        plus = model.posterior_factors(x_star).plus
        model.train()  # the unfolded forward
        out = model(x_star)
    torch.testing.assert_close(out.mean, dense_mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(plus @ plus.T, dense_cov, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.var_f, torch.diagonal(dense_cov), atol=1e-6, rtol=0)
    # the prior kernel the maps show is the one the posterior was taken under
    torch.testing.assert_close(model.kernel(x_star, x_star), a2 * phi_star @ phi_star.T)
    assert fit.weight_prior_variance == pytest.approx(a2)
    assert float(model.noise().detach()) == pytest.approx(fit.tile_noise, rel=1e-6)
    assert float(model.noise.per_test_variance().detach()) == pytest.approx(fit.per_test_noise, rel=1e-6)


def test_hyperparameters_maximise_the_dense_marginal_likelihood():
    """At an interior optimum (for this draw a^2 = 1.8; with 50 tiles an untrained basis often
    leaves a^2 at its bound, where moving it down would not lower the likelihood)."""
    model, _ = _model()
    x, tests, tiles, y, _ = _draw(model, 150, tile_effect=0.2, seed=3)
    with torch.no_grad():
        phi = model.basis(x)
        shape_var = (phi @ model.chol_factor).pow(2).sum(-1)
    fit = fit_conjugate_posterior(model, x, y, tests, tiles, variance_shape=False)
    assert 0.5 < fit.weight_prior_variance < 5.0 and fit.variance_shape == 0.0
    theta = [fit.weight_prior_variance, fit.tile_noise, fit.per_test_noise, fit.tile_effect, fit.constant_mean]

    def dense(values):
        return float(_dense_log_marginal(phi, y, *values[:4], 0.0, tests, tiles, shape_var, values[4]))

    best = dense(theta)
    assert best / len(y) == pytest.approx(fit.log_marginal_per_row, abs=1e-6)
    for index in range(5):
        for factor in (0.97, 1.03):
            moved = list(theta)
            moved[index] = theta[index] * factor if index < 4 else theta[index] + (factor - 1.0)
            assert dense(moved) < best


def test_recovers_the_generating_hyperparameters():
    model, _ = _model(rank=6)
    x, tests, tiles, y, _ = _draw(model, 6000, prior=2.0, tile=0.1, per_test=0.5, tile_effect=0.2, c=0.3)
    fit = fit_conjugate_posterior(model, x, y, tests, tiles, max_rows=6000)
    assert fit.tile_noise == pytest.approx(0.1, rel=0.2)
    assert fit.per_test_noise == pytest.approx(0.5, rel=0.15)
    assert fit.tile_effect == pytest.approx(0.2, rel=0.15)
    assert fit.variance_shape < 0.05  # the data have no input-dependent noise
    # a^2 is seen through only r = 6 weights: its estimate scatters like chi^2_6 / 6 (5%: 0.27)
    assert 0.25 < fit.weight_prior_variance / 2.0 < 2.5


def test_area_z_scores_are_calibrated_on_data_drawn_from_the_model():
    """500 areas (50 draws of a truth and its data, 10 areas each): each area is 30 points
    around its own centre, so areas of one draw are not all alike. The hyperparameters are
    estimated (plug-in type-II ML), which makes the sd a little too narrow on little data:
    z sd 1.11-1.12 with 600 rows per draw, 1.04 with 4,000."""
    z = []
    for replicate in range(50):
        model, config = _model(seed=replicate % 5, rank=16)
        x, tests, _, y, w = _draw(model, 4000, seed=1000 + replicate, per_tile=1)
        regressor = Regressor("dbk-rbf", model, config, input_dim=3, y_mean=0.0, y_std=1.0)
        regressor.refit_posterior(x.numpy(), y.numpy(), tests.numpy())
        rng = np.random.default_rng(replicate)
        centres = rng.uniform(-0.8, 0.8, (10, 3))
        points = np.repeat(centres, 30, axis=0) + rng.uniform(-0.2, 0.2, (300, 3))
        groups, weights = np.repeat(np.arange(10), 30), np.full(300, 1 / 30)
        with torch.no_grad():
            truth = (model.basis(torch.as_tensor(points)) @ w).numpy() + 0.3
        true_area = np.bincount(groups, weights=weights * truth)
        mean = np.bincount(groups, weights=weights * regressor.predict(points).mean)
        sd = np.sqrt(regressor.weighted_sum_variance(points, weights, groups, 10))
        z.append((true_area - mean) / sd)
    z = np.concatenate(z)
    assert len(z) == 500
    assert 0.9 <= z.std() <= 1.1
    assert 0.92 <= np.mean(np.abs(z) <= 1.959964) <= 0.98  # plug-in hyperparameters: a little under 95%


def test_model_files_without_a_prior_variance_load_with_one():
    model, _ = _model()
    state = model.state_dict()
    for name in ("weight_prior_variance", "noise_factor", "noise_factor_scale"):
        del state[name]
    fresh, _ = _model(seed=1)
    with torch.no_grad():
        fresh.weight_prior_variance.fill_(3.0)
    fresh.load_state_dict(state)
    assert float(fresh.weight_prior_variance) == 1.0
    assert not fresh.has_noise_factor and float(fresh.noise_factor.abs().sum()) == 0.0


def test_models_with_a_nystrom_residual_are_refused():
    torch.manual_seed(0)
    model = get_model_spec("sv-dkl").build(3, ModelConfig(hidden=8, rank=6, dtype="float64")).double()
    x = torch.rand(20, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="Nystrom"):
        fit_conjugate_posterior(model, x, torch.randn(20, dtype=torch.float64))


def test_input_dependent_noise_is_recovered_and_folded_prediction_agrees():
    """Data whose noise is beta ||B^T phi||^2 with B the model's trained factor: beta comes back,
    and the folded prediction path gives the same distribution as the unfolded one."""
    model, _ = _model(rank=6)
    x, tests, tiles, _, _ = _draw(model, 6000, per_tile=1)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        phi = model.basis(x)
        shape_var = (phi @ model.chol_factor).pow(2).sum(-1)
        w = math.sqrt(2.0) * torch.randn(phi.shape[1], generator=g, dtype=torch.float64)
        noise = 0.1 + 0.5 / tests + 0.8 * shape_var / shape_var.mean()
        y = 0.3 + phi @ w + noise.sqrt() * torch.randn(len(x), generator=g, dtype=torch.float64)
    fit = fit_conjugate_posterior(model, x, y, tests, max_rows=6000)
    assert fit.variance_shape * float(shape_var.mean()) == pytest.approx(0.8, rel=0.2)
    model.eval()
    with torch.no_grad():
        folded = model(x[:50], tests[:50])
        model.train()
        plain = model(x[:50], tests[:50])
    torch.testing.assert_close(folded.noise, plain.noise)
    torch.testing.assert_close(folded.tile_noise, plain.tile_noise)
    torch.testing.assert_close(folded.tile_noise - model.noise(), fit.variance_shape * shape_var[:50])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tiles_on", ["cuda", "cpu"])
def test_the_fit_on_cuda_equals_the_fit_on_the_cpu(tiles_on):
    """Optimiser state lives on the host, the data on the device: the same fit either way. The
    tile labels may come on the host, as :meth:`~geodbk.fit.regressor.Regressor.refit_posterior` gives them."""
    cpu, _ = _model(rank=16)
    gpu, _ = _model(rank=16)
    gpu.cuda()
    x, tests, tiles, y, _ = _draw(cpu, 600, tile_effect=0.2)
    on_cpu = fit_conjugate_posterior(cpu, x, y, tests, tiles)
    on_gpu = fit_conjugate_posterior(gpu, x.cuda(), y.cuda(), tests.cuda(), tiles.to(tiles_on))
    assert on_gpu.log_marginal_per_row == pytest.approx(on_cpu.log_marginal_per_row, abs=1e-9)
    for name in ("weight_prior_variance", "tile_noise", "per_test_noise", "tile_effect", "variance_shape"):
        assert getattr(on_gpu, name) == pytest.approx(getattr(on_cpu, name), rel=1e-4), name
    x_star = torch.rand(100, 3, dtype=torch.float64) * 2 - 1
    cpu.eval(), gpu.eval()
    with torch.no_grad():
        a, b = cpu(x_star, tests[:100]), gpu(x_star.cuda(), tests[:100].cuda())
    torch.testing.assert_close(b.mean.cpu(), a.mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.noise.cpu(), a.noise, atol=1e-6, rtol=1e-5)
