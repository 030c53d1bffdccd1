"""UCI regression benchmarks with fixed train/test splits (the ``uci_datasets`` layout).

Each dataset is a folder ``<root>/<name>/`` with two files:

* ``data.csv.gz``: no header, one row per example; the last column is the target ``y``,
  the other columns are the inputs ``X``.
* ``test_mask.csv.gz``: same number of rows, one 0/1 column per split; column ``k`` marks
  the test rows of split ``k`` (10 splits, ~10% test each).

:func:`load_uci` reads a dataset; :meth:`UCIDataset.split` turns split ``k`` into scaled
train / validation / test arrays with the protocol of the DBK papers: validation carved from
the training rows with a fixed seed, inputs scaled to [-1, 1] (or standardised) and ``y``
standardised with training statistics only. Metrics computed on the returned arrays are in
standardised target units, as the papers report them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from geodbk.errors import InputDataError
from geodbk.paths import SAMPLE_DIR

#: Small UCI sets shipped with the repository (used by the tests).
SHIPPED_UCI_DIR = SAMPLE_DIR / "uci"

Scaling = Literal["minmax", "standardize"]


def default_uci_root() -> Path:
    """Folder searched by :func:`load_uci` when no root is given.

    ``GEODBK_UCI_DIR`` overrides the shipped folder ``data/uci``.
    """
    return Path(os.environ.get("GEODBK_UCI_DIR", SHIPPED_UCI_DIR))


def available_uci(root: str | Path | None = None) -> list[str]:
    """Names of the datasets under ``root`` that have both files, sorted."""
    root = Path(root) if root is not None else default_uci_root()
    if not root.is_dir():
        return []
    return sorted(
        p.name
        for p in root.iterdir()
        if (p / "data.csv.gz").is_file() and (p / "test_mask.csv.gz").is_file()
    )


@dataclass(frozen=True)
class UCISplit:
    """One train / validation / test split, scaled for modelling.

    All ``X_*`` are ``(n_*, d)`` float64 inputs scaled with training statistics; all ``y_*``
    are ``(n_*,)`` float64 targets standardised as ``(y - y_mean) / y_std``.
    """

    name: str
    split: int
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    y_mean: float
    y_std: float

    def to_original_units(self, y_std_units: np.ndarray) -> np.ndarray:
        """Map standardised targets (or predictive means) back to the dataset's units."""
        return np.asarray(y_std_units) * self.y_std + self.y_mean


@dataclass(frozen=True)
class UCIDataset:
    """A UCI regression set with its fixed test masks.

    Attributes
    ----------
    name: dataset name (folder name).
    X: ``(n, d)`` float64 inputs as shipped (pre-processed by the source).
    y: ``(n,)`` float64 targets.
    test_mask: ``(n, n_splits)`` bool; column ``k`` marks the test rows of split ``k``.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    test_mask: np.ndarray

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        return int(self.X.shape[1])

    @property
    def n_splits(self) -> int:
        return int(self.test_mask.shape[1])

    def split(
        self,
        k: int = 0,
        *,
        val_fraction: float = 0.1,
        seed: int = 0,
        scaling: Scaling = "minmax",
        max_train: int | None = None,
        max_test: int | None = None,
    ) -> UCISplit:
        """Scaled arrays for split ``k``.

        Parameters
        ----------
        k: split index, ``0 <= k < n_splits``; its test rows are the test set.
        val_fraction: share of the (non-test) training rows carved out as validation,
            chosen with ``numpy.random.default_rng(seed)``.
        seed: seed for the validation carve and for subsampling.
        scaling: ``"minmax"`` maps each input column to [-1, 1] over the training rows
            (the DBK papers' protocol); ``"standardize"`` gives zero mean, unit variance.
            Constant columns are centred and left unscaled.
        max_train, max_test: optional random subsample sizes (CPU-sized benchmarks); the
            validation set is carved before subsampling the training rows.
        """
        if not 0 <= k < self.n_splits:
            raise InputDataError(f"{self.name}: split {k} out of range 0..{self.n_splits - 1}")
        if not 0.0 < val_fraction < 1.0:
            raise InputDataError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if scaling not in ("minmax", "standardize"):
            raise InputDataError(f"scaling must be 'minmax' or 'standardize', got {scaling!r}")
        rng = np.random.default_rng(seed)
        test_idx = np.flatnonzero(self.test_mask[:, k])
        rest = rng.permutation(np.flatnonzero(~self.test_mask[:, k]))
        n_val = max(1, int(round(val_fraction * rest.size)))
        val_idx, train_idx = rest[:n_val], rest[n_val:]
        if max_train is not None and train_idx.size > max_train:
            train_idx = rng.choice(train_idx, size=max_train, replace=False)
        if max_test is not None and test_idx.size > max_test:
            test_idx = rng.choice(test_idx, size=max_test, replace=False)
        train_idx, val_idx, test_idx = np.sort(train_idx), np.sort(val_idx), np.sort(test_idx)

        X_tr = self.X[train_idx]
        if scaling == "minmax":
            lo, hi = X_tr.min(axis=0), X_tr.max(axis=0)
            centre, half = (hi + lo) / 2.0, (hi - lo) / 2.0
        else:
            centre, half = X_tr.mean(axis=0), X_tr.std(axis=0)
        half = np.where(half > 0, half, 1.0)
        y_mean = float(self.y[train_idx].mean())
        y_std = float(self.y[train_idx].std())
        if not y_std > 0:
            raise InputDataError(f"{self.name}: training targets of split {k} are constant")

        def x(idx: np.ndarray) -> np.ndarray:
            return (self.X[idx] - centre) / half

        def y(idx: np.ndarray) -> np.ndarray:
            return (self.y[idx] - y_mean) / y_std

        return UCISplit(
            name=self.name,
            split=k,
            X_train=x(train_idx),
            y_train=y(train_idx),
            X_val=x(val_idx),
            y_val=y(val_idx),
            X_test=x(test_idx),
            y_test=y(test_idx),
            y_mean=y_mean,
            y_std=y_std,
        )


def load_uci(name: str, root: str | Path | None = None) -> UCIDataset:
    """Read ``<root>/<name>/data.csv.gz`` and ``test_mask.csv.gz``.

    ``root`` defaults to :func:`default_uci_root` (the shipped ``data/uci``).
    Raises :class:`~geodbk.errors.InputDataError` when a file is missing, the two files
    disagree in length, the data hold non-finite values, or a mask is not 0/1.
    """
    root = Path(root) if root is not None else default_uci_root()
    folder = root / name
    data_path, mask_path = folder / "data.csv.gz", folder / "test_mask.csv.gz"
    for path in (data_path, mask_path):
        if not path.is_file():
            have = ", ".join(available_uci(root)) or "none"
            raise InputDataError(f"UCI dataset {name!r}: {path} not found (available: {have})")
    data = pd.read_csv(data_path, header=None).to_numpy(dtype=np.float64)
    mask = pd.read_csv(mask_path, header=None).to_numpy()
    if data.ndim != 2 or data.shape[1] < 2:
        raise InputDataError(f"{data_path}: need at least one input column and the target")
    if mask.shape[0] != data.shape[0]:
        raise InputDataError(
            f"{name}: test_mask has {mask.shape[0]} rows but data has {data.shape[0]}"
        )
    if not np.isin(mask, (0, 1)).all():
        raise InputDataError(f"{mask_path}: test mask must contain only 0/1")
    if not np.isfinite(data).all():
        raise InputDataError(f"{data_path}: contains NaN or infinite values")
    return UCIDataset(name=name, X=data[:, :-1], y=data[:, -1], test_mask=mask.astype(bool))
