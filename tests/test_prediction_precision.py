"""Reduced-precision prediction: the backbone at TF32/bf16, features and projection in float32 (issue 12)."""

import numpy as np
import pytest
import torch

from geodbk.errors import InputDataError
from geodbk.fit.regressor import Regressor, build_model
from geodbk.models import ModelConfig

CFG = ModelConfig(hidden=16, rank=24)


def _regressor(kind: str = "dbk-rbf", config: ModelConfig = CFG) -> Regressor:
    torch.manual_seed(0)
    model = build_model(kind, 3, config)
    if hasattr(model, "variational_mean"):
        with torch.no_grad():
            model.variational_mean.normal_()
            model.variational_offdiag.normal_(0.0, 0.3)
    return Regressor(kind=kind, model=model.eval(), model_config=config, input_dim=3, y_mean=1.5, y_std=0.6)


def _inputs(n: int = 2000) -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (n, 3))


def test_bf16_runs_the_backbone_only_at_reduced_precision():
    reg = _regressor()
    net = reg.model
    x = torch.as_tensor(_inputs(), dtype=torch.float32)
    reg.prediction_precision = "bf16"
    with torch.no_grad():
        out = net(x)
        # by hand: the backbone under bf16 autocast, then the float32 features and folded projection
        with torch.autocast("cpu", dtype=torch.bfloat16):
            g = net.basis.backbone(x)
        projected = net.basis.expansion.features(g.float()) @ net.folded_weights()
    assert out.mean.dtype == torch.float32
    torch.testing.assert_close(out.mean, projected[:, 0] + net.constant_mean, rtol=0, atol=0)
    torch.testing.assert_close(out.var_f, projected[:, 1:].pow(2).sum(-1), rtol=0, atol=0)


def test_bf16_prediction_is_close_to_float32_but_not_equal():
    reg = _regressor()
    X = _inputs()
    full = reg.predict(X)
    reg.prediction_precision = "bf16"
    half = reg.predict(X)
    mean_err = np.abs(half.mean - full.mean)
    sd_err = np.abs(half.sd / full.sd - 1)
    assert mean_err.max() > 0  # the reduced path ran
    assert mean_err.max() < 0.05 * reg.y_std and sd_err.max() < 0.1


def test_tf32_on_cpu_is_float32_and_training_ignores_the_setting():
    reg = _regressor()
    X = _inputs(500)
    full = reg.predict(X)
    reg.prediction_precision = "tf32"
    same = reg.predict(X)
    np.testing.assert_array_equal(same.mean, full.mean)
    np.testing.assert_array_equal(same.sd, full.sd)
    # with autograd on (training), the backbone is float32 whatever the setting
    reg.prediction_precision = "bf16"
    x = torch.as_tensor(X, dtype=torch.float32)
    trained = reg.model(x).mean
    reg.prediction_precision = "float32"
    torch.testing.assert_close(trained, reg.model(x).mean, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kind", "config", "precision", "message"),
    [
        ("dbk-rbf", CFG, "fp8", "precision must be one of float32, tf32, bf16"),
        ("dnn", CFG, "bf16", "dnn has no reduced-precision prediction"),
        ("dbk-rbf", ModelConfig(hidden=16, rank=24, dtype="float64"), "tf32", "needs a float32 model"),
    ],
)
def test_unusable_precisions_are_one_line_errors(kind, config, precision, message):
    reg = _regressor(kind, config)
    with pytest.raises(InputDataError, match=message):
        reg.prediction_precision = precision
    assert reg.prediction_precision == "float32"
    reg.prediction_precision = "float32"  # always allowed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tf32_on_cuda_is_close_and_restores_the_global_switch():
    reg = _regressor()
    reg.model.cuda()
    X = _inputs()
    full = reg.predict(X)
    before = torch.backends.cuda.matmul.allow_tf32
    reg.prediction_precision = "tf32"
    fast = reg.predict(X)
    assert torch.backends.cuda.matmul.allow_tf32 == before
    assert np.abs(fast.mean - full.mean).max() < 0.01 * reg.y_std
    assert np.abs(fast.sd / full.sd - 1).max() < 0.02
