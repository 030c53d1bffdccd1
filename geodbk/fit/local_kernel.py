"""The residual field's local kernel and the kriging solve that every use of it shares.

:class:`LocalKernel` is the local space-time covariance of a tile's offset from the GP
(:mod:`geodbk.fit.residuals` gives the model). :func:`krige` conditions it on each query's m
nearest training rows in one batched solve. Both are written once for numpy arrays and torch
tensors alike: maps and areas call them with arrays and float hyperparameters, and the
hyperparameter search (:mod:`geodbk.fit.kernel_search`) calls them with tensors and 0-d tensor
hyperparameters, so that autograd gives the criterion's exact gradient.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from geodbk.blocks import blocks
from geodbk.ingest.quadkey import SAME_TILE_M

#: Bounds of the hyperparameters (:class:`LocalKernel` field order): no variance above 1 (a
#: factor of 10 in speed at one sd), time scales between a quarter and 20 years. Without them a
#: validation set whose tiles all have training rows leaves an unseen tile's variance free to
#: run off. Ranges between a tile and 10 km: the field is local, and longer-range structure
#: belongs to the deep kernel. The validation NLL hardly tells ranges apart (HI random: 0.6319
#: at 45 km, 0.6325 at 4 km), but 16 nearest rows cannot pin down a long-range part, so an
#: area's variance then keeps it: HI validation county z sd 0.62 with the earlier 50 km bound,
#: 0.82 with 10 km (PR 0.98 and 1.00).
KERNEL_BOUNDS = ((0.05, 2.0), (1e-5, 1.0), (1e-5, 1.0), (0.25, 20.0), (1e-5, 1.0), (50.0, 10_000.0), (0.05, 4.0))


#: Neighbourhoods per batched solve in :func:`krige`: their (b, m, m) temporaries stay in the
#: CPU's cache (2 MB at m = 16), which made the search's criterion and its gradient a third faster
#: than one batch of every neighbourhood.
KRIGE_BLOCK = 1024


@dataclass(frozen=True)
class LocalKernel:
    """Hyperparameters of the local residual kernel (variances in (log10 units)^2).

    The fields are floats, or 0-d tensors inside the hyperparameter search
    (:meth:`from_log_tensor`); every method works with either.

    Attributes:
        variance_scale: s, the factor on the GP's own variance (0 < s, usually < 1).
        tile_var: variance of a tile's persistent offset.
        tile_time_var: variance of a tile's offset that decays with time.
        time_scale: years over which the decaying parts forget.
        local_var: variance of the short-range spatial part.
        range_m: its range, metres.
        test_noise_scale: s_t, the factor on the GP's test-count noise sigma1^2 / tests.
    """

    variance_scale: float = 0.7
    tile_var: float = 0.03
    tile_time_var: float = 0.04
    time_scale: float = 1.5
    local_var: float = 0.02
    range_m: float = 1500.0
    test_noise_scale: float = 0.7

    def to_vector(self) -> np.ndarray:
        """(7,) natural logs of the fields, in field order."""
        return np.log(np.array([float(v) for v in asdict(self).values()]))

    @classmethod
    def from_vector(cls, v: np.ndarray) -> LocalKernel:
        return cls(*map(float, np.exp(v)))

    @classmethod
    def from_log_tensor(cls, log_values: torch.Tensor) -> LocalKernel:
        """The kernel whose fields are the 0-d tensors ``exp(log_values)`` (7,), in field order:
        what the search differentiates through."""
        return cls(*log_values.exp().unbind())  # type: ignore[arg-type]  # 0-d tensors stand in for floats

    @property
    def prior_var(self) -> Any:
        """k_local(x, x)."""
        return self.tile_var + self.tile_time_var + self.local_var

    def combine(self, gp: Any, local: Any, test_noise: Any = 0.0) -> Any:
        """The map model's (co)variance from its parts: ``s * gp + local``, plus ``s_t * test_noise``
        for a measurement (``test_noise`` the GP's sigma1^2 / tests); arrays or tensors."""
        return self.variance_scale * gp + local + self.test_noise_scale * test_noise

    def __call__(self, distance_m: Any, dt_years: Any) -> Any:
        """k_local for distances (metres) and time lags (years) of the same shape: arrays, or
        tensors. Written as ``decay (same tile_time_var + local_var spatial) + same tile_var``,
        the fewest passes over the arrays (and so the fewest steps for autograd to retrace):
        the search's criterion with its gradient took a tenth less time than with
        ``same (tile_var + tile_time_var decay) + local_var spatial decay``."""
        exp = torch.exp if isinstance(distance_m, torch.Tensor) else np.exp
        same = distance_m < SAME_TILE_M
        if isinstance(same, torch.Tensor):
            same = same.to(distance_m.dtype)
        decay = exp(abs(dt_years) * (-1.0 / self.time_scale))
        spatial = exp(distance_m * (-1.0 / self.range_m))
        return decay * (same * self.tile_time_var + self.local_var * spatial) + same * self.tile_var


def planar_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distances between points ``a`` (..., 2) and ``b`` (..., 2) metres, broadcast against each
    other. From the x and y differences, with no (..., 2) array of differences summed over its
    last axis, which took 2-3x as long on a neighbourhood's (n, m, m) pairs; bitwise the same."""
    dx, dy = a[..., 0] - b[..., 0], a[..., 1] - b[..., 1]
    return np.sqrt(dx * dx + dy * dy)


@dataclass(frozen=True)
class Neighbourhoods:
    """What kriging n queries needs besides the kernel: where each one's m nearest training rows are.

    Attributes:
        index: (n, m) the training rows, int64.
        distance: (n, m) metres from each query to its rows.
        lag: (n, m) years from its rows to the query (query minus row).
        pairwise: (n, m, m) metres between a query's rows.
        pairwise_lag: (n, m, m) years between them.
    """

    index: np.ndarray
    distance: np.ndarray
    lag: np.ndarray
    pairwise: np.ndarray
    pairwise_lag: np.ndarray

    @classmethod
    def around(cls, xy_m: np.ndarray, years: np.ndarray, distance: np.ndarray, index: np.ndarray,
               query_years: np.ndarray) -> Neighbourhoods:
        """The neighbourhoods of queries at ``query_years`` (n,) whose rows ``index`` (n, m) lie at
        ``distance`` (n, m) metres, among training rows at ``xy_m`` (N, 2) metres and ``years`` (N,)."""
        xy, t = xy_m[index], years[index]  # (n, m, 2), (n, m)
        pairwise = planar_distance(xy[:, :, None, :], xy[:, None, :, :])
        return cls(index, distance, query_years[:, None] - t, pairwise, t[:, :, None] - t[:, None, :])

    def __len__(self) -> int:
        return len(self.index)

    @classmethod
    def concat(cls, parts: list[Neighbourhoods]) -> Neighbourhoods:
        """One set of neighbourhoods from several (so that they are solved in one batch)."""
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in
                     ("index", "distance", "lag", "pairwise", "pairwise_lag")))


