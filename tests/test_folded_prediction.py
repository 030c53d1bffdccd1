"""Prediction with the whitening folded into precomputed weights (issue 12, item 2)."""

import pytest
import torch

from geodbk.fit.regressor import build_model
from geodbk.models import ModelConfig

CFG = ModelConfig(hidden=8, rank=12, dtype="float64")
FOLDING_KINDS = ("dbk-rbf", "dbk-silu", "sv-rbf", "sv-dkl")


def _model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A float64 model with a non-trivial q(w) and constant mean."""
    torch.manual_seed(seed)
    model = build_model(kind, 2, CFG)
    with torch.no_grad():
        model.variational_mean.normal_()
        model.variational_offdiag.normal_(0.0, 0.3)
        model.variational_log_diag.uniform_(-1.0, 0.5)
        model.constant_mean.fill_(0.7)
    return model


def _unfolded(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mean = phi^T m + c, var_f = ||L^T phi||^2 (+ s^2 - ||phi||^2 clamped), phi by the triangular solve."""
    g = model.basis.backbone(x)
    phi = model.basis.expansion(g)
    mean = phi @ model.variational_mean + model.constant_mean
    var_f = (phi @ model.chol_factor).pow(2).sum(-1)
    if model.include_residual:
        var_f = var_f + (model.basis.expansion.prior_variance(g) - phi.pow(2).sum(-1)).clamp_min(0.0)
    return mean, var_f


@pytest.mark.parametrize("kind", FOLDING_KINDS)
def test_folded_prediction_matches_the_unfolded_formula(kind):
    model = _model(kind)
    x = torch.rand(300, 2, dtype=torch.float64) * 2 - 1
    with torch.no_grad():
        mean, var_f = _unfolded(model, x)
        model.eval()
        out = model(x)
    assert out.phi is None  # the folded path ran: no per-point basis values
    torch.testing.assert_close(out.mean, mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(out.var_f, var_f, rtol=0, atol=1e-10)
    assert float(var_f.std()) > 1e-3  # the comparison is not between constants


def test_folded_prediction_does_no_triangular_solve_once_cached(monkeypatch):
    model = _model("dbk-rbf").eval()
    x = torch.rand(50, 2, dtype=torch.float64)
    calls = []
    solve = torch.linalg.solve_triangular

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return solve(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "solve_triangular", counting)
    with torch.no_grad():
        first = model(x).mean
        assert len(calls) == 1 and calls[0] == (12, 13)  # one solve, on the (r, 1 + r) weights
        for _ in range(3):
            torch.testing.assert_close(model(x).mean, first, rtol=0, atol=0)
    assert len(calls) == 1


def test_folded_weights_follow_parameter_changes():
    model = _model("sv-dkl").eval()
    x = torch.rand(40, 2, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        model.variational_mean.add_(0.5)  # in place, as an optimizer step does
        model.basis.expansion.log_lengthscale.sub_(0.2)
        after = model(x)
        expected_mean, expected_var = _unfolded(model, x)
    torch.testing.assert_close(after.mean, expected_mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(after.var_f, expected_var, rtol=0, atol=1e-10)
    assert not torch.allclose(after.mean, before.mean)

    other = _model("sv-dkl", seed=1)
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        reloaded = model(x).mean
        torch.testing.assert_close(reloaded, _unfolded(other, x)[0], rtol=0, atol=1e-10)


def test_train_mode_drops_the_cache_and_autograd_uses_the_basis():
    model = _model("dbk-rbf").eval()
    x = torch.rand(10, 2, dtype=torch.float64)
    with torch.no_grad():
        model(x)
    assert model._folded is not None
    model.train()
    assert model._folded is None
    model.eval()
    out = model(x)  # autograd on: gradients must reach the parameters through phi
    assert out.phi is not None
    out.mean.sum().backward()
    assert model.basis.expansion.inducing.grad is not None


def test_float32_folded_prediction_is_close_to_the_unfolded_one():
    model = _model("dbk-rbf").float()
    x = torch.rand(500, 2) * 2 - 1
    with torch.no_grad():
        mean, var_f = _unfolded(model, x)
        model.eval()
        out = model(x)
    torch.testing.assert_close(out.mean, mean, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.var_f, var_f, rtol=1e-3, atol=1e-5)
