"""Every output is written atomically: a write that fails or is killed midway leaves the old
output (or nothing) at the target, and no partial file or folder a reader would open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import shapely
import xarray as xr

from geodbk.dataset.model_info import ModelInfo
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.fileio import MARKER, RUN_FOLDER, atomic_dir, atomic_path
from geodbk.fit.metrics import save_metrics
from geodbk.io.cubes import write_netcdf, write_zarr
from geodbk.io.geotiff import write_geotiff
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.maps.stores import open_grid
from geodbk.workflow import DemoConfig, RunFolder, run_demo

GRID = RegularGrid.over(shapely.Point(-66.5, 18.2).buffer(0.3), 0.02)


def visible(folder: Path) -> list[str]:
    """Entries a reader globbing the folder sees (hidden temporaries excluded)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def everything(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


class FailingModel:
    """Predicts a constant surface and raises on block ``fail_at`` (0-based): a crash midway."""

    info = ModelInfo("failing", target="download", units="Mbps")
    has_kernel = False
    latest_quarter = None  # time-free: maps the quarters a test names

    def __init__(self, value: float, fail_at: int | None = None) -> None:
        self.value, self.fail_at, self.blocks = value, fail_at, 0

    def predict_series(self, lonlat: np.ndarray, times) -> list:
        if self.blocks == self.fail_at:
            raise RuntimeError("injected failure midway")
        self.blocks += 1
        return [SimpleNamespace(mean=np.full(len(lonlat), self.value), sd=np.full(len(lonlat), 0.1)) for _ in times]


# --- the helpers ------------------------------------------------------------------------------
def test_atomic_path_keeps_the_old_file_on_failure_and_replaces_it_on_success(tmp_path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash")
    assert target.read_text() == "old" and everything(tmp_path) == ["out.csv"]
    with atomic_path(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"  # nothing at the target changes until the end
    assert target.read_text() == "new" and everything(tmp_path) == ["out.csv"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_atomic_dir_swaps_whole_folders_and_keeps_the_old_one_on_failure(tmp_path) -> None:
    target = tmp_path / "run"
    with atomic_dir(target, kind=RUN_FOLDER) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target, kind=RUN_FOLDER) as tmp:
        (tmp / "new.txt").write_text("half")
        raise RuntimeError("crash")
    assert (target / "sub" / "old.txt").read_text() == "old" and everything(tmp_path) == ["run"]
    with atomic_dir(target, kind=RUN_FOLDER) as tmp:
        (tmp / "new.txt").write_text("new")
        assert not (target / "new.txt").exists()
    assert everything(target) == [MARKER, "new.txt"] and everything(tmp_path) == ["run"]
    # an empty folder and a missing target are replaced too, and the folder appears whole
    (tmp_path / "empty").mkdir()
    for name in ("empty", "fresh"):
        with atomic_dir(tmp_path / name, kind=RUN_FOLDER) as tmp:
            (tmp / "a").write_text("a")
        assert everything(tmp_path / name) == [MARKER, "a"]


# --- an exception inside a sink's write -----------------------------------------------------
@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_failed_streaming_prediction_leaves_the_old_grid(tmp_path, suffix: str) -> None:
    target = tmp_path / f"grid{suffix}"
    predict_grid(FailingModel(1.0), GRID, chunk_rows=3, store=target, progress=False).close()
    before = everything(tmp_path)
    with pytest.raises(RuntimeError, match="injected"):
        predict_grid(FailingModel(2.0, fail_at=2), GRID, chunk_rows=3, store=target, progress=False)
    assert everything(tmp_path) == before == [target.name]
    old = open_grid(target).load()
    assert np.nanmax(old["mean"].values) == 1.0 and np.isfinite(old["mean"].values).any()
    # a fresh target is simply not there after a failure
    with pytest.raises(RuntimeError):
        predict_grid(FailingModel(2.0, fail_at=1), GRID, chunk_rows=3, store=tmp_path / f"new{suffix}", progress=False)
    assert everything(tmp_path) == before
    # and a successful run replaces the old grid
    predict_grid(FailingModel(3.0), GRID, chunk_rows=3, store=target, progress=False).close()
    assert np.nanmax(open_grid(target)["mean"].values) == 3.0 and everything(tmp_path) == before


def test_failed_metrics_write_keeps_the_old_tables(tmp_path, monkeypatch) -> None:
    table = pd.DataFrame({"model": ["a"], "group": ["overall"], "n": [1], "MAE": [0.1]})
    save_metrics(table, tmp_path)
    old_csv, old_json = (tmp_path / "metrics.csv").read_text(), (tmp_path / "metrics.json").read_text()

    def broken(self, path, **kw):
        Path(path).write_text("model,gr")  # a partial write, then the crash
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    with pytest.raises(OSError):
        save_metrics(table.assign(n=2), tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == old_csv and (tmp_path / "metrics.json").read_text() == old_json
    assert everything(tmp_path) == ["metrics.csv", "metrics.json"]


# --- SIGKILL midway ---------------------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import dask.array as da
    import numpy as np
    import xarray as xr
    from geodbk.io.cubes import write_netcdf, write_zarr
    from geodbk.io.geotiff import write_geotiff
    from geodbk.maps.geometry import RegularGrid

    target, started = Path(sys.argv[1]), Path(sys.argv[2])

    def slow(block):  # every chunk takes a while; the first one says the write has begun
        started.touch()
        time.sleep(0.5)
        return np.full(block.shape, 2.0, dtype=np.float32)

    grid = RegularGrid.over((-67.0, 18.0, -66.0, 18.6), 0.002)
    data = da.zeros((grid.height, grid.width), chunks=(16, grid.width), dtype=np.float32).map_blocks(slow)
    ds = xr.Dataset({"mean": (("y", "x"), data)}, coords={"y": grid.y, "x": grid.x})
    ds = ds.rio.write_crs(4326).rio.write_transform(grid.transform)
    {".nc": write_netcdf, ".zarr": write_zarr, ".tif": write_geotiff}[target.suffix](ds, target)
    """
)


def old_output(target: Path) -> xr.Dataset:
    """A small finished grid of 1.0 at ``target`` (the 'old file')."""
    ds = xr.Dataset({"mean": (("y", "x"), np.ones((4, 5), dtype=np.float32))},
                    coords={"y": 18.5 - 0.1 * np.arange(4), "x": -66.9 + 0.1 * np.arange(5)}).rio.write_crs(4326)
    {".nc": write_netcdf, ".zarr": write_zarr, ".tif": write_geotiff}[target.suffix](ds, target)
    return ds


def read_back(target: Path) -> np.ndarray:
    if target.suffix == ".tif":
        import rasterio

        with rasterio.open(target) as src:
            return src.read(1)
    with open_grid(target) as ds:
        return ds["mean"].values


@pytest.mark.parametrize("suffix", [".nc", ".zarr", ".tif"])
@pytest.mark.parametrize("existing", [True, False], ids=["over-old", "fresh"])
def test_write_killed_midway_leaves_the_old_output_or_nothing(tmp_path, suffix: str, existing: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target, started = out / f"grid{suffix}", tmp_path / "started"
    if existing:
        old_output(target)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(started)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120

    def staged() -> bool:  # the write has begun and its hidden temporary is there
        return started.exists() and any(p.name.startswith(f".{target.name}.") for p in out.iterdir())

    while not staged() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"writer ended before it was killed: {proc.stderr.read().decode()[-2000:]}"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    # a reader sees the old grid, or nothing; what the killed writer left is one hidden temporary
    assert visible(out) == ([target.name] if existing else [])
    litter = [name for name in everything(out) if name != target.name]
    assert litter and all(name.startswith(f".{target.name}.") and name.endswith(".tmp") for name in litter), litter
    if existing:
        np.testing.assert_array_equal(read_back(target), np.ones((4, 5), dtype=np.float32))
    # the next write into the folder sweeps what the killed writer left
    old_output(out / f"another{suffix}")
    assert everything(out) == sorted([*([target.name] if existing else []), f"another{suffix}"])


# --- the demo's run folder ---------------------------------------------------------------------
def test_crashed_demo_leaves_the_previous_run_folder(tmp_path, monkeypatch) -> None:
    import geodbk.fit.geomodel as geomodel

    run = RunFolder(tmp_path / "run")
    run.model("dbk-rbf").parent.mkdir(parents=True)
    load_sample_dataset("PR", "download", quarters=["2023Q3"]).save(run.dataset)
    previous = run.dataset.read_bytes()
    run.model("dbk-rbf").write_bytes(b"previous model")
    (run.root / MARKER).write_text("run\n")

    def crash(*args, **kwargs):
        raise RuntimeError("injected: out of memory while drawing the maps")

    monkeypatch.setattr(geomodel, "predict_plan", crash)  # GeoModel.grid, which the demo calls
    config = DemoConfig(quarters=["2023Q4"], models=("knn",), epochs=1, resolution=0.05, progress=False, device="cpu")
    with pytest.raises(RuntimeError, match="injected"):  # into a run folder only with overwrite
        run_demo(run.root, config, echo=lambda line: None, overwrite=True)
    assert run.dataset.read_bytes() == previous and run.model("dbk-rbf").read_bytes() == b"previous model"
    assert everything(run.root) == [MARKER, "dataset.parquet", "models"] and everything(tmp_path) == ["run"]


def test_crashed_demo_into_a_new_folder_leaves_nothing(tmp_path, monkeypatch) -> None:
    import geodbk.fit.geomodel as geomodel

    def crash(*args, **kwargs):
        raise RuntimeError("injected: out of memory while drawing the maps")

    monkeypatch.setattr(geomodel, "predict_plan", crash)
    config = DemoConfig(quarters=["2023Q4"], models=("knn",), epochs=1, resolution=0.05, progress=False, device="cpu")
    with pytest.raises(RuntimeError, match="injected"):
        run_demo(tmp_path / "outputs" / "demo", config, echo=lambda line: None)
    assert everything(tmp_path / "outputs") == []


def test_demo_refuses_to_replace_a_folder_that_is_not_a_run(tmp_path) -> None:
    from geodbk.errors import OutputExistsError

    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(OutputExistsError, match="not a run folder"):
        run_demo(tmp_path, DemoConfig(models=("knn",)), echo=lambda line: None)
    assert everything(tmp_path) == ["thesis.tex"]
