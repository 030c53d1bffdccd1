"""MapPosterior: its factored algebra against the dense Gaussian formulas computed here with numpy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from scipy.stats import multivariate_normal, norm

from geodbk.errors import InputDataError
from geodbk.fit.posterior import MapPosterior

N_SITES, N_TARGETS, RANK = 30, 2, 4


def random_posterior(seed: int = 0, n: int = N_SITES, n_targets: int = N_TARGETS, rank: int = RANK) -> MapPosterior:
    """A random posterior: F (n, T, k), a banded sparse PSD local part B^T B + 0.05 I, random PSD noise blocks."""
    rng = np.random.default_rng(seed)
    size = n * n_targets
    band = sparse.diags([rng.normal(0.0, 0.3, size - offset) for offset in range(4)], list(range(4)), format="csr")
    local = sparse.csr_matrix(band.T @ band + 0.05 * sparse.identity(size))
    root = rng.normal(0.0, 0.1, (n, n_targets, n_targets))
    return MapPosterior(
        targets=("download", "upload")[:n_targets],
        mean=rng.normal(1.5, 0.3, (n, n_targets)),
        factor=rng.normal(0.0, 0.2, (n, n_targets, rank)),
        local=local,
        nugget=root @ root.transpose(0, 2, 1) + 0.01 * np.eye(n_targets),
        per_test=np.broadcast_to(0.05 * (0.7 * np.eye(n_targets) + 0.3), (n, n_targets, n_targets)).copy(),
    )


def flat(sites: np.ndarray, n_targets: int = N_TARGETS) -> np.ndarray:
    return (np.asarray(sites)[:, None] * n_targets + np.arange(n_targets)).ravel()


def dense_condition(mean: np.ndarray, cov: np.ndarray, observed: np.ndarray, noise: np.ndarray,
                    y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Textbook conditioning of N(mean, cov) on y = f[observed] + e, e ~ N(0, noise)."""
    solve = np.linalg.solve(cov[np.ix_(observed, observed)] + noise, np.eye(len(observed)))
    cross = cov[:, observed]
    return mean + cross @ solve @ (y - mean[observed]), cov - cross @ solve @ cross.T


def noise_of(posterior: MapPosterior, sites: np.ndarray, tests: np.ndarray) -> np.ndarray:
    blocks = posterior.nugget[sites] + posterior.per_test[sites] / np.asarray(tests, float)[:, None, None]
    n_targets = posterior.mean.shape[1]
    out = np.zeros((len(sites) * n_targets,) * 2)
    for row, block in enumerate(blocks):
        out[row * n_targets:(row + 1) * n_targets, row * n_targets:(row + 1) * n_targets] = block
    return out


@pytest.fixture
def posterior() -> MapPosterior:
    return random_posterior()


@pytest.fixture
def observed(posterior: MapPosterior) -> MapPosterior:
    return posterior.condition(np.array([3, 17, 3]), np.full((3, N_TARGETS), 1.4), tests=np.array([5, 2, 9]))


