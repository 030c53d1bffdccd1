"""Decisions from the map's joint posterior: where to test next (:func:`plan_visits`) and the
baselines a plan is compared with."""

from geodbk.decisions.plan import VisitPlan, expected_wrong_after, most_uncertain_first, plan_visits, random_visits

__all__ = ["VisitPlan", "expected_wrong_after", "most_uncertain_first", "plan_visits", "random_visits"]
