"""The residual field's variance of an area: the conditional variance of a weighted sum of kriged residuals.

An area's (or any group's) mean is ``sum_{i in g} w_i r_i`` over its points i, each kriged on
its own m nearest training rows by :class:`~geodbk.fit.residuals.ResidualField`. The
conditional covariance of two points i, j is taken from i's neighbourhood,
``c_ij = k(x_i, x_j) - z_i^T k(N_i, x_j)`` with z_i = A_i^{-1} k(N_i, x_i) the kriging weights,
averaged with j's: exact when both neighbourhoods hold every training row, the same tile's
points fully correlated, and the variance of each point its own conditional variance v_i.
Summed over a group's pairs this is

    sum_ij w_i w_j c_ij = w^T K w - sum_i w_i z_i^T F(N_i),   F(y) = sum_j w_j k(y, x_j),

one kernel value per pair of points and per (training neighbour, point) pair, where the
pairwise form took 2m + 1 per pair of points (16 times the time; all US counties at 1 km did
not finish in an hour). Pairs farther apart than :data:`AREA_CUTOFF_RANGES` ranges are left
out. The validation areas' criterion (:class:`~geodbk.fit.kernel_search.AreaTerm`) scores the
same variance, without the cutoff, in torch.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from geodbk.blocks import blocks
from geodbk.fit.local_kernel import LocalKernel, planar_distance

#: Pairs of points farther apart than this many ranges are left out of area variances.
AREA_CUTOFF_RANGES = 4.0
#: Query points per block of an area variance's pair sums (bounds their memory).
_QUERY_BLOCK = 2048
#: Groups of at most this many points have their variance summed as arrays (:func:`_small_groups`);
#: larger ones group by group, with a KD-tree (a county's thousands of cells).
SMALL_GROUP = 64
#: (point, neighbour, member) triples per block of :func:`_small_groups` (bounds its memory).
_TRIPLES = 1 << 21


def grouped_local_variance(
    kernel: LocalKernel,
    xy: np.ndarray,
    years: np.ndarray,
    weights: np.ndarray,
    groups: np.ndarray,
    n_groups: int,
    *,
    neighbours: np.ndarray,
    kriging: np.ndarray,
    train_xy: np.ndarray,
    train_years: np.ndarray,
) -> np.ndarray:
    """The conditional variance of ``sum_{i in g} w_i r_i`` for each group g, (n_groups,), in
    (log10 units)^2 (module docstring), clamped at 0 against rounding.

    Args:
        kernel: the local kernel.
        xy: (n, 2) the points' tile centres, metres; years: (n,) their times, decimal years.
        weights: (n,) w_i; groups: (n,) integers in [0, n_groups).
        neighbours: (n, m) each point's training rows N_i (indices into ``train_xy``).
        kriging: (n, m) each point's kriging weights z_i on those rows.
        train_xy: (N, 2) the training rows' tile centres, metres; train_years: (N,) their times.
    """
    w, groups = np.asarray(weights, np.float64), np.asarray(groups, dtype=np.int64)
    cutoff = AREA_CUTOFF_RANGES * kernel.range_m
    sizes = np.bincount(groups, minlength=n_groups)
    order = np.argsort(groups, kind="stable")  # the points group by group
    starts = np.concatenate([[0], np.cumsum(sizes)])
    small = sizes <= SMALL_GROUP
    in_small = order[small[groups[order]]]
    out = _small_groups(kernel, xy, years, w, groups, in_small, sizes, starts, order, cutoff, n_groups,
                        neighbours, kriging, train_xy, train_years)
    for g in np.flatnonzero(~small & (sizes > 0)):
        members = order[starts[g]:starts[g + 1]]
        group = (cKDTree(xy[members]), years[members], w[members], cutoff)
        training = np.unique(neighbours[members])
        at_training = _weighted_field(kernel, *group, train_xy[training], train_years[training])
        explained = (kriging[members] * at_training[np.searchsorted(training, neighbours[members])]).sum(-1)
        prior = _weighted_field(kernel, *group, xy[members], years[members])  # w^T K w = sum_i w_i F(x_i)
        out[g] = float((w[members] * (prior - explained)).sum())
    return np.maximum(out, 0.0)


def _small_groups(
    kernel: LocalKernel, xy: np.ndarray, years: np.ndarray, w: np.ndarray, groups: np.ndarray,
    points: np.ndarray, sizes: np.ndarray, starts: np.ndarray, order: np.ndarray, cutoff: float,
    n_groups: int, neighbours: np.ndarray, kriging: np.ndarray, train_xy: np.ndarray, train_years: np.ndarray,
) -> np.ndarray:
    """:func:`grouped_local_variance` of the groups of ``points`` (their indices), as arrays: every
    (point, member of its group) pair and every (point, training neighbour, member) triple within
    ``cutoff`` metres, in blocks of at most :data:`_TRIPLES` triples. For groups of at most
    :data:`SMALL_GROUP` points (hexagons of tiles), where a loop over groups took about 100
    microseconds a group. The other arguments as :func:`grouped_local_variance` has them, with
    ``order`` the points sorted by group, ``starts`` (n_groups + 1,) where each group's run in it
    begins and ``sizes`` (n_groups,)."""
    out = np.zeros(n_groups)
    m = neighbours.shape[1]
    partners = sizes[groups[points]]
    for rows in blocks(len(points), max(1, _TRIPLES // (m * SMALL_GROUP))):  # at most _TRIPLES triples
        block, count = points[rows], partners[rows]
        first = np.repeat(block, count)  # point i, once per member j of its group
        offset = np.arange(len(first)) - np.repeat(np.cumsum(count) - count, count)
        second = order[np.repeat(starts[groups[block]], count) + offset]
        distance = planar_distance(xy[first], xy[second])
        near = distance <= cutoff
        i, j = first[near], second[near]
        prior = w[i] * w[j] * kernel(distance[near], years[j] - years[i])  # w^T K w, pair by pair
        out += np.bincount(groups[i], prior, minlength=n_groups)
        row = neighbours[first].ravel()  # (point i, neighbour n of i, member j of i's group) triples
        member = np.repeat(second, m)
        distance = planar_distance(train_xy[row], xy[member])
        near = distance <= cutoff
        explained = (np.repeat(w[first], m) * kriging[first].ravel() * w[member])[near] * kernel(
            distance[near], years[member[near]] - train_years[row[near]])
        out -= np.bincount(np.repeat(groups[first], m)[near], explained, minlength=n_groups)
    return out


def _weighted_field(
    kernel: LocalKernel, tree: cKDTree, years: np.ndarray, w: np.ndarray, cutoff: float,
    at: np.ndarray, at_years: np.ndarray,
) -> np.ndarray:
    """F(y) = sum_j w_j k(y, x_j) over a group's points (``tree`` over their tile centres in
    metres, ``years`` (n,), weights ``w`` (n,)) within ``cutoff`` metres of each query ``at``
    (q, 2) metres at ``at_years`` (q,): (q,). Queries go in blocks, so memory stays bounded."""
    field = np.zeros(len(at))
    for rows in blocks(len(at), _QUERY_BLOCK):
        pairs = cKDTree(at[rows]).sparse_distance_matrix(tree, cutoff, output_type="ndarray")
        q, j = pairs["i"], pairs["j"]
        values = w[j] * kernel(pairs["v"], years[j] - at_years[rows][q])
        field[rows] = np.bincount(q, weights=values, minlength=len(at_years[rows]))
    return field
