"""Hostile ingest inputs (issue 19): bad values, duplicates, unpublished quarters, disguised
files, VRTs, bad zips and bad URLs, as ``ingest``, ``summarize`` and ``serve`` command lines.

Every case runs through the ``hostile`` harness (tests/hostile/conftest.py): exit 0, or exit 2
with one error line; no pre-existing byte changed; no temporary left. On top of that:

* a bad value is dropped, never written: the dataset a case writes holds only finite speeds
  and latencies within the ingest rule's bounds and at least one test per row;
* a refusal names what was wrong (each case gives a phrase of the expected message);
* no VRT makes GDAL open what it names: the loopback server the VRTs point at sees no request.

No network: URLs go to a loopback ``http.server`` thread.
"""

from __future__ import annotations

import datetime
import json
import shutil
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geodbk import paths
from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import InputDataError
from geodbk.fit.fitting import fit_dataset
from geodbk.ingest.ookla import MAX_LATENCY_MS, MAX_SPEED_KBPS, as_tiles, current_quarter
from geodbk.ingest.regions import load_region

#: Raw Ookla columns written to the tile files.
RAW = ["quadkey", "year", "quarter", "service", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]
NOW = current_quarter()
FUTURE = NOW.shift(1)  # the quarter after the current one


# --- the loopback server the URLs and VRTs point at (tests/conftest.py) -------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, loopback):
    """``(base_url, requests)`` of a loopback server over a folder with real tile files."""
    www = tmp_path_factory.mktemp("www")
    shutil.copy(paths.HAWAII_MOBILE_GEOJSON_ZIP, www / "hi_mobile_tiles.zip")
    (www / "secret.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    return loopback(www)


# --- the folder of files ----------------------------------------------------------------------
def _vrt(source: str) -> str:
    return (f'<OGRVRTDataSource><OGRVRTLayer name="counties"><SrcDataSource>{source}</SrcDataSource>'
            '</OGRVRTLayer></OGRVRTDataSource>\n')


def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_tiles_2023q4, server) -> Path:
    """Real tile, region and polygon files, good and bad, in one folder."""
    base, _ = server
    root = tmp_path_factory.mktemp("hostile-inputs")
    good = pd.DataFrame(pr_tiles_2023q4[RAW].iloc[::20].reset_index(drop=True))  # 322 PR tiles of 2023Q4
    good.to_parquet(root / "tiles.parquet")
    for name, column, value in VALUE_FILES:
        bad = good.copy()
        bad[column] = bad[column].astype(str if isinstance(value, str) else np.float64)
        bad.loc[:9, column] = value
        bad.to_parquet(root / f"{name}.parquet")
    for name, year, quarter in QUARTER_FILES:
        bad = good.copy()
        bad.loc[:4, "year"], bad.loc[:4, "quarter"] = year, quarter
        bad.to_parquet(root / f"{name}.parquet")
    pd.concat([good, good.head(3)]).to_parquet(root / "duplicates.parquet")
    good.drop(columns=["year", "quarter"]).to_parquet(root / f"tiles_{FUTURE}_mobile.parquet")
    good.drop(columns=["year", "quarter"]).to_parquet(root / "tiles_2018Q4_mobile.parquet")
    good.drop(columns=["year", "quarter"]).to_parquet(root / "tiles_2023Q4_mobile.parquet")
    tiles = gpd.GeoDataFrame(good, geometry=pr_tiles_2023q4.geometry.iloc[::20].to_numpy(), crs=4326)
    tiles.to_file(root / "tiles.geojson", driver="GeoJSON", engine="pyogrio")
    tiles.to_file(root / "tiles.gpkg", driver="GPKG", engine="pyogrio")
    # regions and polygons
    pr = gpd.GeoDataFrame({"name": ["PR"]}, geometry=[load_region("PR").geometry], crs=4326)
    pr.to_file(root / "pr.geojson", driver="GeoJSON", engine="pyogrio")
    pr.to_file(root / "pr.gpkg", driver="GPKG", engine="pyogrio")
    pr.to_parquet(root / "pr.parquet")
    shp = root / "shp"
    shp.mkdir()
    pr.to_file(shp / "pr.shp", engine="pyogrio")
    _zip(root / "pr!region.zip", {p.name: p.read_bytes() for p in shp.iterdir()})
    _zip(root / "two_layers.zip", {f"{i}{p.suffix}": p.read_bytes() for i in "ab" for p in shp.iterdir()})
    shutil.copy(paths.HAWAII_MOBILE_GEOJSON_ZIP, root / "hi!mobile_tiles_2020Q3_2023Q4.zip")
    points = gpd.GeoDataFrame({"name": ["a"]}, geometry=gpd.points_from_xy([-66.1], [18.4]), crs=4326)
    points.to_file(root / "points.geojson", driver="GeoJSON", engine="pyogrio")
    (root / "empty_collection.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    # disguises: VRTs that point at the loopback server or at a local file, and other formats
    (root / "secret.csv").write_text("WKT,name\n\"POINT (0 0)\",secret\n")
    remote, local = _vrt(f"/vsicurl/{base}/secret.geojson"), _vrt(str(root / "secret.csv"))
    for name in ("counties.geojson", "counties.json", "counties.gpkg", "counties.vrt", "counties.parquet"):
        (root / name).write_text(remote)
    (root / "local.geojson").write_text(local)
    (root / "counties.shp").write_text(remote)
    _zip(root / "vrt_in_zip.zip", {"counties.geojson": remote.encode()})
    _zip(root / "vrt_as_shp.zip", {"counties.shp": remote.encode(), "counties.dbf": b""})
    _zip(root / "nothing.zip", {"readme.txt": b"no layers here"})
    (root / "html.parquet").write_text("<html><body>404</body></html>\n")
    (root / "html.zip").write_text("<html><body>404</body></html>\n")
    (root / "text.gpkg").write_text("not a geopackage\n")
    (root / "broken.geojson").write_text('{"type": "FeatureCollection", "features": [')
    (root / "empty.geojson").write_bytes(b"")
    (root / "tiles.csv").write_text(good.to_csv(index=False))
    (root / "noext").write_bytes((root / "tiles.parquet").read_bytes())
    (root / "folder.parquet").mkdir()
    (root / "out").mkdir()
    return root


# name, column, value written into the first 10 rows
VALUE_FILES = [
    ("down_inf", "avg_d_kbps", np.inf),
    ("down_minus_inf", "avg_d_kbps", -np.inf),
    ("down_1e300", "avg_d_kbps", 1e300),
    ("down_negative", "avg_d_kbps", -5.0),
    ("down_above_cap", "avg_d_kbps", 2 * MAX_SPEED_KBPS),
    ("down_nan", "avg_d_kbps", np.nan),
    ("down_text", "avg_d_kbps", "fast"),
    ("up_inf", "avg_u_kbps", np.inf),
    ("up_1e300", "avg_u_kbps", 1e300),
    ("up_negative", "avg_u_kbps", -1.0),
    ("latency_inf", "avg_lat_ms", np.inf),
    ("latency_huge", "avg_lat_ms", 10 * MAX_LATENCY_MS),
    ("latency_negative", "avg_lat_ms", -3.0),
    ("tests_zero", "tests", 0),
    ("tests_negative", "tests", -4),
    ("tests_nan", "tests", np.nan),
    ("tests_fraction", "tests", 2.5),
    ("tests_1e300", "tests", 1e300),
    ("tests_inf", "tests", np.inf),
    ("devices_negative", "devices", -1),
    ("devices_inf", "devices", np.inf),
]
# name, year, quarter written into the first 5 rows
QUARTER_FILES = [
    ("year_1900", 1900, 1),
    ("year_3023", 3023, 4),
    ("year_2018", 2018, 4),
    ("year_2099", 2099, 1),
    ("next_quarter", FUTURE.year, FUTURE.number),
    ("quarter_5", 2023, 5),
    ("quarter_0", 2023, 0),
]


def _tiles(name: str, *extra: str, region: str = "PR") -> Callable[[Path], list[str]]:
    return lambda r: ["ingest", "--tiles", str(r / name), "--region", region, *extra]


# --- bad values: dropped and counted, never written --------------------------------------------
@pytest.mark.parametrize("name", [v[0] for v in VALUE_FILES])
@pytest.mark.parametrize("target", ["download", "upload", "latency"])
def test_bad_values_are_dropped_not_written(hostile, root, name, target):
    out = root / "out" / f"{name}_{target}.parquet"
    argv = ["ingest", "--tiles", root / f"{name}.parquet", "--region", "PR", "--target", target, "--out", out]
    hostile(argv, root, may_change=[out], expect="ok")
    frame = SpatialDataset.load(out).frame
    assert len(frame) >= 312 - 10  # only the ten bad rows can go (and some zero targets)
    assert np.isfinite(frame["y"]).all() and (frame["tests"] >= 1).all() and (frame["devices"] >= 0).all()
    ceiling = MAX_LATENCY_MS if target == "latency" else MAX_SPEED_KBPS / 1000
    assert (frame["value"] > 0).all() and (frame["value"] <= ceiling).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    speed=st.floats(allow_nan=True, allow_infinity=True),
    latency=st.floats(allow_nan=True, allow_infinity=True),
    tests=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**40), 2**40)),
)
def test_any_value_is_kept_only_when_the_rule_allows_it(pr_tiles_2023q4, speed, latency, tests):
    raw = pd.DataFrame(pr_tiles_2023q4[RAW].head(3))
    raw["avg_d_kbps"] = [speed, 1000.0, 1000.0]
    raw["avg_lat_ms"] = [latency, 20.0, 20.0]
    raw["tests"] = np.array([tests, 1, 1], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the drop warning; counted below
        tiles = as_tiles(raw)
    dropped = tiles.attrs["dropped"]
    speed_ok = np.isnan(speed) or 0 <= speed <= MAX_SPEED_KBPS
    latency_ok = np.isnan(latency) or 0 <= latency <= MAX_LATENCY_MS
    tests_ok = np.isfinite(tests) and 1 <= tests <= 2**31 - 1 and float(tests).is_integer()
    assert len(tiles) == 3 - (not (speed_ok and latency_ok and tests_ok))
    assert dropped["invalid_value"] + dropped["no_tests"] == 3 - len(tiles)
    kept = tiles["avg_d_kbps"].dropna()
    assert np.isfinite(kept).all() and (kept >= 0).all() and (kept <= MAX_SPEED_KBPS).all()
    assert (tiles["tests"] >= 1).all()



# --- refused in one line -----------------------------------------------------------------------
REFUSED: dict[str, tuple[Callable[[Path], list], str]] = {
    # duplicates and quarters Ookla does not publish
    "duplicate rows": (_tiles("duplicates.parquet"), "duplicate"),
    "one file twice": (lambda r: ["ingest", "--tiles", r / "tiles.parquet", r / "tiles.parquet"], "duplicate"),
    "geojson and parquet of one quarter": (
        lambda r: ["ingest", "--tiles", r / "tiles.parquet", r / "tiles.geojson"], "duplicate"),
    **{f"rows of {name}": (_tiles(f"{name}.parquet"), "quarter") for name, *_ in QUARTER_FILES},
    "file named after the next quarter": (_tiles(f"tiles_{FUTURE}_mobile.parquet"), "published"),
    "file named 2018Q4": (_tiles("tiles_2018Q4_mobile.parquet"), "published"),
    "download of 2099Q1": (lambda r: ["ingest", "--service", "mobile", "--year", "2099", "--quarter", "1"],
                           "published"),
    "download of 2018Q4": (lambda r: ["ingest", "--service", "mobile", "--year", "2018", "--quarter", "4"],
                           "published"),
    "download of 1900Q1": (lambda r: ["ingest", "--service", "fixed", "--year", "1900", "--quarter", "1"],
                           "published"),
    "download of the next quarter": (
        lambda r: ["ingest", "--service", "mobile", "--year", str(FUTURE.year), "--quarter", str(FUTURE.number)],
        "published"),
    # disguised tile files: VRTs and other formats under a tile suffix
    "VRT as tiles.geojson": (_tiles("counties.geojson"), "not a GeoJSON"),
    "VRT as tiles.json": (_tiles("counties.json"), "not a GeoJSON"),
    "VRT of a local file as geojson": (_tiles("local.geojson"), "not a GeoJSON"),
    "VRT as tiles.gpkg": (_tiles("counties.gpkg"), "not a GPKG"),
    "VRT as tiles.shp": (_tiles("counties.shp"), "not a ESRI Shapefile"),
    "VRT as tiles.parquet": (_tiles("counties.parquet"), "not a Parquet"),
    "a .vrt tile file": (_tiles("counties.vrt"), "unsupported"),
    "VRT member of a zip": (_tiles("vrt_in_zip.zip"), "not a GeoJSON"),
    "VRT named .shp in a zip": (_tiles("vrt_as_shp.zip"), "not a ESRI Shapefile"),
    "zip without layers": (_tiles("nothing.zip"), "neither"),
    "HTML as parquet": (_tiles("html.parquet"), "not a Parquet"),
    "HTML as zip": (_tiles("html.zip"), "not a zip"),
    "text as geopackage": (_tiles("text.gpkg"), "not a GPKG"),
    "truncated geojson": (_tiles("broken.geojson"), "cannot read"),
    "empty geojson": (_tiles("empty.geojson"), "not a GeoJSON"),
    "csv tiles": (_tiles("tiles.csv"), "unsupported"),
    "no suffix": (_tiles("noext"), "unsupported"),
    "a folder": (_tiles("folder.parquet"), "not found"),
    "missing file": (_tiles("missing.parquet"), "not found"),
    "vsicurl path": (lambda r: ["ingest", "--tiles", "/vsicurl/http://127.0.0.1:9/x.parquet"], "virtual"),
    "vsizip path": (lambda r: ["ingest", "--tiles", f"/vsizip/{r}/vrt_in_zip.zip/counties.geojson"], "virtual"),
    "vsimem path": (lambda r: ["ingest", "--tiles", "/vsimem/x.geojson"], "virtual"),
    "driver prefix": (lambda r: ["ingest", "--tiles", "GeoJSON:/etc/passwd"], "unsupported"),
    "file URL": (lambda r: ["ingest", "--tiles", "file:///etc/passwd"], "unsupported"),
    "ftp URL": (lambda r: ["ingest", "--tiles", "ftp://127.0.0.1/x.parquet"], "not found"),
    # disguised region and urban-area files
    "VRT as region geojson": (_tiles("tiles.parquet", region="counties.geojson"), "not a GeoJSON"),
    "VRT of a local file as region": (_tiles("tiles.parquet", region="local.geojson"), "not a GeoJSON"),
    "VRT as region gpkg": (_tiles("tiles.parquet", region="counties.gpkg"), "not a GPKG"),
    "a .vrt region": (_tiles("tiles.parquet", region="counties.vrt"), "unsupported"),
    "VRT in a region zip": (_tiles("tiles.parquet", region="vrt_in_zip.zip"), "not a GeoJSON"),
    "HTML as region zip": (_tiles("tiles.parquet", region="html.zip"), "not a zip"),
    "region of points": (_tiles("tiles.parquet", region="points.geojson"), "polygons"),
    "region without features": (_tiles("tiles.parquet", region="empty_collection.geojson"), "no features"),
    "region zip of two layers": (_tiles("tiles.parquet", region="two_layers.zip"), "2 layers"),
    "region vsicurl": (_tiles("tiles.parquet", region="/vsicurl/http://127.0.0.1:9/r.geojson"), "virtual"),
    "VRT as urban areas": (_tiles("tiles.parquet", "--urban-areas", "counties.geojson"), "not a GeoJSON"),
    "VRT of a local file as urban areas": (_tiles("tiles.parquet", "--urban-areas", "local.geojson"),
                                           "not a GeoJSON"),
    "a .vrt as urban areas": (_tiles("tiles.parquet", "--urban-areas", "counties.vrt"), "unsupported"),
    "VRT zip as urban areas": (_tiles("tiles.parquet", "--urban-areas", "vrt_as_shp.zip"), "not a ESRI Shapefile"),
    "urban areas vsicurl": (_tiles("tiles.parquet", "--urban-areas", "/vsicurl/http://127.0.0.1:9/u.zip"),
                            "virtual"),
    "urban areas of points": (_tiles("tiles.parquet", "--urban-areas", "points.geojson"), "polygons"),
    # download limits
    "zero download cap": (_tiles("tiles.parquet", "--max-download-mb", "0"), "--max-download-mb"),
    "negative download deadline": (_tiles("tiles.parquet", "--download-deadline", "-1"), "--download-deadline"),
}


def _resolve(argv: list, root: Path) -> list[str]:
    """Names of files in ``root`` given to --region/--urban-areas become paths in it."""
    out = [str(a) for a in argv]
    for i, item in enumerate(out[:-1]):
        if item in ("--region", "--urban-areas") and (root / out[i + 1]).exists():
            out[i + 1] = str(root / out[i + 1])
    return out


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_hostile_ingest_inputs_are_refused_in_one_line(hostile, root, server, case):
    make, phrase = REFUSED[case]
    _, requests = server
    before = len(requests)
    outcome = hostile(_resolve(make(root), root), root, expect="refused")
    assert phrase.lower() in outcome.stderr[-1].lower(), outcome.stderr[-1]
    assert len(requests) == before, f"GDAL fetched {requests[before:]}"  # no VRT reached the server


# --- URLs: refused in one line, never cached when bad --------------------------------------------
URLS = {
    "404": (lambda b: [f"{b}/missing_2023Q4_mobile.parquet"], "HTTP 404"),
    "200 with an HTML body": (lambda b: [f"{b}/garbage/tiles_2023Q4_mobile.parquet"], "not a Parquet"),
    "200 with HTML for a zip": (lambda b: [f"{b}/garbage/tiles_2023Q4_mobile.zip"], "not a zip"),
    "larger than the cap": (lambda b: [f"{b}/huge/tiles_2023Q4_mobile.parquet"], "--max-download-mb"),
    "above a lowered cap": (lambda b: [f"{b}/hi_mobile_tiles.zip", "--max-download-mb", "0.01"], "--max-download-mb"),
    "unreachable port": (lambda b: ["http://127.0.0.1:9/tiles_2023Q4_mobile.parquet"], "cannot download"),
}


@pytest.mark.parametrize("case", list(URLS), ids=list(URLS))
def test_bad_urls_are_refused_and_not_cached(hostile, root, server, tmp_path, case):
    base, _ = server
    url, *extra = URLS[case][0](base)
    outcome = hostile(["ingest", "--tiles", url, "--region", "HI", "--cache-dir", tmp_path, *extra], root,
                      expect="refused")
    assert URLS[case][1].lower() in outcome.stderr[-1].lower()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


# --- what must keep working ----------------------------------------------------------------------
ACCEPTED: dict[str, Callable[[Path], list]] = {
    "plain parquet": _tiles("tiles.parquet"),
    "geojson tiles": _tiles("tiles.geojson"),
    "geopackage tiles": _tiles("tiles.gpkg"),
    "a ! in a tile zip name": lambda r: ["ingest", "--tiles", r / "hi!mobile_tiles_2020Q3_2023Q4.zip",
                                         "--region", "HI"],
    "a ! in a region zip name": _tiles("tiles.parquet", region="pr!region.zip"),
    "geojson region": _tiles("tiles.parquet", region="pr.geojson"),
    "geopackage region": _tiles("tiles.parquet", region="pr.gpkg"),
    "geoparquet region": _tiles("tiles.parquet", region="pr.parquet"),
    "urban areas from a zip with a !": _tiles("tiles.parquet", "--urban-areas", "pr!region.zip"),
    "urban areas from geojson": _tiles("tiles.parquet", "--urban-areas", "pr.geojson"),
    "the quarter of the name": _tiles("tiles_2023Q4_mobile.parquet"),
    "a quarter with bad rows dropped": _tiles("down_inf.parquet", "--quarters", "2023Q4"),
}


@pytest.mark.parametrize("case", list(ACCEPTED), ids=list(ACCEPTED))
def test_good_inputs_still_work(hostile, root, case):
    hostile(_resolve(ACCEPTED[case](root), root), root, expect="ok")


def test_a_good_url_is_read_once(hostile, root, server, tmp_path):
    base, requests = server
    before = len(requests)
    for _ in range(2):
        hostile(["ingest", "--tiles", f"{base}/hi_mobile_tiles.zip", "--region", "HI", "--quarters", "2023Q4",
                 "--cache-dir", tmp_path], root, expect="ok")
    assert len(requests) == before + 1


# --- polygon files of summarize and serve --------------------------------------------------------
POLYGONS = {
    "VRT as geojson": ("counties.geojson", "not a GeoJSON"),
    "VRT of a local file": ("local.geojson", "not a GeoJSON"),
    "VRT as gpkg": ("counties.gpkg", "not a GPKG"),
    "a .vrt": ("counties.vrt", "unsupported"),
    "VRT in a zip": ("vrt_in_zip.zip", "not a GeoJSON"),
    "VRT named .shp in a zip": ("vrt_as_shp.zip", "not a ESRI Shapefile"),
    "HTML as zip": ("html.zip", "not a zip"),
    "points": ("points.geojson", "polygons"),
    "missing": ("missing.geojson", "not found"),
    "vsicurl": ("/vsicurl/http://127.0.0.1:9/c.geojson", "virtual"),
}


@pytest.fixture(scope="module")
def knn_model(tmp_path_factory, pr_dataset) -> Path:
    path = tmp_path_factory.mktemp("knn") / "knn.pt"
    fit_dataset(pr_dataset, "knn", epochs=1, progress=False, device="cpu").save(path)
    return path


def _polygon_path(root: Path, name: str) -> str:
    return name if name.startswith("/vsi") else str(root / name)


@pytest.mark.parametrize("case", list(POLYGONS), ids=list(POLYGONS))
def test_summarize_refuses_hostile_polygon_files(hostile, root, server, knn_model, case):
    name, phrase = POLYGONS[case]
    _, requests = server
    before = len(requests)
    outcome = hostile(["summarize", "--model", knn_model, "--polygons", _polygon_path(root, name),
                       "--out", root / "out" / "summary.parquet"], root, expect="refused")
    assert phrase.lower() in outcome.stderr[-1].lower()
    assert len(requests) == before


@pytest.mark.parametrize("case", list(POLYGONS), ids=list(POLYGONS))
def test_serve_refuses_hostile_polygon_files_before_starting(hostile, root, server, monkeypatch, case):
    def no_server(*args, **kwargs):
        raise AssertionError("serve started the server")

    monkeypatch.setattr("os.execv", no_server)
    monkeypatch.setattr("subprocess.call", no_server)
    name, phrase = POLYGONS[case]
    _, requests = server
    before = len(requests)
    outcome = hostile(["serve", "--run", root, "--polygons", _polygon_path(root, name)], root, expect="refused")
    assert phrase.lower() in outcome.stderr[-1].lower()
    assert len(requests) == before


def test_the_vrt_is_what_gdal_would_have_followed(root, server):
    """The disguised VRT is a real one: handed to GDAL directly, it requests the server's file.
    (This is the SSRF the reader now refuses; it proves the cases above test something.)"""
    base, requests = server
    before = len(requests)
    try:
        gpd.read_file(root / "counties.geojson", engine="pyogrio")
    except Exception:  # the empty FeatureCollection behind it may not open as a layer
        pass
    assert any(r.endswith("secret.geojson") for r in requests[before:])


def test_published_span_moves_with_the_date():
    from geodbk.ingest.ookla import check_published

    check_published(np.array([2019]), np.array([1]), "f", today=datetime.date(2019, 1, 1))
    with pytest.raises(InputDataError, match="2019Q2"):
        check_published(np.array([2019]), np.array([2]), "f", today=datetime.date(2019, 3, 31))
    with pytest.raises(InputDataError, match="2018Q4"):
        check_published(np.array([2018]), np.array([4]), "f", today=datetime.date(2030, 1, 1))


@pytest.mark.parametrize("where", ["404", "unreachable"])
def test_a_password_in_a_url_is_not_echoed(hostile, root, server, tmp_path, where):
    base, _ = server
    host = base.removeprefix("http://") if where == "404" else "127.0.0.1:9"
    url = f"http://alice:hunter2@{host}/missing_2023Q4_mobile.parquet"
    outcome = hostile(["ingest", "--tiles", url, "--region", "PR", "--cache-dir", tmp_path], root, expect="refused")
    assert "hunter2" not in " ".join(outcome.stderr) and "***@" in outcome.stderr[-1]
