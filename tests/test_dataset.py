"""SpatialDataset: building, scaling, splitting, dropping, summary and the file round trip."""

import dataclasses
import json
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from geodbk.dataset.spatial_dataset import (
    CoordinateTransform,
    SpatialDataset,
    build_dataset,
    load_sample_dataset,
    parse_quarters,
)
from geodbk.dataset.splits import random_split
from geodbk.errors import InputDataError, RegionError
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.quarters import Quarter


def test_coordinate_transform_maps_the_box_to_the_unit_square():
    t = CoordinateTransform(-67.5, 17.5, -65.0, 18.5)
    corners = np.array([[-67.5, 17.5], [-65.0, 18.5], [-66.25, 18.0]])
    np.testing.assert_allclose(t.to_unit(corners), [[-1, -1], [1, 1], [0, 0]], atol=1e-15)
    pts = np.random.default_rng(0).uniform([-67.5, 17.5], [-65.0, 18.5], size=(1000, 2))
    np.testing.assert_allclose(t.to_lonlat(t.to_unit(pts)), pts, rtol=0, atol=1e-12)
    assert CoordinateTransform.from_dict(t.to_dict()) == t
    with pytest.raises(InputDataError):
        CoordinateTransform(0, 0, 0, 1)


def test_parse_quarters():
    assert parse_quarters("2023Q1, 2023q4") == [(2023, 1), (2023, 4)]
    assert parse_quarters(["2020Q3", (2021, 2)]) == [(2020, 3), (2021, 2)]
    assert parse_quarters(None) is None
    for bad in ["2023-4", "2023Q5", "23Q1", ""]:
        with pytest.raises(InputDataError):
            parse_quarters(bad)


def test_split_is_8_1_1_and_seeded():
    labels = random_split(1001, seed=3)
    assert [(labels == s).sum() for s in ("train", "val", "test")] == [800, 100, 101]
    assert (random_split(1001, seed=3) == labels).all()
    assert (random_split(1001, seed=4) != labels).any()


def test_dataset_columns_scaling_and_target(pr_dataset, pr_tiles_2023q4):
    f = pr_dataset.frame
    expected = ["quadkey", "year", "quarter", "service", "tests", "devices", "lon", "lat", "x1", "x2",
                "value", "y", "urban_rural", "split", "geometry"]
    assert list(f.columns) == expected
    assert f.crs.to_epsg() == 4326
    assert pr_dataset.target == "download" and pr_dataset.units == "Mbps"
    assert pr_dataset.quarters == [Quarter(2023, 4)]
    n_in = len(pr_tiles_2023q4)
    assert len(f) + pr_dataset.dropped["outside_region"] + pr_dataset.dropped["zero_value"] + pr_dataset.dropped[
        "missing_value"] == n_in
    # value = avg_d_kbps / 1000 for the same tile; y = log10(value)
    raw = pr_tiles_2023q4.set_index("quadkey")["avg_d_kbps"]
    np.testing.assert_allclose(f["value"].to_numpy(), raw.loc[f["quadkey"]].to_numpy() / 1000.0, rtol=0, atol=0)
    np.testing.assert_allclose(f["y"].to_numpy(), np.log10(f["value"].to_numpy()))
    # centres and scaling
    np.testing.assert_allclose(f[["lon", "lat"]].to_numpy(), quadkey_centres(f["quadkey"].to_numpy(dtype=object)))
    xy = f[["x1", "x2"]].to_numpy()
    assert xy.min() >= -1 and xy.max() <= 1
    np.testing.assert_allclose(pr_dataset.transform.to_lonlat(xy), f[["lon", "lat"]].to_numpy(), atol=1e-12)
    np.testing.assert_allclose(
        [pr_dataset.transform.west, pr_dataset.transform.south, pr_dataset.transform.east, pr_dataset.transform.north],
        np.array(pr_dataset.region.bounds) + [-0.01, -0.01, 0.01, 0.01],
    )
    # geometry = tile polygon containing the centre
    assert f.geometry.contains(gpd.GeoSeries(gpd.points_from_xy(f["lon"], f["lat"]), index=f.index, crs=4326)).all()


