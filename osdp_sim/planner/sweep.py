"""The Pareto front by the epsilon-constraint method: exact search() calls at descending memory
limits, each just below the peak of the previous optimum. Every call's optimum is a front point
(the fastest plan using at most that much memory). Slower than one pareto_front() pass on small
models, but it finishes on deep ones, where the one pass does not (docs/search-usage.md)."""

import math
import time

from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec
from osdp_sim.planner.bnb import DEFAULT_PARETO_TIME_LIMIT_S, ParetoResult, earlier_deadline, search
from osdp_sim.planner.space import SearchSpace
from osdp_sim.units import format_bytes


def non_dominated(points: list) -> list:
    """Points (peak_bytes, samples_per_s, ...) that no other point beats on both axes, sorted by
    peak memory; along the result throughput strictly increases."""
    out = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not out or p[1] > out[-1][1]:
            out.append(p)
    return out


def sweep_front(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, hi_bytes: float, *,
                limits: tuple = (), resolution_bytes: float = 0.0, time_limit_s: float | None = None,
                progress=None, deadline: float | None = None,
                total_time_limit_s: float | None = DEFAULT_PARETO_TIME_LIMIT_S) -> tuple[ParetoResult, bool]:
    """search() at hi_bytes, then just below the peak of the plan it returned (and at least
    resolution_bytes lower), until nothing fits; then once at the least peak if the last step
    jumped past it. With resolution 0 every front point is visited; with R > 0 points closer
    together than R may be skipped (each point shown is still exact). Each of `limits` is searched
    too, so the plan marked for it is exact. The calls share their tables (search(cache=...)).
    deadline (time.perf_counter()): the whole sweep's; each call gets at most what is left, and
    the sweep stops there.
    total_time_limit_s (default DEFAULT_PARETO_TIME_LIMIT_S, None: none) bounds the whole sweep
    from the call as well. progress: called with one line per search() call, what it found within
    its limit and whether the call proved it.
    Returns (result, proven): proven is False when some call stopped at time_limit_s or the deadline."""
    deadline = earlier_deadline(deadline, total_time_limit_s)
    t0 = time.perf_counter()
    pts, evaluated = [], []
    nodes, proven, least = 0, True, None
    cache: dict = {}

    def one(limit: float, label: str):
        nonlocal nodes, proven, least
        t = time_limit_s
        if deadline is not None:
            left = max(0.0, deadline - time.perf_counter())
            t = left if t is None else min(t, left)
        r = search(spec, hw, limit, space, time_limit_s=t, cache=cache)
        evaluated.extend((e.peak_memory_bytes, e.samples_per_s) for e in r.evaluated)
        nodes += r.nodes
        _report(progress, label, limit, r)
        if r.plan is None:
            proven &= r.status == "infeasible"
            if r.status == "infeasible" and r.min_peak_proven and math.isfinite(r.min_peak_memory_bytes):
                least = r.min_peak_memory_bytes
            return None
        proven &= r.status == "optimal"
        pts.append((r.prediction.peak_memory_bytes, r.prediction.samples_per_s, r.plan))
        return r.prediction.peak_memory_bytes

    for lim in limits:
        one(lim, "sweep (a marked limit)")
    limit, calls = hi_bytes, 0
    while True:
        if deadline is not None and time.perf_counter() > deadline:
            proven = False
            break
        calls += 1
        peak = one(limit, f"sweep {calls}")
        if peak is None:
            if least is not None and least < limit + resolution_bytes and \
                    not any(abs(p[0] - least) < 1.0 for p in pts):
                one(least, "sweep (the least peak)")
            break
        limit = min(peak - 1.0, limit - resolution_bytes)
    return ParetoResult(non_dominated(pts), evaluated, time.perf_counter() - t0, nodes), proven


def _report(progress, label: str, limit: float, r) -> None:
    """One progress line per search() call: what it found within the limit and whether it is proven."""
    if progress is None:
        return
    how = {"optimal": "proven", "infeasible": "proven",
           "within_gap": f"proven within {100 * r.gap:.2f}%"}.get(r.status, "not proven: the time limit")
    if r.plan is None:
        progress(f"{label}: within {format_bytes(limit)}: no plan fits ({how})")
        return
    gap = f", gap {100 * r.gap:.2f}%" if r.status == "time_limit" else ""
    progress(f"{label}: within {format_bytes(limit)}: {r.prediction.samples_per_s:.2f} samples/s "
             f"at {format_bytes(r.prediction.peak_memory_bytes)} ({how}{gap})")
