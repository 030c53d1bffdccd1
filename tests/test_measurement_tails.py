"""A new measurement's family: its scores of a prediction against scipy, its 95% interval and
P(meets) by Monte Carlo, the validation choice recovering a known shape, scale and test-count
shift, and model files of the Student-t family before it."""

import math

import numpy as np
import pytest
from scipy import stats

from geodbk.fit.metrics import coverage95, crps, nll, nll_per_row
from geodbk.fit.tails import MeasurementTails, fit_measurement_tails
from geodbk.prediction import Prediction, probability_both_above, probability_pair_above, to_data_units
from geodbk.shape import Shape

SKEWED = Shape(skew=-0.45, tailweight=1.08)


def _draws(shape: Shape, n: int, rng: np.random.Generator) -> np.ndarray:
    """n standardised draws of a sinh-arcsinh ``shape`` from its definition (sample-standardised)."""
    raw = np.sinh((np.arcsinh(rng.standard_normal(n)) + shape.skew) / shape.tailweight)
    return (raw - raw.mean()) / raw.std()


def test_a_shaped_prediction_scores_through_its_shape():
    mean, sd = np.array([0.3, -1.0]), np.array([0.7, 0.2])
    y = np.array([-1.5, -0.9])
    p = Prediction(mean, sd, shape=SKEWED)
    np.testing.assert_allclose(nll_per_row(y, p), np.log(sd) - SKEWED.log_density((y - mean) / sd))
    assert crps(y, p) == pytest.approx(np.mean(sd * SKEWED.crps((y - mean) / sd)))
    t = Prediction(mean, sd, shape=Shape(df=4.0))
    scipy_t = stats.t(4.0, mean, sd * math.sqrt(0.5))
    np.testing.assert_allclose(nll_per_row(y, t), -scipy_t.logpdf(y), rtol=1e-12)


def test_central_interval_holds_95_percent_of_draws_and_data_units_follow_the_shape():
    rng = np.random.default_rng(3)
    sd = 0.5
    draws = sd * _draws(SKEWED, 400_000, rng)
    p = Prediction(np.zeros(len(draws)), np.full(len(draws), sd), shape=SKEWED)
    assert coverage95(draws, p) == pytest.approx(0.95, abs=0.002)
    assert np.mean(draws <= p.quantile(0.5)[0]) == pytest.approx(0.5, abs=0.002)
    np.testing.assert_allclose(p.upper - p.lower, p.pi_width)
    median, low, high = to_data_units(p.mean[:1], p.sd[:1], SKEWED)
    expected = 10.0 ** np.array([np.median(draws), p.lower[0], p.upper[0]])
    np.testing.assert_allclose([median[0], low[0], high[0]], expected, rtol=2e-3)
    assert np.mean(draws >= 0.2) == pytest.approx(p.probability_above(0.2)[0], abs=0.002)


def test_pair_probability_is_the_gaussian_copula_of_the_two_shapes():
    """Draws joined by a Gaussian copula of rho 0.6: P(both above) matches; two Gaussians give the
    bivariate normal probability and rho = 0 the product of the marginals."""
    rng = np.random.default_rng(4)
    n, rho = 1_000_000, 0.6
    normal = rng.multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]], n)
    other = Shape(skew=0.2, tailweight=0.8)
    a = 1.0 + 0.3 * SKEWED.quantile(stats.norm.cdf(normal[:, 0]))
    b = -0.5 + 0.6 * other.quantile(stats.norm.cdf(normal[:, 1]))
    first = Prediction(np.array([1.0]), np.array([0.3]), shape=SKEWED)
    second = Prediction(np.array([-0.5]), np.array([0.6]), shape=other)
    expected = np.mean((a >= 1.1) & (b >= -0.7))
    assert probability_pair_above(first, second, rho, 1.1, -0.7)[0] == pytest.approx(expected, abs=0.002)
    independent = probability_pair_above(first, second, 0.0, 1.1, -0.7)[0]
    assert independent == pytest.approx(first.probability_above(1.1)[0] * second.probability_above(-0.7)[0], rel=1e-9)
    gauss_a, gauss_b = Prediction(np.array([1.0]), np.array([0.3])), Prediction(np.array([-0.5]), np.array([0.6]))
    np.testing.assert_allclose(probability_pair_above(gauss_a, gauss_b, rho, 1.1, -0.7),
                               probability_both_above(1.0, 0.3, -0.5, 0.6, rho, 1.1, -0.7), rtol=1e-12)


def test_validation_choice_recovers_a_known_shape_and_noise_scale():
    """Measurements whose noise beyond the tile mean is 1.3 times what the Gaussian prediction
    claims, with a long lower tail: the choice finds the scale and the shape; Gaussian draws get
    a shape near the Gaussian."""
    rng = np.random.default_rng(0)
    n, tile_sd, noise_sd = 60_000, 0.3, 0.5
    mean = rng.normal(size=n)
    true_sd = math.sqrt(tile_sd**2 + noise_sd**2)
    y = mean + true_sd * _draws(SKEWED, n, rng)
    claimed_sd = math.sqrt(tile_sd**2 + (noise_sd / 1.3) ** 2)
    claimed = Prediction(mean, np.full(n, tile_sd), measurement_sd=np.full(n, claimed_sd))
    tails = fit_measurement_tails(y, claimed)
    assert tails.shape.skew == pytest.approx(SKEWED.skew, abs=0.05)
    assert tails.shape.tailweight == pytest.approx(SKEWED.tailweight, abs=0.05)
    assert tails.noise_scale == pytest.approx(1.3, rel=0.03)
    assert tails.validation_nll == pytest.approx(nll(y, tails.apply(claimed).measurement()))
    gaussian = fit_measurement_tails(mean + rng.normal(0.0, true_sd, n), claimed).shape
    assert abs(gaussian.skew) < 0.05 and abs(gaussian.tailweight - 1.0) < 0.05


