"""Areas of validation rows on which the local residual field's kernel is also scored.

A validation row's NLL fixes its variance but not how much of it neighbouring tiles share;
the mean of a square of validation rows does (:meth:`~geodbk.fit.residuals.ResidualField.fit`).
:func:`square_areas` groups the rows, :class:`AreaGroups` carries the groups with the GP's
variance of each area's mean, which the caller (:func:`~geodbk.fit.fitting.fit_dataset`)
takes from the GP's joint posterior.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geodbk.dataset.coords import ProjectedTransform

#: Squares (metres, in an equal-area projection) that group validation rows of one quarter
#: into the areas :meth:`ResidualField.fit` also scores, areas with fewer rows skipped, and a
#: cap on their ordered pairs of rows (each costs m kernel values per evaluation).
AREA_SQUARES_M = (2_000.0, 5_000.0)
AREA_MIN_ROWS = 3
AREA_MAX_PAIRS = 150_000


@dataclass(frozen=True)
class AreaGroups:
    """Areas of validation rows whose mean residual also scores the local kernel's choice.

    Attributes:
        rows: (p,) indices into the validation rows (a row may sit in several areas).
        groups: (p,) the area of each, integers in [0, n_areas).
        gp_var: (n_areas,) the GP's variance of each area's equal-weight mean of tile means (its
            latent joint posterior plus the tile noise sigma0^2 / n), (log10 units)^2, before
            the kernel's scale s.
    """

    rows: np.ndarray
    groups: np.ndarray
    gp_var: np.ndarray

    @property
    def n_areas(self) -> int:
        return len(self.gp_var)


def square_areas(
    lonlat: np.ndarray, years: np.ndarray, sizes_m: tuple[float, ...] = AREA_SQUARES_M,
    min_rows: int = AREA_MIN_ROWS, max_pairs: int = AREA_MAX_PAIRS, seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows (p,) and areas (p,) of the squares of side ``sizes_m`` (equal-area metres) that hold
    at least ``min_rows`` of the points ``lonlat`` (n, 2) degrees at one time of ``years`` (n,).
    Areas are kept in a random order until their ordered pairs of rows reach ``max_pairs``."""
    lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
    if len(lonlat) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    xy = ProjectedTransform.from_lonlat(lonlat).to_metres(lonlat)
    quarter = np.floor(np.asarray(years, np.float64) * 4.0).astype(np.int64)
    rows, areas, n_areas = [], [], 0
    for size in sizes_m:
        key = np.column_stack([np.floor(xy / size).astype(np.int64), quarter])
        _, label, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        label = label.reshape(-1)
        keep = np.flatnonzero(counts[label] >= min_rows)
        _, area = np.unique(label[keep], return_inverse=True)
        rows.append(keep)
        areas.append(area.reshape(-1) + n_areas)
        n_areas += int(area.max()) + 1 if len(keep) else 0
    row, area = np.concatenate(rows), np.concatenate(areas)
    order = np.random.default_rng(seed).permutation(n_areas)
    chosen = order[np.cumsum(np.bincount(area, minlength=n_areas)[order] ** 2) <= max_pairs]
    kept = np.isin(area, chosen)
    _, area = np.unique(area[kept], return_inverse=True)
    return row[kept], area.reshape(-1)
