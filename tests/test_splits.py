"""Split protocols: random (as before), spatial blocks and forecast by quarter."""

import numpy as np
import pytest

from geodbk.errors import InputDataError
from geodbk.dataset.splits import (
    DEFAULT_BLOCK_M,
    SPLIT_PROTOCOLS,
    assign_split,
    forecast_split,
    random_split,
    spatial_block_split,
)


def _clustered_points(n: int, seed: int) -> np.ndarray:
    """``(n, 2)`` metres in a 200 x 200 km square: a mixture of 6 Gaussians plus 10% uniform."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(20_000, 180_000, size=(6, 2))
    sigmas = rng.uniform(5_000, 25_000, size=6)
    n_uniform = n // 10
    which = rng.choice(6, size=n - n_uniform, p=np.full(6, 1 / 6))
    clustered = centres[which] + rng.normal(size=(n - n_uniform, 2)) * sigmas[which, None]
    uniform = rng.uniform(0, 200_000, size=(n_uniform, 2))
    return np.clip(np.vstack([clustered, uniform]), 0, 199_999)


def _block_keys(xy_m: np.ndarray, block_m: float) -> np.ndarray:
    """``(n,)`` one integer per square block, computed independently of geodbk."""
    cells = np.floor(xy_m / block_m).astype(np.int64)
    return cells[:, 0] * 1_000_003 + cells[:, 1]


@pytest.fixture(scope="module")
def cluster() -> np.ndarray:
    return _clustered_points(50_000, seed=7)


def _quarter_periods(n: int, seed: int) -> np.ndarray:
    """``(n,)`` quarter index year * 4 + quarter - 1 for 2019 Q1 .. 2022 Q4, in random row order."""
    rng = np.random.default_rng(seed)
    year = rng.integers(2019, 2023, size=n)
    quarter = rng.integers(1, 5, size=n)
    return year * 4 + quarter - 1


#: random_split(20, 0) as the first geodbk datasets were split: existing files keep their rows.
PINNED_20_0 = ["train", "test", "train", "train", "train", "train", "train", "train", "train", "val",
               "train", "train", "train", "train", "val", "test", "train", "train", "train", "train"]


def test_random_split_keeps_the_split_of_existing_datasets():
    assert list(random_split(20, 0)) == PINNED_20_0


@pytest.mark.parametrize(("n", "seed"), [(0, 0), (1, 3), (7, 0), (10, 1), (1000, 0), (12_345, 42)])
def test_random_split_is_8_1_1(n, seed):
    labels = random_split(n, seed)
    assert labels.dtype == object and labels.shape == (n,)
    np.testing.assert_array_equal(labels, random_split(n, seed))
    n_train, n_val = int(np.floor(0.8 * n)), int(np.floor(0.1 * n))
    assert [int(np.sum(labels == s)) for s in ("train", "val", "test")] == [n_train, n_val, n - n_train - n_val]


def test_random_split_counts_for_1000_rows_are_800_100_100():
    labels = random_split(1000, 5)
    assert [int(np.sum(labels == s)) for s in ("train", "val", "test")] == [800, 100, 100]


def test_spatial_blocks_never_straddle_two_splits(cluster):
    labels = spatial_block_split(cluster, seed=0)
    keys = _block_keys(cluster, DEFAULT_BLOCK_M)
    labels_per_block = {}
    for key, label in zip(keys.tolist(), labels.tolist()):
        labels_per_block.setdefault(key, set()).add(label)
    assert all(len(v) == 1 for v in labels_per_block.values())
    train_blocks = set(keys[labels == "train"].tolist())
    assert not train_blocks & set(keys[labels == "test"].tolist())
    assert not train_blocks & set(keys[labels == "val"].tolist())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_spatial_block_row_shares_are_close_to_8_1_1(cluster, seed):
    labels = spatial_block_split(cluster, seed=seed)
    shares = [float(np.mean(labels == s)) for s in ("train", "val", "test")]
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.03)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_spatial_block_cuts_follow_rows_and_overshoot_by_less_than_one_block(cluster, seed):
    labels = spatial_block_split(cluster, seed=seed)
    _, counts = np.unique(_block_keys(cluster, DEFAULT_BLOCK_M), return_counts=True)
    largest = counts.max() / len(cluster)
    train = float(np.mean(labels == "train"))
    train_val = train + float(np.mean(labels == "val"))
    assert 0.8 <= train < 0.8 + largest
    assert 0.9 <= train_val < 0.9 + largest


def test_spatial_block_split_is_deterministic_per_seed(cluster):
    first = spatial_block_split(cluster, seed=11)
    np.testing.assert_array_equal(first, spatial_block_split(cluster, seed=11))
    assert np.any(first != spatial_block_split(cluster, seed=12))


def test_spatial_block_split_does_not_depend_on_row_order(cluster):
    perm = np.random.default_rng(0).permutation(len(cluster))
    np.testing.assert_array_equal(spatial_block_split(cluster, seed=4)[perm], spatial_block_split(cluster[perm], seed=4))


def test_block_size_sets_the_blocks(cluster):
    labels = spatial_block_split(cluster, seed=0, block_m=25_000.0)
    keys = _block_keys(cluster, 25_000.0)
    for key in np.unique(keys):
        assert len(set(labels[keys == key].tolist())) == 1


@pytest.mark.parametrize("seed", range(8))
def test_each_split_gets_a_block_even_when_one_block_dominates(seed):
    # 95 rows in one block and 1 row in each of two others: the row rule alone would leave val or test empty.
    xy = np.vstack([np.full((95, 2), 5_000.0), [[15_000.0, 5_000.0]], [[25_000.0, 5_000.0]]])
    labels = spatial_block_split(xy, seed=seed)
    assert sorted(set(labels.tolist())) == ["test", "train", "val"]
    assert len(set(labels[:95].tolist())) == 1


def test_fewer_than_three_blocks_is_an_input_error():
    xy = np.array([[1_000.0, 1_000.0], [2_000.0, 3_000.0], [12_000.0, 1_000.0]])
    with pytest.raises(InputDataError, match="only 2 blocks of 10 km"):
        spatial_block_split(xy, seed=0)
    assert set(spatial_block_split(xy, seed=0, block_m=1_000.0).tolist()) == {"train", "val", "test"}


@pytest.mark.parametrize(
    ("xy", "block_m"),
    [(np.zeros((5, 3)), 10_000.0), (np.array([[0.0, np.nan]] * 3), 10_000.0), (np.eye(3, 2), 0.0)],
)
def test_bad_coordinates_or_block_size_are_input_errors(xy, block_m):
    with pytest.raises(InputDataError):
        spatial_block_split(xy, seed=0, block_m=block_m)


def test_forecast_tests_on_exactly_the_latest_quarter():
    period = _quarter_periods(9_000, seed=1)
    labels = forecast_split(period, seed=0)
    latest = period == 2022 * 4 + 3
    np.testing.assert_array_equal(labels == "test", latest)
    assert not np.any(np.isin(labels[latest], ["train", "val"]))
    earlier = labels[~latest]
    assert set(earlier.tolist()) == {"train", "val"}
    assert abs(float(np.mean(earlier == "val")) - 1 / 9) < 0.002


def test_forecast_split_is_deterministic_per_seed_and_accepts_integral_floats():
    period = _quarter_periods(2_000, seed=2)
    first = forecast_split(period, seed=3)
    np.testing.assert_array_equal(first, forecast_split(period, seed=3))
    np.testing.assert_array_equal(first, forecast_split(period.astype(np.float64), seed=3))
    assert np.any(first != forecast_split(period, seed=4))


@pytest.mark.parametrize(
    "period",
    [np.full(10, 8080), np.array([], dtype=np.int64), np.array([8080.0, 8081.5]), np.array([8080.0, np.nan])],
)
def test_forecast_needs_two_integer_periods(period):
    with pytest.raises(InputDataError):
        forecast_split(period, seed=0)


def test_assign_split_dispatches(cluster):
    period = _quarter_periods(len(cluster), seed=0)
    np.testing.assert_array_equal(assign_split("random", n=100, seed=2), random_split(100, 2))
    np.testing.assert_array_equal(assign_split("random", period=period, seed=2), random_split(len(cluster), 2))
    np.testing.assert_array_equal(
        assign_split("spatial-block", xy_m=cluster, period=period, seed=5, block_m=20_000.0),
        spatial_block_split(cluster, 5, 20_000.0),
    )
    np.testing.assert_array_equal(
        assign_split("forecast", n=len(cluster), xy_m=cluster, period=period, seed=6), forecast_split(period, 6)
    )
    assert SPLIT_PROTOCOLS == ("random", "spatial-block", "forecast")


def test_assign_split_rejects_unknown_protocols_and_missing_or_mismatched_arrays(cluster):
    with pytest.raises(InputDataError, match="random, spatial-block, forecast"):
        assign_split("kfold", n=10)
    with pytest.raises(InputDataError, match="xy_m"):
        assign_split("spatial-block", n=10)
    with pytest.raises(InputDataError, match="period"):
        assign_split("forecast", xy_m=cluster)
    with pytest.raises(InputDataError, match="number of rows"):
        assign_split("random")
    with pytest.raises(InputDataError, match="disagree"):
        assign_split("spatial-block", n=10, xy_m=cluster)
    with pytest.raises(InputDataError, match="disagree"):
        assign_split("forecast", xy_m=cluster, period=np.arange(10))
