"""DBKRegressor: scikit-learn's estimator checks, and recovery of a known function and noise."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from geodbk import DBKRegressor
from geodbk.prediction import Z95

pytestmark = pytest.mark.usefixtures("single_thread")

#: Small enough for the whole check suite to run in about half a minute on one core, large
#: enough to pass check_regressors_train (R^2 > 0.5 on its 200 x 10 data set).
SMALL = dict(hidden=8, rank=8, epochs=25, lr=5e-2, batch_size=64, random_state=0, device="cpu")

#: The checks that do not apply to the knn baseline, with the reasons the DBKRegressor
#: docstring gives.
KNN_NOT_APPLICABLE = {
    "check_regressors_train": "knn reads columns 0-1 as coordinates and 2 as time; the check's "
    "target depends on all 10 features",
    "check_fit2d_1feature": "knn needs two coordinate columns and says so in its own words",
}


@parametrize_with_checks(
    [DBKRegressor(**SMALL), DBKRegressor("knn", random_state=0, device="cpu")],
    expected_failed_checks=lambda est: KNN_NOT_APPLICABLE if est.kind == "knn" else {},
    xfail_strict=True,
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def surface(X: np.ndarray) -> np.ndarray:
    return np.sin(3.0 * X[:, 0]) + 0.5 * X[:, 1]


def draw(n: int, seed: int, noise_sd: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, 2))
    return X, surface(X) + noise_sd * rng.standard_normal(n)


def test_recovers_a_known_function_and_its_noise():
    X, y = draw(1200, 0, 0.1)
    X_new, y_new = draw(400, 1, 0.1)
    # inputs in the thousands: the scaler in the pipeline brings them to order one
    model = make_pipeline(StandardScaler(), DBKRegressor(**{**SMALL, "hidden": 16, "rank": 16, "epochs": 40}))
    model.fit(1000.0 * X + 5e5, y)
    mean, sd = model.predict(1000.0 * X_new + 5e5, return_std=True)
    assert mean.shape == sd.shape == (400,)
    assert np.sqrt(np.mean((mean - surface(X_new)) ** 2)) < 0.12  # the function, under noise sd 0.1
    assert model.score(1000.0 * X_new + 5e5, y_new) > 0.9
    assert 0.07 < np.median(sd) < 0.2  # the noise sd is learned
    covered = np.mean(np.abs(y_new - mean) <= Z95 * sd)
    assert 0.88 <= covered <= 0.99
    fitted = model[-1]
    assert fitted.n_features_in_ == 2
    assert [row["epoch"] for row in fitted.history_][-1] <= 40
    assert fitted.history_[fitted.best_epoch_ - 1]["val_nll"] == min(row["val_nll"] for row in fitted.history_)
    assert fitted.get_params()["hidden"] == 16 and fitted.hidden == 16  # parameters are stored unchanged


def test_validation_rows_given_or_split_off():
    X, y = draw(300, 2, 0.1)
    X_val, y_val = draw(60, 3, 0.1)
    given = DBKRegressor(**{**SMALL, "epochs": 3}).fit(X, y, X_val=X_val, y_val=y_val)
    assert len(given.history_) == 3
    # the validation NLL in the history is the one of the rows given
    prediction = given.predict_distribution(X_val)
    nll = np.mean(0.5 * np.log(2 * np.pi * prediction.sd**2) + 0.5 * ((y_val - prediction.mean) / prediction.sd) ** 2)
    assert given.history_[given.best_epoch_ - 1]["val_nll"] == pytest.approx(nll, rel=1e-4)
    # an own split trains on 90% of the rows: the regressor's y scaling shows which
    split = DBKRegressor(**{**SMALL, "epochs": 1}).fit(X, y)
    assert split.regressor_.y_mean != pytest.approx(y.mean(), abs=1e-12)
    whole = DBKRegressor(**{**SMALL, "epochs": 1}).fit(X, y, X_val=X_val, y_val=y_val)
    assert whole.regressor_.y_mean == pytest.approx(y.mean())


@pytest.mark.parametrize(
    "params, fit_kwargs, message",
    [
        ({"kind": "no-such-kind"}, {}, "unknown kind"),
        ({"validation_fraction": 1.0}, {}, "validation_fraction"),
        ({}, {"y_val": np.zeros(3)}, "need X_val"),
        ({}, {"X_val": np.zeros((3, 2))}, "needs y_val"),
        ({}, {"X_val": np.zeros((3, 5)), "y_val": np.zeros(3)}, "5 features"),
    ],
)
def test_bad_settings_are_value_errors(params, fit_kwargs, message):
    X, y = draw(50, 4, 0.1)
    with pytest.raises(ValueError, match=message):
        DBKRegressor(**{**SMALL, "epochs": 1, **params}).fit(X, y, **fit_kwargs)


def test_test_counts_give_a_measurement_noise_that_falls_with_tests():
    rng = np.random.default_rng(5)
    X = rng.uniform(-1.0, 1.0, size=(1500, 2))
    tests = rng.integers(1, 30, size=1500).astype(float)
    # tile mean of `tests` measurements: noise variance 0.05^2 + 0.4^2 / tests
    y = surface(X) + np.sqrt(0.05**2 + 0.4**2 / tests) * rng.standard_normal(1500)
    model = DBKRegressor(**{**SMALL, "hidden": 16, "rank": 16, "epochs": 30}).fit(X, y, tests=tests)
    assert model.regressor_.model_config.test_noise
    X_new = rng.uniform(-0.8, 0.8, size=(200, 2))
    _, sd_one = model.predict(X_new, return_std=True, tests=np.ones(200))
    _, sd_many = model.predict(X_new, return_std=True, tests=np.full(200, 25.0))
    _, sd_tile = model.predict(X_new, return_std=True)
    assert np.all(sd_tile <= sd_many + 1e-9) and np.all(sd_many < sd_one)
    assert 0.3 < np.median(sd_one) < 0.55  # sqrt(0.05^2 + 0.4^2) = 0.40 plus function uncertainty


def test_refit_from_clone_is_reproducible():
    X, y = draw(200, 6, 0.1)
    first = DBKRegressor(**{**SMALL, "epochs": 4}).fit(X, y)
    again = clone(first).fit(X, y)
    np.testing.assert_array_equal(first.predict(X), again.predict(X))
    other = clone(first).set_params(random_state=1).fit(X, y)
    assert not np.array_equal(first.predict(X), other.predict(X))
