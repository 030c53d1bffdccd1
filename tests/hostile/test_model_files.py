"""Hostile model and dataset files (issue 35): tampered model files, tampered dataset files, input
paths that are not regular files, sizes a fit cannot hold, and a fit of several kinds of which one
fails, as command lines through the ``hostile`` harness (tests/hostile/conftest.py).

* A model file is checked when it is loaded: finite weights that are exactly those of its kind, a
  target scaling that describes values ingest keeps, and one kind in its facts and its weights.
  All-NaN weights mapped all-NaN, ``y_std = -1`` and ``y_mean = 1e300`` mapped without a word, and
  NaN weights or a relabelled kind were internal errors.
* A dataset file is checked when it is loaded: damaged metadata, a missing column, unknown split or
  urban/rural labels, and rows ingest would not have written are one line. Fit trained on duplicate
  rows, ``y = 1e300`` and ``urban_rural = "suburban"`` without a word; the rest were internal errors.
* ``fit --dataset`` takes only a regular file: on a FIFO it hung, deaf to SIGTERM (vector inputs
  are checked by their reader, tests/hostile/test_inputs.py).
* ``--rank`` and ``--hidden`` are capped for the kinds trained by gradient: ``--rank 4000`` on
  5,508 rows passed 2.9 GB and two minutes.
* A fit of several kinds keeps those that finished: one failing kind threw the others away.

The cases that succeed, and the refusals that other checks made before (a split of test rows only,
``--hidden`` above 4096, a rank above the training rows, a fit whose only kind fails), are controls.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import InputDataError
from geodbk.fit.fitting import fit_dataset

TRAIN = {"epochs": 1, "progress": False, "device": "cpu"}
SMALL = {"hidden": 16, "rank": 16}


# --- tampered model files ---------------------------------------------------------------------
def _fill(value: float) -> Callable[[dict], None]:
    """Every floating weight of the regressor set to ``value``."""
    def edit(payload: dict) -> None:
        for tensor in payload["regressor"]["state_dict"].values():
            if tensor.is_floating_point():
                tensor.fill_(value)
    return edit


def _poke(payload: dict) -> None:
    """One NaN in the first weight of more than one value."""
    tensor = next(t for t in payload["regressor"]["state_dict"].values() if t.is_floating_point() and t.numel() > 1)
    tensor.view(-1)[0] = math.nan


def _set(part: str, key: str, value: Any) -> Callable[[dict], None]:
    def edit(payload: dict) -> None:
        payload[part][key] = value
    return edit


def _drop(part: str | None, key: str) -> Callable[[dict], None]:
    def edit(payload: dict) -> None:
        (payload if part is None else payload[part]).pop(key)
    return edit


def _relabel(kind: str) -> Callable[[dict], None]:
    """The kind changed in the weights and in the facts alike."""
    def edit(payload: dict) -> None:
        payload["regressor"]["kind"] = payload["meta"]["kind"] = kind
    return edit


#: name -> (source model, edit of its payload, phrase of the one-line refusal)
MODELS: dict[str, tuple[str, Callable[[dict], None], str]] = {
    "all-NaN dnn weights": ("dnn.pt", _fill(math.nan), "'backbone.stem.weight' holds NaN or infinite values"),
    "all-NaN dbk-rbf weights": ("dbk.pt", _fill(math.nan), "holds NaN or infinite values"),
    "all-NaN knn tables": ("knn.pt", _fill(math.nan), "knn weight 'spatial' holds NaN"),
    "infinite dbk-rbf weights": ("dbk.pt", _fill(math.inf), "holds NaN or infinite values"),
    "one NaN dbk-rbf weight": ("dbk.pt", _poke, "holds NaN or infinite values"),
    "one NaN dnn weight": ("dnn.pt", _poke, "holds NaN or infinite values"),
    "y_std -1": ("dbk.pt", _set("regressor", "y_std", -1.0), "y_std -1.0 is not a finite mean and a positive"),
    "y_std 0": ("dbk.pt", _set("regressor", "y_std", 0.0), "positive, finite sd"),
    "y_std NaN": ("knn.pt", _set("regressor", "y_std", math.nan), "positive, finite sd"),
    "y_std as text": ("knn.pt", _set("regressor", "y_std", "0.5"), "positive, finite sd"),
    "y_mean infinite": ("dnn.pt", _set("regressor", "y_mean", math.inf), "positive, finite sd"),
    "y_mean 1e300": ("dbk.pt", _set("regressor", "y_mean", 1e300), "beyond what ingest keeps"),
    "y_mean -1e300": ("dbk.pt", _set("regressor", "y_mean", -1e300), "beyond what ingest keeps"),
    "y_std 1e300": ("knn.pt", _set("regressor", "y_std", 1e300), "beyond what ingest keeps"),
    "y_mean 400": ("dnn.pt", _set("regressor", "y_mean", 400.0), "beyond what ingest keeps"),
    "no y_std": ("dbk.pt", _drop("regressor", "y_std"), "its regressor has no y_std"),
    "dnn weights labelled dbk-rbf": ("dnn.pt", _set("regressor", "kind", "dbk-rbf"),
                                     "not those of a dbk-rbf model (27 missing"),
    "dbk-rbf weights labelled knn": ("dbk.pt", _set("regressor", "kind", "knn"), "not those of a knn model"),
    "knn tables labelled dnn": ("knn.pt", _set("regressor", "kind", "dnn"), "not those of a dnn model"),
    "dbk-rbf weights labelled dbk-silu": ("dbk.pt", _set("regressor", "kind", "dbk-silu"), "not those of a dbk-silu"),
    "dbk-rbf weights labelled sv-dkl": ("dbk.pt", _set("regressor", "kind", "sv-dkl"),
                                        "its facts name kind dbk-rbf and its weights sv-dkl"),
    "dbk-rbf relabelled sv-dkl throughout": ("dbk.pt", _relabel("sv-dkl"), "conjugate posterior"),
    "dbk-rbf relabelled pp-dkl throughout": ("dbk.pt", _relabel("pp-dkl"), "conjugate posterior"),
    "unknown kind": ("dbk.pt", _relabel("gradient-boost"), "unknown model kind 'gradient-boost'"),
    "fitted region not WKB": ("dbk.pt", _set("meta", "region_wkb_hex", "00ff"), "model facts are damaged"),
    "training rows as text": ("knn.pt", _set("meta", "n_train", "many"), "model facts are damaged"),
    "unknown target": ("dnn.pt", _set("meta", "target", "speed"), "target 'speed'"),
    "no facts": ("knn.pt", _drop(None, "meta"), "no meta table"),
}


# --- tampered dataset files -------------------------------------------------------------------
def _metadata(edit: Callable[[dict], Any]) -> Callable[[pa.Table], pa.Table]:
    """The table with its ``geodbk`` metadata edited (``edit`` changes the dict in place, or
    returns the bytes to store instead)."""
    def tamper(table: pa.Table) -> pa.Table:
        meta = dict(table.schema.metadata)
        mapping = json.loads(meta[b"geodbk"])
        raw = edit(mapping)
        meta[b"geodbk"] = raw if isinstance(raw, bytes) else json.dumps(mapping).encode()
        return table.replace_schema_metadata(meta)
    return tamper


def _rows(edit: Callable[[pd.DataFrame], None]) -> Callable[[pa.Table], pa.Table]:
    """The table with its rows edited (``edit`` changes the frame in place), metadata kept."""
    def tamper(table: pa.Table) -> pa.Table:
        frame = table.to_pandas()
        edit(frame)
        return pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(table.schema.metadata)
    return tamper


def _cells(column: str, value: Any, rows: slice = slice(0, 5)) -> Callable[[pa.Table], pa.Table]:
    def edit(frame: pd.DataFrame) -> None:
        frame[column] = frame[column].astype(type(value))
        frame.iloc[rows, frame.columns.get_loc(column)] = value
    return _rows(edit)


def _duplicate(frame: pd.DataFrame) -> None:
    frame.iloc[1:20, frame.columns.get_loc("quadkey")] = frame["quadkey"].iloc[0]


def _region(key: str, value: Any) -> Callable[[dict], None]:
    return lambda meta: meta["region"].__setitem__(key, value)


#: name -> (edit of the dataset's Arrow table, phrase of the one-line refusal)
DATASETS: dict[str, tuple[Callable[[pa.Table], pa.Table], str]] = {
    "metadata not JSON": (_metadata(lambda meta: b"{not json"), "damaged geodbk metadata (Expecting property"),
    "metadata a JSON list": (_metadata(lambda meta: b"[1, 2]"), "damaged geodbk metadata (list indices"),
    "metadata without region": (_metadata(lambda meta: meta.pop("region")), "damaged geodbk metadata (no 'region')"),
    "region not WKB": (_metadata(_region("wkb_hex", "00ff")), "damaged geodbk metadata (ParseException"),
    "region null": (_metadata(_region("wkb_hex", None)), "a region that is not a polygon"),
    "region a point": (_metadata(_region("wkb_hex", "0101000000000000000000f03f000000000000f03f")),
                       "a region that is not a polygon"),
    "transform a string": (_metadata(lambda meta: meta.__setitem__("transform", "box")), "damaged geodbk metadata"),
    "seed as text": (_metadata(lambda meta: meta.__setitem__("seed", "abc")), "damaged geodbk metadata"),
    "unknown target": (_metadata(lambda meta: meta.__setitem__("target", "speed")), "got ('speed',)"),
    "latency in Mbps": (_metadata(lambda meta: meta.__setitem__("target", "latency")), "units 'Mbps' for latency"),
    "unknown split protocol": (_metadata(lambda meta: meta.__setitem__("split_protocol", "k-fold")),
                               "split protocol 'k-fold'"),
    "negative block side": (_metadata(lambda meta: meta.__setitem__("block_m", -5)), "block side -5.0 m"),
    "no geometry column": (lambda table: table.drop(["geometry"]), "lacks the column(s) geometry"),
    "no y column": (lambda table: table.drop(["y"]), "lacks the column(s) y"),
    "split of unknown labels": (_cells("split", "holdout", slice(None)), "the split column holds 'holdout'"),
    "a few unknown split labels": (_cells("split", "foo"), "the split column holds 'foo'"),
    "urban_rural suburban": (_cells("urban_rural", "suburban"), "the urban_rural column holds 'suburban'"),
    "duplicate rows": (_rows(_duplicate), "19 duplicate (quadkey, quarter, service) row(s)"),
    "y 1e300": (_cells("y", 1e300), "5 row(s) hold a target or count that ingest drops"),
    "y -1e300": (_cells("y", -1e300), "ingest drops"),
    "y NaN": (_cells("y", math.nan), "ingest drops"),
    "tests 0": (_cells("tests", 0), "ingest drops"),
    "devices negative": (_cells("devices", -3), "ingest drops"),
    "y as text": (_cells("y", "fast"), "not numeric"),
    # refused by fit's split check before this issue; kept so that it stays one line
    "split all test": (_cells("split", "test", slice(None)), "leaves 0 validation rows"),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_dataset) -> Path:
    """A knn, a small dnn and a small dbk-rbf model of Puerto Rico 2023Q4, their dataset, tampered
    copies of both, and paths that are not regular files: a FIFO, a folder and a symlink."""
    root = tmp_path_factory.mktemp("hostile-model-files")
    fit_dataset(pr_dataset, "knn", **TRAIN).save(root / "knn.pt")
    fit_dataset(pr_dataset, "dnn", **SMALL, **TRAIN).save(root / "dnn.pt")
    fit_dataset(pr_dataset, "dbk-rbf", **SMALL, **TRAIN).save(root / "dbk.pt")
    pr_dataset.save(root / "dataset.parquet")
    for i, (source, edit, _) in enumerate(MODELS.values()):
        payload = torch.load(root / source, weights_only=True)
        edit(payload)
        torch.save(payload, root / f"model{i}.pt")
    table = pq.read_table(root / "dataset.parquet")
    for i, (tamper, _) in enumerate(DATASETS.values()):
        pq.write_table(tamper(table), root / f"dataset{i}.parquet")
    os.mkfifo(root / "fifo.parquet")
    (root / "folder.parquet").mkdir()
    (root / "link.parquet").symlink_to(root / "dataset.parquet")
    (root / "out").mkdir()
    return root


def _predict(model: str, out: str = "grid.nc") -> Callable[[Path], list]:
    return lambda r: ["predict", "--model", r / model, "--out", r / "out" / out, "--resolution", "0.1", "--no-progress"]


def _fit(
    *extra: Any, dataset: str = "dataset.parquet", models: str = "knn", out: str = "run"
) -> Callable[[Path], list]:
    """``geodbk fit`` of the root's file ``dataset`` into ``out/<out>``."""
    return lambda r: ["fit", "--dataset", r / dataset, "--out", r / "out" / out, "--models", models, "--epochs", "1",
                      "--no-progress", *extra]


