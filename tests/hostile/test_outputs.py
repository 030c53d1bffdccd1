"""Hostile cases of the outputs (issue 19, findings 1 and 3): whatever stands at an output path,
a command replaces only its own kind of thing, never one of its inputs, and refuses the rest in
one line unless given --overwrite.

Each case runs in a fresh copy (hard links) of a module folder of real files: a knn model, its
dataset, a Hawaii dataset, grids written by ``geodbk predict`` (NetCDF and Zarr) and a run folder
written by ``geodbk fit``. A scene then puts something at the output path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from geodbk.cli import main
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.fit.fitting import fit_dataset
from geodbk.workflow import RunFolder

COARSE = ("--resolution", "0.1", "--no-progress")


@pytest.fixture(scope="module")
def base(tmp_path_factory, pr_dataset) -> Path:
    root = tmp_path_factory.mktemp("hostile-outputs")
    model = fit_dataset(pr_dataset, "knn", epochs=1, progress=False, device="cpu")
    model.save(root / "knn.pt")
    pr_dataset.save(root / "dataset.parquet")
    load_sample_dataset("HI", quarters=["2023Q4"]).save(root / "hawaii.parquet")
    for grid in ("grid.nc", "grid.zarr"):
        assert main(["predict", "--model", str(root / "knn.pt"), "--out", str(root / grid), *COARSE]) == 0
    assert main(fit(root, root / "run")) == 0
    return root


@pytest.fixture
def work(base, linked_copy) -> Path:
    """A fresh copy of the module folder."""
    return linked_copy(base)


# --- scenes: what stands at the output path before the command ---------------------------------
def nothing(path: Path) -> None:
    """The output path is free."""


def a_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"an older output\n")


def a_folder(path: Path) -> None:
    """A user's folder: ``mkdir keep && echo x > keep/notes.txt``."""
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("precious\n")


def an_empty_folder(path: Path) -> None:
    path.mkdir(parents=True)


def a_nested_folder(path: Path) -> None:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "thesis.tex").write_text("precious\n")


def a_symlink_to_a_folder(path: Path) -> None:
    target = path.parent / "elsewhere"
    a_folder(target)
    path.symlink_to(target, target_is_directory=True)


def a_file_as_parent(path: Path) -> None:
    """A file stands where the output's parent folder should be."""
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.write_text("a file, not a folder\n")


SCENES: dict[str, Callable[[Path], None]] = {
    "free": nothing, "file": a_file, "folder": a_folder, "empty-folder": an_empty_folder,
    "nested-folder": a_nested_folder, "symlink-to-folder": a_symlink_to_a_folder, "parent-is-file": a_file_as_parent,
}
#: What a file output does in each scene: replaced or refused (a symlink is replaced, not the folder it
#: points to); --overwrite replaces any but a parent that is a file.
FILE_OUTPUT = {"free": "ok", "file": "ok", "folder": "refused", "empty-folder": "refused", "nested-folder": "refused",
               "symlink-to-folder": "ok", "parent-is-file": "refused"}


def ingest(w: Path, out: Path) -> list[str]:
    return ["ingest", "--quarters", "2023Q4", "--out", str(out)]


def predict(w: Path, out: Path) -> list[str]:
    return ["predict", "--model", str(w / "knn.pt"), "--out", str(out), *COARSE]


def export_geotiff(w: Path, out: Path) -> list[str]:
    return ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(out)]


def export_cog(w: Path, out: Path) -> list[str]:
    return ["export", "--grid", str(w / "grid.zarr"), "--geotiff", str(out), "--cog"]


def export_netcdf(w: Path, out: Path) -> list[str]:
    return ["export", "--grid", str(w / "grid.zarr"), "--netcdf", str(out)]


def export_zarr(w: Path, out: Path) -> list[str]:
    return ["export", "--grid", str(w / "grid.nc"), "--zarr", str(out)]


def export_tiles(w: Path, out: Path) -> list[str]:
    return ["export", "--model", str(w / "knn.pt"), "--dataset", str(w / "dataset.parquet"), "--test-tiles", str(out)]


def summarize(w: Path, out: Path) -> list[str]:
    return ["summarize", "--model", str(w / "knn.pt"), "--polygons", str(w / "none.geojson"), "--out", str(out)]


