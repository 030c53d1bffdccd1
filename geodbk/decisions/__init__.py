"""Decisions from the map's joint posterior: where to test next (:func:`plan_visits`), the baselines a
plan is compared with, and each site's expected chance of a wrong decision after observations not yet
made (:func:`expected_wrong_after`)."""

from geodbk.decisions.plan import VisitPlan, most_uncertain_first, plan_visits, random_visits
from geodbk.decisions.preposterior import expected_wrong_after

__all__ = ["VisitPlan", "expected_wrong_after", "most_uncertain_first", "plan_visits", "random_visits"]