def test_splits_and_urban_rural_in_every_split(pr_dataset):
    n = len(pr_dataset)
    sizes = {s: len(pr_dataset.subset(s)) for s in ("train", "val", "test")}
    assert sizes == {"train": int(0.8 * n), "val": int(0.1 * n), "test": n - int(0.8 * n) - int(0.1 * n)}
    for split in ("train", "val", "test"):
        X, y, ur = pr_dataset.arrays(split)
        assert X.shape == (sizes[split], 2) and X.dtype == np.float64 and y.shape == (sizes[split],)
        assert set(ur) == {"urban", "rural"}
    with pytest.raises(InputDataError):
        pr_dataset.subset("holdout")


def test_split_does_not_depend_on_input_row_order(pr_tiles_2023q4, pr_dataset):
    shuffled = pr_tiles_2023q4.sample(frac=1.0, random_state=7)
    again = build_dataset(shuffled, "PR", quarters="2023Q4", seed=0)
    pd.testing.assert_frame_equal(again.frame, pr_dataset.frame)
    other_seed = build_dataset(pr_tiles_2023q4, "PR", seed=1)
    assert (other_seed.frame["split"] != pr_dataset.frame["split"]).any()


def test_save_load_round_trip_is_exact(pr_dataset, tmp_path):
    path = pr_dataset.save(tmp_path / "sub" / "dataset.parquet")
    assert [p.name for p in path.parent.iterdir()] == ["dataset.parquet"]
    assert b"geo" in pq.read_schema(path).metadata  # a GeoParquet file
    loaded = SpatialDataset.load(path)
    pd.testing.assert_frame_equal(loaded.frame, pr_dataset.frame)
    assert loaded.frame.crs == pr_dataset.frame.crs
    assert loaded.transform == pr_dataset.transform
    assert loaded.region.name == pr_dataset.region.name and loaded.region.code == "PR"
    assert loaded.region.geometry.equals_exact(pr_dataset.region.geometry, tolerance=0)
    assert loaded.metadata() == pr_dataset.metadata()
    assert loaded.summary() == pr_dataset.summary()


def test_failed_save_leaves_the_old_file_and_no_temp(pr_dataset, tmp_path, monkeypatch):
    path = tmp_path / "dataset.parquet"
    path.write_bytes(b"old")

    real_write = pq.write_table

    def broken(table, where, **kwargs):
        if not isinstance(where, (str, Path)):
            return real_write(table, where, **kwargs)  # geopandas' in-memory encoding step
        Path(where).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        pr_dataset.save(path)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["dataset.parquet"]


def test_load_refuses_other_files(tmp_path, pr_tiles_2023q4):
    plain = tmp_path / "plain.parquet"
    pr_tiles_2023q4.head(5).to_parquet(plain)
    with pytest.raises(InputDataError, match="not a geodbk dataset"):
        SpatialDataset.load(plain)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"garbage")
    with pytest.raises(InputDataError, match="cannot read"):
        SpatialDataset.load(corrupt)


def test_zero_and_missing_targets_are_dropped_and_counted(pr_tiles_2023q4):
    tiles = pr_tiles_2023q4.copy()
    tiles.loc[tiles.index[:7], "avg_u_kbps"] = 0
    tiles.loc[tiles.index[7:10], "avg_u_kbps"] = np.nan
    ds = build_dataset(tiles, "PR", target="upload", buffer_deg=0.5)
    assert ds.dropped["zero_value"] == 7 and ds.dropped["missing_value"] == 3
    assert ds.dropped["outside_region"] == 0
    assert len(ds) == len(tiles) - 10 and ds.units == "Mbps"
    assert np.isfinite(ds.frame["y"]).all()


