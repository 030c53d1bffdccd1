"""A new measurement's Student-t family: its scores against scipy and the defining integrals,
its 95% interval by Monte Carlo, and the validation choice recovering a known df and scale."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from geodbk.fit.metrics import coverage95, crps, nll, nll_per_row
from geodbk.fit.tails import MeasurementTails, fit_measurement_tails
from geodbk.prediction import Prediction, quantile95, to_data_units


def _scipy_t(mean: float, sd: float, df: float):
    """The Student-t with this mean, standard deviation and df, as scipy parametrises it."""
    return stats.t(df, mean, sd * math.sqrt((df - 2.0) / df))


@pytest.mark.parametrize("df", [3.0, 5.0, 30.0])
def test_t_nll_and_crps_match_scipy_and_the_defining_integral(df):
    mean, sd = 0.3, 0.7
    y = np.array([-2.5, 0.1, 0.9])
    p = Prediction(np.full(3, mean), np.full(3, sd), df=df)
    dist = _scipy_t(mean, sd, df)
    np.testing.assert_allclose(nll_per_row(y, p), -dist.logpdf(y), rtol=1e-12)
    for value in y:
        below = integrate.quad(lambda x: dist.cdf(x) ** 2, -np.inf, value)[0]
        above = integrate.quad(lambda x: (1.0 - dist.cdf(x)) ** 2, value, np.inf)[0]
        one = Prediction(np.array([mean]), np.array([sd]), df=df)
        assert crps(np.array([value]), one) == pytest.approx(below + above, rel=1e-7)
    assert dist.std() == pytest.approx(sd, rel=1e-12)  # sd is the t's standard deviation


def test_large_df_tends_to_the_gaussian_and_inf_is_it():
    y, mean, sd = np.array([-1.0, 0.4, 2.0]), np.zeros(3), np.full(3, 0.8)
    gauss, t_large = Prediction(mean, sd), Prediction(mean, sd, df=1e7)
    assert nll(y, t_large) == pytest.approx(nll(y, gauss), abs=1e-6)
    assert crps(y, t_large) == pytest.approx(crps(y, gauss), abs=1e-6)
    assert quantile95(math.inf) == pytest.approx(stats.norm.ppf(0.975), abs=1e-6)


def test_central_interval_holds_95_percent_of_t_draws():
    df, sd = 4.0, 0.5
    draws = _scipy_t(0.0, sd, df).rvs(400_000, random_state=np.random.default_rng(3))
    p = Prediction(np.zeros(len(draws)), np.full(len(draws), sd), df=df)
    assert coverage95(draws, p) == pytest.approx(0.95, abs=0.002)
    np.testing.assert_allclose(p.upper - p.lower, p.pi_width)
    _, low, high = to_data_units(p.mean[:1], p.sd[:1], df)
    np.testing.assert_allclose([low[0], high[0]], 10.0 ** np.array([p.lower[0], p.upper[0]]))
    assert p.pi_width[0] > Prediction(p.mean[:1], p.sd[:1]).pi_width[0] * 0.9  # same sd, similar width


def test_validation_choice_recovers_a_known_df_and_noise_scale():
    """Measurements drawn as a t of df 5 whose noise sd beyond the tile mean's is 1.3 times
    what the Gaussian prediction claims: the choice finds both; Gaussian draws get a large df."""
    rng = np.random.default_rng(0)
    n, df, tile_sd, noise_sd = 40_000, 5.0, 0.3, 0.5
    mean = rng.normal(size=n)
    true_sd = math.sqrt(tile_sd**2 + noise_sd**2)
    y = mean + _scipy_t(0.0, true_sd, df).rvs(n, random_state=rng)
    claimed_sd = math.sqrt(tile_sd**2 + (noise_sd / 1.3) ** 2)
    claimed = Prediction(mean, np.full(n, tile_sd), measurement_sd=np.full(n, claimed_sd))
    tails = fit_measurement_tails(y, claimed)
    assert tails.df in (4.0, 5.0, 6.0)
    assert tails.noise_scale == pytest.approx(1.3, rel=0.03)
    gaussian_y = mean + rng.normal(0.0, true_sd, n)
    assert fit_measurement_tails(gaussian_y, claimed).df >= 30.0


def test_apply_changes_only_the_measurement_distribution():
    p = Prediction(np.zeros(2), np.full(2, 0.3), measurement_sd=np.full(2, 0.5))
    tails = MeasurementTails(df=6.0, noise_scale=0.5)
    out = tails.apply(p)
    np.testing.assert_array_equal(out.sd, p.sd)
    assert out.df == math.inf  # the tile mean stays Gaussian
    measured = out.measurement()
    np.testing.assert_allclose(measured.sd, math.sqrt(0.09 + 0.25 * 0.16))  # noise var 0.16, scaled by 0.5^2
    assert measured.df == 6.0
    assert out.subset(np.array([True, False])).measurement().df == 6.0
    no_tests = Prediction(np.zeros(2), np.full(2, 0.3))
    assert tails.apply(no_tests) is no_tests
    fitted = MeasurementTails(df=8.0, noise_scale=1.1, validation_nll=0.62)
    assert MeasurementTails.from_payload(fitted.to_payload()) == fitted


def test_the_test_count_shift_recovers_a_known_slope():
    """t measurements whose centre moves by b (1/k - c): the slope and the t's df are found, and
    the shifted family scores the rows better than the unshifted one."""
    rng = np.random.default_rng(1)
    n, slope = 30_000, -0.3
    tests = rng.integers(1, 30, n).astype(np.float64)
    train_tests = rng.integers(1, 30, 50_000).astype(np.float64)
    centre = float(np.mean(1.0 / train_tests))
    mean = rng.normal(size=n)
    y = mean + slope * (1.0 / tests - centre) + _scipy_t(0.0, 0.4, 5.0).rvs(n, random_state=rng)
    claimed = Prediction(mean, np.full(n, 0.2), measurement_sd=np.full(n, 0.4))
    tails = fit_measurement_tails(y, claimed, tests, train_tests=train_tests)
    assert tails.tests_shift == pytest.approx(slope, abs=0.02)
    assert tails.tests_centre == centre and tails.df in (4.0, 5.0, 6.0)
    measured = tails.apply(claimed, tests).measurement()
    np.testing.assert_allclose(measured.mean - mean, tails.tests_shift * (1.0 / tests - centre))
    assert tails.validation_nll < fit_measurement_tails(y, claimed).validation_nll - 0.005
    assert tails.apply(claimed).measurement().mean is claimed.mean  # no test counts: no shift
    np.testing.assert_array_equal(tails.apply(claimed, tests).sd, claimed.sd)  # the tile mean never moves
    subset = tails.apply(claimed, tests).subset(np.arange(5))
    np.testing.assert_allclose(subset.measurement().mean, measured.mean[:5])
    assert MeasurementTails.from_payload(tails.to_payload()) == tails
    older = {"df": 8.0, "noise_scale": 1.1, "validation_nll": 0.6}  # a file from before the shift
    assert MeasurementTails.from_payload(older).tests_shift == 0.0


def test_equal_test_counts_give_no_shift():
    rng = np.random.default_rng(2)
    y = rng.normal(size=500)
    claimed = Prediction(np.zeros(500), np.full(500, 0.5), measurement_sd=np.full(500, 1.0))
    assert fit_measurement_tails(y, claimed, np.full(500, 3.0), train_tests=np.full(50, 2.0)).tests_shift == 0.0
