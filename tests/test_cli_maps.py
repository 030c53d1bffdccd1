"""``geodbk demo``, ``predict`` and ``export`` from the command line on a tiny real run."""

from __future__ import annotations

import numpy as np
import pyproj
import pytest
import rasterio

from geodbk.cli import build_parser, main
from geodbk.fit.geomodel import GeoModel
from geodbk.maps.stores import open_grid
from geodbk.workflow import DEMO_MODELS, DemoConfig


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    rc = main(["demo", "--out", str(out), "--quarters", "2023Q4", "--epochs", "1", "--models", "sv-rbf",
               "--resolution", "0.05", "--device", "cpu", "--no-progress"])
    assert rc == 0
    return out


def test_demo_writes_the_run_folder(run_dir, capsys) -> None:
    for rel in ("dataset.parquet", "metrics.csv", "metrics.json", "models/sv-rbf.pt", "maps/sv-rbf.nc",
                "maps/sv-rbf.tif", "maps/sv-rbf_test_tiles.geojson"):
        assert (run_dir / rel).is_file(), rel
    ds = open_grid(run_dir / "maps" / "sv-rbf.nc")
    assert ds.rio.resolution() == pytest.approx((0.05, -0.05))
    assert set(ds["ref"].values) == {"urban", "rural", "wildland"}


def test_predict_other_crs_with_refs(run_dir, tmp_path, capsys) -> None:
    out = tmp_path / "grid.nc"
    rc = main(["predict", "--model", str(run_dir / "models" / "sv-rbf.pt"), "--region", "PR", "--crs", "EPSG:32161",
               "--resolution", "5km", "--ref", "sanjuan:-66.06,18.45", "--ref", "ponce:-66.61,18.01",
               "--chunk-rows", "4", "--out", str(out), "--no-progress"])
    assert rc == 0
    assert "EPSG:32161" in capsys.readouterr().out
    ds = open_grid(out).load()
    assert ds.rio.crs.to_epsg() == 32161 and ds.rio.resolution() == pytest.approx((5000.0, -5000.0))
    assert list(ds["ref"].values) == ["sanjuan", "ponce"]
    model = GeoModel.load(run_dir / "models" / "sv-rbf.pt")
    i, j = np.argwhere(np.isfinite(ds["mean"].values))[0]
    lon, lat = pyproj.Transformer.from_crs(32161, 4326, always_xy=True).transform(ds["x"].values[j], ds["y"].values[i])
    pred = model.predict(np.array([[lon, lat]]))
    assert float(ds["mean"][i, j]) == pytest.approx(float(pred.mean[0]), rel=1e-5)
    k = model.kernel_slice(np.array([[lon, lat]]), np.array([[-66.06, 18.45], [-66.61, 18.01]]))
    np.testing.assert_allclose(ds["kernel_slice"].values[:, i, j], k[0], rtol=1e-4)


def test_predict_at_bf16_is_the_python_bf16_prediction(run_dir, tmp_path) -> None:
    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.fit.fitting import fit_dataset

    out, path = tmp_path / "bf16.nc", tmp_path / "dbk-rbf.pt"  # a kind with a deep backbone
    fit_dataset(SpatialDataset.load(run_dir / "dataset.parquet"), "dbk-rbf", hidden=16, rank=16, epochs=1, progress=False, device="cpu").save(path)
    assert main(["predict", "--model", str(path), "--resolution", "0.05", "--precision", "bf16", "--out", str(out),
                 "--no-progress"]) == 0
    ds = open_grid(out).load()
    i, j = np.argwhere(np.isfinite(ds["mean"].values))[0]
    lonlat = np.array([[float(ds["x"][j]), float(ds["y"][i])]])
    model = GeoModel.load(path)
    model.regressor.prediction_precision = "bf16"
    fast = model.predict(lonlat)
    model.regressor.prediction_precision = "float32"
    full = model.predict(lonlat)
    assert abs(fast.mean[0] - full.mean[0]) > 2e-5  # bf16 is visibly not float32 here
    assert float(ds["mean"][i, j]) == pytest.approx(float(fast.mean[0]), abs=2e-6)
    assert float(ds["sd"][i, j]) == pytest.approx(float(fast.sd[0]), rel=1e-5)


def test_predict_zarr_with_automatic_refs_then_export(run_dir, tmp_path) -> None:
    grid = tmp_path / "grid.zarr"
    assert main(["predict", "--model", str(run_dir / "models" / "sv-rbf.pt"), "--resolution", "0.04",
                 "--dataset", str(run_dir / "dataset.parquet"), "--out", str(grid), "--no-progress"]) == 0
    ds = open_grid(grid)
    assert ds.rio.crs.to_epsg() == 4326 and set(ds["ref"].values) == {"urban", "rural", "wildland"}
    tif, nc = tmp_path / "grid.tif", tmp_path / "copy.nc"
    assert main(["export", "--grid", str(grid), "--geotiff", str(tif), "--cog", "--variables", "mean", "pi_width",
                 "--netcdf", str(nc)]) == 0
    with rasterio.open(tif) as src:
        assert src.descriptions == ("mean", "pi_width")
        assert src.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG"
        assert src.crs.to_epsg() == 4326
        np.testing.assert_array_equal(src.read(1, masked=True).filled(np.nan), ds["mean"].values)
    np.testing.assert_array_equal(open_grid(nc)["sd"].values, ds["sd"].values)


