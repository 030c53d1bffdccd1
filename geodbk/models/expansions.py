"""Expansion layers: lift a backbone representation g(x) in R^h to r basis functions.

* :class:`RBFInducingExpansion` (DBK-RBF, and the Nystrom features of SV-RBF / SV-DKL /
  PP-DKL): ``phi(x) = L_ZZ^{-1} k_Z(g(x))``.
* :class:`SiLUExpansion` (DBK-SiLU, VBLL): ``phi(x) = s * SiLU(W g(x) + b)``.

Whitening choice. The method text writes ``K_ZZ^{-1/2} k_Z``; geodbk uses the lower
Cholesky factor ``L_ZZ`` of the jittered ``K_ZZ`` instead and computes ``L_ZZ^{-1} k_Z``
with a triangular solve (never an explicit inverse). Both give the same kernel,
``phi(x).phi(x') = k_Z(x)^T K_ZZ^{-1} k_Z(x')`` (the Nystrom kernel), and the two bases
differ by an orthogonal rotation, to which the N(0, I_r) weight prior is invariant.

Folded prediction. Both expansions are ``phi(g) = features(g) @ T`` for a fixed (r, r)
matrix T (``L_ZZ^{-T}`` for the RBF basis, ``diag(s)`` for SiLU); :meth:`fold` returns
``T @ M``, so a prediction ``phi(g) @ M = features(g) @ (T @ M)`` needs no per-point
triangular solve once ``T @ M`` is precomputed (see
:meth:`geodbk.models.basis_gp.BasisGP.forward`).

Host syncs. In training the trainer switches every :class:`DeferredCholesky` to deferred
checks (:func:`deferred_cholesky_checks`): a Cholesky failure is counted on the device and
read once per epoch instead of at every step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from geodbk.models.fused import rbf_kernel

#: Tenfold jitter increases tried after the first jitter level fails (4 levels in all).
MAX_JITTER_LEVEL = 3


def jittered_cholesky(
    matrix: torch.Tensor, jitter: float | torch.Tensor, max_tries: int = MAX_JITTER_LEVEL + 1
) -> torch.Tensor:
    """Lower Cholesky factor of ``matrix + jitter * I``; the jitter grows tenfold on failure.

    Each try reads the failure flag on the host (a device sync on CUDA).

    Args:
        matrix: (r, r) symmetric positive semi-definite matrix.
        jitter: absolute diagonal jitter added on the first try (a float or a 0-d tensor).
        max_tries: how many jitter levels to try before raising.

    Raises:
        torch.linalg.LinAlgError: when every jitter level fails.
    """
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    for attempt in range(max_tries):
        factor, info = torch.linalg.cholesky_ex(matrix + (jitter * 10**attempt) * eye)
        if not bool(info.any()):
            return factor
    raise torch.linalg.LinAlgError(
        f"Cholesky failed with diagonal jitter up to {jitter * 10 ** (max_tries - 1):.1e}"
    )


class DeferredCholesky(nn.Module):
    """Jittered Cholesky factors whose failure check can wait for the end of an epoch.

    Normally (``deferred`` false) a call is :func:`jittered_cholesky` starting at jitter
    ``jitter * 10**level``. While the trainer defers checks (:func:`deferred_cholesky_checks`),
    a call factors ``matrix + jitter * 10**level * I`` once with
    :func:`torch.linalg.cholesky_ex` and adds 1 to the device counter ``failures`` if that
    failed on a finite matrix, so a training step never waits for the host. The trainer reads ``failures`` once
    per epoch and, when it is non-zero, redoes the epoch with ``level + 1``.

    ``level`` is not saved with the weights: a reloaded model starts again at level 0 and
    grows the jitter where it must.
    """

    failures: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.deferred = False
        self.level = 0
        self.register_buffer("failures", torch.zeros((), dtype=torch.int32), persistent=False)

    def forward(self, matrix: torch.Tensor, jitter: float | torch.Tensor) -> torch.Tensor:
        """Lower factor (r, r) of ``matrix`` (r, r) plus the jitter (absolute, at level 0) times 10^level."""
        jitter = jitter * 10**self.level
        if not self.deferred:
            return jittered_cholesky(matrix, jitter, max_tries=MAX_JITTER_LEVEL + 1 - self.level)
        # matrix + jitter * I without an (r, r) identity: a copy with its diagonal raised
        jittered = matrix.clone()
        jittered.diagonal().add_(jitter)
        factor, info = torch.linalg.cholesky_ex(jittered)
        # a non-finite matrix (parameters already NaN) is no jitter problem: not counted. Its
        # smallest and largest entries are both finite exactly when every entry is (min and max
        # propagate NaN); one float reduction, where isfinite().all() makes an (r, r) bool pass.
        low, high = torch.aminmax(matrix.detach())
        self.failures.add_((info.ne(0) & low.isfinite() & high.isfinite()).to(self.failures.dtype))
        return factor


@contextmanager
def deferred_cholesky_checks(model: nn.Module) -> Iterator[list[DeferredCholesky]]:
    """Defer the failure checks of every :class:`DeferredCholesky` in ``model``; yields them."""
    guards = [m for m in model.modules() if isinstance(m, DeferredCholesky)]
    for guard in guards:
        guard.deferred = True
    try:
        yield guards
    finally:
        for guard in guards:
            guard.deferred = False


def ard_rbf(a: torch.Tensor, b: torch.Tensor, lengthscale: torch.Tensor, outputscale: torch.Tensor) -> torch.Tensor:
    """``s^2 exp(-0.5 ||(a - b) / l||^2)`` between a (n, d) and b (k, d): (n, k)."""
    a, b = a / lengthscale, b / lengthscale
    sq = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1) - 2.0 * a @ b.T
    return outputscale * torch.exp(-0.5 * sq.clamp_min(0.0))


def default_jitter(dtype: torch.dtype) -> float:
    """Relative diagonal jitter for K_ZZ: 1e-4 in float32, 1e-6 in float64."""
    return 1e-6 if dtype == torch.float64 else 1e-4


class FoldingExpansion(nn.Module):
    """An expansion ``phi(g) = features(g) @ T`` for a fixed (r, r) matrix T: it can fold T into
    weights (module docstring). Subclasses define :meth:`features`, :meth:`fold` and ``forward``."""

    def features(self, g: torch.Tensor) -> torch.Tensor:
        """The unmixed features of ``g`` (n, h): (n, r)."""
        raise NotImplementedError

    def fold(self, weights: torch.Tensor) -> torch.Tensor:
        """T @ ``weights`` (r, k), so that ``phi(g) @ weights = features(g) @ fold(weights)``."""
        raise NotImplementedError


class InducingExpansion(FoldingExpansion):
    """A folding expansion from a kernel with a prior variance k(g, g): it can carry a Nystrom
    residual (:class:`~geodbk.models.basis_gp.BasisGP` ``include_residual``)."""

    def prior_variance(self, g: torch.Tensor) -> torch.Tensor:
        """k(g, g) for every row of ``g`` (n, h): (n,)."""
        raise NotImplementedError


class RBFInducingExpansion(InducingExpansion):
    """Whitened inducing-point RBF basis ``phi(g) = L_ZZ^{-1} k_Z(g)``.

    The ARD RBF kernel is ``k(a, b) = s^2 exp(-0.5 sum_j (a_j - b_j)^2 / l_j^2)``.

    Args:
        input_dim: h, the width of g(x) (d for SV-RBF on raw inputs).
        rank: r, the number of inducing points Z (r, h), initialised U[-1, 1].
        jitter: diagonal jitter relative to s^2; ``None`` picks :func:`default_jitter`
            from the parameter dtype at call time.

    Lengthscales are initialised to sqrt(h) and the outputscale s^2 to 1; both are
    stored as logs.

    Shapes: ``forward`` maps ``(n, h) -> (n, r)``; ``phi = features(g) @ L_ZZ^{-T}``.
    """

    def __init__(self, input_dim: int, rank: int, jitter: float | None = None) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = rank
        self.jitter = jitter
        self.inducing = nn.Parameter(torch.rand(rank, input_dim) * 2.0 - 1.0)
        self.log_lengthscale = nn.Parameter(torch.full((input_dim,), 0.5 * math.log(input_dim)))
        self.log_outputscale = nn.Parameter(torch.zeros(()))
        self.cholesky = DeferredCholesky()

    @property
    def outputscale(self) -> torch.Tensor:
        """s^2, the prior variance k(g, g) of the RBF kernel."""
        return self.log_outputscale.exp()

    def base_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The ARD RBF kernel matrix between ``a`` (n, h) and ``b`` (m, h): (n, m) (:func:`ard_rbf`,
        computed by :func:`~geodbk.models.fused.rbf_kernel`)."""
        return rbf_kernel(a, b, self.log_lengthscale.exp(), self.outputscale)

    def inducing_cholesky(self) -> torch.Tensor:
        """Lower Cholesky factor of the jittered K_ZZ, (r, r)."""
        jitter = self.jitter if self.jitter is not None else default_jitter(self.inducing.dtype)
        kzz = self.base_kernel(self.inducing, self.inducing)
        return self.cholesky(kzz, jitter * self.outputscale.detach())

    def features(self, g: torch.Tensor) -> torch.Tensor:
        """k_Z(g)^T, the kernel between ``g`` (n, h) and the inducing points: (n, r)."""
        return self.base_kernel(g, self.inducing)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        # phi = k_Z^T L_ZZ^{-T}: the solve X L_ZZ^T = k_Z^T, so k_Z (n rows) stays contiguous
        return torch.linalg.solve_triangular(self.inducing_cholesky().T, self.features(g), upper=True, left=False)

    def fold(self, weights: torch.Tensor) -> torch.Tensor:
        """L_ZZ^{-T} @ ``weights`` (r, k), so that ``phi(g) @ weights = features(g) @ fold(weights)``."""
        return torch.linalg.solve_triangular(self.inducing_cholesky().T, weights, upper=True)

    def prior_variance(self, g: torch.Tensor) -> torch.Tensor:
        """k(g, g) = s^2 for every row of ``g``: (n,)."""
        return self.outputscale.expand(g.shape[0])


class SiLUExpansion(FoldingExpansion):
    """``phi(g) = s * SiLU(W g + b)`` with a learnable diagonal scale s.

    Args:
        input_dim: h, the width of g(x).
        rank: r, the number of basis functions.

    s is initialised to random signs / sqrt(r), so that ||phi||^2 starts at O(1).
    Shapes: ``(n, h) -> (n, r)``; ``phi = features(g) @ diag(s)``.
    """

    def __init__(self, input_dim: int, rank: int) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = rank
        self.linear = nn.Linear(input_dim, rank)
        signs = torch.randint(0, 2, (rank,)).to(torch.get_default_dtype()) * 2.0 - 1.0
        self.scale = nn.Parameter(signs / math.sqrt(rank))

    def features(self, g: torch.Tensor) -> torch.Tensor:
        """SiLU(W g + b) for ``g`` (n, h): (n, r)."""
        return nn.functional.silu(self.linear(g))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return self.scale * self.features(g)

    def fold(self, weights: torch.Tensor) -> torch.Tensor:
        """diag(s) @ ``weights`` (r, k), so that ``phi(g) @ weights = features(g) @ fold(weights)``."""
        return self.scale.unsqueeze(-1) * weights
