"""osdp-sim pareto: the exact throughput-vs-peak-memory front of a model on a machine, plotted
with every evaluated plan, the uniform baselines and the best plan under each memory limit."""

import sys
from pathlib import Path

from osdp_sim.cli.common import load_hw, load_spec
from osdp_sim.cli.search_cmd import add_space_arguments, build_space, describe_space, progress
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable
from osdp_sim.units import format_bytes, parse_bytes

HELP = "plot the exact throughput vs peak-memory Pareto front (PNG + SVG) and write it as CSV"


def add_arguments(p) -> None:
    add_space_arguments(p)
    p.add_argument("--mem-limit", action="append", default=[], metavar="SIZE",
                   help="mark a memory limit and the best plan within it (repeatable)")
    p.add_argument("-o", "--output", required=True, metavar="PLOT.png",
                   help="the PNG to write; the SVG goes beside it with the same stem")
    p.add_argument("--csv", metavar="FRONT.csv", help="where to write the front (default: the PNG's stem .csv)")
    p.add_argument("--method", choices=("front", "sweep"), default="front",
                   help="front: one pareto_front() pass (exact; slow beyond ~16 blocks); sweep: exact "
                        "search() calls from --mem-max down, each just below the previous optimum's peak")
    p.add_argument("--mem-max", metavar="SIZE", help="upper end of the memory axis searched "
                   "(default: the device's usable memory)")
    p.add_argument("--resolution", metavar="SIZE", default="64MiB",
                   help="sweep: step at least this much below the previous limit; front points closer "
                        "together than this may be skipped (default 64MiB; 0 visits every front point)")
    p.add_argument("--time-limit", type=float, metavar="S", help="sweep: time limit of each search() call")
    p.add_argument("--throughput", choices=("samples", "tokens"), default="samples",
                   help="the plot's y axis: samples/s or tokens/s (samples x sequence length), all devices")


def run(args) -> int:
    from osdp_sim.search.baselines import UNIFORM, uniform_candidates
    from osdp_sim.search.bnb import pareto_front
    from osdp_sim.search.report import plan_oneline
    from osdp_sim.search.sweep import non_dominated, sweep_front
    from osdp_sim.viz.pareto import Throughput, best_under, plot_pareto, write_front_csv

    out = Path(args.output)
    if out.suffix.lower() != ".png":
        raise UserError(f"expected a .png path, got {args.output!r}", field="-o")
    for path, flag in ((out, "-o"), (out.with_suffix(".svg"), "-o"),
                       (args.csv or out.with_suffix(".csv"), "--csv" if args.csv else "-o")):
        check_writable(path, flag)                 # before the front, not after it
    limits = [parse_bytes(t, field="--mem-limit") for t in args.mem_limit]
    resolution = 0 if args.resolution.strip() in ("0", "0B") else parse_bytes(args.resolution, field="--resolution")
    if args.time_limit is not None and args.time_limit <= 0:
        raise UserError(f"expected a positive number of seconds, got {args.time_limit}", field="--time-limit")
    hw = load_hw(args)
    spec = load_spec(args)
    space = build_space(args, spec, hw)

    hi = parse_bytes(args.mem_max, field="--mem-max") if args.mem_max else float(hw.device.usable_memory_bytes)
    progress(f"computing the Pareto front of {spec.name} on {hw.device.count} x {hw.device.name} "
             f"up to {format_bytes(hi)} ({args.method}) ...")
    if args.method == "front":
        res = pareto_front(spec, hw, space, mem_range=(0.0, hi), progress=True)
        proven = True
    else:
        res, proven = sweep_front(spec, hw, space, hi, limits=tuple(limits), resolution_bytes=resolution,
                                  time_limit_s=args.time_limit, progress=progress)
    progress(f"front of {len(res.front)} plans from {len(res.evaluated):,} evaluated in {res.seconds:.2f} s"
             + ("" if proven else "; some searches hit the time limit (points are best found, not proven)"))
    uniform = {}
    for s in UNIFORM:
        if s in space.strategies:
            uniform[s] = [(e.peak_memory_bytes, e.samples_per_s)
                          for _, e in uniform_candidates(spec, hw, space, s, hi)]

    title = f"{spec.name} on {hw.name}: {hw.device.count} x {hw.device.name}"
    subtitle = describe_space(space, hw) + "\nfront: " + (
        "one exact pareto_front() pass" if args.method == "front" else
        f"exact search() at descending limits (resolution {args.resolution})")
    axis = Throughput("tokens/s", spec.config.seq_len) if args.throughput == "tokens" else Throughput()
    figure = plot_pareto(out, front=res.front, evaluated=res.evaluated, uniform=uniform, limits=limits,
                         title=title, subtitle=subtitle, device_memory_bytes=hw.device.usable_memory_bytes,
                         x_max_bytes=max([hi] + limits), throughput=axis)
    paths = figure.paths
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
        pts = [p for p in pts if p[0] <= hi]
        if pts:
            top = max(pts, key=lambda p: p[1])
            print(f"  uniform {name}: best {top[1]:.2f} samples/s at {format_bytes(top[0])} "
                  f"(within {format_bytes(hi)})")
    print("wrote " + ", ".join(str(p) for p in paths + [csv_path]), file=sys.stderr)
    return 0
