"""Read a hardware profile (YAML schema osdp-sim/hardware, version 1) into a HardwareProfile.

Every value is checked; a mistake is a UserError naming the file, the key path
(e.g. `collectives.tables[2].busbw_gbps`) and what is expected. docs/hardware-profiles.md
documents the schema key by key.
"""

import math
from pathlib import Path

import osdp_sim
from osdp_sim.errors import UserError
from osdp_sim.fileio import read_yaml
from osdp_sim.hardware.profile import (COLLECTIVE_OPS, DTYPES, SCOPES, CollectiveSpec, HostSpec,
                                       CollectiveTable, ComputeSpec, DeviceSpec, HardwareProfile,
                                       LinkSpec, MemorySpec)

SCHEMA = "osdp-sim/hardware"
VERSION = 1
DEVICE_KINDS = ("cuda", "cpu")
REQUIRED_DTYPES = ("fp32", "bf16")

GiB = 2**30
MiB = 2**20
GBPS = 1e9        # GB/s -> bytes/s
TFLOPS = 1e12     # TFLOP/s -> FLOP/s
US = 1e-6         # microseconds -> seconds

# Upper bounds far above any real device, per unit: values beyond them are almost always a unit
# slip (bytes/s written under a *_gbps key, FLOP/s under *_tflops, ns under *_us).
_PLAUSIBLE_MAX = {"GiB": 65536.0, "MiB": 65536.0 * 1024, "TFLOP/s": 1e6, "GB/s": 1e6, "us": 1e7}
# Lower bounds far below any real device (non-zero values under them are slips the other way, or
# make every prediction astronomically long): 1 MiB of memory, 1 MFLOP/s, 1 KB/s.
_PLAUSIBLE_MIN = {"GiB": 2.0**-10, "TFLOP/s": 1e-6, "GB/s": 1e-6}

# A sane collective table (docs/hardware-profiles.md, `tables`): the time factor * S / busbw of
# a size is at least TABLE_MIN_TIME_RATIO of the previous (smaller) size's: it does not decrease,
# up to the noise of a measurement where latency dominates (shipped tables: 1.01x at the least);
# and its bus bandwidth is at least TABLE_MIN_BUSBW_RATIO of the previous size's (measured
# neighbours differ by about 2x at most).
TABLE_MIN_TIME_RATIO = 0.8
MAX_DEVICES = 2**20               # a million ranks: above any machine built
MAX_MESSAGE_BYTES = 2**50         # 1 PiB in one collective
TABLE_MIN_BUSBW_RATIO = 0.1


def shipped_profiles() -> list[Path]:
    """The profiles shipped in the repository's hwprofiles/ folder, sorted by name."""
    folder = _repo_profile_dir()
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def available_profiles() -> list[Path]:
    """Profiles a bare name can resolve to: ./hwprofiles/ first (it wins on a name clash),
    then the shipped ones."""
    seen: dict[str, Path] = {}
    for folder in _search_dirs():
        for path in sorted(folder.glob("*.yaml")):
            seen.setdefault(path.stem, path)
    return sorted(seen.values(), key=lambda p: p.stem)


def resolve_profile_path(arg: str | Path) -> Path:
    """A path to an existing file, or a bare name looked up in ./hwprofiles/ and the shipped folder."""
    try:
        return _resolve_profile_path(arg)
    except OSError as e:                        # a name too long for the file system, ...
        raise UserError(f"cannot use this as a profile path or name ({e.strerror})", source=str(arg)) from None


def _resolve_profile_path(arg: str | Path) -> Path:
    path = Path(arg)
    if path.exists() and not path.is_dir():     # a file, or a device the reader then refuses
        return path
    text = str(arg)
    is_bare_name = path.name == text and path.suffix not in (".yaml", ".yml")
    if is_bare_name:
        for folder in _search_dirs():
            for suffix in (".yaml", ".yml"):
                candidate = folder / f"{text}{suffix}"
                if candidate.is_file():
                    return candidate
    if path.is_dir():
        raise UserError("is a directory, not a profile file; give a YAML file or a profile name "
                        "(`osdp-sim profiles DIR` lists the profiles in a folder)", source=str(arg))
    names = ", ".join(p.stem for p in available_profiles()) or "none found"
    what = "no hardware profile of that name" if is_bare_name else "file not found"
    raise UserError(f"{what}; give a YAML file or a profile name ({names})", source=text)


