"""Reading Ookla tiles from Parquet, GeoJSON (zip), shapefile (zip) and URLs."""

from __future__ import annotations

import shutil
import socket
import zipfile
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely

from geodbk import paths
from geodbk.errors import DownloadError, InputDataError, ResourceLimitError
from geodbk.ingest.names import ookla_source
from geodbk.ingest.ookla import TILE_COLUMNS, ookla_url, parse_quarter, parse_service, read_tiles
from geodbk.ingest.quadkey import quadkey_bounds
from geodbk.ingest.sources import cache_path, download_limits, fetch

OOKLA_RAW_COLUMNS = ["quadkey", "tile", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]


def test_ookla_url_follows_the_bucket_layout():
    assert ookla_url("mobile", 2023, 4) == (
        "https://ookla-open-data.s3.amazonaws.com/parquet/performance/type=mobile/year=2023/"
        "quarter=4/2023-10-01_performance_mobile_tiles.parquet"
    )
    assert ookla_url("fixed", 2020, 2, "shapefile") == (
        "https://ookla-open-data.s3.amazonaws.com/shapefiles/performance/type=fixed/year=2020/"
        "quarter=2/2020-04-01_performance_fixed_tiles.zip"
    )
    for bad in [("cable", 2023, 1, "parquet"), ("mobile", 2023, 5, "parquet"), ("mobile", 2018, 1, "parquet"),
                ("mobile", 2023, 1, "csv")]:
        with pytest.raises(InputDataError):
            ookla_url(*bad)


def test_a_service_and_quarter_name_ookla_global_file():
    assert ookla_source("fixed:2023Q4") == ookla_source("FIXED:2023q4") == ookla_url("fixed", 2023, 4)
    assert ookla_source("mobile:2020Q1") == ookla_url("mobile", 2020, 1)
    for unchanged in ("data/fixed_2023Q4.parquet", "https://example.org/fixed:2023Q4", Path("fixed:2023Q4")):
        assert ookla_source(unchanged) == unchanged
    for bad in ("cable:2023Q4", "fixed:2018Q1", "fixed:2023Q5"):
        with pytest.raises(InputDataError):
            ookla_source(bad)


def test_a_file_named_like_a_quarter_is_read_as_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("fixed:2023Q4").write_bytes(b"")
    assert ookla_source("fixed:2023Q4") == "fixed:2023Q4"


@pytest.mark.parametrize(
    "name, quarter, service",
    [
        ("hawaii-state_ookla_2023Q4.geojson", (2023, 4), None),
        ("2021-07-01_performance_fixed_tiles.parquet", (2021, 3), "fixed"),
        ("parquet/performance/type=mobile/year=2022/quarter=1/x.parquet", (2022, 1), "mobile"),
        ("hawaii-state_mobile_geojson_2020Q3_2023Q4.zip/hawaii-state_ookla_2020Q3.geojson", (2020, 3), "mobile"),
        ("tiles.parquet", None, None),
    ],
)
def test_quarter_and_service_from_names(name, quarter, service):
    assert parse_quarter(name) == quarter
    assert parse_service(name) == service


def test_sample_parquet_is_normalised_and_drops_the_truncated_quarter(pr_tiles):
    assert list(pr_tiles.columns) == list(TILE_COLUMNS)
    assert pr_tiles.crs.to_epsg() == 4326
    assert len(pr_tiles) == 142_803 - 1_277
    assert pr_tiles.attrs["dropped"] == {"incomplete_quarter": 1_277, "invalid_value": 0, "no_tests": 0}
    assert not ((pr_tiles["year"] == 2020) & (pr_tiles["quarter"] == 2)).any()
    assert set(pr_tiles["service"]) == {"mobile"}
    kept = read_tiles(paths.PUERTO_RICO_MOBILE, drop_incomplete=False)
    assert len(kept) == 142_803 and kept.attrs["dropped"]["incomplete_quarter"] == 0


