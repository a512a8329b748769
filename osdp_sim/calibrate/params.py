"""The free coefficients of calibration: what each one is, how it maps onto a HardwareProfile, its
bounds, and the prior that keeps it near the value the profile measured.

The optimiser works in internal coordinates u: u = log(x) for multiplicative coefficients
(efficiencies, slowdown), u = x / sigma for additive ones (latencies, bytes, fractions). The prior
residual of a coefficient is (u - u_prior) / sigma in those coordinates, so one `sigma` of
deviation from the measured value costs as much as a one-sigma misfit of one run.

Priors are centred on the profile's own value (its measurement). When the profile is itself the
output of a calibration, the prior stays on the value measured before that calibration
(provenance.calibration.coefficients[name].before): recalibrating never drifts the anchor.
"""

import math
from dataclasses import dataclass, replace

from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import COLLECTIVE_OPS, HardwareProfile

MiB = 2**20


@dataclass(frozen=True)
class Param:
    name: str                 # the profile key it writes, e.g. collectives.efficiency.all_gather
    log: bool                 # multiplicative (fitted in log space) or additive
    lo: float                 # bounds in natural units
    hi: float
    sigma: float              # prior strength: log units (log=True) or natural units
    unit: str                 # how to show it: "", "x", "us", "MiB"
    affects: str              # time | memory (memory-only coefficients need no re-simulation)
    why: str                  # one line for the report

    def to_internal(self, x: float) -> float:
        return math.log(x) if self.log else x / self.sigma

    def from_internal(self, u: float) -> float:
        return math.exp(u) if self.log else u * self.sigma

    def internal_bounds(self) -> tuple[float, float]:
        return self.to_internal(self.lo), self.to_internal(self.hi)

    def show(self, x: float) -> str:
        if self.unit == "us":
            return f"{x * 1e6:.1f} us"
        if self.unit == "MiB":
            return f"{x / MiB:.1f} MiB"
        return f"{x:.4g}"


def default_params(profile: HardwareProfile) -> tuple[Param, ...]:
    """The coefficients calibration frees, with bounds and prior strengths scaled to the profile.

    Prior strengths (stated, not tuned to the data):
    - compute.efficiency_scale, collectives.efficiency.*: sigma 0.3 in log (about 35%): the
      profiler measures these directly, but a GEMM benchmark and a training step differ.
    - collectives.extra_latency_s.*: sigma = the profile's small-message cost (launch + link
      latency, at least 50 us): a per-call overhead of the order of what was measured.
    - overlap_slowdown: sigma 0.15 in log: published overlap coefficients span 1.1-1.4.
    - host.op_s, host.call_s: sigma 1 in log (host_params says why).
    - memory.context_bytes: sigma 64 MiB; memory.fragmentation: sigma 0.05 (5% of the peak).
    """
    k = profile.collectives
    lat_sigma = max(50e-6, k.launch_s + k.intra.latency_s)
    cap = float(profile.device.memory_bytes)
    ps = [Param("compute.efficiency_scale", True, 0.2, 5.0, 0.3, "x", "time",
                "multiplier on the measured GEMM efficiency curve")]
    for op in COLLECTIVE_OPS:
        ps.append(Param(f"collectives.efficiency.{op}", True, 0.1, 10.0, 0.3, "x", "time",
                        f"multiplier on the measured {op} bus bandwidth"))
    for op in COLLECTIVE_OPS:
        ps.append(Param(f"collectives.extra_latency_s.{op}", False, 0.0, 0.05, lat_sigma, "us", "time",
                        f"fixed cost added to every {op} call"))
    ps.append(Param("overlap_slowdown", True, 1.0, 3.0, 0.15, "x", "time",
                    "slowdown of compute and communication while they overlap"))
    ps.extend(host_params(profile))
    ps.append(Param("memory.context_bytes", False, 0.0, cap / 2, 64 * MiB, "MiB", "memory",
                    "bytes per device outside the tracked tensors"))
    ps.append(Param("memory.fragmentation", False, 0.0, 0.5, 0.05, "", "memory",
                    "allocator margin as a fraction of the live-tensor peak"))
    return tuple(ps)


# Coefficients that may be freed in addition (--free NAME): same mechanics, off by default
# because the brief's model says the profiler measures them well.
EXTRA = {
    "compute.bandwidth_efficiency": lambda p: Param(
        "compute.bandwidth_efficiency", True, 0.01, 1.0, 0.3, "", "time",
        "achieved fraction of memory bandwidth for elementwise work"),
    "compute.kernel_launch_s": lambda p: kernel_launch_param(p),
    "compute.attention_backward_ratio": lambda p: Param(
        "compute.attention_backward_ratio", True, 1.0, 6.0, 0.3, "x", "time",
        "backward over forward time of the attention kernel"),
    "host.dtensor_op_s": lambda p: Param(
        "host.dtensor_op_s", True, 1e-7, 1e-2, 1.0, "us", "time",
        "host time of one op on a DTensor (the optimizer step)"),
}


