"""H3 hexagon covers (geodbk.maps.hexagons), hexagon summaries (geodbk.decisions.hexagon_summary)
and ``geodbk summarize --h3``."""

from __future__ import annotations

import geopandas as gpd
import h3
import numpy as np
import pytest
import shapely

from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.ingest.regions import load_region
from geodbk.maps.hexagons import HexagonCover, sample_resolution

#: A square of about 11 km x 11 km in San Juan.
SAN_JUAN = shapely.box(-66.12, 18.36, -66.02, 18.46)


@pytest.fixture(scope="module")
def pr_region():
    return load_region("PR").geometry


@pytest.fixture(scope="module")
def pr_res7(pr_region) -> HexagonCover:
    return HexagonCover.over(pr_region, 7)


@pytest.mark.parametrize("resolution", [5, 7, 9])
def test_ids_round_trip_through_h3(pr_region, resolution) -> None:
    cover = HexagonCover.over(pr_region, resolution) if resolution < 9 else HexagonCover.over(SAN_JUAN, resolution)
    assert len(cover.ids) == len(cover.centres) == len(cover) > 0
    assert len(set(cover.ids)) == len(cover)
    for cell, (lon, lat) in zip(cover.ids, cover.centres, strict=True):
        assert h3.is_valid_cell(cell) and h3.get_resolution(cell) == resolution
        assert h3.latlng_to_cell(lat, lon, resolution) == cell
    inside = shapely.contains_xy(pr_region if resolution < 9 else SAN_JUAN, cover.centres[:, 0], cover.centres[:, 1])
    assert inside.all()


def test_multipolygon_covers_every_part(pr_region) -> None:
    """Puerto Rico is a MultiPolygon (the main island, Vieques, Culebra, Mona): each part gets hexagons."""
    cover = HexagonCover.over(pr_region, 8)
    for part in pr_region.geoms:
        if part.area > 0.005:  # about 50 km^2, tens of resolution-8 hexagons
            assert shapely.contains_xy(part, cover.centres[:, 0], cover.centres[:, 1]).any()


@pytest.mark.parametrize("resolution", [7, 9, 10])
def test_sample_points_descend_from_their_hexagon(resolution) -> None:
    cover = HexagonCover.over(SAN_JUAN, resolution)
    lonlat, hexagon, weights = cover.sample_points()
    child = sample_resolution(resolution)
    assert child == max(resolution + 1, 9)
    assert lonlat.shape == (len(hexagon), 2) and weights.shape == hexagon.shape
    assert np.array_equal(np.bincount(hexagon, minlength=len(cover)), np.full(len(cover), 7 ** (child - resolution)))
    cells = [h3.latlng_to_cell(lat, lon, child) for lon, lat in lonlat]
    parents = [h3.cell_to_parent(cell, resolution) for cell in cells]
    assert np.array_equal(np.array(parents), cover.ids[hexagon])
    np.testing.assert_allclose(np.bincount(hexagon, weights=weights), 1.0)
    assert np.ptp(weights) == 0  # equal weights


def test_polygons_contain_their_centres_with_h3_areas(pr_res7) -> None:
    polygons = pr_res7.polygons()
    assert len(polygons) == len(pr_res7)
    assert shapely.contains_xy(polygons, pr_res7.centres[:, 0], pr_res7.centres[:, 1]).all()
    areas = gpd.GeoSeries(polygons, crs=4326).to_crs("+proj=cea +lat_ts=18.2 +datum=WGS84").area / 1e6
    expected = np.array([h3.cell_area(cell, unit="km^2") for cell in pr_res7.ids])
    np.testing.assert_allclose(areas, expected, rtol=0.01)
    vertices = np.array(h3.cell_to_boundary(pr_res7.ids[0]))[:, ::-1]  # (lat, lng) -> (lon, lat)
    np.testing.assert_allclose(np.array(polygons[0].exterior.coords)[:-1], vertices)


def test_resolution_7_covers_puerto_rico(pr_region, pr_res7) -> None:
    union = shapely.union_all(pr_res7.polygons())
    assert shapely.intersection(union, pr_region).area > 0.95 * pr_region.area


