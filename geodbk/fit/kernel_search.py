"""Choosing the residual field's :class:`~geodbk.fit.local_kernel.LocalKernel` on validation rows.

The criterion (:class:`KernelCriterion`) is the Gaussian NLL of validation rows' residuals
under the field conditioned on the training rows, plus that of validation areas' mean
residuals under their joint variance (:class:`AreaTerm`; :mod:`geodbk.fit.area_variance` gives
the same variance for a map). It is written in torch, so autograd gives its exact gradient, and
every neighbourhood of the tiles and of the areas is solved in one batch per evaluation
(:func:`~geodbk.fit.local_kernel.krige`).
:func:`search_kernel` minimises it by bounded L-BFGS-B in log space. Before, scipy estimated
the gradient by finite differences, 7 more evaluations per step: 259 of PR's criterion calls
and 55 of the fit's 190 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.optimize import minimize

from geodbk.fit.local_kernel import KERNEL_BOUNDS, LocalKernel, Neighbourhoods, krige, planar_distance
from geodbk.fit.validation_areas import AreaGroups
from geodbk.ingest.quadkey import tile_centres
from geodbk.models.objectives import gaussian_nll

if TYPE_CHECKING:
    from geodbk.fit.residuals import ResidualField

#: The optimiser's iteration cap. With exact gradients L-BFGS-B converges in 30-60 iterations
#: on PR and HI, one criterion evaluation each (with line-search retries, a few more).
SEARCH_ITERATIONS = 200


def _tensor(values: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64))


@dataclass(frozen=True)
class TileTerm:
    """Validation rows of the tile NLL: their neighbourhoods among the training rows and their
    residuals y - mu_GP, GP tile-mean variances and test-count noise variances, (n,) each."""

    hoods: Neighbourhoods
    residual: torch.Tensor
    gp_var: torch.Tensor
    test_var: torch.Tensor

    def nll(self, kernel: LocalKernel, mean: torch.Tensor, conditional: torch.Tensor) -> torch.Tensor:
        """Mean NLL of the rows given their kriged residuals and conditional variances (n,)."""
        return gaussian_nll(self.residual, mean, kernel.combine(self.gp_var, conditional, self.test_var)).mean()


@dataclass(frozen=True)
class AreaTerm:
    """Validation areas' mean residuals and the geometry of their joint conditional variance.

    The variance of an area's kriged mean is ``s gp_var + local + s_t sum_i w_i^2 test_var_i``
    with, as :mod:`geodbk.fit.area_variance` has it (without its distance cutoff), w_i = 1 / size
    and

        local = sum_ij w_i w_j c_ij = w^T K w - sum_i w_i z_i^T F(N_i),   F(y) = sum_j w_j k(y, x_j),

    z_i the kriging weights of row i and N_i its neighbours. F is taken at each area's distinct
    neighbours only: one kernel value per (neighbour, row) pair of an area, where the pairwise
    form took one per (row, neighbour of another row) (PR spatial-block: 148,000 pairs of rows
    times m = 16). Built by :meth:`build`.

    Attributes:
        hoods: neighbourhoods of the areas' distinct rows (u of them).
        member: (rows,) index into ``hoods`` of each (area, row) membership.
        area: (rows,) each membership's area; weight (rows,) its w = 1 / size.
        pair_area: (pairs,) the area of every ordered pair of its rows; pair_weight (pairs,) w^2.
        distance, lag: (pairs,) metres and years between the pair's rows.
        slot: (rows, m) where in ``field_at`` each membership's neighbours are.
        field_slot: (q,) the slot of every (area, distinct neighbour, row) triple.
        field_distance, field_lag: (q,) metres and years from that neighbour to that row.
        field_weight: (q,) the row's w.
        n_slots: how many (area, distinct neighbour) slots there are.
        observed: (areas,) the mean validation residual; noise: (areas,) sum_i w_i^2 test_var_i.
        gp_var: (areas,) the GP's variance of the area mean.
    """

    hoods: Neighbourhoods
    member: torch.Tensor
    area: torch.Tensor
    weight: torch.Tensor
    pair_area: torch.Tensor
    pair_weight: torch.Tensor
    distance: torch.Tensor
    lag: torch.Tensor
    slot: torch.Tensor
    field_slot: torch.Tensor
    field_distance: torch.Tensor
    field_lag: torch.Tensor
    field_weight: torch.Tensor
    n_slots: int
    observed: torch.Tensor
    noise: torch.Tensor
    gp_var: torch.Tensor

    @classmethod
    def build(cls, field: ResidualField, areas: AreaGroups, lonlat: np.ndarray, years: np.ndarray,
              residual: np.ndarray, test_var: np.ndarray) -> AreaTerm:
        """The term of ``areas`` of validation rows at ``lonlat`` (n, 2) degrees and ``years`` (n,)
        with residuals and test-count variances (n,), against ``field``'s training rows."""
        unique, member = np.unique(areas.rows, return_inverse=True)
        member = member.reshape(-1)
        hoods = field.neighbourhoods(lonlat[unique], years[unique])
        xy = field.projection.to_metres(tile_centres(lonlat[unique]))
        t = years[unique]
        size = np.maximum(np.bincount(areas.groups, minlength=areas.n_areas), 1).astype(np.float64)
        w = 1.0 / size[areas.groups]
        order = np.argsort(areas.groups, kind="stable")
        starts = np.searchsorted(areas.groups[order], np.arange(areas.n_areas + 1))
        first, second = [], []
        slot = np.zeros((len(member), hoods.index.shape[1]), np.int64)
        field_slot, field_row, field_neighbour, n_slots = [], [], [], 0
        for g in range(areas.n_areas):
            inside = order[starts[g]:starts[g + 1]]  # memberships of area g
            rows = member[inside]
            first.append(np.repeat(inside, len(inside)))
            second.append(np.tile(inside, len(inside)))
            distinct, where = np.unique(hoods.index[rows], return_inverse=True)
            slot[inside] = n_slots + where.reshape(len(rows), -1)
            field_slot.append(np.repeat(n_slots + np.arange(len(distinct)), len(rows)))
            field_neighbour.append(np.repeat(distinct, len(rows)))
            field_row.append(np.tile(inside, len(distinct)))
            n_slots += len(distinct)

        def joined(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        a, b = joined(first), joined(second)
        neighbour, at = joined(field_neighbour), joined(field_row)
        return cls(
            hoods=hoods,
            member=torch.as_tensor(member),
            area=torch.as_tensor(areas.groups),
            weight=_tensor(w),
            pair_area=torch.as_tensor(areas.groups[a]),
            pair_weight=_tensor(w[a] * w[b]),
            distance=_tensor(planar_distance(xy[member[a]], xy[member[b]])),
            lag=_tensor(t[member[a]] - t[member[b]]),
            slot=torch.as_tensor(slot),
            field_slot=torch.as_tensor(joined(field_slot)),
            field_distance=_tensor(planar_distance(field.xy_m[neighbour], xy[member[at]])),
            field_lag=_tensor(field.years[neighbour] - t[member[at]]),
            field_weight=_tensor(w[at]),
            n_slots=n_slots,
            observed=_tensor(np.bincount(areas.groups, weights=w * residual[areas.rows], minlength=areas.n_areas)),
            noise=_tensor(np.bincount(areas.groups, weights=w**2 * test_var[areas.rows], minlength=areas.n_areas)),
            gp_var=_tensor(areas.gp_var),
        )

    def nll(self, kernel: LocalKernel, mean: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Mean NLL of the areas given the kriged residuals (u,) and kriging weights (u, m) of
        their distinct rows."""
        n_areas = len(self.observed)

        def by_area(index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(n_areas, dtype=values.dtype).index_add(0, index, values)

        prior = by_area(self.pair_area, self.pair_weight * kernel(self.distance, self.lag))  # w^T K w
        at_neighbours = torch.zeros(self.n_slots, dtype=mean.dtype).index_add(
            0, self.field_slot, self.field_weight * kernel(self.field_distance, self.field_lag))  # F(N)
        explained = (weights[self.member] * at_neighbours[self.slot]).sum(-1)  # z_i^T F(N_i)
        local = prior - by_area(self.area, self.weight * explained)
        area_mean = by_area(self.area, self.weight * mean[self.member])
        var = kernel.combine(self.gp_var, torch.clamp(local, min=0.0), self.noise)
        return gaussian_nll(self.observed, area_mean, var).mean()


#: A weak prior that holds a small validation set's kernel near the defaults: independent
#: Gaussians on the log hyperparameters, centred on :class:`LocalKernel`'s defaults with sd
#: ``PRIOR_SD`` (a factor e^2 either way), worth ``PRIOR_ROWS`` validation rows of evidence (the
#: criterion is a mean over rows, so the prior's share is PRIOR_ROWS / rows). With 100-300
#: validation rows the search ran to its bounds (range 10 km on an island 30 km long, a time
#: scale of 20 years) and the field then hurt the held-out rows. Chosen on crops of the samples
#: (benchmarks/bench_regions.py, six crops of 1-7k rows, three draws of each split; the
#: validation rows held out of a fit whose own validation rows were cut from training), against
#: weight 30: 100 / 300 / 1,000 moved that NLL by 0.000 / -0.001 / -0.001 on the random split and
#: -0.012 / -0.016 / -0.016 at held-out blocks; on PR and HI (3,000 validation rows used, one
#: seed) 100 cost their validation NLL 0.001-0.003 and 300 0.003-0.005, so 100
#: (docs/small-regions.md).
PRIOR_SD = 2.0
PRIOR_ROWS = 100.0


class KernelCriterion:
    """The validation criterion of a local kernel: the tile NLL plus the area NLL (either may be
    left out).

    Call it with (7,) log hyperparameters (a float64 tensor, :class:`LocalKernel` field order);
    :meth:`value_and_gradient` is the form scipy's optimisers take. ``prior_rows`` weighs the
    prior on the hyperparameters (default :data:`PRIOR_ROWS`; 0 leaves it out).
    """

    def __init__(self, field: ResidualField, tiles: TileTerm | None, areas: AreaTerm | None = None,
                 prior_rows: float | None = None) -> None:
        if tiles is None and areas is None:
            raise ValueError("a kernel criterion needs tiles, areas or both")
        self.field, self.tiles, self.areas = field, tiles, areas
        self.prior_rows = PRIOR_ROWS if prior_rows is None else prior_rows
        self.hoods = Neighbourhoods.concat([term.hoods for term in (tiles, areas) if term is not None])
        self._n_tiles = 0 if tiles is None else len(tiles.hoods)
        assert field.test_var is not None  # set by ResidualField.__post_init__
        index = self.hoods.index
        self._residual = _tensor(field.residual[index])
        self._noise_var, self._test_var = _tensor(field.noise_var[index]), _tensor(field.test_var[index])

    def __call__(self, log_values: torch.Tensor) -> torch.Tensor:
        kernel = LocalKernel.from_log_tensor(log_values)
        noise = kernel.combine(self._noise_var, 0.0, self._test_var)
        mean, conditional, weights = krige(kernel, self.hoods, self._residual, noise)
        n = self._n_tiles
        total = torch.zeros((), dtype=torch.float64)
        if self.tiles is not None:
            total = total + self.tiles.nll(kernel, mean[:n], conditional[:n])
        if self.areas is not None:
            total = total + self.areas.nll(kernel, mean[n:], weights[n:])
        if self.prior_rows > 0:
            z = (log_values - _tensor(LocalKernel().to_vector())) / PRIOR_SD
            total = total + self.prior_rows * 0.5 * (z**2).sum() / max(n, 1)
        return total

    def value_and_gradient(self, vector: np.ndarray) -> tuple[float, np.ndarray]:
        """The criterion and its exact gradient at log hyperparameters ``vector`` (7,)."""
        log_values = torch.tensor(vector, dtype=torch.float64, requires_grad=True)
        value = self(log_values)
        (gradient,) = torch.autograd.grad(value, log_values)
        return float(value.detach()), gradient.numpy().copy()


def search_kernel(criterion: KernelCriterion, start: LocalKernel | None = None,
                  max_iterations: int = SEARCH_ITERATIONS) -> LocalKernel:
    """The kernel that minimises ``criterion`` within :data:`~geodbk.fit.local_kernel.KERNEL_BOUNDS`,
    by L-BFGS-B in log space with exact gradients, from ``start`` (default ``LocalKernel()``)."""
    bounds = [(np.log(low), np.log(high)) for low, high in KERNEL_BOUNDS]
    found = minimize(criterion.value_and_gradient, (start or LocalKernel()).to_vector(), jac=True,
                     method="L-BFGS-B", bounds=bounds, options={"maxiter": max_iterations})
    return LocalKernel.from_vector(found.x)