def load_profile(arg: str | Path) -> HardwareProfile:
    """Load a profile from a YAML file path or a bare name such as `titan8`."""
    path = resolve_profile_path(arg)
    return profile_from_dict(read_yaml(path, "profile"), str(path))


def profile_from_dict(data, source: str = "<profile>") -> HardwareProfile:
    """Validate a parsed profile mapping and convert it to SI units (bytes, bytes/s, FLOP/s, s)."""
    r = _Reader(source)
    top = r.mapping(data, "", required=("schema", "version", "name", "device", "compute",
                                        "collectives", "overlap", "memory"),
                    optional=("description", "provenance", "host"))
    if top["schema"] != SCHEMA:
        r.fail("schema", f"expected {SCHEMA!r}, got {top['schema']!r}; is this an osdp-sim hardware profile?")
    if isinstance(top["version"], bool) or top["version"] != VERSION:
        r.fail("version", f"unsupported version {top['version']!r}; this osdp-sim reads version {VERSION}")
    name = r.text(top["name"], "name")
    description = r.text(top.get("description", ""), "description", allow_empty=True)
    device = _device(r, top["device"])
    compute = _compute(r, top["compute"])
    collectives = _collectives(r, top["collectives"], device)
    overlap = r.mapping(top["overlap"], "overlap", required=("slowdown",))
    slowdown = r.number(overlap["slowdown"], "overlap.slowdown", lo=1.0, hi=10.0,
                        hint="1 means perfect overlap; measured values are 1.1-1.4")
    memory = _memory(r, top["memory"], device)
    host = _host(r, top.get("host"), device)
    provenance = top.get("provenance", {})
    if provenance is None:
        provenance = {}
    if not isinstance(provenance, dict):
        r.fail("provenance", f"expected a mapping (how it was measured), got {_show(provenance)}")
    return HardwareProfile(name=name, description=description, device=device, compute=compute,
                           collectives=collectives, overlap_slowdown=slowdown, memory=memory,
                           host=host, source=source, provenance=provenance)


def _device(r: "_Reader", value) -> DeviceSpec:
    d = r.mapping(value, "device", required=("kind", "name", "count", "per_node", "memory_gib",
                                             "usable_memory_gib"))
    kind = d["kind"]
    if kind not in DEVICE_KINDS:
        r.fail("device.kind", f"expected one of {', '.join(DEVICE_KINDS)}, got {_show(kind)}")
    name = r.text(d["name"], "device.name")
    count = r.integer(d["count"], "device.count", lo=1, hi=MAX_DEVICES)
    per_node = r.integer(d["per_node"], "device.per_node", lo=1, hi=MAX_DEVICES)
    if per_node > count or count % per_node:
        r.fail("device.per_node", f"device.count ({count}) must be a multiple of per_node "
               f"({per_node}); use per_node = count for one node")
    memory_gib = r.positive(d["memory_gib"], "device.memory_gib", "GiB")
    usable_gib = r.positive(d["usable_memory_gib"], "device.usable_memory_gib", "GiB")
    if usable_gib > memory_gib:
        r.fail("device.usable_memory_gib", f"usable memory ({usable_gib:g} GiB) exceeds the device's "
               f"capacity memory_gib ({memory_gib:g} GiB)")
    return DeviceSpec(kind=kind, name=name, count=count, per_node=per_node,
                      memory_bytes=int(round(memory_gib * GiB)),
                      usable_memory_bytes=int(round(usable_gib * GiB)))