def fit(w: Path, out: Path, dataset: str = "dataset.parquet") -> list[str]:
    return ["fit", "--dataset", str(w / dataset), "--out", str(out), "--models", "knn", "--epochs", "1",
            "--device", "cpu", "--no-progress"]


def demo(w: Path, out: Path) -> list[str]:
    return ["demo", "--out", str(out), "--models", "knn", "--epochs", "1", "--quarters", "2023Q4", "--resolution",
            "0.1", "--device", "cpu", "--no-progress"]


FILE_WRITERS: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "ingest": (ingest, "out.parquet"),
    "predict-nc": (predict, "out.nc"),
    "export-geotiff": (export_geotiff, "out.tif"),
    "export-cog": (export_cog, "out.tif"),
    "export-netcdf": (export_netcdf, "out.nc"),
    "export-tiles-geojson": (export_tiles, "out.geojson"),
    "export-tiles-parquet": (export_tiles, "out.parquet"),
}
# ingest is the slow one (the whole sample is read): its free and file cases are covered by the others
FILE_CASES = [
    (writer, scene, overwrite)
    for writer in FILE_WRITERS
    for scene in SCENES
    for overwrite in (False, True)
    if not (writer == "ingest" and scene in ("free", "file") and overwrite)
]


@pytest.mark.parametrize(("writer", "scene", "overwrite"), FILE_CASES,
                         ids=[f"{w}-{s}{'-overwrite' if o else ''}" for w, s, o in FILE_CASES])
def test_a_file_output_replaces_only_a_file(hostile, work, writer: str, scene: str, overwrite: bool) -> None:
    make_argv, name = FILE_WRITERS[writer]
    out = work / "outputs" / name if scene == "parent-is-file" else work / name
    SCENES[scene](out)
    expect = FILE_OUTPUT[scene] if not overwrite or scene == "parent-is-file" else "ok"
    outcome = hostile(make_argv(work, out) + (["--overwrite"] if overwrite else []), work,
                      may_change=[out] if expect == "ok" else [], expect=expect)
    if expect == "ok":
        assert out.is_file() and out.stat().st_size > 0
    elif scene == "parent-is-file":
        assert "is a file, not a folder" in outcome.stderr[-1]
    else:
        assert "--overwrite" in outcome.stderr[-1]


# --- folder outputs: Zarr stores ---------------------------------------------------------------
def geodbk_zarr(w: Path, out: Path) -> None:
    shutil.copytree(w / "grid.zarr", out, copy_function=os.link)


def foreign_zarr(w: Path, out: Path) -> None:
    """A Zarr store geodbk did not write (its root attributes lack the marker)."""
    shutil.copytree(w / "grid.zarr", out, copy_function=shutil.copy2)
    meta = out / "zarr.json"
    meta.write_text(meta.read_text().replace('"geodbk_output"', '"someone_else"'))


ZARR_SCENES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "free": (lambda w, out: None, "ok"),
    "geodbk-store": (geodbk_zarr, "ok"),
    "empty-folder": (lambda w, out: an_empty_folder(out), "ok"),
    "foreign-store": (foreign_zarr, "refused"),
    "folder": (lambda w, out: a_folder(out), "refused"),
    "nested-folder": (lambda w, out: a_nested_folder(out), "refused"),
    "file": (lambda w, out: a_file(out), "refused"),
    "run-folder": (lambda w, out: shutil.copytree(w / "run", out, copy_function=os.link), "refused"),
    "parent-is-file": (lambda w, out: a_file_as_parent(out), "refused"),
}
ZARR_WRITERS = {"predict-zarr": predict, "export-zarr": export_zarr}
ZARR_CASES = [
    (writer, scene, overwrite) for writer in ZARR_WRITERS for scene in ZARR_SCENES for overwrite in (False, True)
]


@pytest.mark.parametrize(("writer", "scene", "overwrite"), ZARR_CASES,
                         ids=[f"{w}-{s}{'-overwrite' if o else ''}" for w, s, o in ZARR_CASES])
def test_a_zarr_output_replaces_only_a_geodbk_store(hostile, work, writer: str, scene: str, overwrite: bool) -> None:
    out = work / "outputs" / "out.zarr" if scene == "parent-is-file" else work / "out.zarr"
    setup, expect = ZARR_SCENES[scene]
    setup(work, out)
    if overwrite and scene != "parent-is-file":
        expect = "ok"
    hostile(ZARR_WRITERS[writer](work, out) + (["--overwrite"] if overwrite else []), work,
            may_change=[out] if expect == "ok" else [], expect=expect)
    if expect == "ok":
        assert (out / "zarr.json").is_file()