@pytest.mark.parametrize("which", ["prior", "conditioned"])
def test_variances_and_blocks_match_the_dense_covariance(posterior, observed, which):
    post = posterior if which == "prior" else observed
    dense = post.dense_covariance()
    assert dense.shape == (N_SITES * N_TARGETS,) * 2
    np.testing.assert_allclose(post.variance().ravel(), np.diag(dense), rtol=1e-12)
    np.testing.assert_allclose(post.sd() ** 2, post.variance(), rtol=1e-12)
    blocks = np.stack([dense[2 * i:2 * i + 2, 2 * i:2 * i + 2] for i in range(N_SITES)])
    np.testing.assert_allclose(post.site_covariance(), blocks, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(post.correlation(), blocks[:, 0, 1] / np.sqrt(blocks[:, 0, 0] * blocks[:, 1, 1]))
    rows, cols = np.array([0, 5, 59, 7]), np.array([8, 8, 1])
    np.testing.assert_allclose(post.covariance(rows, cols), dense[np.ix_(rows, cols)], rtol=1e-12, atol=1e-15)
    assert np.linalg.eigvalsh(dense).min() > 0.0
    # the dense matrix is the formula F F^T + S - G G^T itself
    low = post.factor.reshape(N_SITES * N_TARGETS, -1)
    removed = post.downdate.reshape(N_SITES * N_TARGETS, -1)
    np.testing.assert_allclose(dense, low @ low.T + post.local.toarray() - removed @ removed.T, atol=1e-14)


def test_condition_equals_dense_gaussian_conditioning(posterior):
    sites, tests = np.array([4, 20, 4, 11]), np.array([1.0, 5.0, 3.0, 10.0])
    y = np.random.default_rng(1).normal(1.2, 0.4, (4, N_TARGETS))
    once = posterior.condition(sites[:2], y[:2], tests=tests[:2])
    post = once.condition(sites[2:], y[2:], tests=tests[2:])  # a second round: the old downdate enters C
    mean, cov = dense_condition(posterior.mean.ravel(), posterior.dense_covariance(), flat(sites),
                                noise_of(posterior, sites, tests), y.ravel())
    np.testing.assert_allclose(post.mean.ravel(), mean, rtol=1e-10)
    np.testing.assert_allclose(post.dense_covariance(), cov, atol=1e-12)
    assert post.downdate.shape == (N_SITES, N_TARGETS, 4 * N_TARGETS)
    # the sites' own blocks moved; a scalar tests count means every observation has it
    scalar = posterior.condition(sites, y, tests=4)
    np.testing.assert_allclose(scalar.mean.ravel(), dense_condition(
        posterior.mean.ravel(), posterior.dense_covariance(), flat(sites),
        noise_of(posterior, sites, np.full(4, 4.0)), y.ravel())[0], rtol=1e-10)


def test_preposterior_covariance_does_not_depend_on_the_values(posterior):
    sites = np.array([2, 9, 9])
    hypothetical = posterior.condition(sites, None, tests=3)
    np.testing.assert_array_equal(hypothetical.mean, posterior.mean)
    rng = np.random.default_rng(2)
    draws = [rng.multivariate_normal(posterior.mean[sites].ravel(),
                                     posterior.covariance(flat(sites), flat(sites)) + noise_of(posterior, sites,
                                                                                               np.full(3, 3.0)))
             for _ in range(2)]
    updated = [posterior.condition(sites, draw.reshape(3, N_TARGETS), tests=3) for draw in draws]
    for post in updated:
        np.testing.assert_allclose(post.dense_covariance(), hypothetical.dense_covariance(), atol=1e-13)
    assert np.abs(updated[0].mean - updated[1].mean).max() > 1e-3


def test_spread_of_posterior_means_is_the_variance_removed():
    # Monte Carlo: draw f from the prior and an observation given f, condition; the posterior means
    # vary by exactly prior var - posterior var (the law of total variance)
    posterior = random_posterior(seed=3, n=12)
    sites, tests, draws = np.array([1, 6]), 2.0, 3000
    rng = np.random.default_rng(4)
    truth = rng.multivariate_normal(posterior.mean.ravel(), posterior.dense_covariance(), draws)
    noise = rng.multivariate_normal(np.zeros(4), noise_of(posterior, sites, np.full(2, tests)), draws)
    y = truth[:, flat(sites)] + noise
    means = np.stack([posterior.condition(sites, row.reshape(2, N_TARGETS), tests=tests).mean.ravel() for row in y])
    removed = posterior.variance().ravel() - posterior.condition(sites, tests=tests).variance().ravel()
    spread = means.var(axis=0, ddof=1)
    # relative sd of a variance estimate from 3000 draws: sqrt(2 / 3000) = 0.026
    np.testing.assert_allclose(spread, removed, rtol=0.12)
    assert removed.min() > 0.0 and np.abs(means.mean(axis=0) - posterior.mean.ravel()).max() < 0.05


def test_one_visit_gain_and_weighted_removal_match_dense_conditioning(observed):
    sites, tests = np.array([5, 12, 5, 29]), 3.0
    dense = observed.dense_covariance()
    gain = observed.visit_gain(sites, tests)
    rng = np.random.default_rng(8)
    directions, weights = rng.normal(size=(N_SITES, N_TARGETS)), rng.uniform(0.0, 2.0, N_SITES)
    expected_total = []
    for j, site in enumerate(sites):
        _, after = dense_condition(observed.mean.ravel(), dense, flat(np.array([site])),
                                   noise_of(observed, np.array([site]), np.array([tests])), observed.mean[site])
        np.testing.assert_allclose(dense - after, gain[:, :, j, :].reshape(-1, N_TARGETS)
                                   @ gain[:, :, j, :].reshape(-1, N_TARGETS).T, atol=1e-13)
        removed = np.diag(dense - after).reshape(N_SITES, N_TARGETS)  # only the diagonal blocks matter below
        blocks = np.stack([(dense - after)[2 * i:2 * i + 2, 2 * i:2 * i + 2] for i in range(N_SITES)])
        assert (removed >= -1e-15).all()
        expected_total.append(np.einsum("i,ia,iab,ib->", weights, directions, blocks, directions))
    np.testing.assert_allclose(observed.total_variance_removed(directions, weights, sites, tests), expected_total,
                               rtol=1e-10)
    rows = np.array([3, 0])
    np.testing.assert_allclose(observed.visit_gain(sites, tests, rows=rows), gain[rows], atol=1e-15)
    np.testing.assert_allclose(observed.observation_noise(sites, tests),
                               observed.nugget[sites] + observed.per_test[sites] / tests)


def test_select_keeps_the_joint_structure(posterior, observed):
    sites = np.array([7, 2, 7, 29])
    part = observed.select(sites)
    np.testing.assert_allclose(part.dense_covariance(), observed.dense_covariance()[np.ix_(flat(sites), flat(sites))],
                               atol=1e-14)
    np.testing.assert_array_equal(part.mean, observed.mean[sites])
    np.testing.assert_array_equal(part.nugget, observed.nugget[sites])


def test_grouped_is_the_linear_map_of_group_means(observed):
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 5, N_SITES)
    groups[groups == 3] = 4  # group 3 is empty
    weights = rng.uniform(0.2, 2.0, N_SITES)
    means = observed.grouped(groups, n_groups=6, weights=weights)
    matrix = np.zeros((6, N_SITES))
    matrix[groups, np.arange(N_SITES)] = weights
    totals = matrix.sum(axis=1, keepdims=True)
    matrix = np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)
    flat_map = np.kron(matrix, np.eye(N_TARGETS))
    expected_mean = matrix @ observed.mean
    assert np.isnan(means.mean[[3, 5]]).all()
    np.testing.assert_allclose(np.delete(means.mean, [3, 5], 0), np.delete(expected_mean, [3, 5], 0), rtol=1e-12)
    np.testing.assert_allclose(means.dense_covariance(), flat_map @ observed.dense_covariance() @ flat_map.T,
                               atol=1e-13)
    np.testing.assert_allclose(means.nugget, np.einsum("gi,iab->gab", matrix, observed.nugget), atol=1e-15)
    # equal weights by default
    plain = observed.grouped(groups)
    assert plain.n_sites == 5
    np.testing.assert_allclose(plain.mean[0], observed.mean[groups == 0].mean(axis=0))


