"""The Python API: what `osdp-sim estimate`, `search` and `pareto` do, as functions.

Models and profiles are taken by name, path or object; sizes as "40GiB" or bytes. Defaults are
the CLI's (a finite time limit included). Results are dataclasses; search() returns
planner.result.SearchResult, whose to_json() is the object `osdp-sim search --json` prints. docs/python-api.md has a worked example.
"""

import math
import time
from dataclasses import dataclass, replace

from osdp_sim.costmodel import Estimate
from osdp_sim.costmodel import estimate as _estimate
from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.config import ModelConfig
from osdp_sim.model.spec import ModelSpec, build_spec
from osdp_sim.plan.plan import Plan
from osdp_sim.planner.bnb import DEFAULT_PARETO_TIME_LIMIT_S, DEFAULT_TIME_LIMIT_S
from osdp_sim.planner.result import SearchResult
from osdp_sim.planner.space import SearchSpace
from osdp_sim.units import parse_bytes


def load_model(model: str | ModelConfig | ModelSpec, *, seq_len: int | None = None) -> ModelSpec:
    """A model description: a built-in name (`osdp-sim models`), a model YAML, a Hugging Face
    config.json (or its folder), a ModelConfig, or a ModelSpec (returned as it is)."""
    if isinstance(model, ModelSpec):
        return model if seq_len is None else load_model(model.config, seq_len=seq_len)
    if isinstance(model, ModelConfig):
        from osdp_sim.model.config import with_overrides
        return build_spec(with_overrides(model, seq_len=seq_len))
    if not isinstance(model, str):
        raise UserError(f"expected a model name, a path, a ModelConfig or a ModelSpec, got {type(model).__name__}",
                        field="model")
    from osdp_sim.model.load import load_model as _load
    return _load(model, seq_len=seq_len)


def load_profile(hardware: str | HardwareProfile, *, devices: int | None = None) -> HardwareProfile:
    """A hardware profile: a shipped name (`osdp-sim profiles`), a YAML path, or a profile;
    `devices` uses fewer of its devices (as --gpus)."""
    if isinstance(hardware, HardwareProfile):
        hw = hardware
    elif isinstance(hardware, str):
        from osdp_sim.hardware.load import load_profile as _load
        hw = _load(hardware)
    else:
        raise UserError(f"expected a profile name, a path or a HardwareProfile, got {type(hardware).__name__}",
                        field="hardware")
    if devices is not None:
        if not isinstance(devices, int) or isinstance(devices, bool) or not 1 <= devices <= hw.device.count:
            raise UserError(f"expected 1..{hw.device.count} devices of {hw.name!r}, got {devices!r}",
                            field="devices")
        hw = hw.with_devices(devices)
    return hw


def _bytes(size: str | int | float, field: str) -> int:
    return parse_bytes(size, field=field)


def _headroom_limit(limit_bytes: float, hw: HardwareProfile, headroom) -> tuple[float, float]:
    """(limit searched, headroom bytes): min(limit, usable) less the headroom (planner/headroom.py)."""
    from osdp_sim.planner.headroom import parse_headroom, planning_limit
    return planning_limit(limit_bytes, hw.device.usable_memory_bytes, parse_headroom(headroom, field="headroom"),
                          field="headroom")


def uniform_plan(model, hardware, strategy: str = "zero3", *, micro_batch: int = 1,
                 checkpoint: bool | str = False, **plan_fields) -> Plan:
    """Every group on one strategy (ddp, zero2, zero3), on all of the profile's devices;
    checkpoint: False, True (full) or "selective" for every block; further Plan fields
    (grad_accum, precision, optimizer, shard_group, slices) as keywords."""
    from osdp_sim.plan.plan import uniform_plan as _uniform
    spec, hw = load_model(model), load_profile(hardware)
    return _uniform(spec.config, strategy, devices=hw.device.count, micro_batch=micro_batch,
                    checkpoint=checkpoint, **plan_fields)


def estimate(model, hardware, plan: Plan) -> Estimate:
    """Peak memory and step time of `plan` on the hardware (docs/cost-model.md)."""
    spec, hw = load_model(model), load_profile(hardware)
    if plan.devices > hw.device.count:
        raise UserError(f"the plan is for {plan.devices} devices; {hw.name!r} has {hw.device.count}",
                        field="plan.devices")
    return _estimate(spec, hw if plan.devices == hw.device.count else hw.with_devices(plan.devices), plan)