def _compute(r: "_Reader", value) -> ComputeSpec:
    c = r.mapping(value, "compute", required=("peak_tflops", "gemm_efficiency", "memory_bandwidth_gbps",
                                              "bandwidth_efficiency", "backward_forward_ratio",
                                              "kernel_launch_us"),
                  optional=("efficiency_scale", "attention_efficiency", "attention_backward_ratio",
                            "gemm_tile"))
    optional_dtypes = tuple(d for d in DTYPES if d not in REQUIRED_DTYPES)
    peak = r.mapping(c["peak_tflops"], "compute.peak_tflops", required=REQUIRED_DTYPES,
                     optional=optional_dtypes)
    peak_flops = {dt: r.positive(v, f"compute.peak_tflops.{dt}", "TFLOP/s") * TFLOPS
                  for dt, v in peak.items()}
    eff = r.mapping(c["gemm_efficiency"], "compute.gemm_efficiency", required=REQUIRED_DTYPES,
                    optional=optional_dtypes)
    curves = {}
    for dt, curve in eff.items():
        path = f"compute.gemm_efficiency.{dt}"
        if dt not in peak:
            r.fail(path, f"an efficiency curve for {dt} needs compute.peak_tflops.{dt} too")
        curves[dt] = _efficiency_curve(r, curve, path)
    return ComputeSpec(
        peak_flops=peak_flops, gemm_efficiency=curves,
        memory_bandwidth_bytes_per_s=r.positive(c["memory_bandwidth_gbps"], "compute.memory_bandwidth_gbps",
                                                "GB/s") * GBPS,
        bandwidth_efficiency=r.fraction(c["bandwidth_efficiency"], "compute.bandwidth_efficiency"),
        backward_forward_ratio=r.number(c["backward_forward_ratio"], "compute.backward_forward_ratio",
                                        lo=0.1, hi=10.0, hint="2 for the 6*P*tokens rule"),
        kernel_launch_s=r.nonnegative(c["kernel_launch_us"], "compute.kernel_launch_us", "us") * US,
        efficiency_scale=r.multiplier(c.get("efficiency_scale", 1.0), "compute.efficiency_scale"),
        attention_efficiency=_attention_curves(r, c.get("attention_efficiency"), peak_flops),
        attention_backward_ratio=r.number(c.get("attention_backward_ratio", 2.5),
                                          "compute.attention_backward_ratio", lo=0.5, hi=10.0,
                                          hint="2.5 for FlashAttention-2's 5 backward matmuls against 2"),
        gemm_tile=_tile(r, c.get("gemm_tile", [1, 1])))


def _attention_curves(r: "_Reader", value, peak_flops: dict) -> dict:
    if value is None:
        return {}
    eff = r.mapping(value, "compute.attention_efficiency", optional=DTYPES)
    out = {}
    for dt, curve in eff.items():
        path = f"compute.attention_efficiency.{dt}"
        if dt not in peak_flops:
            r.fail(path, f"an attention curve for {dt} needs compute.peak_tflops.{dt} too")
        pts = _efficiency_curve(r, curve, path, "attended keys", "keys", "key counts")
        out[dt] = pts
    return out


def _tile(r: "_Reader", value) -> tuple[int, int]:
    pair = r.sequence(value, "compute.gemm_tile", hint="[tile rows, tile columns], e.g. [128, 128]")
    if len(pair) != 2:
        r.fail("compute.gemm_tile", f"expected [tile rows, tile columns], got {_show(value)}")
    return (r.integer(pair[0], "compute.gemm_tile[0]", lo=1, hi=4096),
            r.integer(pair[1], "compute.gemm_tile[1]", lo=1, hi=4096))


def _host(r: "_Reader", value, device: DeviceSpec) -> HostSpec:
    """The optional `host` section; absent, a host that costs nothing (the device's own terms
    then carry the overheads, as in profiles written before it existed)."""
    default_async = device.kind == "cuda"
    if value is None:
        return HostSpec(async_device=default_async)
    h = r.mapping(value, "host", optional=("op_us", "call_us", "dtensor_op_us", "async_device"))
    asynchronous = h.get("async_device", default_async)
    if not isinstance(asynchronous, bool):
        r.fail("host.async_device", f"expected true or false, got {_show(asynchronous)}")
    return HostSpec(op_s=r.nonnegative(h.get("op_us", 0.0), "host.op_us", "us") * US,
                    call_s=r.nonnegative(h.get("call_us", 0.0), "host.call_us", "us") * US,
                    dtensor_op_s=r.nonnegative(h.get("dtensor_op_us", 0.0), "host.dtensor_op_us", "us") * US,
                    async_device=asynchronous)


def _efficiency_curve(r: "_Reader", value, path: str, x_name: str = "GEMM GFLOP", x_unit: str = "GFLOP",
                      x_plural: str = "GEMM sizes") -> tuple[tuple[float, float], ...]:
    """[[x, fraction of peak], ...] with x > 0 strictly increasing and fractions in (0, 1]."""
    pairs = r.sequence(value, path, hint=f"[[{x_name}, fraction of peak], ...]", nonempty=True)
    out: list[tuple[float, float]] = []
    for i, pair in enumerate(pairs):
        p = f"{path}[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            r.fail(p, f"expected a pair [{x_name}, fraction of peak], got {_show(pair)}")
        x = r.positive(pair[0], f"{p}[0]", x_unit)
        frac = r.fraction(pair[1], f"{p}[1]")
        if out and x <= out[-1][0]:
            r.fail(f"{p}[0]", f"{x_plural} must be strictly increasing; {x:g} follows {out[-1][0]:g}")
        out.append((x, frac))
    return tuple(out)


