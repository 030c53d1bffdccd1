"""How far a query leaves the domain a model was fitted on: :class:`DomainReport`, made by
:meth:`geodbk.fit.geomodel.GeoModel.domain_report`, and the limits past which the CLI refuses
to map without ``--allow-extrapolation``."""

from __future__ import annotations

from dataclasses import dataclass

#: Quarters after the last fitted one that a space-time model may forecast before a map of them
#: counts as extrapolation to refuse (:meth:`DomainReport.problem`); they still warn.
FORECAST_QUARTERS = 1
#: Share of a requested area outside the fitted extent above which the area counts as
#: "mostly outside" (:meth:`DomainReport.problem`).
MAX_OUTSIDE_SHARE = 0.5


@dataclass(frozen=True)
class DomainReport:
    """How far a query (points and quarters) leaves the domain a model was fitted on.

    Attributes:
        kind: the model kind, for messages.
        outside_share: share (0-1) of the query points outside the fitted extent (grown by 5%).
        quarters_after: quarters from the last fitted quarter to the latest queried one (0 if
            none is later; always 0 for a time-free model).
        quarters_before: quarters from the earliest queried one to the first fitted quarter.
        fitted: the fitted quarters as ``"2019Q1-2023Q4"`` (or ``"time-free"``).
    """

    kind: str
    outside_share: float
    quarters_after: float
    quarters_before: float
    fitted: str

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
        return f"the {self.kind} model (fitted on {self.fitted}) would extrapolate: " + "; ".join(problems)


__all__ = ["FORECAST_QUARTERS", "MAX_OUTSIDE_SHARE", "DomainReport"]
