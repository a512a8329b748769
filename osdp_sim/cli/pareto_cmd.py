"""osdp-sim pareto: the exact throughput-vs-peak-memory front of a model on a machine, plotted
with every evaluated plan, the uniform baselines and the best plan under each memory limit."""

import sys
from pathlib import Path

from osdp_sim.cli.common import load_hw, load_spec
from osdp_sim.cli.search_cmd import add_space_arguments, build_space, describe_space, progress
from osdp_sim.errors import UserError
from osdp_sim.units import format_bytes, parse_bytes

HELP = "plot the exact throughput vs peak-memory Pareto front (PNG + SVG) and write it as CSV"


def add_arguments(p) -> None:
    add_space_arguments(p)
    p.add_argument("--mem-limit", action="append", default=[], metavar="SIZE",
                   help="mark a memory limit and the best plan within it (repeatable)")
    p.add_argument("-o", "--output", required=True, metavar="PLOT.png",
                   help="the PNG to write; the SVG goes beside it with the same stem")
    p.add_argument("--csv", metavar="FRONT.csv", help="where to write the front (default: the PNG's stem .csv)")


def run(args) -> int:
    from osdp_sim.search.baselines import UNIFORM, uniform_candidates
    from osdp_sim.search.bnb import pareto_front
    from osdp_sim.search.report import plan_oneline
    from osdp_sim.viz.pareto import best_under, non_dominated, plot_pareto, write_front_csv

    out = Path(args.output)
    if out.suffix.lower() != ".png":
        raise UserError(f"expected a .png path, got {args.output!r}", field="-o")
    limits = [parse_bytes(t, field="--mem-limit") for t in args.mem_limit]
    hw = load_hw(args)
    spec = load_spec(args)
    space = build_space(args, spec, hw)

    progress(f"computing the Pareto front of {spec.name} on {hw.device.count} x {hw.device.name} ...")
    res = pareto_front(spec, hw, space, progress=True)
    progress(f"front of {len(res.front)} plans from {len(res.evaluated):,} evaluated in {res.seconds:.2f} s")
    uniform = {}
    for s in UNIFORM:
        if s in space.strategies:
            uniform[s] = [(e.peak_memory_bytes, e.samples_per_s) for _, e in uniform_candidates(spec, hw, space, s)]

    title = f"{spec.name} on {hw.name}: {hw.device.count} x {hw.device.name}"
    subtitle = describe_space(space, hw)
    paths = plot_pareto(out, front=res.front, evaluated=res.evaluated, uniform=uniform, limits=limits,
                        title=title, subtitle=subtitle, device_memory_bytes=hw.device.usable_memory_bytes)
    csv_path = write_front_csv(args.csv or out.with_suffix(".csv"), res.front, plan_oneline)
    front = non_dominated(res.front)
    print(f"Pareto front of {spec.name} on {hw.device.count} x {hw.device.name}: {len(front)} plans, "
          f"{len(res.evaluated):,} evaluated, {res.seconds:.2f} s")
    if front:
        print(f"  from {format_bytes(front[0][0])} at {front[0][1]:.2f} samples/s "
              f"to {format_bytes(front[-1][0])} at {front[-1][1]:.2f} samples/s")
    for lim in limits:
        best = best_under(front, lim)
        if best is None:
            print(f"  within {format_bytes(lim)}: nothing fits")
        else:
            print(f"  within {format_bytes(lim)}: {best[1]:.2f} samples/s at {format_bytes(best[0])}: "
                  f"{plan_oneline(best[2])}")
    for name, pts in uniform.items():
        if pts:
            top = max(pts, key=lambda p: p[1])
            print(f"  uniform {name}: best {top[1]:.2f} samples/s at {format_bytes(top[0])} (no limit)")
    print("wrote " + ", ".join(str(p) for p in paths + [csv_path]), file=sys.stderr)
    return 0
