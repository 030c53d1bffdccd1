"""The sync-free training step: device-side loss sums, deferred Cholesky checks, CUDA graphs."""

import numpy as np
import pytest
import torch
from torch import nn

from geodbk.errors import GeodbkError, TrainingError
from geodbk.fit.regressor import build_model
from geodbk.fit.step import TrainingStep, train_epoch
from geodbk.fit.train import fit_arrays, make_optimizer
from geodbk.models import ModelConfig, ModelSpec, register_model, unregister_model
from geodbk.models.config import TrainConfig
from geodbk.models.expansions import DeferredCholesky
from geodbk.models.objectives import Objective
from geodbk.models.zoo import get_model_spec

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _problem(n: int, device: str = "cpu", seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=gen) * 2 - 1
    y = torch.sin(3 * X[:, 0]) * X[:, 1] + 0.1 * torch.randn(n, generator=gen)
    tests = torch.randint(1, 20, (n,), generator=gen).float()
    return X.to(device), y.to(device), tests.to(device)


def _setup(kind: str, device: str, cfg: ModelConfig, tc: TrainConfig):
    torch.manual_seed(0)
    model = build_model(kind, 2, cfg).to(device)
    return model, get_model_spec(kind).objective(tc), make_optimizer(model, tc)


def _previous_epoch(model, objective, optimizer, X, y, tests, batch_size, generator) -> float:
    """The per-step implementation this replaces: host indices, a float(loss) sync every step."""
    model.train()
    n, total = len(X), 0.0
    for idx in torch.randperm(n, generator=generator).split(batch_size):
        xb, yb, tb = X[idx], y[idx], tests[idx]
        loss = objective(model, xb, yb, n, tb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach()) * len(yb)
    return total / n


@pytest.mark.parametrize("kind", ["dbk-rbf", "sv-dkl"])
def test_sync_free_epoch_matches_the_per_step_implementation(kind):
    cfg = ModelConfig(hidden=16, rank=8, test_noise=True)
    tc = TrainConfig(batch_size=64, lr=1e-2)
    X, y, tests = _problem(300)  # 4 full batches and a tail of 44 rows
    old = _setup(kind, "cpu", cfg, tc)
    new = _setup(kind, "cpu", cfg, tc)
    step = TrainingStep(*new, X, y, tests)
    assert not step.capture
    gen_old, gen_new = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for epoch in (1, 2, 3):
        expected = _previous_epoch(*old, X, y, tests, tc.batch_size, gen_old)
        got = train_epoch(step, tc, False, gen_new, kind=kind, epoch=epoch)
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    for (name, a), b in zip(old[0].state_dict().items(), new[0].state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=name)
    assert int(old[2].state_dict()["state"][0]["step"]) == 15  # 5 steps in each of 3 epochs


