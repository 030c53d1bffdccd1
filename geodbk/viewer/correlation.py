"""What a place tells about the others: the map model's covariance with a reference point,
as covariance or as correlation, before the data (prior) and after them (posterior).

A kernel slice is the prior covariance ``k(x, x_ref)`` between the cells ``x`` and a
reference point, in (log10 units)²; its correlation is

    ρ(x, x_ref) = k(x, x_ref) / sqrt(k(x, x) k(x_ref, x_ref)),

which is 1 at the reference point itself and at most 1 in absolute value. The posterior
correlation is the same ratio of the map posterior's covariance (:meth:`GeoModel.posterior`,
first target) given the training tiles: how much a new test at ``x_ref`` still moves the map
at ``x`` (:func:`posterior_correlation`). :func:`half_distance` reads off the distance at
which a correlation falls to 0.5, which is how far a visit informs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import pandas as pd

from geodbk.blocks import blocks
from geodbk.quarters import Quarter
from geodbk.viewer.tiles import distance_km

#: Smallest variance product divided by, so that a vanishing prior variance gives 0, not inf.
MIN_VARIANCE = 1e-30

SliceKind = Literal["correlation", "covariance"]
#: Cells whose joint posterior with the reference point is asked for together (memory and time
#: grow with a block's short-range neighbours; the ref's covariance with a cell does not depend
#: on the other cells of its block).
POSTERIOR_BLOCK = 4000
#: The level :func:`half_distance` reads the distance at.
HALF = 0.5


class KernelModel(Protocol):
    """What a slice needs from a GP (:class:`geodbk.fit.geomodel.GeoModel` is one): lon/lat
    degrees in, one quarter (``None`` for the model's default)."""

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: Quarter | None = None) -> np.ndarray:
        """``(n, k)`` prior covariance between ``n`` points and ``k`` reference points."""
        ...

    def prior_variance(self, lonlat: np.ndarray, time: Quarter | None = None) -> np.ndarray:
        """``(n,)`` prior variance k(x, x)."""
        ...


def correlation(k: np.ndarray, var_x: np.ndarray, var_ref: np.ndarray | float) -> np.ndarray:
    """Normalise a kernel slice to a correlation.

    Args:
        k: ``(m,)`` slice at one reference point, or ``(m, r)`` at ``r`` of them, (log10 units)².
        var_x: ``(m,)`` prior variance k(x, x) at the ``m`` points.
        var_ref: prior variance k(x_ref, x_ref): a number, or ``(r,)`` for a 2-D ``k``.

    Returns:
        ρ, shaped like ``k`` (dimensionless).
    """
    k = np.asarray(k, dtype=np.float64)
    var_x = np.asarray(var_x, dtype=np.float64)
    product = np.multiply.outer(var_x, var_ref) if k.ndim == 2 else var_x * np.asarray(var_ref, dtype=np.float64)
    return k / np.sqrt(np.clip(product, MIN_VARIANCE, None))


def slice_at_cells(
    model: KernelModel,
    lonlat: np.ndarray,
    ref: tuple[float, float],
    quarter: Quarter | None,
    kind: SliceKind = "correlation",
    var_x: np.ndarray | None = None,
) -> np.ndarray:
    """``(m,)`` kernel slice between the cells ``lonlat`` (``(m, 2)`` degrees) and ``ref``
    (lon, lat) at ``quarter``: ``k(x, x_ref)`` in (log10 units)² for ``"covariance"``, ρ for
    ``"correlation"``. ``var_x``: the cells' prior variance when already at hand (it is the
    costly part), else computed."""
    ref_lonlat = np.array([ref], dtype=np.float64)
    k = model.kernel_slice(lonlat, ref_lonlat, quarter)[:, 0]
    if kind == "covariance":
        return np.asarray(k, dtype=np.float64)
    if var_x is None:
        var_x = model.prior_variance(lonlat, quarter)
    return correlation(k, var_x, float(model.prior_variance(ref_lonlat, quarter)[0]))


class PosteriorModel(Protocol):
    """What a posterior correlation needs (:class:`geodbk.fit.geomodel.GeoModel` is one)."""

    def posterior(self, lonlat: np.ndarray, time: Quarter | None = None, *, covariance: bool = True) -> Any:
        """A :class:`geodbk.fit.posterior.MapPosterior` at ``lonlat`` (n, 2) degrees: ``targets``,
        ``n_sites``, ``covariance(rows, cols)`` between flat indices ``site * T + target`` and
        ``sd()`` (n, T)."""
        ...


