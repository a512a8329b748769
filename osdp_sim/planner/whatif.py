"""What-if sweeps: the best plan and the uniform baselines at every point of a grid of device
counts, memory limits, sequence lengths, micro-batches, models and scale factors on interconnect
bandwidth and compute, within one time limit for the whole grid (osdp-sim sweep, osdp_sim.sweep)."""

import itertools
import math
import time
from dataclasses import dataclass, field, replace

from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile, LinkSpec
from osdp_sim.hardware.trust import Trust, trust_of
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan import Plan
from osdp_sim.planner.headroom import NONE as NO_HEADROOM
from osdp_sim.planner.headroom import Headroom, planning_limit
from osdp_sim.planner.mbbound import states_floor_bytes
from osdp_sim.planner.space import SearchSpace
from osdp_sim.units import format_bytes

DEFAULT_SWEEP_TIME_LIMIT_S = 600.0
# Each point's share of the time left is at least this (or all that is left): a share too small
# to find any plan answers nothing, so the points the time does not reach are "not run" instead
# (after the first, none starts with less than half of it).
MIN_POINT_S = 1.0
NOT_RUN = "not_run"
JSON_FORMAT, JSON_VERSION = "osdp-sim/sweep", 1

# The axes in the order the grid (and its table) enumerates them.
AXES = ("model", "devices", "mem_limit_bytes", "seq_len", "micro_batch", "bandwidth_scale", "compute_scale")


@dataclass(frozen=True)
class SweepAxes:
    """The values of each axis; None: not swept (the profile's or the model's own value)."""

    model: tuple[str, ...]
    """Model names or paths (at least one)."""
    devices: tuple[int, ...] | None = None
    """Device counts; past one node of the profile, whole nodes over the inter-node link."""
    mem_limit_bytes: tuple[float, ...] | None = None
    """Peak memory limits per device (None: the device's usable memory)."""
    seq_len: tuple[int, ...] | None = None
    """Sequence lengths (None: the model's)."""
    micro_batch: tuple[int, ...] | None = None
    """Fixed micro-batches per device (None: the search picks it)."""
    bandwidth_scale: tuple[float, ...] | None = None
    """Factors on every intra- and inter-node bus bandwidth, tables included."""
    compute_scale: tuple[float, ...] | None = None
    """Factors on the peak FLOP/s of every dtype."""

    def swept(self) -> tuple[str, ...]:
        """The axes given, in AXES order."""
        return tuple(a for a in AXES if getattr(self, a) is not None)

    def varying(self) -> tuple[str, ...]:
        """The axes with more than one value."""
        return tuple(a for a in self.swept() if len(getattr(self, a)) > 1)