def test_export_test_tiles(run_dir, tmp_path) -> None:
    import geopandas as gpd

    out = tmp_path / "tiles.parquet"
    assert main(["export", "--model", str(run_dir / "models" / "sv-rbf.pt"), "--dataset",
                 str(run_dir / "dataset.parquet"), "--test-tiles", str(out)]) == 0
    tiles = gpd.read_parquet(out)
    assert {"quadkey", "quarter", "urban_rural", "y", "observed_mbps", "mean", "sd", "lower_mbps", "upper_mbps"} <= set(tiles.columns)
    assert (tiles["lower_mbps"] < tiles["upper_mbps"]).all()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["predict", "--model", "m.pt", "--out", "grid.tif"], "--out must end in .nc or .zarr"),
        (["predict", "--model", "missing.pt", "--out", "grid.nc"], "no model file"),
        (["export", "--grid", "g.nc"], "needs an output"),
        (["export", "--geotiff", "g.tif"], "need --grid"),
        (["export", "--test-tiles", "t.geojson"], "needs --model and --dataset"),
        (["export"], "nothing to do"),
        (["demo", "--models", ","], "no model kind"),
    ],
)
def test_user_errors_are_one_line_exit_2(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_ref_is_reported(run_dir, tmp_path, capsys) -> None:
    rc = main(["predict", "--model", str(run_dir / "models" / "sv-rbf.pt"), "--ref", "nowhere",
               "--out", str(tmp_path / "g.nc"), "--no-progress"])
    assert rc == 2 and "name:lon,lat" in capsys.readouterr().err


def test_help_states_units_and_the_real_defaults() -> None:
    sub = build_parser()._subparsers._group_actions[0].choices
    predict_help = sub["predict"].format_help()
    assert "log10(Mbps)" in predict_help and "default 0.01 degrees" in predict_help
    assert "--chunk-rows" in predict_help and "--crs" in predict_help
    export_help = sub["export"].format_help()
    assert "--cog" in export_help and "*.geojson or *.parquet" in export_help
    # argparse wraps lines (also inside "dbk-rbf"), so compare with all whitespace removed
    demo_help = "".join(sub["demo"].format_help().split())
    d = DemoConfig()

    def says(text: str) -> bool:
        return "".join(text.split()) in demo_help

    # the defaults the help promises are the ones DemoConfig uses
    schedule = d.train_config()
    assert says(f"(default {schedule.epochs} at lr {schedule.lr:g}, batch {schedule.batch_size};")
    # explicit values win over either schedule
    assert DemoConfig(paper_size=True, epochs=5).train_config().epochs == 5
    assert DemoConfig(epochs=7, lr=0.5).train_config().lr == 0.5
    assert says(f"(default {d.resolution} degrees")
    assert says("(default all: the 19 complete quarters") and d.quarters is None
    assert says(f"(default {','.join(DEMO_MODELS)})") and tuple(d.models) == DEMO_MODELS
    assert says(f"(default {d.region})") and says(f"(default {d.target})")


def test_a_model_fitted_on_a_polygon_file_maps_its_own_region_by_default(pr_dataset, tmp_path, capsys) -> None:
    """A region read from a polygon file is named after the file's stem, which no region lookup
    knows: ``geodbk predict`` without ``--region`` maps the stored polygon, not the name."""
    import dataclasses

    import shapely

    from geodbk.fit.fitting import fit_dataset
    from geodbk.ingest.regions import Region

    west_half = shapely.box(-67.3, 17.9, -66.4, 18.55)  # the west of Puerto Rico
    inside = shapely.contains_xy(west_half, pr_dataset.frame["lon"], pr_dataset.frame["lat"])
    dataset = dataclasses.replace(pr_dataset, frame=pr_dataset.frame[inside], region=Region("my_towns", west_half))
    model = fit_dataset(dataset, "knn", progress=False, device="cpu")
    assert model.info.region == "my_towns"
    model.save(tmp_path / "knn.pt")
    out = tmp_path / "west.nc"
    assert main(["predict", "--model", str(tmp_path / "knn.pt"), "--resolution", "0.05", "--out", str(out),
                 "--no-progress"]) == 0
    grid = open_grid(out).load()
    assert grid.attrs["region"] == "my_towns"
    assert float(grid["x"].min()) > -67.35 and float(grid["x"].max()) < -66.35  # the polygon's extent only
    lon, lat = np.meshgrid(grid["x"].values, grid["y"].values)
    np.testing.assert_array_equal(np.isfinite(grid["mean"].values), shapely.contains_xy(west_half, lon, lat))