def _run(hostile, root: Path, make: Callable[[Path], list], phrase: str | None) -> list[str]:
    """Run one case: refused with ``phrase`` in its one error line, or (``None``) a success."""
    argv = [str(a) for a in make(root)]
    outcome = hostile(argv, root, may_change=[root / "out"], expect="ok" if phrase is None else "refused")
    if phrase is not None:
        assert phrase in outcome.stderr[-1] and "internal error" not in outcome.stderr[-1], outcome.stderr[-1]
    return outcome.stderr


@pytest.mark.parametrize("case", list(MODELS), ids=list(MODELS))
def test_a_tampered_model_file_is_refused_at_load(hostile, root, case):
    i = list(MODELS).index(case)
    lines = _run(hostile, root, _predict(f"model{i}.pt"), MODELS[case][2])
    assert lines[-1].startswith(f"geodbk predict: error: model file {root / f'model{i}.pt'}: ")
    assert not (root / "out" / "grid.nc").exists()


@pytest.mark.parametrize("command", ["summarize", "export"])
def test_every_command_loads_a_model_file_through_the_checks(hostile, root, command):
    model = root / f"model{list(MODELS).index('y_mean 1e300')}.pt"
    argv = {"summarize": ["summarize", "--model", model, "--polygons", root / "dataset.parquet", "--out",
                          root / "out" / "s.csv"],
            "export": ["export", "--model", model, "--dataset", root / "dataset.parquet", "--test-tiles",
                       root / "out" / "t.geojson"]}[command]
    _run(hostile, root, lambda r: argv, "beyond what ingest keeps")