def _collectives(r: "_Reader", value, device: DeviceSpec) -> CollectiveSpec:
    c = r.mapping(value, "collectives", required=("launch_us", "intra_node"),
                  optional=("inter_node", "efficiency", "extra_latency_us", "tables"))
    if device.count > device.per_node and c.get("inter_node") is None:
        r.fail("collectives.inter_node", f"required: device.count ({device.count}) spans "
               f"{device.nodes} nodes of {device.per_node}; give {{latency_us, busbw_gbps}} of the "
               "network between nodes")
    inter = c.get("inter_node")
    efficiency = _per_op(r, c.get("efficiency"), "collectives.efficiency", default=1.0)
    extra_us = _per_op(r, c.get("extra_latency_us"), "collectives.extra_latency_us", default=0.0, unit="us")
    tables = c.get("tables")
    return CollectiveSpec(
        intra=_link(r, c["intra_node"], "collectives.intra_node"),
        inter=None if inter is None else _link(r, inter, "collectives.inter_node"),
        launch_s=r.nonnegative(c["launch_us"], "collectives.launch_us", "us") * US,
        tables=() if tables is None else _tables(r, tables, device),
        efficiency=efficiency,
        extra_latency_s={op: v * US for op, v in extra_us.items()})


def _link(r: "_Reader", value, path: str) -> LinkSpec:
    m = r.mapping(value, path, required=("latency_us", "busbw_gbps"))
    return LinkSpec(latency_s=r.nonnegative(m["latency_us"], f"{path}.latency_us", "us") * US,
                    busbw_bytes_per_s=r.positive(m["busbw_gbps"], f"{path}.busbw_gbps", "GB/s") * GBPS)


def _per_op(r: "_Reader", value, path: str, *, default: float, unit: str = "") -> dict[str, float]:
    """efficiency (positive multipliers) or extra_latency_us (>= 0); absent ops keep the default."""
    out = {op: default for op in COLLECTIVE_OPS}
    if value is None:
        return out
    for op, v in r.mapping(value, path, optional=COLLECTIVE_OPS).items():
        out[op] = r.nonnegative(v, f"{path}.{op}", unit) if unit else r.multiplier(v, f"{path}.{op}")
    return out


def _tables(r: "_Reader", value, device: DeviceSpec) -> tuple[CollectiveTable, ...]:
    items = r.sequence(value, "collectives.tables",
                       hint="a list of {op, group_size, scope, sizes_bytes, busbw_gbps}")
    seen: dict[tuple, int] = {}
    out = []
    for i, item in enumerate(items):
        path = f"collectives.tables[{i}]"
        t = r.mapping(item, path, required=("op", "group_size", "scope", "sizes_bytes", "busbw_gbps"))
        op, scope = t["op"], t["scope"]
        if op not in COLLECTIVE_OPS:
            r.fail(f"{path}.op", f"expected one of {', '.join(COLLECTIVE_OPS)}, got {_show(op)}")
        if scope not in SCOPES:
            r.fail(f"{path}.scope", f"expected one of {', '.join(SCOPES)}, got {_show(scope)}")
        group = r.integer(t["group_size"], f"{path}.group_size", lo=2)
        _check_group(r, path, group, scope, device)
        if (op, group, scope) in seen:
            r.fail(path, f"duplicate table for {op}, group_size {group}, scope {scope} "
                   f"(also collectives.tables[{seen[op, group, scope]}])")
        seen[op, group, scope] = i
        sizes_raw = r.sequence(t["sizes_bytes"], f"{path}.sizes_bytes", hint="message sizes in bytes",
                               nonempty=True)
        sizes = [r.integer(s, f"{path}.sizes_bytes[{j}]", lo=1, hi=MAX_MESSAGE_BYTES, unit="bytes")
                 for j, s in enumerate(sizes_raw)]
        for j in range(1, len(sizes)):
            if sizes[j] <= sizes[j - 1]:
                r.fail(f"{path}.sizes_bytes[{j}]", f"sizes must be strictly increasing; {sizes[j]} "
                       f"follows {sizes[j - 1]}")
        bw_raw = r.sequence(t["busbw_gbps"], f"{path}.busbw_gbps", hint="bus bandwidths in GB/s",
                            nonempty=True)
        if len(bw_raw) != len(sizes):
            r.fail(f"{path}.busbw_gbps", f"has {len(bw_raw)} values but sizes_bytes has {len(sizes)}; "
                   "give one bus bandwidth per message size")
        bw = [r.positive(b, f"{path}.busbw_gbps[{j}]", "GB/s") * GBPS for j, b in enumerate(bw_raw)]
        _check_table_shape(r, path, sizes, bw)
        out.append(CollectiveTable(op=op, group_size=group, scope=scope, sizes_bytes=tuple(sizes),
                                   busbw_bytes_per_s=tuple(bw)))
    return tuple(out)