def test_geojson_zip_with_null_geometries_matches_the_parquet_sample():
    geo = read_tiles(paths.HAWAII_MOBILE_GEOJSON_ZIP)
    assert set(zip(geo["year"], geo["quarter"])) == {(2020, 3), (2023, 4)}
    assert set(geo["service"]) == {"mobile"}  # from the zip's name
    assert geo.geometry.notna().all()
    ref = read_tiles(paths.HAWAII_MOBILE)
    for year, quarter, n_null in [(2020, 3, 829), (2023, 4, 0)]:
        a = geo[(geo.year == year) & (geo.quarter == quarter)].set_index("quadkey").sort_index()
        b = ref[(ref.year == year) & (ref.quarter == quarter)].set_index("quadkey").sort_index()
        # 2023Q4 upstream holds one Puerto Rico tile that the sample removed.
        common = a.index.intersection(b.index)
        assert len(a) - len(common) == (0 if quarter == 3 else 1) and len(common) == len(b)
        for col in ["avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]:
            np.testing.assert_array_equal(a.loc[common, col].to_numpy(), b.loc[common, col].to_numpy())
        np.testing.assert_allclose(
            np.asarray(a.loc[common].geometry.bounds), quadkey_bounds(common.to_numpy(dtype=object)), atol=1e-9
        )
    raw = gpd.read_file(f"zip://{paths.HAWAII_MOBILE_GEOJSON_ZIP}!hawaii-state_ookla_2020Q3.geojson")
    assert raw.geometry.isna().sum() == 829  # the nulls that had to be rebuilt


@pytest.fixture(scope="module")
def ookla_schema_table(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """2023Q4 Puerto Rico tiles in Ookla's own Parquet schema and file name."""
    df = pd.read_parquet(paths.PUERTO_RICO_MOBILE)
    df = df[(df.year == 2023) & (df.quarter == 4)][OOKLA_RAW_COLUMNS].reset_index(drop=True)
    path = tmp_path_factory.mktemp("ookla") / "2023-10-01_performance_mobile_tiles.parquet"
    df.to_parquet(path)
    return path, df


def test_ookla_own_parquet_schema(ookla_schema_table):
    path, df = ookla_schema_table
    tiles = read_tiles(path)
    assert len(tiles) == len(df)
    assert (tiles["year"] == 2023).all() and (tiles["quarter"] == 4).all() and (tiles["service"] == "mobile").all()
    np.testing.assert_array_equal(tiles["avg_u_kbps"].to_numpy(), df["avg_u_kbps"].to_numpy(dtype=float))
    ref = shapely.from_wkt(df["tile"].to_numpy())
    assert shapely.equals_exact(tiles.geometry.to_numpy(), ref, tolerance=0).all()


def test_geoparquet_round_trip(pr_tiles_2023q4, tmp_path):
    path = tmp_path / "tiles.parquet"
    pr_tiles_2023q4.to_crs(3857).to_parquet(path)  # GeoParquet with a projected CRS
    back = read_tiles(path)
    pd.testing.assert_frame_equal(
        pd.DataFrame(back.drop(columns="geometry")), pd.DataFrame(pr_tiles_2023q4.drop(columns="geometry"))
    )
    np.testing.assert_allclose(
        np.asarray(back.geometry.bounds), np.asarray(pr_tiles_2023q4.geometry.bounds), rtol=0, atol=1e-9
    )


def test_missing_tile_column_rebuilds_polygons_and_quarter_can_be_given(ookla_schema_table, tmp_path):
    _, df = ookla_schema_table
    path = tmp_path / "tiles.parquet"
    df.drop(columns="tile").to_parquet(path)
    with pytest.raises(InputDataError, match="quarter"):
        read_tiles(path, service="mobile")
    tiles = read_tiles(path, year=2023, quarter=4, service="mobile")
    np.testing.assert_allclose(
        np.asarray(tiles.geometry.bounds), np.asarray(shapely.bounds(shapely.from_wkt(df["tile"]))), atol=1e-9
    )


def test_shapefile_zip_in_another_crs_is_reprojected(ookla_schema_table, tmp_path):
    _, df = ookla_schema_table
    gdf = gpd.GeoDataFrame(df.drop(columns="tile").head(300), geometry=gpd.GeoSeries.from_wkt(df["tile"].head(300)), crs=4326)
    shp_dir = tmp_path / "shp"
    shp_dir.mkdir()
    gdf.to_crs(3857).to_file(shp_dir / "gis_osm_tiles.shp")
    zpath = tmp_path / "2023-10-01_performance_mobile_tiles.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in shp_dir.iterdir():
            zf.write(f, f.name)
    tiles = read_tiles(zpath)
    assert len(tiles) == 300 and tiles.crs.to_epsg() == 4326
    assert (tiles["quarter"] == 4).all()
    np.testing.assert_allclose(np.asarray(tiles.geometry.bounds), np.asarray(gdf.geometry.bounds), atol=1e-8)


@pytest.mark.filterwarnings("ignore:'crs' was not provided")
def test_geometry_without_crs_is_refused(ookla_schema_table, tmp_path):
    _, df = ookla_schema_table
    gdf = gpd.GeoDataFrame(df.drop(columns="tile").head(10), geometry=gpd.GeoSeries.from_wkt(df["tile"].head(10)))
    path = tmp_path / "tiles_2023Q4_mobile.shp"
    gdf.to_file(path)
    assert not path.with_suffix(".prj").exists()
    with pytest.raises(InputDataError, match="no CRS"):
        read_tiles(path)


def test_missing_columns_are_named(ookla_schema_table, tmp_path):
    _, df = ookla_schema_table
    path = tmp_path / "tiles_2023Q4_mobile.parquet"
    df.drop(columns=["avg_lat_ms", "devices"]).to_parquet(path)
    with pytest.raises(InputDataError, match=r"avg_lat_ms.*devices"):
        read_tiles(path)


def test_missing_quadkey_is_an_error(ookla_schema_table, tmp_path):
    _, df = ookla_schema_table
    bad = df.head(20).copy()
    bad.loc[3, "quadkey"] = None
    path = tmp_path / "tiles_2023Q4_mobile.parquet"
    bad.to_parquet(path)
    with pytest.raises(InputDataError, match="1 row"):
        read_tiles(path)


@pytest.mark.parametrize("name", ["tiles_2023Q4_mobile.parquet", "tiles_2023Q4_mobile.geojson", "tiles.zip"])
def test_corrupt_files_give_clear_errors(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"PAR1 this is not really a file \x00\x01\x02" * 10)
    with pytest.raises(InputDataError, match="cannot read"):
        read_tiles(path)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(InputDataError, match="not found"):
        read_tiles(tmp_path / "nope.parquet")
    (tmp_path / "tiles.csv").write_text("quadkey\n0\n")
    with pytest.raises(InputDataError, match="unsupported"):
        read_tiles(tmp_path / "tiles.csv")


# --- URLs against a loopback HTTP server -----------------------------------------------------


@pytest.fixture(scope="module")
def http_root(tmp_path_factory, loopback):
    """``(base_url, requests)``: a 127.0.0.1 server over a folder with the Hawaii GeoJSON zip and
    Parquet sample."""
    root = tmp_path_factory.mktemp("www")
    for sample in (paths.HAWAII_MOBILE_GEOJSON_ZIP, paths.HAWAII_MOBILE):
        shutil.copy(sample, root / sample.name)
    return loopback(root)


def test_url_is_downloaded_once_then_cached(http_root, tmp_path):
    base, requests = http_root
    url = f"{base}/{paths.HAWAII_MOBILE_GEOJSON_ZIP.name}"
    before = len(requests)
    tiles = read_tiles(url, cache_dir=tmp_path)
    assert len(requests) == before + 1
    local = read_tiles(paths.HAWAII_MOBILE_GEOJSON_ZIP)
    pd.testing.assert_frame_equal(pd.DataFrame(tiles.drop(columns="geometry")), pd.DataFrame(local.drop(columns="geometry")))
    cached = fetch(url, tmp_path)
    assert cached == cache_path(url, tmp_path) and cached.parent.parent == tmp_path
    assert cached.read_bytes() == paths.HAWAII_MOBILE_GEOJSON_ZIP.read_bytes()
    again = read_tiles(url, cache_dir=tmp_path)
    assert len(requests) == before + 1  # cache hit: no second request
    assert len(again) == len(tiles)
    assert not list(tmp_path.rglob("*.part"))


def test_a_parquet_url_is_downloaded_once_then_streamed_like_the_local_file(http_root, tmp_path):
    from geodbk.dataset.spatial_dataset import build_dataset

    base, requests = http_root
    url = f"{base}/{paths.HAWAII_MOBILE.name}"
    before = len(requests)
    streamed = build_dataset(url, "HI", quarters="2023Q4", cache_dir=tmp_path)
    again = build_dataset(url, "HI", quarters="2023Q4", cache_dir=tmp_path)
    assert len(requests) == before + 1
    local = build_dataset(paths.HAWAII_MOBILE, "HI", quarters="2023Q4")
    for dataset in (streamed, again):
        pd.testing.assert_frame_equal(dataset.frame, local.frame)
        assert dataset.dropped == local.dropped


def test_http_errors_and_truncated_downloads_leave_nothing(http_root, tmp_path):
    base, _ = http_root
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(f"{base}/missing_2023Q4.parquet", tmp_path)
    with pytest.raises(DownloadError, match="closed after 1000 of 100000"):
        fetch(f"{base}/truncated/tiles_2023Q4.parquet", tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_unreachable_url_raises_download_error(tmp_path):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match="cannot download"):
        read_tiles(f"http://127.0.0.1:{port}/2023-10-01_performance_mobile_tiles.parquet", cache_dir=tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_garbage_200_body_is_refused_and_not_cached(http_root, tmp_path):
    base, requests = http_root
    url = f"{base}/garbage/tiles_2023Q4_mobile.parquet"
    before = len(requests)
    for attempt in (1, 2):  # refused each time, and asked for again each time: nothing was cached
        with pytest.raises(DownloadError, match="not a Parquet file"):
            fetch(url, tmp_path)
        assert len(requests) == before + attempt
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_bad_cached_download_is_fetched_again(http_root, tmp_path):
    base, requests = http_root
    url = f"{base}/{paths.HAWAII_MOBILE_GEOJSON_ZIP.name}"
    stale = cache_path(url, tmp_path)
    stale.parent.mkdir(parents=True)
    stale.write_text("<html>cached by an older geodbk</html>")
    before = len(requests)
    assert fetch(url, tmp_path).read_bytes() == paths.HAWAII_MOBILE_GEOJSON_ZIP.read_bytes()
    assert len(requests) == before + 1


def test_download_size_cap_and_deadline_name_their_flags(http_root, tmp_path):
    base, _ = http_root
    with pytest.raises(ResourceLimitError, match="--max-download-mb"):
        fetch(f"{base}/huge/tiles_2023Q4_mobile.parquet", tmp_path)
    with download_limits(max_bytes=1000), pytest.raises(ResourceLimitError, match="--max-download-mb"):
        fetch(f"{base}/garbage/tiles_2023Q4_mobile.parquet", tmp_path)
    with download_limits(deadline_s=0.3), pytest.raises(ResourceLimitError, match="--download-deadline"):
        fetch(f"{base}/slow/tiles_2023Q4_mobile.parquet", tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
