"""The local residual field (geodbk.fit.residuals) against dense Gaussian conditioning done by hand.

Training rows sit at real zoom-16 tile centres near San Juan, Puerto Rico; the reference
kernel is written out here from the formula in the module docstring, with "same tile"
decided by quadkey equality (not by the module's distance threshold).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from geodbk.dataset.coords import ProjectedTransform
from geodbk.fit import kernel_search
from geodbk.fit.kernel_search import AreaTerm, KernelCriterion
from geodbk.fit.residual_choice import ValidationRows, pseudo_forecast_rate
from geodbk.fit.residuals import NEIGHBOUR_METRES_PER_YEAR, LocalKernel, ResidualField, fit_tests_slope
from geodbk.fit.validation_areas import AreaGroups, square_areas
from geodbk.fit.volatility import LocalVolatility
from geodbk.ingest.quadkey import lonlat_to_quadkey, quadkey_bounds, quadkey_centres, tile_centres

SAN_JUAN = (-66.06, 18.45)
KERNEL = LocalKernel(
    variance_scale=0.6, tile_var=0.05, tile_time_var=0.03, time_scale=1.2, local_var=0.02, range_m=900.0
)


pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- helpers


def tiles_near(rng: np.random.Generator, n: int, half_width_deg: float, centre=SAN_JUAN) -> np.ndarray:
    """``n`` distinct zoom-16 quadkeys of random points in a box around ``centre``."""
    keys: list[str] = []
    while len(keys) < n:
        lon = centre[0] + rng.uniform(-half_width_deg, half_width_deg)
        lat = centre[1] + rng.uniform(-half_width_deg, half_width_deg)
        key = str(lonlat_to_quadkey(lon, lat)[0])
        if key not in keys:
            keys.append(key)
    return np.array(keys, dtype=object)


def dense_kernel(kernel: LocalKernel, xy_a, keys_a, t_a, xy_b, keys_b, t_b) -> np.ndarray:
    """k_local between two row sets from the docstring formula; same tile = same quadkey."""
    distance = np.sqrt(((xy_a[:, None, :] - xy_b[None, :, :]) ** 2).sum(-1))
    decay = np.exp(-np.abs(t_a[:, None] - t_b[None, :]) / kernel.time_scale)
    _, codes = np.unique(np.concatenate([keys_a, keys_b]).astype(str), return_inverse=True)
    same = codes[: len(keys_a), None] == codes[None, len(keys_a):]
    tile = same * (kernel.tile_var + kernel.tile_time_var * decay)
    return tile + kernel.local_var * np.exp(-distance / kernel.range_m) * decay


def dense_condition(kernel, projection, train, residual, noise_var, query):
    """Exact Gaussian conditioning on all training rows: (mean, k(x,x) - k^T A^-1 k)."""
    (keys, t), (q_keys, q_t) = train, query
    xy, q_xy = projection.to_metres(quadkey_centres(keys)), projection.to_metres(quadkey_centres(q_keys))
    A = dense_kernel(kernel, xy, keys, t, xy, keys, t) + kernel.variance_scale * np.diag(noise_var)
    k = dense_kernel(kernel, q_xy, q_keys, q_t, xy, keys, t)  # (q, n)
    kqq = np.diag(dense_kernel(kernel, q_xy, q_keys, q_t, q_xy, q_keys, q_t))
    mean = k @ np.linalg.solve(A, residual)
    var = kqq - np.einsum("qn,nq->q", k, np.linalg.solve(A, k.T))
    return mean, var


def make_field(kernel, keys, years, residual, noise_var, neighbours) -> ResidualField:
    lonlat = quadkey_centres(keys)
    projection = ProjectedTransform.from_lonlat(lonlat)
    return ResidualField(kernel, projection, projection.to_metres(lonlat), np.asarray(years, np.float64),
                         np.asarray(residual, np.float64), np.asarray(noise_var, np.float64), neighbours)


@pytest.fixture(scope="module")
def small():
    """30 training rows on 12 tiles (several rows per tile, different quarters) and 9 queries."""
    rng = np.random.default_rng(7)
    tiles = tiles_near(rng, 12, 0.02)
    keys = np.concatenate([tiles, rng.choice(tiles, 18)])  # every tile once, then 18 more rows
    years = 2021.125 + 0.25 * rng.integers(0, 12, size=30) + rng.uniform(-0.1, 0.1, size=30)
    residual = rng.normal(0.0, 0.3, size=30)
    noise_var = rng.uniform(0.01, 0.08, size=30)
    assert len(set(keys)) == 12 and len(keys) == 30
    # queries: training tiles at new times, unseen tiles in the same box, one unseen tile 3 km away
    q_keys = np.concatenate([tiles[:4], tiles_near(rng, 4, 0.02), lonlat_to_quadkey(SAN_JUAN[0] + 0.028, SAN_JUAN[1])])
    q_years = np.array([2023.875, 2021.0, 2022.4, 2024.6, 2023.875, 2022.0, 2021.5, 2023.1, 2023.875])
    return keys, years, residual, noise_var, q_keys, q_years


# ----------------------------------------------------------------------------- tests


def test_condition_with_all_rows_is_exact_gaussian_conditioning(small):
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=len(keys))
    assert field.neighbours == 30
    mean, var = field.condition(quadkey_centres(q_keys), q_years)
    ref_mean, ref_var = dense_condition(KERNEL, field.projection, (keys, years), residual, noise_var, (q_keys, q_years))
    np.testing.assert_allclose(mean, ref_mean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(var, ref_var, rtol=0, atol=1e-9)
    # the conditioning does something: shifts of size ~0.1 and variances well below the prior's
    assert np.abs(mean).max() > 0.05
    assert var[:4].max() < 0.7 * KERNEL.prior_var and var[4:].min() > 0.95 * KERNEL.prior_var
    # asking for more neighbours than rows is clipped to all rows (same answer)
    more = make_field(KERNEL, keys, years, residual, noise_var, neighbours=100)
    assert more.neighbours == 30
    np.testing.assert_allclose(more.condition(quadkey_centres(q_keys), q_years)[0], mean, rtol=0, atol=1e-12)


def test_conditional_variance_is_the_error_variance_of_the_kriged_mean(small):
    """Monte Carlo over the joint Gaussian (queries + training residuals), with the m = 8
    nearest-neighbour predictor: condition()'s variance is that predictor's mean squared error."""
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    q_lonlat = quadkey_centres(q_keys)
    _, var = field.condition(q_lonlat, q_years)
    # the kriged mean is linear in the residuals: its weights, one training row at a time
    weights = np.column_stack([
        dataclasses.replace(field, residual=np.eye(len(keys))[i]).condition(q_lonlat, q_years)[0]
        for i in range(len(keys))
    ])  # (q, n)
    assert ((weights != 0).sum(1) <= 8).all()
    np.testing.assert_allclose(weights @ residual, field.condition(q_lonlat, q_years)[0], rtol=0, atol=1e-12)
    # joint covariance of (f_local at the queries, training residuals = f_local + noise)
    projection = field.projection
    xy, q_xy = projection.to_metres(quadkey_centres(keys)), projection.to_metres(q_lonlat)
    kqq = dense_kernel(KERNEL, q_xy, q_keys, q_years, q_xy, q_keys, q_years)
    kqn = dense_kernel(KERNEL, q_xy, q_keys, q_years, xy, keys, years)
    knn = dense_kernel(KERNEL, xy, keys, years, xy, keys, years) + KERNEL.variance_scale * np.diag(noise_var)
    cov = np.block([[kqq, kqn], [kqn.T, knn]])
    draws = np.random.default_rng(11).standard_normal((200_000, len(cov))) @ np.linalg.cholesky(cov).T
    error = draws[:, : len(q_keys)] - draws[:, len(q_keys):] @ weights.T
    empirical = (error**2).mean(0)
    np.testing.assert_allclose(empirical, var, rtol=0.02)
    # and the answer is informative: the training-tile queries have well under the prior variance
    assert var[:4].max() < 0.7 * KERNEL.prior_var


def test_queries_snap_to_their_tile_centre(small):
    keys, years, residual, noise_var, *_ = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=16)
    key = keys[0]
    west, south, east, north = quadkey_bounds([key])[0]
    centre = quadkey_centres([key])
    # points inside the tile, well off its centre (up to 45% of the way to the edges)
    off = np.array([[west + 0.05 * (east - west), north - 0.1 * (north - south)],
                    [east - 0.02 * (east - west), south + 0.03 * (north - south)],
                    [(west + east) / 2 + 0.3 * (east - west), (south + north) / 2]])
    assert (lonlat_to_quadkey(off[:, 0], off[:, 1]) == key).all()
    np.testing.assert_array_equal(tile_centres(off), np.repeat(centre, 3, axis=0))
    at_centre = field.condition(np.repeat(centre, 3, axis=0), 2023.875)
    at_off = field.condition(off, 2023.875)
    np.testing.assert_array_equal(at_off[0], at_centre[0])
    np.testing.assert_array_equal(at_off[1], at_centre[1])
    # and the next tile east gives a different answer (the snapping is to the right tile)
    neighbour = field.condition(np.array([[east + 0.5 * (east - west), (south + north) / 2]]), 2023.875)
    assert neighbour[0][0] != at_centre[0][0] and neighbour[1][0] > at_centre[1][0]


def test_far_from_training_rows_gives_no_correction_and_prior_variance(small):
    keys, years, residual, noise_var, *_ = small
    kernel = dataclasses.replace(KERNEL, range_m=500.0)
    field = make_field(kernel, keys, years, residual, noise_var, neighbours=16)
    # about 50 km east and 50 km west-south-west of the training box
    far = np.array([[SAN_JUAN[0] + 0.5, SAN_JUAN[1]], [SAN_JUAN[0] - 0.45, SAN_JUAN[1] - 0.15]])
    when = np.array([2023.875, 2021.0])
    distance, _ = field._neighbourhoods(far, when)
    assert (distance > 45_000).all()
    mean, var = field.condition(far, when)
    np.testing.assert_allclose(mean, 0.0, rtol=0, atol=1e-6)
    np.testing.assert_allclose(var, kernel.prior_var, rtol=0, atol=1e-6)
    assert kernel.prior_var == pytest.approx(0.05 + 0.03 + 0.02)


def test_payload_round_trip_through_torch_save(small, tmp_path):
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    field.volatility = LocalVolatility.from_rows(field.projection, field.xy_m, np.linspace(0.1, 4.0, len(keys)), 1.0)
    torch.save(field.to_payload(), tmp_path / "field.pt")
    back = ResidualField.from_payload(torch.load(tmp_path / "field.pt", weights_only=True))
    assert back.kernel == field.kernel and back.neighbours == 8
    assert back.projection == field.projection and back.metres_per_year == NEIGHBOUR_METRES_PER_YEAR
    rng = np.random.default_rng(3)
    query = np.column_stack([SAN_JUAN[0] + rng.uniform(-0.03, 0.03, 50), SAN_JUAN[1] + rng.uniform(-0.03, 0.03, 50)])
    when = rng.uniform(2021.0, 2024.5, 50)
    for ours, theirs in zip(field.condition(query, when), back.condition(query, when), strict=True):
        np.testing.assert_array_equal(theirs, ours)
    np.testing.assert_array_equal(back.variance_factor(query, when), field.variance_factor(query, when))
    assert np.ptp(field.variance_factor(query, when)) > 0.1  # the factor is not all ones


def test_leave_one_out_is_conditioning_on_the_other_rows(small):
    """Each training row's leave-one-out error and variance are those of a field without that
    row, queried at the row's tile and time, plus the row's own rescaled noise."""
    keys, years, residual, noise_var, *_ = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    error, var = field.leave_one_out()
    lonlat = quadkey_centres(keys)
    for i in (0, 5, 13, 29):
        others = np.arange(len(keys)) != i
        without = make_field(KERNEL, keys[others], years[others], residual[others], noise_var[others], neighbours=8)
        without.projection = field.projection
        without.xy_m = field.xy_m[others]
        without.__post_init__()
        kriged, conditional = without.condition(lonlat[i:i + 1], years[i:i + 1])
        assert error[i] == pytest.approx(residual[i] - kriged[0], abs=1e-12)
        assert var[i] == pytest.approx(conditional[0] + KERNEL.variance_scale * noise_var[i], rel=1e-12)


# ----------------------------------------------------------------------------- fit on synthetic data

TRUE = LocalKernel(
    variance_scale=0.5, tile_var=0.10, tile_time_var=0.05, time_scale=1.0, local_var=0.015, range_m=800.0
)


@pytest.fixture(scope="module")
def synthetic():
    """2,800 rows = 350 tiles x 8 quarters drawn from the exact joint Gaussian of TRUE:
    2,000 train, 300 val, 500 test rows (40% in tiles without training rows).

    On a full tiles x quarters grid the local kernel is a sum of Kronecker products
    (tiles: identity, space: exp(-d / range_m); both times exp(-|dt| / time_scale)), so the
    joint draw needs only a 350 x 350 and an 8 x 8 Cholesky factor."""
    rng = np.random.default_rng(2024)
    tiles = tiles_near(rng, 350, 0.06)  # ~13 km box: 350 of its ~500 tiles
    quarters = 2022.125 + 0.25 * np.arange(8)
    centres = quadkey_centres(tiles)
    xy = ProjectedTransform.from_lonlat(centres).to_metres(centres)
    space = np.exp(-np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1)) / TRUE.range_m)
    decay = np.exp(-np.abs(quarters[:, None] - quarters[None]) / TRUE.time_scale)
    tile_cov = TRUE.tile_var + TRUE.tile_time_var * decay  # 8 x 8, one tile's quarters
    tile_part = rng.standard_normal((len(tiles), 8)) @ np.linalg.cholesky(tile_cov).T
    local_part = np.linalg.cholesky(space) @ rng.standard_normal((len(tiles), 8)) @ np.linalg.cholesky(decay).T
    f_local = (tile_part + np.sqrt(TRUE.local_var) * local_part).reshape(-1)  # row = tile * 8 + quarter
    keys, years = np.repeat(tiles, 8), np.tile(quarters, len(tiles))
    noise_var = rng.uniform(0.03, 0.10, size=len(keys))
    residual = f_local + np.sqrt(TRUE.variance_scale * noise_var) * rng.standard_normal(len(keys))
    lonlat = quadkey_centres(keys)
    # 40 tiles have no training rows (as tiles seen in no training quarter do in real data):
    # 120 of their 320 rows go to val, 200 to test; the other rows are split at random
    unseen = np.isin(np.arange(len(keys)) // 8, rng.choice(len(tiles), 40, replace=False))
    held, rest = rng.permutation(np.flatnonzero(unseen)), rng.permutation(np.flatnonzero(~unseen))
    parts = {"train": rest[:2000], "val": np.concatenate([rest[2000:2180], held[:120]]),
             "test": np.concatenate([rest[2180:], held[120:]])}
    return {name: (lonlat[i], years[i], residual[i], noise_var[i]) for name, i in parts.items()}


def test_synthetic_draw_has_the_kernel_covariance(synthetic):
    """A check of the fixture's Kronecker draw: same-tile covariances at lags 0 and 7 quarters
    match the kernel (350 tiles: about +-8% sampling error)."""
    lonlat, years, residual, noise_var = (np.concatenate(a) for a in zip(*synthetic.values(), strict=True))
    order = np.lexsort((years, lonlat[:, 1], lonlat[:, 0]))
    grid = residual[order].reshape(350, 8)  # tiles x quarters
    assert (lonlat[order].reshape(350, 8, 2) == lonlat[order][::8, None, :]).all()
    decay7 = np.exp(-1.75 / TRUE.time_scale)
    lag0 = TRUE.prior_var + TRUE.variance_scale * noise_var.mean()
    lag7 = TRUE.tile_var + (TRUE.tile_time_var + TRUE.local_var) * decay7
    assert (grid**2).mean() == pytest.approx(lag0, rel=0.25)
    assert (grid[:, 0] * grid[:, 7]).mean() == pytest.approx(lag7, rel=0.25)


def gaussian_nll(residual, mean, var) -> float:
    return float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (residual - mean) ** 2 / var))


def test_fit_recovers_the_tile_variance_and_beats_the_zero_correction(synthetic):
    train, val, test = synthetic["train"], synthetic["val"], synthetic["test"]
    field = ResidualField.fit(*train, *val)
    lonlat, years, residual, noise_var = test

    def nll(kernel: LocalKernel) -> float:
        mean, var = dataclasses.replace(field, kernel=kernel).condition(lonlat, years)
        return gaussian_nll(residual, mean, kernel.variance_scale * noise_var + var)

    baseline = gaussian_nll(residual, 0.0, noise_var)  # the GP alone: no shift, its own variance
    fitted, oracle = nll(field.kernel), nll(TRUE)
    # test rows: a clear gain over the GP alone, and close to the true kernel's NLL (seen:
    # baseline 1.154, fitted 0.254, oracle 0.248 nats per row; over fixture seeds 1-7 the
    # fit was 0.65-1.10 below the baseline and at most 0.015 above the oracle)
    assert fitted < baseline - 0.5
    assert fitted < oracle + 0.04
    # variances, true values far from LocalKernel()'s start (tile 0.07, total 0.09). What the
    # rows identify is the variance a tile does not share with the next tile (its centre one
    # tile width, about 580 m, away): tile_var + tile_time_var can trade places with a local
    # part whose range is below the tile width (seen: L-BFGS-B, converged, 0.067 + local_var
    # 0.092 at 334 m, a lower criterion than the 200-iteration Nelder-Mead's 0.136 + 0.021 at
    # 874 m; both give 0.14-0.15 unshared, truth 0.158). prior_var within +-50%; time_scale
    # and range_m are loosely identified and not checked.
    west, _, east, _ = quadkey_bounds(lonlat_to_quadkey(*SAN_JUAN))[0]
    width = float(np.diff(ProjectedTransform.from_lonlat(np.array([[west, SAN_JUAN[1]], [east, SAN_JUAN[1]]]))
                          .to_metres(np.array([[west, SAN_JUAN[1]], [east, SAN_JUAN[1]]]))[:, 0])[0])

    def unshared(kernel: LocalKernel) -> float:
        return float(kernel(np.array([0.0]), np.zeros(1))[0] - kernel(np.array([width]), np.zeros(1))[0])

    assert 500.0 < width < 650.0
    assert 0.5 < unshared(field.kernel) / unshared(TRUE) < 2.0
    assert 0.5 < field.kernel.prior_var / TRUE.prior_var < 1.5
    assert 0.25 < field.kernel.variance_scale < 1.0


#: The scale of the test-count noise in :func:`test_fit_recovers_separate_scales_of_tile_and_test_noise`.
TRUE_TEST_SCALE = 1.6


def test_fit_recovers_separate_scales_of_tile_and_test_noise(synthetic):
    """Rows whose noise is s v + s_t u (v the tile-mean part; u = sigma1^2 / tests, half the rows
    with 1 test and half with 100; s = 0.5, s_t = 1.6): given both parts, the fit finds both
    scales; given only their sum (one scale, as before the split) it cannot, and its variances
    of one-test rows come out too small. Fitted on the 800 val + test rows (300 val rows alone
    leave 7 hyperparameters loosely identified)."""
    rng = np.random.default_rng(11)
    parts = {}
    for name, (lonlat, years, residual, noise_var) in synthetic.items():
        test_var = 0.4 / rng.choice([1.0, 100.0], size=len(residual))
        residual = residual + np.sqrt(TRUE_TEST_SCALE * test_var) * rng.standard_normal(len(residual))
        parts[name] = (lonlat, years, residual, noise_var, test_var)
    (*train, train_u) = parts["train"]
    *val, val_u = (np.concatenate(a) for a in zip(parts["val"], parts["test"], strict=True))
    split = ResidualField.fit(*train, *val, train_test_var=train_u, val_test_var=val_u)
    one = ResidualField.fit(*train[:3], train[3] + train_u, *val[:3], val[3] + val_u)
    # seen: s_t 1.46; one scale: 1.11 on both parts. s itself trades places with a tile part
    # that forgets within a quarter or two (converged: s 0.20 with tile_time_var 0.047 over
    # 0.40 years, a lower criterion than Nelder-Mead's unconverged s 0.50 with 0.129 over
    # 3.8 years), so what is checked is what the rows identify: the variance of a row that its
    # tile's row one quarter later does not share (truth 0.044; seen 0.038 and 0.041).
    def quarter_unshared(kernel: LocalKernel) -> float:
        forgets = 1.0 - np.exp(-0.25 / kernel.time_scale)
        return kernel.variance_scale * float(val[3].mean()) + (kernel.tile_time_var + kernel.local_var) * forgets

    assert 0.7 < quarter_unshared(split.kernel) / quarter_unshared(TRUE) < 1.3
    assert 1.2 < split.kernel.test_noise_scale < 2.0
    one_test = val_u > 0.1
    assert one.kernel.variance_scale * val_u[one_test].mean() < 0.85 * TRUE_TEST_SCALE * val_u[one_test].mean()


# ----------------------------------------------------------------------------- GeoModel integration


def train_then_test_rows(dataset):
    """Train rows first, then the test rows."""
    import pandas as pd

    return pd.concat([dataset.subset("train"), dataset.subset("test")])


@pytest.fixture(scope="module")
def pr_two_quarters():
    """A random slice of the shipped PR sample, 2023Q3 + 2023Q4: ~1,550 train, ~130 val and test rows."""
    from geodbk.dataset.spatial_dataset import load_sample_dataset

    ds = load_sample_dataset("PR", quarters="2023Q3,2023Q4")
    u = np.random.default_rng(0).random(len(ds))
    keep = np.where(ds.frame["split"] == "train", u < 0.15, u < 0.1)
    small = dataclasses.replace(ds, frame=ds.frame[keep])
    assert [str(q) for q in small.quarters] == ["2023Q3", "2023Q4"]
    return small


@pytest.fixture(scope="module")
def fitted(pr_two_quarters):
    from geodbk.fit.fitting import fit_dataset

    def fit(kind="dbk-rbf", **kw):
        return fit_dataset(pr_two_quarters, kind, hidden=16, rank=16,
                           lr=1e-3, epochs=2, batch_size=256, progress=False, **kw)

    return fit


@pytest.fixture(scope="module")
def pr_model(fitted):
    """The deep part and its field alone: the tests below check their algebra (the average with a
    kriging part is checked in test_averaging.py)."""
    return fitted(kriging_average=False)


def test_fit_dataset_fits_the_field_to_the_gp_training_residuals(pr_two_quarters, pr_model):
    from geodbk.quarters import quarter_years

    field = pr_model.residuals
    assert isinstance(field, ResidualField) and pr_model.info.local_residuals is True
    train = pr_two_quarters.subset("train")
    lonlat, years = train[["lon", "lat"]].to_numpy(np.float64), quarter_years(train["year"], train["quarter"])
    tests = train["tests"].to_numpy(np.float64)
    gp = pr_model.regressor.predict(pr_model.inputs.features(lonlat, years), tests=tests)
    # the residuals less their least-squares slope in 1/tests (tests/test_field_test_counts.py)
    slope, centre = fit_tests_slope(train["y"].to_numpy() - gp.mean, tests)
    assert (field.tests_slope, field.tests_centre) == (slope, centre) and slope < 0.0
    expected = train["y"].to_numpy() - gp.mean - slope * (1.0 / tests - centre)
    np.testing.assert_allclose(field.residual, expected, rtol=0, atol=1e-9)
    # the training rows' noise, split into the GP's tile-mean part and its test-count part
    np.testing.assert_allclose(field.noise_var, gp.sd**2, rtol=1e-9)
    np.testing.assert_allclose(field.test_var, gp.measurement_sd**2 - gp.sd**2, rtol=1e-9)
    assert field.test_var.min() > 0.0
    np.testing.assert_array_equal(field.years, years)
    np.testing.assert_allclose(field.xy_m, field.projection.to_metres(lonlat), rtol=0, atol=1e-6)
    assert field.neighbours == 16


def test_geomodel_predict_adds_the_kriged_residual(pr_two_quarters, pr_model):
    from geodbk.quarters import quarter_years

    field = pr_model.residuals
    s, s_t = field.kernel.variance_scale, field.kernel.test_noise_scale
    rows = train_then_test_rows(pr_two_quarters)
    lonlat, years = rows[["lon", "lat"]].to_numpy(np.float64), quarter_years(rows["year"], rows["quarter"])
    tests = rows["tests"].to_numpy(np.float64)
    got = pr_model.predict(lonlat, years, tests=tests)
    gp = pr_model.regressor.predict(pr_model.inputs.features(lonlat, years), tests=tests)
    shift, var = field.condition(lonlat, years)
    factor = field.variance_factor(lonlat, years)  # inside the fitted period: the local volatility alone
    np.testing.assert_allclose(got.mean, gp.mean + shift, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.sd, np.sqrt(factor * (s * gp.sd**2 + var)), rtol=1e-12)
    test_noise = gp.measurement_sd**2 - gp.sd**2
    combined = factor * (s * gp.sd**2 + s_t * test_noise + var)  # its noise part then scaled as chosen on the val rows
    scaled = got.sd**2 + pr_model.tails.noise_scale**2 * (combined - got.sd**2)
    np.testing.assert_allclose(got.measurement_sd, np.sqrt(scaled), rtol=1e-12)
    # the correction is real: on training rows (first in `rows`) the shift follows the residual
    n_train = len(pr_two_quarters.subset("train"))
    assert np.abs(shift).max() > 0.05
    assert np.corrcoef(shift[:n_train], field.residual)[0, 1] > 0.5
    # predict_tiles goes the same way (each row at its own quarter, with its own tests)
    tiles = pr_model.predict_tiles(rows)
    np.testing.assert_allclose(tiles.mean, got.mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tiles.measurement_sd, got.measurement_sd, rtol=1e-12)


def test_no_field_without_local_residuals_or_a_kernel(pr_two_quarters, fitted):
    test = pr_two_quarters.subset("test")
    lonlat = test[["lon", "lat"]].to_numpy(np.float64)
    for model in (fitted(local_residuals=False), fitted("knn"), fitted(protocol="paper")):
        assert model.residuals is None and model.info.local_residuals is False, model.kind
        got = model.predict(lonlat, "2023Q4")
        direct = model.regressor.predict(model.features(lonlat, "2023Q4"))
        np.testing.assert_array_equal(got.mean, direct.mean)


def test_geomodel_save_load_keeps_the_field(pr_two_quarters, pr_model, tmp_path):
    from geodbk.fit.geomodel import GeoModel

    pr_model.save(tmp_path / "model.pt")
    back = GeoModel.load(tmp_path / "model.pt")
    assert back.residuals is not None and back.residuals.kernel == pr_model.residuals.kernel
    test = pr_two_quarters.subset("test")
    lonlat, tests = test[["lon", "lat"]].to_numpy(np.float64), test["tests"].to_numpy(np.float64)
    for when in ("2023Q3", "2023Q4"):
        ours, theirs = pr_model.predict(lonlat, when, tests=tests), back.predict(lonlat, when, tests=tests)
        np.testing.assert_array_equal(theirs.mean, ours.mean)
        np.testing.assert_array_equal(theirs.sd, ours.sd)
        np.testing.assert_array_equal(theirs.measurement_sd, ours.measurement_sd)


def test_change_variance_is_exact_joint_conditioning_of_the_pair(small):
    """With every row as a neighbour, Var[r(x, t2) - r(x, t1) | data] from the dense joint Gaussian."""
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=len(keys))
    q_lonlat = quadkey_centres(q_keys)
    t_from, t_to = q_years - 1.0, q_years
    var = field.change_variance(q_lonlat, t_from, t_to)
    projection = field.projection
    xy, q_xy = projection.to_metres(quadkey_centres(keys)), projection.to_metres(q_lonlat)
    A = dense_kernel(KERNEL, xy, keys, years, xy, keys, years) + KERNEL.variance_scale * np.diag(noise_var)
    for i in range(len(q_keys)):
        pair_xy, pair_keys = np.repeat(q_xy[i : i + 1], 2, 0), np.repeat(q_keys[i : i + 1], 2)
        pair_t = np.array([t_from[i], t_to[i]])
        kpp = dense_kernel(KERNEL, pair_xy, pair_keys, pair_t, pair_xy, pair_keys, pair_t)
        kpn = dense_kernel(KERNEL, pair_xy, pair_keys, pair_t, xy, keys, years)
        cov = kpp - kpn @ np.linalg.solve(A, kpn.T)
        assert var[i] == pytest.approx(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1], abs=1e-10)
    assert (var > 0).all() and (var < 2 * KERNEL.prior_var).all()


def test_change_variance_is_the_error_variance_of_the_kriged_change(small):
    """Monte Carlo over the joint Gaussian, m = 8: the two times pick different nearest rows,
    and change_variance is the mean squared error of the difference of the two kriged values."""
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    q_lonlat = quadkey_centres(q_keys)
    t_from, t_to = q_years - 2.5, q_years
    _, index_from = field._neighbourhoods(q_lonlat, t_from)
    _, index_to = field._neighbourhoods(q_lonlat, t_to)
    differ = np.array([set(a) != set(b) for a, b in zip(index_from, index_to, strict=True)])
    assert differ.sum() >= 5  # the test is about neighbourhoods that are not shared
    var = field.change_variance(q_lonlat, t_from, t_to)

    def kriging_weights(when: np.ndarray) -> np.ndarray:  # (q, n): the kriged value is linear in the residuals
        return np.column_stack([
            dataclasses.replace(field, residual=np.eye(len(keys))[i]).condition(q_lonlat, when)[0]
            for i in range(len(keys))
        ])

    weights = kriging_weights(t_to) - kriging_weights(t_from)
    projection = field.projection
    xy, q_xy = projection.to_metres(quadkey_centres(keys)), projection.to_metres(q_lonlat)
    both_keys, both_xy = np.concatenate([q_keys, q_keys]), np.vstack([q_xy, q_xy])
    both_t = np.concatenate([t_from, t_to])
    kqq = dense_kernel(KERNEL, both_xy, both_keys, both_t, both_xy, both_keys, both_t)
    kqn = dense_kernel(KERNEL, both_xy, both_keys, both_t, xy, keys, years)
    knn = dense_kernel(KERNEL, xy, keys, years, xy, keys, years) + KERNEL.variance_scale * np.diag(noise_var)
    cov = np.block([[kqq, kqn], [kqn.T, knn]])
    draws = np.random.default_rng(12).standard_normal((200_000, len(cov))) @ np.linalg.cholesky(cov).T
    q = len(q_keys)
    change = draws[:, q : 2 * q] - draws[:, :q]
    error = change - draws[:, 2 * q :] @ weights.T
    np.testing.assert_allclose((error**2).mean(0), var, rtol=0.02)


def test_nearest_rows_are_nearest_in_space_and_time():
    """A tile seen in 20 quarters: a query on it takes its rows nearest in time. A year counts
    as NEIGHBOUR_METRES_PER_YEAR = 250 m, so a neighbouring tile's row of the same quarter
    (about 580 m away) comes before the tile's own row three years earlier (750 m); by distance
    alone it was the other way round."""
    assert NEIGHBOUR_METRES_PER_YEAR == 250.0
    home = lonlat_to_quadkey(*SAN_JUAN)[0]
    next_door = lonlat_to_quadkey(SAN_JUAN[0] + 0.006, SAN_JUAN[1])[0]
    query = quadkey_centres(np.array([home]))
    years = 2019.125 + 0.25 * np.arange(20)
    field = make_field(KERNEL, np.array([home] * 20, dtype=object), years, np.zeros(20), np.full(20, 0.05), 5)
    _, index = field._neighbourhoods(query, np.array([years[9]]))
    assert set(index[0]) == {7, 8, 9, 10, 11}

    keys = np.array([home, home, next_door], dtype=object)
    years = np.array([2019.125, 2022.125, 2022.125])
    field = make_field(KERNEL, keys, years, np.zeros(3), np.full(3, 0.05), 2)
    distance, index = field._neighbourhoods(query, np.array([2022.125]))
    assert set(index[0]) == {1, 2} and 550 < distance[0].max() < 650
    plain = dataclasses.replace(field, metres_per_year=0.0)
    assert set(plain._neighbourhoods(query, np.array([2022.125]))[1][0]) == {0, 1}


def dense_conditional_covariance(kernel, projection, train, noise_var, query) -> np.ndarray:
    """Exact conditional covariance of the local part at the queries given all training rows, (q, q)."""
    (keys, t), (q_keys, q_t) = train, query
    xy, q_xy = projection.to_metres(quadkey_centres(keys)), projection.to_metres(quadkey_centres(q_keys))
    A = dense_kernel(kernel, xy, keys, t, xy, keys, t) + kernel.variance_scale * np.diag(noise_var)
    k = dense_kernel(kernel, q_xy, q_keys, q_t, xy, keys, t)
    return dense_kernel(kernel, q_xy, q_keys, q_t, q_xy, q_keys, q_t) - k @ np.linalg.solve(A, k.T)


def test_area_condition_with_all_rows_is_the_exact_conditional_variance(small, monkeypatch):
    """Neighbourhoods holding every training row and no distance cutoff: the area variance is
    w^T C w of the exact conditional covariance C (to 1e-12)."""
    from geodbk.fit import area_variance

    monkeypatch.setattr(area_variance, "AREA_CUTOFF_RANGES", 100.0)
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=len(keys))
    queries = np.concatenate([q_keys[:8], keys[:4]])  # training tiles, unseen tiles, near and far
    lonlat, when = quadkey_centres(queries), np.full(len(queries), 2023.875)
    groups, weights = np.array([0] * 6 + [1] * 6), np.linspace(0.5, 2.0, 12)
    shift, var, area = field.area_condition(lonlat, when, weights, groups, 2)
    C = dense_conditional_covariance(KERNEL, field.projection, (keys, years), noise_var, (queries, when))
    expected = [weights[groups == g] @ C[np.ix_(groups == g, groups == g)] @ weights[groups == g] for g in (0, 1)]
    np.testing.assert_allclose(area, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(shift, field.condition(lonlat, when)[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(var, np.diag(C), rtol=1e-10, atol=1e-15)


def test_area_condition_is_exact_on_the_diagonal_and_fully_correlated_within_a_tile(small):
    keys, years, residual, noise_var, *_ = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    lonlat, when = quadkey_centres(keys[:3]), np.full(3, 2023.875)
    _, v = field.condition(lonlat, when)
    _, _, one = field.area_condition(lonlat, when, np.ones(3), np.arange(3), 3)
    np.testing.assert_allclose(one, v, rtol=0, atol=1e-15)
    # two points in the same tile (its centre and a corner-ward point) are one tile: v
    west, south, east, north = quadkey_bounds(keys[:1])[0]
    same = np.array([lonlat[0], [west + 0.1 * (east - west), south + 0.1 * (north - south)]])
    _, _, both = field.area_condition(same, when[:2], np.array([0.5, 0.5]), np.zeros(2, int), 1)
    assert both[0] == pytest.approx(v[0], rel=1e-12)
    # two far-apart tiles are independent: the variance of the average is (v1 + v2) / 4
    far = np.array([[-66.06, 18.45], [-66.5, 18.2]])
    _, v_far = field.condition(far, when[:2])
    _, _, average = field.area_condition(far, when[:2], np.array([0.5, 0.5]), np.zeros(2, int), 1)
    assert average[0] == pytest.approx(0.25 * v_far.sum(), rel=1e-12)


def test_area_criterion_is_the_nll_of_area_condition(small, monkeypatch):
    """The fit's area term, with its pair geometry set up once, equals the Gaussian NLL of the
    areas' mean residuals under the variance :meth:`area_condition` and the one combination
    rule give, for two different kernels (it must follow the kernel being tried)."""
    from geodbk.fit import area_variance
    from geodbk.fit.metrics import nll as metric_nll
    from geodbk.prediction import Prediction

    monkeypatch.setattr(area_variance, "AREA_CUTOFF_RANGES", 100.0)
    keys, years, residual, noise_var, q_keys, _ = small
    rng = np.random.default_rng(11)
    test_var = rng.uniform(0.01, 0.05, size=30)
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    field.test_var = test_var
    val_keys = np.concatenate([q_keys, tiles_near(rng, 7, 0.02)])  # 16 validation rows
    lonlat, when = quadkey_centres(val_keys), np.full(16, 2023.875)
    val_residual, val_test_var = rng.normal(0.0, 0.3, 16), rng.uniform(0.01, 0.2, 16)
    rows = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2, 3, 4, 11])  # a row may sit in two areas
    groups = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    gp_var = np.array([0.01, 0.02, 0.005, 0.03])
    term = AreaTerm.build(field, AreaGroups(rows, groups, gp_var), lonlat, when, val_residual, val_test_var)
    criterion = KernelCriterion(field, None, term, prior_rows=0)
    for kernel in (KERNEL, dataclasses.replace(KERNEL, local_var=0.08, range_m=3000.0, test_noise_scale=1.4)):
        field.kernel = kernel
        w = 1.0 / np.bincount(groups)[groups]
        shift, _, local = field.area_condition(lonlat[rows], when[rows], w, groups, 4)
        mean = np.bincount(groups, weights=w * shift)
        noise = np.bincount(groups, weights=w**2 * val_test_var[rows])
        observed = np.bincount(groups, weights=w * val_residual[rows])
        expected = metric_nll(observed, Prediction(mean, np.sqrt(kernel.combine(gp_var, local, noise))))
        assert float(criterion(torch.tensor(kernel.to_vector()))) == pytest.approx(expected, rel=1e-10)


def test_square_areas_hold_rows_of_one_square_and_one_quarter():
    rng = np.random.default_rng(5)
    lonlat = np.column_stack([SAN_JUAN[0] + rng.uniform(-0.1, 0.1, 600), SAN_JUAN[1] + rng.uniform(-0.1, 0.1, 600)])
    years = rng.choice([2023.125, 2023.375], size=600)
    xy = ProjectedTransform.from_lonlat(lonlat).to_metres(lonlat)
    rows, groups = square_areas(lonlat, years, sizes_m=(2000.0, 5000.0), min_rows=3, max_pairs=10**9)
    sizes = np.bincount(groups)
    assert sizes.min() >= 3 and len(np.unique(groups)) == len(sizes)
    for g in range(len(sizes)):
        members = rows[groups == g]
        assert len(np.unique(years[members])) == 1
        assert min(len(np.unique(np.floor(xy[members] / size), axis=0)) for size in (2000.0, 5000.0)) == 1
    # every square of either size and one quarter with 3 or more rows is one area, with all its rows
    expected = []
    for size in (2000.0, 5000.0):
        _, counts = np.unique(np.column_stack([np.floor(xy / size), years]), axis=0, return_counts=True)
        expected.extend(counts[counts >= 3])
    assert sorted(sizes) == sorted(expected)
    # the cap on ordered pairs keeps whole areas, in a random order
    capped_rows, capped = square_areas(lonlat, years, min_rows=3, max_pairs=500)
    assert (np.bincount(capped) ** 2).sum() <= 500 and len(capped_rows) == len(capped) > 0


def test_areas_of_a_known_local_field_are_calibrated_after_the_fit():
    """Recovered truth: residuals drawn from a known local kernel (tile offsets plus a shared
    part of range 1.5 km) on 5,000 distinct tiles. The field is fitted on 1,500 training and
    1,500 validation tiles with the area criterion, then held-out tiles are averaged over 2 km
    squares: the z-scores of their observed means (joint sd from :meth:`area_condition` plus
    each tile's own noise) have sd within 10% of 1, and the shared variance is recovered."""
    rng = np.random.default_rng(21)
    lon, lat = SAN_JUAN[0] + rng.uniform(-0.25, 0.25, 40000), SAN_JUAN[1] + rng.uniform(-0.25, 0.25, 40000)
    keys = pd.unique(lonlat_to_quadkey(lon, lat))[:5000]
    truth = LocalKernel(variance_scale=1.0, tile_var=0.03, tile_time_var=1e-5, time_scale=1.0, local_var=0.04,
                        range_m=1500.0, test_noise_scale=1.0)
    lonlat, years = quadkey_centres(keys), np.full(5000, 2023.375)
    xy = ProjectedTransform.from_lonlat(lonlat).to_metres(lonlat)
    noise = rng.uniform(0.01, 0.05, 5000)
    cov = dense_kernel(truth, xy, keys, years, xy, keys, years) + np.diag(noise)
    draw = np.linalg.cholesky(cov) @ rng.standard_normal(5000)
    train, val, test = slice(0, 1500), slice(1500, 3000), slice(3000, 5000)
    rows, groups = square_areas(lonlat[val], years[val])
    areas = AreaGroups(rows, groups, np.bincount(groups, weights=noise[val][rows]) / np.bincount(groups) ** 2)
    field = ResidualField.fit(lonlat[train], years[train], draw[train], noise[train], lonlat[val], years[val],
                              draw[val], noise[val], val_areas=areas)
    assert field.kernel.local_var == pytest.approx(0.04, rel=0.35)
    test_xy = xy[test]
    cell = np.floor(test_xy / 2000.0).astype(np.int64)
    _, label, counts = np.unique(cell, axis=0, return_inverse=True, return_counts=True)
    keep = counts[label.reshape(-1)] >= 3
    _, group = np.unique(label.reshape(-1)[keep], return_inverse=True)
    group = group.reshape(-1)
    n = np.bincount(group).astype(np.float64)
    w = 1.0 / n[group]
    shift, _, local = field.area_condition(lonlat[test][keep], years[test][keep], w, group, len(n))
    gp_var = np.bincount(group, weights=w**2 * noise[test][keep])  # each tile's own noise, as the GP's variance
    var = field.kernel.combine(gp_var, local)
    observed = np.bincount(group, weights=w * draw[test][keep])
    z = (observed - np.bincount(group, weights=w * shift)) / np.sqrt(var)
    assert len(z) > 200
    assert z.std() == pytest.approx(1.0, abs=0.1)


# ----------------------------------------------------------------------------- forecast horizon


def test_pseudo_forecast_recovers_a_known_relative_excess_variance():
    """Validation rows of the last quarter whose residuals have (1 + kappa) times the variance the
    field predicts for them: kappa = 0.5 comes back, as a rate per year over the 0.25-year gap."""
    rng = np.random.default_rng(3)
    train_keys = tiles_near(rng, 40, 0.02)
    years = np.repeat([2023.375, 2023.625], 20)
    field = make_field(KERNEL, train_keys, years, np.zeros(40), np.full(40, 0.05), 16)
    far = (SAN_JUAN[0] + 0.5, SAN_JUAN[1])  # 50 km away: no correction, conditional var = prior var
    val_lonlat = np.column_stack([far[0] + rng.uniform(-0.1, 0.1, 3000), far[1] + rng.uniform(-0.1, 0.1, 3000)])
    gp_var = rng.uniform(0.02, 0.2, size=3000)
    test_var = rng.uniform(0.01, 0.3, size=3000)
    total = KERNEL.combine(gp_var, np.full(3000, KERNEL.prior_var), test_var)
    residual = rng.normal(0.0, np.sqrt(1.5 * total))
    last = ValidationRows.of(val_lonlat, np.full(3000, 2023.625), residual, gp_var, test_var)
    assert pseudo_forecast_rate(field, last) * 0.25 == pytest.approx(0.5, abs=0.08)
    # no last-quarter validation rows, or one training quarter: no rate
    earlier = ValidationRows.of(val_lonlat, np.full(3000, 2023.375), residual, gp_var, test_var)
    assert pseudo_forecast_rate(field, earlier) == 0.0


@pytest.mark.filterwarnings("ignore::geodbk.errors.ExtrapolationWarning")  # quarters after the fitted ones, by design
def test_forecast_variance_grows_with_the_horizon(pr_model):
    field = pr_model.residuals
    lonlat = np.array([[-66.06, 18.45], [-66.5, 18.2], [-67.1, 18.3]])
    saved = field.horizon_rate
    try:
        field.horizon_rate = 0.0
        plain = pr_model.predict_series(lonlat, ["2023Q4", "2024Q1", "2024Q2", "2024Q4"])
        plain_change = pr_model.predict_change(lonlat, "2023Q4", "2024Q2")
        field.horizon_rate = 1.2
        ahead = pr_model.predict_series(lonlat, ["2023Q4", "2024Q1", "2024Q2", "2024Q4"])
        change = pr_model.predict_change(lonlat, "2023Q4", "2024Q2")
    finally:
        field.horizon_rate = saved
    # inside the fitted period nothing changes; after it the variance is F(h) = 1 + 1.2 h times larger
    np.testing.assert_allclose(ahead[0].sd, plain[0].sd, rtol=1e-12)
    for p, q, h in zip(ahead[1:], plain[1:], (0.25, 0.5, 1.0), strict=True):
        np.testing.assert_allclose(p.sd**2, (1 + 1.2 * h) * q.sd**2, rtol=1e-9)
        np.testing.assert_allclose(p.mean, q.mean, rtol=0, atol=0)
    ratios = np.stack([(p.sd / q.sd) for p, q in zip(ahead, plain, strict=True)])
    assert (np.diff(ratios, axis=0) > 0).all()
    # the change into a forecast quarter: covariance scaled by sqrt(F_from F_to), so wider than without
    assert (change.sd > plain_change.sd).all()
    np.testing.assert_allclose(change.sd_to**2, 1.6 * plain_change.sd_to**2, rtol=1e-9)
    np.testing.assert_allclose(change.sd_from, plain_change.sd_from, rtol=1e-12)


def test_a_field_saved_before_the_test_noise_scale_loads_as_it_was(small):
    """Payloads without ``test_var`` (their ``noise_var`` is the whole measurement variance) load
    with zero test noise and s_t = s, so they predict as they did."""
    keys, years, residual, noise_var, q_keys, q_years = small
    field = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8)
    old = field.to_payload()
    del old["test_var"], old["kernel"]["test_noise_scale"]
    back = ResidualField.from_payload(old)
    assert back.kernel.test_noise_scale == KERNEL.variance_scale and not back.test_var.any()
    lonlat = quadkey_centres(q_keys)
    for ours, theirs in zip(field.condition(lonlat, q_years), back.condition(lonlat, q_years), strict=True):
        np.testing.assert_array_equal(theirs, ours)


