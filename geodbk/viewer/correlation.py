"""Kernel slices over a grid's cells, as covariance or as correlation.

A kernel slice is the prior covariance ``k(x, x_ref)`` between the cells ``x`` and a
reference point, in (log10 units)²; its correlation is

    ρ(x, x_ref) = k(x, x_ref) / sqrt(k(x, x) k(x_ref, x_ref)),

which is 1 at the reference point itself and at most 1 in absolute value.
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np

#: Smallest variance product divided by, so that a vanishing prior variance gives 0, not inf.
MIN_VARIANCE = 1e-30

SliceKind = Literal["correlation", "covariance"]


class KernelModel(Protocol):
    """What a slice needs from a GP (:class:`geodbk.fit.geomodel.GeoModel` is one): lon/lat
    degrees in, one quarter (``"2023Q4"``, or ``None`` for the model's default)."""

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray, time: str | None = None) -> np.ndarray:
        """``(n, k)`` prior covariance between ``n`` points and ``k`` reference points."""
        ...

    def prior_variance(self, lonlat: np.ndarray, time: str | None = None) -> np.ndarray:
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
    quarter: str | None,
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