def test_index_of_finds_hexagons_and_minus_one_outside(pr_res7) -> None:
    assert np.array_equal(pr_res7.index_of(pr_res7.centres), np.arange(len(pr_res7)))
    outside = np.array([[-66.5, 19.5], [-70.0, 18.3], [10.0, 50.0]])  # the Atlantic, Hispaniola, Germany
    assert np.array_equal(pr_res7.index_of(outside), [-1, -1, -1])
    rng = np.random.default_rng(0)
    points = pr_res7.centres[rng.integers(0, len(pr_res7), 50)] + rng.normal(0, 0.005, (50, 2))
    found = pr_res7.index_of(points)
    for (lon, lat), position in zip(points, found, strict=True):
        cell = h3.latlng_to_cell(lat, lon, 7)
        assert (pr_res7.ids[position] == cell) if position >= 0 else (cell not in set(pr_res7.ids))
    with pytest.raises(InputDataError, match="shape"):
        pr_res7.index_of(np.zeros(3))
    with pytest.raises(InputDataError, match="finite"):
        pr_res7.index_of(np.array([[np.nan, 18.0]]))


@pytest.mark.parametrize("resolution", [4, 11, 9.0, True])
def test_resolution_outside_5_to_10_is_refused(resolution) -> None:
    with pytest.raises(InputDataError, match="from 5 to 10"):
        HexagonCover.over(SAN_JUAN, resolution)


def test_bad_regions_are_refused() -> None:
    with pytest.raises(InputDataError, match="Polygon or MultiPolygon"):
        HexagonCover.over(shapely.Point(-66.0, 18.4), 9)
    with pytest.raises(InputDataError, match="no resolution-5"):
        HexagonCover.over(shapely.box(-66.001, 18.4, -66.0, 18.401), 5)


def test_blocks_of_a_cover_are_covers() -> None:
    cover = HexagonCover.over(SAN_JUAN, 9)
    part = cover[10:20]
    assert part.resolution == 9 and np.array_equal(part.ids, cover.ids[10:20])
    _, hexagon, _ = part.sample_points()
    assert np.array_equal(np.unique(hexagon), np.arange(10))


# --- hexagon summaries of a fitted model ---------------------------------------------------------
@pytest.fixture(scope="module")
def two_targets(pr_tiles, single_thread, fit_device):
    """A tiny download-and-upload dbk-rbf model of PR 2023Q4 without the local residual field,
    whose hexagon variance is exactly that of the tiles' joint posterior. In float64, so that
    the exact comparisons hold on CUDA too, where float32 sums depend on the batch."""
    from geodbk.dataset.spatial_dataset import build_dataset
    from geodbk.fit.fitting import fit_dataset

    dataset = build_dataset(pr_tiles, "PR", target="download,upload", quarters="2023Q4", seed=0)
    model = fit_dataset(dataset, "dbk-rbf", hidden=16, rank=16, epochs=1, dtype="float64", local_residuals=False,
                        progress=False, device=fit_device)
    assert model.targets == ("download", "upload") and model.residuals is None
    return model


@pytest.fixture(scope="module")
def summary_res7(two_targets) -> gpd.GeoDataFrame:
    from geodbk.decisions.hexagon_summary import summarize_hexagons

    with pytest.warns(ExtrapolationWarning, match="outside the fitted extent"):  # the tiles of coastal hexagons
        return summarize_hexagons(two_targets, 7, progress=False)


def test_summary_has_one_row_per_hexagon(two_targets, summary_res7, pr_res7) -> None:
    s = summary_res7
    assert np.array_equal(s["h3"], pr_res7.ids) and s.crs.to_epsg() == 4326
    assert list(s.columns) == [
        "h3", "quarter", "mean_log10_download", "sd_log10_download", "median_download_mbps", "mean_log10_upload",
        "sd_log10_upload", "median_upload_mbps", "correlation", "p_meets", "share_meets", "benchmark",
        "observed_tiles", "geometry",
    ]
    assert (s["quarter"] == "2023Q4").all() and (s["benchmark"] == "35/3").all()
    values = s.drop(columns=["h3", "quarter", "benchmark", "geometry"]).to_numpy(np.float64)
    assert np.isfinite(values).all()
    np.testing.assert_allclose(s["median_upload_mbps"], 10 ** s["mean_log10_upload"])
    assert ((s["p_meets"] >= 0) & (s["p_meets"] <= 1) & (s["share_meets"] >= 0) & (s["share_meets"] <= 1)).all()
    assert shapely.contains_xy(s.geometry.to_numpy(), pr_res7.centres[:, 0], pr_res7.centres[:, 1]).all()
    found = pr_res7.index_of(two_targets.support)
    assert s["observed_tiles"].sum() == (found >= 0).sum() > 1000
    assert s["observed_tiles"].iloc[np.bincount(found[found >= 0]).argmax()] == np.bincount(found[found >= 0]).max()


