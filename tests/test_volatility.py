"""The local variance factor V(x) (geodbk.fit.volatility): recovered from rows whose errors are
larger in one part of the region, and 1 where no training tile is near."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodbk.dataset.coords import ProjectedTransform
from geodbk.fit.volatility import LocalVolatility
from geodbk.ingest.quadkey import tile_centres

SAN_JUAN = (-66.06, 18.45)


def _places(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 2) lon/lat in a 0.2-degree box around San Juan."""
    return np.column_stack([SAN_JUAN[0] + rng.uniform(-0.1, 0.1, n), SAN_JUAN[1] + rng.uniform(-0.1, 0.1, n)])


@pytest.fixture(scope="module")
def noisier_east():
    """Training rows (six quarters of 1,500 tiles) and 6,000 validation rows whose errors have
    four times the variance east of San Juan's meridian that they have west of it, relative to
    a model variance that is right on average (1.6 and 0.4 times it)."""
    rng = np.random.default_rng(11)
    tiles = tile_centres(_places(rng, 1500))
    projection = ProjectedTransform.from_lonlat(tiles)
    train = np.repeat(tiles, 6, axis=0)
    scale = lambda lonlat: np.where(lonlat[:, 0] > SAN_JUAN[0], 1.6, 0.4)  # noqa: E731
    z2 = rng.chisquare(1, len(train)) * scale(train)
    val = tile_centres(_places(rng, 6000))
    val_var = rng.uniform(0.02, 0.2, len(val))
    val_error = rng.normal(0.0, np.sqrt(scale(val) * val_var))
    return projection, train, z2, val, val_error, val_var, scale


def test_fit_recovers_where_errors_are_larger(noisier_east):
    projection, train, z2, val, val_error, val_var, scale = noisier_east
    volatility = LocalVolatility.fit(projection, projection.to_metres(train), z2, val, val_error, val_var)
    assert volatility is not None
    rng = np.random.default_rng(5)
    query = _places(rng, 400)
    factor = volatility.factor(query)
    east, west = factor[query[:, 0] > SAN_JUAN[0] + 0.01], factor[query[:, 0] < SAN_JUAN[0] - 0.01]
    assert np.median(east) == pytest.approx(1.6, rel=0.15)
    assert np.median(west) == pytest.approx(0.4, rel=0.15)
    # the validation rows' z-scores under the factor have unit variance in both halves
    z = val_error / np.sqrt(volatility.factor(val) * val_var)
    for half in (val[:, 0] > SAN_JUAN[0], val[:, 0] <= SAN_JUAN[0]):
        assert z[half].std() == pytest.approx(1.0, abs=0.05)


def test_no_factor_when_errors_are_as_the_model_says():
    """Validation errors with exactly the model's variance everywhere and training rows with
    varying z^2: the chosen factor barely moves from 1 (or V = 1 is chosen)."""
    rng = np.random.default_rng(2)
    tiles = tile_centres(_places(rng, 800))
    projection = ProjectedTransform.from_lonlat(tiles)
    train = np.repeat(tiles, 4, axis=0)
    val = tile_centres(_places(rng, 4000))
    val_var = rng.uniform(0.02, 0.2, len(val))
    volatility = LocalVolatility.fit(projection, projection.to_metres(train), rng.chisquare(1, len(train)),
                                     val, rng.normal(0.0, np.sqrt(val_var)), val_var)
    if volatility is not None:
        assert np.abs(np.log(volatility.factor(val))).mean() < 0.1


def test_one_far_from_training_tiles_and_a_mean_of_one_over_them(noisier_east, tmp_path):
    projection, train, z2, *_ = noisier_east
    volatility = LocalVolatility.from_rows(projection, projection.to_metres(train), z2, 8.0, 0.3, 1000.0)
    far = np.array([[SAN_JUAN[0] + 1.0, SAN_JUAN[1]], [SAN_JUAN[0], SAN_JUAN[1] - 1.0]])  # ~100 km away
    np.testing.assert_allclose(volatility.factor(far), 1.0, rtol=1e-12)
    # z^2 is divided by its mean, so the rows' tiles average about 1
    assert volatility.sum_z2.sum() / volatility.rows.sum() == pytest.approx(1.0, rel=1e-12)
    assert len(volatility.xy_m) == len(np.unique(train, axis=0)) and volatility.rows.sum() == len(train)
    # asked again for the same places, or for others in between, it gives the same answers
    near = train[:50]
    first = volatility.factor(near)
    first[:] = -1.0  # the caller's copy: changing it must not change the next answer
    second = volatility.factor(near)
    assert (second > 0).all() and np.ptp(second) > 0
    np.testing.assert_array_equal(volatility.factor(far), np.ones(2))
    np.testing.assert_array_equal(volatility.factor(near.copy()), second)
    torch.save(volatility.to_payload(), tmp_path / "volatility.pt")
    back = LocalVolatility.from_payload(torch.load(tmp_path / "volatility.pt", weights_only=True))
    np.testing.assert_array_equal(back.factor(train[:50]), volatility.factor(train[:50]))
