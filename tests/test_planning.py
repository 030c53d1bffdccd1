"""The visit planner: its objective against Monte Carlo over simulated observations, its greedy
against brute force, and that it spreads visits over what is not yet known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from geodbk.decisions import VisitPlan, expected_wrong_after, most_uncertain_first, plan_visits, random_visits
from geodbk.errors import InputDataError
from geodbk.fit.posterior import MapPosterior

LEVELS = {1: (1.5,), 2: (1.5, 0.5)}
TESTS = 5


def line_posterior(n_targets: int, n: int = 24, seed: int = 0) -> MapPosterior:
    """Sites on a line: a smooth low-rank field (4 bumps), a local part linking neighbours, means
    around the levels so that most decisions are uncertain."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 1.0, n)
    bumps = np.exp(-0.5 * ((x[:, None] - np.linspace(0.0, 1.0, 4)) / 0.25) ** 2)
    mixing = np.array([[1.0, 0.0], [0.6, 0.8]])[:n_targets, :n_targets]
    factor = 0.12 * np.einsum("ik,ts->itsk", bumps, mixing).reshape(n, n_targets, -1)
    spatial = sparse.diags([np.full(n - 1, 0.3), np.ones(n), np.full(n - 1, 0.3)], [-1, 0, 1])
    scale = sparse.diags(np.repeat(rng.uniform(0.08, 0.14, n), n_targets))
    local = sparse.csr_matrix(scale @ sparse.kron(spatial, 0.6 * np.eye(n_targets) + 0.4) @ scale)
    mean = np.asarray(LEVELS[n_targets]) + rng.normal(0.0, 0.15, (n, n_targets))
    return MapPosterior(targets=("download", "upload")[:n_targets], mean=mean, factor=factor, local=local,
                        nugget=np.broadcast_to(0.004 * np.eye(n_targets), (n, n_targets, n_targets)).copy(),
                        per_test=np.broadcast_to(0.03 * np.eye(n_targets), (n, n_targets, n_targets)).copy())


def objective(posterior: MapPosterior, sites: list[int], n_targets: int) -> float:
    """Expected wrong decisions over all sites after hypothetical visits at ``sites``."""
    after = posterior.condition(np.asarray(sites, dtype=np.int64), tests=TESTS).site_covariance()
    return float(expected_wrong_after(posterior.mean, posterior.site_covariance(), after, LEVELS[n_targets]).sum())


def simulated_wrong(posterior: MapPosterior, site: int, n_targets: int, draws: int, seed: int) -> np.ndarray:
    """(draws, n) min(p', 1 - p') after observing simulated values of a visit at ``site``."""
    rng = np.random.default_rng(seed)
    block = posterior.site_covariance()[site] + posterior.nugget[site] + posterior.per_test[site] / TESTS
    values = rng.multivariate_normal(posterior.mean[site], block, draws)
    return np.stack([posterior.condition(np.array([site]), value[None], tests=TESTS).expected_wrong(LEVELS[n_targets])
                     for value in values])


@pytest.mark.parametrize("n_targets", [1, 2])
def test_expected_wrong_after_matches_monte_carlo(n_targets):
    posterior = line_posterior(n_targets)
    site = 9
    after = posterior.condition(np.array([site]), tests=TESTS).site_covariance()
    exact = expected_wrong_after(posterior.mean, posterior.site_covariance(), after, LEVELS[n_targets])
    simulated = simulated_wrong(posterior, site, n_targets, draws=1500, seed=n_targets)
    error = simulated.std(axis=0, ddof=1) / np.sqrt(len(simulated))
    # quadrature / delta-method error allowance on top of 4 Monte Carlo standard errors
    allowance = 1e-9 if n_targets == 1 else 0.004
    np.testing.assert_array_less(np.abs(simulated.mean(axis=0) - exact), 4.0 * error + allowance)
    now = posterior.expected_wrong(LEVELS[n_targets])
    assert (exact <= now + 1e-12).all() and now[site] - exact[site] > 0.05
    total_error = simulated.sum(axis=1).std(ddof=1) / np.sqrt(len(simulated))
    assert abs(simulated.sum(axis=1).mean() - exact.sum()) < 4.0 * total_error + 0.01


@pytest.mark.parametrize("n_targets", [1, 2])
def test_first_pick_is_the_best_single_visit(n_targets):
    posterior = line_posterior(n_targets, seed=3)
    levels = LEVELS[n_targets]
    single = np.array([plan_visits(posterior, levels, 1, TESTS, candidates=np.array([site])).expected_wrong_after[0]
                       for site in range(posterior.n_sites)])
    brute = np.array([objective(posterior, [site], n_targets) for site in range(posterior.n_sites)])
    np.testing.assert_allclose(single, brute, atol=1e-5)
    plan = plan_visits(posterior, levels, 1, TESTS)
    assert plan.sites[0] == np.argmin(brute)
    # Monte Carlo over simulated values: the best visit's objective, and no sign that the
    # runner-up is better (common random numbers)
    best, runner_up = np.argsort(brute)[:2]
    draws = 600
    first = simulated_wrong(posterior, best, n_targets, draws, seed=7).sum(axis=1)
    second = simulated_wrong(posterior, runner_up, n_targets, draws, seed=7).sum(axis=1)
    assert abs(first.mean() - brute[best]) < 4.0 * first.std() / np.sqrt(draws) + 0.01
    gap = first - second
    assert gap.mean() < 3.0 * gap.std() / np.sqrt(draws)


