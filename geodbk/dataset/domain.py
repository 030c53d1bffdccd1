"""How far a query leaves the domain a model was fitted on: :class:`DomainReport`.

One measurement, made by :meth:`geodbk.dataset.inputs.InputSpace.domain`, read two ways:
:meth:`DomainReport.warning` names any departure (Python prediction warns with it) and
:meth:`DomainReport.problem` names only what is too far out to map (the CLI refuses it
without ``--allow-extrapolation``), so the warning and the refusal cannot drift apart.

A point counts as outside the fitted extent when it lies outside the box of the training
tiles grown by 5% and also outside the fitted region's polygon (:func:`beyond_region`): a
map of a model's own region is not extrapolation where the region reaches past its tiles
(coastal cells, Mona Island).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import shapely
from shapely.geometry.base import BaseGeometry

from geodbk.quarters import QUARTER_YEARS, Quarter

#: Quarters after the last fitted one that a space-time model may forecast before a map of them
#: counts as extrapolation to refuse (:meth:`DomainReport.problem`); they still warn.
FORECAST_QUARTERS = 1
#: Share of a requested area outside the fitted extent above which the area counts as
#: "mostly outside" (:meth:`DomainReport.problem`).
MAX_OUTSIDE_SHARE = 0.5


@dataclass(frozen=True)
class DomainReport:
    """Where query points and quarters lie against the fitted extent and quarters.

    Attributes:
        n_points: query points.
        n_outside: those outside the fitted extent (grown by 5%) and the fitted region polygon.
        queried: (earliest, latest) queried time, decimal years; None without time or points.
        fitted: (first, last) fitted quarter middles, decimal years; None for a time-free model.
        kind: the model kind, for :meth:`problem`.
        region: the fitted region's name (e.g. ``"PR"``), for :meth:`problem`, or None.
    """

    n_points: int
    n_outside: int
    queried: tuple[float, float] | None
    fitted: tuple[float, float] | None
    kind: str = "model"
    region: str | None = None

    @property
    def outside_share(self) -> float:
        """Share (0-1) of the query points outside the fitted extent (0 without points)."""
        return self.n_outside / self.n_points if self.n_points else 0.0

    @property
    def quarters_after(self) -> float:
        """Quarters from the last fitted quarter to the latest queried one (0 if none is later)."""
        if self.queried is None or self.fitted is None:
            return 0.0
        return max(0.0, (self.queried[1] - self.fitted[1]) / QUARTER_YEARS)

    @property
    def quarters_before(self) -> float:
        """Quarters from the earliest queried one to the first fitted quarter (0 if none is earlier)."""
        if self.queried is None or self.fitted is None:
            return 0.0
        return max(0.0, (self.fitted[0] - self.queried[0]) / QUARTER_YEARS)

    def warning(self) -> str | None:
        """One line naming every departure (any point outside, any later or earlier quarter), or None."""
        problems = []
        if self.n_outside:
            problems.append(f"{self.n_outside} of {self.n_points} point(s) lie outside the fitted extent")
        if self.queried is not None and self.fitted is not None:
            ahead = self.quarters_after
            if ahead > 1e-6:
                what = "one quarter" if ahead < 1 + 1e-6 else f"{ahead:.0f} quarters"
                problems.append(f"{Quarter.of_years(self.queried[1])} is {what} after the last fitted quarter "
                                f"{Quarter.of_years(self.fitted[1])}")
            if self.quarters_before > 1e-6:
                problems.append(f"{Quarter.of_years(self.queried[0])} is before the first fitted quarter "
                                f"{Quarter.of_years(self.fitted[0])}")
        return "; ".join(problems) + ": predictions there are extrapolation" if problems else None

    def problem(self, *, max_outside: float = MAX_OUTSIDE_SHARE, forecast: int = FORECAST_QUARTERS) -> str | None:
        """One line naming what is too far out, or None: more than ``max_outside`` of the points
        outside the fitted extent, a quarter more than ``forecast`` quarters after the last fitted
        one, or any quarter before the first."""
        problems = []
        if self.outside_share > max_outside:
            problems.append(f"{100 * self.outside_share:.0f}% of the requested area lies outside its fitted extent")
        if self.quarters_after > forecast + 1e-6:
            problems.append(f"a requested quarter is {self.quarters_after:.0f} quarters after its last fitted one "
                            f"(it forecasts {forecast})")
        if self.quarters_before > 1e-6:
            problems.append(f"a requested quarter is {self.quarters_before:.0f} quarters before its first fitted one")
        if not problems:
            return None
        return f"the {self.kind} model (fitted on {self.fitted_label}) would extrapolate: " + "; ".join(problems)

    @property
    def fitted_label(self) -> str:
        """``"PR 2019Q1-2023Q4"``, ``"2023Q4"`` or ``"time-free inputs"``."""
        if self.fitted is None:
            span = "time-free inputs"
        else:
            first, last = Quarter.of_years(self.fitted[0]), Quarter.of_years(self.fitted[1])
            span = str(last) if first == last else f"{first}-{last}"
        return f"{self.region} {span}" if self.region else span


@lru_cache(maxsize=8)
def fitted_area(wkb_hex: str | None) -> BaseGeometry | None:
    """The fitted region's polygon (EPSG:4326) from its hex WKB, prepared for point tests; None for None."""
    if wkb_hex is None:
        return None
    area = shapely.from_wkb(wkb_hex)
    shapely.prepare(area)
    return area


def beyond_region(outside: np.ndarray, lonlat: np.ndarray, region: BaseGeometry | None) -> np.ndarray:
    """``outside`` ((n,) bool, outside the fitted extent) cleared where ``lonlat`` ((n, 2) degrees)
    lies inside ``region``, the fitted region polygon (unchanged when it is None)."""
    if region is None or not outside.any():
        return outside
    beyond = outside.copy()
    points = lonlat[outside]
    beyond[outside] = ~shapely.contains_xy(region, points[:, 0], points[:, 1])
    return beyond


def quarter_report(fitted: Sequence[Quarter], asked: Sequence[Quarter], *, kind: str = "model",
                   region: str | None = None) -> DomainReport:
    """The :class:`DomainReport` of quarters ``asked`` against a model fitted on the quarters
    ``fitted``, with no points: what a model will refuse before it is fitted (the demo checks its
    map quarters with it before training)."""
    span, queried = [quarter.years for quarter in fitted], [quarter.years for quarter in asked]
    return DomainReport(
        0, 0,
        (min(queried), max(queried)) if queried else None,
        (min(span), max(span)) if span else None,
        kind, region,
    )


__all__ = ["FORECAST_QUARTERS", "MAX_OUTSIDE_SHARE", "DomainReport", "beyond_region", "fitted_area", "quarter_report"]
