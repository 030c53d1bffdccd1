"""A model applied to a region or quarter it was not fitted on warns, and the CLI refuses
without --allow-extrapolation (a Puerto Rico model asked for Hawaii)."""

from __future__ import annotations

import warnings

import geopandas as gpd
import numpy as np
import pytest

from geodbk.cli import main
from geodbk.dataset.domain import FORECAST_QUARTERS, DomainReport
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.ingest.regions import load_region
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.predict import predict_grid

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def pr_model(pr_dataset):
    """A tiny dbk-rbf fitted on Puerto Rico 2023Q4 (one epoch)."""
    return fit_dataset(pr_dataset, "dbk-rbf", hidden=16, rank=16,
                       epochs=1, progress=False, device="cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory, pr_model):
    root = tmp_path_factory.mktemp("extrapolation")
    pr_model.save(root / "pr.pt")
    for code in ("PR", "HI"):
        gpd.GeoDataFrame({"name": [code]}, geometry=[load_region(code).geometry], crs=4326).to_file(
            root / f"{code}.geojson", driver="GeoJSON", engine="pyogrio"
        )
    return root


def cells(code: str) -> np.ndarray:
    return RegularGrid.over(load_region(code), 0.05).cells_inside()


def test_domain_report_of_places_and_quarters(pr_model) -> None:
    home = pr_model.domain_report(cells("PR"), ["2023Q4"])
    assert home.outside_share < 0.05 and home.quarters_after == 0 == home.quarters_before
    assert home.problem() is None
    away = pr_model.domain_report(cells("HI"), ["2023Q4"])
    assert away.outside_share == 1.0 and "outside its fitted extent" in away.problem()
    ahead = f"2024Q{FORECAST_QUARTERS}"  # within the forecast allowance
    assert pr_model.domain_report(cells("PR"), [ahead]).problem() is None
    late = pr_model.domain_report(cells("PR"), ["2023Q4", "2024Q3"])
    assert late.quarters_after == 3 and "3 quarters after" in late.problem()
    early = pr_model.domain_report(cells("PR"), ["2023Q2"])
    assert early.quarters_before == 2 and "before its first" in early.problem()


def test_the_warning_and_the_refusal_read_one_measurement(pr_model) -> None:
    fitted = (2019.125, 2023.875)  # 2019Q1-2023Q4
    # a few points outside and one quarter ahead: warned about, not refused
    mild = DomainReport(n_points=10, n_outside=3, queried=(2023.875, 2024.125), fitted=fitted, kind="dbk-rbf")
    assert mild.warning() == ("3 of 10 point(s) lie outside the fitted extent; 2024Q1 is one quarter after the last "
                              "fitted quarter 2023Q4: predictions there are extrapolation")
    assert mild.problem() is None
    far = DomainReport(n_points=10, n_outside=6, queried=(2018.875, 2023.875), fitted=fitted,
                       kind="dbk-rbf", region="PR")
    assert far.problem() == ("the dbk-rbf model (fitted on PR 2019Q1-2023Q4) would extrapolate: 60% of the requested "
                             "area lies outside its fitted extent; a requested quarter is 1 quarters before its first "
                             "fitted one")
    assert "2018Q4 is before the first fitted quarter 2019Q1" in far.warning()
    # the Python warning and the CLI's report of a real model agree on what they measure
    lonlat = cells("HI")[:50]
    report = pr_model.domain_report(lonlat, ["2024Q2"])
    assert pr_model.inputs.extrapolation(lonlat, "2024Q2") == report.warning()
    assert report.n_outside == 50 and report.quarters_after == 2
    # quarters are checked even before there are cells to check
    assert pr_model.domain_report(np.empty((0, 2)), ["2024Q3"]).quarters_after == 3


def test_python_grid_of_another_region_warns(pr_model) -> None:
    with pytest.warns(ExtrapolationWarning, match="outside the fitted extent"):
        predict_grid(pr_model, RegularGrid.over(load_region("HI"), 0.1), progress=False)


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("extra", [["--region", "HI"], ["--quarter", "2025Q1"], ["--change", "2022Q4:2023Q4"]],
                         ids=["hawaii", "far-future", "change-from-before"])
def test_cli_predict_refuses_extrapolation_unless_allowed(files, capsys, extra: list[str]) -> None:
    out = files / "grid.nc"
    argv = ["predict", "--model", str(files / "pr.pt"), "--resolution", "0.1", "--out", str(out), "--no-progress",
            *extra]
    assert main(argv) == 2
    assert "--allow-extrapolation" in one_line(capsys) and not out.exists()
    assert main([*argv, "--allow-extrapolation"]) == 0
    assert out.is_file() and "warning:" in capsys.readouterr().err
    out.unlink()


def test_cli_summarize_refuses_extrapolation_unless_allowed(files, capsys) -> None:
    out = files / "summary.csv"
    hawaii = ["summarize", "--model", str(files / "pr.pt"), "--polygons", str(files / "HI.geojson"),
              "--resolution", "0.1", "--all-polygons", "--out", str(out)]
    assert main(hawaii) == 2
    assert "outside its fitted extent" in one_line(capsys) and not out.exists()
    assert main([*hawaii, "--allow-extrapolation"]) == 0 and out.is_file()
    assert "warning:" in capsys.readouterr().err
    later = ["summarize", "--model", str(files / "pr.pt"), "--polygons", str(files / "PR.geojson"),
             "--resolution", "0.1", "--quarter", "2026Q1", "--out", str(files / "later.csv")]
    assert main(later) == 2
    assert "quarters after" in one_line(capsys) and not (files / "later.csv").exists()
    assert main(later[:-4] + ["--quarter", "2023Q4", "--out", str(files / "home.csv")]) == 0


@pytest.mark.parametrize("resolution", [0.01, 0.005])
def test_a_map_of_the_fitted_region_does_not_warn(pr_model, resolution) -> None:
    """Coastal cells and Mona Island lie outside the box of the training tiles but inside the
    fitted region polygon: mapping the model's own region is not extrapolation (every ordinary
    PR map warned "N of M point(s) lie outside the fitted extent")."""
    grid = RegularGrid.over(load_region("PR"), resolution)
    mona = np.array([[-67.90, 18.09]])  # Mona Island: in the PR polygon, no tile near it
    assert pr_model.domain_report(mona, ["2023Q4"]).n_outside == 0
    assert pr_model.domain_report(cells("PR"), ["2023Q4"]).n_outside == 0
    assert pr_model.domain_report(cells("HI"), ["2023Q4"]).n_outside == len(cells("HI"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExtrapolationWarning)
        pr_model.grid(resolution, quarters="2023Q4", region=load_region("PR"), progress=False)
        predict_grid(pr_model, grid, time="2023Q4", progress=False)