# --- an output that is, or holds, the command's own input ----------------------------------------
def own_run_as_zarr(w: Path) -> list[str]:
    """``geodbk predict --model run.zarr/models/knn.pt --out run.zarr`` (finding 1)."""
    shutil.copytree(w / "run", w / "run.zarr", copy_function=os.link)
    return ["predict", "--model", str(w / "run.zarr" / "models" / "knn.pt"), "--out", str(w / "run.zarr"), *COARSE]


def own_dataset_run(w: Path) -> list[str]:
    """``--dataset run.zarr/dataset.parquet --out run.zarr``."""
    shutil.copytree(w / "run", w / "run.zarr", copy_function=os.link)
    return predict(w, w / "run.zarr") + ["--dataset", str(w / "run.zarr" / "dataset.parquet")]


OWN_INPUT: dict[str, Callable[[Path], list[str]]] = {
    "predict-onto-its-run": own_run_as_zarr,
    "predict-onto-its-model": lambda w: ["predict", "--model", str(w / "knn.nc"), "--out", str(w / "knn.nc"), *COARSE],
    "predict-onto-the-run-of-its-dataset": own_dataset_run,
    "export-zarr-onto-its-grid": lambda w: ["export", "--grid", str(w / "grid.zarr"), "--zarr", str(w / "grid.zarr")],
    "export-netcdf-onto-its-grid": lambda w: ["export", "--grid", str(w / "grid.nc"), "--netcdf", str(w / "grid.nc")],
    "export-geotiff-onto-its-grid": lambda w: ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(w / "grid.nc")],
    "export-tiles-onto-its-dataset": lambda w: export_tiles(w, w / "dataset.parquet"),
    "export-tiles-onto-its-model": lambda w: export_tiles(w, w / "knn.pt"),
    "export-zarr-onto-the-folder-of-its-grid": lambda w: ["export", "--grid", str(w / "grid.nc"), "--zarr", str(w)],
    "ingest-onto-its-tiles": lambda w: ["ingest", "--tiles", str(w / "tiles.parquet"),
                                        "--out", str(w / "tiles.parquet")],
    "summarize-onto-its-polygons": lambda w: ["summarize", "--model", str(w / "knn.pt"), "--polygons",
                                              str(w / "p.geojson"), "--out", str(w / "p.geojson")],
}


@pytest.mark.parametrize("case", list(OWN_INPUT))
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
def test_an_output_never_replaces_its_own_input(hostile, work, case: str, overwrite: bool) -> None:
    (work / "knn.nc").write_bytes((work / "grid.nc").read_bytes())  # a grid named like the model, for one case
    (work / "p.geojson").write_text('{"type": "FeatureCollection", "features": []}')
    (work / "tiles.parquet").write_bytes(b"PAR1 tiles of some region")
    outcome = hostile(OWN_INPUT[case](work) + (["--overwrite"] if overwrite else []), work, expect="refused")
    assert "would replace the input" in outcome.stderr[-1], outcome.stderr


# --- fit into a run folder (finding 3) -----------------------------------------------------------
def run_with_model_folder(w: Path) -> Path:
    shutil.copytree(w / "run", w / "r", copy_function=os.link)
    (w / "r" / "models" / "knn.pt").unlink()
    a_folder(w / "r" / "models" / "knn.pt")
    return w / "r"


def run_with_metrics_folder(w: Path) -> Path:
    shutil.copytree(w / "run", w / "r", copy_function=os.link)
    (w / "r" / "metrics.csv").unlink()
    a_folder(w / "r" / "metrics.csv")
    return w / "r"


def run_with_metrics(text: str) -> Callable[[Path], Path]:
    def scene(w: Path) -> Path:
        shutil.copytree(w / "run", w / "r", copy_function=os.link)
        (w / "r" / "metrics.csv").unlink()
        (w / "r" / "metrics.csv").write_text(text)
        return w / "r"

    return scene


def legacy_run(w: Path) -> Path:
    """A run folder of a geodbk without markers: only run entries."""
    shutil.copytree(w / "run", w / "r", copy_function=os.link)
    (w / "r" / ".geodbk").unlink(missing_ok=True)
    return w / "r"