def test_a_field_saved_before_space_time_neighbours_chooses_them_by_distance(small):
    keys, years, residual, noise_var, *_ = small
    old = make_field(KERNEL, keys, years, residual, noise_var, neighbours=8).to_payload()
    del old["metres_per_year"], old["volatility"]
    back = ResidualField.from_payload(old)
    assert back.metres_per_year == 0.0
    assert back.volatility is None  # fields saved before the local volatility keep V = 1
    np.testing.assert_array_equal(back.variance_factor(quadkey_centres(keys), years), np.ones(len(keys)))


def test_the_variance_factor_scales_the_covariance_of_every_product(pr_model, monkeypatch):
    """With a factor F_i per point, Cov'(i, j) = sqrt(F_i F_j) Cov(i, j): a point's variance, the
    variance of a two-point area's mean and of a change all follow it, and no mean moves."""
    field = pr_model.residuals
    lonlat = np.array([[-66.06, 18.45], [-66.055, 18.452], [-66.5, 18.2], [-66.49, 18.21]])
    groups = np.array([0, 0, 1, 1])
    monkeypatch.setattr(type(field), "variance_factor", lambda self, ll, yy: np.ones(len(ll)))
    plain_areas, plain_cells = pr_model.predict_areas(lonlat, groups, time="2023Q4", return_cells=True)
    plain_change = pr_model.predict_change(lonlat, "2023Q3", "2023Q4")
    factor = np.array([0.5, 2.0, 1.5, 0.8])
    monkeypatch.setattr(type(field), "variance_factor", lambda self, ll, yy: factor[: len(ll)].copy())
    areas, cells = pr_model.predict_areas(lonlat, groups, time="2023Q4", return_cells=True)
    change = pr_model.predict_change(lonlat, "2023Q3", "2023Q4")
    np.testing.assert_allclose(cells.sd**2, factor * plain_cells.sd**2, rtol=1e-9)
    np.testing.assert_allclose(cells.mean, plain_cells.mean, rtol=0, atol=0)
    np.testing.assert_allclose(areas.mean, plain_areas.mean, rtol=0, atol=0)
    v = plain_cells.sd**2
    for g, (i, j) in enumerate(((0, 1), (2, 3))):
        covariance = 2.0 * plain_areas.sd[g] ** 2 - 0.5 * (v[i] + v[j])  # from Var((f_i + f_j) / 2)
        expected = 0.25 * (factor[i] * v[i] + factor[j] * v[j] + 2.0 * np.sqrt(factor[i] * factor[j]) * covariance)
        assert areas.sd[g] ** 2 == pytest.approx(expected, rel=1e-5)  # the GP part is float32
    np.testing.assert_allclose(change.sd**2, factor * plain_change.sd**2, rtol=1e-9)
    np.testing.assert_allclose(change.mean, plain_change.mean, rtol=0, atol=0)
    np.testing.assert_allclose(change.sd_from**2, factor * plain_change.sd_from**2, rtol=1e-9)


