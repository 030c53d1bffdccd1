"""geodbk.viewer, the dashboard's logic without a browser: catalog, cells, Mercator, tiles,
kernel-slice correlation, units, layers and tables.

Most tests build small grids and frames by hand; the catalog tests read a tiny run folder
that ``run_demo`` writes into tmp_path (two quarters, a GP and the knn baseline, ~20 s).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tokenize
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rioxarray  # noqa: F401
import shapely
import xarray as xr

from geodbk.errors import InputDataError
from geodbk.prediction import Prediction, probability_below, to_data_units
from geodbk.quarters import Quarter
from geodbk.viewer import (
    ALL_QUARTERS,
    LAYER_BY_KEY,
    Catalog,
    PointPrediction,
    Series,
    at_quarter,
    benchmark_options,
    cell_km,
    change_span,
    colour_limits,
    correlation,
    decision_summary,
    distance_km,
    grid_cells_lonlat,
    grid_quarters,
    half_distance,
    layer_cmap,
    layer_label,
    layer_options,
    layer_variable,
    loaders,
    lonlat_to_mercator,
    mercator_raster,
    mercator_to_lonlat,
    metrics_tables,
    name_column,
    observed_near,
    on_cells,
    outline_paths,
    p_meets,
    plan_marks,
    posterior_correlation,
    resolve_layer,
    shown_quarter,
    slice_at_cells,
    summary_table,
    table_benchmark,
    tiles_geojson,
    tiles_in_quarter,
    with_mercator,
)

REPO = Path(__file__).resolve().parents[1]
QUARTERS = ["2023Q2", "2023Q3", "2023Q4"]
Q2, Q3, Q4 = map(Quarter.parse, QUARTERS)


def make_grid(*, per_quarter: bool = True, units: str = "Mbps", target: str = "download") -> xr.Dataset:
    """A 3 x 4 lon/lat grid, NaN in the corner cell (0, 0) (outside the region)."""
    x, y = np.array([-66.3, -66.2, -66.1, -66.0]), np.array([18.4, 18.3, 18.2])
    mean = np.arange(12, dtype=np.float64).reshape(3, 4) / 10 + 1.0
    mean[0, 0] = np.nan
    if per_quarter:
        cube = np.stack([mean + q for q in range(len(QUARTERS))])
        coords = {"time": pd.PeriodIndex(QUARTERS, freq="Q").start_time, "quarter": ("time", QUARTERS), "y": y, "x": x}
        data = {"mean": (("time", "y", "x"), cube), f"mean_{units.lower()}": (("time", "y", "x"), 10 * cube)}
        attrs: dict = {}
    else:
        coords, attrs = {"y": y, "x": x}, {"quarter": "2023Q4"}
        data = {"mean": (("y", "x"), mean)}
    data["change"] = (("y", "x"), mean - 1.5)
    ds = xr.Dataset(data, coords=coords, attrs={"target": target, "units": units, **attrs})
    ds["change"].attrs.update(quarter_from="2022Q4", quarter_to="2023Q4")
    return ds.rio.write_crs("EPSG:4326")


# --- the one back-transform ----------------------------------------------------------------
def _code_tokens(source: str) -> str:
    """The source without strings and comments (docstrings may say ``10**mean``)."""
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            kept.append(tok.string)
    return " ".join(kept)


def test_no_hand_written_back_transform_in_the_viewer_apps_or_notebook():
    """geodbk.prediction.to_data_units is the one log10 -> data units back-transform."""
    power_of_ten = re.compile(r"\b10(\.0*)?\s*\*\*|power\s*\(\s*10")
    sources = {p: p.read_text() for p in [*(REPO / "apps").glob("*.py"), *(REPO / "geodbk" / "viewer").glob("*.py")]}
    notebook = json.loads((REPO / "notebooks" / "spatial_analysis.ipynb").read_text())
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            sources[Path(f"notebook cell {i}")] = "".join(cell["source"]).replace("%matplotlib", "#")
    assert len(sources) > 10
    offenders = [str(path) for path, text in sources.items() if power_of_ten.search(_code_tokens(text))]
    assert offenders == []
    assert power_of_ten.search(_code_tokens("median = 10 ** mean\n"))  # the check can fail


# --- Web Mercator ------------------------------------------------------------------------------
@pytest.mark.parametrize("lon, lat", [(0.0, 0.0), (-66.1, 18.4), (-157.8, 21.3), (179.9, -60.0)])
def test_mercator_round_trips(lon, lat):
    x, y = lonlat_to_mercator(lon, lat)
    assert mercator_to_lonlat(x, y) == pytest.approx((lon, lat), abs=1e-9)


def test_mercator_known_values_and_frames():
    assert lonlat_to_mercator(0.0, 0.0) == pytest.approx((0.0, 0.0), abs=1e-6)
    assert lonlat_to_mercator(180.0, 0.0)[0] == pytest.approx(20037508.3428, abs=1e-3)
    frame = pd.DataFrame({"lon": [-66.1, 0.0], "lat": [18.4, 0.0]})
    out = with_mercator(frame)
    assert list(out.columns) == ["lon", "lat", "easting", "northing"] and "easting" not in frame
    assert (out.loc[0, "easting"], out.loc[0, "northing"]) == pytest.approx(lonlat_to_mercator(-66.1, 18.4))


def test_outline_paths_give_every_ring_in_mercator():
    hole = [(-66.2, 18.2), (-66.1, 18.2), (-66.1, 18.3)]
    polygon = shapely.Polygon([(-66.5, 18.0), (-65.5, 18.0), (-65.5, 18.5), (-66.5, 18.5)], [hole])
    rings = outline_paths(shapely.MultiPolygon([polygon, shapely.box(-67.5, 18.0, -67.0, 18.5)]))
    assert len(rings) == 3 and all(r.ndim == 2 and r.shape[1] == 2 for r in rings)
    assert rings[0][0] == pytest.approx(lonlat_to_mercator(-66.5, 18.0))
    assert len(rings[1]) == 4  # the hole, closed


def test_mercator_raster_keeps_values_and_moves_to_metres():
    warped = mercator_raster(at_quarter(make_grid()["mean"], Q4))
    assert warped.rio.crs is None or "spatial_ref" not in warped.coords
    assert float(warped["x"].min()) < -7.3e6 and float(warped["y"].max()) > 2.0e6  # metres, not degrees
    values = warped.to_numpy()
    assert np.nanmax(values) == pytest.approx(np.nanmax(make_grid()["mean"].isel(time=-1)))
    assert np.isnan(values).any()  # the corner outside the region stays empty


# --- cells and quarters ------------------------------------------------------------------------
def test_grid_quarters_of_both_layouts():
    assert grid_quarters(make_grid()) == [Q2, Q3, Q4]
    assert grid_quarters(make_grid(per_quarter=False)) == [Q4]
    assert grid_quarters(make_grid(per_quarter=False).assign_attrs(quarter=None)) == []
    assert grid_quarters(None) == []


def test_at_quarter_picks_the_quarter_else_the_last():
    grid = make_grid()
    assert at_quarter(grid["mean"], Q3).dims == ("y", "x")
    assert float(at_quarter(grid["mean"], Q3)[1, 1]) == pytest.approx(float(grid["mean"][1, 1, 1]))
    assert float(at_quarter(grid["mean"], Quarter(1999, 1))[1, 1]) == pytest.approx(float(grid["mean"][2, 1, 1]))
    assert "quarter" not in at_quarter(grid["mean"], None).coords
    flat = make_grid(per_quarter=False)["mean"]
    xr.testing.assert_identical(at_quarter(flat, Quarter(2023, 1)), flat)


def test_shown_quarter_and_change_span():
    grid = make_grid()
    assert shown_quarter(grid, Q3, None) == Q3
    assert shown_quarter(grid, None, None) == shown_quarter(grid, Quarter(1999, 1), None) == Q4
    assert shown_quarter(None, None, Quarter(2021, 1)) == Quarter(2021, 1)
    assert change_span(grid) == "2022Q4 → 2023Q4"
    assert change_span(xr.Dataset(attrs={"change": "2021Q1:2022Q1"})) == "2021Q1 → 2022Q1"


def test_grid_cells_lonlat_and_on_cells():
    grid = make_grid()
    lonlat, inside = grid_cells_lonlat(grid)
    assert inside.shape == (3, 4) and not inside[0, 0] and inside.sum() == 11
    assert lonlat.shape == (11, 2)
    assert lonlat[0] == pytest.approx((-66.2, 18.4)) and lonlat[-1] == pytest.approx((-66.0, 18.2))
    values = on_cells(grid, inside, np.arange(11.0), "k")
    assert values.name == "k" and values.dims == ("y", "x")
    assert np.isnan(values[0, 0]) and float(values[2, 3]) == 10.0


def test_grid_cells_of_a_projected_grid_are_in_degrees():
    grid = make_grid(per_quarter=False)
    utm = grid.rio.reproject("EPSG:32619", resolution=10_000.0, nodata=np.nan)
    lonlat, inside = grid_cells_lonlat(utm)
    assert inside.sum() == len(lonlat) > 0
    assert np.all((lonlat[:, 0] > -67.0) & (lonlat[:, 0] < -65.5)) and np.all(np.abs(lonlat[:, 1] - 18.3) < 0.5)


# --- observed tiles ----------------------------------------------------------------------------
def tiles_frame() -> pd.DataFrame:
    lat0 = 18.4
    return pd.DataFrame(
        {
            "lon": [-66.1, -66.1, -66.1, -66.0],
            "lat": [lat0, lat0 + 0.5 / 111.195, lat0 + 2 / 111.195, lat0],  # 0, 0.5 and 2 km north; ~10.6 km east
            "year": [2023, 2023, 2022, 2023],
            "quarter": [4, 3, 4, 4],
            "value": [10.0, 20.0, 30.0, 40.0],
            "tests": [5, 6, 7, 8],
            "split": ["train", "test", "val", "train"],
        }
    )


def test_distance_km():
    assert distance_km(np.array([0.0]), np.array([1.0]), 0.0, 0.0)[0] == pytest.approx(111.195, rel=1e-4)
    assert distance_km(np.array([10.0]), np.array([0.0]), 10.0, 0.0)[0] == 0.0
    d = distance_km(np.array([-66.0, 2.0]), np.array([18.0, 50.0]), -66.5, 18.2)
    assert d.shape == (2,) and d[0] == pytest.approx(distance_km(np.array([-66.5]), np.array([18.2]), -66.0, 18.0)[0])


def test_observed_near_and_tiles_in_quarter():
    frame = tiles_frame()
    near = observed_near(frame, -66.1, 18.4)
    assert list(near.columns) == ["quarter_start", "quarter_label", "observed_value", "tests", "split", "distance_km"]
    assert near["observed_value"].tolist() == [10.0, 20.0]
    assert near["quarter_label"].tolist() == ["2023Q4", "2023Q3"]
    assert near["quarter_start"].tolist() == [pd.Timestamp("2023-10-01"), pd.Timestamp("2023-07-01")]
    assert near["distance_km"].to_numpy() == pytest.approx([0.0, 0.5], abs=1e-3)
    assert len(observed_near(frame, -66.1, 18.4, radius_km=3.0)) == 3
    assert observed_near(frame, 0.0, 0.0).empty
    assert tiles_in_quarter(frame, "2023Q4")["value"].tolist() == [10.0, 40.0]
    assert len(tiles_in_quarter(frame, ALL_QUARTERS)) == 4
    assert json.loads(tiles_geojson(None)) == {"type": "FeatureCollection", "features": []}


# --- correlation -------------------------------------------------------------------------------
class ScaledRBF:
    """A non-stationary toy GP: k(x, y) = s(x) s(y) exp(-|x - y|² / 2), s(x) = 1 + lon²."""

    @staticmethod
    def _scale(lonlat: np.ndarray) -> np.ndarray:
        return 1.0 + lonlat[:, 0] ** 2

    def kernel_slice(self, lonlat, ref_lonlat, time=None):
        sq = ((lonlat[:, None, :] - ref_lonlat[None, :, :]) ** 2).sum(-1)
        return np.outer(self._scale(lonlat), self._scale(ref_lonlat)) * np.exp(-0.5 * sq)

    def prior_variance(self, lonlat, time=None):
        return self._scale(lonlat) ** 2


def test_correlation_of_a_slice_is_one_at_its_reference_point():
    model = ScaledRBF()
    cells = np.random.default_rng(0).uniform(-2, 2, size=(50, 2))
    ref = (float(cells[7, 0]), float(cells[7, 1]))
    rho = slice_at_cells(model, cells, ref, None, "correlation")
    assert rho.shape == (50,)
    assert rho[7] == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.abs(rho) <= 1.0 + 1e-12)
    expected = np.exp(-0.5 * ((cells - cells[7]) ** 2).sum(1))  # the scales cancel
    assert rho == pytest.approx(expected, rel=1e-12)
    covariance = slice_at_cells(model, cells, ref, None, "covariance")
    assert covariance[7] == pytest.approx(model.prior_variance(cells[[7]])[0])
    # a cached prior variance gives the same correlation
    assert slice_at_cells(model, cells, ref, None, "correlation", model.prior_variance(cells)) == pytest.approx(rho)


def test_correlation_of_several_slices_and_a_vanishing_variance():
    model = ScaledRBF()
    cells = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 1.0]])
    k = model.kernel_slice(cells, cells[:2])
    rho = correlation(k, model.prior_variance(cells), model.prior_variance(cells[:2]))
    assert rho.shape == (3, 2) and np.diag(rho[:2]) == pytest.approx([1.0, 1.0])
    assert rho[:, 1] == pytest.approx(correlation(k[:, 1], model.prior_variance(cells), 4.0))
    assert np.isfinite(correlation(np.array([0.0]), np.array([0.0]), 0.0)).all()


class ExponentialPosterior:
    """A fake map model whose posterior is a dense two-target Gaussian (a real MapPosterior):
    Cov(f_a(x), f_b(y)) = s(x) s(y) B_ab exp(-|x - y| / L), s(x) = 1 + lon², in degrees."""

    length = 0.7
    targets = np.array([[1.0, 0.4], [0.4, 2.0]])

    def posterior(self, lonlat, time=None, *, covariance=True):
        from scipy import sparse

        from geodbk.fit.posterior import MapPosterior

        lonlat = np.asarray(lonlat, dtype=np.float64)
        n = len(lonlat)
        scale = 1.0 + lonlat[:, 0] ** 2
        distance = np.sqrt(((lonlat[:, None, :] - lonlat[None, :, :]) ** 2).sum(-1))
        dense = np.kron(np.outer(scale, scale) * np.exp(-distance / self.length), self.targets)
        values, vectors = np.linalg.eigh(dense)
        root = vectors * np.sqrt(np.clip(values, 0.0, None))  # dense = root root^T
        return MapPosterior(
            targets=("download", "upload"),
            mean=np.zeros((n, 2)),
            factor=root.reshape(n, 2, 2 * n),
            local=sparse.csr_matrix((2 * n, 2 * n)),
            nugget=np.broadcast_to(0.01 * np.eye(2), (n, 2, 2)).copy(),
            per_test=np.broadcast_to(0.05 * np.eye(2), (n, 2, 2)).copy(),
        )


def test_posterior_correlation_is_one_at_the_reference_and_the_dense_formula_elsewhere():
    model = ExponentialPosterior()
    cells = np.random.default_rng(1).uniform(-1.5, 1.5, size=(23, 2))
    ref = (float(cells[5, 0]), float(cells[5, 1]))
    rho = posterior_correlation(model, cells, ref, None, block=4)  # blocks of 4 cells with the ref
    assert rho.shape == (23,)
    assert rho[5] == pytest.approx(1.0, abs=1e-9)
    expected = np.exp(-np.sqrt(((cells - cells[5]) ** 2).sum(1)) / model.length)  # scales and B cancel
    assert rho == pytest.approx(expected, rel=1e-8, abs=1e-9)
    assert posterior_correlation(model, cells, ref, None) == pytest.approx(rho, abs=1e-9)  # one block


def test_half_distance_of_an_exponential_correlation_is_l_ln_2_within_a_bin():
    rng = np.random.default_rng(0)
    length, bin_km = 5.0, 1.0
    distance = rng.uniform(0.0, 60.0, 20_000)
    half = half_distance(distance, np.exp(-distance / length), bin_km)
    assert half.km == pytest.approx(length * np.log(2.0), abs=bin_km)
    low, high = half.bin
    assert high - low == bin_km and low <= length * np.log(2.0) + bin_km and high >= length * np.log(2.0)
    assert "falls to 0.5 at 3.5 km" in half.text()
    # the first bin below 0.5 is the smallest such distance bin, whatever comes after it
    rho = np.where(distance > 30.0, 0.9, np.exp(-distance / length))
    assert half_distance(distance, rho, bin_km).bin == half.bin
    # never below 0.5 (a flat prior sheet): no distance; below at once: within the first bin
    flat = half_distance(distance, np.full_like(distance, 0.8), bin_km)
    assert flat.km is None and flat.bin is None and "stays above 0.5 out to 60 km" in flat.text()
    steep = half_distance(distance, np.exp(-distance / 0.05), 2.0)
    assert steep.bin == (0.0, 2.0) and 0.0 < steep.km < 2.0 and "finer than the grid" in steep.text()
    with pytest.raises(ValueError):
        half_distance(distance, rho, 0.0)


def test_cell_km_is_the_grid_spacing():
    lon, lat = np.meshgrid(np.arange(-66.5, -66.0, 0.02), np.arange(18.0, 18.3, 0.02))
    km = cell_km(np.column_stack([lon.ravel(), lat.ravel()]))
    assert km == pytest.approx(0.02 * 111.195 * np.cos(np.radians(18.14)), rel=0.02)
    assert cell_km(np.array([[0.0, 0.0]])) == 1.0


# --- decisions: the hexagon table and plan --------------------------------------------------------
def hexagon_table(n: int = 40, seed: int = 0) -> pd.DataFrame:
    """A hexagon table as ``summarize_hexagons`` writes it: p_meets of 35/3 from each hexagon's
    2 x 2 posterior block through MapPosterior.probability_meets, the sds and correlation from the same blocks."""
    import geopandas as gpd
    import h3

    from geodbk.fit.posterior import meets_probability

    rng = np.random.default_rng(seed)
    mean = np.column_stack([rng.normal(np.log10(35.0), 0.4, n), rng.normal(np.log10(3.0), 0.3, n)])
    root = rng.normal(0.0, 0.2, (n, 2, 2))
    block = root @ root.transpose(0, 2, 1) + 0.01 * np.eye(2)
    sd = np.sqrt(np.diagonal(block, axis1=1, axis2=2))
    cells = list(h3.grid_disk(h3.latlng_to_cell(18.4, -66.1, 8), 4))[:n]
    polygons = [shapely.Polygon([(lng, lat) for lat, lng in h3.cell_to_boundary(c)]) for c in cells]
    return gpd.GeoDataFrame(
        {
            "h3": cells,
            "quarter": "2023Q4",
            "mean_log10_download": mean[:, 0],
            "sd_log10_download": sd[:, 0],
            "median_download_mbps": to_data_units(mean[:, 0], sd[:, 0])[0],
            "mean_log10_upload": mean[:, 1],
            "sd_log10_upload": sd[:, 1],
            "median_upload_mbps": to_data_units(mean[:, 1], sd[:, 1])[0],
            "correlation": block[:, 0, 1] / (sd[:, 0] * sd[:, 1]),
            "p_meets": meets_probability(mean, block, (np.log10(35.0), np.log10(3.0))),
            "share_meets": 0.5,
            "benchmark": "35/3",
            "observed_tiles": rng.integers(0, 4, n),
        },
        geometry=polygons,
        crs=4326,
    )


def test_p_meets_of_the_tables_benchmark_is_its_p_meets_and_lower_benchmarks_are_likelier():
    table = hexagon_table()
    assert table_benchmark(table) == "35/3"
    np.testing.assert_allclose(p_meets(table, "35/3"), table["p_meets"], rtol=0, atol=1e-9)
    slow, slower = p_meets(table, "7/1"), p_meets(table, "5/1")
    assert np.all(slower > table["p_meets"]) and np.all(slow > table["p_meets"]) and np.all(slower >= slow)
    assert benchmark_options(table) == ["5/1", "7/1", "35/3"]
    assert benchmark_options(table.assign(benchmark="100/20")) == ["5/1", "7/1", "35/3", "100/20"]
    summary = decision_summary(table["p_meets"].to_numpy(), "35/3")
    assert summary.hexagons == 40 and summary.likely_meet == int((table["p_meets"] >= 0.5).sum())
    assert summary.expected_wrong == pytest.approx(np.minimum(table["p_meets"], 1 - table["p_meets"]).sum())
    assert "35/3 Mbps" in summary.text()


def test_hexagon_columns_and_plan_marks_are_in_web_mercator():
    from geodbk.viewer.decisions import check_table, hexagon_columns

    table = hexagon_table()
    columns = hexagon_columns(table)
    assert len(columns["xs"]) == len(table) and all(len(x) == 7 for x in columns["xs"])  # closed hexagons
    x0, y0 = lonlat_to_mercator(*table.geometry.iloc[0].exterior.coords[0])
    assert (columns["xs"][0][0], columns["ys"][0][0]) == pytest.approx((x0, y0))
    np.testing.assert_array_equal(columns["observed_tiles"], table["observed_tiles"])
    plan = table.iloc[[7, 3, 11]].assign(rank=[2, 1, 3])[["rank", "h3", "geometry"]]
    marks = plan_marks(plan)
    assert marks["rank"].tolist() == [1, 2, 3] and marks["label"].tolist() == ["1", "2", "3"]
    assert marks["h3"][0] == table["h3"].iloc[3]
    inside = table.to_crs(3857).geometry.iloc[3]
    assert inside.contains(shapely.Point(marks["x"][0], marks["y"][0]))
    with pytest.raises(InputDataError, match="correlation"):
        check_table(table.drop(columns="correlation"))


# --- units -------------------------------------------------------------------------------------
def test_point_prediction_and_series_use_the_one_back_transform():
    prediction = Prediction(np.array([1.2, 1.5]), np.array([0.1, 0.3]))
    point = PointPrediction.from_prediction(prediction, 1)
    median, lower, upper = to_data_units(1.5, 0.3)
    assert (point.median, point.lower, point.upper) == pytest.approx((median, lower, upper))
    assert point.median == pytest.approx(10**1.5)  # the back-transform itself is tested here, once
    assert (point.mean, point.sd, point.pi_width) == pytest.approx((1.5, 0.3, float(prediction.pi_width[1])))
    assert (point.log_lower, point.log_upper) == pytest.approx((prediction.lower[1], prediction.upper[1]))
    series = Series.from_predictions([Q3, Q4], [prediction.subset(np.array([i])) for i in range(2)])
    expected = to_data_units(prediction.mean, prediction.sd)
    for got, want in zip((series.median, series.lower, series.upper), expected, strict=True):
        assert got == pytest.approx(want)
    assert series.quarters == [Q3, Q4]


# --- layers ------------------------------------------------------------------------------------
def test_layer_variables_labels_and_colours():
    grid = make_grid()
    assert layer_variable(LAYER_BY_KEY["median"], grid) == "mean_mbps"
    assert layer_variable(LAYER_BY_KEY["change_units"], make_grid(units="ms", target="latency")) == "change_ms"
    assert layer_options(grid) == {"Predictive median": "median", "Change (log10)": "change"}
    assert layer_options(None) == {"Predictive median": "median"}
    assert resolve_layer("sd", grid).key == "median" and resolve_layer("change", grid).key == "change"
    with_p = grid.assign(p_below=grid["mean"] * 0).assign_attrs(threshold=35.0)
    assert layer_label(LAYER_BY_KEY["p_below"], with_p) == "P(download < 35 Mbps)"
    latency = make_grid(units="ms", target="latency")
    assert layer_label(LAYER_BY_KEY["p_increase"], latency) == "P(increase)"
    assert layer_label(LAYER_BY_KEY["p_increase"], grid) == "P(improvement)"
    assert layer_cmap(LAYER_BY_KEY["change"], latency) == "RdBu_r"
    assert layer_cmap(LAYER_BY_KEY["change"], grid) == "RdBu"


def test_colour_limits():
    values = np.concatenate([np.arange(101.0), [np.nan]])
    assert colour_limits(values, LAYER_BY_KEY["median"]) == (0.0, 100.0, (2.0, 98.0))
    assert colour_limits(values, LAYER_BY_KEY["p_below"]) == (0.0, 1.0, (0.0, 1.0))
    start, end, (low, high) = colour_limits(values - 80, LAYER_BY_KEY["change"])
    assert (start, end) == (-80.0, 80.0) and low == -high and 0 < high < 80
    assert colour_limits(np.full(4, np.nan), LAYER_BY_KEY["sd"]) is None


# --- tables ------------------------------------------------------------------------------------
def test_summary_and_metrics_tables(tmp_path):
    summary = pd.DataFrame(
        {
            "GEOID": ["1", "2"],
            "median_mbps": [40.04, 12.34],
            "lower_mbps": [20.0, 5.0],
            "upper_mbps": [80.0, 30.0],
            "cells": [3, 4],
            "extra": [0, 0],
        }
    )
    table = summary_table(summary, "Mbps")
    assert list(table.columns) == ["GEOID", "median_mbps", "lower_mbps", "upper_mbps", "cells"]
    assert table["median_mbps"].tolist() == [12.3, 40.0]  # slowest first, one decimal
    assert name_column(summary) == "GEOID" and name_column(summary.drop(columns="GEOID")) is None
    path = tmp_path / "metrics.csv"
    pd.DataFrame({"model": ["a", "a", "b"], "group": ["all", "urban", "all"], "nll": [0.12345, 0.2, 0.3]}).to_csv(path)
    mine, everything = metrics_tables(path, "a")
    assert len(mine) == 2 and len(everything) == 3 and mine["nll"].iloc[0] == 0.123
    assert metrics_tables(path, "zzz")[0].empty
    pd.DataFrame({"model": ["a", "a", "b"], "target": ["download", "upload", "download"], "group": ["all"] * 3,
                  "nll": [0.1, 0.2, 0.3]}).to_csv(path, index=False)
    mine, everything = metrics_tables(path, "a", "upload")
    assert mine["nll"].tolist() == [0.2] and everything.index.names == ["model", "target", "group"]
    assert len(metrics_tables(path, "a")[0]) == 2


# --- the catalog over a real run folder --------------------------------------------------------
@pytest.fixture(scope="module")
def run_folder(small_demo) -> Path:
    """The shared tiny demo run's folder (``conftest.small_demo``: 2023Q3-2023Q4; dbk-rbf of
    download and upload, sv-rbf and knn; an H3 table and a plan)."""
    return small_demo[0].run.root


def test_catalog_finds_the_fits_of_a_run_folder(run_folder, tmp_path):
    (tmp_path / "empty").mkdir()
    catalog = Catalog.scan([run_folder, tmp_path / "empty", tmp_path / "missing"])
    assert [(f.kind, f.target) for f in catalog.fits] == [("dbk-rbf", "download"), ("knn", "download"),
                                                          ("sv-rbf", "download")]
    assert len(catalog.problems) == 2 and "empty" in catalog.problems[0] and "missing" in catalog.problems[1]
    assert catalog.targets == ["download"] and catalog.for_target("latency") == []
    fit = catalog.fits[0]
    assert fit.label == "dbk-rbf (run, download)"
    for path in (fit.model_path, fit.grid_path, fit.geotiff_path, fit.test_tiles_path, fit.dataset_path):
        assert path.exists(), path
    assert grid_quarters(fit.grid()) == fit.dataset().quarters == [Q3, Q4]
    assert {"pi_width", "urban_rural"} <= set(fit.test_tiles().columns)
    assert fit.mercator_layer("mean", Q3).dims == ("y", "x")


def test_readers_are_cached_until_the_file_changes(run_folder):
    fit = Catalog.scan([run_folder]).fits[0]
    assert fit.model() is fit.model() and fit.grid() is fit.grid()
    before = fit.grid()
    stamp = loaders.stamp(fit.grid_path)
    os.utime(fit.grid_path, (stamp + 10, stamp + 10))
    assert fit.grid() is not before
    xr.testing.assert_identical(fit.grid(), before)


def test_real_gp_slice_correlation_and_reference(run_folder):
    fit = Catalog.scan([run_folder]).for_target("download")[0]
    model, grid = fit.model(), fit.grid()
    lon, lat = fit.default_reference()
    assert fit.dataset().region.geometry.buffer(0.05).contains(shapely.Point(lon, lat))
    lonlat, inside = grid_cells_lonlat(grid)
    var_x = fit.prior_variance(Q4)
    assert var_x.shape == (len(lonlat),) and np.all(var_x > 0)
    cells = np.vstack([lonlat, [[lon, lat]]])
    rho = slice_at_cells(model, cells, (lon, lat), Q4, "correlation")
    assert rho[-1] == pytest.approx(1.0, abs=1e-5)
    assert np.all(np.abs(rho) <= 1.0 + 1e-5)
    cached = slice_at_cells(model, lonlat, (lon, lat), Q4, "correlation", var_x)
    assert cached == pytest.approx(rho[:-1], rel=1e-6, abs=1e-9)
    point = PointPrediction.from_prediction(model.predict(np.array([[lon, lat]]), "2023Q4"))
    assert (point.median, point.lower, point.upper) == pytest.approx(to_data_units(point.mean, point.sd))
    assert point.lower < point.median < point.upper


def test_real_hexagon_table_and_posterior_correlation(run_folder):
    """A run's hexagon table (download and upload dbk-rbf): P(meets 35/3) recomputed from its
    columns is its p_meets; 5/1 is likelier everywhere; the plan is read; the map model's
    posterior correlation with a point is 1 at the point and falls off far faster than the prior's."""
    fit = Catalog.scan([run_folder]).for_target("download")[0]
    assert fit.model().targets == ("download", "upload")
    table, plan = fit.hexagons(), fit.plan()
    assert table is not None and len(table) > 100 and table_benchmark(table) == "35/3"
    np.testing.assert_allclose(p_meets(table, "35/3"), table["p_meets"], rtol=0, atol=1e-9)
    easy = p_meets(table, "5/1")
    assert np.all((easy > table["p_meets"]) | (table["p_meets"] == 1.0))
    assert plan is not None and plan["rank"].tolist() == list(range(1, len(plan) + 1))
    assert set(plan["h3"]) <= set(table["h3"])
    knn = next(f for f in Catalog.scan([run_folder]).fits if f.kind == "knn")
    assert knn.hexagons() is None and knn.plan() is None
    lon, lat = fit.default_reference()
    lonlat, _ = grid_cells_lonlat(fit.grid())
    cells = np.vstack([lonlat[:60], [[lon, lat]]])
    rho = posterior_correlation(fit.model(), cells, (lon, lat), Q4)
    assert rho[-1] == pytest.approx(1.0, abs=1e-6)
    assert np.all(np.abs(rho) <= 1.0 + 1e-6)
    cached = fit.posterior_correlation((lon, lat), Q4)
    assert cached.shape == (len(lonlat),) and cached[:60] == pytest.approx(rho[:60], abs=1e-6)
    prior = slice_at_cells(fit.model(), lonlat, (lon, lat), Q4, "correlation", fit.prior_variance(Q4))
    assert np.median(cached) < np.median(prior)