def search(model, hardware, mem_limit: str | int | float, *, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
           space: SearchSpace | None = None, baselines: bool = True, top_k: int = 1,
           rel_gap: float = 0.0, headroom: str | int | float = 0, **space_fields) -> SearchResult:
    """The plan of highest throughput within `mem_limit` per device, proven optimal within the time
    limit (the whole call's: the search and the baselines), like `osdp-sim search`. The space is
    `space` or SearchSpace(**space_fields) (strategies, splits, checkpoint, micro_batches, ...);
    a limit above the device's usable memory is capped to it; `headroom` ("2GiB", "10%" of that
    capped limit, or bytes) is left free below it, as --headroom. The result is planner.bnb.search's
    with the uniform baselines and the OSDP knapsack DP's plan filled (when a plan was found)."""
    from osdp_sim.planner.baselines import all_baselines
    from osdp_sim.planner.beside import Beside
    from osdp_sim.planner.bnb import search as _search
    from osdp_sim.planner.budget import Budget
    spec, hw = load_model(model), load_profile(hardware)
    limit, room = _headroom_limit(_bytes(mem_limit, "mem_limit"), hw, headroom)
    if time_limit_s is not None and not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise UserError(f"expected a positive number of seconds or None, got {time_limit_s!r}", field="time_limit_s")
    if space is not None and space_fields:
        raise UserError("give a SearchSpace or its fields, not both", field="space")
    space = space or SearchSpace(**space_fields)
    budget = Budget(time_limit_s)
    if not baselines:
        res = _search(spec, hw, limit, space, time_limit_s=budget.search_share(), top_k=top_k, rel_gap=rel_gap)
        return replace(res, baselines={}, headroom_bytes=room)
    with Beside(all_baselines, spec, hw, limit, space, deadline=budget.deadline) as beside:   # planner/beside.py
        res = _search(spec, hw, limit, space, time_limit_s=budget.search_share(), top_k=top_k, rel_gap=rel_gap)
        found = beside.result() if res.plan is not None else {}
    return replace(res, baselines=found, headroom_bytes=room)


@dataclass
class Front:
    """The throughput-vs-peak-memory front: points (peak_bytes, samples_per_s, Plan), peak
    ascending, each faster than the one before; proven False when the time limit stopped it."""

    points: list
    evaluated: int
    proven: bool
    seconds: float
    mem_max_bytes: float = math.inf      # the upper end searched (headroom taken off)
    usable_memory_bytes: float = math.inf

    def margin_bytes(self, peak_bytes: float) -> float:
        """What a point of peak `peak_bytes` leaves free of the device's usable memory."""
        return self.usable_memory_bytes - peak_bytes


def pareto(model, hardware, *, mem_max: str | int | float | None = None, method: str = "sweep",
           resolution: str | int | float = "64MiB", time_limit_s: float | None = DEFAULT_PARETO_TIME_LIMIT_S,
           space: SearchSpace | None = None, headroom: str | int | float = 0, **space_fields) -> Front:
    """The exact front up to `mem_max` (default: the device's usable memory) less `headroom` (as
    in search()), like `osdp-sim pareto`: method "sweep" (exact search() at descending limits, `resolution` apart) or "front"
    (one pareto_front() pass; slow beyond ~16 blocks)."""
    from osdp_sim.planner.bnb import pareto_front
    from osdp_sim.planner.sweep import non_dominated, sweep_front
    spec, hw = load_model(model), load_profile(hardware)
    if method not in ("sweep", "front"):
        raise UserError(f"expected 'sweep' or 'front', got {method!r}", field="method")
    if space is not None and space_fields:
        raise UserError("give a SearchSpace or its fields, not both", field="space")
    space = space or SearchSpace(**space_fields)
    hi, _ = _headroom_limit(float(hw.device.usable_memory_bytes) if mem_max is None else _bytes(mem_max, "mem_max"),
                            hw, headroom)
    t0 = time.perf_counter()
    if method == "front":
        res = pareto_front(spec, hw, space, mem_range=(0.0, hi), time_limit_s=time_limit_s)
        proven = res.proven
    else:
        step = 0 if resolution in (0, "0", "0B") else _bytes(resolution, "resolution")
        res, proven = sweep_front(spec, hw, space, hi, resolution_bytes=step, total_time_limit_s=time_limit_s)
    return Front(non_dominated(res.front), len(res.evaluated), proven, time.perf_counter() - t0, hi,
                 float(hw.device.usable_memory_bytes))