def posterior_correlation(
    model: PosteriorModel,
    lonlat: np.ndarray,
    ref: tuple[float, float],
    quarter: Quarter | None,
    *,
    block: int = POSTERIOR_BLOCK,
) -> np.ndarray:
    """``(m,)`` posterior correlation of the first target between the cells ``lonlat`` (``(m, 2)``
    degrees) and ``ref`` (lon, lat) at ``quarter``: ``Cov(f(x), f(x_ref)) / (sd(x) sd(x_ref))``
    under the map model's posterior, asked for ``[ref, cells]`` in blocks of ``block`` cells.

    A cell at the reference point itself is the reference site (correlation 1), not a second site
    there (which a model may give a small variance of its own)."""
    lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
    ref_lonlat = np.array([ref], dtype=np.float64)
    rho = np.empty(len(lonlat), dtype=np.float64)
    for part in blocks(len(lonlat), max(int(block), 1)):
        cells = lonlat[part]
        itself = np.all(cells == ref_lonlat, axis=1)
        posterior = model.posterior(np.vstack([ref_lonlat, cells[~itself]]), quarter, covariance=True)
        site = np.zeros(len(cells), dtype=np.int64)  # each cell's site: 0 (the ref) or its own
        site[~itself] = np.arange(1, int((~itself).sum()) + 1)
        flat = np.arange(posterior.n_sites) * len(posterior.targets)  # site * T + 0: the first target
        k = posterior.covariance(flat[:1], flat)[0]
        variance = posterior.sd()[:, 0] ** 2
        rho[part] = correlation(k[site], variance[site], variance[0])
    return rho


@dataclass(frozen=True)
class HalfDistance:
    """Where a correlation with a reference point falls to 0.5, from the medians over distance bins.

    Attributes:
        km: the distance (km) at which the binned median correlation crosses 0.5, interpolated
            linearly between the last bin at or above it and the first bin below it (each bin at
            the median distance of its cells); ``None`` when no bin falls below 0.5.
        bin: ``(lower, upper)`` km of the first (smallest-distance) bin whose median correlation
            is below 0.5, or ``None``.
        bin_km: the bins' width (km).
        farthest_km: the largest distance looked at (km).
    """

    km: float | None
    bin: tuple[float, float] | None
    bin_km: float
    farthest_km: float

    def text(self) -> str:
        """``"correlation falls to 0.5 at 3.2 km (first 1.0 km bin below: 3.0–4.0 km)"``."""
        if self.km is None or self.bin is None:
            return f"correlation stays above 0.5 out to {self.farthest_km:.0f} km (the whole grid)"
        low, high = self.bin
        if low == 0.0:  # the nearest cells already fall below 0.5: finer than the grid
            return (
                f"correlation falls to 0.5 at about {self.km:.1f} km, within the first {self.bin_km:.1f} km "
                "distance bin (finer than the grid's cells)"
            )
        return (
            f"correlation falls to 0.5 at {self.km:.1f} km "
            f"(first {self.bin_km:.1f} km bin below: {low:.1f}–{high:.1f} km)"
        )


def half_distance(distance: np.ndarray, rho: np.ndarray, bin_km: float) -> HalfDistance:
    """The distance at which a correlation falls to 0.5 (see :class:`HalfDistance`).

    Args:
        distance: ``(m,)`` km from the reference point to each cell.
        rho: ``(m,)`` the cells' correlation with the reference point (NaN left out).
        bin_km: width of the distance bins (km), e.g. the grid's cell size.
    """
    distance, rho = np.asarray(distance, dtype=np.float64), np.asarray(rho, dtype=np.float64)
    keep = np.isfinite(distance) & np.isfinite(rho)
    distance, rho = distance[keep], rho[keep]
    bin_km = float(bin_km)
    if not bin_km > 0:
        raise ValueError(f"bin_km must be positive, got {bin_km}")
    farthest = float(distance.max()) if distance.size else 0.0
    bins = pd.DataFrame({"bin": np.floor(distance / bin_km).astype(np.int64), "d": distance, "rho": rho})
    medians = bins.groupby("bin", sort=True).median()
    below = np.flatnonzero(medians["rho"].to_numpy() < HALF)
    if below.size == 0:
        return HalfDistance(None, None, bin_km, farthest)
    first = int(below[0])
    index = int(medians.index[first])
    d1, r1 = float(medians["d"].iloc[first]), float(medians["rho"].iloc[first])
    # the bin before it (median >= 0.5), or the reference point itself (distance 0, correlation 1)
    d0, r0 = (float(medians["d"].iloc[first - 1]), float(medians["rho"].iloc[first - 1])) if first else (0.0, 1.0)
    km = d0 + (r0 - HALF) / (r0 - r1) * (d1 - d0) if r0 > r1 else d1
    return HalfDistance(float(km), (index * bin_km, (index + 1) * bin_km), bin_km, farthest)


def cell_km(lonlat: np.ndarray) -> float:
    """The grid's cell size (km): the distance from a central cell of ``lonlat`` (``(m, 2)``
    degrees) to its nearest other cell; 1 km for fewer than two cells."""
    lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
    if len(lonlat) < 2:
        return 1.0
    centre = lonlat[len(lonlat) // 2]
    d = distance_km(lonlat[:, 0], lonlat[:, 1], float(centre[0]), float(centre[1]))
    positive = d[d > 0]
    return float(positive.min()) if positive.size else 1.0
