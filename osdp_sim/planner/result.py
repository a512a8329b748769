"""What search() returns: one result object, as scipy.optimize's OptimizeResult, with named fields.

planner.bnb.search fills everything but the baselines; osdp_sim.search (api.py) returns the same
object with the baselines filled. docs/search.md ("The result") lists the fields.
"""

from dataclasses import dataclass, field

from osdp_sim.costmodel import Estimate
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan.plan import Plan

# Every value SearchResult.status takes (tests/test_search_result.py checks the code returns no other).
STATUSES = {
    "optimal": "proven: no plan of the space that fits is faster (gap 0)",
    "within_gap": "proven within the gap tolerance (rel_gap): no plan is faster by more than `gap`",
    "time_limit": "stopped by the time limit: the plan is the best found (or none), "
                  "best_bound_samples_per_s still holds; open_configs says what was left",
    "infeasible": "no plan of the space fits the limit; min_peak_memory_bytes is the least peak",
}


@dataclass(frozen=True, slots=True)
class TopPlan:
    """One of the k best plans found, best first."""

    plan: Plan
    """The plan."""
    prediction: Estimate
    """estimate() of the plan."""


@dataclass(frozen=True, slots=True)
class MicroBatchOutcome:
    """What the search found at one micro-batch it listed."""

    micro_batch: int
    """The micro-batch."""
    best_samples_per_s: float | None
    """The fastest fitting plan found at it; None when none was found."""
    pruned: bool
    """True: ruled out by its bound (or the gap tolerance) without an exact search."""


@dataclass(frozen=True, slots=True)
class EvaluatedPlan:
    """A complete plan evaluated exactly during the search (fitting or not)."""

    peak_memory_bytes: float
    """Its estimate() peak memory per device."""
    samples_per_s: float
    """Its throughput."""


@dataclass(frozen=True, slots=True)
class OpenConfig:
    """A configuration the search stopped before it was proven or ruled out."""

    micro_batch: int
    """Its micro-batch."""
    shard_group: int
    """Its shard group size (devices)."""
    root: str
    """The strategy of its root group (embedding + head)."""
    bound_samples_per_s: float
    """No plan of it is faster than this."""
    reason: str
    """Why it is open: "not finished within the time limit" or "key graph over the caps"."""

    def to_dict(self) -> dict:
        return {"micro_batch": self.micro_batch, "shard_group": self.shard_group, "root": self.root,
                "bound_samples_per_s": self.bound_samples_per_s, "reason": self.reason}


@dataclass(frozen=True)
class SearchResult:
    """The result of a search: the plan, its prediction, the certificate (status, bound, gap),
    what was searched, and the uniform baselines when osdp_sim.search computed them."""

    status: str
    """One of STATUSES."""
    plan: Plan | None = field(repr=False)
    """The fastest plan that fits; None when infeasible or the time ran out before one was found."""
    prediction: Estimate | None = field(repr=False)
    """estimate() of the plan; None without a plan."""
    top: tuple[TopPlan, ...] = field(repr=False)
    """The top_k best distinct plans found, best first (top[0] is the plan)."""
    best_bound_samples_per_s: float
    """No plan of the space that fits is faster than this (0 when infeasible)."""
    gap: float
    """(best_bound_samples_per_s - the plan's) / the plan's; 0 when optimal, inf without a plan."""
    nodes: int
    """Partial plans created."""
    leaves: int
    """Complete plans evaluated exactly."""
    seconds: float
    """Wall time of the search (the baselines excluded)."""
    message: str
    """One line on the outcome: what was found, and what is open or why nothing fits."""
    min_peak_memory_bytes: float
    """When infeasible: the least peak memory over the space (see min_peak_proven); nan otherwise."""
    min_peak_plan: Plan | None = field(repr=False)
    """When infeasible: a plan that attains min_peak_memory_bytes (the leanest found)."""
    min_peak_proven: bool
    """False: min_peak_memory_bytes is a proven lower bound only (the time ran out first)."""
    per_micro_batch: tuple[MicroBatchOutcome, ...] = field(repr=False)
    """Each micro-batch listed, ascending."""
    evaluated: tuple[EvaluatedPlan, ...] = field(repr=False)
    """The complete plans evaluated (up to bnb.EVALUATED_CAP), in the order evaluated."""
    configs: int
    """Configurations (micro-batch, accumulation, shard group, root, checkpoint policy) listed."""
    configs_searched: int
    """Of those, searched exactly (the rest were ruled out by bounds, or searched as the twin of one
    that costs the same: docs/search.md, "Configurations")."""
    open_configs: tuple[OpenConfig, ...]
    """When stopped by the time limit: the configurations that may still hold a faster plan."""
    model: ModelSpec = field(repr=False)
    """The model searched."""
    hardware: HardwareProfile = field(repr=False)
    """The hardware profile searched."""
    mem_limit_bytes: float
    """The per-device limit searched (headroom already taken off)."""
    headroom_bytes: float = 0.0
    """The headroom kept free below the limit asked for (osdp_sim.search's headroom=)."""
    baselines: dict = field(default_factory=dict, repr=False)
    """name -> planner.baselines.Baseline (ddp, zero2, zero3, osdp_knapsack); empty when not computed."""

    @property
    def success(self) -> bool:
        """A plan was found (status optimal or within_gap, or time_limit with a plan)."""
        return self.plan is not None

    @property
    def proven(self) -> bool:
        """The answer is certified: optimal, within the gap tolerance, or infeasible."""
        return self.status != "time_limit"

    def to_json(self, explanation: str | None = None) -> dict:
        """The object `osdp-sim search --json` prints (format osdp-sim/search, docs/json.md);
        explanation: its "why" when already computed (report.explain)."""
        from osdp_sim.planner.report import explain, no_plan_to_json, result_to_json
        if self.plan is None:
            least = None if self.status == "time_limit" else self.min_peak_memory_bytes
            return no_plan_to_json(self.model, self.hardware, self.mem_limit_bytes, self, self.message,
                                   min_peak_memory_bytes=least, headroom_bytes=self.headroom_bytes)
        why = explanation or explain(self.model, self.hardware, self.plan, self.prediction, self.baselines)
        return result_to_json(self.model, self.hardware, self.mem_limit_bytes, self, self.baselines,
                              explanation=why, headroom_bytes=self.headroom_bytes)