def test_latency_target(pr_tiles_2023q4):
    ds = build_dataset(pr_tiles_2023q4, "PR", target="latency")
    assert ds.units == "ms"
    raw = pr_tiles_2023q4.set_index("quadkey")["avg_lat_ms"]
    np.testing.assert_array_equal(ds.frame["value"].to_numpy(), raw.loc[ds.frame["quadkey"]].to_numpy())


def test_bad_inputs_give_clear_errors(pr_tiles_2023q4):
    with pytest.raises(InputDataError, match="target"):
        build_dataset(pr_tiles_2023q4, "PR", target="jitter")
    with pytest.raises(RegionError, match="unknown region"):
        build_dataset(pr_tiles_2023q4, "Atlantis")
    with pytest.raises(RegionError, match="no tiles left"):
        build_dataset(pr_tiles_2023q4, "Alaska")
    with pytest.raises(InputDataError, match=r"2018Q1.*2023Q4"):
        build_dataset(pr_tiles_2023q4, "PR", quarters="2018Q1")
    with pytest.raises(InputDataError, match="no fixed tiles"):
        build_dataset(pr_tiles_2023q4, "PR", service="fixed")
    no_speed = pd.DataFrame(pr_tiles_2023q4.drop(columns=["avg_d_kbps"]))
    with pytest.raises(InputDataError, match="avg_d_kbps"):
        build_dataset(no_speed, "PR")
    for col in ("quadkey", "year"):
        broken = pr_tiles_2023q4.copy()
        broken[col] = broken[col].astype(object)
        broken.loc[broken.index[5], col] = None
        with pytest.raises(InputDataError, match=f"1 row.*no {col}"):
            build_dataset(broken, "PR")
    no_key = pd.DataFrame(pr_tiles_2023q4.drop(columns=["quarter"]))
    with pytest.raises(InputDataError, match="quarter"):
        build_dataset(no_key, "PR")
    all_zero = pr_tiles_2023q4.assign(avg_d_kbps=0.0)
    with pytest.raises(InputDataError, match="positive download"):
        build_dataset(all_zero, "PR")


def test_tiles_in_another_crs_are_reprojected_and_no_crs_is_refused(pr_tiles_2023q4, pr_dataset):
    projected = pr_tiles_2023q4.to_crs(3857)
    ds = build_dataset(projected, "PR", quarters="2023Q4")
    assert ds.frame.crs.to_epsg() == 4326
    np.testing.assert_allclose(np.asarray(ds.frame.geometry.bounds), np.asarray(pr_dataset.frame.geometry.bounds),
                               atol=1e-9)
    no_crs = pr_tiles_2023q4.set_crs(None, allow_override=True)
    with pytest.raises(InputDataError, match="no CRS"):
        build_dataset(no_crs, "PR")


def test_plain_table_with_the_truncated_quarter_flag(pr_tiles_2023q4):
    raw = pd.DataFrame(pr_tiles_2023q4.drop(columns="geometry")).head(200)
    raw["quarter_incomplete"] = np.arange(200) < 30
    ds = build_dataset(raw, "PR", buffer_deg=0.5)
    assert ds.dropped["incomplete_quarter"] == 30 and len(ds) == 170


def test_summary_reports_quarters_splits_urban_and_target(pr_dataset):
    text = pr_dataset.summary()
    f = pr_dataset.frame
    assert "Puerto Rico, download (Mbps)" in text
    assert f"{len(f):,}" in text and "2023Q4" in text
    train = f[f["split"] == "train"]
    urban_row, stats_row = [line.split() for line in text.splitlines() if line.startswith("train")]
    assert urban_row[1:3] == [str((train["urban_rural"] == u).sum()) for u in ("urban", "rural")]
    assert stats_row[1] == str(len(train))
    assert f"{train['y'].mean():.3f}" in text and f"{train['value'].median():.3f}" in text
    assert "outside_region" in text and pr_dataset.urban_route in text


