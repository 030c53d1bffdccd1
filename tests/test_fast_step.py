"""The faster CPU training step computes the same thing: fused kernels with hand-written
gradients (:mod:`geodbk.models.fused`), the fused AdamW of :func:`make_optimizer`, and the
basis GP's cheaper KL and Cholesky-factor assembly, each against the plain form."""

import math

import pytest
import torch

from geodbk.fit.regressor import build_model
from geodbk.fit.step import TrainingStep, train_epoch
from geodbk.fit.train import make_optimizer
from geodbk.models import ModelConfig
from geodbk.models.config import TrainConfig
from geodbk.models.expansions import DeferredCholesky, ard_rbf, default_jitter, deferred_cholesky_checks
from geodbk.models.fused import rbf_kernel, row_squared_norm
from geodbk.models.objectives import gaussian_nll
from geodbk.models.zoo import get_model_spec


def _inputs(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(9, 4, generator=gen, dtype=dtype).requires_grad_()
    b = torch.randn(6, 4, generator=gen, dtype=dtype).requires_grad_()
    lengthscale = (torch.rand(4, generator=gen, dtype=dtype) + 0.5).requires_grad_()
    outputscale = torch.tensor(1.7, dtype=dtype, requires_grad=True)
    return a, b, lengthscale, outputscale


def test_rbf_kernel_gradients_pass_gradcheck():
    a, b, lengthscale, outputscale = _inputs()
    assert torch.autograd.gradcheck(rbf_kernel, (a, b, lengthscale, outputscale))
    # the Gram matrix of one set of points with itself (K_ZZ): both slots take the gradient
    assert torch.autograd.gradcheck(lambda z, ls, s: rbf_kernel(z, z, ls, s), (b, lengthscale, outputscale))


@pytest.mark.parametrize("same", [False, True])
def test_rbf_kernel_and_its_gradients_equal_ard_rbf(same):
    a, b, lengthscale, outputscale = _inputs()
    if same:
        a = b
    weights = torch.randn(len(a), len(b), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    leaves = (b, lengthscale, outputscale) if same else (a, b, lengthscale, outputscale)
    fast = rbf_kernel(a, b, lengthscale, outputscale)
    plain = ard_rbf(a, b, lengthscale, outputscale)
    torch.testing.assert_close(fast, plain, rtol=1e-12, atol=1e-12)
    for g_fast, g_plain in zip(
        torch.autograd.grad((fast * weights).sum(), leaves),
        torch.autograd.grad((plain * weights).sum(), leaves),
        strict=True,
    ):
        torch.testing.assert_close(g_fast, g_plain, rtol=1e-10, atol=1e-12)


def test_rbf_kernel_without_autograd_is_the_same_kernel():
    a, b, lengthscale, outputscale = _inputs(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(rbf_kernel(a, b, lengthscale, outputscale), ard_rbf(a, b, lengthscale, outputscale))


def test_row_squared_norm_and_its_gradient():
    u = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(row_squared_norm, (u,))
    torch.testing.assert_close(row_squared_norm(u), u.pow(2).sum(-1))


def _plain_chol_factor(model):
    rows, cols = model._tril_index
    strict = model.variational_log_diag.new_zeros(model.rank, model.rank).index_put(
        (rows, cols), model.variational_offdiag
    )
    return strict + torch.diag(model.variational_log_diag.exp())


def test_chol_factor_and_kl_equal_their_plain_forms():
    torch.manual_seed(0)
    model = build_model("dbk-rbf", 2, ModelConfig(hidden=8, rank=6)).double()
    with torch.no_grad():
        model.variational_log_diag.normal_()
        model.variational_mean.normal_()
    assert torch.equal(model.chol_factor, _plain_chol_factor(model))
    m, L = model.variational_mean, _plain_chol_factor(model)
    plain_kl = 0.5 * (m.pow(2).sum() + L.pow(2).sum() - 2.0 * model.variational_log_diag.sum() - model.rank)
    torch.testing.assert_close(model.kl_divergence(), plain_kl, rtol=1e-12, atol=1e-12)


def test_deferred_cholesky_adds_the_jitter_and_counts_only_finite_failures():
    guard = DeferredCholesky()
    guard.deferred = True
    matrix = torch.tensor([[2.0, 1.0], [1.0, 3.0]], requires_grad=True)
    factor = guard(matrix, 0.5)
    expected = torch.linalg.cholesky(matrix.detach() + 0.5 * torch.eye(2))
    torch.testing.assert_close(factor, expected)
    factor.sum().backward()  # the jitter is a constant: the gradient reaches the matrix
    assert matrix.grad is not None and torch.isfinite(matrix.grad).all()
    assert int(guard.failures) == 0
    guard(torch.tensor([[1.0, 2.0], [2.0, 1.0]]), 0.0)  # indefinite: a jitter failure
    assert int(guard.failures) == 1
    for bad in (math.nan, math.inf, -math.inf):
        guard(torch.tensor([[1.0, bad], [bad, 1.0]]), 0.0)  # non-finite: not counted
    assert int(guard.failures) == 1


def _reference_optimizer(model, tc):
    """make_optimizer's groups with PyTorch's default (single-tensor on the CPU) AdamW."""
    decayed = {id(p) for p in model.backbone_parameters()}
    groups = [
        {"params": [p for p in model.parameters() if id(p) in decayed], "weight_decay": tc.weight_decay},
        {"params": [p for p in model.parameters() if id(p) not in decayed], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=tc.lr, foreach=False, fused=False)


def test_cpu_optimizer_is_fused_and_steps_like_the_single_tensor_adamw():
    tc = TrainConfig(lr=1e-2, weight_decay=1e-3)
    torch.manual_seed(0)
    model = build_model("dbk-rbf", 2, ModelConfig(hidden=8, rank=6)).double()
    twin = build_model("dbk-rbf", 2, ModelConfig(hidden=8, rank=6)).double()
    twin.load_state_dict(model.state_dict())
    fast, reference = make_optimizer(model, tc), _reference_optimizer(twin, tc)
    assert all(group["fused"] for group in fast.param_groups)
    gen = torch.Generator().manual_seed(2)
    for _ in range(10):
        x = torch.rand(32, 2, generator=gen, dtype=torch.float64)
        for m, opt in ((model, fast), (twin, reference)):
            opt.zero_grad()
            m(x).mean.pow(2).mean().backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)


def _plain_dppgp(model, x, y, n, alpha=0.1, beta=0.01):
    """The dPPGP loss of dbk-rbf written with autograd's own ops (ard_rbf, pow, the built L)."""
    expansion = model.basis.expansion
    g = model.basis.backbone(x)
    scale = expansion.log_outputscale.exp()
    lengthscale = expansion.log_lengthscale.exp()
    kzz = ard_rbf(expansion.inducing, expansion.inducing, lengthscale, scale)
    jitter = default_jitter(kzz.dtype) * scale.detach()
    lzz = torch.linalg.cholesky(kzz + jitter * torch.eye(model.rank, dtype=kzz.dtype))
    kz = ard_rbf(g, expansion.inducing, lengthscale, scale)
    phi = torch.linalg.solve_triangular(lzz.T, kz, upper=True, left=False)
    L = _plain_chol_factor(model)
    noise = model.noise()
    mean = phi @ model.variational_mean + model.constant_mean
    var = (phi @ L).pow(2).sum(-1) + noise
    sq_norm = phi.pow(2).sum(-1)
    m = model.variational_mean
    kl = 0.5 * (m.pow(2).sum() + L.pow(2).sum() - 2.0 * model.variational_log_diag.sum() - model.rank)
    trace = ((sq_norm.max() - sq_norm) / (2.0 * noise)).mean()
    return gaussian_nll(y, mean, var).mean() + alpha * trace + (beta / n) * kl


def test_dppgp_loss_and_gradients_equal_the_plain_autograd_form():
    torch.manual_seed(0)
    model = build_model("dbk-rbf", 2, ModelConfig(hidden=16, rank=12)).double()
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(50, 2, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.randn(50, generator=gen, dtype=torch.float64)
    objective = get_model_spec("dbk-rbf").objective(TrainConfig())
    with deferred_cholesky_checks(model):
        fast = objective(model, x, y, 500)
        grads = torch.autograd.grad(fast, list(model.parameters()))
    plain = _plain_dppgp(model, x, y, 500)
    plain_grads = torch.autograd.grad(plain, list(model.parameters()))
    torch.testing.assert_close(fast, plain, rtol=1e-10, atol=1e-12)
    for (name, _), g_fast, g_plain in zip(model.named_parameters(), grads, plain_grads, strict=True):
        torch.testing.assert_close(g_fast, g_plain, rtol=1e-8, atol=1e-10, msg=name)


def test_an_epoch_equals_the_plain_loss_with_single_tensor_adamw():
    """Five float64 steps of the real TrainingStep match the plain loss stepped by the reference AdamW."""
    tc = TrainConfig(batch_size=40, lr=1e-2)
    cfg = ModelConfig(hidden=16, rank=12)
    torch.manual_seed(0)
    model = build_model("dbk-rbf", 2, cfg).double()
    twin = build_model("dbk-rbf", 2, cfg).double()
    twin.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(4)
    X = torch.rand(200, 2, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(200, generator=gen, dtype=torch.float64)
    step = TrainingStep(model, get_model_spec("dbk-rbf").objective(tc), make_optimizer(model, tc), X, y)
    train_epoch(step, tc, False, torch.Generator().manual_seed(5), kind="dbk-rbf", epoch=1)
    reference = _reference_optimizer(twin, tc)
    for index in torch.randperm(200, generator=torch.Generator().manual_seed(5)).split(tc.batch_size):
        reference.zero_grad()
        _plain_dppgp(twin, X[index], y[index], 200).backward()
        reference.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_kernel_and_norm_on_cuda_equal_their_plain_forms_with_exact_gradients():
    """The hand-written backwards run on the device as on the host: gradcheck in float64 on CUDA,
    and the values and gradients of rbf_kernel equal ard_rbf's there."""
    a, b, lengthscale, outputscale = (t.detach().cuda().requires_grad_() for t in _inputs())
    assert torch.autograd.gradcheck(rbf_kernel, (a, b, lengthscale, outputscale))
    assert torch.autograd.gradcheck(row_squared_norm, (a,))
    fast, plain = rbf_kernel(a, b, lengthscale, outputscale), ard_rbf(a, b, lengthscale, outputscale)
    torch.testing.assert_close(fast, plain, rtol=1e-12, atol=1e-12)
    leaves = (a, b, lengthscale, outputscale)
    for g_fast, g_plain in zip(torch.autograd.grad(fast.sum(), leaves), torch.autograd.grad(plain.sum(), leaves),
                               strict=True):
        torch.testing.assert_close(g_fast, g_plain, rtol=1e-10, atol=1e-12)