def test_difference_is_the_linear_map_of_changes(observed):
    first, second = np.array([0, 1, 2, 3]), np.array([15, 16, 17, 18])
    change = observed.difference(first, second)
    matrix = np.zeros((4, N_SITES))
    matrix[np.arange(4), second] += 1.0
    matrix[np.arange(4), first] -= 1.0
    flat_map = np.kron(matrix, np.eye(N_TARGETS))
    np.testing.assert_allclose(change.mean, observed.mean[second] - observed.mean[first], rtol=1e-12)
    np.testing.assert_allclose(change.dense_covariance(), flat_map @ observed.dense_covariance() @ flat_map.T,
                               atol=1e-13)
    np.testing.assert_allclose(change.per_test, observed.per_test[first] + observed.per_test[second])


def test_probability_meets_matches_scipy_multivariate_normal(observed):
    levels = (1.45, 1.6)
    p = observed.probability_meets(levels)
    blocks = observed.site_covariance()
    for site in (0, 4, 13, 28):
        # P(A >= a, B >= b) = P(-A <= -a, -B <= -b)
        expected = multivariate_normal(-observed.mean[site], blocks[site]).cdf(-np.asarray(levels))
        assert p[site] == pytest.approx(expected, abs=1e-6)
    wrong = observed.expected_wrong(levels)
    np.testing.assert_allclose(wrong, np.minimum(p, 1.0 - p))
    assert (wrong <= 0.5).all()


