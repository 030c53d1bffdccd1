"""Issue 35's last hostile cases, each of which failed before its fix:

* ``serve --run`` on a missing folder, a file, or a ``geodbk fit`` folder without maps started the
  server; it now exits at once with one line (``geodbk.viewer.catalog.check_run_folder``).
* ``demo --resolution 1e300`` (no cell inside the region) and ``demo --change 2023Q4:2023Q4`` were
  refused after the fitting, or not at all; they are now refused before it.
* A zip of 3,000 empty GeoJSON files as ``--region`` or ``--tiles`` took half a minute to refuse;
  a zip of more than 256 members is now refused at once.
* A Zarr v2 grid with a pickled object variable was refused, then asyncio printed tracebacks of
  its pending tasks at exit; it is now refused from its metadata, before zarr opens it.
* A download that is not the file it claims quoted its first 16 bytes in the refusal; it now says
  what it looks like and quotes none of it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numcodecs
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from geodbk.cli import main

COARSE = ("--resolution", "0.1", "--no-progress")
RAW = ["quadkey", "year", "quarter", "service", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]
#: Seconds a refused ``serve`` may take (imports included): a started server runs until killed.
SERVE_TIMEOUT_S = 90
#: Passwd-like text a server sends for a Parquet file: no refusal may quote it.
SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_dataset, pr_tiles_2023q4) -> Path:
    """A ``geodbk fit`` run folder of an sv-rbf model (no maps), its grid as NetCDF (with a
    reference point, so it holds text labels) and as a Zarr v2 store, a small tile file, and
    a folder for outputs."""
    root = tmp_path_factory.mktemp("hostile-leftovers")
    pr_dataset.save(root / "dataset.parquet")
    assert main(["fit", "--dataset", str(root / "dataset.parquet"), "--out", str(root / "fit-run"), "--models",
                 "sv-rbf", "--epochs", "1", "--hidden", "16", "--rank", "16", "--no-progress"]) == 0
    assert main(["predict", "--model", str(root / "fit-run" / "models" / "sv-rbf.pt"), "--out", str(root / "grid.nc"),
                 "--ref", "a:-66.1,18.4", *COARSE]) == 0
    with xr.open_dataset(root / "grid.nc", decode_coords="all") as grid:
        for name in grid.variables:  # the NetCDF encoding is not Zarr's; keep the CRS link
            mapping = grid[name].encoding.get("grid_mapping")
            grid[name].encoding = {"grid_mapping": mapping} if mapping else {}
        grid.to_zarr(root / "v2.zarr", zarr_format=2, mode="w", consolidated=False)
    pd.DataFrame(pr_tiles_2023q4[RAW].iloc[::20]).reset_index(drop=True).to_parquet(root / "tiles.parquet")
    (root / "out").mkdir()
    return root


# --- serve: a run folder the dashboard cannot show --------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("make", "phrase"), [
    (lambda r: r / "no-such-run", "no run folder"),
    (lambda r: r / "dataset.parquet", "is a file"),
    (lambda r: r / "fit-run", "no maps to show"),
], ids=["missing", "a file", "a fit folder without maps"])
def test_serve_refuses_a_run_it_cannot_show_before_the_server_starts(root, make, phrase):
    argv = [sys.executable, "-m", "geodbk", "serve", "--run", str(make(root)), "--port", str(_free_port())]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SERVE_TIMEOUT_S,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the server started: {expired.stderr!r}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("geodbk serve: error:") and phrase in lines[0], lines


# --- demo: an empty grid or a change of a quarter to itself, before the fitting -----------------
@pytest.mark.parametrize(("extra", "phrase"), [
    (("--resolution", "1e300"), "finer --resolution"),
    (("--change", "2023Q4:2023Q4"), "two different quarters"),
], ids=["resolution 1e300", "change of a quarter to itself"])
def test_demo_refuses_a_meaningless_map_before_fitting(hostile, root, monkeypatch, extra, phrase):
    import geodbk.workflow

    def fitted(*args, **kwargs):
        pytest.fail("the demo started fitting")

    monkeypatch.setattr(geodbk.workflow, "run_demo", fitted)
    start = time.perf_counter()
    outcome = hostile(["demo", "--out", str(root / "out" / "demo"), "--no-progress", *extra], root, expect="refused")
    assert phrase in outcome.stderr[-1], outcome.stderr[-1]
    assert time.perf_counter() - start < 30
    assert not (root / "out" / "demo").exists()


# --- zips of thousands of members ----------------------------------------------------------------
@pytest.fixture(scope="module")
def many(root) -> Path:
    """A zip of 3,000 empty GeoJSON feature collections (about 300 KB)."""
    path = root / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(3000):
            archive.writestr(f"{i}.geojson", '{"type":"FeatureCollection","features":[]}')
    return path


@pytest.mark.parametrize("option", ["--region", "--tiles"])
def test_a_zip_of_thousands_of_members_is_refused_at_once(hostile, root, many, option):
    inputs = {"--tiles": str(root / "tiles.parquet"), "--region": "PR", option: str(many)}
    out = root / "out" / "d.parquet"
    start = time.perf_counter()
    outcome = hostile(["ingest", "--tiles", inputs["--tiles"], "--region", inputs["--region"], "--out", str(out)], root,
                      expect="refused")
    assert time.perf_counter() - start < 5
    assert "3,000 members, more than the 256" in outcome.stderr[-1], outcome.stderr[-1]


# --- a Zarr grid with a pickled variable -------------------------------------------------------
def _object_variable(store: Path, codec: str) -> None:
    """Add to Zarr v2 ``store`` a variable ``label`` of two strings, as Python objects through
    ``codec``: ``"pickle"`` or the text codec ``"vlen-utf8"``."""
    (store / "label").mkdir()
    labels = np.array(["a", "b"], dtype=object)
    meta = {"zarr_format": 2, "shape": [2], "chunks": [2], "dtype": "|O", "compressor": None, "fill_value": None,
            "filters": [{"id": codec}], "order": "C", "dimension_separator": "."}
    (store / "label" / ".zarray").write_text(json.dumps(meta))
    (store / "label" / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["label"]}))
    chunk = pickle.dumps(labels, protocol=4) if codec == "pickle" else numcodecs.VLenUTF8().encode(labels)
    (store / "label" / "0").write_bytes(chunk)


def test_a_zarr_grid_of_pickled_objects_is_refused_in_one_line(root, tmp_path):
    store = tmp_path / "pickled.zarr"
    shutil.copytree(root / "v2.zarr", store)
    _object_variable(store, "pickle")
    argv = [sys.executable, "-m", "geodbk", "export", "--grid", str(store), "--netcdf", str(tmp_path / "g.nc")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("geodbk export: error:") and "variable label" in lines[0] and "'|O'" in lines[0]
    assert not (tmp_path / "g.nc").exists()


def test_zarr_grids_with_text_labels_are_still_read(hostile, root, tmp_path):
    store = tmp_path / "text.zarr"
    shutil.copytree(root / "v2.zarr", store)
    _object_variable(store, "vlen-utf8")
    hostile(["export", "--grid", str(store), "--netcdf", str(tmp_path / "v2.nc")], tmp_path, may_change=[tmp_path],
            expect="ok")
    with xr.open_dataset(tmp_path / "v2.nc") as grid:
        assert list(grid["label"].values) == ["a", "b"] and list(grid["ref"].values) == ["a"]
    hostile(["export", "--grid", str(root / "grid.nc"), "--zarr", str(tmp_path / "v3.zarr")], tmp_path,
            may_change=[tmp_path], expect="ok")
    hostile(["export", "--grid", str(tmp_path / "v3.zarr"), "--netcdf", str(tmp_path / "v3.nc")], tmp_path,
            may_change=[tmp_path], expect="ok")
    with xr.open_dataset(tmp_path / "v3.nc") as grid:
        assert list(grid["ref"].values) == ["a"]


def test_a_zarr_grid_whose_arrays_name_no_dimensions_is_refused_in_one_line(hostile, root, tmp_path):
    """A store written by zarr alone (no ``_ARRAY_DIMENSIONS``): xarray's KeyError was an internal error."""
    store = tmp_path / "bare.zarr"
    shutil.copytree(root / "v2.zarr", store)
    for attrs in store.glob("*/.zattrs"):
        attrs.write_text("{}")
    outcome = hostile(["export", "--grid", str(store), "--netcdf", str(tmp_path / "g.nc")], tmp_path, expect="refused")
    assert "not a store xarray wrote" in outcome.stderr[-1], outcome.stderr[-1]
    assert not (tmp_path / "g.nc").exists()


# --- a download that is not the file it claims ---------------------------------------------------
def test_a_bad_download_is_described_not_quoted(hostile, root, loopback, tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    (www / "tiles_2023Q4_mobile.parquet").write_bytes(SECRET)
    base, requests = loopback(www)
    outcome = hostile(["ingest", "--tiles", f"{base}/tiles_2023Q4_mobile.parquet", "--region", "HI", "--cache-dir",
                       str(tmp_path / "cache"), "--out", str(root / "out" / "d.parquet")], root, expect="refused")
    assert requests == ["/tiles_2023Q4_mobile.parquet"]
    assert "not a Parquet file (it starts with text)" in outcome.stderr[-1], outcome.stderr[-1]
    assert "root:x" not in outcome.stderr[-1]
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
