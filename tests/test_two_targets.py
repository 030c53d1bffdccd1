"""Download and upload together: two-target datasets and models, their error correlation, the
model's MapPosterior, conditioning on new rows without a refit, and P(meets) in the export."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy.stats import multivariate_normal

from geodbk.cli import main
from geodbk.dataset.spatial_dataset import SpatialDataset, load_sample_dataset, sample_tiles_path
from geodbk.dataset.targets import parse_targets
from geodbk.errors import InputDataError
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.fit.metrics import metrics_table, nll_per_row
from geodbk.fit.targets import fit_target_correlation
from geodbk.io.vectors import tile_predictions
from geodbk.maps.thresholds import Benchmark
from geodbk.prediction import Prediction, probability_both_above
from geodbk.workflow import evaluate_targets, pair_correlations

pytestmark = pytest.mark.usefixtures("single_thread")

QUARTERS = ["2023Q2", "2023Q3", "2023Q4"]


@pytest.fixture(scope="module")
def dataset() -> SpatialDataset:
    ds = load_sample_dataset("PR", target="download,upload", quarters=QUARTERS)
    rng = np.random.default_rng(0)
    keep = np.where(ds.frame["split"] == "train", rng.random(len(ds.frame)) < 0.08, rng.random(len(ds.frame)) < 0.15)
    return dataclasses.replace(ds, frame=ds.frame[keep])


@pytest.fixture(scope="module")
def model(dataset, fit_device) -> GeoModel:
    return fit_dataset(dataset, "dbk-rbf", hidden=16, rank=16, dtype="float64", lr=1e-3, epochs=3,
                       batch_size=256, progress=False, device=fit_device)


def test_two_target_dataset_keeps_both_speeds(dataset, tmp_path):
    assert dataset.targets == ("download", "upload")
    frame = dataset.frame
    np.testing.assert_allclose(frame["y_upload"], np.log10(frame["value_upload"]))
    upload = dataset.for_target("upload")
    assert upload.target == "upload" and upload.targets == ("upload",)
    np.testing.assert_array_equal(upload.frame["y"].to_numpy(), frame["y_upload"].to_numpy())
    assert "y_upload" not in upload.frame.columns
    np.testing.assert_array_equal(dataset.for_target("download").frame["y"].to_numpy(), frame["y"].to_numpy())
    loaded = SpatialDataset.load(dataset.save(tmp_path / "pair.parquet"))
    assert loaded.targets == ("download", "upload")
    np.testing.assert_array_equal(loaded.frame["y_upload"].to_numpy(), frame["y_upload"].to_numpy())


def test_summary_names_both_targets_and_gives_each_its_table(dataset):
    text = dataset.summary()
    assert text.splitlines()[0].endswith("download and upload (Mbps), y = log10(download), y_upload = log10(upload)")
    for target, column in (("download", "value"), ("upload", "value_upload")):
        table = text.split(f"target {target} (Mbps; y = log10):\n")[1].splitlines()
        train = next(line.split() for line in table if line.startswith("train"))
        assert train[3] == f"{dataset.subset('train')[column].median():.3f}"


@pytest.mark.parametrize("bad", ["download,download", "speed", "download,latency", ""])
def test_bad_target_lists_are_refused(bad):
    with pytest.raises(InputDataError):
        parse_targets(bad)


def test_correlation_recovers_synthetic_truth():
    """Rows whose tile-mean errors correlate at 0.6 and test noise at 0.2 (sds as a fit gives them)."""
    rng = np.random.default_rng(1)
    n = 40_000
    sd_a, sd_b = rng.uniform(0.1, 0.3, n), rng.uniform(0.1, 0.3, n)
    noise_a, noise_b = rng.uniform(0.05, 0.5, n), rng.uniform(0.05, 0.5, n)
    z = rng.multivariate_normal([0, 0], [[1, 0.6], [0.6, 1]], n)
    e = rng.multivariate_normal([0, 0], [[1, 0.2], [0.2, 1]], n)
    y_a, y_b = sd_a * z[:, 0] + noise_a * e[:, 0], sd_b * z[:, 1] + noise_b * e[:, 1]
    first = Prediction(np.zeros(n), sd_a, np.sqrt(sd_a**2 + noise_a**2))
    second = Prediction(np.zeros(n), sd_b, np.sqrt(sd_b**2 + noise_b**2))
    fitted = fit_target_correlation(("download", "upload"), y_a, first, y_b, second)
    assert fitted.tile == pytest.approx(0.6, abs=0.05)
    assert fitted.noise == pytest.approx(0.2, abs=0.03)


def test_two_target_model_round_trips_in_one_file(model, dataset, tmp_path):
    assert model.targets == ("download", "upload")
    assert model.correlation is not None and 0.0 < model.correlation.tile < 0.99
    path = tmp_path / "dbk-rbf.pt"
    model.save(path)
    loaded = GeoModel.load(path)
    assert loaded.targets == model.targets and loaded.correlation == model.correlation
    lonlat = dataset.subset("test")[["lon", "lat"]].to_numpy()[:50]
    for target in model.targets:
        np.testing.assert_allclose(loaded.for_target(target).predict(lonlat).mean,
                                   model.for_target(target).predict(lonlat).mean)
    # the upload model is its own fit, not the download one
    assert not np.allclose(model.for_target("upload").predict(lonlat).mean, model.predict(lonlat).mean)


def test_posterior_marginals_are_the_models(model, dataset):
    lonlat = dataset.subset("test")[["lon", "lat"]].to_numpy()[:40]
    posterior = model.posterior(lonlat)
    for k, target in enumerate(model.targets):
        prediction = model.for_target(target).predict(lonlat)
        np.testing.assert_allclose(posterior.mean[:, k], prediction.mean)
        np.testing.assert_allclose(posterior.sd()[:, k], prediction.sd, rtol=1e-8)
    np.testing.assert_allclose(posterior.correlation(), model.correlation.tile, rtol=1e-8)
    levels = Benchmark.parse("35/3").log10_levels
    sd = posterior.sd()
    rho = model.correlation.tile
    pair = multivariate_normal([0, 0], [[1, rho], [rho, 1]])
    expected = [pair.cdf([(posterior.mean[i, 0] - levels[0]) / sd[i, 0], (posterior.mean[i, 1] - levels[1]) / sd[i, 1]])
                for i in range(5)]
    np.testing.assert_allclose(posterior.probability_meets(levels)[:5], expected, atol=1e-7)


def test_grouped_posterior_sd_is_the_area_sd(model, dataset):
    lonlat = dataset.subset("test")[["lon", "lat"]].to_numpy()[:60]
    groups = np.arange(60) % 4
    posterior = model.posterior(lonlat, groups=groups, n_groups=4)
    for k, target in enumerate(model.targets):
        areas = model.for_target(target).predict_areas(lonlat, groups, 4)
        np.testing.assert_allclose(posterior.sd()[:, k], areas.sd, rtol=1e-8)
        np.testing.assert_allclose(posterior.mean[:, k], areas.mean, rtol=1e-10)


def test_condition_reproduces_the_fits_conditioning(model, dataset):
    """A model whose residual fields (its deep part's and its kriging part's) lack some training
    rows, conditioned on those rows, predicts what the fitted model predicts (the same networks)."""
    train = dataset.subset("train")
    held = train.iloc[::5]

    def thinned(part: GeoModel) -> GeoModel:
        field = part.residuals
        keep = np.ones(len(field.residual), dtype=bool)
        keep[::5] = False  # the field's rows are the training rows in order
        field = dataclasses.replace(field, xy_m=field.xy_m[keep], years=field.years[keep],
                                    residual=field.residual[keep], noise_var=field.noise_var[keep],
                                    test_var=field.test_var[keep])
        kriging = None if part.kriging is None else thinned(part.kriging)
        return dataclasses.replace(part, residuals=field, kriging=kriging)

    first, upload = thinned(model.for_target("download")), thinned(model.for_target("upload"))
    assert first.kriging is not None
    without = dataclasses.replace(first, others={"upload": upload}, correlation=model.correlation)
    lonlat = held[["lon", "lat"]].to_numpy()[:200]
    assert not np.allclose(without.predict(lonlat).mean, model.predict(lonlat).mean)
    conditioned = without.condition(held)
    for target in model.targets:
        expected = model.for_target(target).predict(lonlat)
        got = conditioned.for_target(target).predict(lonlat)
        np.testing.assert_allclose(got.mean, expected.mean, atol=1e-10)
        np.testing.assert_allclose(got.sd, expected.sd, atol=1e-10)
    assert conditioned.info.n_train == without.info.n_train + len(held)


def test_condition_refuses_rows_without_a_target(model, dataset):
    with pytest.raises(InputDataError, match="y_upload"):
        model.condition(dataset.subset("test").drop(columns="y_upload"))


def test_export_gives_p_meets_for_each_test_tile(model, dataset):
    tiles = tile_predictions(model, dataset, benchmark="35/3")
    for column in ("p_meets", "p_meets_download", "p_meets_upload"):
        assert tiles[column].between(0, 1).all()
    assert (tiles["p_meets"] <= np.minimum(tiles["p_meets_download"], tiles["p_meets_upload"]) + 1e-12).all()
    test = dataset.subset("test")
    np.testing.assert_allclose(tiles["observed_upload_mbps"], test["value_upload"])
    # the joint probability is above the product of the marginals for positively correlated errors
    assert (tiles["p_meets"] >= tiles["p_meets_download"] * tiles["p_meets_upload"] - 1e-12).all()
    product = probability_both_above(0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0)
    assert product == pytest.approx(0.25)


def test_a_pairs_metrics_hold_a_row_per_target(model, dataset):
    """What ``geodbk fit`` and the demo print and write to metrics.csv for a download,upload model:
    each target's rows, scored against that target's values, and the pair's error correlation."""
    frame = evaluate_targets(model, dataset)
    assert list(frame["target"].unique()) == ["download", "upload"]
    test = dataset.subset("test")
    upload = model.for_target("upload").predict_tiles(test).measurement()
    overall = frame[frame["target"] == "upload"].loc["overall"]
    assert overall["NLL"] == pytest.approx(nll_per_row(test["y_upload"].to_numpy(), upload).mean())
    assert overall["n"] == len(test)
    one = evaluate_targets(model.for_target("download"), dataset)
    assert list(one["target"].unique()) == ["download"]
    pd.testing.assert_frame_equal(one, frame[frame["target"] == "download"])
    table = metrics_table({"dbk-rbf": frame})
    assert list(table.columns[:3]) == ["model", "target", "group"] and len(table) == len(frame)
    assert pair_correlations({"dbk-rbf": model, "knn": model.for_target("download")}) == [
        f"dbk-rbf: error correlation of download and upload {model.correlation.tile:.2f} (tiles)"]


