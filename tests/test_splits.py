"""Split protocols: random (as before), spatial blocks and forecast by quarter."""

import warnings

import numpy as np
import pytest

from geodbk.dataset.splits import (
    BLOCK_LADDER_M,
    DEFAULT_BLOCK_M,
    FEW_VALIDATION_ROWS,
    GOAL_HELD_OUT_BLOCKS,
    GOAL_HELD_OUT_SHARE,
    MIN_HELD_OUT_BLOCKS,
    MIN_HELD_OUT_ROWS,
    SPLIT_PROTOCOLS,
    assign_split,
    block_ids,
    blocks_per_split,
    check_usable_split,
    choose_block_m,
    few_validation_rows_note,
    forecast_split,
    noisy_test_note,
    random_split,
    spatial_block_split,
)
from geodbk.errors import InputDataError


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
    for key, label in zip(keys.tolist(), labels.tolist(), strict=True):
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
    np.testing.assert_array_equal(spatial_block_split(cluster, seed=4)[perm],
                                  spatial_block_split(cluster[perm], seed=4))


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


# --- the block side chosen from the data ------------------------------------------------------------
def _held_out(xy_m: np.ndarray, seed: int, block_m: float) -> tuple[int, int, float, float]:
    """Val and test blocks and row shares of the spatial-block split, counted apart from choose_block_m."""
    labels = spatial_block_split(xy_m, seed, block_m)
    keys = _block_keys(xy_m, block_m)
    blocks = [len(np.unique(keys[labels == s])) for s in ("val", "test")]
    shares = [float(np.mean(labels == s)) for s in ("val", "test")]
    return blocks[0], blocks[1], shares[0], shares[1]


def _qualifies(xy_m: np.ndarray, seed: int, block_m: float) -> bool:
    val, test, val_share, test_share = _held_out(xy_m, seed, block_m)
    return min(val, test) >= GOAL_HELD_OUT_BLOCKS and min(val_share, test_share) >= GOAL_HELD_OUT_SHARE


def _city(n: int, sd_m: float, seed: int) -> np.ndarray:
    """``(n, 2)`` metres: one Gaussian cluster of ``sd_m`` around (53.7 km, 53.7 km), off the block corners."""
    return 53_700.0 + np.random.default_rng(seed).normal(size=(n, 2)) * sd_m


