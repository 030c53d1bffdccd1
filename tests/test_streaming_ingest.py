"""The streaming ingest (geodbk.ingest.scan) gives what the in-memory reader gives, on generated
Ookla-schema global files (benchmarks/synthetic_ookla.py) and on the shipped sample."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import shapely

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synthetic_ookla  # noqa: E402  # benchmarks/synthetic_ookla.py, not a package

from geodbk import paths  # noqa: E402
from geodbk.dataset.spatial_dataset import build_dataset  # noqa: E402
from geodbk.errors import DroppedRowsWarning, InputDataError, RegionError  # noqa: E402
from geodbk.ingest.ookla import read_tiles  # noqa: E402
from geodbk.ingest.regions import Region, clip_to_region, load_region  # noqa: E402
from geodbk.ingest.scan import scan_tiles, select_rows  # noqa: E402

#: Two quarters: one of the old schema (no tile_x/tile_y), one of the new (with them and the
#: loaded latency).
QUARTERS = ["2022Q2", "2023Q4"]


@pytest.fixture(scope="module")
def global_files(tmp_path_factory) -> list[Path]:
    """Two small global quarters (6,000 rows each), written in row groups of 1,000 rows."""
    folder = tmp_path_factory.mktemp("global")
    old = synthetic_ookla.ROW_GROUP_ROWS
    synthetic_ookla.ROW_GROUP_ROWS = 1000
    try:
        return synthetic_ookla.write_global_quarters(folder, QUARTERS, 4000, 2000, seed=3)
    finally:
        synthetic_ookla.ROW_GROUP_ROWS = old


def _in_memory(source, region, **kw) -> pd.DataFrame:
    """What ingest did before streaming: read every row, select, then clip."""
    tiles = read_tiles(source)
    chosen, _, _ = select_rows(tiles, kw.get("service"), kw.get("quarters"))
    clipped = clip_to_region(tiles[chosen], load_region(region))
    clipped.attrs["dropped"] = {**tiles.attrs["dropped"], **clipped.attrs["dropped"]}
    return clipped.reset_index(drop=True)


def _assert_same_tiles(new: pd.DataFrame, old: pd.DataFrame) -> None:
    plain = [pd.DataFrame(frame.drop(columns="geometry")) for frame in (new, old)]
    pd.testing.assert_frame_equal(*plain)
    assert new.geometry.geom_equals_exact(old.geometry, 0.0).all()
    assert new.attrs["dropped"] == old.attrs["dropped"]


def test_generated_files_have_ookla_names_and_schemas(global_files):
    assert [p.name for p in global_files] == [
        "2022-04-01_performance_mobile_tiles.parquet",
        "2023-10-01_performance_mobile_tiles.parquet",
    ]
    old, new = (pq.ParquetFile(p) for p in global_files)
    assert old.schema_arrow.names == [
        "quadkey", "tile", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]
    assert new.schema_arrow.names == [
        "quadkey", "tile", "tile_x", "tile_y", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms",
        "avg_lat_down_ms", "avg_lat_up_ms", "tests", "devices"]
    assert old.metadata.num_rows == 6000 and old.num_row_groups == 6
    quadkeys = old.read(columns=["quadkey"])["quadkey"].to_pylist()
    assert quadkeys == sorted(quadkeys) and len(set(quadkeys)) == 6000


def test_generation_is_deterministic_and_georgia_gets_a_few_percent(global_files, tmp_path):
    again = synthetic_ookla.write_global_quarters(tmp_path, QUARTERS[-1:], 4000, 2000, seed=3)
    assert pq.read_table(again[0]).equals(pq.read_table(global_files[1]))
    tiles = read_tiles(global_files[1])
    us = tiles.cx[-125:-66.5, 24:49.5]
    georgia = clip_to_region(tiles, load_region("GA"))
    assert 0.01 < len(georgia) / len(us) < 0.08


@pytest.mark.parametrize("region", ["GA", "Texas"])
def test_streamed_scan_equals_the_in_memory_reader(global_files, region):
    for batch_rows in (700, 100_000):  # batches within and across row groups
        new = scan_tiles(global_files, load_region(region), batch_rows=batch_rows)
        _assert_same_tiles(new, _in_memory(global_files, region))
    assert new["avg_lat_down_ms"].isna().any() and new["avg_lat_down_ms"].notna().any()


def test_streamed_dataset_equals_the_in_memory_dataset(global_files):
    """Rows, values, urban/rural classes, splits and dropped counts (the CLI's path)."""
    for kw in ({}, {"quarters": "2023Q4", "target": "latency", "split": "spatial-block"}):
        new = build_dataset(global_files, "GA", **kw)
        old = build_dataset(read_tiles(global_files), "GA", **kw)
        pd.testing.assert_frame_equal(new.frame, old.frame, check_exact=True)
        assert new.frame.geometry.geom_equals_exact(old.frame.geometry, 0.0).all()
        assert new.dropped == old.dropped and new.metadata() == old.metadata()


def test_shipped_sample_streams_to_the_same_dataset():
    new = build_dataset(paths.PUERTO_RICO_MOBILE, "PR")
    old = build_dataset(read_tiles(paths.PUERTO_RICO_MOBILE), "PR")
    pd.testing.assert_frame_equal(new.frame, old.frame, check_exact=True)
    assert new.dropped["incomplete_quarter"] == 1277 and new.metadata() == old.metadata()


def _edited(source: Path, folder: Path, edit) -> Path:
    """A copy of ``source`` (same name, so the same quarter) with ``edit(frame)`` applied."""
    frame = pq.read_table(source).to_pandas()
    edit(frame)
    folder.mkdir(exist_ok=True)
    frame.to_parquet(folder / source.name, row_group_size=1000)
    return folder / source.name


def _outside_georgia(frame: pd.DataFrame) -> np.ndarray:
    """Row numbers of ten tiles far from Georgia (west of 100W)."""
    lon = frame["tile"].str.extract(r"POLYGON\(\((-?[\d.]+)")[0].astype(float)
    return np.flatnonzero((lon < -100).to_numpy())[:10]


def test_rows_outside_the_region_are_checked_and_counted(global_files, tmp_path):
    def invalid(frame):
        rows = _outside_georgia(frame)
        frame.loc[rows[:4], "tests"] = 0
        frame.loc[rows[4:], "avg_d_kbps"] = -1

    path = _edited(global_files[1], tmp_path / "invalid", invalid)
    with pytest.warns(DroppedRowsWarning, match="dropped 10 tile row"):
        new = scan_tiles(path, load_region("GA"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DroppedRowsWarning)
        _assert_same_tiles(new, _in_memory(path, "GA"))
    assert new.attrs["dropped"]["no_tests"] == 4 and new.attrs["dropped"]["invalid_value"] == 6


def _bad_quadkey(frame: pd.DataFrame, rows: np.ndarray) -> None:
    frame.loc[rows[:1], "quadkey"] = "0123x"


def _centre_outside(frame: pd.DataFrame, rows: np.ndarray) -> None:
    frame.loc[rows[:2], "tile_x"] = 0.0


def _duplicate(frame: pd.DataFrame, rows: np.ndarray) -> None:
    frame.loc[rows[1], "quadkey"] = frame.loc[rows[0], "quadkey"]


@pytest.mark.parametrize(
    ("edit", "quarter", "message"),
    [
        (_bad_quadkey, 1, "invalid quadkey '0123x'"),
        (_centre_outside, 1, "2 row.s. have tile_x/tile_y outside"),
        (_duplicate, 0, "1 duplicate"),
    ],
    ids=["bad quadkey", "centre outside its tile", "duplicate"],
)
def test_a_file_refused_for_rows_outside_the_region_is_still_refused(global_files, tmp_path, edit, quarter, message):
    path = _edited(global_files[quarter], tmp_path / "bad", lambda f: edit(f, _outside_georgia(f)))
    with pytest.raises(InputDataError, match=message):
        read_tiles(path)
    with pytest.raises(InputDataError, match=message):
        scan_tiles(path, load_region("GA"))


def test_polygons_are_parsed_for_kept_rows_only(global_files, tmp_path):
    """Broken WKT far from Georgia stops the in-memory reader, not the scan of Georgia."""
    def broken(frame):
        frame.loc[_outside_georgia(frame), "tile"] = "POLYGON((not a polygon"

    path = _edited(global_files[0], tmp_path / "wkt", broken)
    with pytest.raises(InputDataError, match="invalid WKT"):
        read_tiles(path)
    kept = scan_tiles(path, load_region("GA"))
    reference = scan_tiles(global_files[0], load_region("GA"))
    assert kept.geometry.geom_equals_exact(reference.geometry, 0.0).all() and len(kept) > 0


def test_selection_errors_name_what_the_files_hold(global_files):
    with pytest.raises(InputDataError, match=r"no tiles for quarter\(s\) \['2019Q1'\]; the tiles hold 2022Q2, 2023Q4"):
        build_dataset(global_files, "GA", quarters="2019Q1")
    antarctic = Region("Antarctic", shapely.box(0.0, -80.0, 1.0, -79.0))
    with pytest.raises(RegionError, match="no tiles left after clipping to Antarctic"):
        scan_tiles(global_files, antarctic, quarters=[(2023, 4)])


def test_one_file_twice_is_refused(global_files):
    with pytest.raises(InputDataError, match="duplicate"):
        scan_tiles([global_files[0], global_files[0]], load_region("GA"))


def test_quarter_ranges_of_the_generator_cli():
    assert synthetic_ookla.parse_quarter_range("2019Q3..2020Q2") == ["2019Q3", "2019Q4", "2020Q1", "2020Q2"]
    assert synthetic_ookla.parse_quarter_range("2019q1,2023Q4") == ["2019Q1", "2023Q4"]
    assert len(synthetic_ookla.parse_quarter_range("2019Q1..2023Q4")) == 20
