"""The k-nearest-tiles baseline (geodbk.models.knn): trend, local moments, k choice, persistence."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from geodbk.models import ModelConfig, get_model_spec
from geodbk.models.knn import K_GRID, NearestTilesModel, fit_nearest_tiles
from geodbk.models.config import TrainConfig

SLOPE = 0.8


def synthetic(n: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 3) inputs (x, y, t) uniform on [-1, 1]^3 and y = 0.8 t + smooth field + N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, 3))
    y = SLOPE * X[:, 2] + np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.1 * rng.standard_normal(n)
    return torch.as_tensor(X, dtype=dtype), torch.as_tensor(y, dtype=dtype)


def fit(X: torch.Tensor, y: torch.Tensor, X_val: torch.Tensor, y_val: torch.Tensor) -> NearestTilesModel:
    return fit_nearest_tiles(X, y, X_val, y_val, ModelConfig(), TrainConfig())


def brute_force(
    X: np.ndarray, y: np.ndarray, X_new: np.ndarray, k: int, floor: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Numpy reference: (mean, variance) at X_new of trend + k-nearest residual moments."""
    b, a = np.polyfit(X[:, 2], y, 1)
    residual = y - (a + b * X[:, 2])
    dist = np.linalg.norm(X_new[:, None, :2] - X[None, :, :2], axis=-1)
    near = residual[np.argsort(dist, axis=1)[:, :k]]
    var = np.maximum(near.var(axis=1, ddof=1) * (1 + 1 / k), floor)
    return a + b * X_new[:, 2] + near.mean(axis=1), var


def test_recovers_trend_and_beats_global_mean():
    X, y = synthetic(3000, seed=0)
    X_val, y_val = synthetic(500, seed=1)
    X_test, y_test = synthetic(500, seed=2)
    model = fit(X, y, X_val, y_val)
    assert abs(float(model.trend[1]) - SLOPE) < 0.1 * SLOPE
    out = model(X_test)
    mse = float((out.mean - y_test).pow(2).mean())
    baseline = float((y.mean() - y_test).pow(2).mean())
    assert mse < 0.5 * baseline
    assert torch.equal(out.var_f, torch.zeros(500, dtype=torch.float64))
    assert out.tile_noise is out.noise and bool((out.noise > 0).all())


def test_chosen_k_is_the_validation_nll_argmin():
    X, y = synthetic(400, seed=3)
    X_val, y_val = synthetic(200, seed=4)
    model = fit(X, y, X_val, y_val)
    assert sorted(model.validation_nll) == list(K_GRID)
    chosen = int(model.k)
    assert chosen == min(model.validation_nll, key=model.validation_nll.__getitem__)
    other = 160 if chosen != 160 else 5
    for k in (chosen, other):
        mean, var = brute_force(X.numpy(), y.numpy(), X_val.numpy(), k)
        direct = np.mean(0.5 * (np.log(2 * np.pi * var) + (y_val.numpy() - mean) ** 2 / var))
        assert model.validation_nll[k] == pytest.approx(direct, rel=1e-9)
    assert model.validation_nll[chosen] < model.validation_nll[other]


def test_k_grid_is_clipped_to_n_minus_one():
    X, y = synthetic(12, seed=5)
    model = fit(X, y, *synthetic(6, seed=6))
    assert sorted(model.validation_nll) == [5, 10, 11]


def test_prediction_matches_hand_computation():
    X, y = synthetic(15, seed=7)
    X_new, _ = synthetic(9, seed=8)
    model = fit(X, y, *synthetic(10, seed=9))
    k = int(model.k)
    mean, var = brute_force(X.numpy(), y.numpy(), X_new.numpy(), k)
    out = model(X_new)
    np.testing.assert_allclose(out.mean.numpy(), mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.noise.numpy(), var, rtol=1e-10, atol=1e-12)


def test_without_time_column_the_trend_is_the_mean():
    X, y = synthetic(50, seed=10)
    X_new, _ = synthetic(7, seed=11)
    model = fit(X[:, :2], y, X[:20, :2], y[:20])
    assert float(model.trend[1]) == 0.0
    residual = (y - y.mean()).numpy()
    dist = np.linalg.norm(X_new[:, None, :2].numpy() - X[None, :, :2].numpy(), axis=-1)
    near = residual[np.argsort(dist, axis=1)[:, : int(model.k)]]
    np.testing.assert_allclose(model(X_new[:, :2]).mean.numpy(), float(y.mean()) + near.mean(axis=1), rtol=1e-10)


def test_state_dict_round_trip_gives_identical_predictions():
    X, y = synthetic(300, seed=12, dtype=torch.float32)
    X_test, _ = synthetic(50, seed=13, dtype=torch.float32)
    model = fit(X, y, *synthetic(100, seed=14, dtype=torch.float32))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    config = ModelConfig(dtype="float32")
    fresh = get_model_spec("knn").build(3, config).to(config.torch_dtype)
    assert len(fresh.residual) == 0
    fresh.load_state_dict(state)
    before, after = model(X_test), fresh(X_test)
    assert int(fresh.k) == int(model.k) and fresh.k.dtype == torch.int64
    assert torch.equal(before.mean, after.mean) and torch.equal(before.noise, after.noise)


def test_unfitted_model_refuses_to_predict():
    with pytest.raises(RuntimeError, match="not fitted"):
        NearestTilesModel(3)(torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64_inputs(dtype):
    X, y = synthetic(200, seed=15, dtype=dtype)
    X_test, _ = synthetic(30, seed=16, dtype=dtype)
    model = fit(X, y, *synthetic(60, seed=17, dtype=dtype))
    out = model(X_test)
    assert out.mean.dtype == dtype and out.noise.dtype == dtype and out.var_f.dtype == dtype
    assert out.mean.shape == out.noise.shape == (30,)
    reference = fit(*synthetic(200, seed=15), *synthetic(60, seed=17))(synthetic(30, seed=16)[0])
    np.testing.assert_allclose(out.mean.double().numpy(), reference.mean.numpy(), rtol=1e-4, atol=1e-4)
