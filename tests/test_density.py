"""Map-time covariates from another tile layer (geodbk.dataset.density): window sums against
brute force, the model inputs they make, and a fitted model that keeps them through a save."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from geodbk import paths
from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.density import CELL_M, TestDensityCovariates, read_density_tiles
from geodbk.dataset.spatial_dataset import SpatialDataset, build_dataset, sample_tiles_path
from geodbk.errors import InputDataError
from geodbk.ingest.names import ookla_url
from geodbk.ingest.regions import load_region
from geodbk.ingest.sources import cache_path
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.ingest.quadkey import lonlat_to_quadkey

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def pr_fixed() -> pd.DataFrame:
    """The shipped Puerto Rico fixed-broadband tiles (four quarters)."""
    columns = ["quadkey", "tests", "avg_d_kbps", "service", "year", "quarter"]
    return pd.read_parquet(paths.PUERTO_RICO_FIXED, columns=columns)


@pytest.fixture(scope="module")
def pr_two_quarters(pr_tiles) -> SpatialDataset:
    return build_dataset(pr_tiles, "PR", quarters="2023Q3,2023Q4", seed=0)


def _brute_force(layer: TestDensityCovariates, xy_m: np.ndarray, half_side_m: float) -> np.ndarray:
    """Tests of the tiles whose centre is within ``half_side_m`` of each point in x and in y."""
    gap = np.abs(xy_m[:, None, :] - layer.xy_m[None, :, :]).max(axis=2)  # (n, m) Chebyshev metres
    return (gap <= half_side_m) @ layer.tests


def test_window_sums_match_brute_force_to_one_cell(pr_fixed):
    rng = np.random.default_rng(0)
    projection = ProjectedTransform.from_lonlat(np.array([[-67.3, 17.9], [-65.2, 18.55]]))
    layer = TestDensityCovariates.from_tiles(pr_fixed, projection)
    assert layer.tests.sum() == pr_fixed["tests"].sum() and len(layer.xy_m) == pr_fixed["quadkey"].nunique()
    # places near tiles and places in the sea
    xy_m = layer.xy_m[rng.choice(len(layer.xy_m), 300)] + rng.normal(0, 2000, (300, 2))
    for r in layer.radii_m:
        got = layer.window_tests(xy_m, r)
        # a tile counts when its 250 m cell does: exact but for tiles within one cell of the edge
        inner, outer = _brute_force(layer, xy_m, r - CELL_M * 1.5), _brute_force(layer, xy_m, r + CELL_M * 1.5)
        assert np.all(inner <= got + 1e-6) and np.all(got <= outer + 1e-6)
        assert np.mean(inner < outer) > 0.3
    columns = layer.columns(xy_m)
    assert columns.shape == (300, 7) and np.all(np.diff(columns[:, :4], axis=1) >= 0)  # wider windows hold more
    far = layer.columns(np.array([[1e7, 1e7]]))  # no tile within 30 km: log(1 + 0) / 5 - 1, the mean speed
    np.testing.assert_allclose(far, [[-1.0] * 4 + [layer.overall_speed - 4.0] * 3])
    mbps = pr_fixed["avg_d_kbps"].to_numpy() / 1000
    assert layer.overall_speed == pytest.approx(np.average(np.log1p(mbps), weights=pr_fixed["tests"]))
    again = TestDensityCovariates.from_dict(layer.to_dict())
    np.testing.assert_array_equal(again.columns(xy_m), columns)
    pickled = pickle.dumps(layer)  # as Dask ships a model: the summed-area table stays behind
    assert "_grid" in layer.__dict__ and len(pickled) < 2 * layer.xy_m.nbytes + 10_000
    np.testing.assert_array_equal(pickle.loads(pickled).columns(xy_m), columns)
    assert again.names == (*(f"fixed_tests_{r}km" for r in (1, 3, 10, 30)),
                           *(f"fixed_speed_{r}km" for r in (1, 3, 10)))


def test_a_known_density_is_read_back_at_a_tile():
    """Two tiles of 7 and 5 tests at 100 and 20 Mbps, 1.5 km apart: the 1 km window around the
    first sees 7 tests at 100 Mbps, the wider ones 12, at a test-weighted mean ln(1 + Mbps)."""
    projection = ProjectedTransform.from_lonlat(np.array([[-66.2, 18.2], [-66.0, 18.4]]))
    a, b = (-66.10, 18.30), (-66.10 + 1500 / 105_700, 18.30)  # 1 degree of longitude: about 105.7 km here
    tiles = pd.DataFrame({"quadkey": lonlat_to_quadkey(np.array([a, b])[:, 0], np.array([a, b])[:, 1]),
                          "tests": [7, 5], "avg_d_kbps": [100_000, 20_000]})
    layer = TestDensityCovariates.from_tiles(tiles, projection)
    at_a = layer.columns(projection.to_metres(np.array([a])))
    speed = (7 * np.log1p(100) + 5 * np.log1p(20)) / 12  # the 1 km windows see tile a alone
    np.testing.assert_allclose(at_a, [[np.log1p(7) / 5 - 1] + [np.log1p(12) / 5 - 1] * 3
                                      + [np.log1p(100) - 4] + [speed - 4] * 2])
    assert TestDensityCovariates.from_tiles(tiles[["quadkey", "tests"]], projection).speed is None


def test_bad_density_layers_are_refused(pr_two_quarters):
    projection = ProjectedTransform.from_lonlat(np.array([[-66.2, 18.2], [-66.0, 18.4]]))
    with pytest.raises(InputDataError, match="lack columns"):
        TestDensityCovariates.from_tiles(pd.DataFrame({"quadkey": ["0"]}), projection)
    with pytest.raises(InputDataError, match="tests >= 0"):
        TestDensityCovariates.from_tiles(pd.DataFrame({"quadkey": ["032300213"], "tests": [-1]}), projection)
    with pytest.raises(InputDataError, match="paper protocol"):
        fit_dataset(pr_two_quarters, "knn", protocol="paper", density_tiles=pd.DataFrame(
            {"quadkey": ["032300213"], "tests": [3]}))


def test_a_fit_with_a_density_layer_keeps_it_through_a_save(pr_two_quarters, tmp_path):
    fixed = read_density_tiles(sample_tiles_path("PR", "fixed"), pr_two_quarters.region)
    assert set(fixed["service"]) == {"fixed"} and len(fixed) > 30_000
    model = fit_dataset(pr_two_quarters, "dbk-rbf", density_tiles=fixed, epochs=2, progress=False,
                        local_residuals=False, measurement_tails=False)
    assert model.inputs.feature_names == (
        "x", "y", "t", *(f"fixed_tests_{r}km" for r in (1, 3, 10, 30)), *(f"fixed_speed_{r}km" for r in (1, 3, 10)))
    assert model.regressor.input_dim == 10
    rows = pr_two_quarters.subset("test")
    lonlat = rows[["lon", "lat"]].to_numpy(np.float64)
    X = model.inputs.features(lonlat, "2023Q4")
    expected = model.inputs.density.columns(model.inputs.coords.to_metres(lonlat))
    np.testing.assert_array_equal(X[:, 3:], expected)
    assert X[:, 3:].std(axis=0).min() > 0.1  # the covariates vary over the island
    model.save(tmp_path / "m.pt")
    loaded = GeoModel.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.inputs.features(lonlat, "2023Q4"), X)
    np.testing.assert_allclose(loaded.predict_tiles(rows).mean, model.predict_tiles(rows).mean, rtol=0, atol=1e-12)


def test_a_service_and_quarter_read_ookla_global_file_through_the_cache(tmp_path, monkeypatch):
    """``--density-tiles fixed:2023Q3`` is Ookla's global fixed file of 2023Q3, fetched once into the
    cache: with that file cached (here, the shipped sample's 2023Q3 rows under its URL's name), the
    layer is the file's tiles in the region."""
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    sample = pd.read_parquet(paths.PUERTO_RICO_FIXED)
    quarter = sample[(sample["year"] == 2023) & (sample["quarter"] == 3)]
    cached = cache_path(ookla_url("fixed", 2023, 3))
    cached.parent.mkdir(parents=True)
    quarter.to_parquet(cached)
    region = load_region("Ponce, PR")
    layer = read_density_tiles("fixed:2023Q3", region)
    local = read_density_tiles(paths.PUERTO_RICO_FIXED, region)
    expected = local[(local["year"] == 2023) & (local["quarter"] == 3)]
    assert len(layer) == len(expected) > 100
    assert sorted(layer["quadkey"]) == sorted(expected["quadkey"])
    with pytest.raises(InputDataError, match="service must be one of"):
        read_density_tiles("fixd:2023Q3", region)
