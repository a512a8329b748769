"""Plan search: the exact branch-and-bound, baselines, the OSDP knapsack DP, reports."""

from osdp_sim.planner.bnb import ParetoResult, min_peak, pareto_front, search
from osdp_sim.planner.result import STATUSES, SearchResult
from osdp_sim.planner.space import SearchSpace, group_choices

__all__ = ["SearchSpace", "group_choices", "search", "pareto_front", "min_peak", "SearchResult",
           "STATUSES", "ParetoResult"]
