"""Comparison records: several plans timed side by side in one process group (`osdp-sim compare`,
runtime/compare.py), and their speed ratios measured on paired steps.

A comparison is not a validation record: no memory is measured (every plan is resident at once)
and the figure of interest is a ratio between plans, not one plan's time. The schema is documented
field by field in validate/README.md, "Comparing plans side by side".

The estimator (docs/accuracy.md, "Decisions", the paired round): in round r every plan takes one
step; plan i's speed in that round is s_i,r = global_batch_i / t_i,r (t: the slowest rank's step
time). The ratio of plan i to plan j is exp(mean_r log(s_i,r / s_j,r)), the geometric mean of the
per-round ratios, and its standard error (as a fraction) is stdev_r(log(s_i,r / s_j,r)) / sqrt(n):
what slows the machine for a few seconds touches both steps of a round and cancels in the ratio.
The best plan is the one with the largest mean log speed over the rounds every plan finished.
"""

import math
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_json
from osdp_sim.plan import Plan, plan_from_dict, plan_to_dict, write_json_atomic

FORMAT = "osdp-sim/comparison"
VERSION = 1
STATUSES = ("ok", "oom", "failed", "timeout")
_TOP_KEYS = ("format", "version", "status", "run_id", "created", "hardware_profile", "env", "settings",
             "rounds_completed", "best", "plans", "failure")
_PLAN_KEYS = ("label", "impl", "plan", "predicted_samples_per_s", "step_times_s", "samples_per_s",
              "ratio_to_best", "ratio_se")


@dataclass(frozen=True)
class PairedRatio:
    """Plan a's speed over plan b's, from the rounds both finished."""

    ratio: float
    """exp(mean over rounds of log(speed_a / speed_b)): > 1 when a is faster."""
    se: float
    """Standard error of that log mean (about the ratio's relative error); 0 with one round."""
    rounds: int


def round_times(per_rank_times_s: list[list[float]]) -> list[float]:
    """A plan's step time per round: the slowest rank's (the step is done when every rank is),
    over the rounds every rank finished."""
    n = min((len(t) for t in per_rank_times_s), default=0)
    return [max(t[i] for t in per_rank_times_s) for i in range(n)]


def paired_ratio(times_a_s: list[float], batch_a: int, times_b_s: list[float], batch_b: int) -> PairedRatio | None:
    """Speed ratio of a to b over their common rounds (None without one)."""
    n = min(len(times_a_s), len(times_b_s))
    if n == 0:
        return None
    logs = [math.log((batch_a / ta) / (batch_b / tb)) for ta, tb in zip(times_a_s[:n], times_b_s[:n])]
    se = statistics.stdev(logs) / math.sqrt(n) if n > 1 else 0.0
    return PairedRatio(math.exp(statistics.fmean(logs)), se, n)


def best_index(times_s: list[list[float]], batches: list[int]) -> int | None:
    """The plan with the largest mean log speed over the rounds every plan finished."""
    n = min((len(t) for t in times_s), default=0)
    if n == 0:
        return None
    score = [statistics.fmean(math.log(b / t) for t in ts[:n]) for ts, b in zip(times_s, batches)]
    return max(range(len(score)), key=score.__getitem__)


# ---------------------------------------------------------------- building

def build_comparison(*, status: str, run_id: str, plans: list[Plan], labels: list[str], impls: list[str],
                     hardware_profile: dict, env: dict, settings: dict, rank_results: list[dict | None],
                     predicted_samples_per_s: list[float | None], failure: dict | None = None,
                     created: str | None = None) -> dict:
    """Assemble a comparison from the per-rank results of runtime/compare.py (None for a rank that
    wrote nothing). The rounds every rank finished count, also when the run failed or timed out."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} not in {STATUSES}")
    results = [r or {} for r in rank_results]
    times = []
    for i in range(len(plans)):
        per_rank = [list(r["step_times_s"][i]) if r.get("step_times_s") else [] for r in results]
        times.append(round_times(per_rank))
    n = min((len(t) for t in times), default=0)
    times = [t[:n] for t in times]
    batches = [p.global_batch for p in plans]
    best = best_index(times, batches)
    rows = []
    for i, plan in enumerate(plans):
        pr = paired_ratio(times[i], batches[i], times[best], batches[best]) if best is not None else None
        rows.append({"label": labels[i], "impl": impls[i], "plan": plan_to_dict(plan),
                     "predicted_samples_per_s": predicted_samples_per_s[i], "step_times_s": times[i],
                     "samples_per_s": batches[i] / statistics.fmean(times[i]) if times[i] else None,
                     "ratio_to_best": pr.ratio if pr else None, "ratio_se": pr.se if pr else None})
    return {"format": FORMAT, "version": VERSION, "status": status, "run_id": run_id,
            "created": created or datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "hardware_profile": dict(hardware_profile), "env": dict(env), "settings": dict(settings),
            "rounds_completed": n, "best": best, "plans": rows, "failure": failure}


def save_comparison(data: dict, path) -> Path:
    """Check, then write atomically (temp file + fsync + rename)."""
    comparison_from_dict(data, source="<new comparison>")
    write_json_atomic(path, data)
    return Path(path)


# ---------------------------------------------------------------- loading

@dataclass(frozen=True)
class ComparedPlan:
    label: str
    plan: Plan
    impl: str
    predicted_samples_per_s: float | None
    step_times_s: tuple[float, ...]
    """Per round, the slowest rank's step time."""
    samples_per_s: float | None
    """global batch / mean step time."""