def test_hexagon_sd_is_the_dense_joint_formula(two_targets, summary_res7, pr_res7) -> None:
    """Each target's sd = sqrt(w^T C w) over the hexagon's tiles, C their dense joint covariance
    under that target's model; the two hexagon means correlate at the model's tile correlation;
    p_meets from that 2 x 2, share_meets from the tiles' own P(meets)."""
    from geodbk.fit.posterior import meets_probability
    from geodbk.maps.thresholds import Benchmark

    levels = Benchmark.parse("35/3").log10_levels
    rho = two_targets.correlation.tile
    for position in (0, 700, 2000):
        lonlat, _, w = pr_res7[position:position + 1].tile_points()
        assert len(w) > 5 and np.ptp(w) > 0  # edge tiles hold fewer of the hexagon's points
        row = summary_res7.iloc[position]
        mean, sd = np.zeros(2), np.zeros(2)
        for k, target in enumerate(("download", "upload")):
            tiles = two_targets.for_target(target).posterior(lonlat, "2023Q4", covariance=True)
            mean[k], sd[k] = w @ tiles.mean[:, 0], np.sqrt(w @ tiles.dense_covariance() @ w)
        np.testing.assert_allclose([row["mean_log10_download"], row["mean_log10_upload"]], mean, rtol=1e-9)
        np.testing.assert_allclose([row["sd_log10_download"], row["sd_log10_upload"]], sd, rtol=1e-6)
        np.testing.assert_allclose(row["correlation"], rho, rtol=1e-9)
        covariance = np.array([[sd[0] ** 2, rho * sd[0] * sd[1]], [rho * sd[0] * sd[1], sd[1] ** 2]])
        np.testing.assert_allclose(row["p_meets"], meets_probability(mean, covariance, levels), rtol=1e-5, atol=1e-9)
        own = two_targets.posterior(lonlat, "2023Q4", covariance=False)
        np.testing.assert_allclose(row["share_meets"], w @ own.probability_meets(levels), rtol=1e-6)


def test_blocks_do_not_change_the_summary(two_targets, summary_res7) -> None:
    from geodbk.decisions.hexagon_summary import summarize_hexagons

    with pytest.warns(ExtrapolationWarning) as caught:
        small = summarize_hexagons(two_targets, 7, points_per_block=997, progress=False)
    assert len(caught) == 1  # once for the summary, not once per block
    numbers = summary_res7.select_dtypes("number").columns
    np.testing.assert_allclose(small[numbers].to_numpy(np.float64), summary_res7[numbers].to_numpy(np.float64),
                               rtol=1e-6)


def test_one_target_p_meets_is_of_its_own_level(two_targets) -> None:
    from scipy.special import ndtr

    from geodbk.decisions.hexagon_summary import summarize_hexagons

    with pytest.warns(ExtrapolationWarning):
        s = summarize_hexagons(two_targets.for_target("download"), 6, benchmark="5/1", progress=False)
    assert "correlation" not in s and "mean_log10_upload" not in s and (s["benchmark"] == "5/1").all()
    expected = ndtr((s["mean_log10_download"] - np.log10(5)) / s["sd_log10_download"])
    np.testing.assert_allclose(s["p_meets"], expected, rtol=1e-9)


def test_summarize_h3_round_trip(two_targets, pr_region, tmp_path, capsys) -> None:
    from geodbk.cli import main

    model = tmp_path / "model.pt"
    two_targets.save(model)
    out = tmp_path / "hexagons.parquet"
    assert main(["summarize", "--model", str(model), "--h3", "6", "--benchmark", "7/1", "--out", str(out),
                 "--no-progress"]) == 0
    back = gpd.read_parquet(out)
    assert np.array_equal(back["h3"], HexagonCover.over(pr_region, 6).ids)
    assert back.crs.to_epsg() == 4326 and (back["benchmark"] == "7/1").all()
    assert "resolution-6 H3 hexagons" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--h3", "4"], "from 5 to 10"),
        (["--h3", "9", "--polygons", "p.geojson"], "not allowed with argument"),
        (["--h3", "9", "--resolution", "500m"], "--resolution go with --polygons"),
        (["--h3", "9", "--benchmark", "35"], "download/upload Mbps"),
        (["--polygons", "p.geojson", "--benchmark", "35/3"], "--benchmark goes with --h3"),
        ([], "one of the arguments --polygons --h3 is required"),
    ],
)
def test_summarize_h3_errors_are_one_line_and_write_nothing(two_targets, tmp_path, extra, message, capsys) -> None:
    from geodbk.cli import main

    model = tmp_path / "model.pt"
    two_targets.save(model)
    out = tmp_path / "hexagons.geojson"
    try:
        status = main(["summarize", "--model", str(model), "--out", str(out), "--no-progress", *extra])
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == [model]
