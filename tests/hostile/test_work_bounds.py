"""Hostile sizes of the work (issue 35, classes 3 to 5): memory and time bounded by the work, not
by the input, and requests that would give an empty or meaningless result refused in one line.

* ``summarize`` plans its memory from the largest polygon's joint covariance and refuses a
  polygon above the plan's limit, naming ``--resolution`` (a Puerto Rico-sized polygon at the
  default 0.005 degrees, or small squares at 10 m, passed 4 GiB); a whole-region polygon at a
  resolution within the plan stays within the limit it prints.
* ``--dask-scheduler local:N`` is capped by the machine's cores; an address where an HTTP server
  listens is refused within the connection deadline instead of hanging.
* A Parquet file of 30 million copies of one row is refused in its first batch, within a 3 GiB
  address space (it was killed at 4 GiB after 53 s).
* ``--change Q:Q``, a resolution larger than the region, and run folders the dashboard cannot show
  are refused before any work.

The memory cases run ``geodbk`` in a child process under ``RLIMIT_AS``, so a missing bound shows
as a refusal about memory (or a kill), never as the test machine running out of memory.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import geopandas as gpd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely

from geodbk import paths
from geodbk.cli import main
from geodbk.errors import InputDataError, ResourceLimitError
from geodbk.fit.fitting import fit_dataset
from geodbk.ingest.regions import load_region
from geodbk.ingest.scan import BATCH_ROWS
from geodbk.maps import parallel
from geodbk.maps.schema import GRID_VALUE_BUDGET
from geodbk.maps.summaries import JOINT_VARIANCE_BUDGET, joint_variance_bytes, most_cells, plan_summary
from geodbk.viewer import check_run_folder

COARSE = ("--resolution", "0.1", "--no-progress")
#: Runs ``geodbk`` with argv[1:] and prints the peak RSS (kB) as stderr's last line.
RUNNER = """import resource, sys
from geodbk.cli import main
try:
    status = main(sys.argv[1:])
finally:
    print(f"peak-rss-kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
sys.exit(status)
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_dataset) -> Path:
    """A small sv-rbf model of Puerto Rico 2023Q4, its dataset, the region as one polygon, two
    2 km squares of San Juan, and a ``geodbk fit`` run folder (no maps)."""
    root = tmp_path_factory.mktemp("hostile-work")
    fit_dataset(pr_dataset, "sv-rbf", hidden=16, rank=16, epochs=1, progress=False, device="cpu").save(root / "sv.pt")
    pr_dataset.save(root / "dataset.parquet")
    gpd.GeoDataFrame({"name": ["PR"]}, geometry=[load_region("PR").geometry], crs=4326).to_file(
        root / "pr.geojson", driver="GeoJSON", engine="pyogrio"
    )
    squares = [shapely.box(-66.10, 18.40, -66.08, 18.42), shapely.box(-66.00, 18.40, -65.99, 18.41)]
    gpd.GeoDataFrame({"name": ["a", "b"]}, geometry=squares, crs=4326).to_file(
        root / "squares.geojson", driver="GeoJSON", engine="pyogrio"
    )
    assert main(["fit", "--dataset", str(root / "dataset.parquet"), "--out", str(root / "fit-run"), "--models", "knn",
                 "--epochs", "1", "--no-progress"]) == 0
    (root / "out").mkdir()
    return root


