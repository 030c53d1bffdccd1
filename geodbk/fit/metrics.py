"""Point and probabilistic accuracy of Gaussian predictions, overall and by urban/rural.

All functions take targets ``y`` (n,) and a :class:`~geodbk.fit.regressor.Prediction` in the
same units and return means over points. 95% intervals use z = 1.959964.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.special import erf

from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path
from geodbk.models.objectives import gaussian_nll as elementwise_gaussian_nll
from geodbk.prediction import Z95, Prediction

METRIC_COLUMNS = ["n", "MAE", "NLL", "CRPS", "coverage95", "pi_width"]
GROUPS = ("overall", "urban", "rural")


def _check(y: np.ndarray, prediction: Prediction) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if y.shape != np.shape(prediction.mean):
        raise InputDataError(f"y has {y.shape[0]} values but the prediction has {len(prediction.mean)}")
    return y


def mae(y: np.ndarray, prediction: Prediction) -> float:
    """Mean absolute error |y - mean|."""
    return float(np.mean(np.abs(_check(y, prediction) - prediction.mean)))


def gaussian_nll(y: np.ndarray, prediction: Prediction) -> float:
    """Mean -log N(y; mean, sd^2), by :func:`geodbk.models.objectives.gaussian_nll` in float64."""
    y = _check(y, prediction)
    y_t, mean, var = (torch.tensor(np.asarray(a), dtype=torch.float64) for a in (y, prediction.mean, prediction.var))
    return float(elementwise_gaussian_nll(y_t, mean, var).mean())


def crps_gaussian(y: np.ndarray, prediction: Prediction) -> float:
    """Mean closed-form CRPS of N(mean, sd^2): sd [z (2 Phi(z) - 1) + 2 pdf(z) - 1/sqrt(pi)]."""
    y = _check(y, prediction)
    z = (y - prediction.mean) / prediction.sd
    cdf = 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
    return float(np.mean(prediction.sd * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - 1.0 / math.sqrt(math.pi))))


def coverage95(y: np.ndarray, prediction: Prediction) -> float:
    """Share of y inside mean +/- 1.959964 sd (0..1)."""
    y = _check(y, prediction)
    return float(np.mean(np.abs(y - prediction.mean) <= Z95 * prediction.sd))


def pi_width(prediction: Prediction) -> float:
    """Mean width of the 95% prediction interval."""
    return float(np.mean(prediction.pi_width))


def _row(y: np.ndarray, prediction: Prediction) -> dict[str, float]:
    return {
        "n": len(y),
        "MAE": mae(y, prediction),
        "NLL": gaussian_nll(y, prediction),
        "CRPS": crps_gaussian(y, prediction),
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
    ``{model name: evaluate(...) output}``."""
    parts = [frame.reset_index().assign(model=name) for name, frame in results.items()]
    if not parts:
        return pd.DataFrame(columns=["model", "group", *METRIC_COLUMNS])
    return pd.concat(parts, ignore_index=True)[["model", "group", *METRIC_COLUMNS]]


def format_metrics_table(table: pd.DataFrame) -> str:
    """A fixed-width text table of a :func:`metrics_table`, coverage in percent."""
    shown = table.copy()
    shown["coverage95"] = (100 * shown["coverage95"]).map("{:.1f}%".format)
    for col in ("MAE", "NLL", "CRPS", "pi_width"):
        shown[col] = shown[col].map("{:.4f}".format)
    return shown.to_string(index=False)


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