def _check_table_shape(r: "_Reader", path: str, sizes: list[int], bw: list[float]) -> None:
    """Neighbouring sizes: a bigger message never takes clearly less time (busbw grows at most
    about as fast as the size), and the bus bandwidth never collapses by an order of magnitude."""
    for j in range(1, len(sizes)):
        here, prev = bw[j] / GBPS, bw[j - 1] / GBPS
        if here < prev * TABLE_MIN_BUSBW_RATIO:
            r.fail(f"{path}.busbw_gbps[{j}]", f"bus bandwidth collapses from {prev:g} GB/s at "
                   f"{sizes[j - 1]} bytes to {here:g} GB/s at {sizes[j]} bytes (less than "
                   f"{TABLE_MIN_BUSBW_RATIO:g}x); a measurement glitch? remeasure or drop the row")
        if sizes[j] / bw[j] < TABLE_MIN_TIME_RATIO * sizes[j - 1] / bw[j - 1]:
            r.fail(f"{path}.busbw_gbps[{j}]", f"{sizes[j]} bytes at {here:g} GB/s would take less "
                   f"than {TABLE_MIN_TIME_RATIO:g}x the time of {sizes[j - 1]} bytes at {prev:g} GB/s; "
                   "the time of a collective cannot decrease with its size")


def _check_group(r: "_Reader", path: str, group: int, scope: str, device: DeviceSpec) -> None:
    """intra: the group fits in one node. inter: the group spans nodes, which needs more than one
    node; it may be small (a hybrid-shard replica group has one rank per node)."""
    if group > device.count:
        r.fail(f"{path}.group_size", f"group of {group} is larger than device.count ({device.count})")
    if scope == "intra" and group > device.per_node:
        r.fail(f"{path}.scope", f"a group of {group} cannot fit in one node of {device.per_node} "
               "devices; use scope inter")
    if scope == "replica" and group > device.count // device.per_node:
        r.fail(f"{path}.group_size", f"a replica group has one rank per node: at most "
               f"{device.count // device.per_node} nodes, got {group}")
    if scope in ("inter", "replica") and device.count <= device.per_node:
        r.fail(f"{path}.scope", f"scope {scope} needs more than one node, but all {device.count} "
               "devices are in one node (device.per_node); use scope intra")


def _memory(r: "_Reader", value, device: DeviceSpec) -> MemorySpec:
    m = r.mapping(value, "memory", required=("context_mib", "fragmentation"))
    context_mib = r.nonnegative(m["context_mib"], "memory.context_mib", "MiB")
    context_bytes = int(round(context_mib * MiB))
    # The bound calibration fits the context within (calibrate/params.py), and room for tensors.
    if context_bytes > device.memory_bytes / 2 or context_bytes >= device.usable_memory_bytes:
        r.fail("memory.context_mib", f"{context_mib:g} MiB leaves no room for tensors: it must be at "
               f"most half of device.memory_gib ({device.memory_bytes / MiB / 2:g} MiB) and below "
               f"device.usable_memory_gib ({device.usable_memory_bytes / MiB:g} MiB)")
    frag = r.number(m["fragmentation"], "memory.fragmentation", lo=0.0, hi=1.0, hi_open=True)
    return MemorySpec(context_bytes=context_bytes, fragmentation=frag)