@dataclass(frozen=True)
class SweepPoint:
    """One point of the grid and what the search and the baselines found there."""

    model: str
    """The model's name."""
    devices: int
    """Devices at this point."""
    mem_limit_bytes: float
    """The memory limit searched (capped to the device's usable memory)."""
    seq_len: int
    """Sequence length (tokens per sample)."""
    micro_batch: int | None
    """The fixed micro-batch, or None when the search chose it."""
    bandwidth_scale: float
    """Factor on the interconnect bus bandwidths."""
    compute_scale: float
    """Factor on peak FLOP/s."""
    status: str
    """optimal | within_gap | time_limit | infeasible | not_run."""
    samples_per_s: float | None = None
    """The best plan's throughput (None: no plan)."""
    tokens_per_s: float | None = None
    """samples_per_s x seq_len."""
    peak_memory_bytes: float | None = None
    """The best plan's peak memory per device."""
    iteration_time_s: float | None = None
    """The best plan's step time."""
    gap: float | None = None
    """Proven relative gap of the plan to the best bound (0: optimal)."""
    best_bound_samples_per_s: float | None = None
    """No plan of the space at this point is faster (the certificate)."""
    plan: Plan | None = field(default=None, repr=False)
    """The best plan."""
    plan_summary: str = ""
    """The best plan on one line."""
    baselines: dict = field(default_factory=dict, repr=False)
    """ddp, zero2, zero3 -> planner.baselines.Baseline at its best batch setting."""
    min_peak_memory_bytes: float | None = None
    """When infeasible: the least peak any plan reaches, or a proven lower bound on it."""
    min_peak_proven: bool | None = None
    """Whether min_peak_memory_bytes is the exact least (False: a lower bound)."""
    seconds: float = 0.0
    """Time spent on this point (search and baselines)."""
    message: str = ""
    """Notes: a capped limit, the infeasible diagnosis, not run."""
    headroom_bytes: float = 0.0
    """--headroom in bytes, kept free: the search's limit is mem_limit_bytes less it."""
    usable_memory_bytes: float | None = None
    """The point's device's usable memory (for the margin)."""

    @property
    def margin_bytes(self) -> float | None:
        """What the plan leaves free on the device: usable memory less its peak."""
        if self.peak_memory_bytes is None or self.usable_memory_bytes is None:
            return None
        return self.usable_memory_bytes - self.peak_memory_bytes

    def coordinates(self, axes: tuple[str, ...]) -> dict:
        return {a: getattr(self, a) for a in axes}

    def to_dict(self) -> dict:
        """The point as `osdp-sim sweep --json` prints it."""
        def finite(x):
            return x if x is None or math.isfinite(x) else None
        return {"model": self.model, "devices": self.devices, "mem_limit_bytes": self.mem_limit_bytes,
                "seq_len": self.seq_len, "micro_batch": self.micro_batch,
                "bandwidth_scale": self.bandwidth_scale, "compute_scale": self.compute_scale,
                "status": self.status, "samples_per_s": self.samples_per_s, "tokens_per_s": self.tokens_per_s,
                "peak_memory_bytes": self.peak_memory_bytes, "iteration_time_s": self.iteration_time_s,
                "gap": self.gap, "best_bound_samples_per_s": finite(self.best_bound_samples_per_s),
                "plan": self.plan_summary or None,
                "baselines": {k: b.to_dict() for k, b in self.baselines.items()},
                "min_peak_memory_bytes": finite(self.min_peak_memory_bytes),
                "min_peak_proven": self.min_peak_proven, "seconds": self.seconds, "message": self.message,
                "headroom_bytes": self.headroom_bytes, "usable_memory_bytes": self.usable_memory_bytes,
                "margin_bytes": self.margin_bytes}


@dataclass(frozen=True)
class SweepResult:
    """The whole grid: every point in grid order, those the time limit left out as not_run."""

    hardware: str
    """The profile's name."""
    axes: SweepAxes
    """The axes swept."""
    points: list
    """SweepPoint per grid point, in grid order (itertools.product of the axes in AXES order)."""
    time_limit_s: float | None
    """The whole grid's time limit (None: none)."""
    seconds: float
    """Time the sweep took."""
    inter_node: str | None = None
    """Where the inter-node link came from, when some point spans nodes."""
    trust: Trust = Trust("documented")
    """How far the profile's numbers go: documented, measured or calibrated (hardware.trust)."""

    @property
    def complete(self) -> bool:
        return all(p.status != NOT_RUN for p in self.points)

    def to_json(self) -> dict:
        """The object `osdp-sim sweep --json` prints (docs/json.md, osdp-sim/sweep)."""
        return {"format": JSON_FORMAT, "version": JSON_VERSION, "hardware": self.hardware,
                "axes": {a: list(getattr(self.axes, a)) for a in self.axes.swept()},
                "time_limit_s": self.time_limit_s, "seconds": self.seconds, "complete": self.complete,
                "inter_node": self.inter_node, "provenance": self.trust.to_json(),
                "points": [p.to_dict() for p in self.points]}


def parse_inter_node(text: str) -> LinkSpec:
    """'GBPS[,LATENCY_US]' -> LinkSpec (latency default DEFAULT_INTER_LATENCY_US)."""
    parts = [t.strip() for t in text.split(",")]
    if not 1 <= len(parts) <= 2:
        raise UserError(f"expected GBPS[,LATENCY_US], got {text!r}", field="--inter-node")
    try:
        vals = [float(t) for t in parts]
    except ValueError:
        raise UserError(f"expected GBPS[,LATENCY_US] as numbers, got {text!r}", field="--inter-node") from None
    gbps = vals[0]
    lat_us = vals[1] if len(vals) == 2 else DEFAULT_INTER_LATENCY_US
    if not (math.isfinite(gbps) and gbps > 0) or not (math.isfinite(lat_us) and lat_us >= 0):
        raise UserError(f"expected a positive bandwidth and a latency >= 0, got {text!r}", field="--inter-node")
    return LinkSpec(latency_s=lat_us * 1e-6, busbw_bytes_per_s=gbps * 1e9)


