"""Issue 35's last hostile cases, each of which failed before its fix:

* ``serve --run`` on a missing folder, a file, or a ``geodbk fit`` folder without maps started the
  server; it now exits at once with one line (``geodbk.viewer.catalog.check_run_folder``).
* ``demo --resolution 1e300`` (no cell inside the region) and ``demo --change 2023Q4:2023Q4`` were
  refused after the fitting, or not at all; they are now refused before it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geodbk.cli import main

#: Seconds a refused ``serve`` may take (imports included): a started server runs until killed.
SERVE_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_dataset) -> Path:
    """A ``geodbk fit`` run folder of an sv-rbf model (no maps), its dataset, and a folder for outputs."""
    root = tmp_path_factory.mktemp("hostile-leftovers")
    pr_dataset.save(root / "dataset.parquet")
    assert main(["fit", "--dataset", str(root / "dataset.parquet"), "--out", str(root / "fit-run"), "--models",
                 "sv-rbf", "--epochs", "1", "--hidden", "16", "--rank", "16", "--no-progress"]) == 0
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