class _Reader:
    """Type and range checks that raise a UserError naming the file and the key path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, message: str):
        raise UserError(message, source=self.source, field=path or None)

    def mapping(self, value, path: str, *, required=(), optional=()) -> dict:
        if not isinstance(value, dict):
            what = (f"a mapping with keys {', '.join(required + optional)}" if path
                    else "a mapping (an osdp-sim hardware profile)")
            self.fail(path, f"expected {what}, got {_show(value)}")
        for key in value:
            if key not in required and key not in optional:
                known = ", ".join(required + optional)
                self.fail(_join(path, str(key)), f"unknown key; expected one of {known}")
        for key in required:
            if key not in value:
                self.fail(_join(path, key), "missing required key")
        return value

    def sequence(self, value, path: str, *, hint: str, nonempty: bool = False) -> list:
        if not isinstance(value, list):
            self.fail(path, f"expected a list ({hint}), got {_show(value)}")
        if nonempty and not value:
            self.fail(path, f"expected a non-empty list ({hint})")
        return value

    def text(self, value, path: str, *, allow_empty: bool = False) -> str:
        if not isinstance(value, str) or (not allow_empty and not value.strip()):
            self.fail(path, f"expected a non-empty text, got {_show(value)}")
        return value

    def number(self, value, path: str, *, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False, hi_open: bool = False, unit: str = "", hint: str = "") -> float:
        """A finite number in [lo, hi] (open ends as asked); implausibly large for its unit is a slip."""
        in_unit = f" in {unit}" if unit else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            extra = "; write the number only, the unit is in the key name" if isinstance(value, str) else ""
            self.fail(path, f"expected a number{in_unit}, got {_show(value)}{extra}")
        x = float(value)
        if not math.isfinite(x):
            self.fail(path, f"expected a finite number{in_unit}, got {_show(value)}")
        below = lo is not None and (x <= lo if lo_open else x < lo)
        above = hi is not None and (x >= hi if hi_open else x > hi)
        if below or above:
            self.fail(path, f"expected {_range(lo, hi, lo_open, hi_open)}{in_unit}, got {_show(value)}"
                      + (f"; {hint}" if hint else ""))
        plausible_max = _PLAUSIBLE_MAX.get(unit)
        if plausible_max is not None and x > plausible_max:
            self.fail(path, f"{_show(value)} is implausibly large for a value{in_unit} "
                      f"(more than {plausible_max:g}); check the unit")
        plausible_min = _PLAUSIBLE_MIN.get(unit)
        if plausible_min is not None and 0 < x < plausible_min:
            self.fail(path, f"{_show(value)} is implausibly small for a value{in_unit} "
                      f"(less than {plausible_min:g}); check the unit")
        return x

    def positive(self, value, path: str, unit: str = "") -> float:
        return self.number(value, path, lo=0.0, lo_open=True, unit=unit)

    def nonnegative(self, value, path: str, unit: str = "") -> float:
        return self.number(value, path, lo=0.0, unit=unit)

    def fraction(self, value, path: str) -> float:
        x = self.number(value, path, lo=0.0, lo_open=True, hi=1.0)
        if x < 1e-4:
            self.fail(path, f"{_show(value)} is implausibly small for a fraction of peak (less than 1e-4)")
        return x

    def multiplier(self, value, path: str) -> float:
        """A calibration multiplier: within two orders of magnitude of 1."""
        return self.number(value, path, lo=0.01, hi=100.0, hint="a multiplier near 1")

    def integer(self, value, path: str, *, lo: int, hi: int | None = None, unit: str = "") -> int:
        in_unit = f" of {unit}" if unit else ""
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected a whole number{in_unit} >= {lo}, got {_show(value)}")
        if value < lo:
            self.fail(path, f"expected a whole number{in_unit} >= {lo}, got {value}")
        if hi is not None and value > hi:
            self.fail(path, f"{_show(value)} is implausibly large (more than {hi}){in_unit}")
        return value


def _range(lo, hi, lo_open, hi_open) -> str:
    if lo is not None and hi is not None:
        return f"a number in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"a number {'>' if lo_open else '>='} {_num(lo)}"
    return f"a number {'<' if hi_open else '<='} {_num(hi)}"


def _num(x: float) -> str:
    return f"{x:g}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _search_dirs() -> list[Path]:
    dirs = []
    for folder in (Path("hwprofiles"), _repo_profile_dir()):
        if folder.is_dir() and all(folder.resolve() != d.resolve() for d in dirs):
            dirs.append(folder)
    return dirs


def _repo_profile_dir() -> Path:
    return Path(osdp_sim.__file__).resolve().parents[1] / "hwprofiles"
