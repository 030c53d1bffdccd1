"""GeoModel on the shipped Puerto Rico sample (a small slice of it)."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from geodbk import paths
from geodbk.dataset.protocols import SPACE_TIME
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import InputDataError
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.quarters import Quarter, quarter_years


@pytest.fixture(scope="module")
def small_dataset():
    ds = load_sample_dataset("PR", quarters=["2023Q4"])
    rank_in_split = ds.frame.groupby("split").cumcount()
    keep = np.where(ds.frame["split"] == "train", rank_in_split < 800, rank_in_split < 150)
    frame = ds.frame[keep]
    return dataclasses.replace(ds, frame=frame)


@pytest.fixture(scope="module")
def geomodel(small_dataset):
    """The GP alone (the local residual field on top is tested in test_residuals.py)."""
    return fit_dataset(small_dataset, "dbk-rbf", hidden=16, rank=16,
                       lr=1e-3, epochs=2, batch_size=256, progress=False, local_residuals=False)


def test_fit_dataset_uses_the_train_split_and_records_meta(small_dataset, geomodel):
    assert geomodel.kind == "dbk-rbf"
    assert geomodel.info.target == "download" and geomodel.info.units == "Mbps"
    assert geomodel.info.quarters == geomodel.info.fitted_quarters == (Quarter(2023, 4),)
    assert geomodel.info.n_train == 800
    _, y, _ = small_dataset.arrays("train")
    assert geomodel.regressor.y_mean == pytest.approx(y.mean())


def test_predict_and_kernel_slice_take_degrees(small_dataset, geomodel):
    test = small_dataset.subset("test")
    lonlat = test[["lon", "lat"]].to_numpy()
    # the space-time inputs (u, v, t) of the test rows, built from the dataset without the model
    X = SPACE_TIME.input_space(small_dataset).features(lonlat, quarter_years(test["year"], test["quarter"]))
    assert X.shape == (len(test), 3)
    # predict() defaults to the latest fitted quarter, the test rows' own quarter here
    assert geomodel.latest_quarter == Quarter(2023, 4)
    via_lonlat = geomodel.predict(lonlat)
    direct = geomodel.regressor.predict(X)
    np.testing.assert_allclose(via_lonlat.mean, direct.mean, rtol=1e-6)
    np.testing.assert_allclose(via_lonlat.sd, direct.sd, rtol=1e-6)
    at_quarter = geomodel.predict(lonlat, "2023Q4")
    np.testing.assert_array_equal(at_quarter.mean, via_lonlat.mean)
    # predict_tiles: each row at its own quarter, plus the sd of a new measurement of its own
    # tests, its noise part scaled as chosen with the measurement family on the val rows
    tests = test["tests"].to_numpy(np.float64)
    tiles = geomodel.predict_tiles(test)
    direct_tests = geomodel.regressor.predict(X, tests=tests)
    np.testing.assert_allclose(tiles.mean, direct.mean, rtol=1e-6)
    np.testing.assert_allclose(tiles.sd, direct.sd, rtol=1e-6)
    noise_var = direct_tests.measurement_sd**2 - direct.sd**2
    expected = np.sqrt(direct.sd**2 + geomodel.tails.noise_scale**2 * noise_var)
    np.testing.assert_allclose(tiles.measurement_sd, expected, rtol=1e-6)
    np.testing.assert_array_equal(tiles.measurement().sd, tiles.measurement_sd)
    k = geomodel.kernel_slice(lonlat[:10], lonlat[:3])
    assert k.shape == (10, 3)
    np.testing.assert_allclose(k[:3, :3], k[:3, :3].T, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(k, geomodel.regressor.kernel(X[:10], X[:3]), rtol=1e-6)
    with pytest.raises(InputDataError):
        geomodel.predict(np.zeros((4, 3)))


def test_save_load_round_trip(tmp_path, small_dataset, geomodel):
    path = tmp_path / "models" / "dbk-rbf.pt"
    geomodel.save(path)
    loaded = GeoModel.load(path, device="cpu")
    assert loaded.info == geomodel.info and loaded.inputs == geomodel.inputs
    np.testing.assert_array_equal(loaded.support, geomodel.support)
    lonlat = small_dataset.subset("val")[["lon", "lat"]].to_numpy()
    np.testing.assert_array_equal(loaded.predict(lonlat).mean, geomodel.predict(lonlat).mean)
    np.testing.assert_array_equal(loaded.predict(lonlat).sd, geomodel.predict(lonlat).sd)
    geomodel.regressor.save(tmp_path / "plain.pt")
    with pytest.raises(InputDataError, match="GeoModel"):
        GeoModel.load(tmp_path / "plain.pt")


def test_new_measurements_get_the_validation_chosen_family_and_keep_it_on_disk(tmp_path, small_dataset, geomodel):
    """fit_dataset chooses the measurement family on the val rows (the lowest val NLL over shapes
    that include the Gaussian, so no worse than it), it reaches predict_tiles' measurement distribution
    and not the tile mean's, survives save/load, and a file without it loads as Gaussian."""
    import torch

    from geodbk.fit.metrics import nll
    from geodbk.fit.tails import fit_measurement_tails

    val = small_dataset.subset("val")
    tails = geomodel.tails
    assert tails is not None and tails.validation_nll < np.inf
    scored = geomodel.predict_tiles(val)
    assert scored.shape.is_gaussian and scored.measurement().shape == tails.shape
    gaussian = dataclasses.replace(geomodel, tails=None).predict_tiles(val)
    noise_var = gaussian.measurement_sd**2 - gaussian.sd**2
    np.testing.assert_allclose(scored.measurement().sd, np.sqrt(gaussian.sd**2 + tails.noise_scale**2 * noise_var))
    assert (scored.measurement().sd >= scored.sd).all()  # a measurement is never surer than its tile mean
    assert nll(val["y"].to_numpy(), scored.measurement()) <= nll(val["y"].to_numpy(), gaussian.measurement()) + 1e-9
    tests, train_tests = val["tests"].to_numpy(np.float64), small_dataset.subset("train")["tests"].to_numpy(np.float64)
    assert fit_measurement_tails(val["y"].to_numpy(), gaussian, tests, train_tests=train_tests) == tails
    assert tails.tests_centre == np.mean(1.0 / train_tests)
    np.testing.assert_allclose(scored.measurement().mean - scored.mean,
                               tails.tests_shift * (1.0 / tests - tails.tests_centre))

    path = tmp_path / "m.pt"
    geomodel.save(path)
    assert GeoModel.load(path).tails == tails
    payload = torch.load(path, weights_only=True)
    del payload["tails"]  # a model file written before the family was chosen
    torch.save(payload, path)
    assert GeoModel.load(path).tails is None
    assert GeoModel.load(path).predict_tiles(val).measurement().shape.is_gaussian


