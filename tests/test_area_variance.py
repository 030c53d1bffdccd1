"""The residual field's group variance (geodbk.fit.area_variance) against its defining double sum,
for small groups summed as arrays (in one block and in many) and large ones group by group."""

from __future__ import annotations

import numpy as np
import pytest

from geodbk.fit import area_variance
from geodbk.fit.local_kernel import LocalKernel, planar_distance


def brute_force(kernel, xy, years, w, groups, n_groups, neighbours, kriging, train_xy, train_years):
    """sum_ij w_i w_j k(x_i, x_j) - sum_i w_i sum_n z_in sum_j w_j k(N_in, x_j) per group, pairs
    within the cutoff, by explicit loops."""
    cutoff = area_variance.AREA_CUTOFF_RANGES * kernel.range_m
    out = np.zeros(n_groups)
    for g in range(n_groups):
        members = np.flatnonzero(groups == g)
        for i in members:
            d = planar_distance(xy[i], xy[members])
            near = d <= cutoff
            out[g] += w[i] * np.sum(w[members][near] * kernel(d[near], years[members][near] - years[i]))
            for n, z in zip(neighbours[i], kriging[i], strict=True):
                d = planar_distance(train_xy[n], xy[members])
                near = d <= cutoff
                out[g] -= w[i] * z * np.sum(w[members][near] * kernel(d[near], years[members][near] - train_years[n]))
    return np.maximum(out, 0.0)


@pytest.mark.parametrize("triples", [area_variance._TRIPLES, 97])  # one block; many, a group across two
def test_group_variance_is_the_double_sum(monkeypatch, triples):
    monkeypatch.setattr(area_variance, "_TRIPLES", triples)
    rng = np.random.default_rng(3)
    kernel = LocalKernel(range_m=800.0, time_scale=1.5)
    sizes = [1, 2, 3, 7, 12] * 20 + [area_variance.SMALL_GROUP + 1]  # 100 small groups and a large one
    n, n_train, m = sum(sizes), 300, 6
    train_xy = rng.uniform(0, 8000, (n_train, 2))
    train_years = rng.choice([2022.0, 2022.25, 2022.5], n_train)
    xy, years = rng.uniform(0, 8000, (n, 2)), rng.choice([2022.25, 2022.5], n)
    xy[:5] = xy[5]  # points of one tile
    neighbours, kriging = rng.integers(0, n_train, (n, m)), rng.normal(0.0, 0.15, (n, m))
    w = rng.uniform(0.2, 1.0, n)
    groups = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    n_groups = len(sizes) + 2  # two empty groups
    got = area_variance.grouped_local_variance(kernel, xy, years, w, groups, n_groups, neighbours=neighbours,
                                               kriging=kriging, train_xy=train_xy, train_years=train_years)
    expected = brute_force(kernel, xy, years, w, groups, n_groups, neighbours, kriging, train_xy, train_years)
    assert np.bincount(groups).max() > area_variance.SMALL_GROUP  # both paths ran
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
    assert (got[-2:] == 0).all() and (got[:-3] > 0).any()
