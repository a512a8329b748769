"""The baselines a searched plan must beat. Uniform: DDP, ZeRO-2 and ZeRO-3 (FSDP) on every group
and the root, each at its own best batch setting (highest samples/s that fits) and with
checkpointing on or off for all blocks (full or selective), as the search space allows. Per block: the same uniform
strategy with each block checkpointed or not as it pays (what FSDP users run today: torchtitan's
per-layer checkpointing), found exactly by the search restricted to that strategy, unsplit."""

import time
from dataclasses import dataclass, field, replace

from osdp_sim.costmodel import Estimate, estimate
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan import GroupChoice, Plan
from osdp_sim.planner.knapsack import (BlockChoice, KnapsackResult, checkpoint_options, make_plan,
                                      micro_batch_candidates, settings_for)

UNIFORM = ("ddp", "zero2", "zero3")


@dataclass(frozen=True)
class Baseline:
    name: str
    feasible: bool
    samples_per_s: float | None              # None when nothing fits
    peak_memory_bytes: float | None          # the plan's; when infeasible, the least any of its plans needs
    iteration_time_s: float | None
    micro_batch: int | None
    grad_accum: int | None
    checkpoint: bool | None                  # every block checkpointed (uniform plans)
    plan: Plan | None                        # when infeasible: its plan of least peak memory
    estimate: Estimate | None = field(default=None, repr=False)
    note: str | None = None                  # e.g. cut or skipped at the command's time limit

    @property
    def shard_group(self) -> int | None:
        """Devices each parameter is sharded over (the plan's shard group; ddp: all devices)."""
        return None if self.plan is None else self.plan.shard_size

    @property
    def checkpoint_label(self) -> str:
        if self.plan is None:
            return "-"
        n = sum(self.plan.checkpoint)
        label = "all" if n == len(self.plan.checkpoint) else ("off" if n == 0 else f"{n} blocks")
        return label + (" selective" if any(self.plan.selective) else "")

    def to_dict(self) -> dict:
        return {"feasible": self.feasible, "samples_per_s": self.samples_per_s,
                "peak_memory_bytes": self.peak_memory_bytes, "iteration_time_s": self.iteration_time_s,
                "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "checkpoint": self.checkpoint_label if self.feasible else None,
                "shard_group": self.shard_group if self.feasible else None,
                **({"note": self.note} if self.note else {})}


def skipped_baseline(name: str, why: str) -> Baseline:
    return Baseline(name, False, None, None, None, None, None, None, None, note=f"skipped: {why}")


def uniform_candidates(spec: ModelSpec, hw: HardwareProfile, space, strategy: str,
                       mem_limit_bytes: float | None = None, *, deadline: float | None = None,
                       prune: bool = False) -> list[tuple[Plan, Estimate]]:
    """The uniform `strategy` plan at every batch setting and checkpoint option of the space.
    When the space leaves micro-batches open they rise until none of these plans fits
    `mem_limit_bytes` (default: the device's usable memory). prune: stop once no larger
    micro-batch can beat the fastest fitting plan so far (mbbound.py); deadline
    (time.perf_counter()): stop then (see cut_short)."""
    limit = mem_limit_bytes if mem_limit_bytes is not None else hw.device.usable_memory_bytes
    mbs, auto = micro_batch_candidates(space, hw)
    beyond = suffix_bound(spec, hw, space, limit, mbs) if prune else None
    out = []
    best = 0.0
    for mb in mbs:
        if deadline is not None and time.perf_counter() > deadline:
            break
        if beyond is not None and best > 0 and beyond(mb) <= best:
            break
        here = []
        settings = settings_for(space, hw, mb)
        if strategy == "ddp":          # a shard group changes nothing for ddp
            settings = list(dict.fromkeys(replace(s, shard_group=s.devices) for s in settings))
        for s in settings:
            for ck in dict.fromkeys(space.checkpoint):     # False, True (full), "selective"
                plan = make_plan(spec, s, strategy,
                                 BlockChoice(GroupChoice(strategy), GroupChoice(strategy), bool(ck)))
                if ck == "selective":
                    plan = replace(plan, selective=plan.checkpoint)
                here.append((plan, estimate(spec, hw, plan)))
        out += here
        best = max([best] + [e.samples_per_s for _, e in here if e.peak_memory_bytes <= limit])
        if auto and here and min(e.peak_memory_bytes for _, e in here) > limit:
            break
    return out


def suffix_bound(spec: ModelSpec, hw: HardwareProfile, space, limit_bytes: float, mbs):
    """mb -> an upper bound on the samples/s of any plan of the space at a micro-batch >= mb
    (among mbs) within limit_bytes (mbbound.py)."""
    import numpy as np

    from osdp_sim.planner.bnb import _limit_q
    from osdp_sim.planner.mbbound import floors, micro_batch_bounds
    if not mbs:
        return lambda mb: 0.0
    b = micro_batch_bounds(spec, hw, space, mbs, _limit_q(limit_bytes, hw), floors(spec, hw, space))
    top = b.suffix_max()
    keys = b.micro_batches

    def beyond(mb: int) -> float:
        i = int(np.searchsorted(keys, mb))
        return float(top[i]) if i < len(top) else 0.0
    return beyond