def test_summary_says_which_held_out_split_lacks_a_class(pr_dataset):
    frame = pr_dataset.frame.copy()
    frame.loc[frame["split"] == "test", "urban_rural"] = "urban"
    text = dataclasses.replace(pr_dataset, frame=frame).summary()
    rural_train = int(((frame["split"] == "train") & (frame["urban_rural"] == "rural")).sum())
    assert f"no rural rows in test: the rural test metrics will be empty ({rural_train:,} rural rows are in train)" in text
    assert "no rural rows in" not in pr_dataset.summary() and "no urban rows" not in text


def test_summary_gives_each_protocol_its_own_shares(pr_tiles):
    ds = build_dataset(pr_tiles, "PR", quarters="2023Q3,2023Q4", seed=0)
    assert "random split 8:1:1 with seed 0" in ds.summary()
    forecast = ds.with_split("forecast", seed=0)
    rows = forecast.frame["split"].value_counts()
    assert rows["test"] == int((forecast.frame["quarter"] == 4).sum())  # the last quarter is the test set
    assert "; forecast split test 2023Q4, earlier rows 8:1 with seed 0" in forecast.summary().splitlines()[1]


def test_load_sample_dataset_hawaii():
    ds = load_sample_dataset("HI", target="upload", quarters=["2023Q4"])
    assert ds.region.code == "HI" and ds.quarters == [Quarter(2023, 4)] and 1500 < len(ds) < 1700
    with pytest.raises(RegionError, match="Puerto Rico"):
        load_sample_dataset("TX")


def test_a_dataset_loaded_without_polygons_saves_them_from_its_source_file(tmp_path, monkeypatch):
    """``geodbk fit`` loads datasets without their tile polygons (1.6 KB a row as shapely
    objects); the run's copy takes them from the source file, batch by batch, in row order."""
    import geodbk.dataset.spatial_dataset as module

    source = tmp_path / "full.parquet"
    load_sample_dataset("PR", quarters=["2023Q3", "2023Q4"]).save(source)
    light = SpatialDataset.load(source, geometry=False)
    assert "geometry" not in light.frame.columns and not isinstance(light.frame, gpd.GeoDataFrame)
    resplit = light.with_split("spatial-block")
    monkeypatch.setattr(module, "SAVE_BATCH_ROWS", 1000)  # several batches
    resplit.save(tmp_path / "run.parquet", geometry_from=source)
    expected = SpatialDataset.load(source).with_split("spatial-block")
    back = SpatialDataset.load(tmp_path / "run.parquet")
    pd.testing.assert_frame_equal(back.frame, expected.frame)
    assert back.metadata() == expected.metadata() and back.split_protocol == "spatial-block"
    with pytest.raises(InputDataError, match="geometry_from"):
        resplit.save(tmp_path / "nowhere.parquet")
    with pytest.raises(InputDataError, match="rows"):
        dataclasses.replace(resplit, frame=resplit.frame.iloc[:10]).save(tmp_path / "x.parquet", geometry_from=source)


# --- the spatial-block side: chosen for the seed, or given, and kept in the file --------------------
@pytest.mark.parametrize(("region", "val", "test"), [("PR", 11, 14), ("HI", 11, 8)])
def test_the_shipped_samples_keep_10_km_blocks_at_seed_0(region, val, test):
    """The PR and HI benchmark splits of seed 0 are the 10 km splits they were before the choice."""
    ds = load_sample_dataset(region, split="spatial-block")
    assert (ds.block_m, ds.block_choice) == (10_000.0, "chosen")
    assert ds.held_out_blocks()["val"] == val and ds.held_out_blocks()["test"] == test
    given = load_sample_dataset(region, split="spatial-block", block_m=10_000.0)
    np.testing.assert_array_equal(ds.frame["split"].to_numpy(), given.frame["split"].to_numpy())
    assert given.block_choice == "given"
    assert f"spatial-block split: 10 km squares chosen for {len(ds):,} rows (val {val} blocks, test {test} blocks)" in (
        ds.summary().splitlines())


