"""Training, the heteroskedastic 1-D experiment, persistence and resuming."""

import math

import numpy as np
import pytest
import torch

from geodbk.errors import InputDataError
from geodbk.fit.metrics import coverage95, nll
from geodbk.models import ModelConfig
from geodbk.fit.regressor import Regressor, resolve_device
from geodbk.fit.train import fit_arrays
from geodbk.models.config import TrainConfig

SMALL = ModelConfig(hidden=16, rank=8)


def _heteroskedastic(n, rng):
    """f(x) = sin(3x) on U[-1, 1], noise sd ramping smoothly from 0.05 to 0.5 around x = 0."""
    x = rng.uniform(-1, 1, size=(n, 1))
    sd = 0.05 + 0.45 / (1 + np.exp(-10 * x[:, 0]))
    return x, np.sin(3 * x[:, 0]) + sd * rng.standard_normal(n), sd


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    X, y, _ = _heteroskedastic(300, rng)
    Xv, yv, _ = _heteroskedastic(100, rng)
    return X, y, Xv, yv


def test_dppgp_is_calibrated_where_exact_mml_collapses():
    rng = np.random.default_rng(0)
    X, y, _ = _heteroskedastic(1500, rng)
    Xv, yv, _ = _heteroskedastic(300, rng)
    Xt, yt, sd_true = _heteroskedastic(1000, rng)
    cfg = ModelConfig(hidden=32, rank=16)
    dppgp = fit_arrays("dbk-silu", X, y, Xv, yv, model_config=cfg,
                       train_config=TrainConfig(lr=1e-3, epochs=60, batch_size=128, patience=None, progress=False))
    exact = fit_arrays("exact-dbk", X, y, Xv, yv, model_config=cfg,
                       train_config=TrainConfig(lr=1e-3, epochs=300, patience=None, progress=False))
    p_dppgp, p_exact = dppgp.predict(Xt), exact.predict(Xt)

    assert nll(yt, p_dppgp) < nll(yt, p_exact) - 1.0
    assert np.corrcoef(p_dppgp.sd, sd_true)[0, 1] > 0.5  # PI widths track the true noise
    assert 0.9 < coverage95(yt, p_dppgp) < 0.99
    # MML drives sigma^2 far below the true noise and becomes overconfident
    learned_noise = float(exact.model.noise().detach()) * exact.y_std**2
    assert learned_noise < 0.25 * np.mean(sd_true**2)
    assert coverage95(yt, p_exact) < 0.85


def test_returned_weights_are_the_best_validation_epoch(toy):
    X, y, Xv, yv = toy
    reg = fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL,
                     train_config=TrainConfig(epochs=6, batch_size=64, lr=3e-2, progress=False))
    best = min(h["val_nll"] for h in reg.history)
    assert reg.history[reg.best_epoch - 1]["val_nll"] == best
    assert nll(yv, reg.predict(Xv)) == pytest.approx(best, abs=1e-4)


def test_targets_are_reported_in_original_units(toy):
    X, y, Xv, yv = toy
    tc = TrainConfig(lr=1e-3, epochs=2, batch_size=64, progress=False)
    a, b = 100.0, 5.0
    base = fit_arrays("dbk-silu", X, y, Xv, yv, model_config=SMALL, train_config=tc)
    scaled = fit_arrays("dbk-silu", X, a * y + b, Xv, a * yv + b, model_config=SMALL, train_config=tc)
    p0, p1 = base.predict(X[:20]), scaled.predict(X[:20])
    np.testing.assert_allclose(p1.mean, a * p0.mean + b, rtol=1e-4)
    np.testing.assert_allclose(p1.sd, a * p0.sd, rtol=1e-4)
    for h0, h1 in zip(base.history, scaled.history):
        assert h1["val_nll"] == pytest.approx(h0["val_nll"] + math.log(a), abs=1e-4)
    np.testing.assert_allclose(scaled.kernel(X[:3], X[:2]), a**2 * base.kernel(X[:3], X[:2]), rtol=1e-4)


def test_save_load_round_trip_gives_identical_predictions(toy, tmp_path):
    X, y, Xv, yv = toy
    reg = fit_arrays("sv-dkl", X, y, Xv, yv, model_config=SMALL,
                     train_config=TrainConfig(lr=1e-3, epochs=2, batch_size=64, progress=False))
    path = tmp_path / "m" / "sv-dkl.pt"
    reg.save(path)
    for device in ("cpu", "auto"):
        loaded = Regressor.load(path, device=device)
        assert loaded.kind == "sv-dkl" and loaded.y_std == reg.y_std and loaded.best_epoch == reg.best_epoch
        assert loaded.device == resolve_device(device)
        p0, p1 = reg.predict(Xv), loaded.predict(Xv)
        if device == "cpu":
            np.testing.assert_array_equal(p0.mean, p1.mean)
            np.testing.assert_array_equal(p0.sd, p1.sd)
            np.testing.assert_array_equal(reg.kernel(Xv[:4], Xv[:3]), loaded.kernel(Xv[:4], Xv[:3]))
    with pytest.raises(InputDataError):
        Regressor.load(tmp_path / "missing.pt")


