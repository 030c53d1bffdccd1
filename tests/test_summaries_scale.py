"""Summaries at scale (issue 21): polygons in blocks, rasterised cells, Dask.

The reference is the summary as it was computed before blocks, written out densely here: each
polygon's cells by the point-in-polygon test of :meth:`RegularGrid.cells_inside`, one
``predict_areas`` and one ``predict`` over every cell of every polygon, and observed tiles by
``contains_xy`` per polygon. The blocked summary must equal it on the shipped Puerto Rico
municipios.
"""

from __future__ import annotations

import dataclasses
import warnings

import geopandas as gpd
import numpy as np
import pandas as pd
import pyproj
import pytest
import shapely

from geodbk.cli import main
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.ingest.regions import load_region, read_polygons
from geodbk.maps.cover import cell_centres, cover
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.summaries import (
    polygon_blocks,
    polygon_cells,
    polygon_grids,
    polygons_in_region,
    summarize_polygons,
)
from geodbk.paths import COUNTY_BOUNDARIES
from geodbk.prediction import probability_below, to_data_units

pytestmark = pytest.mark.usefixtures("single_thread")

QUARTERS = ["2022Q4", "2023Q4"]


@pytest.fixture(scope="module")
def model():
    """A small float64 dbk-rbf with its local residual field, on a tenth of two PR quarters."""
    ds = load_sample_dataset("PR", quarters=QUARTERS)
    ds = dataclasses.replace(ds, frame=ds.frame.sample(frac=0.1, random_state=0))
    return fit_dataset(ds, "dbk-rbf", hidden=8, rank=8, dtype="float64",
                       epochs=2, batch_size=256, progress=False)


@pytest.fixture(scope="module")
def counties() -> gpd.GeoDataFrame:
    return read_polygons(COUNTY_BOUNDARIES, what="polygon", keep_crs=True)


@pytest.fixture(scope="module")
def municipios(counties) -> gpd.GeoDataFrame:
    return polygons_in_region(counties, load_region("PR").geometry)


def one_call_summary(model, polygons: gpd.GeoDataFrame, quarter: str, resolution: float) -> pd.DataFrame:
    """The summary of every polygon from one call per product over all cells (no blocks)."""
    parts = [RegularGrid.over(g, resolution).cells_inside() for g in polygons.to_crs(4326).geometry]
    parts = [p if len(p) else np.array([[g.representative_point().x, g.representative_point().y]])
             for p, g in zip(parts, polygons.to_crs(4326).geometry, strict=True)]
    lonlat = np.concatenate(parts)
    groups = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    weights = np.cos(np.radians(lonlat[:, 1]))
    area = model.predict_areas(lonlat, groups, len(parts), quarter, weights=weights)
    cell = model.predict(lonlat, quarter)
    below = probability_below(cell.mean, cell.sd, np.log10(35.0))
    share = np.bincount(groups, weights * below) / np.bincount(groups, weights)
    x, y = pyproj.Transformer.from_crs(4326, polygons.crs, always_xy=True).transform(*model.support.T)
    median, lower, upper = to_data_units(area.mean, area.sd)
    return pd.DataFrame({
        "cells": np.bincount(groups), "mean_log10": area.mean, "sd_log10": area.sd, "median_mbps": median,
        "lower_mbps": lower, "upper_mbps": upper, "share_below": share,
        "observed_tiles": [int(shapely.contains_xy(g, x, y).sum()) for g in polygons.geometry],
    })


def test_blocked_summary_of_the_municipios_is_the_one_call_summary(model, municipios):
    expected = one_call_summary(model, municipios, "2023Q4", 0.01)
    assert len(municipios) == 78 and expected["observed_tiles"].sum() > 100
    for cells_per_block in (1 << 18, 700):  # one block; about a dozen
        out = summarize_polygons(model, municipios, time="2023Q4", resolution=0.01, cells_per_block=cells_per_block)
        assert list(out.index) == list(municipios.index) and out.crs == municipios.crs
        got = pd.DataFrame(out[expected.columns]).reset_index(drop=True)
        pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-9, atol=1e-12, check_dtype=False)