def test_the_ladder_runs_from_10_km_down_to_1_km():
    assert BLOCK_LADDER_M[0] == DEFAULT_BLOCK_M == 10_000.0 and BLOCK_LADDER_M[-1] == 1_000.0
    assert list(BLOCK_LADDER_M) == sorted(BLOCK_LADDER_M, reverse=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wide_spread_keeps_10_km_blocks(cluster, seed):
    assert choose_block_m(cluster, seed) == 10_000.0
    assert _qualifies(cluster, seed, 10_000.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_city_gets_the_largest_side_that_holds_out_8_blocks_each(seed):
    city = _city(3_000, 4_000.0, seed)
    side = choose_block_m(city, seed)
    assert side < 10_000.0 and _qualifies(city, seed, side)
    assert not any(_qualifies(city, seed, larger) for larger in BLOCK_LADDER_M if larger > side)
    val, test, _, _ = _held_out(city, seed, side)
    assert val >= GOAL_HELD_OUT_BLOCKS and test >= GOAL_HELD_OUT_BLOCKS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_too_few_places_get_the_side_with_the_most_held_out_blocks(seed):
    town = _city(80, 2_000.0, seed)
    splittable = [side for side in BLOCK_LADDER_M if len(np.unique(_block_keys(town, side))) >= 3]
    assert splittable and not any(_qualifies(town, seed, side) for side in splittable)
    fewest = {side: min(_held_out(town, seed, side)[:2]) if side in splittable else 0 for side in BLOCK_LADDER_M}
    best = max(fewest.values())
    assert choose_block_m(town, seed) == max(side for side, held in fewest.items() if held == best)


def _usable(xy_m: np.ndarray, seed: int, block_m: float) -> bool:
    """Whether check_usable_split accepts the split: 5 blocks and 100 rows in val and test."""
    val, test, val_share, test_share = _held_out(xy_m, seed, block_m)
    rows = min(val_share, test_share) * len(xy_m)
    return min(val, test) >= MIN_HELD_OUT_BLOCKS and rows >= MIN_HELD_OUT_ROWS - 1e-6


def test_below_2000_rows_a_usable_side_wins_over_one_that_reaches_8_blocks_with_too_few_rows():
    # 1,000 rows: 5% is 50 rows, so 8 blocks can hold fewer rows than any verb accepts
    town = _city(1_000, 4_000.0, 0)
    goal_only = [side for side in BLOCK_LADDER_M if _qualifies(town, 0, side) and not _usable(town, 0, side)]
    assert goal_only, "the case needs a side that reaches 8 blocks with under 100 rows"
    side = choose_block_m(town, 0)
    assert _usable(town, 0, side) and not _qualifies(town, 0, side)
    assert not any(_usable(town, 0, larger) for larger in BLOCK_LADDER_M if larger > side)
    labels = spatial_block_split(town, 0, side)
    with pytest.warns(UserWarning, match="metrics from this split are noisy"):
        check_usable_split(labels, "spatial-block", blocks=blocks_per_split(labels, block_ids(town, side)),
                           block_m=side, chosen=True)


def test_with_no_usable_side_the_goal_side_is_chosen_and_refused_with_what_to_change():
    town = _city(1_000, 2_500.0, 0)
    assert not any(_usable(town, 0, side) for side in BLOCK_LADDER_M)
    side = choose_block_m(town, 0)
    assert side == max(side for side in BLOCK_LADDER_M if _qualifies(town, 0, side))
    labels = spatial_block_split(town, 0, side)
    blocks = blocks_per_split(labels, block_ids(town, side))
    with pytest.raises(InputDataError) as refused:
        check_usable_split(labels, "spatial-block", blocks=blocks, block_m=side, chosen=True)
    assert str(refused.value).endswith(
        "; no square from 10 km down to 1 km holds out enough; use more tiles or quarters, another --seed, or "
        "--split random")
    with pytest.raises(InputDataError) as refused:  # the same side, given: another side may do
        check_usable_split(labels, "spatial-block", blocks=blocks, block_m=side)
    assert str(refused.value).endswith("; pass another --block-km (or none, and geodbk chooses one), or --split random")


def test_a_single_place_falls_back_to_10_km_and_the_split_refuses_it():
    one = np.full((19, 2), 5_000.0)
    assert choose_block_m(one, 0) == 10_000.0
    with pytest.raises(InputDataError, match="only 1 block of 10 km"):
        spatial_block_split(one, seed=0, block_m=None)


def test_no_block_side_means_the_chosen_side_everywhere():
    city = _city(3_000, 4_000.0, 0)
    side = choose_block_m(city, 5)
    np.testing.assert_array_equal(spatial_block_split(city, 5, None), spatial_block_split(city, 5, side))
    np.testing.assert_array_equal(assign_split("spatial-block", xy_m=city, seed=5), spatial_block_split(city, 5, side))


# --- refusing unusable splits -----------------------------------------------------------------------
def test_a_random_split_of_fewer_than_1000_rows_is_refused_in_one_line():
    labels = random_split(600, 0)
    with pytest.raises(InputDataError) as refused:
        check_usable_split(labels, "random")
    message = str(refused.value)
    assert message == ("the random split of 600 rows leaves 60 validation rows and 60 test rows (at least 100 needed); "
                       "use more tiles or quarters")
    assert "\n" not in message
    check_usable_split(random_split(1000, 0), "random")


def test_a_spatial_block_split_needs_5_blocks_and_100_rows_in_val_and_test():
    labels = np.array(["train"] * 2000 + ["val"] * 300 + ["test"] * 41, dtype=object)
    blocks = {"train": 40, "val": 9, "test": 3}
    with pytest.raises(InputDataError) as refused:
        check_usable_split(labels, "spatial-block", blocks=blocks, block_m=1_000.0)
    assert str(refused.value) == (
        "the spatial-block split of 2,341 rows leaves 3 test blocks (41 rows) at 1 km squares (at least "
        f"{MIN_HELD_OUT_BLOCKS} blocks and {MIN_HELD_OUT_ROWS} rows needed); pass a smaller --block-km, or "
        "--split random")
    labels = np.array(["train"] * 2000 + ["val"] * 300 + ["test"] * 300, dtype=object)
    with pytest.raises(InputDataError, match="leaves 4 validation blocks \\(300 rows\\) at 2.5 km squares"):
        check_usable_split(labels, "spatial-block", blocks={"train": 40, "val": 4, "test": 9}, block_m=2_500.0)
    with pytest.raises(InputDataError, match="blocks per split"):
        check_usable_split(labels, "spatial-block")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_usable_split(labels, "spatial-block", blocks={"train": 40, "val": 5, "test": 5}, block_m=2_500.0)


def test_a_chosen_side_short_of_8_blocks_warns_that_metrics_are_noisy():
    labels = np.array(["train"] * 2000 + ["val"] * 300 + ["test"] * 300, dtype=object)
    with pytest.warns(UserWarning) as caught:
        check_usable_split(labels, "spatial-block", blocks={"train": 40, "val": 9, "test": 6}, block_m=1_000.0,
                           chosen=True)
    assert [str(w.message) for w in caught] == ["only 6 test blocks: metrics from this split are noisy"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_usable_split(labels, "spatial-block", blocks={"train": 40, "val": 8, "test": 8}, block_m=1_000.0,
                           chosen=True)


def test_a_forecast_split_with_a_thin_last_quarter_is_refused():
    period = np.array([8090] * 3000 + [8091] * 60)
    with pytest.raises(InputDataError, match="leaves 60 test rows .*or --split random"):
        check_usable_split(forecast_split(period, 0), "forecast")


def test_blocks_per_split_counts_distinct_blocks():
    ids = np.array([0, 0, 1, 2, 2, 3, 4])
    labels = np.array(["train", "train", "train", "val", "val", "test", "test"])
    assert blocks_per_split(labels, ids) == {"train": 2, "val": 1, "test": 2}
    xy = _city(500, 3_000.0, 1)
    labels = spatial_block_split(xy, 1, 2_000.0)
    counts = blocks_per_split(labels, block_ids(xy, 2_000.0))
    assert sum(counts.values()) == len(np.unique(_block_keys(xy, 2_000.0)))


def test_few_validation_rows_get_a_note():
    assert few_validation_rows_note(FEW_VALIDATION_ROWS) is None
    note = few_validation_rows_note(104)
    assert note is not None and note.startswith("note: only 104 validation rows chose") and "\n" not in note


def test_the_noisy_note_names_blocks_or_rows():
    assert noisy_test_note(5_000, 25) is None and noisy_test_note(5_000) is None
    assert noisy_test_note(13_246, 14) == ("note: the test metrics come from only 14 blocks (13,246 rows), so they are "
                                           "noisy; compare models over several --seed values")
    assert "only 640 rows" in str(noisy_test_note(640))