class _NeedsJitter(nn.Module):
    """y ~ x . w, plus a term in the Cholesky factor of diag(1, -5e-3) + jitter I.

    With jitter 1e-3 the factor fails; ten times that (1e-2) succeeds. A failed factor has
    a NaN diagonal, which would poison the loss, the gradients and AdamW's moments.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2))
        self.cholesky = DeferredCholesky()
        self.register_buffer("matrix", torch.diag(torch.tensor([1.0, -5e-3])))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ self.weight, self.cholesky(self.matrix, 1e-3)


class _JitterLoss(Objective):
    name = "toy"

    def __call__(self, model, x, y, n, tests=None):
        prediction, factor = model(x)
        return (y - prediction).pow(2).mean() + 1e-3 * torch.diagonal(factor).log().sum()


def _toy_run(device: str, level: int, capture: bool, epochs: int = 2):
    torch.manual_seed(0)
    model = _NeedsJitter().to(device)
    model.cholesky.level = level
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, capturable=device != "cpu")
    X = torch.rand(100, 2, generator=torch.Generator().manual_seed(1)).to(device)
    y = X @ torch.tensor([1.0, -2.0], device=device)
    step = TrainingStep(model, _JitterLoss(), optimizer, X, y, capture=capture)
    gen = torch.Generator().manual_seed(2)
    losses = [train_epoch(step, TrainConfig(batch_size=16), False, gen, kind="toy", epoch=e + 1) for e in range(epochs)]
    return model, losses


def test_a_failed_cholesky_redoes_the_epoch_with_more_jitter():
    model, losses = _toy_run("cpu", level=0, capture=False)
    assert model.cholesky.level == 1 and not model.cholesky.deferred
    assert all(np.isfinite(losses))
    # the failed attempt left no trace: the same as training at level 1 from the start
    reference, reference_losses = _toy_run("cpu", level=1, capture=False)
    torch.testing.assert_close(model.weight, reference.weight, rtol=0, atol=0)
    assert losses == reference_losses


def test_a_cholesky_failing_at_every_jitter_is_a_training_error():
    torch.manual_seed(0)
    model = _NeedsJitter()
    model.matrix[1, 1] = -1.0  # no jitter up to 1e-3 * 10^3 rescues it
    step = TrainingStep(model, _JitterLoss(), torch.optim.AdamW(model.parameters()), torch.rand(8, 2), torch.rand(8))
    with pytest.raises(TrainingError, match="toy: a Cholesky factor failed in epoch 4 .*float64"):
        train_epoch(step, TrainConfig(batch_size=4), False, torch.Generator(), kind="toy", epoch=4)


class _NaNAfter(Objective):
    """The dPPGP loss, made NaN from the ``after``-th call on."""

    name = "dPPGP"

    def __init__(self, inner: Objective, after: int) -> None:
        self.inner, self.after, self.calls = inner, after, 0

    def __call__(self, model, x, y, n, tests=None):
        self.calls += 1
        loss = self.inner(model, x, y, n, tests)
        return loss * float("nan") if self.calls >= self.after else loss


def test_a_non_finite_loss_is_a_one_line_training_error():
    spec = get_model_spec("dbk-rbf")
    register_model("nan-later", ModelSpec(spec.build, lambda tc: _NaNAfter(spec.objective(tc), after=6)))
    X, y, _ = _problem(200)
    try:
        with pytest.raises(TrainingError) as info:
            fit_arrays("nan-later", X.numpy(), y.numpy(), X[:50].numpy(), y[:50].numpy(),
                       model_config=ModelConfig(hidden=8, rank=4),
                       train_config=TrainConfig(epochs=5, batch_size=64, lr=1e-3, progress=False, device="cpu"))
    finally:
        unregister_model("nan-later")
    message = str(info.value)
    assert isinstance(info.value, GeodbkError) and "\n" not in message
    # 4 steps per epoch: the 6th call is in epoch 2
    assert message.startswith("nan-later: the training loss (dPPGP) became nan in epoch 2;")
    assert "lower lr (now 0.001)" in message and "float64" in message


@CUDA
def test_captured_step_matches_the_eager_step_after_five_steps():
    cfg = ModelConfig(hidden=32, rank=64)
    tc = TrainConfig(batch_size=128, lr=1e-2)
    X, y, tests = _problem(5 * 128, "cuda")
    runs = {}
    for capture in (False, True):
        parts = _setup("dbk-rbf", "cuda", ModelConfig(**{**cfg.to_dict(), "test_noise": True}), tc)
        step = TrainingStep(*parts, X, y, tests, capture=capture)
        loss = train_epoch(step, tc, False, torch.Generator().manual_seed(0), kind="dbk-rbf", epoch=1)
        runs[capture] = (parts[0], loss, step.replays, step.eager_reason)
    assert runs[True][3] is None
    assert runs[True][2] == 3 and runs[False][2] == 0  # 2 eager warm-up steps, then 3 replays
    assert runs[True][1] == pytest.approx(runs[False][1], abs=1e-5)
    for (name, a), b in zip(runs[False][0].state_dict().items(), runs[True][0].state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)


@CUDA
def test_captured_epochs_with_a_tail_batch_match_eager_epochs():
    tc = TrainConfig(batch_size=100, lr=1e-3)
    X, y, tests = _problem(3 * 100 + 37, "cuda")
    results = {}
    for capture in (False, True):
        parts = _setup("sv-dkl", "cuda", ModelConfig(hidden=16, rank=32), tc)
        step = TrainingStep(*parts, X, y, None, capture=capture)
        gen = torch.Generator().manual_seed(0)
        losses = [train_epoch(step, tc, False, gen, kind="sv-dkl", epoch=e + 1) for e in range(4)]
        results[capture] = (parts[0], losses, step.replays)
    # full size: 2 warm-up steps then replays; the 37-row tail: eager in epochs 1-2, graphed from epoch 3
    assert results[True][2] == (4 * 3 - 2) + 2
    np.testing.assert_allclose(results[True][1], results[False][1], atol=1e-5)
    eager, captured = results[False][0].state_dict(), results[True][0].state_dict()
    for (name, a), b in zip(eager.items(), captured.values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)


@CUDA
def test_cholesky_retry_works_under_capture():
    captured, losses = _toy_run("cuda", level=0, capture=True, epochs=3)
    eager, eager_losses = _toy_run("cuda", level=1, capture=False, epochs=3)
    assert captured.cholesky.level == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    torch.testing.assert_close(captured.weight, eager.weight, rtol=0, atol=1e-6)


class _SyncingLoss(Objective):
    name = "syncing"

    def __call__(self, model, x, y, n, tests=None):
        prediction, _ = model(x)
        loss = (y - prediction).pow(2).mean()
        return loss if float(loss) >= 0 else loss  # a host sync: this step cannot be captured


@CUDA
def test_a_step_that_syncs_stays_eager():
    model = _NeedsJitter().cuda()
    model.cholesky.level = 1
    X = torch.rand(64, 2, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), capturable=True)
    step = TrainingStep(model, _SyncingLoss(), optimizer, X, X[:, 0])
    assert step.capture
    train_epoch(step, TrainConfig(batch_size=8), False, torch.Generator(), kind="toy", epoch=1)
    assert not step.capture and step.replays == 0 and "synchronizing" in step.eager_reason


@CUDA
def test_fit_on_cuda_uses_the_captured_step_and_predicts_like_eager():
    X, y, tests = _problem(1000)
    common = dict(model_config=ModelConfig(hidden=16, rank=16),
                  train_config=TrainConfig(epochs=3, batch_size=128, lr=1e-3, progress=False, device="cuda"))
    reg = fit_arrays("dbk-rbf", X.numpy(), y.numpy(), X[:200].numpy(), y[:200].numpy(), **common)
    cpu = fit_arrays("dbk-rbf", X.numpy(), y.numpy(), X[:200].numpy(), y[:200].numpy(),
                     **{**common, "train_config": TrainConfig(**{**common["train_config"].to_dict(), "device": "cpu"})})
    np.testing.assert_allclose([h["val_nll"] for h in reg.history], [h["val_nll"] for h in cpu.history], atol=1e-4)
