"""Hostile sizes (issue 19): grids, model sizes, tampered model files and demo quarters, as
command lines through the ``hostile`` harness (tests/hostile/conftest.py).

Every limit is estimated before anything is allocated and refused in one line that names the
option to change; what stays inside the limits still works. None of these cases may start the
allocation it guards against (a 164-million-cell grid, 20 GB for ``--rank 100000``, 140 GB for
a tampered ``hidden``), so a missing guard shows up as a hung or killed run, not a quiet pass.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import geopandas as gpd
import pytest
import torch

from geodbk.errors import ResourceLimitError
from geodbk.fit.fitting import fit_dataset
from geodbk.ingest.regions import load_region
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.schema import GRID_VALUE_BUDGET, check_grid_size, grid_size_limit
from geodbk.models.config import (
    MAX_MODEL_BYTES,
    ModelConfig,
    check_model_size,
    parameter_count,
    weight_bytes,
)

#: Edits of a model file's regressor payload: name -> (key path, value).
TAMPERED: dict[str, tuple[tuple[str, ...], Any]] = {
    "hidden 1e9": (("model_config", "hidden"), 10**9),
    "hidden 1e5": (("model_config", "hidden"), 10**5),
    "hidden 3000": (("model_config", "hidden"), 3000),
    "hidden 0": (("model_config", "hidden"), 0),
    "hidden negative": (("model_config", "hidden"), -16),
    "hidden as text": (("model_config", "hidden"), "16"),
    "hidden fractional": (("model_config", "hidden"), 16.5),
    "hidden None": (("model_config", "hidden"), None),
    "rank 1e9": (("model_config", "rank"), 10**9),
    "rank 1e5": (("model_config", "rank"), 10**5),
    "rank 0": (("model_config", "rank"), 0),
    "encoding scales 1e7": (("model_config", "encoding_scales"), 10**7),
    "encoding scales negative": (("model_config", "encoding_scales"), -1),
    "blocks 1e6": (("model_config", "n_blocks"), 10**6),
    "dtype float16": (("model_config", "dtype"), "float16"),
    "unknown setting": (("model_config", "width"), 64),
    "input columns 1e9": (("input_dim",), 10**9),
    "input columns negative": (("input_dim",), -3),
    "input columns as text": (("input_dim",), "three"),
}


def _tamper(source: Path, target: Path, keys: tuple[str, ...], value: Any) -> None:
    payload = torch.load(source, weights_only=True)
    node = payload["regressor"]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    torch.save(payload, target)


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_dataset) -> Path:
    """A knn, a small dnn and a small sv-rbf model of Puerto Rico 2023Q4, their dataset and region
    polygon, and tampered copies of the dnn."""
    root = tmp_path_factory.mktemp("hostile-limits")
    train = {"epochs": 1, "progress": False, "device": "cpu"}
    fit_dataset(pr_dataset, "knn", **train).save(root / "knn.pt")
    fit_dataset(pr_dataset, "dnn", hidden=16, rank=16, **train).save(root / "dnn.pt")
    fit_dataset(pr_dataset, "sv-rbf", hidden=16, rank=16, **train).save(root / "sv.pt")
    pr_dataset.save(root / "dataset.parquet")
    region = load_region("PR")
    gpd.GeoDataFrame({"name": ["PR"]}, geometry=[region.geometry], crs=4326).to_file(
        root / "pr.geojson", driver="GeoJSON", engine="pyogrio"
    )
    for i, (keys, value) in enumerate(TAMPERED.values()):
        _tamper(root / "dnn.pt", root / f"tampered{i}.pt", keys, value)
    (root / "out").mkdir()
    return root


def _predict(*extra: str, model: str = "knn.pt") -> Callable[[Path], list]:
    return lambda r: ["predict", "--model", r / model, "--out", r / "out" / "grid.nc", "--no-progress", *extra]


def _fit(*extra: str) -> Callable[[Path], list]:
    return lambda r: ["fit", "--dataset", r / "dataset.parquet", "--out", r / "out" / "run", "--no-progress",
                      "--models", "knn", "--epochs", "1", *extra]


def _summarize(*extra: str) -> Callable[[Path], list]:
    return lambda r: ["summarize", "--model", r / "sv.pt", "--polygons", r / "pr.geojson",
                      "--out", r / "out" / "summary.csv", *extra]


def _demo(*extra: str) -> Callable[[Path], list]:
    return lambda r: ["demo", "--out", r / "out" / "demo", "--no-progress", *extra]


REFUSED: dict[str, tuple[Callable[[Path], list], str]] = {
    # grids: 164 M cells at 1e-4 over PR; 1e-9 tried to allocate 20+ GiB
    "grid 1e-4": (_predict("--resolution", "1e-4"), "--max-cells"),
    "grid 0.0001deg": (_predict("--resolution", "0.0001deg"), "--max-cells"),
    "grid 1e-5": (_predict("--resolution", "1e-5"), "--max-cells"),
    "grid 1e-9": (_predict("--resolution", "1e-9"), "--max-cells"),
    "grid 1e-12": (_predict("--resolution", "1e-12"), "--max-cells"),
    "grid 10m": (_predict("--resolution", "10m"), "--max-cells"),
    "grid 1m": (_predict("--resolution", "1m"), "--max-cells"),
    "grid 1e-9 with a dataset": (_predict("--resolution", "1e-9", "--dataset", "@dataset.parquet"), "--max-cells"),
    "grid 1e-9 with refs": (_predict("--resolution", "1e-9", "--ref", "a:-66.1,18.4"), "--max-cells"),
    "grid 1e-4 of every quarter": (_predict("--resolution", "1e-4", "--quarters", "all"), "--max-cells"),
    "grid of the dnn 1e-9": (_predict("--resolution", "1e-9", model="dnn.pt"), "--max-cells"),
    "grid above a lowered cap": (_predict("--resolution", "0.05", "--max-cells", "100"), "--max-cells"),
    "grid above a cap of 1": (_predict("--resolution", "2km", "--max-cells", "1"), "--max-cells"),
    "zero cells": (_predict("--max-cells", "0"), "--max-cells"),
    "negative cells": (_predict("--max-cells", "-5"), "--max-cells"),
    "cells not a number": (_predict("--max-cells", "many"), "--max-cells"),
    "summary cells 1e-9": (_summarize("--resolution", "1e-9"), "--max-cells"),
    "summary cells 1e-5": (_summarize("--resolution", "1e-5"), "--max-cells"),
    "summary cells 1m": (_summarize("--resolution", "1m"), "--max-cells"),
    "summary above a lowered cap": (_summarize("--max-cells", "10"), "--max-cells"),
    "summary zero cells": (_summarize("--max-cells", "0"), "--max-cells"),
    # model sizes: rank 100000 on 5,132 rows took 20 GB; 100000 encoding scales ran 228 s
    "rank 100000": (_fit("--rank", "100000"), "--rank"),
    "rank one above the rows": (_fit("--rank", "5133"), "--rank"),
    "rank 1e9": (_fit("--rank", "1000000000"), "--rank"),
    "rank 100000 allowed large": (_fit("--rank", "100000", "--allow-large-model"), "--rank"),
    "rank 6000 on the paper protocol": (_fit("--rank", "6000", "--protocol", "paper"), "--rank"),
    "hidden 100000": (_fit("--hidden", "100000"), "--allow-large-model"),
    "hidden 4097": (_fit("--hidden", "4097"), "--allow-large-model"),
    "hidden 1e9": (_fit("--hidden", "1000000000"), "--allow-large-model"),
    "encoding scales 100000": (_fit("--encoding-scales", "100000"), "--allow-large-model"),
    "encoding scales 65": (_fit("--encoding-scales", "65"), "--allow-large-model"),
    "paper size on a few rows": (_fit("--paper-size", "--split", "forecast"), "x"),
    # demo quarters: 2099Q1 only warned, after minutes of fitting
    "demo 2099Q1": (_demo("--quarter", "2099Q1"), "--allow-extrapolation"),
    "demo 3023Q4": (_demo("--quarter", "3023Q4"), "--allow-extrapolation"),
    "demo 2024Q2": (_demo("--quarter", "2024Q2"), "--allow-extrapolation"),
    "demo before the first quarter": (_demo("--quarter", "2018Q4"), "--allow-extrapolation"),
    "demo before the fitted quarters": (_demo("--quarters", "2023Q1,2023Q4", "--quarter", "2022Q4"),
                                        "--allow-extrapolation"),
    "demo after the fitted quarters": (_demo("--quarters", "2023Q1,2023Q2", "--quarter", "2023Q4"),
                                       "--allow-extrapolation"),
    "demo forecast split ahead": (_demo("--split", "forecast", "--quarter", "2024Q1"), "--allow-extrapolation"),
    "demo change to 2099": (_demo("--change", "2023Q4:2099Q1"), "--allow-extrapolation"),
    "demo change from 2010": (_demo("--change", "2010Q1:2023Q4"), "--allow-extrapolation"),
    "demo grid 1e-4": (_demo("--resolution", "1e-4"), "--max-cells"),
    "demo grid 1e-9": (_demo("--resolution", "1e-9"), "--max-cells"),
    "demo grid 5m": (_demo("--resolution", "5m"), "--max-cells"),
    **{f"tampered {name}": (_predict(model=f"tampered{i}.pt"), "model file") for i, name in enumerate(TAMPERED)},
    "summarize tampered hidden": (lambda r: ["summarize", "--model", r / "tampered0.pt", "--polygons",
                                             r / "dataset.parquet", "--out", r / "out" / "s.csv"], "model file"),
    "export tampered rank": (lambda r: ["export", "--model", r / "tampered8.pt", "--dataset", r / "dataset.parquet",
                                        "--test-tiles", r / "out" / "t.geojson"], "model file"),
}
# the paper size asks for rank 1024 on the 5,132 training rows: allowed, so not a refusal case
del REFUSED["paper size on a few rows"]


def _argv(make: Callable[[Path], list], root: Path) -> list[str]:
    return [str(root / a[1:]) if isinstance(a, str) and a.startswith("@") else str(a) for a in make(root)]


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_limits_are_refused_in_one_line(hostile, root, case):
    make, phrase = REFUSED[case]
    outcome = hostile(_argv(make, root), root, expect="refused")
    assert phrase.lower() in outcome.stderr[-1].lower(), outcome.stderr[-1]


ACCEPTED: dict[str, Callable[[Path], list]] = {
    "grid 0.05": _predict("--resolution", "0.05"),
    "grid 2km": _predict("--resolution", "2km"),
    "grid within a raised cap": _predict("--resolution", "0.05", "--max-cells", "1000"),
    "grid of the dnn": _predict("--resolution", "0.05", model="dnn.pt"),
    "fit at rank 64": _fit("--rank", "64"),
    "fit at the rows": _fit("--rank", "5132"),
}


@pytest.mark.parametrize("case", list(ACCEPTED), ids=list(ACCEPTED))
def test_sizes_within_the_limits_work(hostile, root, case):
    hostile(_argv(ACCEPTED[case], root), root, may_change=[root / "out"], expect="ok")


# --- the rules themselves ------------------------------------------------------------------
def test_the_grid_cap_follows_the_values_per_cell():
    grid = RegularGrid.over(load_region("PR"), 1e-4)
    assert grid.height * grid.width > 160_000_000
    with pytest.raises(ResourceLimitError, match="7 value"):
        check_grid_size(grid, 7)
    coarse = RegularGrid.over(load_region("PR"), 3e-4)  # 18 M cells: 7 values fit, 140 do not
    check_grid_size(coarse, 7)
    with pytest.raises(ResourceLimitError, match="140 value"):
        check_grid_size(coarse, 140)
    assert coarse.height * coarse.width * 7 * 4 < GRID_VALUE_BUDGET
    with grid_size_limit(10**9):
        check_grid_size(grid, 140)
    with grid_size_limit(10), pytest.raises(ResourceLimitError, match="set by --max-cells"):
        check_grid_size(coarse, 1)


def test_the_model_caps():
    check_model_size(ModelConfig(hidden=256, rank=1024), 3, 5132)  # the paper's size
    check_model_size(ModelConfig(rank=128), 3, 50)  # the default rank on a small dataset
    with pytest.raises(ResourceLimitError, match="--rank"):
        check_model_size(ModelConfig(rank=200), 3, 150)
    large = ModelConfig(hidden=4096, rank=20_000, dtype="float64")
    assert weight_bytes(large, 3) > MAX_MODEL_BYTES
    with pytest.raises(ResourceLimitError, match="GiB of weights"):
        check_model_size(large, 3, 10**6)
    check_model_size(large, 3, 10**6, allow_large=True)
    assert parameter_count(ModelConfig(hidden=64, encoding_scales=100_000), 3) * 4 > 100e6  # the 102 MB model
