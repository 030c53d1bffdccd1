"""Basis maps, BasisGP parameterisation and the model zoo registry."""

import math

import numpy as np

import pytest
import torch

from geodbk.models import (
    BasisGP,
    BasisMap,
    IdentityBackbone,
    KernelModel,
    ModelConfig,
    ModelSpec,
    RBFInducingExpansion,
    ResNetBackbone,
    SiLUExpansion,
    available_models,
    get_model_spec,
    jittered_cholesky,
    register_model,
    unregister_model,
    ZooModel,
)
from geodbk.models.objectives import PPGP
from geodbk.fit.regressor import build_model


def test_dbk_rbf_features_reproduce_the_nystrom_kernel():
    torch.manual_seed(0)
    expansion = RBFInducingExpansion(input_dim=4, rank=12, jitter=1e-9).double()
    with torch.no_grad():
        expansion.log_lengthscale.copy_(torch.tensor([0.1, -0.3, 0.2, 0.0], dtype=torch.float64))
        expansion.log_outputscale.fill_(0.4)
    a = torch.randn(15, 4, dtype=torch.float64)
    b = torch.randn(8, 4, dtype=torch.float64)
    # direct ARD RBF and Nystrom kernel, written independently of the module
    ell, s2, Z = expansion.log_lengthscale.exp(), math.exp(0.4), expansion.inducing

    def rbf(u, v):
        diff = (u[:, None, :] - v[None, :, :]) / ell
        return s2 * torch.exp(-0.5 * (diff**2).sum(-1))

    nystrom = rbf(a, Z) @ torch.linalg.solve(rbf(Z, Z), rbf(Z, b))
    features = expansion(a) @ expansion(b).T
    assert torch.allclose(features, nystrom, atol=1e-6)
    assert torch.allclose(expansion.base_kernel(a, b), rbf(a, b), atol=1e-12)
    # at the inducing points the Nystrom kernel is exact: ||phi(z)||^2 = k(z, z)
    assert torch.allclose((expansion(Z) ** 2).sum(1), torch.full((12,), s2, dtype=torch.float64), atol=1e-6)


def test_rbf_expansion_initialisation():
    torch.manual_seed(0)
    expansion = RBFInducingExpansion(input_dim=16, rank=32)
    assert expansion.inducing.shape == (32, 16)
    assert float(expansion.inducing.detach().min()) >= -1 and float(expansion.inducing.detach().max()) <= 1
    assert torch.allclose(expansion.log_lengthscale.exp(), torch.full((16,), 4.0))
    assert float(expansion.outputscale) == pytest.approx(1.0)


def test_jittered_cholesky_recovers_from_a_singular_matrix():
    v = torch.randn(5, 1, dtype=torch.float64)
    singular = v @ v.T  # rank 1
    L = jittered_cholesky(singular, 1e-12)
    assert torch.isfinite(L).all()
    assert torch.allclose(L @ L.T, singular, atol=1e-6)


def test_silu_expansion_scale_init_is_signs_over_sqrt_rank():
    torch.manual_seed(1)
    expansion = SiLUExpansion(input_dim=8, rank=64)
    assert torch.allclose(expansion.scale.abs(), torch.full((64,), 1 / 8))
    assert (expansion.scale > 0).any() and (expansion.scale < 0).any()
    g = torch.randn(5, 8)
    expected = expansion.scale * torch.nn.functional.silu(g @ expansion.linear.weight.T + expansion.linear.bias)
    assert torch.allclose(expansion(g), expected)


def test_resnet_backbone_shapes_and_identity_backbone():
    backbone = ResNetBackbone(input_dim=3, hidden=16)
    assert backbone(torch.randn(7, 3)).shape == (7, 16)
    assert len(backbone.blocks) == 2
    x = torch.randn(4, 2)
    assert torch.equal(IdentityBackbone(2)(x), x)


def test_basis_gp_initial_values_and_prediction_formula():
    torch.manual_seed(0)
    r = 16
    model = BasisGP(BasisMap(ResNetBackbone(2, 8), SiLUExpansion(8, r)))
    assert float(model.noise()) == pytest.approx(1e-2, rel=1e-5)
    assert float(model.constant_mean) == 0.0
    assert torch.allclose(torch.diagonal(model.chol_factor), torch.full((r,), r**-0.5))
    L = model.chol_factor
    assert torch.equal(L, torch.tril(L))
    assert float(model.variational_offdiag.abs().max()) < 5.0 / r
    with torch.no_grad():
        model.variational_mean.normal_()
        model.constant_mean.fill_(0.7)
    x = torch.randn(9, 2)
    out = model(x)
    phi = model.basis(x)
    assert torch.allclose(out.mean, phi @ model.variational_mean + 0.7, atol=1e-5)
    assert torch.allclose(out.var_f, ((phi @ L) ** 2).sum(1), atol=1e-5)
    assert torch.allclose(out.predictive_var, out.var_f + model.noise())
    assert torch.allclose(model.kernel(x, x[:3]), phi @ phi[:3].T, atol=1e-6)