# ---------------------------------------------------------------- what-if sweeps (osdp-sim sweep)

from osdp_sim.planner.whatif import DEFAULT_SWEEP_TIME_LIMIT_S as _SWEEP_TIME_LIMIT_S  # noqa: E402


def sweep(model, hardware, *, devices=None, mem_limit=None, seq_len=None, micro_batch=None,
          bandwidth_scale=None, compute_scale=None, inter_node: str | None = None,
          time_limit_s: float | None = _SWEEP_TIME_LIMIT_S, rel_gap: float = 0.0, space: SearchSpace | None = None,
          progress=None, headroom=None, **space_fields):
    """The best plan (with its certificate) and the uniform baselines at every point of the
    product of the axes, like `osdp-sim sweep`; returns planner.whatif.SweepResult. `model` is one
    model (name, path or ModelSpec) or a list of them; each other axis a value or a list (None:
    not swept); mem_limit sizes as "40GiB" or bytes. inter_node "GBPS[,LATENCY_US]": the link
    between nodes for device counts past one node of a single-node profile. time_limit_s: the
    whole grid's (the CLI's default, planner.whatif.DEFAULT_SWEEP_TIME_LIMIT_S; None: no limit)."""
    from osdp_sim.planner.headroom import parse_headroom
    from osdp_sim.planner.whatif import SweepAxes, parse_inter_node
    from osdp_sim.planner.whatif import sweep as _sweep

    def axis(v):
        return None if v is None else tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if space is not None and space_fields:
        raise UserError("give a SearchSpace or its fields, not both", field="space")
    hw = load_profile(hardware)
    limits = axis(mem_limit)
    axes = SweepAxes(model=axis(model), devices=axis(devices),
                     mem_limit_bytes=None if limits is None else tuple(float(_bytes(m, "mem_limit")) for m in limits),
                     seq_len=axis(seq_len), micro_batch=axis(micro_batch), bandwidth_scale=axis(bandwidth_scale),
                     compute_scale=axis(compute_scale))
    if time_limit_s is not None and not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise UserError(f"expected a positive number of seconds or None, got {time_limit_s!r}", field="time_limit_s")
    return _sweep(hw, axes, space or SearchSpace(**space_fields), time_limit_s=time_limit_s,
                  inter=parse_inter_node(inter_node) if inter_node else None, rel_gap=rel_gap, progress=progress,
                  headroom=parse_headroom(headroom, field="headroom"))


def tune(model, hardware: str, mem_limit: str | int | float, out_dir, *, candidates: int = 3,
         near: int = 2, baselines: int = 2, repeats: int = 1, confirm: int = 2, confirm_within: float = 0.08,
         paired_rounds: int = 0, device: str = "cpu", warmup: int = 2, iters: int = 6, refit: bool = True, time_limit_s: float | None = 1800.0, space: SearchSpace | None = None,
         **space_fields):
    """Like `osdp-sim tune` (docs/tune.md): the search's pick, the best plans at other micro-batches
    and the strongest baselines, each run for real (needs the runtime extra), the measured fastest
    and the refitted profile, as a calibrate.tune.TuneResult. `hardware` is a profile file or name
    (the runs need it by name); out_dir keeps records and candidates, so a second call resumes."""
    from pathlib import Path

    from osdp_sim.calibrate.tune import RunSettings
    from osdp_sim.calibrate.tune import tune as _tune
    if not isinstance(hardware, str):
        raise UserError("give the profile as a file or name: the runs load it themselves", field="hardware")
    spec, hw = load_model(model), load_profile(hardware)
    if space is not None and space_fields:
        raise UserError("give a SearchSpace or its fields, not both", field="space")
    space = space or SearchSpace(**space_fields)
    limit = min(float(_bytes(mem_limit, "mem_limit")), float(hw.device.usable_memory_bytes))
    settings = RunSettings(hardware=hardware, out_dir=Path(out_dir), device=device, warmup=warmup,
                           iters=iters, repeats=repeats, confirm=confirm, confirm_within=confirm_within,
                           paired_rounds=paired_rounds)
    return _tune(spec, hw, limit, space, settings, k=candidates, baselines=baselines, near=near, refit=refit,
                 time_limit_s=time_limit_s)
