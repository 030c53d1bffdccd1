"""What a zoo model is and returns: the capability types and the posterior algebra.

Every model the zoo builds is a :class:`ZooModel`: ``forward(x, tests=None)`` maps inputs
``x`` (n, d) to a :class:`GPOutput` in standardised target units. A model whose prediction
comes from a Gaussian-process prior is a :class:`KernelModel` and adds, in the same units:

* ``kernel(x1, x2=None, diag=False)``: the prior kernel, (n, m), or its diagonal (n,);
* ``posterior_factors(x)``: the posterior covariance of f at x in factored form
  (:class:`PosteriorFactors`), from which :meth:`PosteriorFactors.difference_variance` and
  :meth:`PosteriorFactors.grouped_variance` give exact variances of linear functionals of f;
* ``noise``: the observation noise, a :class:`Noise`.

A kernel model trained by a variational objective (an ELBO, dPPGP, PPGP) is a
:class:`VariationalModel` and adds ``kl_divergence()``, KL(q || p) of its approximate posterior
from its prior, which those objectives weigh by beta / n.

Callers ask ``isinstance(model, KernelModel)`` rather than probing for methods: the k-nearest
tiles and the plain network baselines are ZooModels only. As in GPyTorch, the base methods
raise NotImplementedError, so a subclass that forgets one fails on the first call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from geodbk.blocks import blocks
from geodbk.models.expansions import ard_rbf


@dataclass
class GPOutput:
    """What a model returns for a batch of n inputs (standardised target units).

    Attributes:
        mean: (n,) predictive mean.
        var_f: (n,) function variance; includes the residual c(x) for inducing-point
            models that carry it.
        noise: () or (n,) noise variance of the batch's observations, sigma^2(k_i) for
            their test counts k_i (sigma0^2 when no counts were given).
        phi: (n, r) basis values; ``None`` for the plain network and in the folded
            prediction path (eval mode, no autograd) of expansions that fold.
        residual: (n,) Nystrom residual c(x) = k(x, x) - ||phi(x)||^2, or ``None``.
        tile_noise: () or (n,) sigma0^2, the noise left as k -> infinity; ``None`` means
            the same as ``noise``.
    """

    mean: torch.Tensor
    var_f: torch.Tensor
    noise: torch.Tensor
    phi: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    tile_noise: torch.Tensor | None = None

    @property
    def predictive_var(self) -> torch.Tensor:
        """(n,) var_f + sigma^2(k): a new observation with the batch's test counts."""
        return self.var_f + self.noise

    @property
    def tile_noise_var(self) -> torch.Tensor:
        """() or (n,) sigma0^2: ``tile_noise``, or ``noise`` where the model gives no separate one."""
        return self.noise if self.tile_noise is None else self.tile_noise

    @property
    def tile_var(self) -> torch.Tensor:
        """(n,) var_f + sigma0^2: the tile-mean distribution (k -> infinity)."""
        return self.var_f + self.tile_noise_var


#: One batch for :meth:`PosteriorFactors.grouped_variance`: the factors of b rows, their
#: weights (b,) and their group numbers (b,), int64 in [0, n_groups).
WeightedFactors = tuple["PosteriorFactors", torch.Tensor, torch.Tensor]


