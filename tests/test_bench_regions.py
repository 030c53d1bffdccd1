"""benchmarks/bench_regions.py: the spread of a mean difference over independent draws, the
"dbk-rbf minus" cells built from it, the block side chosen for its smallest crop, any region,
a region's tile persistence, and the saved predictions that variants of the new-measurement family are scored on."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geodbk import paths
from geodbk.errors import InputDataError
from geodbk.fit.averaging import average_predictions
from geodbk.fit.metrics import nll_per_row
from geodbk.fit.tails import fit_measurement_tails
from geodbk.prediction import Prediction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_regions  # noqa: E402  # benchmarks/bench_regions.py, not a package


def test_mean_difference_sd_matches_the_spread_of_simulated_means() -> None:
    """Three independent draws with their own sds: the sd the function gives for their mean is the
    sd of the mean of simulated draws (Monte Carlo, 1% at 200,000 replicates)."""
    means, sds = np.array([0.05, -0.02, 0.11]), np.array([0.03, 0.09, 0.05])
    difference, sd = bench_regions.mean_difference(list(zip(means, sds, strict=True)))
    assert difference == np.mean(means)
    simulated = np.random.default_rng(0).normal(means, sds, size=(200_000, 3)).mean(axis=1)
    assert abs(sd - simulated.std()) < 0.01 * sd
    assert abs(simulated.mean() - difference) < 3 * sd / np.sqrt(200_000)


def test_minus_column_gives_the_latest_draw_or_the_mean_per_peer_of_the_split() -> None:
    spreads = {
        ("random", "gpboost:map"): [(0.010, 0.020), (0.030, 0.040)],
        ("random", "lightgbm:map"): [(-0.050, 0.030), (-0.070, 0.040)],
        ("spatial-block", "gpboost:map"): [(0.500, 0.100)],
    }
    latest = bench_regions.minus_column(spreads, "random", draw=-1)
    assert latest == "gpboost:map +0.030+/-0.040; lightgbm:map -0.070+/-0.040"
    mean = bench_regions.minus_column(spreads, "random", draw=None)
    assert mean == "gpboost:map +0.020+/-0.022; lightgbm:map -0.060+/-0.025"
    assert bench_regions.minus_column(spreads, "spatial-block", draw=None) == "gpboost:map +0.500+/-0.100"


def test_tile_persistence_is_the_share_of_a_tiles_variance_that_it_keeps() -> None:
    """Tiles with a lasting offset a ~ N(0, 1) and a fresh one e ~ N(0, 1) each quarter, on a
    trend per quarter that the centring takes out: consecutive quarters correlate 1 / (1 + 1)."""
    rng = np.random.default_rng(0)
    tiles, quarters = 3000, 6  # 2022Q1-2023Q2: one pair crosses the year
    offset = np.repeat(rng.normal(size=tiles), quarters)
    quarter = np.tile(np.arange(quarters), tiles)
    frame = pd.DataFrame({
        "quadkey": np.repeat([f"{i:016d}" for i in range(tiles)], quarters),
        "year": 2022 + quarter // 4, "quarter": 1 + quarter % 4,
        "y": 1.5 + 0.3 * quarter + offset + rng.normal(size=tiles * quarters),
    })
    assert bench_regions.tile_persistence(frame) == pytest.approx(0.5, abs=0.03)
    fresh = frame.assign(y=rng.normal(size=len(frame)))
    assert abs(bench_regions.tile_persistence(fresh)) < 0.04
    assert np.isnan(bench_regions.tile_persistence(frame.iloc[:2]))


def test_vieques_and_culebra_get_a_square_that_every_verb_accepts() -> None:
    # 1,044 rows: 1.2 km squares hold out 8 blocks each at seed 0 but only 72 test rows, which
    # check_split refused; the chooser now takes 1.5 km, whose held-out sets have 100 rows or more
    base, _ = bench_regions.crop_dataset(bench_regions.CROPS["vieques-culebra"])
    assert len(base) == 1_044
    dataset = base.with_split("spatial-block", seed=0)
    assert dataset.block_choice == "chosen" and dataset.block_m == 1_500.0
    rows = dataset.frame["split"].value_counts()
    assert min(rows["val"], rows["test"]) >= 100
    with pytest.warns(UserWarning, match="only 6 test blocks"):
        dataset.check_split()
    refused = "leaves 8 validation blocks \\(93 rows\\) at 1.2 km squares .*; no square from"
    with pytest.raises(InputDataError, match=refused):
        base.with_split("spatial-block", seed=2).check_split()


def test_any_region_runs_with_its_own_tiles_and_density_layer(capsys, tmp_path) -> None:
    """--region with --tiles and --density: the comparison on a region that was not tuned on (here
    Culebra alone, given the files the shipped defaults would pick, so both routes must agree)."""
    mobile, fixed = str(paths.PUERTO_RICO_MOBILE), str(paths.PUERTO_RICO_FIXED)
    given = bench_regions.Crop("Culebra, PR", "Culebra, PR", mobile, fixed)
    (dataset, density), (default, default_density) = (bench_regions.crop_dataset(c) for c in
                                                        (given, bench_regions.Crop("culebra", "72049")))
    assert dataset.region.name == "Culebra, PR" and len(dataset) == len(default) > 50
    np.testing.assert_array_equal(dataset.frame["y"].to_numpy(), default.frame["y"].to_numpy())
    assert density.equals(default_density)
    layer = pd.read_parquet(fixed)
    halves = [str(tmp_path / f"fixed_{half}.parquet") for half in ("early", "late")]
    layer[layer["year"] < 2022].to_parquet(halves[0])
    layer[layer["year"] >= 2022].to_parquet(halves[1])
    split_layer = bench_regions.crop_dataset(bench_regions.Crop("Culebra, PR", "Culebra, PR", mobile, halves))[1]
    assert len(split_layer) == len(default_density) and set(split_layer["quadkey"]) == set(default_density["quadkey"])
    code = bench_regions.main(["--region", "Culebra, PR", "--tiles", mobile, "--density", *halves,
                               "--models", "knn", "--draws", "1"])  # a layer in two files
    printed = capsys.readouterr().out
    assert code == 0 and "## Culebra, PR" in printed and f"density layer: {halves[0]}, {halves[1]}" in printed


@pytest.mark.parametrize("protocol", ["random", "spatial-block"])
def test_nested_scores_the_validation_rows_and_cuts_new_ones_from_the_training_rows(protocol) -> None:
    base, _ = bench_regions.crop_dataset(bench_regions.CROPS["kauai"])
    dataset = base.with_split(protocol, seed=1)
    inner = bench_regions.nested(dataset, draw=1)
    outer, split = dataset.frame["split"], inner.frame["split"]
    assert set(inner.frame.index) == set(outer.index[outer != "test"])  # the real test rows are gone
    assert (split[outer[outer == "val"].index] == "test").all()  # the real validation rows are scored
    new_val = split.index[split == "val"]
    assert (outer[new_val] == "train").all() and 0.05 < len(new_val) / (outer == "train").sum() < 0.2
    tiles = inner.frame.groupby(split)["quadkey"].agg(set)
    shared = tiles["val"] & tiles["train"]
    if protocol == "spatial-block":  # whole squares of the training rows: no tile on both sides
        assert not shared and inner.block_m == dataset.block_m
    else:  # random rows: most validation tiles keep other quarters in training
        assert len(shared) > 0.5 * len(tiles["val"])


def _saved(rows: pd.DataFrame, prefix: str = "") -> Prediction:
    return Prediction(*(rows[f"{prefix}{name}"].to_numpy() for name in ("mean", "sd", "measurement_sd")))


def test_saved_predictions_give_back_each_fits_nll(tmp_path) -> None:
    """--save-predictions: the new-measurement family refitted on a saved fit's validation rows, and
    applied to its test rows, gives the NLL of the table, for knn and for dbk-rbf, whose saved
    parts average to its saved prediction."""
    table, _ = bench_regions.region_table(bench_regions.Crop("culebra", "72049"), ["knn", "dbk-rbf"], 1, "test",
                                          None, {}, save_to=tmp_path)
    for split in ("random", "spatial-block"):
        for kind in ("knn", "dbk-rbf"):
            saved = pd.read_parquet(tmp_path / f"culebra_{split}_0_{kind}.parquet")
            val, test = saved[saved["part"] == "val"], saved[saved["part"] == "test"]
            assert len(val) > 10 and len(test) > 10
            centre = saved["tests_centre"].iloc[0]  # the mean 1/tests of one row of 1/centre tests is centre
            tails = fit_measurement_tails(val["y"].to_numpy(), _saved(val), val["tests"].to_numpy(),
                                          train_tests=np.array([1.0 / centre]))
            scored = tails.apply(_saved(test), test["tests"].to_numpy()).measurement()
            printed = table[(table["split"] == split) & (table["draw"] == 0)][kind].item()
            assert nll_per_row(test["y"].to_numpy(), scored).mean() == pytest.approx(printed, abs=1e-9)
            if kind == "dbk-rbf":
                averaged = average_predictions(_saved(saved, "deep_"), _saved(saved, "kriging_"))
                np.testing.assert_allclose(averaged.mean, saved["mean"], atol=1e-12)
                np.testing.assert_allclose(averaged.measurement_sd, saved["measurement_sd"], atol=1e-12)
