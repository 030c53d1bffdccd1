"""Fused forms of the basis GP's per-batch products, with hand-written gradients.

Autograd records every elementwise step of the ARD RBF kernel (scale, squared norms, the
cross product, clamp, exp, outputscale) and of a row's squared norm (``pow``, ``sum``) as
its own kernel, forward and backward, each a full pass over an (n, r) matrix. On a CPU
at the CPU preset's r = 128, h = 64, those passes cost more than the matrix products: a
training step spent about half its time in them. The functions here compute the same
quantities, in the same float dtype, with one pass where autograd takes several, and
their backward passes are the analytic derivatives (checked against autograd in
``tests/test_fast_step.py``). Results equal the plain expressions up to float rounding.
"""

from __future__ import annotations

from typing import Any

import torch


def _rbf_forward(a_s: torch.Tensor, b_s: torch.Tensor, outputscale: torch.Tensor) -> torch.Tensor:
    """The kernel (n, m) between lengthscale-scaled a_s (n, h) and b_s (m, h)."""
    sq = torch.addmm((b_s * b_s).sum(-1), a_s, b_s.T, alpha=-2.0)
    sq.add_((a_s * a_s).sum(-1, keepdim=True))
    return sq.clamp_min_(0.0).mul_(-0.5).exp_().mul_(outputscale)


class _RBFKernel(torch.autograd.Function):
    """``s2 * exp(-0.5 * max(||a_i / l - b_j / l||^2, 0))`` for a (n, h), b (m, h): (n, m).

    Backward, with E = dk * k and a' = a / l, b' = b / l:
    ``da' = E b' - a' rowsum(E)``, ``db' = E^T a' - b' colsum(E)``,
    ``da = da' / l``, ``db = db' / l``, ``dl = -(sum_i da'_i * a'_i + sum_j db'_j * b'_j) / l``,
    ``ds2 = sum(dk * k) / s2``.

    The clamp only guards against rounding (||a'_i - b'_j||^2 >= 0 in exact arithmetic), so
    the backward treats it as the identity: where it acts, a'_i = b'_j up to rounding, and the
    term's share of da'_i, E_ij (b'_j - a'_i), is rounding too. ``clamp_min``'s own
    gradient would zero it instead; the difference is at float rounding, and leaving out
    the mask saves a pass over (n, m) forward and backward.
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, lengthscale: torch.Tensor, outputscale: torch.Tensor):
        a_s, b_s = a / lengthscale, b / lengthscale
        kernel = _rbf_forward(a_s, b_s, outputscale)
        ctx.save_for_backward(a_s, b_s, lengthscale, outputscale, kernel)
        return kernel

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        a_s, b_s, lengthscale, outputscale, kernel = ctx.saved_tensors
        need_a, need_b, need_l, need_s = ctx.needs_input_grad
        product = grad * kernel
        grad_s = (product.sum() / outputscale).reshape(outputscale.shape) if need_s else None
        grad_a = grad_b = grad_l = None
        if need_a or need_b or need_l:
            weight = product  # E
            da = torch.addcmul(weight @ b_s, a_s, weight.sum(-1, keepdim=True), value=-1.0)
            db = torch.addcmul(weight.T @ a_s, b_s, weight.sum(0).unsqueeze(-1), value=-1.0)
            if need_l:
                grad_l = -((da * a_s).sum(0) + (db * b_s).sum(0)) / lengthscale
                grad_l = grad_l.reshape(lengthscale.shape)
            grad_a = da / lengthscale if need_a else None
            grad_b = db / lengthscale if need_b else None
        return grad_a, grad_b, grad_l, grad_s


def rbf_kernel(a: torch.Tensor, b: torch.Tensor, lengthscale: torch.Tensor, outputscale: torch.Tensor) -> torch.Tensor:
    """:func:`geodbk.models.expansions.ard_rbf` (``s^2 exp(-0.5 ||(a - b) / l||^2)``, (n, m) for
    a (n, d), b (m, d), lengthscales (d,), s^2 ()) in fewer passes, with its analytic gradient."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, lengthscale, outputscale)):
        return _RBFKernel.apply(a, b, lengthscale, outputscale)
    return _rbf_forward(a / lengthscale, b / lengthscale, outputscale)


class _RowSquaredNorm(torch.autograd.Function):
    """``(u * u).sum(-1)``; backward ``2 u grad[:, None]`` in one pass."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor):
        ctx.save_for_backward(u)
        return (u * u).sum(-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (u,) = ctx.saved_tensors
        return u * (2.0 * grad).unsqueeze(-1)


def row_squared_norm(u: torch.Tensor) -> torch.Tensor:
    """||u_i||^2 for every row of a real ``u`` (n, r): (n,), the same as ``u.pow(2).sum(-1)``."""
    if torch.is_grad_enabled() and u.requires_grad:
        return _RowSquaredNorm.apply(u)
    return (u * u).sum(-1)
