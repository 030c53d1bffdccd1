"""The demo job end to end on one quarter of the shipped Puerto Rico sample, with tiny real fits."""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import rasterio

from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import InputDataError, RegionError
from geodbk.io.geotiff import GEOTIFF_NODATA
from geodbk.fit.geomodel import GeoModel
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.maps.stores import open_grid
from geodbk.quarters import Quarter
from geodbk.workflow import DemoConfig, RunFolder, run_demo

#: the models of the shared run (``conftest.small_demo``): two GP kinds and the kernel-free knn
#: baseline (closed form, fast), as in the demo's defaults
KINDS = ("dbk-rbf", "sv-rbf", "knn")


def test_run_folder_has_every_documented_file(small_demo) -> None:
    result, lines = small_demo
    run = result.run
    expected = [run.dataset, run.metrics_csv, run.metrics_json]
    for kind in KINDS:
        expected += [run.model(kind), run.map_netcdf(kind), run.map_geotiff(kind), run.test_tiles(kind)]
    expected += [run.hexagons("dbk-rbf"), run.plan("dbk-rbf")]  # the one model of both speeds
    for path in expected:
        assert path.is_file() and path.stat().st_size > 0, path
    assert sorted(result.files) == sorted(expected)
    # the documented layout
    assert run.model("dbk-rbf") == run.root / "models" / "dbk-rbf.pt"
    assert run.map_netcdf("sv-rbf") == run.root / "maps" / "sv-rbf.nc"
    assert run.test_tiles("sv-rbf") == run.root / "maps" / "sv-rbf_test_tiles.geojson"
    text = "\n".join(lines)
    assert "SpatialDataset" in text and "coverage95" in text and "wildland" in text
    assert "fitted dbk-rbf (download and upload; error correlation" in text
    plan = gpd.read_parquet(run.plan("dbk-rbf"))
    assert list(plan["rank"]) == [1, 2, 3] and plan["expected_wrong_after"].is_monotonic_decreasing


def test_metrics_table_by_model_and_group(small_demo) -> None:
    result, _ = small_demo
    table = pd.read_csv(result.run.metrics_csv)
    assert list(table.columns) == ["model", "target", "group", "n", "MAE", "NLL", "CRPS", "coverage95", "pi_width"]
    pairs = {kind for kind, model in result.models.items() if model.targets == ("download", "upload")}
    assert pairs == {"dbk-rbf"}  # the demo's pair model: its upload rows too
    assert set(zip(table["model"], table["target"], table["group"])) == {
        (k, t, g) for k in KINDS for t in ("download", "upload") if t == "download" or k in pairs
        for g in ("overall", "urban", "rural")}
    n_test = int((result.dataset.frame["split"] == "test").sum())
    for kind, target in [(k, "download") for k in KINDS] + [(k, "upload") for k in pairs]:
        rows = table[(table["model"] == kind) & (table["target"] == target)].set_index("group")
        assert rows.loc["overall", "n"] == n_test == rows.loc["urban", "n"] + rows.loc["rural", "n"]
        assert 0.0 <= rows.loc["overall", "coverage95"] <= 1.0 and rows.loc["overall", "MAE"] > 0
    json_table = pd.read_json(result.run.metrics_json)
    pd.testing.assert_frame_equal(json_table[table.columns], table, check_dtype=False)