def test_noise_respects_floor():
    model = get_model_spec("dbk-silu").build(2, ModelConfig(hidden=4, rank=3))
    model.noise.set_(0.0)
    assert float(model.noise()) >= 1e-6


def test_svgp_models_carry_the_residual_and_report_the_full_kernel():
    torch.manual_seed(0)
    model = get_model_spec("sv-rbf").build(2, ModelConfig(rank=10, dtype="float64")).double()
    x = torch.rand(6, 2, dtype=torch.float64) * 2 - 1
    out = model(x)
    phi = model.basis(x)
    prior = model.basis.expansion.outputscale
    assert torch.allclose(out.residual, prior - (phi**2).sum(1))
    assert torch.allclose(model.kernel(x, x), model.basis.expansion.base_kernel(x, x))
    with pytest.raises(TypeError):
        BasisGP(BasisMap(IdentityBackbone(2), SiLUExpansion(2, 4)), include_residual=True)


def test_zoo_names_and_registering_a_new_kind():
    assert available_models()[:8] == ["dbk-rbf", "dbk-silu", "exact-dbk", "sv-rbf", "sv-dkl", "pp-dkl", "vbll", "dnn"]
    assert get_model_spec("exact-dbk").full_batch
    with pytest.raises(KeyError, match="dbk-rbf"):
        get_model_spec("no-such-model")
    spec = ModelSpec(
        build=lambda d, cfg: BasisGP(BasisMap(IdentityBackbone(d), RBFInducingExpansion(d, cfg.rank)), include_residual=True),
        objective=lambda tc: PPGP(tc.beta),
        description="PPGP on raw inputs (test registration)",
    )
    register_model("test-pp-rbf", spec)
    try:
        assert "test-pp-rbf" in available_models()
        assert get_model_spec("test-pp-rbf") is spec
        with pytest.raises(ValueError):
            register_model("test-pp-rbf", spec)
    finally:
        assert unregister_model("test-pp-rbf") is spec
    assert "test-pp-rbf" not in available_models()


@pytest.mark.parametrize("kind", available_models())
def test_prior_variance_is_the_kernel_diagonal(kind):
    torch.manual_seed(0)
    model = build_model(kind, 3, ModelConfig(hidden=16, rank=12, dtype="float64")).eval()
    if not isinstance(model, KernelModel):
        pytest.skip(f"{kind} has no kernel (it is not a KernelModel)")
    x = torch.rand(20, 3, dtype=torch.float64) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(model.kernel(x, diag=True), torch.diagonal(model.kernel(x, x)))
        torch.testing.assert_close(model.kernel(x), model.kernel(x, x))
        with pytest.raises(ValueError, match="pass no x2"):
            model.kernel(x, x, diag=True)


def test_only_the_non_gp_baselines_have_no_kernel():
    config = ModelConfig(hidden=16, rank=12, dtype="float64")
    models = {kind: build_model(kind, 3, config).eval() for kind in available_models()}
    assert all(isinstance(model, ZooModel) for model in models.values())
    without = sorted(kind for kind, model in models.items() if not isinstance(model, KernelModel))
    assert without == ["dnn", "knn"]
    for kind in without:  # a kernel-free model has no kernel to ask for
        assert not hasattr(models[kind], "kernel") and not hasattr(models[kind], "posterior_factors")


def test_geomodel_prior_variance_matches_its_kernel_slice(tmp_path):
    from geodbk.dataset.coords import CoordinateTransform
    from geodbk.dataset.model_info import ModelInfo
    from geodbk.fit.geomodel import GeoModel
    from geodbk.dataset.inputs import InputSpace
    from geodbk.fit.train import fit_arrays
    from geodbk.models.config import TrainConfig

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (200, 2))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(200)
    reg = fit_arrays("dbk-rbf", X, y, X[:50], y[:50], model_config=ModelConfig(hidden=8, rank=8),
                     train_config=TrainConfig(lr=1e-3, epochs=2, progress=False))
    model = GeoModel(reg, InputSpace(CoordinateTransform(-67.0, 17.9, -65.2, 18.5), None, "paper"), ModelInfo(reg.kind))
    lonlat = np.column_stack([rng.uniform(-67.0, -65.2, 30), rng.uniform(17.9, 18.5, 30)])
    np.testing.assert_allclose(model.prior_variance(lonlat), np.diag(model.kernel_slice(lonlat, lonlat)), rtol=1e-5)