def best_fitting(name: str, candidates: list[tuple[Plan, Estimate]], mem_limit_bytes: float) -> Baseline:
    fitting = [(p, e) for p, e in candidates if e.peak_memory_bytes <= mem_limit_bytes]
    if fitting:
        p, e = max(fitting, key=lambda pe: pe[1].samples_per_s)
        return Baseline(name, True, e.samples_per_s, e.peak_memory_bytes, e.iteration_time_s,
                        p.micro_batch, p.grad_accum, all(p.checkpoint), p, e)
    if not candidates:
        return Baseline(name, False, None, None, None, None, None, None, None)
    p, e = min(candidates, key=lambda pe: pe[1].peak_memory_bytes)
    return Baseline(name, False, None, e.peak_memory_bytes, None, None, None, None, p, e)


def uniform_baselines(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space,
                      strategies=UNIFORM, *, deadline: float | None = None,
                      shares_after: int = 0) -> dict[str, Baseline]:
    """ddp, zero2, zero3 -> Baseline: each at its own best batch setting within the limit (the
    micro-batches no larger one of which can beat it, by mbbound.py's bound). deadline
    (time.perf_counter()): each baseline gets an equal share of the time left (shares_after: as
    many more shares are kept for what the caller runs next); one not finished in its share says
    so in its note."""
    out = {}
    for i, s in enumerate(strategies):
        until = None
        if deadline is not None:
            now = time.perf_counter()
            until = now + max(0.0, deadline - now) / (len(strategies) - i + shares_after)
        b = best_fitting(s, uniform_candidates(spec, hw, space, s, mem_limit_bytes, deadline=until, prune=True),
                         mem_limit_bytes)
        if until is not None and time.perf_counter() > until:
            b = replace(b, note="cut short at the time limit (best of the micro-batches tried)")
        out[s] = b
    return out


PER_BLOCK = {s: f"{s}_per_block" for s in UNIFORM}
"""Baseline name of each uniform strategy with per-block checkpointing."""


def per_block_baselines(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space,
                        strategies=UNIFORM, *, deadline: float | None = None,
                        shares_after: int = 0) -> dict[str, Baseline]:
    """'<strategy>_per_block' -> Baseline: the uniform strategy (root included, no splitting) with
    every block checkpointed or not as it pays, at the best batch setting: the exact search over
    that space. Not run (so noted) when the space fixes checkpointing: it is then the uniform
    baseline. deadline as uniform_baselines; a search stopped by it gives its best plan so far."""
    from osdp_sim.planner.bnb import search
    out = {}
    if len(set(space.checkpoint)) < 2:
        return {PER_BLOCK[s]: skipped_baseline(PER_BLOCK[s], "the space fixes checkpointing")
                for s in strategies}
    for i, s in enumerate(strategies):
        name = PER_BLOCK[s]
        left = None
        if deadline is not None:
            left = max(0.0, deadline - time.perf_counter()) / (len(strategies) - i + shares_after)
            if left <= 0.0:
                out[name] = skipped_baseline(name, "time limit")
                continue
        sub = replace(space, strategies=(s,), splits=(1,), root_strategies=(s,))
        res = search(spec, hw, mem_limit_bytes, sub, time_limit_s=left)
        note = None if res.status == "optimal" else "cut short at the time limit (best plan found)"
        if res.plan is None:
            out[name] = Baseline(name, False, None, res.min_peak_memory_bytes, None, None, None, None,
                                 None, note=note if res.status == "time_limit" else None)
            continue
        p, e = res.plan, res.prediction
        out[name] = Baseline(name, True, e.samples_per_s, e.peak_memory_bytes, e.iteration_time_s,
                             p.micro_batch, p.grad_accum, all(p.checkpoint), p, e, note=note)
    return out


def knapsack_baseline(res: KnapsackResult) -> Baseline:
    """The OSDP knapsack DP's plan in the same shape as the uniform baselines."""
    note = "cut short at the time limit (best of the batch settings tried)" if res.cut_short else None
    if not res.feasible:
        return Baseline("osdp_knapsack", False, None, None, None, None, None, None, None, note=note)
    p, e = res.plan, res.estimate
    return Baseline("osdp_knapsack", True, e.samples_per_s, e.peak_memory_bytes, e.iteration_time_s,
                    p.micro_batch, p.grad_accum, all(p.checkpoint), p, e, note=note)


def all_baselines(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space, *,
                  deadline: float | None = None) -> dict[str, Baseline]:
    """What a searched plan is compared with: the uniform baselines, the uniform strategies with
    per-block checkpointing, then the OSDP knapsack DP, all within the deadline
    (time.perf_counter()); the DP is skipped, so noted, when none is left."""
    from osdp_sim.planner.knapsack import osdp_knapsack
    out = uniform_baselines(spec, hw, mem_limit_bytes, space, deadline=deadline, shares_after=4)
    out.update(per_block_baselines(spec, hw, mem_limit_bytes, space, deadline=deadline, shares_after=1))
    if deadline is None or time.perf_counter() < deadline:
        out["osdp_knapsack"] = knapsack_baseline(osdp_knapsack(spec, hw, mem_limit_bytes, space, deadline=deadline))
    else:
        out["osdp_knapsack"] = skipped_baseline("osdp_knapsack", "time limit")
    return out