def test_apply_changes_only_the_measurement_distribution():
    p = Prediction(np.zeros(2), np.full(2, 0.3), measurement_sd=np.full(2, 0.5))
    tails = MeasurementTails(SKEWED, noise_scale=0.5)
    out = tails.apply(p)
    np.testing.assert_array_equal(out.sd, p.sd)
    assert out.shape.is_gaussian  # the tile mean stays Gaussian
    measured = out.measurement()
    np.testing.assert_allclose(measured.sd, math.sqrt(0.09 + 0.25 * 0.16))  # noise var 0.16, scaled by 0.5^2
    assert measured.shape == SKEWED and out.subset(np.array([True, False])).measurement().shape == SKEWED
    no_tests = Prediction(np.zeros(2), np.full(2, 0.3))
    assert tails.apply(no_tests) is no_tests
    fitted = MeasurementTails(SKEWED, noise_scale=1.1, validation_nll=0.62, tests_shift=-0.2, tests_centre=0.4)
    assert MeasurementTails.from_payload(fitted.to_payload()) == fitted


def test_files_of_the_student_t_family_load_and_score_as_a_t():
    older = {"df": 8.0, "noise_scale": 1.1, "validation_nll": 0.6}  # before the shift and the shape
    tails = MeasurementTails.from_payload(older)
    assert tails.shape == Shape(df=8.0) and tails.tests_shift == 0.0
    p = tails.apply(Prediction(np.zeros(1), np.full(1, 0.3), measurement_sd=np.full(1, 0.5))).measurement()
    scipy_t = stats.t(8.0, 0.0, p.sd[0] * math.sqrt(6.0 / 8.0))
    assert nll(np.array([-1.2]), p) == pytest.approx(-scipy_t.logpdf(-1.2), rel=1e-12)
    assert p.upper[0] == pytest.approx(scipy_t.ppf(0.975), rel=1e-10)


def test_the_test_count_shift_recovers_a_known_slope():
    """Measurements whose mean moves by b (1/k - c): the slope is found, and the shifted family
    scores the rows better than the unshifted one."""
    rng = np.random.default_rng(1)
    n, slope = 30_000, -0.3
    tests = rng.integers(1, 30, n).astype(np.float64)
    train_tests = rng.integers(1, 30, 50_000).astype(np.float64)
    centre = float(np.mean(1.0 / train_tests))
    mean = rng.normal(size=n)
    y = mean + slope * (1.0 / tests - centre) + 0.4 * _draws(SKEWED, n, rng)
    claimed = Prediction(mean, np.full(n, 0.2), measurement_sd=np.full(n, 0.4))
    tails = fit_measurement_tails(y, claimed, tests, train_tests=train_tests)
    assert tails.tests_shift == pytest.approx(slope, abs=0.02)
    assert tails.tests_centre == centre and tails.shape.skew == pytest.approx(SKEWED.skew, abs=0.07)
    measured = tails.apply(claimed, tests).measurement()
    np.testing.assert_allclose(measured.mean - mean, tails.tests_shift * (1.0 / tests - centre))
    assert tails.validation_nll < fit_measurement_tails(y, claimed).validation_nll - 0.005
    assert tails.apply(claimed).measurement().mean is claimed.mean  # no test counts: no shift
    np.testing.assert_array_equal(tails.apply(claimed, tests).sd, claimed.sd)  # the tile mean never moves
    subset = tails.apply(claimed, tests).subset(np.arange(5))
    np.testing.assert_allclose(subset.measurement().mean, measured.mean[:5])
    assert MeasurementTails.from_payload(tails.to_payload()) == tails


def test_equal_test_counts_give_no_shift():
    rng = np.random.default_rng(2)
    y = rng.normal(size=500)
    claimed = Prediction(np.zeros(500), np.full(500, 0.5), measurement_sd=np.full(500, 1.0))
    assert fit_measurement_tails(y, claimed, np.full(500, 3.0), train_tests=np.full(50, 2.0)).tests_shift == 0.0


def test_the_prior_holds_a_few_rows_near_it_and_lets_many_rows_speak(monkeypatch):
    """Gaussian rows with a noise 1.5 times the claimed one: 40,000 of them find the Gaussian shape
    and the scale; 40 stay near the prior's shape, where the unheld choice runs to an extreme."""
    from geodbk.fit import tails as tails_module

    rng = np.random.default_rng(5)
    claimed = Prediction(np.zeros(40_000), np.full(40_000, 0.1), measurement_sd=np.full(40_000, 0.4))
    y = rng.normal(0.0, math.sqrt(0.01 + 1.5**2 * 0.15), 40_000)
    many = fit_measurement_tails(y, claimed)
    assert abs(many.shape.skew) < 0.05 and many.noise_scale == pytest.approx(1.5, rel=0.03)
    assert many.shape.tailweight == pytest.approx(1.0, abs=0.05)  # the data, not the prior's 0.8
    few_y, few_claimed = y[:40], claimed.subset(np.arange(40))
    held = fit_measurement_tails(few_y, few_claimed)
    assert abs(held.shape.skew - tails_module.PRIOR_CENTRE[2]) < 0.3
    assert abs(math.log(held.shape.tailweight) - tails_module.PRIOR_CENTRE[3]) < 0.2
    monkeypatch.setattr(tails_module, "PRIOR_SD", (1e9,) * 4)
    unheld = fit_measurement_tails(few_y, few_claimed)
    assert abs(unheld.shape.skew) > 1.0 and unheld.shape.tailweight > 2.0
