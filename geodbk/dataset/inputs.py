"""What a map model sees: :class:`InputSpace` turns (lon, lat, quarter) into model inputs X.

Two input spaces, chosen by the fitting protocol (:mod:`geodbk.dataset.protocols`):

:meth:`InputSpace.projected` (the ``space-time`` protocol, the default)
    X = (u, v, t): u, v are the tile centre in a Lambert azimuthal equal-area projection
    centred on the data and scaled by the data's own extent
    (:class:`geodbk.dataset.coords.ProjectedTransform`); t is time in decimal years, scaled so that
    the fitted quarters span [-1, 1]. One model gives the map of any fitted quarter. With a
    density layer (:class:`geodbk.dataset.density.TestDensityCovariates`), X gains its
    covariates after t: another Ookla layer's test density and speed around the place, known
    at every map cell.
:meth:`InputSpace.region_box` (the ``paper`` protocol)
    X = (x1, x2): lon/lat scaled by the region's bounding box
    (:class:`geodbk.dataset.coords.CoordinateTransform`) and no time, as in the DBK paper. Kept
    as the replication protocol.

The input space is stored in the model file, so a saved model predicts in the same
coordinates, and it knows what the model was fitted on: :meth:`InputSpace.extrapolation`
names points outside the fitted extent or time range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from shapely.geometry.base import BaseGeometry

from geodbk.dataset.coords import CoordinateTransform, ProjectedTransform, outside_extent, transform_from_dict
from geodbk.dataset.density import TestDensityCovariates
from geodbk.dataset.domain import DomainReport, beyond_region
from geodbk.errors import InputDataError
from geodbk.quarters import Quarter, quarter_years

#: Time span (years) below which the time axis is not stretched further (one fitted quarter).
_MIN_HALF_SPAN_YEARS = 0.5

TimeLike = Quarter | str | float | np.ndarray | Sequence[float] | None


def parse_time(when: TimeLike) -> np.ndarray | float | None:
    """A quarter (a :class:`Quarter` or its label ``"2023Q4"``), decimal years (float or (n,) array),
    or None -> years."""
    if when is None:
        return None
    if isinstance(when, Quarter | str):
        return Quarter.parse(when).years
    years = np.asarray(when, dtype=np.float64)
    if not np.isfinite(years).all():
        raise InputDataError("time must be finite decimal years")
    return float(years) if years.ndim == 0 else years.reshape(-1)


@dataclass(frozen=True)
class TimeAxis:
    """Decimal years <-> the model's time input; ``first``/``last`` are the fitted quarters' middles."""

    first: float
    last: float

    @property
    def centre(self) -> float:
        return 0.5 * (self.first + self.last)

    @property
    def half_span(self) -> float:
        """Years per unit of the time input (at least half a year)."""
        return max(0.5 * (self.last - self.first), _MIN_HALF_SPAN_YEARS)

    def to_unit(self, years: np.ndarray) -> np.ndarray:
        return (np.asarray(years, dtype=np.float64) - self.centre) / self.half_span

    def to_dict(self) -> dict[str, float]:
        return {"first": self.first, "last": self.last}

    @classmethod
    def from_dict(cls, d: dict) -> TimeAxis:
        return cls(float(d["first"]), float(d["last"]))


@dataclass(frozen=True)
class InputSpace:
    """lon/lat (+ time) -> model inputs X, and the domain the model was fitted on.

    Attributes:
        coords: the spatial transform (projected and data-scaled, or the paper's box).
        time: the time axis, or ``None`` for a time-free model (the paper protocol).
        protocol: the name of the protocol it was made for, a label
            (:data:`geodbk.dataset.protocols.PROTOCOLS`).
        density: covariates from another tile layer, appended after time (space-time only).
    """

    coords: CoordinateTransform | ProjectedTransform
    time: TimeAxis | None = None
    protocol: str = "space-time"
    density: TestDensityCovariates | None = None

    @classmethod
    def projected(
        cls, dataset: Any, protocol: str, density_tiles: pd.DataFrame | None = None
    ) -> InputSpace:
        """The projected, timed input space of a :class:`geodbk.dataset.SpatialDataset`, labelled
        ``protocol``: projection and scale from all of the dataset's tile centres (locations only,
        no targets), time range from its training rows, and the test density of ``density_tiles``
        (another layer's Ookla tiles, e.g. the region's fixed tiles; see
        :mod:`geodbk.dataset.density`) when given.
        """
        tiles = dataset.frame.drop_duplicates("quadkey")
        coords = ProjectedTransform.from_lonlat(tiles[["lon", "lat"]].to_numpy(np.float64))
        train = dataset.subset("train")
        years = quarter_years(train["year"], train["quarter"])
        density = None if density_tiles is None else TestDensityCovariates.from_tiles(density_tiles, coords)
        return cls(coords, TimeAxis(float(years.min()), float(years.max())), protocol, density)

    @classmethod
    def region_box(cls, dataset: Any, protocol: str) -> InputSpace:
        """The time-free input space of a :class:`geodbk.dataset.SpatialDataset`, labelled
        ``protocol``: the dataset's region box."""
        return cls(dataset.transform, None, protocol)

    def years(self, when: TimeLike, n: int) -> np.ndarray | None:
        """(n,) decimal years of ``when`` (default the latest fitted quarter), or None without time."""
        if self.time is None:
            return None
        parsed = self._decimal_years(when)
        if np.ndim(parsed) == 0:
            years = np.broadcast_to(np.asarray(parsed, dtype=np.float64), (n,))
        else:
            years = np.asarray(parsed)
        if len(years) != n:
            raise InputDataError(f"time has {len(years)} values for {n} points")
        return years

    def _decimal_years(self, when: TimeLike) -> np.ndarray | float:
        """``when`` as decimal years (scalar or (n,)), ``None`` being the latest fitted quarter; needs a time axis."""
        assert self.time is not None
        parsed = parse_time(when)
        return self.time.last if parsed is None else parsed

    def features(self, lonlat: np.ndarray, when: TimeLike = None) -> np.ndarray:
        """Model inputs X, (n, input_dim), for ``lonlat`` (n, 2) degrees.

        ``when``: a quarter (``"2023Q4"``), decimal years (scalar or (n,)); ``None`` = the
        latest fitted quarter. Ignored by a time-free model.
        """
        if self.density is None:
            xy, density = self.coords.to_unit(lonlat), None
        else:  # projected once, for both the coordinates and the density windows
            assert isinstance(self.coords, ProjectedTransform)  # a density comes with the space-time protocol
            xy_m = self.coords.to_metres(lonlat)
            xy, density = self.coords.unit_from_metres(xy_m), self.density.columns(xy_m)
        years = self.years(when, len(xy))
        if years is None or self.time is None:  # years is None exactly when time is
            return xy
        X = np.column_stack([xy, self.time.to_unit(years)])
        return X if density is None else np.column_stack([X, density])

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Names of :meth:`features`' columns."""
        names = ("x", "y") if self.time is None else ("x", "y", "t")
        return names + (() if self.density is None else self.density.names)

    def domain(
        self,
        lonlat: np.ndarray,
        times: Sequence[TimeLike] = (None,),
        *,
        xy: np.ndarray | None = None,
        region: BaseGeometry | None = None,
    ) -> DomainReport:
        """Where ``lonlat`` (n, 2) degrees at each of ``times`` (as in :meth:`features`; None = the
        latest fitted quarter) lie against the fitted extent (grown by 5%) and quarters.

        ``xy``: the (n, 2) unit coordinates of ``lonlat`` when already at hand (the first two
        columns of :meth:`features`), so that they are not projected again. ``region``: the
        fitted region polygon (lon/lat); points inside it are not outside the extent
        (:func:`geodbk.dataset.domain.beyond_region`)."""
        outside = outside_extent(self.coords.to_unit(lonlat) if xy is None else xy, self.coords.extent)
        outside = beyond_region(outside, lonlat, region)
        queried = fitted = None
        if self.time is not None:
            fitted = (self.time.first, self.time.last)
            # every queried time counts, with or without points (a map's quarters are checked before its cells)
            joined = np.concatenate([np.atleast_1d(self._decimal_years(when)) for when in times] or [np.empty(0)])
            if len(joined):
                queried = (float(joined.min()), float(joined.max()))
        return DomainReport(len(outside), int(outside.sum()), queried, fitted)

    def extrapolation(
        self,
        lonlat: np.ndarray,
        when: TimeLike = None,
        *,
        xy: np.ndarray | None = None,
        region: BaseGeometry | None = None,
    ) -> str | None:
        """A one-line description of where the query leaves the fitted domain, or None
        (:meth:`DomainReport.warning` of :meth:`domain`, ``xy`` and ``region`` as there): points
        outside the fitted extent and times after the last or before the first fitted quarter;
        one quarter ahead is allowed but still flagged."""
        return self.domain(lonlat, [when], xy=xy, region=region).warning()

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "coords": self.coords.to_dict(),
            "time": None if self.time is None else self.time.to_dict(),
            "density": None if self.density is None else self.density.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> InputSpace:
        time, density = d.get("time"), d.get("density")
        return cls(
            transform_from_dict(d["coords"]),
            None if time is None else TimeAxis.from_dict(time),
            d["protocol"],
            None if density is None else TestDensityCovariates.from_dict(density),
        )
