"""The map model as the average of its deep part and its kriging part (geodbk.fit.averaging).

The moments are checked against Monte Carlo draws of the 50/50 mixture, the joint factor against
the dense covariance, and a fitted model against its two parts: every product of the model is
the average of theirs, the kriging part's network reads the quarter alone, and a saved model
keeps both parts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import InputDataError
from geodbk.fit.averaging import average_changes, average_predictions, averaged_factor
from geodbk.fit.fitting import _kriging_schedule, fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.models.config import ModelConfig, TrainConfig
from geodbk.models.zoo import get_model_spec
from geodbk.prediction import ChangePrediction, Prediction

pytestmark = pytest.mark.usefixtures("single_thread")


def test_the_average_has_the_mixtures_mean_and_variance():
    rng = np.random.default_rng(0)
    a = Prediction(np.array([1.0, 0.2]), np.array([0.3, 0.1]), np.array([0.5, 0.2]))
    b = Prediction(np.array([1.4, 0.2]), np.array([0.2, 0.4]), np.array([0.3, 0.6]))
    average = average_predictions(a, b)
    n = 400_000
    pick = rng.random((n, 1)) < 0.5
    for sd, measured in ((average.sd, (a.sd, b.sd)), (average.measurement_sd, (a.measurement_sd, b.measurement_sd))):
        draws = np.where(pick, rng.normal(a.mean, measured[0], (n, 2)), rng.normal(b.mean, measured[1], (n, 2)))
        np.testing.assert_allclose(draws.mean(0), average.mean, atol=4e-3)
        np.testing.assert_allclose(draws.std(0), sd, rtol=5e-3)
    assert average_predictions(a, Prediction(b.mean, b.sd)).measurement_sd is None


def test_an_averaged_change_is_the_average_of_each_quantity():
    a = ChangePrediction(*(np.array([v]) for v in (0.1, 0.2, 1.0, 1.1, 0.3, 0.3)))
    b = ChangePrediction(*(np.array([v]) for v in (0.3, 0.1, 1.2, 1.5, 0.2, 0.4)))
    average = average_changes(a, b)
    assert average.mean[0] == pytest.approx(0.2)
    assert average.sd[0] ** 2 == pytest.approx(0.5 * (0.04 + 0.01) + 0.25 * 0.2**2)
    assert average.mean_to[0] == pytest.approx(1.3)
    assert average.sd_from[0] ** 2 == pytest.approx(0.5 * (0.09 + 0.04) + 0.25 * 0.2**2)


def test_the_averaged_factor_gives_the_averaged_covariance():
    rng = np.random.default_rng(1)
    factor_a, factor_b = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    mean_a, mean_b = rng.normal(size=6), rng.normal(size=6)
    joined = averaged_factor(factor_a, factor_b, mean_a, mean_b)
    d = mean_a - mean_b
    expected = 0.5 * (factor_a @ factor_a.T + factor_b @ factor_b.T) + 0.25 * np.outer(d, d)
    np.testing.assert_allclose(joined @ joined.T, expected, atol=1e-12)


@pytest.mark.parametrize("kind", ["dbk-rbf", "sv-rbf"])
def test_a_backbone_on_some_columns_ignores_the_others(kind):
    torch.manual_seed(0)
    model = get_model_spec(kind).build(3, ModelConfig(hidden=8, rank=8, input_columns=(2,)))
    x = torch.randn(5, 3)
    moved = x.clone()
    moved[:, :2] = torch.randn(5, 2) * 10.0
    torch.testing.assert_close(model.basis(x), model.basis(moved))
    changed = x.clone()
    changed[:, 2] += 1.0
    assert not torch.allclose(model.basis(x), model.basis(changed))


def test_input_columns_are_refused_unless_positions():
    with pytest.raises(ValueError, match="input_columns"):
        ModelConfig(input_columns=())
    assert ModelConfig(input_columns=[2]).input_columns == (2,)  # a model file's list


@pytest.fixture(scope="module")
def dataset():
    ds = load_sample_dataset("PR", quarters=["2023Q2", "2023Q4"])
    rng = np.random.default_rng(0)
    return dataclasses.replace(ds, frame=ds.frame[rng.random(len(ds.frame)) < 0.05])


@pytest.fixture(scope="module")
def model(dataset):
    return fit_dataset(dataset, "dbk-rbf", hidden=16, rank=16, dtype="float64", lr=1e-3, epochs=2,
                       batch_size=256, progress=False, device="cpu")


def test_a_space_time_fit_has_a_kriging_part_reading_the_quarter(model, dataset):
    kriging = model.kriging
    assert kriging is not None and kriging.kriging is None and kriging.tails is None
    assert kriging.residuals is not None and kriging.inputs.density is None
    assert kriging.regressor.model_config.input_columns == (kriging.inputs.feature_names.index("t"),)
    places = dataset.frame[["lon", "lat"]].to_numpy(np.float64)[:50]
    level = kriging.regressor.predict(kriging.inputs.features(places, "2023Q4"))
    np.testing.assert_allclose(level.mean, level.mean[0], rtol=0, atol=1e-12)  # one level per quarter
    other = kriging.regressor.predict(kriging.inputs.features(places, "2023Q2"))
    assert abs(other.mean[0] - level.mean[0]) > 0


def test_the_models_products_are_the_average_of_its_parts(model, dataset):
    places = dataset.frame[["lon", "lat"]].to_numpy(np.float64)[:40]
    tests = np.full(len(places), 3.0)
    deep, kriging = model.deep_part, model.kriging
    assert deep.kriging is None and deep.tails is None
    expected = model.tails.apply(average_predictions(deep.predict(places, tests=tests),
                                                     kriging.predict(places, tests=tests)), tests)
    got = model.predict(places, tests=tests)
    np.testing.assert_allclose(got.mean, expected.mean)
    np.testing.assert_allclose(got.sd, expected.sd)
    np.testing.assert_allclose(got.measurement_sd, expected.measurement_sd)
    groups = np.arange(len(places)) % 4
    areas = model.predict_areas(places, groups)
    parts = [part.predict_areas(places, groups) for part in (deep, kriging)]
    np.testing.assert_allclose(areas.sd, average_predictions(*parts).sd)
    change = model.predict_change(places, "2023Q2", "2023Q4")
    np.testing.assert_allclose(change.sd, average_changes(deep.predict_change(places, "2023Q2", "2023Q4"),
                                                          kriging.predict_change(places, "2023Q2", "2023Q4")).sd)
    np.testing.assert_allclose(model.prior_variance(places),
                               0.5 * (deep.prior_variance(places) + kriging.prior_variance(places)))


def test_the_posterior_of_an_averaged_model_keeps_its_marginals(model, dataset):
    places = dataset.frame[["lon", "lat"]].to_numpy(np.float64)[:30]
    posterior = model.posterior(places)
    prediction = model.predict(places)
    np.testing.assert_allclose(posterior.mean[:, 0], prediction.mean)
    np.testing.assert_allclose(posterior.sd()[:, 0], prediction.sd, rtol=1e-9)
    deep, kriging = model.deep_part.posterior(places), model.kriging.posterior(places)
    d = deep.mean[:, 0] - kriging.mean[:, 0]
    long_range = posterior.factor[:, 0] @ posterior.factor[:, 0].T
    expected = 0.5 * (deep.factor[:, 0] @ deep.factor[:, 0].T + kriging.factor[:, 0] @ kriging.factor[:, 0].T)
    np.testing.assert_allclose(long_range, expected + 0.25 * np.outer(d, d), atol=1e-12)


def test_conditioning_updates_both_parts(model, dataset):
    rows = dataset.frame[dataset.frame["split"] == "test"].head(5)
    updated = model.condition(rows)
    for before, after in ((model, updated), (model.kriging, updated.kriging)):
        assert len(after.residuals.residual) == len(before.residuals.residual) + len(rows)


def test_a_saved_model_keeps_its_kriging_part(model, dataset, tmp_path):
    path = tmp_path / "model.pt"
    model.save(path)
    loaded = GeoModel.load(path)
    places = dataset.frame[["lon", "lat"]].to_numpy(np.float64)[:20]
    assert loaded.kriging is not None
    np.testing.assert_allclose(loaded.predict(places).mean, model.predict(places).mean)
    np.testing.assert_allclose(loaded.predict(places).sd, model.predict(places).sd)


def test_the_ablation_fits_the_deep_part_alone(dataset):
    alone = fit_dataset(dataset, "dbk-rbf", hidden=8, rank=8, epochs=1, batch_size=256, progress=False,
                        device="cpu", kriging_average=False)
    assert alone.kriging is None and alone.deep_part is alone


def test_the_kriging_part_trains_a_quarter_of_the_deep_parts_epochs_and_at_least_one():
    assert _kriging_schedule(TrainConfig(epochs=40)).epochs == 10
    assert _kriging_schedule(TrainConfig(epochs=1)).epochs == 1
    assert _kriging_schedule(TrainConfig(epochs=40, coordinate_jitter=0.1)).coordinate_jitter == 0.0


def test_each_part_keeps_its_own_checkpoint(dataset, tmp_path):
    checkpoint = tmp_path / "fit.ckpt"
    own = tmp_path / "fit.ckpt.kriging"
    settings = dict(hidden=8, rank=8, epochs=1, batch_size=256, progress=False, device="cpu")
    fit_dataset(dataset, "dbk-rbf", checkpoint_path=str(checkpoint), **settings)
    assert checkpoint.is_file() and own.is_file()
    schedule = _kriging_schedule(TrainConfig(resume_from=str(checkpoint), checkpoint_path=str(checkpoint)))
    assert (schedule.resume_from, schedule.checkpoint_path) == (str(own), str(own))
    own.unlink()  # the kriging part then starts afresh instead of reading the deep part's file
    assert _kriging_schedule(TrainConfig(resume_from=str(checkpoint))).resume_from is None
    resumed = fit_dataset(dataset, "dbk-rbf", resume_from=str(checkpoint), checkpoint_path=str(checkpoint), **settings)
    assert resumed.kriging is not None and own.is_file()


def test_a_model_file_whose_network_reads_a_missing_column_is_refused(model, tmp_path):
    path = tmp_path / "model.pt"
    model.save(path)
    payload = torch.load(path, weights_only=False)
    payload["kriging"]["regressor"]["model_config"]["input_columns"] = [7]
    torch.save(payload, path)
    with pytest.raises(InputDataError, match="reads input column 7 of 3: it is damaged or tampered"):
        GeoModel.load(path)