@pytest.mark.parametrize("n_targets", [1, 2])
def test_each_pick_is_the_best_given_the_earlier_ones(n_targets):
    posterior = line_posterior(n_targets, seed=5)
    plan = plan_visits(posterior, LEVELS[n_targets], 4, TESTS)
    for step in range(4):
        earlier = plan.sites[:step].tolist()
        scores = np.array([objective(posterior, earlier + [site], n_targets) for site in range(posterior.n_sites)])
        # the best, or within 0.005 of it: gains at well-informed sites are first order in small steps
        assert scores[plan.sites[step]] <= scores.min() + 0.005
        # the objective kept to first order for small steps: within 0.05% of a recomputation
        assert plan.expected_wrong_after[step] == pytest.approx(scores[plan.sites[step]], rel=5e-4)
    assert plan.expected_wrong_before == pytest.approx(posterior.expected_wrong(LEVELS[n_targets]).sum())


def test_expected_wrong_never_increases_and_the_table_says_so():
    posterior = line_posterior(2, n=40, seed=1)
    plan = plan_visits(posterior, LEVELS[2], 8, TESTS)
    assert isinstance(plan, VisitPlan) and plan.sites.shape == (8,)
    after = plan.expected_wrong_after
    assert after[0] < plan.expected_wrong_before
    assert (np.diff(after) <= 1e-12).all()
    frame = plan.to_frame()
    assert list(frame.columns) == ["rank", "site", "p_meets", "expected_wrong_before", "expected_wrong_after"]
    assert frame["rank"].tolist() == list(range(1, 9))
    np.testing.assert_allclose(frame["expected_wrong_before"].iloc[1:], after[:-1])
    np.testing.assert_allclose(frame["p_meets"], posterior.probability_meets(LEVELS[2])[plan.sites])
    assert frame["expected_wrong_before"].iloc[0] == plan.expected_wrong_before


@pytest.mark.parametrize("n_targets", [1, 2])
def test_plan_spreads_visits_where_the_baseline_repeats_itself(n_targets):
    # sites 0 and 1 share one field (correlation 0.99), site 2 has its own; all three uncertain,
    # site 2 a little less. Visiting 0 tells almost all about 1, so the second visit goes to 2.
    factor = np.zeros((3, n_targets, 2))
    factor[:2, :, 0] = factor[2, :, 1] = 0.3
    levels = LEVELS[n_targets]
    mean = np.tile(levels, (3, 1)) + np.array([[0.0], [0.0], [-0.06]])
    posterior = MapPosterior(targets=("download", "upload")[:n_targets], mean=mean, factor=factor,
                             local=sparse.identity(3 * n_targets, format="csr") * 0.03**2,
                             nugget=np.broadcast_to(0.001 * np.eye(n_targets), (3, n_targets, n_targets)).copy(),
                             per_test=np.broadcast_to(0.005 * np.eye(n_targets), (3, n_targets, n_targets)).copy())
    plan = plan_visits(posterior, levels, 2, TESTS)
    assert plan.sites[0] in (0, 1) and plan.sites[1] == 2
    assert most_uncertain_first(posterior, levels, 2).tolist() == [0, 1]


def test_a_site_without_data_decides_nothing():
    posterior = line_posterior(2, n=12)
    groups = np.arange(12) // 2
    means = posterior.grouped(groups, n_groups=7)  # group 6 is empty: NaN mean
    plan = plan_visits(means, LEVELS[2], 2, TESTS)
    assert np.isfinite(plan.expected_wrong_before) and np.isfinite(plan.expected_wrong_after).all()
    assert 6 not in plan.sites.tolist()


def test_random_visits_are_distinct_and_reproducible():
    first = random_visits(100, 10, seed=3)
    assert len(set(first.tolist())) == 10 and first.min() >= 0 and first.max() < 100
    np.testing.assert_array_equal(first, random_visits(100, 10, seed=3))
    assert len(random_visits(3, 5)) == 5


def test_bad_requests_are_refused_in_one_line():
    posterior = line_posterior(2, n=5)
    with pytest.raises(InputDataError, match="one level per target"):
        plan_visits(posterior, (1.5,), 2)
    with pytest.raises(InputDataError, match="budget"):
        plan_visits(posterior, LEVELS[2], -1)
    with pytest.raises(InputDataError, match="candidates"):
        plan_visits(posterior, LEVELS[2], 1, candidates=np.array([7]))
    empty = plan_visits(posterior, LEVELS[2], 0)
    assert empty.sites.shape == (0,) and len(empty.to_frame()) == 0
