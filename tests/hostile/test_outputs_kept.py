"""Hostile cases of the outputs (issue 35, classes 2, 4 and 5): a folder geodbk wrote keeps what is
not geodbk's, an output is a regular file or folder and nothing else, and a write that fails or is
hung up midway says so in one line and leaves no temporary.

* ``demo`` into an existing run folder refuses without ``--overwrite``; with it, it replaces only
  the files it writes, as ``fit`` does (earlier models and a user's ``notes.txt`` stay);
* a Zarr store holding files that are not the store's is refused as an output;
* a FIFO, a device (``/dev/null`` included) or a symlink to one is refused as an output;
* a NetCDF (or GeoTIFF, GeoJSON, Parquet) write stopped by the file size limit is one line, and its
  temporary is removed; so is SIGHUP midway (unless SIGHUP is ignored, as under ``nohup``);
* two outputs of one ``export`` at one path, and a ``--out`` that is not UTF-8, are refused in one line.

Each case runs in a fresh copy (hard links) of a module folder: a demo run folder (``demo``, one
knn model), a ``fit`` run folder of a dnn model on the demo's dataset (``run``) and knn grids
written by ``predict`` (NetCDF and Zarr).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from geodbk.cli import main
from geodbk.errors import OutputExistsError
from geodbk.fileio import check_output
from geodbk.workflow import RunFolder

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
COARSE = ("--resolution", "0.1", "--no-progress")
#: A knn demo of one quarter on a coarse grid (a few seconds).
DEMO = ("--models", "knn", "--epochs", "1", "--quarters", "2023Q4", "--resolution", "0.1", "--device", "cpu",
        "--no-progress")


def demo(out: Path, *extra: str) -> list[str]:
    return ["demo", "--out", str(out), "--target", "download", *DEMO, *extra]


def predict(w: Path, out: Path | str) -> list[str]:
    return ["predict", "--model", str(w / "demo" / "models" / "knn.pt"), "--out", str(out), *COARSE]


def export_grid(flag: str, grid: str = "grid.nc") -> Callable[[Path, Path | str], list[str]]:
    return lambda w, out: ["export", "--grid", str(w / grid), flag, str(out)]


def export_tiles(w: Path, out: Path | str) -> list[str]:
    return ["export", "--model", str(w / "demo" / "models" / "knn.pt"), "--dataset",
            str(w / "demo" / "dataset.parquet"), "--test-tiles", str(out)]


def summarize(w: Path, out: Path | str) -> list[str]:
    (w / "p.geojson").write_text('{"type": "FeatureCollection", "features": []}')
    return ["summarize", "--model", str(w / "demo" / "models" / "knn.pt"), "--polygons", str(w / "p.geojson"),
            "--out", str(out)]


def fit(w: Path, out: Path | str) -> list[str]:
    return ["fit", "--dataset", str(w / "demo" / "dataset.parquet"), "--out", str(out), "--models", "knn", "--epochs",
            "1", "--device", "cpu", "--no-progress"]


def ingest(w: Path, out: Path | str) -> list[str]:
    return ["ingest", "--quarters", "2023Q4", "--out", str(out)]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-kept")
    assert main(demo(root / "demo")) == 0
    assert main(["fit", "--dataset", str(root / "demo" / "dataset.parquet"), "--out", str(root / "run"), "--models",
                 "dnn", "--epochs", "1", "--device", "cpu", "--no-progress"]) == 0
    for grid in ("grid.nc", "grid.zarr"):
        assert main(predict(root, root / grid)) == 0
    return root


@pytest.fixture
def work(base, linked_copy) -> Path:
    """A fresh copy of the module folder."""
    return linked_copy(base)


def notes(folder: Path) -> Path:
    """A user's file in a folder geodbk wrote: ``echo precious > RUN/notes.txt``."""
    (folder / "notes.txt").write_text("precious\n")
    return folder / "notes.txt"


# --- demo into a run folder: refused without --overwrite, and then only its own files replaced ----------
@pytest.mark.parametrize("folder", ["demo", "run"], ids=["its-own-demo-folder", "a-fit-run-folder"])
def test_demo_into_an_existing_run_folder_needs_overwrite(hostile, work, folder: str) -> None:
    notes(work / folder)
    outcome = hostile(demo(work / folder), work, expect="refused")
    assert "holds a run already" in outcome.stderr[-1] and "--overwrite" in outcome.stderr[-1], outcome.stderr


