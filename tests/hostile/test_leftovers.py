"""Issue 35's last hostile cases, each of which failed before its fix:

* ``serve --run`` on a missing folder, a file, or a ``geodbk fit`` folder without maps started the
  server; it now exits at once with one line (``geodbk.viewer.catalog.check_run_folder``).
* ``demo --resolution 1e300`` (no cell inside the region) and ``demo --change 2023Q4:2023Q4`` were
  refused after the fitting, or not at all; they are now refused before it.
* A zip of 3,000 empty GeoJSON files as ``--region`` or ``--tiles`` took half a minute to refuse;
  a zip of more than 256 members is now refused at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from geodbk.cli import main

RAW = ["quadkey", "year", "quarter", "service", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]
#: Seconds a refused ``serve`` may take (imports included): a started server runs until killed.
SERVE_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_dataset, pr_tiles_2023q4) -> Path:
    """A ``geodbk fit`` run folder of an sv-rbf model (no maps), its dataset, a small tile file, and a
    folder for outputs."""
    root = tmp_path_factory.mktemp("hostile-leftovers")
    pr_dataset.save(root / "dataset.parquet")
    assert main(["fit", "--dataset", str(root / "dataset.parquet"), "--out", str(root / "fit-run"), "--models",
                 "sv-rbf", "--epochs", "1", "--hidden", "16", "--rank", "16", "--no-progress"]) == 0
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