@pytest.mark.parametrize("model", ["knn.pt", "dnn.pt", "dbk.pt"])
def test_the_models_geodbk_writes_pass_the_checks(hostile, root, model):
    _run(hostile, root, _predict(model, out=f"{model}.nc"), None)


@pytest.mark.parametrize("case", list(DATASETS), ids=list(DATASETS))
def test_a_tampered_dataset_file_is_refused_at_load(hostile, root, case):
    i = list(DATASETS).index(case)
    _run(hostile, root, _fit(dataset=f"dataset{i}.parquet", out=f"run{i}"), DATASETS[case][1])
    assert not (root / "out" / f"run{i}").exists()


@pytest.mark.parametrize("case", ["no geometry column", "region not WKB", "duplicate rows"])
def test_predict_and_export_load_a_dataset_through_the_checks(hostile, root, case):
    dataset = root / f"dataset{list(DATASETS).index(case)}.parquet"
    phrase = DATASETS[case][1]
    _run(hostile, root, lambda r: ["predict", "--model", r / "knn.pt", "--dataset", dataset, "--out",
                                   r / "out" / "grid.nc", "--resolution", "0.1", "--no-progress"], phrase)
    _run(hostile, root, lambda r: ["export", "--model", r / "knn.pt", "--dataset", dataset, "--test-tiles",
                                   r / "out" / "t.geojson"], phrase)


