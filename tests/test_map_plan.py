"""One map plan: GeoModel.plan resolves a map request once; grid(plan), grid(resolution, ...), the
engine below them (predict_grid) and ``geodbk predict`` give the same map; plan.check() holds the
refusals and plan.describe() the size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import shapely
import xarray as xr

from geodbk.cli import main
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import InputDataError, OutputExistsError, ResourceLimitError
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.plan import MapPlan
from geodbk.maps.predict import predict_grid
from geodbk.maps.schema import grid_size_limit
from geodbk.maps.stores import open_grid

pytestmark = pytest.mark.usefixtures("single_thread")

QUARTERS = ["2023Q2", "2023Q3", "2023Q4"]
CHANGE = ("2023Q3", "2023Q4")
REFS = {"sanjuan": (-66.06, 18.45)}
FLORIDA = shapely.box(-82.0, 27.0, -81.0, 28.0)


@pytest.fixture(scope="module")
def model() -> GeoModel:
    """A tiny dbk-rbf of one tile in twenty of Puerto Rico's 2023Q2-2023Q4."""
    ds = load_sample_dataset("PR", quarters=QUARTERS)
    ds = dataclasses.replace(ds, frame=ds.frame.sample(frac=0.05, random_state=0))
    return fit_dataset(ds, "dbk-rbf", hidden=8, rank=8, epochs=1, batch_size=256, progress=False,
                       local_residuals=False)


def test_grid_of_a_plan_of_a_resolution_of_predict_grid_and_of_the_cli_are_one_map(model, tmp_path) -> None:
    options = dict(quarters="all", change=CHANGE, refs=REFS, threshold=10.0, chunk_rows=4, progress=False)
    plan = model.plan(0.05, **options)
    of_plan = model.grid(plan)
    of_resolution = model.grid(0.05, **options)
    # the engine called as before the plan existed: the grid built by hand, the quarters as labels
    engine = predict_grid(model, RegularGrid.over(model.fitted_region(), 0.05), time=QUARTERS, change=CHANGE,
                          refs=REFS, threshold=10.0, chunk_rows=4, progress=False)
    assert {"mean", "sd", "p_below", "change", "change_sd", "kernel_slice"} <= set(of_plan.data_vars)
    assert np.isfinite(of_plan["mean"].values).any()
    xr.testing.assert_identical(of_plan, of_resolution)
    xr.testing.assert_allclose(of_plan, engine, rtol=1e-6)
    assert of_plan.attrs == engine.attrs

    model.save(tmp_path / "m.pt")
    argv = ["predict", "--model", str(tmp_path / "m.pt"), "--resolution", "0.05", "--quarters", "all", "--change",
            ":".join(CHANGE), "--ref", "sanjuan:-66.06,18.45", "--threshold", "10", "--chunk-rows", "4",
            "--out", str(tmp_path / "g.nc"), "--no-progress"]
    assert main(argv) == 0
    with open_grid(tmp_path / "g.nc") as written:
        for name in of_plan.data_vars:
            np.testing.assert_allclose(written[name].values, of_plan[name].values, rtol=1e-5, atol=1e-6,
                                       equal_nan=True, err_msg=name)


def test_describe_gives_cells_layers_quarters_and_bytes(model) -> None:
    plan = model.plan(0.05, quarters="all", change=CHANGE, refs=REFS, threshold=None)
    grid = RegularGrid.over(model.fitted_region(), 0.05)
    assert (plan.grid.height, plan.grid.width) == grid.shape and plan.cells == grid.height * grid.width
    # 6 layers per quarter (no p_below), 4 change layers, one kernel slice per reference point
    assert plan.layers.values_per_cell() == 6 * 3 + 4 + 1
    assert plan.nbytes == plan.cells * (6 * 3 + 4 + 1) * 4
    line = plan.describe()
    assert f"{grid.height} x {grid.width} cells of 0.05 deg in EPSG:4326" in line
    assert "quarter(s) 2023Q2,2023Q3,2023Q4" in line and "change 2023Q3 -> 2023Q4" in line
    assert "kernel slices at sanjuan" in line and "11 layers (23 values per cell)" in line
    assert "KiB of float32" in line or "MiB of float32" in line
    assert "kernel slices" not in plan.with_refs(None).describe()
    assert " cells of 2000 m in EPSG:326" in model.plan("2km", threshold=None).describe()  # a UTM zone's metres
    assert plan.with_refs(None).layers.values_per_cell() == 22


def test_check_holds_the_refusals_with_their_messages(model, tmp_path) -> None:
    with pytest.raises(ResourceLimitError, match=r"above the limit of .* cells \(7 value\(s\) per cell, 4 GiB of "
                       r"float32\); use a coarser resolution or pass --max-cells"):
        model.plan(1e-5).check()
    with grid_size_limit(10), pytest.raises(ResourceLimitError, match="limit of 10 cells .set by --max-cells"):
        model.plan(0.05).check()
    with pytest.raises(InputDataError, match="no cell of the 1 x 1 grid at resolution 5 has its centre inside"):
        model.plan(5.0, region=(-66.2, 18.3, -66.0, 18.45)).check()
    model.plan(0.1, region=FLORIDA).check()  # extrapolation allowed: it only warns when predicted
    far = model.plan(0.1, region=FLORIDA, allow_extrapolation=False)
    with pytest.raises(InputDataError, match="outside"):
        far.check()
    with pytest.raises(InputDataError, match="outside.*; pass --allow-extrapolation to map it anyway$"):
        dataclasses.replace(far, domain_lift="pass --allow-extrapolation to map it anyway").check()
    with pytest.raises(InputDataError, match="outside"):  # and the same from the model's own domain check
        model.check_domain(FLORIDA)
    (tmp_path / "taken.nc").mkdir()
    with pytest.raises(OutputExistsError):
        model.plan(0.1, store=tmp_path / "taken.nc").check()
    with pytest.raises(InputDataError, match="store must end in .nc or .zarr, got g.tif"):
        model.plan(0.1, store=tmp_path / "g.tif").check()
    with pytest.raises(InputDataError, match="a Dask cluster writes its blocks straight into a Zarr store"):
        model.plan(0.1, store=tmp_path / "g.nc", client="local").check()


def test_grid_checks_the_plan_before_predicting_and_refuses_another_models_plan(model, tmp_path) -> None:
    (tmp_path / "taken.nc").mkdir()
    with pytest.raises(OutputExistsError):
        model.grid(0.1, store=tmp_path / "taken.nc")
    assert list((tmp_path / "taken.nc").iterdir()) == []
    with pytest.raises(InputDataError, match="outside"):
        model.grid(0.1, region=FLORIDA, allow_extrapolation=False, progress=False)
    other = dataclasses.replace(model)
    with pytest.raises(InputDataError, match="another model"):
        other.grid(model.plan(0.1))
    with pytest.raises(InputDataError, match="chunk_rows must be >= 1"):
        model.plan(0.1, chunk_rows=0)
    with pytest.raises(InputDataError, match="max_distance must be positive"):
        model.plan(0.1, max_distance=-1.0)
    assert isinstance(model.plan(0.1), MapPlan)