# ----------------------------------------------------------------------------- the kernel search


def _criterion_on(synthetic, with_areas: bool):
    """The fit's criterion on the synthetic rows: tiles, and optionally 2 km validation squares."""
    from geodbk.fit.kernel_search import TileTerm

    train, val = synthetic["train"], synthetic["val"]
    rng = np.random.default_rng(3)
    field = ResidualField(KERNEL, ProjectedTransform.from_lonlat(train[0]),
                          ProjectedTransform.from_lonlat(train[0]).to_metres(train[0]), train[1], train[2], train[3],
                          neighbours=8, test_var=rng.uniform(0.0, 0.05, len(train[2])))
    lonlat, years, residual, gp_var = val
    test_var = rng.uniform(0.0, 0.05, len(residual))
    tiles = TileTerm(field.neighbourhoods(lonlat, years), *(torch.as_tensor(a) for a in (residual, gp_var, test_var)))
    areas = None
    if with_areas:
        rows, groups = square_areas(lonlat, years, sizes_m=(2000.0,))
        n_areas = int(groups.max()) + 1
        gp_area_var = np.full(n_areas, 0.01)
        areas = AreaTerm.build(field, AreaGroups(rows, groups, gp_area_var), lonlat, years, residual, test_var)
    return KernelCriterion(field, tiles, areas)