def test_the_dataset_checks_are_ingests(pr_dataset):
    """What the load refuses is what ingest would not write: its own datasets pass, and a row with
    a speed above ingest's ceiling, a zero count or a non-finite y does not."""
    pr_dataset.check_rows()
    for column, value in (("y", 5.0 + 1e-9), ("tests", 0), ("y", math.inf)):
        frame = pr_dataset.frame.copy()
        frame[column] = frame[column].astype(np.float64)
        frame.iloc[0, frame.columns.get_loc(column)] = value
        with pytest.raises(InputDataError, match="ingest drops"):
            SpatialDataset(**{**vars(pr_dataset), "frame": frame}).check_rows()


# --- input paths that are not regular files ---------------------------------------------------
#: name -> (command line, phrase of the one-line refusal)
NOT_FILES: dict[str, tuple[Callable[[Path], list], str]] = {
    "fit --dataset a FIFO": (_fit(dataset="fifo.parquet"), "argument --dataset: "),
    "fit --dataset a folder": (_fit(dataset="folder.parquet"), "is a folder, not a regular file"),
    "fit --dataset a device": (lambda r: ["fit", "--dataset", "/dev/null", "--out", r / "out" / "run"],
                               "/dev/null is a character device, not a regular file"),
    "fit --dataset missing": (_fit(dataset="none.parquet"), "no file at"),
}