def test_a_model_file_that_does_not_load_is_one_line_and_the_others_stay(run_folder, tmp_path, monkeypatch):
    """One bad model file in a run folder made the whole dashboard a blank page; now the catalog
    leaves that model out with a one-line problem, which the page shows above the others."""
    import importlib.util

    run = tmp_path / "run"
    shutil.copytree(run_folder, run)
    (run / "models" / "broken.pt").write_bytes(b"not a model\n" * 10)
    catalog = Catalog.scan([run])
    assert [f.kind for f in catalog.fits] == ["dbk-rbf", "knn", "sv-rbf"]
    assert len(catalog.problems) == 1 and "broken.pt" in catalog.problems[0] and "\n" not in catalog.problems[0]
    monkeypatch.syspath_prepend(str(REPO / "apps"))  # the app imports its sibling dashboard_views
    spec = importlib.util.spec_from_file_location("dashboard_app", REPO / "apps" / "dashboard.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    page = app.Dashboard(catalog, basemap=False)
    assert page.problems.visible and "broken.pt" in page.problems.object


# --- the map's hover readout and the serve command ----------------------------------------------
def test_cell_readout_is_the_back_transform_and_p_below_of_each_cell():
    from geodbk.viewer.units import READOUT_VARIABLES, cell_readout

    mean = np.array([[1.0, 1.5], [np.nan, 2.0]])
    sd = np.array([[0.1, 0.3], [np.nan, 0.2]])
    cells = xr.Dataset({"mean": (("y", "x"), mean), "sd": (("y", "x"), sd)}, attrs={"units": "Mbps", "threshold": 35.0})
    readout = cell_readout(cells)
    assert list(readout.data_vars) == list(READOUT_VARIABLES)
    median, lower, upper = to_data_units(mean, sd)
    np.testing.assert_allclose(readout["readout_median"], median)
    np.testing.assert_allclose(readout["readout_lower"], lower)
    np.testing.assert_allclose(readout["readout_upper"], upper)
    np.testing.assert_allclose(readout["readout_p_below"], probability_below(mean, sd, np.log10(35.0)))
    assert np.isnan(readout["readout_median"][1, 0])  # outside the region
    # a latency grid in ms, without a threshold: no P(below)
    latency = cell_readout(xr.Dataset(dict(cells.data_vars), attrs={"units": "ms"}))
    assert list(latency.data_vars) == list(READOUT_VARIABLES[:3])
    np.testing.assert_allclose(latency["readout_median"], median)


def test_geodbk_serve_no_basemap_reaches_the_app(run_folder, monkeypatch):
    import subprocess

    from geodbk.cli import main

    launched: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda executable, cmd: launched.append(cmd))
    monkeypatch.setattr(subprocess, "call", lambda cmd: 0)
    for flags in ([], ["--no-basemap"]):
        assert main(["serve", "--run", str(run_folder), "--port", "5999", *flags]) == 0
    with_basemap, without = launched
    assert "--no-basemap" not in with_basemap
    app_args = without[without.index("--args") + 1 :]
    assert app_args == ["--run", str(run_folder.resolve()), "--no-basemap"]


