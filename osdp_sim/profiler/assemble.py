"""Measurements -> HardwareProfile, with the provenance that says how each number was obtained."""

import math

from osdp_sim.hardware.load import TABLE_MIN_BUSBW_RATIO
from osdp_sim.hardware.profile import (CollectiveSpec, CollectiveTable, ComputeSpec, DeviceSpec,
                                       HardwareProfile, HostSpec, LinkSpec, MemorySpec)
from osdp_sim.profiler.collectives import CollectivePoint, busbw_factor, fit_alpha_beta
from osdp_sim.profiler.gemm import best_rate, efficiency_curve
from osdp_sim.profiler.measurements import Measurements

# Not measured here: the CPU runtime measures tracked tensor bytes (no allocator margin); on a GPU
# the caching allocator needs a margin, which calibration refines.
DEFAULT_FRAGMENTATION = {"cpu": 0.0, "cuda": 0.05}
# Not measured by profile-hw: FSDP2's host work per collective (pytorch/pytorch PR 133369: 0.37-0.46
# ms of CPU per all-gather on a GPU host; issue 173680: ~1 ms per pre_forward) and one
# optimizer op on a DTensor (bench/host_costs.py on this project's CPU machine).
DEFAULT_CALL_S = {"cuda": 400e-6, "cpu": 1e-3}
DEFAULT_DTENSOR_OP_S = 9.6e-6


def sig(x: float, digits: int = 4) -> float:
    """Round to significant digits: measurement noise is far above the fifth digit."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def monotone_seconds(seconds: list[float]) -> list[float]:
    """Times over increasing message sizes made non-decreasing: a smaller message cannot take
    longer than a larger one, so where it was measured so (a scheduling hiccup inflates a short
    call; the loader refuses such a table) it gets the larger one's time."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def kept_rows(busbw: list[float]) -> list[int]:
    """The indices of the rows of a table to keep: every row but those whose bus bandwidth still
    collapses below TABLE_MIN_BUSBW_RATIO of the last kept row's after the sweep measured it again
    (the loader refuses such a table). A lone glitch drops only its own size (the cost model
    interpolates over it); a real cliff drops every size above it. The kept times stay
    non-decreasing: monotone_seconds ran first."""
    kept = [0] if busbw else []
    for j in range(1, len(busbw)):
        if busbw[j] >= TABLE_MIN_BUSBW_RATIO * busbw[kept[-1]]:
            kept.append(j)
    return kept