def test_a_chosen_side_is_chosen_again_for_a_new_seed_and_a_given_one_is_kept(pr_dataset):
    chosen = pr_dataset.with_split("spatial-block", seed=0)
    assert chosen.block_choice == "chosen" and pr_dataset.block_choice == "chosen"  # built without block_m
    small = dataclasses.replace(chosen, frame=chosen.frame[chosen.frame["lon"] > -66.2])  # the San Juan end
    again = small.with_split("spatial-block", seed=1)
    assert again.block_choice == "chosen" and again.block_m < 10_000.0
    assert min(again.held_out_blocks()["val"], again.held_out_blocks()["test"]) >= 8
    given = small.with_split("spatial-block", seed=1, block_m=5_000.0)
    assert (given.block_m, given.block_choice) == (5_000.0, "given")
    kept = given.with_split("spatial-block", seed=2)
    assert (kept.block_m, kept.block_choice) == (5_000.0, "given")
    assert given.with_split("random").block_m == 5_000.0


def test_held_out_blocks_counts_the_squares_of_each_split(pr_dataset):
    from geodbk.dataset.coords import ProjectedTransform

    ds = pr_dataset.with_split("spatial-block", block_m=4_000.0)
    lonlat = ds.frame[["lon", "lat"]].to_numpy(np.float64)
    cells = np.floor(ProjectedTransform.from_lonlat(lonlat).to_metres(lonlat) / 4_000.0).astype(np.int64)
    keys = cells[:, 0] * 1_000_003 + cells[:, 1]
    split = ds.frame["split"].to_numpy()
    assert ds.held_out_blocks() == {s: len(np.unique(keys[split == s])) for s in ("train", "val", "test")}
    assert not set(keys[split == "train"]) & set(keys[split == "test"])


def test_the_block_choice_round_trips_and_old_files_read_as_given(tmp_path, pr_dataset):
    chosen = pr_dataset.with_split("spatial-block", seed=3)
    back = SpatialDataset.load(chosen.save(tmp_path / "chosen.parquet"))
    assert (back.block_m, back.block_choice) == (chosen.block_m, "chosen")
    assert back.metadata() == chosen.metadata()
    given_file = pr_dataset.with_split("spatial-block", block_m=2_500.0).save(tmp_path / "given.parquet")
    given = SpatialDataset.load(given_file)
    assert (given.block_m, given.block_choice) == (2_500.0, "given")
    # a file written before the choice: no block_choice in its metadata
    table = pq.read_table(given_file)
    meta = json.loads(table.schema.metadata[b"geodbk"])
    del meta["block_choice"]
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"geodbk": json.dumps(meta).encode()}),
                   tmp_path / "old.parquet")
    old = SpatialDataset.load(tmp_path / "old.parquet")
    assert (old.block_m, old.block_choice) == (2_500.0, "given")
    assert old.with_split("spatial-block", seed=7).block_m == 2_500.0
    with pytest.raises(InputDataError, match="block_choice"):
        dataclasses.replace(old, block_choice="guessed")


def test_check_split_refuses_a_small_split_and_the_python_api_does_not(pr_dataset):
    small = dataclasses.replace(pr_dataset, frame=pr_dataset.frame.iloc[::10])
    assert len(small.subset("val")) < 100  # built and kept: only the CLI verbs refuse
    with pytest.raises(InputDataError, match=f"the random split of {len(small):,} rows leaves"):
        small.check_split()
    pr_dataset.check_split()
    assert pr_dataset.test_note() == ("note: the test metrics come from only 643 rows, so they are noisy; compare "
                                      "models over several --seed values")
    assert pr_dataset.validation_note() is None  # 641 validation rows
    assert f"only {len(small.subset('val'))} validation rows chose" in str(small.validation_note())