def test_kernel_criterion_gradient_is_exact(synthetic):
    """Autograd's gradient of the tile + area criterion equals central finite differences of it
    (torch's gradcheck, float64), at a kernel away from every bound."""
    criterion = _criterion_on(synthetic, with_areas=True)
    assert criterion.areas is not None and len(criterion.areas.observed) >= 5
    point = torch.tensor(KERNEL.to_vector(), requires_grad=True)
    assert torch.autograd.gradcheck(criterion, (point,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_exact_gradient_search_finds_the_finite_difference_optimum(synthetic):
    """search_kernel (exact gradients) reaches the optimum that L-BFGS-B with scipy's
    finite-difference gradients (the search before it) finds on the same criterion: the same
    criterion value to 1e-6 and the same kriged means and variances to 1e-4 (what the kernel
    is for), with several times fewer criterion evaluations. The kernel the search starts
    from is far from both (checked, so the comparison can fail)."""
    from scipy.optimize import minimize

    from geodbk.fit.kernel_search import search_kernel
    from geodbk.fit.local_kernel import KERNEL_BOUNDS

    criterion = _criterion_on(synthetic, with_areas=True)
    calls = {"exact": 0, "differences": 0}
    value_and_gradient = criterion.value_and_gradient

    def counted(vector):
        calls["exact"] += 1
        return value_and_gradient(vector)

    criterion.value_and_gradient = counted  # type: ignore[method-assign]
    exact = search_kernel(criterion)

    def value(vector):
        calls["differences"] += 1
        return value_and_gradient(vector)[0]

    bounds = [(np.log(low), np.log(high)) for low, high in KERNEL_BOUNDS]
    reference = minimize(value, LocalKernel().to_vector(), method="L-BFGS-B", bounds=bounds,
                         options={"maxiter": 200}).x
    found = exact.to_vector()
    assert value(found) == pytest.approx(value(reference), rel=1e-6)
    # The same optimum where it is identified: the kriged means and predictive variances at the
    # validation rows agree to 1e-4. The parameters themselves need not: tile_var and
    # tile_time_var trade off along a flat valley, and the finite-difference answer for
    # tile_time_var moved by 2e-3 (log) between a one-thread and a two-thread run.
    field, (lonlat, years, _, gp_var) = criterion.field, synthetic["val"]
    by_exact = dataclasses.replace(field, kernel=exact).condition(lonlat, years)
    by_reference = dataclasses.replace(field, kernel=LocalKernel.from_vector(reference)).condition(lonlat, years)
    np.testing.assert_allclose(by_exact[0], by_reference[0], atol=1e-4)
    np.testing.assert_allclose(exact.combine(gp_var, by_exact[1]),
                               LocalKernel.from_vector(reference).combine(gp_var, by_reference[1]), rtol=1e-4)
    start = dataclasses.replace(field, kernel=LocalKernel()).condition(lonlat, years)
    assert np.abs(start[1] - by_exact[1]).max() > 1e-2
    assert calls["exact"] * 4 < calls["differences"]


@pytest.mark.parametrize("n_val", [1, 4])
def test_a_tiny_validation_set_without_areas_still_fits(synthetic, n_val):
    """A split that leaves a handful of validation rows has no validation square of 3 rows: the
    fit scores the tiles alone, within the kernel's bounds (it used to stop with numpy's
    "cannot reshape array of size 0" from the empty areas' neighbour search)."""
    from geodbk.fit.local_kernel import KERNEL_BOUNDS

    train, val = synthetic["train"], synthetic["val"]
    far = np.random.default_rng(1).choice(len(val[0]), n_val, replace=False)
    lonlat, years, residual, gp_var = (a[far] for a in val)
    rows, groups = square_areas(lonlat, years)
    assert len(rows) == 0 or n_val >= 3
    areas = AreaGroups(rows[:0], groups[:0], np.zeros(0))  # no area has 3 rows of so few
    field = ResidualField.fit(*train, lonlat, years, residual, gp_var, val_areas=areas)
    for value, (low, high) in zip(np.exp(field.kernel.to_vector()), KERNEL_BOUNDS, strict=True):
        assert low * (1 - 1e-9) <= value <= high * (1 + 1e-9)
    mean, var = field.condition(lonlat, years)
    assert np.isfinite(mean).all() and (var >= 0).all()
    assert square_areas(np.zeros((0, 2)), np.zeros(0))[0].shape == (0,)


# ----------------------------------------------------------------------------- stored numbers


def stored_fit_inputs():
    """900 rows on 300 tiles near San Juan over 4 quarters (600 train, 300 val) and the 2 km and
    5 km squares of the validation rows."""
    rng = np.random.default_rng(5)
    lon, lat = SAN_JUAN[0] + rng.uniform(-0.06, 0.06, 3000), SAN_JUAN[1] + rng.uniform(-0.06, 0.06, 3000)
    keys = pd.unique(lonlat_to_quadkey(lon, lat))[:300]
    tile = rng.integers(0, len(keys), 900)
    lonlat = quadkey_centres(keys[tile])
    years = 2022.625 + 0.25 * rng.integers(0, 4, 900)
    residual = rng.normal(0, 0.25, len(keys))[tile] + 0.1 * np.sin(300 * lonlat[:, 0]) + rng.normal(0, 0.2, 900)
    gp_var, test_var = rng.uniform(0.02, 0.08, 900), rng.uniform(0.0, 0.05, 900)
    rows, groups = square_areas(lonlat[600:], years[600:])
    areas = AreaGroups(rows, groups, np.bincount(groups, weights=gp_var[600:][rows]) / np.bincount(groups) ** 2)
    train = (lonlat[:600], years[:600], residual[:600], gp_var[:600])
    val = (lonlat[600:], years[600:], residual[600:], gp_var[600:])
    return train, val, test_var, areas


def test_a_small_fit_gives_its_stored_numbers(monkeypatch):
    """A fit with areas, a forecast rate and a volatility, and every product of the fitted field,
    against numbers stored from the code before issue 36 split residuals.py (the split left them
    bit-identical). 1e-10, not 0: another BLAS may round the optimiser's path differently. The
    stored numbers predate the kernel prior, so it is off here."""
    monkeypatch.setattr(kernel_search, "PRIOR_ROWS", 0.0)
    train, val, test_var, areas = stored_fit_inputs()
    field = ResidualField.fit(*train, *val, train_test_var=test_var[:600], val_test_var=test_var[600:],
                              val_areas=areas)
    assert areas.n_areas == 77
    q = np.array([[-66.06, 18.45], [-66.03, 18.47], [-66.1, 18.42], [-66.3, 18.3]])
    qt = np.array([2022.875, 2023.375, 2023.625, 2024.125])
    assert field.volatility is not None
    got = {
        "kernel": np.exp(field.kernel.to_vector()),
        "horizon_rate": field.horizon_rate,
        "volatility": (field.volatility.prior_rows, field.volatility.neighbour_weight, field.volatility.range_m),
        "condition": field.condition(q, qt),
        "leave_one_out": tuple(a[[0, 100, 599]] for a in field.leave_one_out()),
        "change": field.change_variance(q, qt, qt + 0.5),
        "area": field.area_condition(q, qt, np.array([0.5, 0.5, 1.0, 1.0]), np.array([0, 0, 1, 2]), 3)[2],
        "factor": field.variance_factor(q, qt + 0.5),
    }
    stored = {
        "kernel": [2.6846516135746101e-01, 9.9999999999999974e-06, 2.5778619132815019e-02, 3.4341968555050468e+00,
                   5.3508180839147157e-02, 3.8157609163447336e+02, 4.0658215398809139e-01],
        "horizon_rate": 0.10441721203013388,
        "volatility": (16.0, 1.0, 500.0),
        "condition": ([-8.6034966192633372e-02, 5.5287004871958506e-02, 6.0834947465030070e-02, 4.1110068343935281e-27],
                      [0.013966683834781835, 0.07741838424846528, 0.018329425246426508, 0.07929679997196218]),
        "leave_one_out": ([0.07401226620997577, -0.12925944511829343, -0.20617020688592408],
                          [0.020977482835318174, 0.093385066639119, 0.03927634261613552]),
        "change": [0.014440569061102276, 0.021473586843913456, 0.020366479274481104, 0.021485417095557846],
        "area": [0.022846267020811776, 0.018329425246426494, 0.07929679997196216],
        "factor": [0.8020436065616473, 1.3030832691976726, 1.179652755706251, 1.1305215150376673],
    }
    for name, values in stored.items():
        np.testing.assert_allclose(got[name], values, rtol=1e-10, atol=1e-15, err_msg=name)


def test_the_kernel_prior_holds_a_small_validation_set_near_the_defaults(monkeypatch):
    """With 40 validation rows the search without the prior moves the log hyperparameters far
    from the defaults; the prior (worth 30 rows) keeps them nearer, a stronger one (the default,
    100 rows) nearer still, and with 300 rows its pull is smaller than with 40."""
    train, val, test_var, _ = stored_fit_inputs()
    default, default_rows = LocalKernel().to_vector(), kernel_search.PRIOR_ROWS

    def distance(n_val: int, prior_rows: float) -> float:
        monkeypatch.setattr(kernel_search, "PRIOR_ROWS", prior_rows)
        part = tuple(a[:n_val] for a in val)
        field = ResidualField.fit(*train, *part, train_test_var=test_var[:600], val_test_var=test_var[600:600 + n_val])
        return float(np.linalg.norm(field.kernel.to_vector() - default))

    free, held = distance(40, 0.0), distance(40, 30.0)
    assert held < 0.7 * free
    assert distance(40, default_rows) < held
    assert distance(300, 0.0) - distance(300, 30.0) < free - held
