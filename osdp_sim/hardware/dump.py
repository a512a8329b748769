"""Write a HardwareProfile back to the YAML schema: the exact inverse of load.profile_from_dict.

Numbers are written as the shortest decimal that converts back to the same value, so a saved
profile reads `busbw_gbps: 7.35`, not `7.3500000000000005`. Optional keys are written only when
they differ from their defaults.
"""

import os
from pathlib import Path

import yaml

from osdp_sim.hardware.load import GBPS, SCHEMA, TFLOPS, US, VERSION, GiB, MiB
from osdp_sim.fileio import write_text_atomic
from osdp_sim.hardware.profile import COLLECTIVE_OPS, CollectiveSpec, HardwareProfile, LinkSpec


def profile_to_dict(profile: HardwareProfile) -> dict:
    d, c, k, m = profile.device, profile.compute, profile.collectives, profile.memory
    out = {"schema": SCHEMA, "version": VERSION, "name": profile.name}
    if profile.description:
        out["description"] = profile.description
    out["device"] = {
        "kind": d.kind, "name": d.name, "count": d.count, "per_node": d.per_node,
        "memory_gib": _to_int_unit(d.memory_bytes, GiB),
        "usable_memory_gib": _to_int_unit(d.usable_memory_bytes, GiB),
    }
    compute = {
        "peak_tflops": {dt: _to_unit(v, TFLOPS) for dt, v in c.peak_flops.items()},
        "gemm_efficiency": {dt: [[_plain(g), _plain(f)] for g, f in curve]
                            for dt, curve in c.gemm_efficiency.items()},
        "memory_bandwidth_gbps": _to_unit(c.memory_bandwidth_bytes_per_s, GBPS),
        "bandwidth_efficiency": _plain(c.bandwidth_efficiency),
        "backward_forward_ratio": _plain(c.backward_forward_ratio),
        "kernel_launch_us": _to_unit(c.kernel_launch_s, US),
    }
    if c.efficiency_scale != 1.0:
        compute["efficiency_scale"] = _plain(c.efficiency_scale)
    if c.attention_efficiency:
        compute["attention_efficiency"] = {dt: [[_plain(k), _plain(f)] for k, f in curve]
                                           for dt, curve in c.attention_efficiency.items()}
    if c.attention_backward_ratio != 2.5:
        compute["attention_backward_ratio"] = _plain(c.attention_backward_ratio)
    if tuple(c.gemm_tile) != (1, 1):
        compute["gemm_tile"] = list(c.gemm_tile)
    out["compute"] = compute
    out["collectives"] = _collectives(k)
    out["overlap"] = {"slowdown": _plain(profile.overlap_slowdown)}
    out["memory"] = {"context_mib": _to_int_unit(m.context_bytes, MiB),
                     "fragmentation": _plain(m.fragmentation)}
    h = profile.host
    if (h.op_s, h.call_s, h.dtensor_op_s) != (0.0, 0.0, 0.0) or h.async_device != (d.kind == "cuda"):
        out["host"] = {"op_us": _to_unit(h.op_s, US), "call_us": _to_unit(h.call_s, US),
                       "dtensor_op_us": _to_unit(h.dtensor_op_s, US), "async_device": h.async_device}
    if profile.provenance:
        out["provenance"] = profile.provenance
    return out


def save_profile(profile: HardwareProfile, path: str | os.PathLike, header_comment: str = "") -> None:
    """Write the profile as YAML atomically (temporary file in the same folder, fsync, rename).
    `header_comment` (may span lines) is written as `# ` comment lines above the data."""
    path = Path(path)
    header = "".join(f"# {line}".rstrip() + "\n" for line in header_comment.splitlines())
    body = yaml.safe_dump(profile_to_dict(profile), sort_keys=False, default_flow_style=None,
                          width=100, allow_unicode=True)
    write_text_atomic(path, header + body)


def _collectives(k: CollectiveSpec) -> dict:
    out = {"launch_us": _to_unit(k.launch_s, US), "intra_node": _link(k.intra)}
    if k.inter is not None:
        out["inter_node"] = _link(k.inter)
    if any(k.efficiency.get(op, 1.0) != 1.0 for op in COLLECTIVE_OPS):
        out["efficiency"] = {op: _plain(k.efficiency.get(op, 1.0)) for op in COLLECTIVE_OPS}
    if any(k.extra_latency_s.get(op, 0.0) != 0.0 for op in COLLECTIVE_OPS):
        out["extra_latency_us"] = {op: _to_unit(k.extra_latency_s.get(op, 0.0), US)
                                   for op in COLLECTIVE_OPS}
    if k.tables:
        out["tables"] = [{"op": t.op, "group_size": t.group_size, "scope": t.scope,
                          "sizes_bytes": [int(s) for s in t.sizes_bytes],
                          "busbw_gbps": [_to_unit(b, GBPS) for b in t.busbw_bytes_per_s]}
                         for t in k.tables]
    return out


def _link(link: LinkSpec) -> dict:
    return {"latency_us": _to_unit(link.latency_s, US),
            "busbw_gbps": _to_unit(link.busbw_bytes_per_s, GBPS)}


def _to_unit(value_si: float, scale: float) -> int | float:
    """The shortest decimal x with x * scale == value_si (the loader's conversion)."""
    for digits in range(1, 18):
        x = float(f"{value_si / scale:.{digits}g}")
        if x * scale == value_si:
            return _plain(x)
    return _plain(value_si / scale)


def _to_int_unit(value_si: int, scale: int) -> int | float:
    """The shortest decimal x with round(x * scale) == value_si (bytes are whole numbers)."""
    for digits in range(1, 18):
        x = float(f"{value_si / scale:.{digits}g}")
        if int(round(x * scale)) == value_si:
            return _plain(x)
    return _plain(value_si / scale)


def _plain(x: float) -> int | float:
    """Whole numbers as ints (`24`, not `24.0`); YAML then reads them back to the same value."""
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x