@dataclass
class PosteriorFactors:
    """The posterior covariance of the latent f at n inputs, in factored form.

    ``Cov_q(f(x_i), f(x_j)) = <plus_i, plus_j> - <minus_i, minus_j> + k(z_i, z_j) + [i = j] diagonal_i``

    where ``k(z_i, z_j) = rbf_outputscale * exp(-0.5 ||z_i - z_j||^2)`` is an RBF kernel on
    inputs already divided by their lengthscales. Its diagonal is ``var_f`` of
    :class:`GPOutput`. Linear functionals of f (a change between quarters, an average over
    an area) get their exact variances from these factors without an n x n matrix: the
    plus and minus parts cost O(n r), and only the kernel part, present in the inducing-point
    kinds that carry their Nystrom residual, needs pairwise sums. Variances are in the
    model's (standardised) target units squared.

    Attributes:
        plus: (n, p) features of the positive low-rank part (``L^T phi`` for a basis GP).
        minus: (n, q) features subtracted (the Nystrom projection), or ``None``.
        rbf_inputs: (n, h) lengthscale-scaled inputs z of the kernel part, or ``None``.
        rbf_outputscale: () the kernel part's s^2 (used with ``rbf_inputs``).
        diagonal: (n,) variance independent between inputs, or ``None``.
    """

    plus: torch.Tensor
    minus: torch.Tensor | None = None
    rbf_inputs: torch.Tensor | None = None
    rbf_outputscale: torch.Tensor | None = None
    diagonal: torch.Tensor | None = None

    def double(self) -> PosteriorFactors:
        """The same factors in float64 (the variances below cancel large terms)."""
        return PosteriorFactors(
            self.plus.double(),
            _double(self.minus),
            _double(self.rbf_inputs),
            _double(self.rbf_outputscale),
            _double(self.diagonal),
        )

    def difference_variance(self, start: PosteriorFactors) -> torch.Tensor:
        """Var_q[f(x_i) - f(s_i)] for the paired rows of these factors (x) and ``start`` (s): (n,).

        ``||plus_x - plus_s||^2 - ||minus_x - minus_s||^2 + 2 s^2 (1 - exp(-0.5 ||z_x - z_s||^2))
        + diagonal_x + diagonal_s``, clamped at 0 against rounding.
        """
        var = (self.plus - start.plus).pow(2).sum(-1)
        if self.minus is not None and start.minus is not None:
            var = var - (self.minus - start.minus).pow(2).sum(-1)
        if self.rbf_inputs is not None and start.rbf_inputs is not None:
            assert self.rbf_outputscale is not None  # set with every rbf_inputs
            distance2 = (self.rbf_inputs - start.rbf_inputs).pow(2).sum(-1)
            var = var + 2.0 * self.rbf_outputscale * (1.0 - torch.exp(-0.5 * distance2))
        if self.diagonal is not None and start.diagonal is not None:
            var = var + self.diagonal + start.diagonal
        return var.clamp_min(0.0)

    @staticmethod
    def grouped_variance(batches: Iterable[WeightedFactors], n_groups: int, block: int = 16384) -> torch.Tensor:
        """Var_q[sum_{i in g} w_i f(x_i)] for each group g: (n_groups,), clamped at 0 against rounding.

        ``batches`` yields ``(factors, weights, groups)`` for consecutive rows (see
        :data:`WeightedFactors`), so the low-rank parts are summed per group as they come,
        ``||sum_i w_i plus_i||^2 - ||sum_i w_i minus_i||^2 + sum_i w_i^2 diagonal_i`` in O(n r);
        only the rows' kernel inputs are kept, for the pairwise kernel sums within each group
        (O(sum_g n_g^2) time in ``block`` x ``block`` tiles). Accumulates in the factors' dtype
        and device (float64 from :meth:`double` for exact sums).
        """
        plus: torch.Tensor | None = None
        minus: torch.Tensor | None = None
        diagonal: torch.Tensor | None = None
        kernel_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        scale: torch.Tensor | None = None
        for factors, weights, groups in batches:
            plus = _add_by_group(plus, factors.plus, weights, groups, n_groups)
            if factors.minus is not None:
                minus = _add_by_group(minus, factors.minus, weights, groups, n_groups)
            if factors.diagonal is not None:
                diagonal = _add_by_group(diagonal, factors.diagonal, weights**2, groups, n_groups)
            if factors.rbf_inputs is not None:
                kernel_rows.append((factors.rbf_inputs, weights, groups))
                scale = factors.rbf_outputscale
        if plus is None:  # no rows at all
            return torch.zeros(n_groups, dtype=torch.float64)
        var = plus.pow(2).sum(-1)
        if minus is not None:
            var = var - minus.pow(2).sum(-1)
        if diagonal is not None:
            var = var + diagonal
        if kernel_rows:
            assert scale is not None  # set with every kernel row
            z, w, g = (torch.cat(parts) for parts in zip(*kernel_rows, strict=True))
            order = torch.argsort(g, stable=True)
            var = var + scale * _grouped_rbf_sum(z[order], w[order], g[order], n_groups, block)
        return var.clamp_min(0.0)


