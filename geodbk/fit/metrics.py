"""Point and probabilistic accuracy of predictions, overall and by urban/rural.

All functions take targets ``y`` (n,) and a :class:`~geodbk.prediction.Prediction` in the
same units and return means over points. A prediction is Gaussian or has another
:class:`~geodbk.shape.Shape` with the same mean and sd (a new measurement's long lower tail,
:class:`~geodbk.fit.tails.MeasurementTails`); 95% intervals are its central ones
(z = 1.959964 when Gaussian).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path
from geodbk.models.objectives import gaussian_nll as elementwise_gaussian_nll
from geodbk.prediction import Prediction

METRIC_COLUMNS = ["n", "MAE", "NLL", "CRPS", "coverage95", "pi_width"]
GROUPS = ("overall", "urban", "rural")
#: The closed-form k-nearest-tiles baseline (:mod:`geodbk.models.knn`) that a map has to beat.
BASELINE_KIND = "knn"


def _check(y: np.ndarray, prediction: Prediction) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if y.shape != np.shape(prediction.mean):
        raise InputDataError(f"y has {y.shape[0]} values but the prediction has {len(prediction.mean)}")
    return y


def mae(y: np.ndarray, prediction: Prediction) -> float:
    """Mean absolute error |y - mean|."""
    return float(np.mean(np.abs(_check(y, prediction) - prediction.mean)))


def nll_per_row(y: np.ndarray, prediction: Prediction) -> np.ndarray:
    """(n,) -log p(y) of each point. Gaussian: :func:`geodbk.models.objectives.gaussian_nll` in
    float64. Another shape: log sd - log f((y - mean) / sd), f the shape's density."""
    y = _check(y, prediction)
    if prediction.shape.is_gaussian:
        y_t, mean, var = (torch.tensor(np.asarray(a), dtype=torch.float64)
                          for a in (y, prediction.mean, prediction.var))
        return elementwise_gaussian_nll(y_t, mean, var).numpy()
    sd = np.asarray(prediction.sd, np.float64)
    return np.log(sd) - prediction.shape.log_density((y - prediction.mean) / sd)


def nll(y: np.ndarray, prediction: Prediction) -> float:
    """Mean negative log predictive density (:func:`nll_per_row`)."""
    return float(np.mean(nll_per_row(y, prediction)))


def crps(y: np.ndarray, prediction: Prediction) -> float:
    """Mean CRPS, sd times the shape's CRPS of (y - mean) / sd (:meth:`geodbk.shape.Shape.crps`:
    closed-form for a Gaussian and a Student-t, numerical for a sinh-arcsinh shape)."""
    y = _check(y, prediction)
    sd = np.asarray(prediction.sd, np.float64)
    return float(np.mean(sd * prediction.shape.crps((y - prediction.mean) / sd)))


def coverage95(y: np.ndarray, prediction: Prediction) -> float:
    """Share of y inside the central 95% interval, [prediction.lower, prediction.upper] (0..1)."""
    y = _check(y, prediction)
    return float(np.mean((y >= prediction.lower) & (y <= prediction.upper)))


def pi_width(prediction: Prediction) -> float:
    """Mean width of the 95% prediction interval."""
    return float(np.mean(prediction.pi_width))


def _row(y: np.ndarray, prediction: Prediction) -> dict[str, float]:
    return {
        "n": len(y),
        "MAE": mae(y, prediction),
        "NLL": nll(y, prediction),
        "CRPS": crps(y, prediction),
        "coverage95": coverage95(y, prediction),
        "pi_width": pi_width(prediction),
    }


