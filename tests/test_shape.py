"""The standardised shapes of a prediction: the sinh-arcsinh normal against Monte Carlo draws of
its definition and the defining integrals, the Student-t against scipy, the Gaussian exactly."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from geodbk.shape import GAUSSIAN, Shape

SKEWED = Shape(skew=-0.45, tailweight=1.08)
HEAVY = Shape(skew=0.3, tailweight=0.7)


@pytest.mark.parametrize("shape", [SKEWED, HEAVY])
def test_sinh_arcsinh_quantiles_match_standardised_draws_of_its_definition(shape):
    """X = sinh((asinh(N) + skew) / tailweight), N standard normal; (X - mean) / sd of 2e6 draws
    has the shape's quantiles, and the density integrates to 1 with mean 0 and variance 1."""
    normal = np.random.default_rng(0).standard_normal(2_000_000)
    raw = np.sinh((np.arcsinh(normal) + shape.skew) / shape.tailweight)
    standard = (raw - raw.mean()) / raw.std()
    levels = np.array([0.01, 0.1, 0.5, 0.9, 0.99])
    np.testing.assert_allclose(shape.quantile(levels), np.quantile(standard, levels), atol=0.01)
    z = np.linspace(-40.0, 40.0, 800_001)
    density = np.exp(shape.log_density(z))
    step = z[1] - z[0]
    assert density.sum() * step == pytest.approx(1.0, abs=1e-6)
    assert (z * density).sum() * step == pytest.approx(0.0, abs=1e-6)
    assert (z**2 * density).sum() * step == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("shape", [SKEWED, HEAVY, Shape(df=5.0)])
def test_cdf_inverts_the_quantile_and_crps_is_the_defining_integral(shape):
    levels = np.array([0.001, 0.2, 0.5, 0.77, 0.999])
    np.testing.assert_allclose(shape.cdf(shape.quantile(levels)), levels, rtol=1e-9)
    np.testing.assert_allclose(stats.norm.cdf(shape.normal_score(shape.quantile(levels))), levels, rtol=1e-9)
    for value in (-2.5, 0.2, 1.7):
        below = integrate.quad(lambda x: shape.cdf(np.array(x)) ** 2, -np.inf, value)[0]
        above = integrate.quad(lambda x: (1.0 - shape.cdf(np.array(x))) ** 2, value, np.inf)[0]
        assert shape.crps(np.array([value]))[0] == pytest.approx(below + above, rel=1e-4)


def test_a_long_lower_tail_puts_the_median_above_the_mean():
    assert SKEWED.quantile(0.5) > 0.1  # the mean stays at 0
    assert -SKEWED.quantile(0.025) > SKEWED.quantile(0.975)


def test_student_t_is_scipys_with_sd_one():
    df = 5.0
    scipy_t = stats.t(df, 0.0, math.sqrt((df - 2.0) / df))
    z = np.array([-6.0, -1.0, 0.0, 0.4, 3.0])
    shape = Shape(df=df)
    np.testing.assert_allclose(shape.log_density(z), scipy_t.logpdf(z), rtol=1e-12)
    np.testing.assert_allclose(shape.cdf(z), scipy_t.cdf(z), rtol=1e-12)
    np.testing.assert_allclose(shape.quantile(np.array([0.025, 0.975])), scipy_t.ppf([0.025, 0.975]), rtol=1e-10)
    assert np.isfinite(shape.normal_score(np.array([-80.0, 80.0]))).all()  # far in the tails, still finite


def test_gaussian_is_exact_and_equal_parameters_reduce_to_it():
    z = np.array([-3.0, 0.0, 1.2])
    np.testing.assert_array_equal(GAUSSIAN.normal_score(z), z)
    np.testing.assert_allclose(GAUSSIAN.log_density(z), stats.norm.logpdf(z), rtol=1e-12)
    assert GAUSSIAN.quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert Shape(skew=0.0, tailweight=1.0) == GAUSSIAN and GAUSSIAN.is_gaussian


@pytest.mark.parametrize("kw", [{"df": 2.0}, {"tailweight": 0.0}, {"df": 5.0, "skew": 0.2}, {"skew": math.nan}])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError):
        Shape(**kw)