def test_resume_continues_from_saved_epoch_and_optimizer_state(toy, tmp_path):
    X, y, Xv, yv = toy
    common = dict(batch_size=64, patience=None, progress=False, seed=3)
    straight = fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL, train_config=TrainConfig(lr=1e-3, epochs=4, **common))
    ckpt = tmp_path / "ckpt.pt"
    first = fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL,
                       train_config=TrainConfig(lr=1e-3, epochs=2, checkpoint_path=str(ckpt), **common))
    saved = torch.load(ckpt, weights_only=False)
    assert saved["state"]["epoch"] == 2
    steps = math.ceil(len(X) / 64) * 2
    assert all(int(s["step"]) == steps for s in saved["optimizer_state"]["state"].values())
    assert len(first.history) == 2
    resumed = fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL,
                         train_config=TrainConfig(lr=1e-3, epochs=4, **common), resume=ckpt)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    assert resumed.history == straight.history
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(InputDataError, match="different model"):
        fit_arrays("dbk-silu", X, y, Xv, yv, model_config=SMALL,
                   train_config=TrainConfig(lr=1e-3, epochs=4, resume_from=str(ckpt), **common))


def test_float64_option_and_every_kind_trains(toy):
    X, y, Xv, yv = toy
    for kind in ("dbk-silu", "exact-dbk", "sv-rbf", "pp-dkl", "vbll", "dnn"):
        reg = fit_arrays(kind, X, y, Xv, yv, model_config=ModelConfig(hidden=8, rank=4, dtype="float64"),
                         train_config=TrainConfig(lr=1e-3, epochs=2, batch_size=128, progress=False))
        assert all(p.dtype == torch.float64 for p in reg.model.parameters()), kind
        pred = reg.predict(Xv)
        assert np.isfinite(pred.mean).all() and (pred.sd > 0).all(), kind


def test_dnn_noise_is_the_training_mse(toy):
    X, y, Xv, yv = toy
    reg = fit_arrays("dnn", X, y, Xv, yv, model_config=SMALL,
                     train_config=TrainConfig(lr=1e-3, epochs=3, batch_size=64, patience=None, progress=False))
    mse = np.mean((reg.predict(X).mean - y) ** 2)
    assert float(reg.predict(X[:1]).sd[0]) ** 2 == pytest.approx(mse, rel=1e-4)
    with pytest.raises(TypeError, match="no kernel"):
        reg.kernel(X[:2], X[:1])


def test_bad_inputs_raise_clear_errors(toy):
    X, y, Xv, yv = toy
    tc = TrainConfig(lr=1e-3, epochs=1, progress=False)
    with pytest.raises(InputDataError, match="values"):
        fit_arrays("dbk-rbf", X, y[:-1], Xv, yv, train_config=tc)
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(InputDataError, match="NaN"):
        fit_arrays("dbk-rbf", X, bad, Xv, yv, train_config=tc)
    with pytest.raises(InputDataError, match="columns"):
        fit_arrays("dbk-rbf", X, y, np.c_[Xv, Xv], yv, train_config=tc)
    with pytest.raises(InputDataError, match="constant"):
        fit_arrays("dbk-rbf", X, np.ones_like(y), Xv, yv, train_config=tc)
    with pytest.raises(KeyError, match="unknown model"):
        fit_arrays("gp-magic", X, y, Xv, yv, train_config=tc)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(dtype="float16")


def test_resume_from_a_missing_or_corrupt_checkpoint_is_a_clear_error(toy, tmp_path):
    X, y, Xv, yv = toy
    cfg = TrainConfig(lr=1e-3, epochs=1, progress=False)
    with pytest.raises(InputDataError, match="no model file"):
        fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL, train_config=cfg, resume=tmp_path / "absent.pt")
    bad = tmp_path / "bad.pt"
    bad.write_text("truncated")
    with pytest.raises(InputDataError, match="not a geodbk model file"):
        fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL, train_config=cfg, resume=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fit_predicts_like_its_cpu_reload(toy, tmp_path):
    X, y, Xv, yv = toy
    reg = fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=SMALL,
                     train_config=TrainConfig(lr=1e-3, epochs=2, progress=False, device="cuda"))
    assert next(reg.model.parameters()).is_cuda
    reg.save(tmp_path / "gpu.pt")
    cpu = Regressor.load(tmp_path / "gpu.pt", device="cpu")
    assert not next(cpu.model.parameters()).is_cuda
    on_gpu, on_cpu = reg.predict(Xv), cpu.predict(Xv)
    np.testing.assert_allclose(on_cpu.mean, on_gpu.mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(on_cpu.sd, on_gpu.sd, rtol=1e-4, atol=1e-5)
