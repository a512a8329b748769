"""estimate(model, hardware, plan): predicted peak memory per device and iteration time."""

from dataclasses import dataclass, field

from osdp_sim.costmodel.lowering import Lowered, lower
from osdp_sim.costmodel.memory import MemoryPeak, peak_memory
from osdp_sim.costmodel.schedule import build_step
from osdp_sim.costmodel.simulate import Task, exposed_comm_s, simulate
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan.plan import Plan

COLLECTIVE_KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class Estimate:
    peak_memory_bytes: float          # live-tensor peak + fragmentation margin + context
    memory_breakdown: dict            # at the moment of the peak
    iteration_time_s: float           # one optimizer step: grad_accum micro-batches + update
    time_breakdown: dict
    samples_per_s: float
    tokens_per_s: float
    model_flops_per_s_per_device: float
    mfu: float
    model_states_bytes: dict          # params, grads, optimizer resident on one device
    peak_during: str                  # the task running at the memory peak
    timeline: list = field(default_factory=list, repr=False)   # tasks of the last micro-step

    def fits(self, limit_bytes: float) -> bool:
        return self.peak_memory_bytes <= limit_bytes

    def to_dict(self, timeline: bool = False) -> dict:
        d = {
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_breakdown": self.memory_breakdown,
            "iteration_time_s": self.iteration_time_s,
            "time_breakdown": self.time_breakdown,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_s_per_device": self.model_flops_per_s_per_device,
            "mfu": self.mfu,
            "model_states_bytes": self.model_states_bytes,
            "peak_during": self.peak_during,
        }
        if timeline:
            d["timeline"] = [{"name": t.name, "stream": t.stream, "kind": t.kind,
                              "start_s": t.start_s, "end_s": t.end_s} for t in self.timeline]
        return d


def _time_breakdown(tasks: list[Task]) -> dict:
    out = {"forward_s": 0.0, "backward_s": 0.0, "recompute_s": 0.0, "optimizer_s": 0.0,
           "copy_s": 0.0, "copy_exposed_s": 0.0}
    for kind in COLLECTIVE_KINDS:
        out[f"{kind}_s"] = 0.0
        out[f"{kind}_exposed_s"] = 0.0
    names = {"fwd": "forward_s", "bwd": "backward_s", "recompute": "recompute_s", "optimizer": "optimizer_s"}
    exposed = exposed_comm_s(tasks)
    for i, t in enumerate(tasks):
        if t.stream == "compute":
            out[names[t.kind]] += t.work_s
        else:
            out[f"{t.kind}_s"] += t.work_s
            out[f"{t.kind}_exposed_s"] += exposed[i]
    out["communication_s"] = sum(out[f"{k}_s"] for k in COLLECTIVE_KINDS)
    out["exposed_communication_s"] = sum(out[f"{k}_exposed_s"] for k in COLLECTIVE_KINDS)
    return out


def _simulate(low: Lowered, hw: HardwareProfile, **kw) -> tuple[float, list[Task], MemoryPeak]:
    sched = build_step(low, **kw)
    makespan = simulate(sched.tasks, hw.overlap_slowdown)
    return makespan, sched.tasks, peak_memory(sched.tasks, sched.events)


def estimate(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> Estimate:
    low = lower(spec, hw, plan)
    m = plan.grad_accum
    accumulate_unsharded = m > 1 and not plan.reduce_every_microbatch
    # The last micro-step holds the most state: earlier micro-steps' gradients and the update.
    t_last, tasks, peak = _simulate(low, hw, reduce=True, grads_resident=m > 1 and plan.reduce_every_microbatch,
                                    unsharded_grads_resident=accumulate_unsharded, optimizer=True)
    breakdown = _time_breakdown(tasks)
    iteration_s = t_last
    if m > 1:
        t_mid, mid_tasks, mid_peak = _simulate(
            low, hw, reduce=plan.reduce_every_microbatch, grads_resident=False,
            unsharded_grads_resident=False, optimizer=False)
        iteration_s += (m - 1) * t_mid
        mid = _time_breakdown(mid_tasks)
        for k in breakdown:
            breakdown[k] += (m - 1) * mid[k]
        if mid_peak.peak_bytes > peak.peak_bytes:
            peak = mid_peak
    breakdown["iteration_s"] = iteration_s
    breakdown["compute_s"] = sum(breakdown[k] for k in ("forward_s", "backward_s", "recompute_s", "optimizer_s"))

    frag = peak.peak_bytes * hw.memory.fragmentation
    mem = {k: v for k, v in peak.breakdown.items()}
    mem["fragmentation"] = frag
    mem["context"] = float(hw.memory.context_bytes)
    peak_total = peak.peak_bytes + frag + hw.memory.context_bytes

    samples = plan.micro_batch * m * plan.devices
    tokens = samples * spec.seq_len
    # Model FLOPs: forward + backward (2x forward) per token, no recompute (the MFU convention).
    model_flops = 3.0 * spec.fwd_flops_per_token * plan.micro_batch * m * spec.seq_len
    peak_rate = hw.compute.peak_flops[plan.precision]
    states = {"params": sum(u.states.params for u in low.units),
              "grads": sum(u.states.grads for u in low.units),
              "optimizer": sum(u.states.optimizer for u in low.units)}
    return Estimate(
        peak_memory_bytes=peak_total, memory_breakdown=mem, iteration_time_s=iteration_s,
        time_breakdown=breakdown, samples_per_s=samples / iteration_s, tokens_per_s=tokens / iteration_s,
        model_flops_per_s_per_device=model_flops / iteration_s, mfu=model_flops / iteration_s / peak_rate,
        model_states_bytes=states, peak_during=peak.during, timeline=tasks)
