"""predict_grid on a Dask cluster: a 2-worker local cluster gives the serial grid bit for bit,
and a failure anywhere leaves the old store (or nothing) at the target."""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import shapely
import xarray as xr

from geodbk.cli import main
from geodbk.dataset.model_info import ModelInfo
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.fit.fitting import fit_dataset
from geodbk.maps import predict as predict_module
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.parallel import parse_scheduler
from geodbk.maps.predict import predict_grid
from geodbk.maps.stores import ZarrRegions, open_grid

pytestmark = pytest.mark.usefixtures("single_thread")

QUARTERS = ["2022Q4", "2023Q4"]
SMALL = RegularGrid.over(shapely.Point(-66.5, 18.2).buffer(0.3), 0.02)  # 30 x 30 cells


@pytest.fixture(scope="module")
def model():
    """A tiny space-time dbk-rbf on one Puerto Rico tile in ten of 2022Q4 and 2023Q4."""
    ds = load_sample_dataset("PR", quarters=QUARTERS)
    ds = dataclasses.replace(ds, frame=ds.frame.sample(frac=0.1, random_state=0))
    return fit_dataset(ds, "dbk-rbf", hidden=8, rank=8,
                       epochs=1, batch_size=256, progress=False, local_residuals=False)


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes, as ``"local:2"`` starts them."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as local,
        Client(local) as client,
    ):
        yield client


