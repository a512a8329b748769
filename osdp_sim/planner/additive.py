"""The additive surrogate objective (search_additive), for cross-checks with an independent
integer program (tests/test_search_milp.py); not part of the public search().

  time   T_add = grad_accum * (all compute work + all communication work) + optimizer time.
         This is exactly estimate()'s iteration time when the overlap slowdown is 2: both streams
         then progress at half speed while overlapped, so the pair does one unit of work per
         unit of time, and the schedule never leaves both streams idle (tested).
  memory M_add = resident states + everything kept from forward to backward + the head's
         backward allocations (the live bytes just after the backward starts): a lower bound of
         the real peak, used with the same fragmentation and context terms against the limit.

Both are sums over groups, so the problem is a multiple-choice knapsack; it is solved exactly by
the same outer loop and a Pareto label DP over blocks (labels (memory, time), dominance, memory
bound on the undecided blocks).
"""

import math
import time
from dataclasses import dataclass

import numpy as np

from osdp_sim.costmodel import Estimate, estimate
from osdp_sim.costmodel.fast import MEM_Q, total_peak_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan.plan import Plan
from osdp_sim.planner.problem import Option, Problem
from osdp_sim.planner.result import MicroBatchOutcome
from osdp_sim.planner.space import SearchSpace


def option_terms(o: Option, ck: bool, m: int) -> tuple[float, float]:
    """(time s, bytes) of one group choice; checkpointed: recompute, and activations not kept."""
    t = m * (o.cf + o.af + o.cb + o.ab + (o.rc if ck else 0.0)) + o.opt
    mem = o.res + o.kept_gath + (0.0 if ck else o.kept_act)
    return t, mem


def root_terms(pb: Problem) -> tuple[float, float]:
    h, e = pb.root.head, pb.root.embed
    m = pb.m
    t = m * (h.fwd_s + h.bwd_s + (e.forward_gather_s or 0.0) + e.fwd_s + e.bwd_s + sum(w for (w, *_r) in e.reduction_items)) + h.optimizer_s
    mem = h.resident_bytes + h.act_bytes + e.act_bytes + e.gathered_bytes + h.act_grad_bytes + h.bwd_temp_bytes
    return t, mem


def block_points(pb: Problem, b) -> list[tuple[float, float, int, int, bool]]:
    """(time, bytes, attn choice, mlp choice, checkpointed) of every choice of one block."""
    a_opts, m_opts = pb.shapes[b.attn_shape], pb.shapes[b.mlp_shape]
    pts = []
    for ck in pb.ckpt_options:
        for ia, oa in enumerate(a_opts):
            ta, ma = option_terms(oa, ck, pb.m)
            for im, om in enumerate(m_opts):
                tm, mm = option_terms(om, ck, pb.m)
                pts.append((ta + tm, ma + mm + (b.ck if ck else 0.0), ia, im, ck))
    return pts


def _pareto(pts):
    """Points not dominated in (bytes, time); ties: the first in order."""
    out, best_t = [], math.inf
    for p in sorted(pts, key=lambda p: (p[1], p[0])):
        if p[0] < best_t:
            out.append(p)
            best_t = p[0]
    return out


def solve_config(pb: Problem, budget_bytes: float):
    """Least T_add with M_add <= budget: (time, bytes, [(attn, mlp, ckpt) per block]) or None."""
    t0, m0 = root_terms(pb)
    fronts = [_pareto(block_points(pb, b)) for b in pb.blocks]
    min_rest = np.r_[np.cumsum([min(p[1] for p in f) for f in fronts][::-1])[::-1], 0.0]
    labels = [(t0, m0, ())]
    for i, front in enumerate(fronts):
        cand = []
        for t, mem, hist in labels:
            for p in front:
                if mem + p[1] + min_rest[i + 1] <= budget_bytes:
                    cand.append((t + p[0], mem + p[1], hist + ((p[2], p[3], p[4]),)))
        labels = [(c[0], c[1], c[2]) for c in _pareto([(c[0], c[1], c[2]) for c in cand])]
        if not labels:
            return None
    return min(labels, key=lambda l: (l[0], l[1]))


@dataclass(frozen=True)
class AdditiveResult:
    """The additive surrogate's optimum over a space."""

    status: str
    """"optimal" or "infeasible" (nothing fits under the additive memory model)."""
    plan: Plan | None
    """The surrogate's optimum; None when infeasible."""
    prediction: Estimate | None
    """estimate() of the plan (the real cost model, not the surrogate)."""
    per_micro_batch: tuple[MicroBatchOutcome, ...]
    """The surrogate's best samples/s at each micro-batch (pruned is always False)."""
    surrogate_time_s: float | None
    """T_add of the plan (iteration seconds)."""
    surrogate_memory_q: float | None
    """M_add of the plan, in fast.MEM_Q units."""
    seconds: float
    """Wall time."""
    message: str
    """One line on the outcome."""


def search_additive(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space: SearchSpace) -> AdditiveResult:
    """The plan of highest samples/s under the additive surrogate whose M_add fits the limit."""
    from osdp_sim.planner.bnb import _configs, _limit_q
    start = time.perf_counter()
    pq = _limit_q(mem_limit_bytes, hw)
    total_budget = pq * MEM_Q
    best = None
    cache: dict = {}
    cfgs = _configs(spec, hw, space, 2 ** 62 if space.micro_batches is not None else pq, cache)
    per_mb: dict = {}
    for c in cfgs:
        r = solve_config(c.problem, total_budget)
        sps = None if r is None else c.problem.samples / r[0]
        mb = c.config.micro_batch
        per_mb[mb] = sps if per_mb.get(mb) is None else (max(per_mb[mb], sps) if sps else per_mb[mb])
        if r is not None and (best is None or sps > best[0]):
            best = (sps, c, r)
    seconds = time.perf_counter() - start
    pmb = tuple(MicroBatchOutcome(mb, v, False) for mb, v in sorted(per_mb.items()))
    if best is None:
        return AdditiveResult("infeasible", None, None, pmb, None, None, seconds,
                              "no plan fits under the additive memory model")
    sps, c, (t, mem, hist) = best
    plan = c.problem.plan([h[0] for h in hist], [h[1] for h in hist], [h[2] for h in hist])
    e = estimate(spec, hw, plan)
    return AdditiveResult("optimal", plan, e, pmb, t, mem, seconds,
                          f"additive surrogate optimum: {sps:.4g} samples/s (T_add {t:.6g} s, M_add "
                          f"{total_peak_bytes(mem / MEM_Q, hw) / 2**30:.3f} GiB)")