# Calculon's InfiniBand latency default, as in hwprofiles/a100-2x8.yaml; stated in the output.
DEFAULT_INTER_LATENCY_US = 20.0


def check_devices(hw: HardwareProfile, counts, inter: LinkSpec | None) -> str | None:
    """Every count is usable on this profile: within one node, or whole nodes with an inter-node
    link (the flag's, else the profile's). Returns where that link comes from (None: no count
    spans nodes); a UserError otherwise."""
    per_node = hw.device.per_node
    beyond = [n for n in counts if n > per_node]
    for n in beyond:
        if n % per_node:
            raise UserError(f"{n} devices is past one node of {hw.name} ({per_node} per node) but not a whole "
                            f"number of nodes; use multiples of {per_node}", field="--gpus")
    if not beyond:
        return None
    if inter is not None:
        return (f"--inter-node: {inter.busbw_bytes_per_s / 1e9:g} GB/s busbw, "
                f"{inter.latency_s * 1e6:g} us latency")
    if hw.collectives.inter is not None:
        link = hw.collectives.inter
        more = "" if max(beyond) <= hw.device.count else \
            f"; scaled past its {hw.device.count} devices with the same link per node"
        return (f"the profile {hw.name}: {link.busbw_bytes_per_s / 1e9:g} GB/s busbw, "
                f"{link.latency_s * 1e6:g} us latency{more}")
    raise UserError(f"{max(beyond)} devices spans {max(beyond) // per_node} nodes of {per_node}, and the "
                    f"single-node profile {hw.name} has no inter-node link: give one with --inter-node "
                    "GBPS[,LATENCY_US] (e.g. 23.5,20 for 200 Gb/s HDR InfiniBand) or use a multi-node profile",
                    field="--gpus")


def point_hardware(hw: HardwareProfile, devices: int, inter: LinkSpec | None = None,
                   bandwidth_scale: float = 1.0, compute_scale: float = 1.0) -> HardwareProfile:
    """The profile at one point: `devices` of the same node shape; `inter` (when given) replaces
    the inter-node link and any cross-node tables; every bus bandwidth times bandwidth_scale,
    every peak FLOP/s times compute_scale."""
    h = hw.with_devices(devices)
    col = h.collectives
    if inter is not None:
        col = replace(col, inter=inter, tables=tuple(t for t in col.tables if t.scope != "inter"))
    if bandwidth_scale != 1.0:
        def scaled(link):
            return None if link is None else replace(link, busbw_bytes_per_s=link.busbw_bytes_per_s * bandwidth_scale)
        col = replace(col, intra=scaled(col.intra), inter=scaled(col.inter),
                      tables=tuple(replace(t, busbw_bytes_per_s=tuple(b * bandwidth_scale for b in t.busbw_bytes_per_s))
                                   for t in col.tables))
    h = replace(h, collectives=col)
    if compute_scale != 1.0:
        h = replace(h, compute=replace(h.compute, peak_flops={k: v * compute_scale
                                                              for k, v in h.compute.peak_flops.items()}))
    return h


def grid(axes: SweepAxes, hw: HardwareProfile) -> list[dict]:
    """The product of the axes (AXES order; an axis not swept takes its one default value):
    a dict of AXES -> value per point. mem_limit_bytes None means the device's usable memory,
    seq_len None the model's own."""
    values = {"model": axes.model, "devices": axes.devices or (hw.device.count,),
              "mem_limit_bytes": axes.mem_limit_bytes or (None,), "seq_len": axes.seq_len or (None,),
              "micro_batch": axes.micro_batch or (None,), "bandwidth_scale": axes.bandwidth_scale or (1.0,),
              "compute_scale": axes.compute_scale or (1.0,)}
    return [dict(zip(AXES, combo)) for combo in itertools.product(*(values[a] for a in AXES))]


def check_axes(axes: SweepAxes) -> None:
    """Each axis given is a non-empty tuple of valid values (a UserError naming the flag)."""
    flags = {"model": "--model", "devices": "--gpus", "mem_limit_bytes": "--mem-limit", "seq_len": "--seq-len",
             "micro_batch": "--micro-batch", "bandwidth_scale": "--bandwidth-scale",
             "compute_scale": "--compute-scale"}
    if not axes.model:
        raise UserError("give at least one model", field="--model")
    for a in AXES[1:]:
        vals = getattr(axes, a)
        if vals is None:
            continue
        if not vals:
            raise UserError("expected at least one value", field=flags[a])
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise UserError(f"expected positive, finite values, got {v!r}", field=flags[a])
            if a in ("devices", "seq_len", "micro_batch") and v != int(v):
                raise UserError(f"expected whole numbers, got {v!r}", field=flags[a])