@dataclass(frozen=True)
class Comparison:
    """A loaded comparison record; `data` is the whole JSON object."""

    data: dict
    plans: tuple[ComparedPlan, ...]
    source: str = ""

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def rounds(self) -> int:
        return self.data["rounds_completed"]

    @property
    def best(self) -> int | None:
        return self.data["best"]

    def ratio(self, a: int, b: int) -> PairedRatio | None:
        """Plan a's speed over plan b's (indices into plans)."""
        return self.pooled_ratio([a], [b])

    def log_speeds(self, entries: list[int]) -> list[float]:
        """Per round, the mean over `entries` (copies of one plan, pooled) of log(samples/s)."""
        return [statistics.fmean(math.log(self.plans[i].plan.global_batch / self.plans[i].step_times_s[r])
                                 for i in entries) for r in range(self.rounds)]

    def pooled_ratio(self, a: list[int], b: list[int]) -> PairedRatio | None:
        """As ratio, with each side's entries pooled (their per-round log speeds averaged)."""
        if self.rounds == 0:
            return None
        logs = [x - y for x, y in zip(self.log_speeds(a), self.log_speeds(b))]
        se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
        return PairedRatio(math.exp(statistics.fmean(logs)), se, len(logs))


def load_comparison(path) -> Comparison:
    return comparison_from_dict(read_json(path, "comparison record", "; a partly written record?"),
                                source=str(path))


def comparison_from_dict(data, *, source: str = "<comparison>") -> Comparison:
    def fail(field, msg):
        raise UserError(msg, source=source, field=field)

    if not isinstance(data, dict):
        fail(None, "expected a JSON object (an osdp-sim comparison record)")
    if data.get("format") != FORMAT:
        fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != VERSION:
        fail("version", f"expected {VERSION} (this osdp-sim reads comparison version {VERSION}), "
                        f"got {data.get('version')!r}")
    for k in _TOP_KEYS:
        if k not in data:
            fail(k, "missing")
    if data["status"] not in STATUSES:
        fail("status", f"expected one of {', '.join(STATUSES)}, got {data['status']!r}")
    n = data["rounds_completed"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        fail("rounds_completed", f"expected a whole number >= 0, got {n!r}")
    if not isinstance(data["plans"], list) or len(data["plans"]) < 2:
        fail("plans", "expected a list of at least 2 plans")
    best = data["best"]
    if best is not None and (not isinstance(best, int) or isinstance(best, bool) or not 0 <= best < len(data["plans"])):
        fail("best", f"expected null or an index into plans, got {best!r}")
    plans = []
    for i, row in enumerate(data["plans"]):
        where = f"plans[{i}]"
        if not isinstance(row, dict):
            fail(where, "expected an object")
        for k in _PLAN_KEYS:
            if k not in row:
                fail(f"{where}.{k}", "missing")
        if not isinstance(row["label"], str):
            fail(f"{where}.label", "expected text")
        if row["impl"] not in ("osdp", "hf"):
            fail(f"{where}.impl", f"expected osdp or hf, got {row['impl']!r}")
        plan = plan_from_dict(row["plan"], source=f"{source} ({where}.plan)")
        ts = row["step_times_s"]
        if not isinstance(ts, list) or len(ts) != n or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in ts):
            fail(f"{where}.step_times_s", f"expected {n} positive numbers of seconds (rounds_completed)")
        for k in ("predicted_samples_per_s", "samples_per_s", "ratio_to_best", "ratio_se"):
            v = row[k]
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0):
                fail(f"{where}.{k}", f"expected null or a number >= 0, got {v!r}")
        plans.append(ComparedPlan(row["label"], plan, row["impl"], row["predicted_samples_per_s"],
                                  tuple(float(t) for t in ts), row["samples_per_s"]))
    return Comparison(data, tuple(plans), source)