def _double(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.double()


def _add_by_group(
    total: torch.Tensor | None, values: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor, n_groups: int
) -> torch.Tensor:
    """``total`` (n_groups, ...) plus sum_{i in g} w_i values_i per group; values (b,) or (b, p)."""
    weighted = values * (weights if values.dim() == 1 else weights[:, None])
    if total is None:
        total = values.new_zeros((n_groups, *values.shape[1:]))
    return total.index_add_(0, groups, weighted)


def _grouped_rbf_sum(z: torch.Tensor, w: torch.Tensor, groups: torch.Tensor, n_groups: int, block: int) -> torch.Tensor:
    """sum_{i, j in g} w_i w_j exp(-0.5 ||z_i - z_j||^2) for each group g: (n_groups,).

    Rows must be sorted by group; each group is summed in (block x block) tiles, so memory is
    O(block^2) and time O(sum_g n_g^2).
    """
    out = torch.zeros(n_groups, dtype=z.dtype, device=z.device)
    unit = z.new_ones(())  # z is already divided by the lengthscales; s^2 is applied by the caller
    bounds = torch.searchsorted(groups, torch.arange(n_groups + 1, device=groups.device)).tolist()
    for g in range(n_groups):
        lo, hi = bounds[g], bounds[g + 1]
        for rows in blocks(hi, block, start=lo):
            for cols in blocks(hi, block, start=lo):
                out[g] += w[rows] @ ard_rbf(z[rows], z[cols], unit, unit) @ w[cols]
    return out


def _inverse_softplus(value: float) -> float:
    return value + math.log(-math.expm1(-value))


class Noise(nn.Module):
    """Noise variance of an observation that averages k tests: ``sigma0^2 + sigma1^2 / k``.

    ``sigma0^2 = floor + softplus(raw)`` is what remains for a tile mean of many tests;
    ``sigma1^2 = softplus(raw_per_test)`` is the variance of a single test about its tile
    mean, present only with ``per_test=True`` (otherwise the noise is homoscedastic,
    sigma^2 = sigma0^2, as in the paper).

    Args:
        init: initial noise variance of a one-test observation (1e-2 in the paper); with
            ``per_test`` it is split evenly between sigma0^2 and sigma1^2.
        floor: lower bound on sigma0^2 (1e-6 in the paper).
        per_test: learn the sigma1^2 / k term.
    """

    def __init__(self, init: float = 1e-2, floor: float = 1e-6, per_test: bool = False) -> None:
        super().__init__()
        if init <= floor:
            raise ValueError(f"noise init {init} must exceed the floor {floor}")
        self.floor = floor
        self.per_test = per_test
        tile_init = 0.5 * init if per_test else init
        self.raw = nn.Parameter(torch.tensor(_inverse_softplus(max(tile_init - floor, 0.5 * tile_init))))
        if per_test:
            self.raw_per_test = nn.Parameter(torch.tensor(_inverse_softplus(0.5 * init)))

    def forward(self, tests: torch.Tensor | None = None) -> torch.Tensor:
        """sigma^2(k): () without ``tests`` (k -> infinity) or homoscedastic, else (n,) for (n,) counts."""
        tile = self.floor + nn.functional.softplus(self.raw)
        if tests is None or not self.per_test:
            return tile
        return tile + self.per_test_variance() / tests

    def per_test_variance(self) -> torch.Tensor:
        """sigma1^2, the variance of one test about its tile mean (0 without the term): ()."""
        if not self.per_test:
            return self.raw.new_zeros(())
        return nn.functional.softplus(self.raw_per_test)

    def set_(self, value: float, per_test: float | None = None) -> None:
        """Set sigma0^2 (clamped just above the floor) and, with the test-count term, sigma1^2."""
        with torch.no_grad():
            self.raw.fill_(_inverse_softplus(max(value - self.floor, 1e-12)))
            if per_test is not None:
                if not self.per_test:
                    raise ValueError("this noise has no test-count term to set")
                self.raw_per_test.fill_(_inverse_softplus(max(per_test, 1e-12)))


class ZooModel(nn.Module):
    """Base of every model the zoo builds (:mod:`geodbk.models.zoo`).

    Subclasses implement :meth:`forward`; gradient-trained ones whose network should take
    weight decay override :meth:`backbone_parameters`.
    """

    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        """The predictive distribution at ``x`` (n, d), standardised target units; ``tests`` (n,)
        the speed tests behind each row (they set the per-row noise where the model has a
        test-count term)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward(x, tests)")

    def backbone_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters that take weight decay (by default none)."""
        return iter(())


class KernelModel(ZooModel):
    """A zoo model with a Gaussian-process prior: a kernel, a joint posterior and a noise.

    Attributes:
        noise: the observation noise sigma^2(k), standardised target units squared.
    """

    noise: Noise

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, diag: bool = False) -> torch.Tensor:
        """The prior kernel in standardised target units squared: k(x1, x2), (n, m), for x1 (n, d)
        and x2 (m, d) (``None``: x1 itself); with ``diag``, the prior variance k(x1_i, x1_i), (n,),
        in O(n) kernel evaluations (x2 must then be ``None``)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement kernel(x1, x2, diag)")

    def posterior_factors(self, x: torch.Tensor) -> PosteriorFactors:
        """The posterior covariance of f at ``x`` (n, d), factored (:class:`PosteriorFactors`)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement posterior_factors(x)")

    @staticmethod
    def diagonal_only(x2: object) -> None:
        """For :meth:`kernel` implementations (and wrappers on other array types): refuse
        ``diag=True`` with a second input ``x2``.

        Raises:
            ValueError: if ``x2`` is given.
        """
        if x2 is not None:
            raise ValueError("kernel(x1, diag=True) gives the prior variance at x1; pass no x2")


class VariationalModel(KernelModel):
    """A kernel model with an approximate posterior q over its weights (or inducing values) and a
    prior p, trained by an objective that adds the KL divergence between them
    (:mod:`geodbk.models.objectives`: dPPGP, SVGP, PPGP, VBLL; and the related models' ELBOs)."""

    def kl_divergence(self) -> torch.Tensor:
        """KL(q || p), nats: a () tensor, differentiable in the parameters of q and p."""
        raise NotImplementedError(f"{type(self).__name__} does not implement kl_divergence()")