def test_cli_update_conditions_a_model_file(model, dataset, tmp_path):
    path, updated = tmp_path / "model.pt", tmp_path / "updated.pt"
    model.save(path)
    new_tiles = tmp_path / "new.parquet"
    sample = pd.read_parquet(sample_tiles_path("PR"))
    sample[(sample["year"] == 2023) & (sample["quarter"] == 4)].iloc[:300].to_parquet(new_tiles)
    assert main(["update", "--model", str(path), "--tiles", str(new_tiles), "--out", str(updated)]) == 0
    loaded = GeoModel.load(updated)
    assert loaded.targets == model.targets
    assert loaded.info.n_train > model.info.n_train
    assert len(loaded.for_target("upload").residuals.residual) > len(model.for_target("upload").residuals.residual)


def test_maps_of_a_two_target_model_have_p_meets(model):
    grid = model.grid(0.05, quarters="all", change=("2023Q2", "2023Q4"), progress=False)
    assert {"p_meets", "mean_upload_mbps", "p_meets_change"} <= set(grid.data_vars)
    upload = model.for_target("upload").grid(0.05, quarters="all", progress=False)
    inside = np.isfinite(grid["mean"].values)
    levels = Benchmark.parse("35/3").log10_levels
    expected = probability_both_above(grid["mean"].values[inside], grid["sd"].values[inside],
                                      upload["mean"].values[inside], upload["sd"].values[inside],
                                      model.correlation.tile, *levels)
    np.testing.assert_allclose(grid["p_meets"].values[inside], expected, atol=1e-5)
    last, first = grid["p_meets"].sel(time=grid["time"][-1]).values, grid["p_meets"].sel(time=grid["time"][0]).values
    cells = np.isfinite(last)
    np.testing.assert_allclose(grid["p_meets_change"].values[cells], (last - first)[cells], atol=1e-5)
    assert "p_meets" not in upload.data_vars  # a one-target model maps no pair