def evaluate(y: np.ndarray, prediction: Prediction, groups: Sequence[str] | None = None) -> pd.DataFrame:
    """Metrics overall and per group.

    Args:
        y: (n,) targets. prediction: matching :class:`Prediction`.
        groups: optional (n,) labels, e.g. the dataset's ``urban_rural`` column.

    Returns:
        DataFrame indexed by group ("overall", then "urban" and "rural" when ``groups`` is
        given; other labels follow in sorted order) with columns
        n, MAE, NLL, CRPS, coverage95, pi_width. Groups with no points are left out.
    """
    y = _check(y, prediction)
    rows = {"overall": _row(y, prediction)}
    if groups is not None:
        labels = np.asarray(groups).astype(str)
        if labels.shape != y.shape:
            raise InputDataError(f"groups has {labels.shape[0]} labels for {y.shape[0]} targets")
        known = [g for g in GROUPS[1:] if g in set(labels)]
        for label in known + sorted(set(labels) - set(GROUPS)):
            mask = labels == label
            rows[label] = _row(y[mask], prediction.subset(mask))
    frame = pd.DataFrame.from_dict(rows, orient="index")[METRIC_COLUMNS]
    frame.index.name = "group"
    return frame


def metrics_table(results: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Long table (model, group, n, MAE, NLL, CRPS, coverage95, pi_width) from
    ``{model name: evaluate(...) output}``; with a ``target`` column after ``model`` when the
    frames have one (a download,upload model's rows of each target)."""
    parts = [frame.reset_index().assign(model=name) for name, frame in results.items()]
    if not parts:
        return pd.DataFrame(columns=["model", "group", *METRIC_COLUMNS])
    table = pd.concat(parts, ignore_index=True)
    return table[metrics_columns(table)]


def metrics_columns(table: pd.DataFrame) -> list[str]:
    """The column order of a :func:`metrics_table`: model, target (where ``table`` has one), group,
    then :data:`METRIC_COLUMNS`."""
    return ["model", *(["target"] if "target" in table else []), "group", *METRIC_COLUMNS]


def format_metrics_table(table: pd.DataFrame) -> str:
    """A fixed-width text table of a :func:`metrics_table`, coverage in percent."""
    shown = table.copy()
    shown["coverage95"] = (100 * shown["coverage95"]).map("{:.1f}%".format)
    for col in ("MAE", "NLL", "CRPS", "pi_width"):
        shown[col] = shown[col].map("{:.4f}".format)
    return shown.to_string(index=False)


def baseline_note(table: pd.DataFrame) -> str | None:
    """One line naming the models of a :func:`metrics_table` whose overall NLL is above the
    nearest-tiles baseline's (:data:`BASELINE_KIND`), with both NLLs; None when every model beats
    it or the table has no baseline row. On a small region's held-out blocks the baseline can win
    (the Big Island's 6-10 km squares in ``benchmarks/bench_regions.py``), and there the map says
    less than the measured tiles around a place."""
    if "target" in table and len(table):  # the first target's rows (download, beside a pair's upload)
        table = table[table["target"] == table["target"].iloc[0]]
    overall = table[table["group"] == "overall"].drop_duplicates("model", keep="last").set_index("model")["NLL"]
    if BASELINE_KIND not in overall.index:
        return None
    baseline = float(overall[BASELINE_KIND])
    worse = [f"{model} ({nll:.3f})" for model, nll in overall.items() if model != BASELINE_KIND and nll > baseline]
    if not worse:
        return None
    return (f"note: the nearest-tiles average ({BASELINE_KIND}, NLL {baseline:.3f}) scores better on these held-out "
            f"rows than {', '.join(worse)}; at places like them, the measured tiles nearby say more than that map")


def save_metrics(table: pd.DataFrame, run_dir: str | Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``metrics.csv`` and ``metrics.json`` (list of records) into ``run_dir``, each atomically
    (a folder at either path is replaced only with ``overwrite``). To change them together with
    other files of a run folder, write into a :class:`geodbk.fileio.FolderCommit`'s staging
    folder (:meth:`geodbk.workflow.RunFolder.save_fits`)."""
    run_dir = Path(run_dir)
    csv_path, json_path = run_dir / "metrics.csv", run_dir / "metrics.json"
    with atomic_path(csv_path, overwrite=overwrite) as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(json_path, overwrite=overwrite) as tmp:
        tmp.write_text(json.dumps(table.to_dict(orient="records"), indent=2))
    return csv_path, json_path