def test_demo_overwrite_replaces_only_its_own_files_in_its_demo_folder(hostile, work) -> None:
    run = RunFolder(work / "demo")
    kept, project = notes(run.root), run.root / "maps" / "mine.qgz"
    project.write_bytes(b"a user's QGIS project")
    old_model = run.model("knn").read_bytes()
    hostile(demo(run.root, "--seed", "3", "--overwrite"), work, may_change=[run.root], expect="ok")
    assert kept.read_text() == "precious\n" and project.read_bytes() == b"a user's QGIS project"
    assert run.model("knn").read_bytes() != old_model  # another seed: another split, another model file
    assert sorted(pd.read_csv(run.metrics_csv)["model"].unique()) == ["knn"]


def test_demo_overwrite_keeps_the_models_fitted_earlier_into_a_run_folder(hostile, work) -> None:
    run = RunFolder(work / "run")
    kept = notes(run.root)
    earlier = run.model("dnn").read_bytes()
    hostile(demo(run.root, "--overwrite"), work, may_change=[run.root], expect="ok")
    assert kept.read_text() == "precious\n" and run.model("dnn").read_bytes() == earlier
    for path in (run.model("knn"), run.map_netcdf("knn"), run.map_geotiff("knn"), run.test_tiles("knn")):
        assert path.is_file() and path.stat().st_size > 0, path
    assert sorted(pd.read_csv(run.metrics_csv)["model"].unique()) == ["dnn", "knn"]  # as fit merges them


def test_demo_overwrite_refuses_a_run_folder_of_another_region_before_fitting(hostile, work, monkeypatch) -> None:
    import geodbk.workflow

    monkeypatch.setattr(geodbk.workflow, "fit_dataset", lambda *a, **k: pytest.fail("fitted before the check"))
    outcome = hostile(demo(work / "run", "--region", "HI", "--overwrite"), work, expect="refused")
    assert "Hawaii" in outcome.stderr[-1] and "another run folder" in outcome.stderr[-1], outcome.stderr


def test_a_demo_that_fails_midway_leaves_no_folder(hostile, work, monkeypatch) -> None:
    import geodbk.workflow

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(geodbk.workflow, "fit_dataset", interrupted)
    hostile(demo(work / "outputs" / "new"), work, expect="refused")
    assert not (work / "outputs" / "new").exists()


# --- a Zarr store that holds files that are not the store's --------------------------------------------
def a_user_file(store: Path) -> Path:
    return notes(store)


def a_nested_user_file(store: Path) -> Path:
    (store / "mean" / "c" / "README").write_text("precious\n")
    return store / "mean" / "c" / "README"