@pytest.mark.parametrize("case", list(NOT_FILES), ids=list(NOT_FILES))
def test_an_input_path_must_be_a_regular_file(hostile, root, case):
    make, phrase = NOT_FILES[case]
    line = _run(hostile, root, make, phrase)[-1]
    assert "FIFO" in line or "FIFO" not in case


def test_a_symlink_to_a_dataset_is_a_regular_file(hostile, root):
    _run(hostile, root, _fit(dataset="link.parquet", out="linked"), None)


# --- model sizes ------------------------------------------------------------------------------
SIZES: dict[str, tuple[Callable[[Path], list], str | None]] = {
    "rank 4000 of the default kinds": (_fit("--rank", "4000", "--hidden", "16", models="dbk-rbf,sv-rbf,sv-dkl,knn"),
                                       "--rank 4000 is above the limit of 2048 for fitting dbk-rbf, sv-rbf, sv-dkl"),
    "rank 2049 of a dbk-rbf": (_fit("--rank", "2049", models="dbk-rbf"), "limit of 2048"),
    "hidden 1025 of a dnn": (_fit("--hidden", "1025", models="dnn"), "--hidden 1025 is above the limit of 1024"),
    "hidden 4097 of a dnn": (_fit("--hidden", "4097", models="knn,dnn"), "--allow-large-model"),
    "rank 6000 allowed large": (_fit("--rank", "6000", "--allow-large-model", models="dbk-rbf"),
                                "more than the 5,132 training rows"),
    "rank 4000 of a knn": (_fit("--rank", "4000", out="knn-rank"), None),
}


@pytest.mark.parametrize("case", list(SIZES), ids=list(SIZES))
def test_rank_and_hidden_are_capped_for_the_kinds_trained_by_gradient(hostile, root, case):
    make, phrase = SIZES[case]
    _run(hostile, root, make, phrase)


# --- a fit of several kinds -------------------------------------------------------------------
def test_a_fit_of_several_kinds_keeps_those_that_finished(hostile, root):
    """--lr 1e12 makes the dnn diverge; the knn, fitted before it, is kept and scored."""
    run = root / "out" / "several"
    argv = ["fit", "--dataset", root / "dataset.parquet", "--out", run, "--models", "knn,dnn", "--epochs", "1",
            "--hidden", "16", "--lr", "1e12", "--no-progress"]
    lines = _run(hostile, root, lambda r: argv, "dnn failed: the training loss (MSE) became nan in epoch 1")
    assert lines[-1].endswith(f"; the fits of knn were saved in {run}")
    assert sorted(p.name for p in (run / "models").iterdir()) == ["knn.pt"]
    assert set(pd.read_csv(run / "metrics.csv")["model"]) == {"knn"}


def test_a_fit_whose_kinds_all_fail_writes_nothing(hostile, root):
    run = root / "out" / "none"
    argv = ["fit", "--dataset", root / "dataset.parquet", "--out", run, "--models", "dnn", "--epochs", "1",
            "--hidden", "16", "--lr", "1e12", "--no-progress"]
    _run(hostile, root, lambda r: argv, "dnn: the training loss (MSE) became nan")
    assert not run.exists()


@pytest.mark.parametrize("verb", ["model", "dataset"])
def test_a_fifo_given_as_a_model_or_dataset_to_the_python_loaders_is_refused_not_opened(tmp_path, verb):
    """Opening a FIFO blocks until a writer comes; predict --model and export --dataset reach
    these loaders, so a FIFO there must be refused before it is opened."""
    import os

    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.errors import InputDataError
    from geodbk.fit.geomodel import GeoModel

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputDataError, match="not a regular file"):
        (GeoModel.load if verb == "model" else SpatialDataset.load)(fifo)