def foreign_folder(w: Path) -> Path:
    a_folder(w / "r")
    return w / "r"


def file_at_run(w: Path) -> Path:
    a_file(w / "r")
    return w / "r"


def parent_is_file(w: Path) -> Path:
    a_file_as_parent(w / "p" / "r")
    return w / "p" / "r"


FIT_CASES: dict[str, tuple[Callable[[Path], Path], str, str, str]] = {
    # name: (scene -> run folder, dataset file, expect, expect with --overwrite)
    "new-folder": (lambda w: w / "r", "dataset.parquet", "ok", "ok"),
    "empty-folder": (lambda w: (w / "r").mkdir() or w / "r", "dataset.parquet", "ok", "ok"),
    "own-run": (lambda w: w / "run", "dataset.parquet", "ok", "ok"),
    "legacy-run": (legacy_run, "dataset.parquet", "ok", "ok"),
    "model-path-is-a-folder": (run_with_model_folder, "dataset.parquet", "refused", "ok"),
    "metrics-path-is-a-folder": (run_with_metrics_folder, "dataset.parquet", "refused", "ok"),
    "foreign-folder": (foreign_folder, "dataset.parquet", "refused", "ok"),
    "file-at-run": (file_at_run, "dataset.parquet", "refused", "refused"),
    "parent-is-file": (parent_is_file, "dataset.parquet", "refused", "refused"),
    "run-of-another-region": (lambda w: w / "run", "hawaii.parquet", "refused", "refused"),
    "metrics-not-a-table": (run_with_metrics('a,"b\n\xff'), "dataset.parquet", "refused", "refused"),
    "metrics-of-something-else": (run_with_metrics("x,y\n1,2\n"), "dataset.parquet", "refused", "refused"),
    "metrics-empty": (run_with_metrics(""), "dataset.parquet", "refused", "refused"),
}


@pytest.mark.parametrize("case", list(FIT_CASES))
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
def test_fit_adds_to_a_run_folder_and_refuses_the_rest(hostile, work, case: str, overwrite: bool) -> None:
    scene, dataset, expect, expect_forced = FIT_CASES[case]
    run = scene(work)
    expect = expect_forced if overwrite else expect
    argv = fit(work, run, dataset) + (["--overwrite"] if overwrite else [])
    outcome = hostile(argv, work, may_change=[run] if expect == "ok" else [], expect=expect)
    if expect == "ok":
        assert RunFolder(run).model("knn").is_file() and (run / ".geodbk").is_file()
        assert sorted(pd.read_csv(RunFolder(run).metrics_csv)["model"].unique()) == ["knn"]
    elif case == "run-of-another-region":
        assert "Hawaii" in outcome.stderr[-1] and "Puerto Rico" in outcome.stderr[-1]


# --- the demo replaces its run folder as a whole: only one geodbk wrote ----------------------------
DEMO_SCENES = {"folder": a_folder, "nested-folder": a_nested_folder, "file": a_file,
               "parent-is-file": a_file_as_parent, "symlink-to-folder": a_symlink_to_a_folder}


@pytest.mark.parametrize("scene", list(DEMO_SCENES))
def test_demo_refuses_an_output_it_did_not_write_before_fitting(hostile, work, scene: str) -> None:
    out = work / "outputs" / "demo"
    DEMO_SCENES[scene](out)
    outcome = hostile(demo(work, out), work, expect="refused")
    assert "--out" in outcome.stderr[-1] or "not a folder" in outcome.stderr[-1]


# --- summarize: checked before the model loads ----------------------------------------------------
SUMMARY_SCENES = {"folder": (a_folder, "--overwrite"), "empty-folder": (an_empty_folder, "--overwrite"),
                  "parent-is-file": (a_file_as_parent, "is a file"), "nested-folder": (a_nested_folder, "--overwrite")}


@pytest.mark.parametrize("suffix", [".csv", ".geojson", ".parquet"])
@pytest.mark.parametrize("scene", list(SUMMARY_SCENES))
def test_summarize_refuses_a_folder_at_its_output(hostile, work, scene: str, suffix: str) -> None:
    setup, match = SUMMARY_SCENES[scene]
    out = work / "outputs" / f"s{suffix}" if scene == "parent-is-file" else work / f"s{suffix}"
    setup(out)
    outcome = hostile(summarize(work, out), work, expect="refused")
    assert match in outcome.stderr[-1]