def krige(
    kernel: LocalKernel, hoods: Neighbourhoods, residual: torch.Tensor, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kriged mean ``k_m^T A^{-1} r_m`` and conditional variance ``k(x, x) - k_m^T A^{-1} k_m``
    at each query, (n,), and the kriging weights ``A^{-1} k_m``, (n, m), with
    ``A = K_mm + diag(noise)``: batched solves over the neighbourhoods, :data:`KRIGE_BLOCK` at a
    time.

    ``residual`` and ``noise`` (n, m): the neighbours' residuals and noise variances, float64
    tensors. Differentiable in the kernel's tensor fields and in ``noise``.
    """
    parts = []
    for rows in blocks(len(hoods), KRIGE_BLOCK):
        cross = kernel(torch.as_tensor(hoods.distance[rows]), torch.as_tensor(hoods.lag[rows]))  # (b, m)
        gram = kernel(torch.as_tensor(hoods.pairwise[rows]), torch.as_tensor(hoods.pairwise_lag[rows]))
        solved = torch.linalg.solve(gram + torch.diag_embed(noise[rows]),
                                    torch.stack([residual[rows], cross], dim=-1))  # (b, m, 2)
        mean = (cross * solved[..., 0]).sum(-1)
        var = torch.clamp(kernel.prior_var - (cross * solved[..., 1]).sum(-1), min=0.0)
        parts.append((mean, var, solved[..., 1]))
    if not parts:
        empty = residual.new_zeros(residual.shape)
        return empty[:, 0], empty[:, 0], empty
    mean, var, weights = (torch.cat(p) for p in zip(*parts, strict=True))
    return mean, var, weights