def _tables(points: tuple[CollectivePoint, ...]) -> tuple[tuple[CollectiveTable, ...], dict]:
    """The tables, and 'op/group_size/scope' -> the message sizes dropped from each (kept_rows)."""
    keyed: dict[tuple, list[CollectivePoint]] = {}
    for p in points:
        keyed.setdefault((p.op, p.group_size, p.scope), []).append(p)
    tables, dropped = [], {}
    for (op, g, scope), ps in sorted(keyed.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ps = sorted(ps, key=lambda p: p.size_bytes)
        seconds = monotone_seconds([p.seconds for p in ps])
        busbw = [sig(busbw_factor(op, g) * p.size_bytes / s) for p, s in zip(ps, seconds)]
        keep = kept_rows(busbw)
        if len(keep) < len(ps):
            dropped[f"{op}/{g}/{scope}"] = [p.size_bytes for j, p in enumerate(ps) if j not in keep]
        tables.append(CollectiveTable(op=op, group_size=g, scope=scope,
                                      sizes_bytes=tuple(ps[j].size_bytes for j in keep),
                                      busbw_bytes_per_s=tuple(busbw[j] for j in keep)))
    return tuple(tables), dropped


def _table_spreads(points: tuple[CollectivePoint, ...]) -> dict:
    """'op/group_size' -> spreads in message-size order (the tables' order)."""
    out: dict[str, list[float]] = {}
    for p in sorted(points, key=lambda p: (p.op, p.group_size, p.size_bytes)):
        out.setdefault(f"{p.op}/{p.group_size}", []).append(sig(p.spread, 2))
    return out


def _raw_busbw(points: tuple[CollectivePoint, ...]) -> dict:
    """'op/group_size' -> busbw (GB/s) of the raw median times, in message-size order."""
    out: dict[str, list[float]] = {}
    for p in sorted(points, key=lambda p: (p.op, p.group_size, p.size_bytes)):
        out.setdefault(f"{p.op}/{p.group_size}", []).append(sig(p.busbw_bytes_per_s / 1e9))
    return out


def _link(points: list[CollectivePoint]) -> tuple[LinkSpec | None, dict]:
    if not points:
        return None, {}
    fit = fit_alpha_beta(points)
    return (LinkSpec(latency_s=sig(fit.latency_s), busbw_bytes_per_s=sig(fit.busbw_bytes_per_s)),
            {"latency_us": sig(fit.latency_s * 1e6), "busbw_gbps": sig(fit.busbw_bytes_per_s / 1e9),
             "max_relative_error": sig(fit.max_relative_error, 3), "points": len(points)})


def build_profile(m: Measurements, *, name: str, dtypes: tuple[str, ...], nominal_peak_tflops: dict,
                  nominal_bandwidth_gbps: float | None, command: str, date: str, host: dict) -> HardwareProfile:
    peaks, curves, gemm_prov = {}, {}, {}
    for dtype in dtypes:
        points = [p for p in m.gemm if p.dtype == dtype]
        best = best_rate(points)
        peak = nominal_peak_tflops[dtype] * 1e12 if dtype in nominal_peak_tflops else best
        peaks[dtype] = sig(peak)
        curves[dtype] = tuple((g, sig(f, 3)) for g, f in efficiency_curve(points, peak))
        gemm_prov[dtype] = {
            "best_gflops": sig(best / 1e9),
            "peak_source": "nominal (--peak-tflops)" if dtype in nominal_peak_tflops else "best measured GEMM rate",
            "points_m_n_k_gflops_spread": [[p.m, p.n, p.k, sig(p.flops_per_s / 1e9), sig(p.spread, 2)]
                                           for p in points]}

    bw = m.bandwidth
    if nominal_bandwidth_gbps:
        bandwidth_bytes_per_s = nominal_bandwidth_gbps * 1e9
        bandwidth_eff = sig(min(1.0, bw.add_bytes_per_s / bandwidth_bytes_per_s), 3)
    else:
        bandwidth_bytes_per_s, bandwidth_eff = sig(bw.add_bytes_per_s), 1.0

    tables, dropped = _tables(m.collectives)
    intra_points = [p for p in m.collectives if p.scope == "intra"]
    inter_points = [p for p in m.collectives if p.scope == "inter"]
    intra, intra_prov = _link(intra_points)
    inter, inter_prov = _link(inter_points)

    capacity = m.memory.capacity_bytes
    usable = max(1, capacity - m.memory.baseline_bytes)
    ov = m.overlap
    kind_words = f"{m.threads_per_rank}-thread CPU rank" if m.kind == "cpu" else m.device_name
    backend = "gloo" if m.kind == "cpu" else "nccl"

    provenance = {
        "tool": "osdp-sim profile-hw", "command": command, "date": date, "host": host,
        "ranks": m.world, "ranks_per_node": m.per_node, "threads_per_rank": m.threads_per_rank,
        "backend": backend, "measuring_s": sig(m.wall_s, 3),
        "method": "warm-up, then repeated samples; the median is kept; spread = IQR / median of the "
                  "samples (largest over ranks); times are medians over ranks; all ranks measure at once",
        "gemm": gemm_prov,
        "memory_bandwidth": {
            "tensor_bytes": bw.tensor_bytes, "add_gbps": sig(bw.add_bytes_per_s / 1e9),
            "add_spread": sig(bw.add_spread, 2), "copy_gbps": sig(bw.copy_bytes_per_s / 1e9),
            "copy_spread": sig(bw.copy_spread, 2),
            "source": (f"nominal {nominal_bandwidth_gbps} GB/s, efficiency = measured add / nominal"
                       if nominal_bandwidth_gbps else "measured fp32 add c = a + b (3 x bytes moved), efficiency 1")},
        "kernel_launch": {"us": sig(m.kernel_launch.seconds * 1e6), "spread": sig(m.kernel_launch.spread, 2),
                          "op": "1-element in-place add, back to back"},
        "block": {"dtype": m.block.dtype, "hidden": m.block.hidden, "heads": m.block.heads,
                  "seq": m.block.seq, "batch": m.block.batch,
                  "forward_ms": sig(m.block.forward_s * 1e3), "forward_spread": sig(m.block.forward_spread, 2),
                  "backward_ms": sig(m.block.backward_s * 1e3), "backward_spread": sig(m.block.backward_spread, 2)},
        "collectives": {
            "buffers": "fp32; message size = full buffer S; busbw = factor * S / t",
            "one_element_call_us": {op: sig(s * 1e6) for op, s in m.collective_launch_s.items()},
            "launch_us": "0: the tables and the fitted latency are whole-call times through "
                         "torch.distributed, so the per-call cost is already inside them",
            "intra_fit": intra_prov, **({"inter_fit": inter_prov} if inter_prov else {}),
            "fit_method": "t = latency + factor * S / busbw, least squares in relative error over all "
                          "ops and group sizes of the scope",
            "spread_per_table": _table_spreads(m.collectives),
            "table_times": "each table's median times made non-decreasing in message size (a smaller "
                           "message is given a larger one's time where it measured slower); the raw "
                           "medians' busbw is raw_busbw_gbps_per_table",
            "raw_busbw_gbps_per_table": _raw_busbw(m.collectives),
            **({"dropped_sizes_per_table": dropped,
                "dropped_why": f"bus bandwidth still below {TABLE_MIN_BUSBW_RATIO:g}x the previous "
                               f"size's after measuring again: a burst of other work on the host"}
               if dropped else {})},
        "overlap": {"gemm": f"{ov.gemm_calls} x {ov.gemm_dim}^3 {ov.gemm_dtype}",
                    "all_reduce_bytes": ov.message_bytes, "group_size": ov.group_size,
                    "compute_alone_ms": sig(ov.compute_alone_s * 1e3),
                    "compute_overlapped_ms": sig(ov.compute_overlapped_s * 1e3),
                    "comm_alone_ms": sig(ov.comm_alone_s * 1e3),
                    "comm_overlapped_ms": sig(ov.comm_overlapped_s * 1e3),
                    "compute_slowdown": sig(ov.compute_slowdown, 3), "comm_slowdown": sig(ov.comm_slowdown, 3),
                    "compute_spread": sig(ov.compute_spread, 2), "comm_spread": sig(ov.comm_spread, 2)},
        "memory": {"basis": m.memory.basis, "capacity_bytes": capacity,
                   "baseline_bytes": m.memory.baseline_bytes,
                   "fragmentation": "not measured: default for the device kind"},
    }

    return HardwareProfile(
        name=name,
        description=(f"{m.world} x {kind_words} ({m.device_name}), {backend}; measured by "
                     f"osdp-sim profile-hw on {date}"),
        device=DeviceSpec(kind=m.kind, name=m.device_name, count=m.world, per_node=m.per_node,
                          memory_bytes=capacity, usable_memory_bytes=usable),
        compute=ComputeSpec(peak_flops=peaks, gemm_efficiency=curves,
                            memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                            bandwidth_efficiency=bandwidth_eff,
                            backward_forward_ratio=sig(m.block.ratio, 3),
                            # on a CPU the measured per-op cost is the host's (below)
                            kernel_launch_s=sig(m.kernel_launch.seconds) if m.kind == "cuda" else 0.0),
        collectives=CollectiveSpec(intra=intra, inter=inter, launch_s=0.0,
                                   tables=tables),
        overlap_slowdown=sig(ov.slowdown, 3),
        memory=MemorySpec(context_bytes=0, fragmentation=DEFAULT_FRAGMENTATION.get(m.kind, 0.05)),
        # the 1-element op's time is the host's dispatch of one op; per-collective and DTensor-op costs
        # are the documented defaults (docs/cost-model.md, "Host"), fitted by calibrate
        host=HostSpec(op_s=sig(m.kernel_launch.seconds), call_s=DEFAULT_CALL_S[m.kind],
                      dtensor_op_s=DEFAULT_DTENSOR_OP_S, async_device=m.kind == "cuda"),
        provenance=provenance,
    )
