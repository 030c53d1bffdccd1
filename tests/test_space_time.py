"""The space-time map protocol end to end: per-row noise, test-count noise recovery, the
positional encoding, data-scaled coordinates (Anchorage), extrapolation warnings,
``max_distance``, split protocols and the CLI.

Fits are tiny and single-threaded; the whole module runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.optimize import minimize
from torch.distributions import MultivariateNormal

from geodbk import paths
from geodbk.cli import main
from geodbk.dataset.protocols import SPACE_TIME
from geodbk.dataset.spatial_dataset import SpatialDataset, build_dataset
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.models import ModelConfig
from geodbk.models.objectives import exact_posterior, woodbury_log_marginal
from geodbk.ingest.quadkey import lonlat_to_quadkey, quadkey_centres
from geodbk.ingest.regions import load_region
from geodbk.fit.train import fit_arrays
from geodbk.models.config import TrainConfig
from geodbk.quarters import Quarter

SAN_JUAN = (-66.06, 18.42)
HONOLULU = (-157.86, 21.31)
ANCHORAGE = (-149.85, 61.18)


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def pr_two_quarters(pr_tiles) -> SpatialDataset:
    """Puerto Rico 2023Q3 + 2023Q4 (12,944 rows), random split, seed 0."""
    return build_dataset(pr_tiles, "PR", quarters="2023Q3,2023Q4", seed=0)


@pytest.fixture(scope="module")
def pr_knn(pr_two_quarters) -> GeoModel:
    """The knn baseline on the space-time protocol (closed form: instant)."""
    return fit_dataset(pr_two_quarters, "knn")


# --- 1. Woodbury identities with a per-row noise vector ------------------------------------------
def _dense_terms(phi, y, d):
    n = len(y)
    cov = phi @ phi.T + torch.diag(d)
    log_p = MultivariateNormal(torch.zeros(n, dtype=phi.dtype), cov).log_prob(y)
    precision = torch.eye(phi.shape[1], dtype=phi.dtype) + phi.T @ (phi / d[:, None])
    post_cov = torch.linalg.inv(precision)
    post_mean = post_cov @ (phi.T @ (y / d))
    return log_p, post_mean, post_cov


def test_woodbury_and_exact_posterior_with_a_diagonal_noise_vector():
    g = torch.Generator().manual_seed(11)
    n, r = 50, 6
    phi = torch.randn(n, r, generator=g, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    d = 0.05 + torch.rand(n, generator=g, dtype=torch.float64) ** 2 * 2.0  # spread 0.05 .. 2.05
    log_p, post_mean, post_cov = _dense_terms(phi, y, d)

    assert float(woodbury_log_marginal(phi, y, d)) == pytest.approx(float(log_p), abs=1e-6)
    mean, factor = exact_posterior(phi, y, d)
    torch.testing.assert_close(mean, post_mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(factor @ factor.T, post_cov, rtol=0, atol=1e-8)
    assert torch.equal(factor, torch.tril(factor))

    # the per-row noise matters: the mean noise as a scalar gives a different answer
    scalar = d.mean()
    assert abs(float(woodbury_log_marginal(phi, y, scalar)) - float(log_p)) > 1.0

    # a 0-d noise is still the homoscedastic formula sigma^2 I
    s2 = torch.tensor(0.3, dtype=torch.float64)
    eye = torch.eye(n, dtype=torch.float64)
    dense = MultivariateNormal(torch.zeros(n, dtype=torch.float64), phi @ phi.T + s2 * eye)
    assert float(woodbury_log_marginal(phi, y, s2)) == pytest.approx(float(dense.log_prob(y)), abs=1e-6)
    homo_cov = torch.linalg.inv(torch.eye(r, dtype=torch.float64) + phi.T @ phi / s2)
    mean_h, factor_h = exact_posterior(phi, y, s2)
    torch.testing.assert_close(mean_h, homo_cov @ phi.T @ y / s2, rtol=0, atol=1e-8)
    torch.testing.assert_close(factor_h @ factor_h.T, homo_cov, rtol=0, atol=1e-8)


# --- 2. sigma0^2 + sigma1^2 / tests is identified from the test counts -----------------------------
S0, S1 = 0.02, 0.2  # true tile noise and single-test variance (target units^2)


def _space_time_rows(n, rng):
    """(u, v, t) on [-1, 1]^3, f smooth in space plus a linear trend in t, and per-row test
    counts like real tiles: geometric (median 3, mostly 1-5) with a quarter of the rows
    busy tiles of 10-50 tests."""
    X = rng.uniform(-1, 1, (n, 3))
    f = np.sin(2 * X[:, 0]) * np.cos(1.5 * X[:, 1]) + 0.4 * X[:, 2]
    k = rng.geometric(0.35, n).astype(np.float64)
    busy = rng.random(n) < 0.25
    k[busy] = rng.integers(10, 51, busy.sum())
    y = f + rng.standard_normal(n) * np.sqrt(S0 + S1 / k)
    return X, y, k, f


def _oracle_noise(residual, k):
    """Maximum-likelihood (sigma0^2, sigma1^2) of residuals y - f with f known."""

    def nll(log_s):
        var = np.exp(log_s[0]) + np.exp(log_s[1]) / k
        return 0.5 * np.sum(np.log(var) + residual**2 / var)

    return np.exp(minimize(nll, np.log([0.05, 0.1])).x)


def test_test_count_noise_is_recovered_by_the_exact_marginal_likelihood():
    rng = np.random.default_rng(0)
    X, y, k, f = _space_time_rows(4000, rng)
    assert np.median(k) == 3 and k.max() == 50
    # Epoch selection on the training rows themselves: the noise parameters converge slowly
    # and a held-out NLL, flat to within its noise once f is fitted, would return an early epoch.
    reg = fit_arrays(
        "exact-dbk", X, y, X, y, tests=k, tests_val=k,
        model_config=ModelConfig(test_noise=True, hidden=16, rank=64, dtype="float64", noise_init=0.3),
        train_config=TrainConfig(epochs=80, lr=5e-2, patience=None, progress=False, seed=0),
    )
    with torch.no_grad():
        s0 = float(reg.model.noise()) * reg.y_std**2
        s1 = float(reg.model.noise.per_test_variance()) * reg.y_std**2
    assert s1 / s0 == pytest.approx(S1 / S0, rel=0.2)
    assert s0 == pytest.approx(S0, rel=0.25)
    assert s1 == pytest.approx(S1, rel=0.15)
    # and close to what the same data identify when f is known (removes the sampling error)
    o0, o1 = _oracle_noise(y - f, k)
    assert s1 / s0 == pytest.approx(o1 / o0, rel=0.15)
    assert np.sqrt(np.mean((reg.predict(X).mean - f) ** 2)) < 0.06

    # measurement_sd adds sigma1^2 / tests to the tile-mean sd, in target units
    Xq = np.repeat(X[:5], 4, axis=0)
    tests = np.tile([1.0, 3.0, 10.0, 50.0], 5)
    p = reg.predict(Xq, tests=tests)
    np.testing.assert_allclose(p.measurement_sd, np.sqrt(p.sd**2 + s1 / tests), rtol=1e-12, atol=0)
    np.testing.assert_array_equal(p.sd, reg.predict(Xq).sd)  # the tile-mean sd ignores tests
    assert (np.diff(p.measurement_sd.reshape(5, 4), axis=1) < 0).all()
    assert reg.predict(Xq).measurement_sd is None


# --- 3. the positional encoding lets the network represent high frequencies ----------------------------
def _checkerboard(n, rng):
    X = rng.uniform(-1, 1, (n, 2))
    f = np.sin(2 * np.pi * 4 * X[:, 0]) * np.cos(2 * np.pi * 3 * X[:, 1])
    return X, f + 0.05 * rng.standard_normal(n), f


@pytest.mark.parametrize("scales, passes", [(8, True), (0, False)])
def test_positional_encoding_fits_a_high_frequency_surface(scales, passes):
    rng = np.random.default_rng(0)
    X, y, _ = _checkerboard(2000, rng)
    Xv, yv, _ = _checkerboard(500, rng)
    Xt, _, ft = _checkerboard(2000, rng)
    # noise_init 0.5: from the default 1e-2 dbk-rbf sits for tens of epochs on the plateau
    # where the whole signal is predictive variance around a constant mean
    cfg = ModelConfig(hidden=32, rank=64, noise_init=0.5, encoding_scales=scales,
                      encoding_min_wavelength=0.05, encoding_max_wavelength=4.0)
    reg = fit_arrays("dbk-rbf", X, y, Xv, yv, model_config=cfg,
                     train_config=TrainConfig(epochs=40, batch_size=128, lr=1e-2, patience=None, progress=False))
    r2 = 1.0 - np.mean((reg.predict(Xt).mean - ft) ** 2) / np.var(ft)
    if passes:
        assert r2 > 0.9
    else:
        assert r2 < 0.5


# --- 4. a city in a big state fills the model's square ----------------------------------------------
def test_anchorage_fills_the_unit_square_where_the_alaska_box_is_a_sliver():
    rng = np.random.default_rng(0)
    lon0, lat0 = ANCHORAGE
    radius, angle = 0.15 * np.sqrt(rng.random(500)), rng.uniform(0, 2 * np.pi, 500)
    quadkeys = pd.unique(lonlat_to_quadkey(lon0 + radius * np.cos(angle), lat0 + 0.5 * radius * np.sin(angle)))[:300]
    assert len(quadkeys) == 300
    centres = quadkey_centres(quadkeys)
    fast = np.exp(-((centres[:, 0] - lon0) ** 2) / 0.005)  # fast along a north-south corridor
    frames = [
        pd.DataFrame({
            "quadkey": quadkeys, "year": 2023, "quarter": q, "service": "mobile",
            "avg_d_kbps": 1000.0 * (5.0 + 95.0 * fast) * (1.0 + 0.1 * (q - 3)),
            "avg_u_kbps": 2000.0, "avg_lat_ms": 30.0,
            "tests": rng.integers(1, 30, len(quadkeys)), "devices": rng.integers(1, 10, len(quadkeys)),
        })
        for q in (3, 4)
    ]
    ds = build_dataset(pd.concat(frames, ignore_index=True), "AK")
    assert ds.region.name == "Alaska" and len(ds) >= 500 and ds.quarters == [Quarter(2023, 3), Quarter(2023, 4)]

    inputs = SPACE_TIME.input_space(ds)
    uv = inputs.features(ds.frame[["lon", "lat"]].to_numpy(np.float64))[:, :2]
    longer = int(np.argmax(np.ptp(uv, axis=0)))
    assert uv[:, longer].min() <= -0.9 and uv[:, longer].max() >= 0.9
    assert np.ptp(uv[:, 1 - longer]) > 1.0  # a round city stays round: no sliver either way
    # the paper protocol's region box (Alaska crosses the antimeridian) squeezes the city
    assert np.ptp(ds.frame["x1"]) < 0.01

    model = fit_dataset(ds, "knn")
    test = ds.subset("test")
    pred = model.predict_tiles(test).mean
    assert np.ptp(pred) > 0.5
    assert np.corrcoef(pred, test["y"])[0, 1] > 0.9


# --- 5. extrapolation warnings and the stored input space ---------------------------------------------
def test_extrapolation_warnings(pr_two_quarters, pr_knn):
    assert pr_knn.latest_quarter == Quarter(2023, 4)
    with pytest.warns(ExtrapolationWarning, match="outside the fitted extent"):
        pr_knn.predict(np.array([HONOLULU]), "2023Q4")
    with pytest.warns(ExtrapolationWarning, match="2024Q1 is one quarter after the last fitted quarter 2023Q4"):
        pr_knn.predict(np.array([SAN_JUAN]), "2024Q1")
    with pytest.warns(ExtrapolationWarning, match="2025Q4 is 8 quarters after") as caught:
        pr_knn.predict(np.array([SAN_JUAN]), "2025Q4")
    assert "one quarter" not in str(caught[0].message)
    with pytest.warns(ExtrapolationWarning, match="before the first fitted quarter"):
        pr_knn.predict(np.array([SAN_JUAN]), "2022Q4")

    lonlat = pr_two_quarters.subset("test")[["lon", "lat"]].to_numpy(np.float64)[:50]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for quarter in ("2023Q3", "2023Q4", None):
            pr_knn.predict(lonlat, quarter)


def test_save_load_keeps_the_input_space(pr_two_quarters, pr_knn, tmp_path):
    path = tmp_path / "knn.pt"
    pr_knn.save(path)
    loaded = GeoModel.load(path)
    assert loaded.inputs == pr_knn.inputs and loaded.latest_quarter == Quarter(2023, 4)
    rows = pr_two_quarters.subset("val")
    lonlat = rows[["lon", "lat"]].to_numpy(np.float64)
    for when in ("2023Q3", 2023.8):
        np.testing.assert_array_equal(loaded.inputs.features(lonlat, when), pr_knn.inputs.features(lonlat, when))
    np.testing.assert_array_equal(loaded.predict_tiles(rows).mean, pr_knn.predict_tiles(rows).mean)
    np.testing.assert_array_equal(loaded.support, pr_knn.support)


# --- 6. max_distance ------------------------------------------------------------------------------
def test_max_distance_blanks_exactly_the_far_cells(pr_knn):
    grid = RegularGrid.over(load_region("PR"), 0.02)
    with warnings.catch_warnings():  # every cell is in the fitted region's polygon: no warning
        warnings.simplefilter("error")
        full = predict_grid(pr_knn, grid, progress=False)
        near = predict_grid(pr_knn, grid, max_distance=2000.0, progress=False)

    inside = grid.inside_mask()
    xx, yy = np.meshgrid(grid.x, grid.y)
    distance = np.full(grid.shape, np.nan)
    distance[inside] = pr_knn.distance_to_data(np.column_stack([xx[inside], yy[inside]]))
    far = inside & (distance > 2000.0)
    kept = inside & ~far
    assert far.sum() > 20 and kept.sum() > 100  # a real mix of both

    for name in ("mean", "sd"):
        a, b = full[name].values, near[name].values
        assert np.isfinite(a[inside]).all()
        assert np.isnan(b[far]).all() and np.isnan(b[~inside]).all()
        np.testing.assert_array_equal(b[kept], a[kept])


# --- 7. split protocols through the dataset -----------------------------------------------------------
def test_split_protocols_through_the_dataset(pr_two_quarters, tmp_path):
    blocks = pr_two_quarters.with_split("spatial-block")
    assert blocks.split_protocol == "spatial-block" and pr_two_quarters.split_protocol == "random"
    by_split = {s: set(blocks.subset(s)["quadkey"]) for s in ("train", "val", "test")}
    assert all(by_split.values())
    assert not by_split["train"] & by_split["test"]
    assert not by_split["train"] & by_split["val"] and not by_split["val"] & by_split["test"]
    # the random split of the same rows does put tiles' two quarters on both sides
    random_train = set(pr_two_quarters.subset("train")["quadkey"])
    assert random_train & set(pr_two_quarters.subset("test")["quadkey"])

    forecast = pr_two_quarters.with_split("forecast")
    f = forecast.frame
    last = (f["year"] == 2023) & (f["quarter"] == 4)
    np.testing.assert_array_equal(f["split"] == "test", last)
    assert (f.loc[~last, "split"] == "val").mean() == pytest.approx(1 / 9, abs=0.01)
    assert SPACE_TIME.input_space(forecast).time.last == Quarter(2023, 3).years  # time range from train rows

    path = blocks.save(tmp_path / "blocks.parquet")
    again = SpatialDataset.load(path)
    assert again.split_protocol == "spatial-block" and again.block_m == blocks.block_m
    np.testing.assert_array_equal(again.frame["split"].to_numpy(), blocks.frame["split"].to_numpy())


# --- 8. CLI -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_pr_file(pr_two_quarters, tmp_path_factory):
    """Every rural row and a fifth of the urban ones of the two-quarter dataset, saved."""
    f = pr_two_quarters.frame
    keep = (f["urban_rural"] == "rural").to_numpy() | (np.random.default_rng(0).random(len(f)) < 0.2)
    small = dataclasses.replace(pr_two_quarters, frame=f[keep].reset_index(drop=True))
    return small.save(tmp_path_factory.mktemp("cli") / "dataset.parquet")


def test_cli_fit_then_predict_warns_and_rejects_bad_quarters(small_pr_file, tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["fit", "--dataset", str(small_pr_file), "--models", "knn,dbk-rbf", "--epochs", "1",
               "--hidden", "16", "--rank", "16", "--split", "spatial-block", "--out", str(run), "--no-progress",
               "--density-tiles", str(paths.PUERTO_RICO_FIXED)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "spatial-block split" in out and "no density layer" not in out
    assert SpatialDataset.load(run / "dataset.parquet").split_protocol == "spatial-block"
    table = pd.read_csv(run / "metrics.csv")
    assert set(table["model"]) == {"dbk-rbf", "knn"}
    for kind in ("dbk-rbf", "knn"):
        assert set(table.loc[table["model"] == kind, "group"]) == {"overall", "urban", "rural"}
    records = json.loads((run / "metrics.json").read_text())
    assert {r["model"] for r in records} == {"dbk-rbf", "knn"} and len(records) == len(table)
    assert {"urban", "rural"} <= {r["group"] for r in records}
    fitted = GeoModel.load(run / "models" / "dbk-rbf.pt")
    assert fitted.info.split == "spatial-block" and fitted.inputs.density is not None
    assert fitted.inputs.feature_names[3:] == fitted.inputs.density.names and fitted.regressor.input_dim == 10

    model = str(run / "models" / "knn.pt")
    rc = main(["predict", "--model", model, "--quarter", "2030Q1", "--resolution", "0.05",
               "--out", str(tmp_path / "future.nc"), "--no-progress", "--allow-extrapolation"])
    err = capsys.readouterr().err
    assert rc == 0 and (tmp_path / "future.nc").exists()
    warned = [line for line in err.splitlines() if "warning:" in line]
    assert len(warned) == 1
    assert warned[0].startswith("geodbk predict: warning:") and "2030Q1" in warned[0] and "extrapolation" in warned[0]

    rc = main(["predict", "--model", model, "--quarter", "2023Q7", "--resolution", "0.05",
               "--out", str(tmp_path / "bad.nc"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "bad.nc").exists()
    assert err.strip().count("\n") == 0
    assert err.startswith("geodbk predict: error:") and "2023Q7" in err