def test_blocks_hold_whole_polygons_within_the_cell_budget(municipios):
    blocks = polygon_blocks(municipios, 0.01, cells_per_block=700)
    counts = [np.bincount(cover(block.grids)[1]) for block in blocks]
    assert len(blocks) > 5
    assert np.array_equal(np.concatenate([b.positions for b in blocks]), np.arange(len(municipios)))
    for per_polygon in counts:  # at most the budget, unless one polygon alone holds more
        assert per_polygon.sum() <= 700 or len(per_polygon) == 1
    everything = np.bincount(cover(polygon_grids(municipios, 0.01))[1])
    assert np.array_equal(np.concatenate(counts), everything)


@pytest.mark.parametrize("state, resolution", [("72", 0.005), ("13", 0.01), ("13", "2km"), ("06", 0.02)])
def test_rasterised_cells_are_the_point_in_polygon_cells(counties, state, resolution):
    for geometry in counties[counties["STATEFP"] == state].to_crs(4326).geometry[:60]:
        grid = RegularGrid.over(geometry, resolution)
        inside = grid.cells_inside()
        got = cell_centres(grid)
        if len(inside):
            np.testing.assert_array_equal(got, inside)
        else:
            assert len(got) == 1 and shapely.contains_xy(geometry.buffer(1e-9), *got[0])


def test_overlapping_polygons_each_get_all_their_cells():
    big = shapely.box(-66.3, 18.1, -66.0, 18.4)
    speck = shapely.Point(-66.0512, 18.2).buffer(1e-4)
    frame = gpd.GeoDataFrame({"name": ["big", "inner", "speck"]}, crs=4326,
                             geometry=[big, shapely.box(-66.2, 18.2, -66.1, 18.3), speck])
    lonlat, groups, _ = polygon_cells(frame, 0.01)
    big_cells, inner_cells = (set(map(tuple, lonlat[groups == g].round(9))) for g in (0, 1))
    assert len(big_cells) == 900 and len(inner_cells) == 100 and inner_cells <= big_cells
    assert (groups == 2).sum() == 1  # too small for a centre: its representative point


def test_a_dask_cluster_gives_the_serial_table_and_warnings(model, municipios, tmp_path):
    from distributed import Client, LocalCluster

    # a square of open sea west of Puerto Rico: an extrapolation warning, raised once
    area = municipios.iloc[:12]
    outside = gpd.GeoDataFrame({"NAME": ["sea"]}, geometry=[shapely.box(-67.9, 17.0, -67.7, 17.2)], crs=4326)
    polygons = pd.concat([area, outside.to_crs(area.crs)], ignore_index=True)
    runs = {}
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as local,
        Client(local) as client,
    ):
        for name, how in (("serial", None), ("dask", client)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                table = summarize_polygons(model, polygons, resolution=0.01, cells_per_block=300, client=how)
            runs[name] = (table, [(w.category, str(w.message)) for w in caught])
    (serial, serial_warnings), (dask, dask_warnings) = runs["serial"], runs["dask"]
    pd.testing.assert_frame_equal(pd.DataFrame(dask.drop(columns="geometry")),
                                  pd.DataFrame(serial.drop(columns="geometry")), check_exact=True)
    assert dask_warnings == serial_warnings and [c for c, _ in serial_warnings] == [ExtrapolationWarning]


def test_cli_summarize_on_a_local_cluster(model, municipios, tmp_path, capsys):
    model.save(tmp_path / "m.pt")
    municipios.iloc[:20].to_file(tmp_path / "p.geojson")
    base = ["summarize", "--model", str(tmp_path / "m.pt"), "--polygons", str(tmp_path / "p.geojson"),
            "--resolution", "0.02", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "serial.parquet")]) == 0
    assert main([*base, "--out", str(tmp_path / "dask.parquet"), "--dask-scheduler", "local:2"]) == 0
    serial, dask = (gpd.read_parquet(tmp_path / f"{name}.parquet") for name in ("serial", "dask"))
    pd.testing.assert_frame_equal(dask, serial, check_exact=True)
    assert "wrote" in capsys.readouterr().out


def test_cli_summarize_refuses_a_bad_scheduler_before_the_model_loads(tmp_path, capsys):
    rc = main(["summarize", "--model", str(tmp_path / "none.pt"), "--polygons", str(tmp_path / "none.geojson"),
               "--out", str(tmp_path / "s.csv"), "--dask-scheduler", "local:0"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "local:N" in err and len(err.splitlines()) == 1