def _limited(argv: list[str], limit: int, timeout: float = 300) -> tuple[int, str, list[str], int]:
    """``geodbk argv`` in a child whose address space is capped at ``limit`` bytes:
    ``(status, stdout, stderr lines, peak RSS in bytes)``."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run([sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = done.stderr.strip().splitlines()
    peak = [line for line in lines if line.startswith("peak-rss-kb ")]
    errors = [line for line in lines if not line.startswith("peak-rss-kb ") and ": warning:" not in line]
    return done.returncode, done.stdout, errors, int(peak[-1].split()[1]) * 1024 if peak else -1


# --- summarize: the largest polygon's joint covariance ------------------------------------------
def _summarize(root: Path, polygons: str, *extra: str) -> list[str]:
    return ["summarize", "--model", str(root / "sv.pt"), "--polygons", str(root / polygons),
            "--out", str(root / "out" / "summary.csv"), "--no-progress", *extra]


@pytest.mark.parametrize(("polygons", "extra"), [("pr.geojson", ()), ("squares.geojson", ("--resolution", "10m"))],
                         ids=["the region at 0.005 degrees", "2 km squares at 10 m"])
def test_summarize_refuses_a_polygon_above_the_memory_plan(root, polygons, extra):
    status, _, errors, _ = _limited(_summarize(root, polygons, *extra), GRID_VALUE_BUDGET)
    assert status == 2 and len(errors) == 1, errors
    assert "joint covariance plans" in errors[0] and "--resolution" in errors[0], errors[0]
    assert not (root / "out" / "summary.csv").exists()


def test_summarize_over_the_whole_region_stays_within_the_limit_it_prints(root):
    status, stdout, errors, peak = _limited(_summarize(root, "pr.geojson", "--resolution", "0.02"), GRID_VALUE_BUDGET)
    assert status == 0, errors
    plan = next(line for line in stdout.splitlines() if line.startswith("memory plan:"))
    assert f"half of the {GRID_VALUE_BUDGET / 2**30:.3g} GiB limit" in plan, plan
    assert 0 < peak <= GRID_VALUE_BUDGET
    (root / "out" / "summary.csv").unlink()


def test_the_coarser_resolution_the_refusal_names_fits_the_plan(root):
    polygons = gpd.read_file(root / "pr.geojson")
    with pytest.raises(ResourceLimitError, match=r"e\.g\. (\S+)$") as refused:
        plan_summary(polygons, 0.005)
    suggested = float(str(refused.value).rsplit(" ", 1)[1])
    plan = plan_summary(polygons, suggested)
    assert plan.planned <= JOINT_VARIANCE_BUDGET and plan.cells > most_cells() // 2


def test_the_plan_holds_what_a_polygon_takes(root):
    """Measured drift guard: the memory one polygon of about 2,900 cells adds (the peak RSS over a
    one-cell polygon's) is within its plan, with the sv-rbf model's kernel tile and residual field."""
    script = f"""import resource, geopandas as gpd, pyproj, shapely
from geodbk.fit.geomodel import GeoModel
from geodbk.maps.summaries import SummaryJob, plan_summary
model = GeoModel.load({str(root / "sv.pt")!r})
job = SummaryJob(model, None, None, pyproj.CRS(4326))
def box(side):
    return gpd.GeoDataFrame(geometry=[shapely.box(-66.10, 18.38, -66.10 + side, 18.38 + side)], crs=4326)
job(plan_summary(box(0.0005), "10m").blocks[0])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
plan = plan_summary(box(0.005), "10m")
job(plan.blocks[0])
print(plan.cells, plan.planned, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    cells, planned, taken = map(int, done.stdout.split())
    assert cells > 2000 and planned == joint_variance_bytes(cells)
    assert taken <= planned, f"{cells} cells took {taken / 2**20:.0f} MiB, planned {planned / 2**20:.0f} MiB"


# --- Dask schedulers ----------------------------------------------------------------------------
def test_a_local_cluster_is_capped_by_the_cores(hostile, root):
    most = max(parallel.DEFAULT_LOCAL_WORKERS, parallel.machine_cores())
    for argv in (["predict", "--model", str(root / "sv.pt"), "--out", str(root / "out" / "g.zarr"), *COARSE],
                 _summarize(root, "pr.geojson", "--resolution", "0.1")):
        outcome = hostile([*argv, "--dask-scheduler", "local:10000"], root, expect="refused")
        assert f"use local:{most} or fewer" in outcome.stderr[-1], outcome.stderr[-1]


def test_an_http_port_is_refused_within_the_connection_deadline(hostile, root, loopback, monkeypatch):
    monkeypatch.setattr(parallel, "CONNECT_TIMEOUT", 2.0)
    base, _ = loopback(root)
    address = base.replace("http://", "tcp://")
    start = time.perf_counter()
    outcome = hostile(["predict", "--model", str(root / "sv.pt"), "--out", str(root / "out" / "g.zarr"), *COARSE,
                       "--dask-scheduler", address], root, expect="refused")
    assert "cannot reach the Dask scheduler" in outcome.stderr[-1] and "within 2 s" in outcome.stderr[-1]
    assert time.perf_counter() - start < 30


# --- a Parquet file of one row 30 million times -------------------------------------------------
def _copies_of_one_row(path: Path, rows: int) -> None:
    """``rows`` copies of the sample's first row (without its polygon) in row groups of a million."""
    one = pq.read_table(paths.PUERTO_RICO_MOBILE).slice(0, 1).drop_columns(["tile"])
    group = pa.concat_tables([pa.concat_tables([one] * 1000).combine_chunks()] * 1000).combine_chunks()
    with pq.ParquetWriter(path, group.schema) as writer:
        for start in range(0, rows, len(group)):
            writer.write_table(group.slice(0, min(len(group), rows - start)))


def test_a_file_of_one_row_repeated_is_refused_in_its_first_batch(tmp_path):
    path = tmp_path / "repeated.parquet"
    _copies_of_one_row(path, 30_000_000)
    assert path.stat().st_size < 4 << 20
    start = time.perf_counter()
    status, _, errors, _ = _limited(["ingest", "--tiles", str(path), "--region", "PR", "--out",
                                     str(tmp_path / "d.parquet")], 3 << 30)
    assert status == 2 and len(errors) == 1, errors
    assert f"{BATCH_ROWS - 1} duplicate" in errors[0], errors[0]  # the first batch's other rows
    assert time.perf_counter() - start < 120 and not (tmp_path / "d.parquet").exists()


# --- requests with an empty or meaningless result -----------------------------------------------
REFUSED: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "change of a quarter to itself": (
        lambda r: ["predict", "--model", str(r / "sv.pt"), "--out", str(r / "out" / "g.nc"), *COARSE,
                   "--change", "2023Q4:2023q4"], "two different quarters"),
    "resolution 1e300": (
        lambda r: ["predict", "--model", str(r / "sv.pt"), "--out", str(r / "out" / "g.nc"), "--resolution", "1e300"],
        "finer --resolution"),
    "resolution 3 degrees": (
        lambda r: ["predict", "--model", str(r / "sv.pt"), "--out", str(r / "out" / "g.nc"), "--resolution", "3"],
        "finer --resolution"),
    "resolution 1e300 m": (
        lambda r: ["predict", "--model", str(r / "sv.pt"), "--out", str(r / "out" / "g.nc"), "--resolution", "1e300m"],
        "finer --resolution"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_empty_or_meaningless_maps_are_refused(hostile, root, case):
    make, phrase = REFUSED[case]
    outcome = hostile(make(root), root, expect="refused")
    assert phrase in outcome.stderr[-1], outcome.stderr[-1]
    assert not (root / "out" / "g.nc").exists()


# --- run folders for the dashboard --------------------------------------------------------------
@pytest.mark.parametrize(("make", "phrase"), [
    (lambda r: r / "no-such-run", "no run folder"),
    (lambda r: r / "sv.pt", "is a file"),
    (lambda r: r / "out", "not a run folder"),
    (lambda r: r / "fit-run", "no maps to show"),
], ids=["missing", "a file", "an empty folder", "a fit folder without maps"])
def test_a_run_folder_the_dashboard_cannot_show_is_refused(root, make, phrase):
    with pytest.raises(InputDataError, match=phrase) as refused:
        check_run_folder(make(root))
    assert "\n" not in str(refused.value)


def test_a_run_folder_with_a_map_is_shown(root, tmp_path):
    run = tmp_path / "run"
    assert main(["fit", "--dataset", str(root / "dataset.parquet"), "--out", str(run), "--models", "sv-rbf",
                 "--epochs", "1", "--hidden", "16", "--rank", "16", "--no-progress"]) == 0
    assert main(["predict", "--model", str(run / "models" / "sv-rbf.pt"), "--out", str(run / "maps" / "sv-rbf.nc"),
                 *COARSE]) == 0
    check_run_folder(run)
