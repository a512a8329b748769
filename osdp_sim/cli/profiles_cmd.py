"""`osdp-sim profiles [NAME_OR_PATH]`: list the hardware profiles (of a folder, if one is given),
or check and summarise one."""

import sys
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.hardware.load import available_profiles, load_profile
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.units import format_bytes, format_seconds

HELP = ("list hardware profiles (those of a folder, if given), or validate and summarise one "
        "(a name such as titan8, or a YAML file)")


def add_arguments(parser) -> None:
    parser.add_argument("profile", nargs="?", metavar="NAME_OR_PATH",
                        help="a profile name from the list or a YAML file; a folder lists and checks "
                        "the *.yaml profiles in it; omit to list the known ones")


def run(args) -> int:
    if args.profile and _is_dir(args.profile):
        folder = Path(args.profile)
        paths = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not paths:
            raise UserError("is a directory with no profile files (*.yaml, *.yml) in it", source=str(folder))
        return _list(paths)
    if args.profile:
        print(summary(load_profile(args.profile)))
        return 0
    paths = available_profiles()
    if not paths:
        print("no hardware profiles found (looked in ./hwprofiles/ and the shipped hwprofiles/)")
        return 0
    return _list(paths)


def _is_dir(arg: str) -> bool:
    try:
        return Path(arg).is_dir()
    except OSError:                 # a name too long for the file system: load_profile says so
        return False


def _list(paths) -> int:
    rows = [("name", "devices", "memory/device", "bf16 TFLOP/s", "intra busbw GB/s", "inter busbw GB/s")]
    failed = 0
    for path in paths:
        try:
            hw = load_profile(path)
        except UserError as e:
            print(f"osdp-sim profiles: error: {e}", file=sys.stderr)
            failed += 1
            continue
        rows.append((path.stem, _devices(hw), format_bytes(hw.device.memory_bytes),
                     f"{hw.compute.peak_flops['bf16'] / 1e12:g}",
                     f"{hw.collectives.intra.busbw_bytes_per_s / 1e9:g}",
                     f"{hw.collectives.inter.busbw_bytes_per_s / 1e9:g}" if hw.collectives.inter else "-"))
    print(_table(rows))
    return 2 if failed else 0


def summary(hw: HardwareProfile) -> str:
    d, c, k = hw.device, hw.compute, hw.collectives
    lines = [f"{hw.name}: {hw.description}" if hw.description else hw.name,
             f"  file            {hw.source}  (valid)",
             f"  devices         {_devices(hw)} x {d.name} ({d.kind})",
             f"  memory          {format_bytes(d.memory_bytes)} per device, "
             f"{format_bytes(d.usable_memory_bytes)} usable",
             "  peak            " + ", ".join(f"{dt} {v / 1e12:g} TFLOP/s" for dt, v in c.peak_flops.items())]
    for dt, curve in c.gemm_efficiency.items():
        pts = ", ".join(f"{g:g} GFLOP: {f:.3g}" for g, f in curve)
        lines.append(f"  GEMM eff {dt:<6} {pts}")
    if c.efficiency_scale != 1.0:
        lines.append(f"  eff. scale      x{c.efficiency_scale:g} (calibrated)")
    lines += [
        f"  DRAM bandwidth  {c.memory_bandwidth_bytes_per_s / 1e9:g} GB/s"
        f" x {c.bandwidth_efficiency:g} achieved",
        f"  bwd/fwd         {c.backward_forward_ratio:g}; kernel launch {format_seconds(c.kernel_launch_s)}",
        f"  collectives     launch {format_seconds(k.launch_s)}; intra-node "
        f"{k.intra.busbw_bytes_per_s / 1e9:g} GB/s busbw + {format_seconds(k.intra.latency_s)}",
    ]
    if k.inter:
        lines.append(f"                  inter-node {k.inter.busbw_bytes_per_s / 1e9:g} GB/s busbw "
                     f"+ {format_seconds(k.inter.latency_s)}")
    for t in k.tables:
        lines.append(f"  table           {t.op} x{t.group_size} {t.scope}: "
                     f"{format_bytes(t.sizes_bytes[0])} {t.busbw_bytes_per_s[0] / 1e9:g} GB/s .. "
                     f"{format_bytes(t.sizes_bytes[-1])} {t.busbw_bytes_per_s[-1] / 1e9:g} GB/s "
                     f"({len(t.sizes_bytes)} sizes)")
    if not k.tables:
        lines.append("  tables          none (the alpha-beta lines serve every collective)")
    if any(v != 1.0 for v in k.efficiency.values()) or any(v != 0.0 for v in k.extra_latency_s.values()):
        lines.append("  calibrated      " + ", ".join(
            f"{op} x{k.efficiency[op]:g} +{format_seconds(k.extra_latency_s[op])}" for op in k.efficiency))
    lines += [f"  overlap         compute and communication x{hw.overlap_slowdown:g} slower while overlapped",
              f"  memory          context {format_bytes(hw.memory.context_bytes)}, "
              f"fragmentation {hw.memory.fragmentation:.0%}"]
    if hw.provenance:
        lines.append("  provenance      " + ", ".join(f"{k_}: {v}" for k_, v in hw.provenance.items()))
    return "\n".join(lines)


def _devices(hw: HardwareProfile) -> str:
    d = hw.device
    return f"{d.count} (1 node)" if d.nodes == 1 else f"{d.count} ({d.nodes}x{d.per_node})"


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)