def run_point(spec: ModelSpec, hw: HardwareProfile, limit_bytes: float, space: SearchSpace, coords: dict,
              time_limit_s: float | None, rel_gap: float = 0.0, headroom: Headroom = NO_HEADROOM) -> SweepPoint:
    """search() and the uniform baselines at one point within time_limit_s (Budget: the search
    first, a reserve for the baselines)."""
    from osdp_sim.planner.baselines import uniform_baselines
    from osdp_sim.planner.bnb import search
    from osdp_sim.planner.budget import Budget
    from osdp_sim.planner.report import plan_oneline
    t0 = time.perf_counter()
    budget = Budget(time_limit_s)
    notes = []
    usable = float(hw.device.usable_memory_bytes)
    if limit_bytes > usable:
        notes.append(f"limit {format_bytes(limit_bytes)} capped to the {format_bytes(usable)} usable per device")
    searched, room = planning_limit(limit_bytes, usable, headroom)
    limit_bytes = min(limit_bytes, usable)
    if room:
        notes.append(f"headroom {format_bytes(room)} kept free: searched within {format_bytes(searched)}")
    res = search(spec, hw, searched, space, time_limit_s=budget.search_share(), rel_gap=rel_gap)
    base = uniform_baselines(spec, hw, searched, space, deadline=budget.deadline)
    fields = dict(coords, model=spec.name, seq_len=spec.config.seq_len, mem_limit_bytes=limit_bytes,
                  baselines=base, headroom_bytes=room, usable_memory_bytes=usable)
    if res.plan is not None:
        e = res.prediction
        return SweepPoint(**fields, status=res.status, samples_per_s=e.samples_per_s,
                          tokens_per_s=e.samples_per_s * spec.config.seq_len, peak_memory_bytes=e.peak_memory_bytes,
                          iteration_time_s=e.iteration_time_s, gap=res.gap, best_bound_samples_per_s=res.best_bound_samples_per_s,
                          plan=res.plan, plan_summary=plan_oneline(res.plan),
                          seconds=time.perf_counter() - t0, message="; ".join(notes))
    least, proven = None, None
    if res.status == "time_limit":
        notes.append(f"time limit before any plan was found (no plan exceeds {res.best_bound_samples_per_s:.4g} samples/s)")
    else:
        least, proven = res.min_peak_memory_bytes, res.min_peak_proven
        if not proven:
            least = max(least, states_floor_bytes(spec, hw, space.optimizer, hw.device.count))
        notes.append(f"no plan fits {format_bytes(searched)}: the least peak is "
                     + (format_bytes(least) if proven else f"at least {format_bytes(least)} (a proven bound)"))
    return SweepPoint(**fields, status=res.status, best_bound_samples_per_s=res.best_bound_samples_per_s,
                      min_peak_memory_bytes=least, min_peak_proven=proven,
                      seconds=time.perf_counter() - t0, message="; ".join(notes))


def not_run(spec: ModelSpec, hw: HardwareProfile, coords: dict) -> SweepPoint:
    limit = coords["mem_limit_bytes"]
    return SweepPoint(**dict(coords, model=spec.name, seq_len=spec.config.seq_len,
                             mem_limit_bytes=min(limit, float(hw.device.usable_memory_bytes))),
                      status=NOT_RUN, message="not run: time limit")


def load_models(axes: SweepAxes) -> dict:
    """(model, seq_len) -> ModelSpec for every pair of the grid, loaded before any point runs
    (a model is a name, a path or a ModelSpec)."""
    from osdp_sim.model.config import with_overrides
    from osdp_sim.model.load import load_model
    from osdp_sim.model.spec import build_spec
    out = {}
    for m in axes.model:
        for s in axes.seq_len or (None,):
            if not isinstance(m, ModelSpec):
                out[(m, s)] = load_model(m, seq_len=s)
            else:
                out[(m, s)] = m if s is None else build_spec(with_overrides(m.config, seq_len=s))
    return out