def a_hidden_file(store: Path) -> Path:
    (store / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    return store / ".DS_Store"


def a_user_folder(store: Path) -> Path:
    (store / "figures").mkdir()
    (store / "figures" / "map.png").write_bytes(b"\x89PNG")
    return store / "figures" / "map.png"


FOREIGN: dict[str, Callable[[Path], Path]] = {
    "notes": a_user_file, "nested": a_nested_user_file, "hidden": a_hidden_file, "folder": a_user_folder,
}
ZARR_WRITERS = {"predict": predict, "export": export_grid("--zarr")}


@pytest.mark.parametrize("foreign", list(FOREIGN))
@pytest.mark.parametrize("writer", list(ZARR_WRITERS))
def test_a_zarr_store_holding_foreign_files_is_refused(hostile, work, writer: str, foreign: str) -> None:
    store = work / "out.zarr"
    shutil.copytree(work / "grid.zarr", store)
    kept = FOREIGN[foreign](store)
    outcome = hostile(ZARR_WRITERS[writer](work, store), work, expect="refused")
    assert "not the store's" in outcome.stderr[-1] and kept.name in outcome.stderr[-1], outcome.stderr
    assert "--overwrite" in outcome.stderr[-1]


@pytest.mark.parametrize("writer", list(ZARR_WRITERS))
def test_overwrite_replaces_a_zarr_store_holding_foreign_files_as_a_whole(hostile, work, writer: str) -> None:
    store = work / "out.zarr"
    shutil.copytree(work / "grid.zarr", store)
    notes(store)
    hostile(ZARR_WRITERS[writer](work, store) + ["--overwrite"], work, may_change=[store], expect="ok")
    assert (store / "zarr.json").is_file() and not (store / "notes.txt").exists()


# --- outputs that are not regular files ---------------------------------------------------------------
def a_fifo(path: Path) -> None:
    os.mkfifo(path)


def a_device(path: Path) -> None:
    """A character device like /dev/null (1, 3), made in the test's folder."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")


def a_symlink_to_a_fifo(path: Path) -> None:
    a_fifo(path.parent / "pipe")
    path.symlink_to(path.parent / "pipe")


def a_symlink_to_dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


SPECIAL: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (a_fifo, "a FIFO"), "device": (a_device, "a character device"),
    "symlink-to-fifo": (a_symlink_to_a_fifo, "a FIFO"), "symlink-to-dev-null": (a_symlink_to_dev_null, "a character"),
}
SPECIAL_WRITERS: dict[str, tuple[Callable[[Path, Path | str], list[str]], str]] = {
    "predict-nc": (predict, "out.nc"),
    "predict-zarr": (predict, "out.zarr"),
    "export-geotiff": (export_grid("--geotiff"), "out.tif"),
    "export-netcdf": (export_grid("--netcdf", "grid.zarr"), "out.nc"),
    "export-zarr": (export_grid("--zarr"), "out.zarr"),
    "export-tiles": (export_tiles, "out.geojson"),
    "summarize": (summarize, "out.csv"),
    "fit": (fit, "out-run"),
    "demo": (lambda w, out: demo(Path(out)), "out-demo"),
}


def special_kind(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


@pytest.mark.timeout(120)  # a write that opened the FIFO would block forever
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
@pytest.mark.parametrize("scene", list(SPECIAL))
@pytest.mark.parametrize("writer", list(SPECIAL_WRITERS))
def test_an_output_that_is_not_a_regular_file_is_refused(hostile, work, writer: str, scene: str,
                                                         overwrite: bool) -> None:
    make_argv, name = SPECIAL_WRITERS[writer]
    out = work / name
    setup, what = SPECIAL[scene]
    setup(out)
    before = special_kind(out)
    outcome = hostile(make_argv(work, out) + (["--overwrite"] if overwrite else []), work, expect="refused")
    assert what in outcome.stderr[-1] and "not a regular file" in outcome.stderr[-1], outcome.stderr
    assert special_kind(out) == before


@pytest.mark.timeout(120)
def test_fit_refuses_a_fifo_inside_its_run_folder_before_training(hostile, work) -> None:
    os.unlink(work / "run" / "metrics.csv")
    a_fifo(work / "run" / "metrics.csv")
    outcome = hostile(fit(work, work / "run") + ["--overwrite"], work, expect="refused")
    assert "a FIFO" in outcome.stderr[-1]


@pytest.mark.parametrize("name", ["/dev/null", "/dev/zero"])
@pytest.mark.parametrize("kind", [None, "zarr", "run"])
def test_dev_null_and_its_kin_are_refused_even_with_overwrite(name: str, kind: str | None) -> None:
    """Checked without running a writer: on a machine where the tests run as root, a writer would
    otherwise stage its temporary in /dev and rename it over the device."""
    with pytest.raises(OutputExistsError, match="not a regular file"):
        check_output(name, kind=kind, overwrite=True, name="--out")


# --- the file size limit (``ulimit -f``) and a full disk midway ------------------------------------------
LIMITED = {
    "predict-nc": (predict, "big.nc"),
    "export-netcdf": (export_grid("--netcdf", "grid.zarr"), "big.nc"),
    "export-geotiff": (export_grid("--geotiff"), "big.tif"),
    "export-tiles-geojson": (export_tiles, "big.geojson"),
    "export-tiles-parquet": (export_tiles, "big.parquet"),
    "demo": (lambda w, out: demo(Path(out)), "big-demo"),
}
LIMIT_BYTES = 4 * 1024


def limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, resource.RLIM_INFINITY))


LIMITED_CASES = [(writer, existing) for writer in LIMITED for existing in (False, True)
                 if not (writer == "demo" and existing)]


@pytest.mark.parametrize(("writer", "existing"), LIMITED_CASES,
                         ids=[f"{w}-{'replacing' if e else 'new'}" for w, e in LIMITED_CASES])
def test_a_write_stopped_by_the_file_size_limit_is_one_line_and_leaves_no_temporary(
    work, writer: str, existing: bool
) -> None:
    make_argv, name = LIMITED[writer]
    out = work / name
    if existing:
        out.write_bytes(b"an older output\n")
    proc = subprocess.run([sys.executable, "-m", "geodbk", *make_argv(work, out)], env=ENV, capture_output=True,
                          timeout=300, preexec_fn=limit_file_size)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "file size limit" in lines[0] and name in lines[0] and "internal error" not in lines[0], lines
    assert not list(work.rglob("*.tmp")), list(work.rglob("*.tmp"))
    if existing:
        assert out.read_bytes() == b"an older output\n"
    elif writer == "demo":
        assert not out.exists()


# --- SIGHUP midway --------------------------------------------------------------------------------------
SLOW_EXPORT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rioxarray.raster_array import RasterArray
    to_raster = RasterArray.to_raster

    def slow(self, path, *args, **kwargs):  # the staged GeoTIFF is written, then the process waits
        to_raster(self, path, *args, **kwargs)
        Path(sys.argv[1]).touch()
        deadline = time.monotonic() + 60
        while not Path(sys.argv[2]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    RasterArray.to_raster = slow
    from geodbk.cli import main
    sys.exit(main(sys.argv[3:]))
    """
)


def ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize("nohup", [False, True], ids=["hung-up", "under-nohup"])
def test_sighup_midway_removes_the_temporary_in_one_line(work, nohup: bool) -> None:
    out = work / "map.tif"
    out.write_bytes(b"an older map\n")
    started, release = work / "started", work / "release"
    argv = export_grid("--geotiff")(work, out)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, str(started), str(release), *argv], env=ENV,
                            stderr=subprocess.PIPE, preexec_fn=ignore_sighup if nohup else None)
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    release.touch()
    _, err = proc.communicate(timeout=60)
    lines = err.decode().strip().splitlines()
    if nohup:  # a hangup the user asked to ignore: the export finishes
        assert proc.returncode == 0 and out.read_bytes()[:2] in (b"II", b"MM"), lines
    else:
        assert proc.returncode == 128 + signal.SIGHUP and len(lines) == 1 and "SIGHUP" in lines[0], lines
        assert out.read_bytes() == b"an older map\n"
    assert sorted(p.name for p in work.glob("*map.tif*")) == ["map.tif"]


# --- two outputs of one export at one path --------------------------------------------------------------
SAME_PATH: dict[str, Callable[[Path], list[str]]] = {
    "geotiff-and-netcdf": lambda w: ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(w / "out"),
                                     "--netcdf", str(w / "out")],
    "netcdf-and-zarr": lambda w: ["export", "--grid", str(w / "grid.nc"), "--netcdf", str(w / "out.zarr"),
                                  "--zarr", str(w / "out.zarr")],
    "geotiff-inside-the-zarr": lambda w: ["export", "--grid", str(w / "grid.nc"), "--geotiff",
                                          str(w / "out.zarr" / "map.tif"), "--zarr", str(w / "out.zarr")],
    "netcdf-and-tiles-spelled-apart": lambda w: [*export_tiles(w, w / "x.parquet"), "--grid", str(w / "grid.zarr"),
                                                 "--netcdf", str(w / "demo" / ".." / "x.parquet")],
}


@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
@pytest.mark.parametrize("case", list(SAME_PATH))
def test_two_outputs_of_one_export_at_one_path_are_refused(hostile, work, case: str, overwrite: bool) -> None:
    before = sorted(p.name for p in work.iterdir())
    outcome = hostile(SAME_PATH[case](work) + (["--overwrite"] if overwrite else []), work, expect="refused")
    assert "own path" in outcome.stderr[-1], outcome.stderr
    assert sorted(p.name for p in work.iterdir()) == before


# --- a --out that is not UTF-8 ----------------------------------------------------------------------------
NOT_UTF8: dict[str, tuple[Callable[[Path, Path | str], list[str]], str]] = {
    "predict-nc": (predict, ".nc"),
    "predict-zarr": (predict, ".zarr"),
    "export-geotiff": (export_grid("--geotiff"), ".tif"),
    "export-netcdf": (export_grid("--netcdf", "grid.zarr"), ".nc"),
    "export-zarr": (export_grid("--zarr"), ".zarr"),
    "export-tiles-geojson": (export_tiles, ".geojson"),
    "export-tiles-parquet": (export_tiles, ".parquet"),
    "summarize": (summarize, ".csv"),
    "fit": (fit, "-run"),
    "demo": (lambda w, out: demo(Path(out)), "-demo"),
    "ingest": (ingest, ".parquet"),
}


@pytest.mark.parametrize("writer", list(NOT_UTF8))
def test_an_output_name_that_is_not_utf8_is_one_line(hostile, work, writer: str) -> None:
    make_argv, suffix = NOT_UTF8[writer]
    out = os.fsdecode(os.fsencode(work) + b"/caf\xe9" + suffix.encode())  # Latin-1 'café', as a shell passes it
    outcome = hostile(make_argv(work, out), work, expect="refused")
    assert "UTF-8" in outcome.stderr[-1] and "caf\\xe9" in outcome.stderr[-1], outcome.stderr
    assert not [p for p in os.listdir(os.fsencode(work)) if b"caf" in p]
