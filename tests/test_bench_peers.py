"""benchmarks/peers.py: the features of the two variants and the LightGBM peer's noise fit."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import peers  # noqa: E402  # benchmarks/peers.py, not a package

from geodbk.fit.metrics import evaluate  # noqa: E402

S0, S1 = 0.15, 0.5


def _synthetic(n: int = 24_000, seed: int = 0) -> SimpleNamespace:
    """A dataset-like object: tiles in a 40 km box near Puerto Rico over 8 quarters, y a smooth
    f(x, y, t) plus N(0, S0^2 + S1^2 / tests) noise, split 8:1:1 at random."""
    rng = np.random.default_rng(seed)
    lon = rng.uniform(-66.4, -66.0, n)
    lat = rng.uniform(18.1, 18.45, n)
    year = rng.integers(2021, 2023, n)
    quarter = rng.integers(1, 5, n)
    tests = rng.integers(1, 30, n).astype(np.float64)
    t = year + (quarter - 0.5) / 4
    f = 1.2 + 0.3 * np.sin((lon + 66.2) * 12) + 0.2 * np.cos((lat - 18.2) * 9) + 0.1 * (t - 2022)
    y = f + rng.normal(0.0, 1.0, n) * np.sqrt(S0**2 + S1**2 / tests)
    split = rng.choice(np.array(["train", "val", "test"]), n, p=[0.8, 0.1, 0.1])
    frame = pd.DataFrame(
        {"lon": lon, "lat": lat, "year": year, "quarter": quarter, "tests": tests, "y": y, "split": split}
    )
    frame["urban_rural"] = np.where(frame["tests"] > 5, "urban", "rural")
    return SimpleNamespace(frame=frame)


def test_feature_variants() -> None:
    data = _synthetic(2000)
    projection = peers.projection_of(data)
    tests_variant = peers.peer_features(data.frame, projection, "tests")
    map_variant = peers.peer_features(data.frame, projection, "map")
    assert list(map_variant.columns) == list(peers.MAP_COVARIATES)
    assert not any("tests" in column for column in map_variant.columns)
    assert list(tests_variant.columns) == [*peers.MAP_COVARIATES, "log_tests"]
    # kilometres on an equal-area projection centred on the tiles: ~42 x ~37 km around 0
    x, y = map_variant["x_km"], map_variant["y_km"]
    assert 38 < x.max() - x.min() < 46 and 33 < y.max() - y.min() < 41
    assert abs(x.mean()) < 5 and abs(y.mean()) < 5
    assert np.allclose(map_variant["t_years"] % 0.25, 0.125)
    assert np.allclose(np.exp(tests_variant["log_tests"]), data.frame["tests"])


def test_measurement_noise_fit_recovers_known_noise() -> None:
    rng = np.random.default_rng(1)
    tests = rng.integers(1, 50, 40_000).astype(np.float64)
    residual = rng.normal(0.0, 1.0, tests.shape) * np.sqrt(0.01 + S0**2 + S1**2 / tests)
    s0, s1 = peers.fit_measurement_noise(residual, tests, latent_var=0.01)
    assert s0 == pytest.approx(S0, rel=0.1) and s1 == pytest.approx(S1, rel=0.05)


def test_lightgbm_peer_recovers_noise_and_scores() -> None:
    pytest.importorskip("lightgbm")
    data = _synthetic()
    peer = peers.fit_lightgbm(data, "tests")
    assert peer.s0 == pytest.approx(S0, rel=0.15) and peer.s1 == pytest.approx(S1, rel=0.15)
    test = data.frame[data.frame["split"] == "test"]
    prediction = peer.predict_tiles(test)
    tests = test["tests"].to_numpy()
    np.testing.assert_allclose(prediction.sd, peer.s0)  # no latent variance
    np.testing.assert_allclose(prediction.measurement().sd, np.sqrt(peer.s0**2 + peer.s1**2 / tests))
    metrics = evaluate(test["y"].to_numpy(), prediction.measurement(), test["urban_rural"].to_numpy())
    assert 0.93 <= metrics.loc["overall", "coverage95"] <= 0.97

    map_peer = peers.fit_lightgbm(data, "map")
    assert map_peer.booster.num_feature() == len(peers.MAP_COVARIATES)
    assert map_peer.predict_tiles(test.drop(columns="tests")).measurement_sd is None


def test_gpboost_peer_has_latent_variance() -> None:
    """A small fit (about 5 s): the GP's latent variance enters both sds, and the measurement
    distribution is calibrated on held-out rows."""
    pytest.importorskip("gpboost")
    data = _synthetic(2000)
    peer = peers.fit_gpboost(data, "map")
    test = data.frame[data.frame["split"] == "test"]
    prediction = peer.predict_tiles(test)
    assert np.all(prediction.sd > peer.s0)
    tests = test["tests"].to_numpy()
    latent = prediction.sd**2 - peer.s0**2
    np.testing.assert_allclose(prediction.measurement_sd**2, latent + peer.s0**2 + peer.s1**2 / tests)
    assert peer.s1 == pytest.approx(S1, rel=0.3)
    metrics = evaluate(test["y"].to_numpy(), prediction.measurement())
    assert 0.88 <= metrics.loc["overall", "coverage95"] <= 0.995
    assert metrics.loc["overall", "MAE"] < 0.25
