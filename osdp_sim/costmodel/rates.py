"""Time of one kernel or one collective on a hardware profile (pure functions).

Compute: roofline with a size-dependent GEMM efficiency (Calculon-style table), t = F / (peak * eff(F)).
Collectives: nccl-tests conventions; t = launch + extra latency + factor * S / busbw(S), with busbw
interpolated in log(S) from measured tables, else an alpha-beta line (latency + factor * S / busbw).
"""

import bisect
import math

from osdp_sim.hardware.profile import CollectiveTable, HardwareProfile


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw: all_reduce 2(n-1)/n; all_gather and reduce_scatter (n-1)/n."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    return (n - 1) / n


def interp_log(points: tuple[tuple[float, float], ...] | list, x: float) -> float:
    """Linear interpolation of y over log(x), clamped at both ends."""
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)


def gemm_efficiency(hw: HardwareProfile, flops: float, dtype: str) -> float:
    curve = hw.compute.gemm_efficiency[dtype]
    return min(1.0, interp_log(curve, max(flops, 1.0) / 1e9) * hw.compute.efficiency_scale)


def gemm_time_s(hw: HardwareProfile, flops: float, dtype: str) -> float:
    """One matrix multiply of `flops` FLOPs: F / (peak * efficiency(F)) + one kernel launch."""
    if flops <= 0:
        return 0.0
    peak = hw.compute.peak_flops[dtype]
    return flops / (peak * gemm_efficiency(hw, flops, dtype)) + hw.compute.kernel_launch_s


def bandwidth_time_s(hw: HardwareProfile, bytes_moved: float, kernels: int = 0) -> float:
    """Bandwidth-bound (elementwise) work: bytes / (memory bandwidth * efficiency) + launches."""
    c = hw.compute
    return bytes_moved / (c.memory_bandwidth_bytes_per_s * c.bandwidth_efficiency) + kernels * c.kernel_launch_s


def _table_for(hw: HardwareProfile, op: str, n: int, scope: str) -> CollectiveTable | None:
    """The measured table for (op, scope) at group size n, else the nearest group size."""
    tables = [t for t in hw.collectives.tables if t.op == op and t.scope == scope]
    if not tables:
        return None
    return min(tables, key=lambda t: (abs(math.log(t.group_size) - math.log(n)), t.group_size))


def has_table(hw: HardwareProfile, op: str, scope: str) -> bool:
    """Whether the profile measured `op` for groups of this scope (any group size)."""
    return any(t.op == op and t.scope == scope for t in hw.collectives.tables)


def busbw_bytes_per_s(hw: HardwareProfile, op: str, message_bytes: float, n: int, scope: str) -> float:
    table = _table_for(hw, op, n, scope)
    if table is not None:
        pts = tuple(zip(table.sizes_bytes, table.busbw_bytes_per_s))
        return interp_log(pts, message_bytes)
    link = hw.collectives.inter if scope == "inter" and hw.collectives.inter else hw.collectives.intra
    return link.busbw_bytes_per_s


def collective_time_s(hw: HardwareProfile, op: str, message_bytes: float, n: int, scope: str = "intra",
                      concurrent: int = 1) -> float:
    """Time of one collective over n ranks; message_bytes is the full (unsharded) buffer S.
    `concurrent` groups running the same collective at once share the link (e.g. the hybrid-shard
    replica all-reduces of every local rank crossing one node's network card): bandwidth / concurrent."""
    if n <= 1 or message_bytes <= 0:
        return 0.0
    col = hw.collectives
    factor = bus_factor(op, n) * concurrent
    eff = col.efficiency.get(op, 1.0)
    base = col.launch_s + col.extra_latency_s.get(op, 0.0)
    if _table_for(hw, op, n, scope) is not None:
        return base + factor * message_bytes / (busbw_bytes_per_s(hw, op, message_bytes, n, scope) * eff)
    link = col.inter if scope == "inter" and col.inter else col.intra
    return base + link.latency_s + factor * message_bytes / (link.busbw_bytes_per_s * eff)


# ---------------------------------------------------------------- compute kernels by shape

def _tile_fill(hw: HardwareProfile, m: float, n: float) -> float:
    """Fraction of the launched output tiles that hold output (tile quantisation): an M x N output
    runs ceil(M / tm) x ceil(N / tn) tiles of tm x tn."""
    tm, tn = hw.compute.gemm_tile
    if tm <= 1 and tn <= 1:
        return 1.0
    return (m * n) / (math.ceil(m / tm) * tm * math.ceil(n / tn) * tn)


def gemm_shape_time_s(hw: HardwareProfile, m: float, n: float, k: float, dtype: str, cb: int) -> float:
    """One GEMM of output M x N over K: the larger of its compute time, 2MNK / (peak x eff(2MNK)
    x tile fill), and its memory time, (MK + KN + MN) x cb / achieved bandwidth; plus one launch."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    c = hw.compute
    compute_s = flops / (c.peak_flops[dtype] * gemm_efficiency(hw, flops, dtype) * _tile_fill(hw, m, n))
    memory_s = (m * k + k * n + m * n) * cb / (c.memory_bandwidth_bytes_per_s * c.bandwidth_efficiency)
    return max(compute_s, memory_s) + c.kernel_launch_s


def attention_time_s(hw: HardwareProfile, flops: float, keys: int, bytes_moved: float, dtype: str) -> float:
    """The fused attention kernel's forward: its executed FLOPs at the profile's attention
    efficiency for this many attended keys x efficiency_scale (else the GEMM curve at those FLOPs), or its memory
    time if larger; plus one launch. Backward = attention_backward_ratio x this."""
    if flops <= 0:
        return 0.0
    c = hw.compute
    curve = c.attention_efficiency.get(dtype)
    # efficiency_scale is the tensor cores' achieved fraction of the benchmark kernels in a
    # training step: it scales the attention kernel's figure as it does the GEMM curve
    eff = min(1.0, interp_log(curve, keys) * c.efficiency_scale) if curve else gemm_efficiency(hw, flops, dtype)
    compute_s = flops / (c.peak_flops[dtype] * eff)
    memory_s = bytes_moved / (c.memory_bandwidth_bytes_per_s * c.bandwidth_efficiency)
    return max(compute_s, memory_s) + c.kernel_launch_s


def task_time_s(hw: HardwareProfile, device_s: float, host_s: float) -> float:
    """A compute task's duration: the device's work and the host's dispatch of it overlap on an
    asynchronous device (a GPU: the slower one bounds), and add on a CPU."""
    return max(device_s, host_s) if hw.host.async_device else device_s + host_s