def host_params(profile: HardwareProfile) -> list[Param]:
    """The host's dispatch cost per eager op and per collective FSDP2 issues. profile-hw times a 1-element op
    on a plain tensor, and torch.profiler puts a training step's non-GEMM ops at 5-9 us each on the
    CPU machine (docs/cost-model.md, issue 15's evidence): sigma 0.5 in log. Around each collective
    FSDP2 runs a hook, copies and a wait, which no profile measures: sigma 1 in log (a factor e)."""
    return [Param("host.op_s", True, 1e-7, 1e-2, 0.5, "us", "time",
                  "host time to dispatch one eager op"),
            Param("host.call_s", True, 1e-7, 5e-2, 1.0, "us", "time",
                  "host time FSDP2 spends per collective of a unit (hook, copies, wait)")]


def kernel_launch_param(profile: HardwareProfile) -> Param:
    """The profiler times a 1-element add on a plain tensor; an op inside a training step also pays
    autograd, autocast and (FSDP2) DTensor dispatch: torch.profiler shows 100-400 us per optimizer
    op on DTensor parameters on one CPU thread. So the prior is loose: sigma 1 in log (a factor e)."""
    return Param("compute.kernel_launch_s", True, 1e-7, 1e-2, 1.0, "us", "time",
                 "fixed cost per kernel (launch and op dispatch)")


def select_params(profile: HardwareProfile, names: list[str] | None = None,
                  extra: list[str] | None = None) -> tuple[Param, ...]:
    """The default set, narrowed to `names` when given, plus `extra` coefficients from EXTRA."""
    base = default_params(profile)
    known = {p.name: p for p in base}
    out = list(base)
    if names:
        for n in names:
            if n not in known and n not in EXTRA:
                raise UserError(f"unknown coefficient {n!r}; expected some of "
                                f"{', '.join(list(known) + list(EXTRA))}", field="--params")
        out = [known[n] if n in known else EXTRA[n](profile) for n in names]
    for n in extra or []:
        if n not in EXTRA:
            raise UserError(f"unknown extra coefficient {n!r}; expected one of {', '.join(EXTRA)}",
                            field="--free")
        if n not in {p.name for p in out}:
            out.append(EXTRA[n](profile))
    return tuple(out)


# ---------------------------------------------------------------- reading and writing a profile

def get_value(profile: HardwareProfile, name: str) -> float:
    c, k, m = profile.compute, profile.collectives, profile.memory
    if name == "compute.efficiency_scale":
        return c.efficiency_scale
    if name.startswith("collectives.efficiency."):
        return k.efficiency.get(name.rsplit(".", 1)[1], 1.0)
    if name.startswith("collectives.extra_latency_s."):
        return k.extra_latency_s.get(name.rsplit(".", 1)[1], 0.0)
    if name == "overlap_slowdown":
        return profile.overlap_slowdown
    if name == "memory.context_bytes":
        return float(m.context_bytes)
    if name == "memory.fragmentation":
        return m.fragmentation
    if name.startswith("compute."):
        return float(getattr(c, name.split(".", 1)[1]))
    if name.startswith("host."):
        return float(getattr(profile.host, name.split(".", 1)[1]))
    raise KeyError(name)


def with_values(profile: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    """A copy of the profile with the given coefficients replaced."""
    c, k, m = profile.compute, profile.collectives, profile.memory
    eff, extra = dict(k.efficiency), dict(k.extra_latency_s)
    c_kw, m_kw, h_kw, slowdown = {}, {}, {}, profile.overlap_slowdown
    for name, x in values.items():
        if name.startswith("collectives.efficiency."):
            eff[name.rsplit(".", 1)[1]] = x
        elif name.startswith("collectives.extra_latency_s."):
            extra[name.rsplit(".", 1)[1]] = x
        elif name == "overlap_slowdown":
            slowdown = max(1.0, x)
        elif name == "memory.context_bytes":
            m_kw["context_bytes"] = int(round(x))
        elif name == "memory.fragmentation":
            m_kw["fragmentation"] = x
        elif name.startswith("compute."):
            c_kw[name.split(".", 1)[1]] = x
        elif name.startswith("host."):
            h_kw[name.split(".", 1)[1]] = x
        else:
            raise KeyError(name)
    return replace(profile, compute=replace(c, **c_kw), host=replace(profile.host, **h_kw),
                   collectives=replace(k, efficiency=eff, extra_latency_s=extra),
                   overlap_slowdown=slowdown, memory=replace(m, **m_kw))


def prior_values(profile: HardwareProfile, params: tuple[Param, ...]) -> dict[str, float]:
    """The measured value of each coefficient: the profile's own, or, for an already calibrated
    profile, the value recorded as `before` in its calibration provenance."""
    cal = (profile.provenance or {}).get("calibration") or {}
    before = {n: v.get("before") for n, v in (cal.get("coefficients") or {}).items()
              if isinstance(v, dict)}
    out = {}
    for p in params:
        b = before.get(p.name)
        x = float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) else get_value(profile, p.name)
        out[p.name] = min(max(x, p.lo), p.hi)
    return out
