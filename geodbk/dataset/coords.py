"""Lon/lat <-> model input coordinates.

The model sees each tile as a point ``(u, v)`` in "unit" coordinates. Two maps are on offer:

* :class:`CoordinateTransform` (``kind="box"``), the paper's protocol: the region's lon/lat
  bounding box stretched onto ``[-1, 1]^2``, each axis separately. A dataset covering one
  city in a large state then lands in a sliver of the square (Anchorage, 0.4 degrees wide,
  spans about 0.002 units of Alaska's u axis), and Alaska itself, whose box crosses the antimeridian
  (west -179.18, east 179.78 through the Aleutians), spans almost 360 degrees of
  longitude. Degrees of longitude also shrink with latitude, so the two axes are in
  different units.
* :class:`ProjectedTransform` (``kind="laea"``): a Lambert azimuthal equal-area projection
  centred on the data, in metres, then scaled by one factor on both axes so that the longer
  side of the data's box spans ``[-1, 1]``. Distances stay physical and isotropic, so
  kernel lengthscales and a positional encoding mean the same thing in every direction,
  and the data always fill the square whatever the size or position of the region.

:func:`transform_from_dict` rebuilds either from its ``to_dict()`` output.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np
import pyproj
from numpy.typing import ArrayLike
from pyproj.enums import TransformDirection

from geodbk.errors import InputDataError

#: Floor of :attr:`ProjectedTransform.scale_m`, metres, so one tile or one point still
#: gives a finite transform.
MIN_SCALE_M = 1000.0

Extent = tuple[float, float, float, float]


#: How far (unit coordinates) beyond its fitted extent a point still counts as inside.
DOMAIN_MARGIN = 0.05


def outside_extent(uv: np.ndarray, extent: Extent, margin: float = DOMAIN_MARGIN) -> np.ndarray:
    """``(n, 2)`` unit coordinates -> ``(n,)`` bool, True outside ``extent = (umin, vmin, umax,
    vmax)`` grown by ``margin`` units on each side; NaN counts as outside."""
    umin, vmin, umax, vmax = extent
    u, v = uv[:, 0], uv[:, 1]
    inside = (u >= umin - margin) & (u <= umax + margin) & (v >= vmin - margin) & (v <= vmax + margin)
    return ~inside


def _check_kind(d: dict, expected: str) -> None:
    """Raise :class:`InputDataError` when ``d["kind"]`` is present and not ``expected``."""
    kind = d.get("kind", expected)
    if kind != expected:
        raise InputDataError(f"transform kind {kind!r} where {expected!r} was expected")


@dataclass(frozen=True)
class CoordinateTransform:
    """Affine map of a lon/lat bounding box onto ``[-1, 1]^2``.

    The paper's protocol: the region's lon/lat bounding box mapped onto ``[-1, 1]^2``, each
    axis separately.

    Attributes:
        west, south, east, north: the box, degrees (EPSG:4326).
    """

    kind: ClassVar[str] = "box"

    west: float
    south: float
    east: float
    north: float

    def __post_init__(self) -> None:
        if not (self.east > self.west and self.north > self.south):
            raise InputDataError(f"degenerate bounding box {self.to_dict()}")

    @classmethod
    def from_bounds(cls, bounds: Iterable[float]) -> CoordinateTransform:
        """From ``(west, south, east, north)``."""
        west, south, east, north = (float(v) for v in bounds)
        return cls(west, south, east, north)

    @property
    def extent(self) -> Extent:
        """``(umin, vmin, umax, vmax)`` of the box in unit coordinates: always ``(-1, -1, 1, 1)``."""
        return (-1.0, -1.0, 1.0, 1.0)

    def to_unit(self, lonlat: ArrayLike) -> np.ndarray:
        """``(n, 2)`` lon/lat degrees -> ``(n, 2)`` float64 coordinates, the box -> [-1, 1]^2."""
        lonlat = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
        lo = np.array([self.west, self.south])
        span = np.array([self.east - self.west, self.north - self.south])
        return 2.0 * (lonlat - lo) / span - 1.0

    def to_lonlat(self, xy: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_unit`: ``(n, 2)`` scaled -> ``(n, 2)`` lon/lat degrees."""
        xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        lo = np.array([self.west, self.south])
        span = np.array([self.east - self.west, self.north - self.south])
        return (xy + 1.0) / 2.0 * span + lo

    def outside(self, lonlat: ArrayLike, margin: float = DOMAIN_MARGIN) -> np.ndarray:
        """``(n, 2)`` lon/lat degrees -> ``(n,)`` bool, True outside the box grown by ``margin`` units."""
        return outside_extent(self.to_unit(lonlat), self.extent, margin)

    def to_dict(self) -> dict[str, float | str]:
        """JSON-able ``{"kind": "box", "west", "south", "east", "north"}`` (degrees)."""
        return {"kind": self.kind, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> CoordinateTransform:
        """Inverse of :meth:`to_dict`; ``"kind"`` may be missing (files written before it existed)."""
        _check_kind(d, cls.kind)
        return cls(float(d["west"]), float(d["south"]), float(d["east"]), float(d["north"]))


@lru_cache(maxsize=32)
def _laea_transformer(lon0: float, lat0: float) -> pyproj.Transformer:
    """lon/lat degrees (EPSG:4326, x = lon) -> LAEA metres centred on ``(lon0, lat0)`` degrees."""
    proj4 = f"+proj=laea +lat_0={float(lat0)!r} +lon_0={float(lon0)!r} +datum=WGS84 +units=m +no_defs"
    laea = pyproj.CRS.from_proj4(proj4)
    return pyproj.Transformer.from_crs("EPSG:4326", laea, always_xy=True)


def _wrap_lon(lon: np.ndarray) -> np.ndarray:
    """Longitudes, degrees -> the same longitudes in ``[-180, 180)``."""
    return (lon + 180.0) % 360.0 - 180.0


def _laea_inverse(
    transformer: pyproj.Transformer, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(n,)`` LAEA metres -> ``(n,)`` lon, ``(n,)`` lat degrees, with one correction step.

    PROJ's inverse goes through a truncated series for the authalic latitude, off by about
    1.4e-8 degrees (1.5 mm) in PROJ 9.5, while the forward map is exact. With ``inv = true + e``
    and ``e`` smooth, ``2 * inv(x, y) - inv(fwd(inv(x, y)))`` cancels ``e`` to second order.
    """
    inverse = TransformDirection.INVERSE
    lon, lat = transformer.transform(x, y, direction=inverse)
    lon_again, lat_again = transformer.transform(*transformer.transform(lon, lat), direction=inverse)
    return lon + _wrap_lon(lon - lon_again), 2 * lat - lat_again


@dataclass(frozen=True)
class ProjectedTransform:
    """Lon/lat -> Lambert azimuthal equal-area metres centred on the data -> unit coordinates.

    ``unit = (metres - (x0, y0)) / scale_m``, one factor on both axes: the longer side of the
    data's projected bounding box spans ``[-1, 1]`` and the shorter one lies within it.

    Attributes:
        lon0, lat0: projection centre, degrees.
        x0, y0: centre of the data's projected bounding box, metres.
        scale_m: metres per unit, half the longer side of that box, at least
            :data:`MIN_SCALE_M`.
        extent: ``(umin, vmin, umax, vmax)`` of the data, unit coordinates.
    """

    kind: ClassVar[str] = "laea"

    lon0: float
    lat0: float
    x0: float
    y0: float
    scale_m: float
    extent: Extent

    def __post_init__(self) -> None:
        values = (self.lon0, self.lat0, self.x0, self.y0, self.scale_m, *self.extent)
        if len(self.extent) != 4 or not np.all(np.isfinite(values)):
            raise InputDataError(f"projected transform needs finite values and a 4-value extent: {self}")
        if self.scale_m <= 0 or abs(self.lat0) > 90:
            raise InputDataError(f"projected transform has scale_m <= 0 or |lat0| > 90: {self}")

    @classmethod
    def from_lonlat(cls, lonlat: ArrayLike) -> ProjectedTransform:
        """Fit to ``(n, 2)`` lon/lat degrees: centre on the circular mean longitude and the mean
        latitude, then scale so that the data's longer side spans ``[-1, 1]``."""
        pts = np.asarray(lonlat, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) == 0:
            raise InputDataError(f"need a non-empty (n, 2) lon/lat array, got shape {pts.shape}")
        if not np.all(np.isfinite(pts)):
            raise InputDataError("lon/lat contain NaN or infinite values")
        if np.any(np.abs(pts[:, 1]) > 90):
            raise InputDataError("latitudes outside [-90, 90]")
        lon_rad = np.radians(pts[:, 0])
        lon0 = float(np.degrees(np.arctan2(np.sin(lon_rad).mean(), np.cos(lon_rad).mean())))
        lat0 = float(pts[:, 1].mean())
        x, y = _laea_transformer(lon0, lat0).transform(pts[:, 0], pts[:, 1])
        x0, y0 = float(x.min() + x.max()) / 2, float(y.min() + y.max()) / 2
        scale_m = max(float(x.max() - x.min()) / 2, float(y.max() - y.min()) / 2, MIN_SCALE_M)
        extent = (
            (float(x.min()) - x0) / scale_m,
            (float(y.min()) - y0) / scale_m,
            (float(x.max()) - x0) / scale_m,
            (float(y.max()) - y0) / scale_m,
        )
        return cls(lon0, lat0, x0, y0, scale_m, extent)

    @property
    def crs(self) -> pyproj.CRS:
        """The LAEA projection of :meth:`to_metres`."""
        crs = _laea_transformer(self.lon0, self.lat0).target_crs
        assert crs is not None  # built from two CRSs, so both ends are known
        return crs

    def to_metres(self, lonlat: ArrayLike) -> np.ndarray:
        """``(n, 2)`` lon/lat degrees -> ``(n, 2)`` float64 projected x/y, metres."""
        pts = np.asarray(lonlat, dtype=np.float64).reshape(-1, 2)
        x, y = _laea_transformer(self.lon0, self.lat0).transform(pts[:, 0], pts[:, 1])
        return np.column_stack([x, y])

    def to_unit(self, lonlat: ArrayLike) -> np.ndarray:
        """``(n, 2)`` lon/lat degrees -> ``(n, 2)`` float64 unit coordinates."""
        return self.unit_from_metres(self.to_metres(lonlat))

    def unit_from_metres(self, xy_m: ArrayLike) -> np.ndarray:
        """``(n, 2)`` projected x/y metres (:meth:`to_metres`) -> ``(n, 2)`` unit coordinates,
        for a caller that needs both without projecting twice."""
        return (np.asarray(xy_m, dtype=np.float64).reshape(-1, 2) - np.array([self.x0, self.y0])) / self.scale_m

    def to_lonlat(self, xy_unit: ArrayLike) -> np.ndarray:
        """Inverse of :meth:`to_unit`: ``(n, 2)`` unit coordinates -> ``(n, 2)`` lon/lat degrees,
        longitudes in ``[-180, 180)``."""
        xy = np.asarray(xy_unit, dtype=np.float64).reshape(-1, 2) * self.scale_m
        xy = xy + np.array([self.x0, self.y0])
        lon, lat = _laea_inverse(_laea_transformer(self.lon0, self.lat0), xy[:, 0], xy[:, 1])
        return np.column_stack([_wrap_lon(lon), lat])

    def metres_to_units(self, distance_m: float) -> float:
        """A distance in projected metres -> the same distance in unit coordinates."""
        return float(distance_m) / self.scale_m

    def outside(self, lonlat: ArrayLike, margin: float = DOMAIN_MARGIN) -> np.ndarray:
        """``(n, 2)`` lon/lat degrees -> ``(n,)`` bool, True outside :attr:`extent` grown by
        ``margin`` units."""
        return outside_extent(self.to_unit(lonlat), self.extent, margin)

    def to_dict(self) -> dict[str, float | str | list[float]]:
        """JSON-able ``{"kind": "laea", "lon0", "lat0", "x0", "y0", "scale_m", "extent"}``."""
        return {
            "kind": self.kind,
            "lon0": self.lon0,
            "lat0": self.lat0,
            "x0": self.x0,
            "y0": self.y0,
            "scale_m": self.scale_m,
            "extent": [float(v) for v in self.extent],
        }

    @classmethod
    def from_dict(cls, d: dict) -> ProjectedTransform:
        """Inverse of :meth:`to_dict`."""
        _check_kind(d, cls.kind)
        try:
            umin, vmin, umax, vmax = (float(v) for v in d["extent"])
            centre = (float(d["lon0"]), float(d["lat0"]), float(d["x0"]), float(d["y0"]))
            scale_m = float(d["scale_m"])
        except (KeyError, TypeError, ValueError) as err:
            raise InputDataError(f"malformed projected transform {d}: {err!r}") from None
        return cls(*centre, scale_m, (umin, vmin, umax, vmax))


def transform_from_dict(d: dict) -> CoordinateTransform | ProjectedTransform:
    """Rebuild a transform from its ``to_dict()``; a dict without ``"kind"`` is a box."""
    kinds: dict[str, type[CoordinateTransform] | type[ProjectedTransform]] = {
        CoordinateTransform.kind: CoordinateTransform,
        ProjectedTransform.kind: ProjectedTransform,
    }
    kind = d.get("kind", CoordinateTransform.kind)
    if kind not in kinds:
        raise InputDataError(f"unknown transform kind {kind!r}; expected one of {sorted(kinds)}")
    return kinds[kind].from_dict(d)