def test_probability_meets_for_one_target():
    post = random_posterior(seed=6, n_targets=1)
    p = post.probability_meets((1.5,))
    np.testing.assert_allclose(p, norm.sf(1.5, post.mean[:, 0], post.sd()[:, 0]), rtol=1e-12)
    with pytest.raises(InputDataError, match="two targets"):
        post.correlation()
    with pytest.raises(InputDataError, match="one level per target"):
        post.probability_meets((1.5, 0.5))


def test_bad_input_is_refused_in_one_line(posterior):
    with pytest.raises(InputDataError, match="mean must be shaped"):
        MapPosterior(targets=("download",), mean=posterior.mean, factor=posterior.factor, local=posterior.local,
                     nugget=posterior.nugget, per_test=posterior.per_test)
    with pytest.raises(InputDataError, match="local must be symmetric"):
        MapPosterior(targets=posterior.targets, mean=posterior.mean, factor=posterior.factor,
                     local=sparse.csr_matrix(sparse.triu(posterior.local)), nugget=posterior.nugget,
                     per_test=posterior.per_test)
    with pytest.raises(InputDataError, match="nugget must be finite"):
        MapPosterior(targets=posterior.targets, mean=posterior.mean, factor=posterior.factor, local=posterior.local,
                     nugget=posterior.nugget[:, :1], per_test=posterior.per_test)
    with pytest.raises(InputDataError, match="sites must lie in"):
        posterior.condition(np.array([N_SITES]))
    with pytest.raises(InputDataError, match="values must be finite"):
        posterior.condition(np.array([1]), np.array([[np.nan, 1.0]]))
    with pytest.raises(InputDataError, match="tests must be positive"):
        posterior.condition(np.array([1]), tests=0)
    with pytest.raises(InputDataError, match="pair up"):
        posterior.difference(np.array([1, 2]), np.array([3]))
    big = 10_001
    large = MapPosterior(targets=("download", "upload"), mean=np.zeros((big, 2)), factor=np.zeros((big, 2, 0)),
                         local=sparse.identity(2 * big, format="csr"), nugget=np.zeros((big, 2, 2)),
                         per_test=np.zeros((big, 2, 2)))
    with pytest.raises(InputDataError, match="exceeds 20000"):
        large.dense_covariance()
    noiseless = MapPosterior(targets=("download",), mean=np.zeros((2, 1)), factor=np.ones((2, 1, 1)),
                             local=sparse.csr_matrix((2, 2)), nugget=np.zeros((2, 1, 1)), per_test=np.zeros((2, 1, 1)))
    with pytest.raises(InputDataError, match="singular"):
        noiseless.condition(np.array([0, 0]))