def test_cli_fit_outside_the_samples_names_the_fixed_layer_to_download(tmp_path, small_dataset, capsys):
    from geodbk.cli import main

    elsewhere = dataclasses.replace(small_dataset, region=dataclasses.replace(small_dataset.region, code=None))
    data = elsewhere.save(tmp_path / "in.parquet")
    assert main(["fit", "--dataset", str(data), "--out", str(tmp_path / "run"), "--models", "knn", "--no-progress"]) == 0
    assert ("note: no density layer; the README's tables fit every region with its fixed-broadband tiles, which lower "
            "the NLL most at new places: --density-tiles fixed:2023Q4 downloads Ookla's global fixed file of that "
            "quarter once") in capsys.readouterr().out


def test_cli_fit_writes_models_and_merged_metrics(tmp_path, small_dataset, capsys):
    from geodbk.cli import main

    data = small_dataset.save(tmp_path / "in.parquet")
    run = tmp_path / "run"
    common = ["--dataset", str(data), "--out", str(run), "--epochs", "1", "--hidden", "8", "--rank", "8",
              "--device", "cpu", "--no-progress"]
    assert main(["fit", *common, "--models", "dbk-rbf,sv-rbf"]) == 0
    printed = capsys.readouterr().out
    assert "urban" in printed and "sv-rbf" in printed
    assert f"note: no density layer; the README's tables fit PR with its shipped fixed-broadband tiles " \
        f"(--density-tiles {paths.PUERTO_RICO_FIXED})" in printed
    for kind in ("dbk-rbf", "sv-rbf"):
        assert GeoModel.load(run / "models" / f"{kind}.pt").kind == kind
    assert (run / "dataset.parquet").exists() and (run / "metrics.json").exists()
    assert main(["fit", *common, "--models", "dnn"]) == 0
    table = pd.read_csv(run / "metrics.csv")
    assert sorted(set(table["model"])) == ["dbk-rbf", "dnn", "sv-rbf"]
    assert set(table["group"]) == {"overall", "urban", "rural"}
    assert table.loc[table["group"] == "overall", "n"].eq(150).all()
    assert main(["fit", *common, "--models", "no-such"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_corrupt_or_missing_model_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(InputDataError, match="not a geodbk model file"):
        GeoModel.load(bad)
    with pytest.raises(InputDataError, match="no model file"):
        GeoModel.load(tmp_path / "absent.pt")


def test_failed_save_leaves_the_previous_file_intact(tmp_path, geomodel, monkeypatch):
    path = tmp_path / "model.pt"
    geomodel.save(path)
    before = path.read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr("geodbk.fit.regressor.torch.save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        geomodel.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_model_info_reads_older_files_facts_with_its_defaults_and_round_trips() -> None:
    from geodbk.dataset.model_info import ModelInfo
    from geodbk.errors import InputDataError

    # a model file of before the region polygon, service and posterior were stored
    older = ModelInfo.from_dict({"kind": "dbk-rbf", "target": "upload", "units": "Mbps", "region": "Hawaii",
                                 "quarters": ["2023Q3", "2023Q4"], "n_train": "12", "unknown_fact": 1})
    assert (older.service, older.posterior, older.local_residuals) == ("mobile", "trained", False)
    assert older.region_wkb_hex is None and older.fitted_region is None and older.region_geometry is None
    assert older.quarters == (Quarter(2023, 3), Quarter(2023, 4)) and older.n_train == 12
    assert older.last_fitted_quarter == Quarter(2023, 4)
    assert ModelInfo.from_dict(older.to_dict()) == older and older.to_dict()["quarters"] == ["2023Q3", "2023Q4"]
    assert ModelInfo("knn").last_fitted_quarter is None
    with pytest.raises(InputDataError, match="no model kind"):
        ModelInfo.from_dict({"target": "download"})