def test_saved_dataset_and_models_reload(small_demo) -> None:
    result, _ = small_demo
    dataset = SpatialDataset.load(result.run.dataset)
    assert len(dataset) == len(result.dataset) and dataset.quarters == [Quarter(2023, 3), Quarter(2023, 4)]
    model = GeoModel.load(result.run.model("dbk-rbf"))
    ll = dataset.frame[["lon", "lat"]].to_numpy()[:50]
    np.testing.assert_allclose(model.predict(ll).mean, result.models["dbk-rbf"].predict(ll).mean, rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_map_cells_equal_the_fitted_model_at_cell_centres(small_demo, kind: str) -> None:
    result, _ = small_demo
    model = GeoModel.load(result.run.model(kind))
    ds = open_grid(result.run.map_netcdf(kind)).load()
    assert ds.rio.crs.to_epsg() == 4326 and ds.attrs["model_kind"] == kind
    # the map has every fitted quarter along time; its last is the model's latest
    assert list(ds["quarter"].values) == ["2023Q3", "2023Q4"] and ds["mean"].dims == ("time", "y", "x")
    quarter = str(ds["quarter"].values[-1])
    assert quarter == str(model.latest_quarter) == "2023Q4"
    if model.has_kernel:  # the year's change, here from the first fitted quarter
        assert ds.attrs["change"] == "2023Q3:2023Q4" and ds["p_increase"].dims == ("y", "x")
    else:
        assert "change" not in ds.data_vars
    assert ds["p_below"].attrs["threshold"] == 35.0
    ds = ds.isel(time=-1)
    if model.has_kernel:
        assert list(ds["ref"].values) == list(result.refs)
    else:
        assert kind == "knn" and "kernel_slice" not in ds.data_vars and "ref" not in ds.coords
    mean = ds["mean"].values
    inside = np.argwhere(np.isfinite(mean))
    assert 0 < len(inside) < mean.size  # the sea around Puerto Rico is masked
    picks = inside[np.linspace(0, len(inside) - 1, 25).astype(int)]
    lonlat = np.column_stack([ds["x"].values[picks[:, 1]], ds["y"].values[picks[:, 0]]])
    pred = model.predict(lonlat, quarter)
    np.testing.assert_allclose(mean[picks[:, 0], picks[:, 1]], pred.mean, rtol=1e-5)
    np.testing.assert_allclose(ds["sd"].values[picks[:, 0], picks[:, 1]], pred.sd, rtol=1e-5)
    np.testing.assert_allclose(ds["upper_mbps"].values[picks[:, 0], picks[:, 1]], 10 ** pred.upper, rtol=1e-4)
    if model.has_kernel:
        ref_ll = np.column_stack([ds["ref_lon"].values, ds["ref_lat"].values])
        k = ds["kernel_slice"].values[:, picks[:, 0], picks[:, 1]].T
        np.testing.assert_allclose(k, model.kernel_slice(lonlat, ref_ll, quarter), rtol=1e-4, atol=1e-7)
    # the GeoTIFF holds the same numbers, nodata where the grid is NaN
    with rasterio.open(result.run.map_geotiff(kind)) as src:
        band = src.read(src.descriptions.index("mean:2023Q4") + 1)
        assert src.nodata == GEOTIFF_NODATA
        np.testing.assert_array_equal(band == GEOTIFF_NODATA, np.isnan(mean))
        np.testing.assert_array_equal(band[np.isfinite(mean)], mean[np.isfinite(mean)])


@pytest.mark.parametrize("kind", KINDS)
def test_test_tiles_hold_the_model_predictions(small_demo, kind: str) -> None:
    result, _ = small_demo
    tiles = gpd.read_file(result.run.test_tiles(kind))
    test = result.dataset.frame[result.dataset.frame["split"] == "test"]
    assert len(tiles) == len(test)
    np.testing.assert_array_equal(tiles["tests"], test["tests"])
    # each test tile at its own quarter, as a new measurement of its own number of tests
    pred = result.models[kind].predict_tiles(test).measurement()
    np.testing.assert_allclose(tiles["mean"], pred.mean, rtol=1e-9)
    np.testing.assert_allclose(tiles["upper_mbps"], 10**pred.upper, rtol=1e-9)


def test_chunked_real_model_grid_matches_one_block(small_demo) -> None:
    result, _ = small_demo
    model = result.models["dbk-rbf"]
    grid = RegularGrid.over(result.dataset.region, 0.03)
    refs = {"ref": result.refs["urban"]}
    whole = predict_grid(model, grid, refs=refs, chunk_rows=grid.height, progress=False)
    chunked = predict_grid(model, grid, refs=refs, chunk_rows=3, progress=False)
    for name in whole.data_vars:
        np.testing.assert_allclose(chunked[name].values, whole[name].values, rtol=1e-5, atol=1e-7)


def test_demo_rejects_empty_model_list(tmp_path) -> None:
    with pytest.raises(InputDataError):
        run_demo(tmp_path, DemoConfig(models=()))
    assert RunFolder(tmp_path).dataset.name == "dataset.parquet"


def test_demo_with_a_kernel_free_kind_maps_without_kernel_or_change_layers(tmp_path) -> None:
    """``geodbk demo --models dnn``: the demo draws kernel slices and change layers for GP kinds
    only (it asks ``has_kernel``), so a dnn run finishes with its maps and none of those layers."""
    config = DemoConfig(quarters=["2023Q3", "2023Q4"], models=("dnn",), epochs=1, resolution=0.05, progress=False,
                        device="cpu")
    result = run_demo(tmp_path / "dnn-run", config, echo=lambda line: None)
    run = result.run
    assert not result.models["dnn"].has_kernel
    for path in (run.dataset, run.metrics_csv, run.model("dnn"), run.map_netcdf("dnn"), run.map_geotiff("dnn"),
                 run.test_tiles("dnn")):
        assert path.is_file() and path.stat().st_size > 0, path
    ds = open_grid(run.map_netcdf("dnn")).load()
    assert ds["mean"].dims == ("time", "y", "x") and np.isfinite(ds["mean"].values).any()
    assert "kernel_slice" not in ds and "ref" not in ds.coords
    assert not {"change", "change_sd", "p_increase"} & set(ds.data_vars)
    with rasterio.open(run.map_geotiff("dnn")) as src:
        assert not any("kernel" in (d or "") for d in src.descriptions)


def test_demo_of_counties_maps_them_and_refuses_a_region_outside_the_samples(tmp_path) -> None:
    """``geodbk demo --region "Vieques, PR+Culebra, PR"``: the demo on counties of a shipped sample,
    with their fixed tiles as its density layer; a region the samples do not cover is one line."""
    config = DemoConfig(region="Vieques, PR+Culebra, PR", models=("knn",), resolution=0.02, progress=False,
                        device="cpu")
    lines: list[str] = []
    result = run_demo(tmp_path / "vieques", config, echo=lines.append)
    assert lines[0].startswith("SpatialDataset: Vieques Municipio, PR + Culebra Municipio, PR, download and upload (Mbps)")
    dataset = SpatialDataset.load(result.run.dataset)
    assert len(dataset.frame) == 1_044 and dataset.region.code == "PR"  # bench_regions' vieques-culebra crop
    grid = open_grid(result.run.map_netcdf("knn")).load()
    west, south, east, north = dataset.region.bounds
    assert west - 0.02 <= float(grid["x"].min()) and float(grid["x"].max()) <= east + 0.02
    assert south - 0.02 <= float(grid["y"].min()) and float(grid["y"].max()) <= north + 0.02
    with pytest.raises(RegionError, match="and Hawaii \\(HI\\) only, not 'Boone County, MO'"):
        run_demo(tmp_path / "boone", DemoConfig(region="Boone, MO", models=("knn",), progress=False))
    assert not (tmp_path / "boone" / "dataset.parquet").exists()