def sweep(hw: HardwareProfile, axes: SweepAxes, space: SearchSpace = SearchSpace(), *,
          time_limit_s: float | None = DEFAULT_SWEEP_TIME_LIMIT_S, inter: LinkSpec | None = None,
          rel_gap: float = 0.0, progress=None, headroom: Headroom = NO_HEADROOM) -> SweepResult:
    """Every point of grid(axes) in order, within time_limit_s for the whole grid: each point gets
    an equal share of what is left (at least MIN_POINT_S); points the time does not reach are
    not_run. progress(msg): called after each point, with an estimate of the time left."""
    t0 = time.perf_counter()
    check_axes(axes)
    source = check_devices(hw, axes.devices or (hw.device.count,), inter)
    specs = load_models(axes)
    points_in = grid(axes, hw)
    if progress is not None:
        progress(f"{len(points_in)} point{'s' if len(points_in) != 1 else ''} on {hw.name}"
                 + (f" within {time_limit_s:g} s" if time_limit_s is not None else "")
                 + (f"; inter-node link from {source}" if source else "") + " ...")
    for c in points_in:                  # a headroom that leaves nothing: an error before any point runs
        h = point_hardware(hw, c["devices"], inter, c["bandwidth_scale"], c["compute_scale"])
        usable = float(h.device.usable_memory_bytes)
        planning_limit(float(c["mem_limit_bytes"]) if c["mem_limit_bytes"] is not None else usable, usable, headroom)
    deadline = None if time_limit_s is None else t0 + time_limit_s
    out = []
    # A point runs past its share by its search's setup and its baselines, which do not stop at
    # the share: the most any point has overrun so far is kept back from the time left.
    overrun_s = 0.0
    for i, c in enumerate(points_in):
        spec = specs[(c["model"], c["seq_len"])]
        h = point_hardware(hw, c["devices"], inter, c["bandwidth_scale"], c["compute_scale"])
        limit = float(c["mem_limit_bytes"]) if c["mem_limit_bytes"] is not None else float(h.device.usable_memory_bytes)
        coords = {a: c[a] for a in ("devices", "micro_batch", "bandwidth_scale", "compute_scale")}
        coords["mem_limit_bytes"] = limit
        left = None if deadline is None else deadline - time.perf_counter() - overrun_s
        if left is not None and i > 0 and left < MIN_POINT_S / 2:
            out.append(not_run(spec, h, coords))
            continue
        share = None if left is None else max(0.0, min(left, max(MIN_POINT_S, left / (len(points_in) - i))))
        sp = replace(space, devices=c["devices"], shard_groups=None,
                     micro_batches=(c["micro_batch"],) if c["micro_batch"] else space.micro_batches)
        started = time.perf_counter()
        p = run_point(spec, h, limit, sp, coords, share, rel_gap, headroom)
        if share is not None:
            overrun_s = max(overrun_s, time.perf_counter() - started - share)
        out.append(p)
        if progress is not None:
            progress(_progress_line(i, len(points_in), p, axes, t0, deadline))
    return SweepResult(hw.name, axes, out, time_limit_s, time.perf_counter() - t0, source, trust_of(hw))


def describe_coords(p: SweepPoint, axes: SweepAxes) -> str:
    parts = []
    for a in axes.swept():
        v = getattr(p, a)
        parts.append({"model": lambda: f"{v}", "devices": lambda: f"{v} GPU{'s' if v != 1 else ''}",
                      "mem_limit_bytes": lambda: f"limit {format_bytes(v)}", "seq_len": lambda: f"seq {v}",
                      "micro_batch": lambda: f"mb {v}", "bandwidth_scale": lambda: f"bw x{v:g}",
                      "compute_scale": lambda: f"compute x{v:g}"}[a]())
    return ", ".join(parts) or p.model


def _progress_line(i: int, n: int, p: SweepPoint, axes: SweepAxes, t0: float, deadline: float | None) -> str:
    elapsed = time.perf_counter() - t0
    eta = elapsed / (i + 1) * (n - i - 1)
    if deadline is not None:
        eta = min(eta, max(0.0, deadline - time.perf_counter()))
    what = (f"{p.samples_per_s:.4g} samples/s at {format_bytes(p.peak_memory_bytes)}" if p.samples_per_s else
            p.message)
    return (f"point {i + 1}/{n} ({describe_coords(p, axes)}): {p.status}, {what} in {p.seconds:.1f} s; "
            f"about {eta:.0f} s left")
