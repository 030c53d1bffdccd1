"""Seconds :func:`geodbk.decisions.plan_visits` takes at Puerto Rico's size, and how its plan compares.

A synthetic posterior shaped like the real use: every resolution-8 H3 hexagon of Puerto Rico
(about 12,000 sites on a 0.92 km triangular lattice, 160 x 64 km), download and upload (T = 2),
a long-range low-rank part of k = 130 Gaussian bumps 15 km wide, and a sparse local part linking
each hexagon to its 6 neighbours. Means follow a smooth field around the FCC's 35/3 Mbps so that
about a third of the hexagons are uncertain. A visit is 5 tests.

    python benchmarks/bench_planning.py                 # budget 50
    python benchmarks/bench_planning.py --budget 20 --sites 3000

Prints the seconds of the plan and, for it and the two baselines (most uncertain first, random),
the expected number of wrong "meets 35/3" decisions after their visits.

Measured on 2 cores (BLAS threads at their default; the machine shared with other jobs, load
average 2.5), budget 50: 49 s (49 s of CPU). Expected wrong decisions 1849.7 now; after the plan's
50 visits 1510.8 (1510.8 recomputed over all sites), after the 50 most uncertain hexagons 1550.6,
after 50 random ones 1552.8.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
from scipy import sparse
from scipy.spatial import cKDTree

from geodbk.decisions import expected_wrong_after, most_uncertain_first, plan_visits, random_visits
from geodbk.fit.posterior import MapPosterior

LEVELS = (math.log10(35.0), math.log10(3.0))


def synthetic_posterior(n_sites: int = 12_000, rank: int = 130, seed: int = 0) -> MapPosterior:
    """A posterior of PR's hexagons: lattice spacing 0.92 km (the resolution-8 hexagon's 0.74 km^2)."""
    rng = np.random.default_rng(seed)
    spacing, aspect = 0.92, 2.5
    cols = int(round(math.sqrt(n_sites * aspect / (math.sqrt(3) / 2))))
    j, i = np.divmod(np.arange(n_sites), cols)
    xy = np.column_stack([(i + 0.5 * (j % 2)) * spacing, j * spacing * math.sqrt(3) / 2])
    # low-rank part: Gaussian bumps on a grid of centres, random weights correlated between targets
    nx = int(round(math.sqrt(rank * aspect)))
    centres = np.stack(np.meshgrid(np.linspace(0, xy[:, 0].max(), nx), np.linspace(0, xy[:, 1].max(), -(-rank // nx))),
                       -1).reshape(-1, 2)[:rank]
    bumps = np.exp(-0.5 * ((xy[:, None, :] - centres[None]) ** 2).sum(-1) / 15.0**2)
    weights = rng.normal(0.0, 1.0, (2, rank, rank)) / math.sqrt(rank)
    weights[1] = 0.6 * weights[0] + 0.8 * weights[1]
    factor = np.stack([bumps @ weights[0], bumps @ weights[1]], axis=1)
    factor *= (np.array([0.10, 0.12]) / np.sqrt((factor**2).sum(-1).mean(0)))[None, :, None]
    # local part: 6 lattice neighbours at 0.12 (diagonally dominant, so PSD), targets correlated 0.5
    pairs = cKDTree(xy).query_pairs(1.01 * spacing, output_type="ndarray")
    link = sparse.coo_matrix((np.full(len(pairs), 0.12), (pairs[:, 0], pairs[:, 1])), shape=(n_sites, n_sites))
    spatial = sparse.identity(n_sites) + link + link.T
    scale = sparse.diags(np.repeat(rng.uniform(0.08, 0.14, n_sites), 2))
    local = sparse.csr_matrix(scale @ sparse.kron(spatial, np.array([[1.0, 0.5], [0.5, 1.0]])) @ scale)
    # means: a smooth field around the levels
    wave = np.sin(xy[:, 0] / 9.0) * np.cos(xy[:, 1] / 7.0) + 0.3 * rng.normal(size=n_sites)
    mean = np.column_stack([LEVELS[0] + 0.4 * wave + 0.1, LEVELS[1] + 0.45 * wave + 0.25])
    corr = np.array([[1.0, 0.3], [0.3, 1.0]])
    return MapPosterior(
        targets=("download", "upload"), mean=mean, factor=factor, local=local,
        nugget=np.broadcast_to(np.outer([0.08, 0.10], [0.08, 0.10]) * corr, (n_sites, 2, 2)).copy(),
        per_test=np.broadcast_to(np.outer([0.25, 0.30], [0.25, 0.30]) * (0.5 + 0.5 * np.eye(2)),
                                 (n_sites, 2, 2)).copy(),
    )


def objective(posterior: MapPosterior, sites: np.ndarray, tests: int) -> float:
    """Expected wrong decisions over all sites after visits at ``sites`` (values not yet known)."""
    after = posterior.condition(sites, tests=tests)
    return float(expected_wrong_after(posterior.mean, posterior.site_covariance(), after.site_covariance(),
                                      LEVELS).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=12_000)
    parser.add_argument("--rank", type=int, default=130)
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--tests", type=int, default=5)
    args = parser.parse_args()
    posterior = synthetic_posterior(args.sites, args.rank)
    wrong = posterior.expected_wrong(LEVELS)
    print(f"{posterior.n_sites} sites, k = {posterior.factor.shape[2]}, local nnz per row "
          f"{posterior.local.nnz / posterior.local.shape[0]:.1f}; {(wrong > 1e-3).sum()} uncertain (> 1e-3), "
          f"expected wrong now {wrong.sum():.2f}")
    start, cpu = time.perf_counter(), time.process_time()
    plan = plan_visits(posterior, LEVELS, args.budget, tests_per_visit=args.tests)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"plan_visits, budget {args.budget}: {seconds:.1f} s ({cpu:.1f} s of CPU, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"expected wrong after: plan {plan.expected_wrong_after[-1]:.2f} (exact over all sites "
          f"{objective(posterior, plan.sites, args.tests):.2f}), most uncertain first "
          f"{objective(posterior, most_uncertain_first(posterior, LEVELS, args.budget), args.tests):.2f}, "
          f"random {objective(posterior, random_visits(posterior.n_sites, args.budget), args.tests):.2f}")


if __name__ == "__main__":
    main()