def dashboard_app(monkeypatch):
    """``apps/dashboard.py`` imported as a module (it imports its sibling dashboard_views)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "apps"))
    spec = importlib.util.spec_from_file_location("dashboard_app", REPO / "apps" / "dashboard.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    return app


def test_dashboard_map_has_a_basemap_layer_only_when_asked(run_folder, monkeypatch):
    import holoviews as hv

    app = dashboard_app(monkeypatch)
    catalog = Catalog.scan([run_folder])
    for basemap in (True, False):
        page = app.Dashboard(catalog, basemap=basemap)
        rendered = hv.render(page.map)
        tiles = [r for r in rendered.renderers if type(r).__name__ == "TileRenderer"]
        assert len(tiles) == int(basemap) and page.basemap.visible is basemap
        assert rendered.sizing_mode != "fixed"  # the map follows the page's width
    shown = app.Dashboard(catalog, basemap=True)  # the toggle hides its tile layer
    shown.basemap.value = False
    assert [r.visible for r in hv.render(shown.map).renderers if type(r).__name__ == "TileRenderer"] == [False]


def test_dashboard_raster_carries_the_saved_grids_data_units_and_p_below(run_folder, monkeypatch):
    """The hover readout of every map pixel equals the grid's own mean_mbps, lower_mbps,
    upper_mbps and p_below layers there (written by the maps schema from the model's prediction)."""
    app = dashboard_app(monkeypatch)
    page = app.Dashboard(Catalog.scan([run_folder]), basemap=False)
    fit = page.fit
    image = page._raster(fit, "sd", (0.0, 1.0), QUARTERS[-1])
    assert [d.name for d in image.vdims] == [
        "sd",
        "readout_median",
        "readout_lower",
        "readout_upper",
        "readout_p_below",
    ]
    for readout, saved in (
        ("median", "mean_mbps"),
        ("lower", "lower_mbps"),
        ("upper", "upper_mbps"),
        ("p_below", "p_below"),
    ):
        expected = fit.mercator_layer(saved, QUARTERS[-1]).to_numpy()
        assert np.isfinite(expected).sum() > 10
        np.testing.assert_allclose(image.data[f"readout_{readout}"].to_numpy(), expected, rtol=1e-5, atol=1e-6)
    tooltips = dict(image.opts.get("plot").kwargs["hover_tooltips"])
    assert tooltips[f"median ({QUARTERS[-1]})"] == "@readout_median{0.0} Mbps"
    assert tooltips["95% interval"] == "@readout_lower{0.0} – @readout_upper{0.0} Mbps"
    assert tooltips["P(download < 35 Mbps)"] == "@readout_p_below{0.00}"


def test_dashboard_decision_view_recolours_in_place_and_explains_a_download_only_model(run_folder, monkeypatch):
    """The Decisions tab's map keeps its hexagons and changes only its P(meets) column (and the
    hover and colour-bar labels) for another benchmark; knn gets the one-line note."""
    app = dashboard_app(monkeypatch)
    page = app.Dashboard(Catalog.scan([run_folder]), basemap=False)
    table = page.fit.hexagons()
    assert page.benchmark.options == ["5/1", "7/1", "35/3"] and page.benchmark.value == "35/3"
    page.decision_view(page.fit)
    shown = page._decision_map
    xs = shown.source.data["xs"]
    np.testing.assert_allclose(shown.source.data["p_meets"], table["p_meets"], atol=1e-9)
    page.benchmark.value = "7/1"
    assert shown.source.data["xs"] is xs
    np.testing.assert_allclose(shown.source.data["p_meets"], p_meets(table, "7/1"), atol=1e-12)
    assert dict(shown.hover.tooltips)["P(meets 7/1)"] == "@p_meets{0.00}"
    assert shown.colour_bar.title == "P(meets 7/1)" and "7/1 Mbps" in page.decision_text.object
    knn = next(f for f in page.catalog.fits if f.kind == "knn")
    note = page.decision_view(knn)
    assert page._decision_map is None and "Fit download and upload together" in note.object
