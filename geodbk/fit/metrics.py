"""Point and probabilistic accuracy of predictions, overall and by urban/rural.

All functions take targets ``y`` (n,) and a :class:`~geodbk.prediction.Prediction` in the
same units and return means over points. A prediction is Gaussian or, with finite ``df``, a
Student-t with the same mean and sd (a new measurement's heavy tail,
:class:`~geodbk.fit.tails.MeasurementTails`); 95% intervals are its central ones
(z = 1.959964 when Gaussian).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.special import betaln, erf, gammaln, stdtr

from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path
from geodbk.models.objectives import gaussian_nll as elementwise_gaussian_nll
from geodbk.prediction import Prediction, t_scale_per_sd

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


def _t_scale(prediction: Prediction) -> np.ndarray:
    """(n,) the Student-t scale s of the prediction's sd and df > 2 (:func:`~geodbk.prediction.t_scale_per_sd`)."""
    return np.asarray(prediction.sd, np.float64) * t_scale_per_sd(prediction.df)


def _t_log_density(z: np.ndarray, df: float) -> np.ndarray:
    """log f(z) of the standard Student-t with ``df`` degrees of freedom (scale 1):
    lgamma((df + 1) / 2) - lgamma(df / 2) - 1/2 log(df pi) - (df + 1) / 2 log(1 + z^2 / df)."""
    constant = gammaln(0.5 * (df + 1.0)) - gammaln(0.5 * df) - 0.5 * math.log(df * math.pi)
    return constant - 0.5 * (df + 1.0) * np.log1p(z**2 / df)


def nll_per_row(y: np.ndarray, prediction: Prediction) -> np.ndarray:
    """(n,) -log p(y) of each point. Gaussian: :func:`geodbk.models.objectives.gaussian_nll` in
    float64. Student-t: log s - log f((y - mean) / s), s = :func:`_t_scale`, f the standard t."""
    y = _check(y, prediction)
    if math.isinf(prediction.df):
        y_t, mean, var = (torch.tensor(np.asarray(a), dtype=torch.float64)
                          for a in (y, prediction.mean, prediction.var))
        return elementwise_gaussian_nll(y_t, mean, var).numpy()
    scale = _t_scale(prediction)
    return np.log(scale) - _t_log_density((y - prediction.mean) / scale, prediction.df)


def nll(y: np.ndarray, prediction: Prediction) -> float:
    """Mean negative log predictive density (:func:`nll_per_row`)."""
    return float(np.mean(nll_per_row(y, prediction)))


def crps(y: np.ndarray, prediction: Prediction) -> float:
    """Mean closed-form CRPS. Gaussian: sd [z (2 Phi(z) - 1) + 2 pdf(z) - 1/sqrt(pi)], z = (y - mean) / sd.
    Student-t with scale s and df (Jordan, Krueger and Lerch 2019, the scoringRules paper), z = (y - mean) / s:
    s [z (2 F(z) - 1) + 2 f(z) (df + z^2) / (df - 1) - 2 sqrt(df) B(1/2, df - 1/2) / ((df - 1) B(1/2, df/2)^2)],
    F and f the standard t's cdf and density."""
    y = _check(y, prediction)
    df = prediction.df
    if math.isinf(df):
        z = (y - prediction.mean) / prediction.sd
        cdf = 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
        return float(np.mean(prediction.sd * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - 1.0 / math.sqrt(math.pi))))
    scale = _t_scale(prediction)
    z = (y - prediction.mean) / scale
    spread = 2.0 * math.sqrt(df) * math.exp(betaln(0.5, df - 0.5) - 2.0 * betaln(0.5, 0.5 * df)) / (df - 1.0)
    density = np.exp(_t_log_density(z, df))
    per_row = z * (2.0 * stdtr(df, z) - 1.0) + 2.0 * density * (df + z**2) / (df - 1.0) - spread
    return float(np.mean(scale * per_row))


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