def both_ways(model, grid, tmp_path: Path, client, **kwargs) -> tuple[xr.Dataset, xr.Dataset, list, list]:
    """(serial grid, cluster grid, serial warnings, cluster warnings), both written to Zarr stores."""
    grids, caught = [], []
    for name, how in (("serial", None), ("dask", client)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            grids.append(predict_grid(model, grid, store=tmp_path / f"{name}.zarr", client=how, progress=False,
                                      **kwargs).load())
        caught.append([(w.category, str(w.message)) for w in seen])
    return grids[0], grids[1], caught[0], caught[1]


def assert_same_grid(serial: xr.Dataset, dask: xr.Dataset) -> None:
    xr.testing.assert_identical(dask, serial)  # values (NaN where NaN), coords, dims, attrs
    assert dask.rio.crs == serial.rio.crs and dask.rio.transform() == serial.rio.transform()
    for name in serial.data_vars:
        assert dask[name].dtype == np.float32
        np.testing.assert_array_equal(dask[name].values, serial[name].values)


def test_workers_run_torch_on_one_thread(cluster) -> None:
    import torch

    assert set(cluster.run(torch.get_num_threads).values()) == {1}


def test_two_workers_give_the_serial_grid_exactly(model, cluster, tmp_path) -> None:
    west, south, east, north = model.fitted_region().geometry.bounds
    grid = RegularGrid.over((west - 0.1, south - 0.1, east + 0.1, north + 0.1), 0.02)  # open sea: extrapolation
    serial, dask, serial_warnings, dask_warnings = both_ways(
        model, grid, tmp_path, cluster, refs={"san juan": (-66.06, 18.45)}, chunk_rows=4, max_distance=20_000.0)
    assert_same_grid(serial, dask)
    assert np.isfinite(dask["mean"].values).sum() > 100 and dask["mean"].dims == ("y", "x")
    # one ExtrapolationWarning naming the first block and the count, as the serial path says it
    assert dask_warnings == serial_warnings
    assert [category for category, _ in dask_warnings] == [ExtrapolationWarning]
    assert f"of {len(range(0, grid.height, 4))} grid block(s)" in dask_warnings[0][1]
    # nothing left beside the stores
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dask.zarr", "serial.zarr"]


def test_quarters_and_change_by_scheduler_address(model, cluster, tmp_path) -> None:
    serial, dask, _, _ = both_ways(model, SMALL, tmp_path, cluster.scheduler.address, time=QUARTERS,
                                   change=tuple(QUARTERS), refs={"a": (-66.4, 18.1), "b": (-66.7, 18.3)}, chunk_rows=7)
    assert_same_grid(serial, dask)
    assert dask["mean"].dims == ("time", "y", "x") and list(dask["quarter"].values) == QUARTERS
    assert dask["kernel_slice"].dims == ("ref", "y", "x") and "change" in dask


class FailingModel:
    """A constant surface that raises in the blocks reaching north of ``fail_north_of``; the others
    take ``delay`` seconds and, with a ``log`` folder, leave ``<lat>.started`` / ``<lat>.finished`` there."""

    info = ModelInfo("failing", target="download", units="Mbps")
    has_kernel = False
    latest_quarter = None  # time-free: maps the quarters a test names

    def __init__(self, value: float, fail_north_of: float = 90.0, delay: float = 0.0, log: Path | None = None) -> None:
        self.value, self.fail_north_of, self.delay, self.log = value, fail_north_of, delay, log

    def predict_series(self, lonlat: np.ndarray, times) -> list:
        if (lonlat[:, 1] > self.fail_north_of).any():
            raise RuntimeError("injected failure in one block")
        name = f"{lonlat[:, 1].max():.4f}"
        if self.log is not None:
            (self.log / f"{name}.started").touch()
        time.sleep(self.delay)
        if self.log is not None:
            (self.log / f"{name}.finished").touch()
        return [SimpleNamespace(mean=np.full(len(lonlat), self.value), sd=np.full(len(lonlat), 0.1)) for _ in times]


def test_a_failing_block_leaves_the_old_store_and_no_block_running(cluster, tmp_path) -> None:
    target, log = tmp_path / "grid.zarr", tmp_path.parent / f"{tmp_path.name}-log"
    log.mkdir()
    predict_grid(FailingModel(1.0), SMALL, chunk_rows=3, store=target, client=cluster, progress=False).close()
    # the first two blocks fail at once, while the next ones still predict for a second
    with pytest.raises(RuntimeError, match="injected failure"):
        predict_grid(FailingModel(2.0, fail_north_of=18.4, delay=1.0, log=log), SMALL, chunk_rows=3, store=target,
                     client=cluster, progress=False)
    started = {p.stem for p in log.glob("*.started")}
    assert started and started == {p.stem for p in log.glob("*.finished")}  # waited for, before the abort
    assert [p.name for p in tmp_path.iterdir()] == ["grid.zarr"]  # no staged store left behind
    old = open_grid(target).load()
    assert np.nanmax(old["mean"].values) == 1.0 and np.nanmin(old["mean"].values) == 1.0
    # a fresh target is simply not there after a failure
    with pytest.raises(RuntimeError, match="injected failure"):
        predict_grid(FailingModel(2.0, fail_north_of=18.2), SMALL, chunk_rows=3, store=tmp_path / "new.zarr",
                     client=cluster, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["grid.zarr"]


def test_an_interrupt_waits_for_running_blocks_then_removes_the_staged_store(cluster, tmp_path, monkeypatch) -> None:
    target = tmp_path / "grid.zarr"
    predict_grid(FailingModel(1.0), SMALL, chunk_rows=3, store=target, client=cluster, progress=False).close()
    seen = []

    def interrupted(self, index, caught) -> None:
        seen.append(index)
        raise KeyboardInterrupt

    monkeypatch.setattr(predict_module._WarningLog, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        predict_grid(FailingModel(2.0), SMALL, chunk_rows=3, store=target, client=cluster, progress=False)
    assert len(seen) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["grid.zarr"]
    assert np.nanmax(open_grid(target)["mean"].values) == 1.0
    # the cluster is idle and usable afterwards: no block of the interrupted grid still runs
    assert not any(cluster.processing().values())


def test_a_cluster_needs_a_zarr_store(tmp_path) -> None:
    for store in (None, tmp_path / "grid.nc"):
        with pytest.raises(InputDataError, match="Zarr store"):
            predict_grid(FailingModel(1.0), SMALL, store=store, client="local", progress=False)
    assert list(tmp_path.iterdir()) == []
    assert parse_scheduler("local") == 2 and parse_scheduler(" local:3 ") == 3
    assert parse_scheduler("localhost:8786") == "localhost:8786"
    for bad in ("local:0", "local:two", " "):
        with pytest.raises(InputDataError):
            parse_scheduler(bad)


def test_zarr_regions_refuse_blocks_that_split_a_chunk(tmp_path) -> None:
    regions = ZarrRegions(tmp_path / "g.zarr", {"mean": ("y", "x")}, chunk_rows=4, height=10)
    for rows in (slice(2, 6), slice(4, 7), slice(0, 3)):
        with pytest.raises(ValueError, match="whole Zarr chunks"):
            regions.write(rows, {"mean": np.zeros((rows.stop - rows.start, 3), np.float32)})


def test_cli_dask_scheduler_local(model, tmp_path, capsys) -> None:
    model.save(tmp_path / "m.pt")
    args = ["predict", "--model", str(tmp_path / "m.pt"), "--resolution", "0.05", "--quarters", ",".join(QUARTERS),
            "--chunk-rows", "3", "--allow-extrapolation", "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        assert main([*args, "--out", str(tmp_path / "serial.zarr")]) == 0
        assert main([*args, "--out", str(tmp_path / "dask.zarr"), "--dask-scheduler", "local:2"]) == 0
    assert_same_grid(open_grid(tmp_path / "serial.zarr").load(), open_grid(tmp_path / "dask.zarr").load())
    capsys.readouterr()
    for extra, message in ((["--out", str(tmp_path / "g.nc"), "--dask-scheduler", "local:2"], "must end in .zarr"),
                           (["--out", str(tmp_path / "g.zarr"), "--dask-scheduler", "local:0"], "N >= 1")):
        assert main(["predict", "--model", str(tmp_path / "missing.pt"), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
