"""osdp-sim pareto: the exact throughput-vs-peak-memory front of a model on a machine, plotted
with every evaluated plan, the uniform baselines and the best plan under each memory limit."""

import sys
from pathlib import Path

from osdp_sim.cli.common import load_hw, load_spec, warn_if_documented
from osdp_sim.cli.search_cmd import (add_headroom_argument, add_space_arguments, build_space, cap_to_device,
                                     describe_space, headroom_limit, progress, time_limit_arg)
from osdp_sim.errors import UserError
from osdp_sim.hardware.trust import trust_of
from osdp_sim.planner.bnb import DEFAULT_PARETO_TIME_LIMIT_S
from osdp_sim.planner.budget import Budget
from osdp_sim.fileio import check_writable
from osdp_sim.units import format_bytes, parse_bytes

PLOT_RESERVE_S = 3.0
# A front is many searches: the README's sweep of a 48-layer model takes about 2 minutes.
DEFAULT_TIME_LIMIT_S = DEFAULT_PARETO_TIME_LIMIT_S

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
    add_headroom_argument(p)
    p.add_argument("--resolution", metavar="SIZE", default="64MiB",
                   help="sweep: step at least this much below the previous limit; front points closer "
                        "together than this may be skipped (default 64MiB; 0 visits every front point)")
    p.add_argument("--time-limit", type=float, metavar="S", default=DEFAULT_TIME_LIMIT_S,
                   help="end the command within S seconds; the front is then of what was searched, marked "
                        f"not proven (default {DEFAULT_TIME_LIMIT_S:g}; 0 = no limit)")
    p.add_argument("--call-time-limit", type=float, metavar="S",
                   help="sweep: also a time limit for each search() call (default: what is left of --time-limit)")
    p.add_argument("--throughput", choices=("samples", "tokens"), default="samples",
                   help="the plot's y axis: samples/s or tokens/s (samples x sequence length), all devices")


def run(args) -> int:
    from osdp_sim.planner.baselines import UNIFORM, uniform_candidates
    from osdp_sim.planner.bnb import pareto_front
    from osdp_sim.planner.headroom import margin_line
    from osdp_sim.planner.report import plan_oneline
    from osdp_sim.planner.sweep import non_dominated, sweep_front
    from osdp_sim.viz.pareto import Throughput, best_under, plot_pareto, write_front_csv

    out = Path(args.output)
    if out.suffix.lower() != ".png":
        raise UserError(f"expected a .png path, got {args.output!r}", field="-o")
    for path, flag in ((out, "-o"), (out.with_suffix(".svg"), "-o"),
                       (args.csv or out.with_suffix(".csv"), "--csv" if args.csv else "-o")):
        check_writable(path, flag)                 # before the front, not after it
    limits = [parse_bytes(t, field="--mem-limit") for t in args.mem_limit]
    resolution = 0 if args.resolution.strip() in ("0", "0B") else parse_bytes(args.resolution, field="--resolution")
    budget = Budget(time_limit_arg(args.time_limit))
    call_limit = time_limit_arg(args.call_time_limit, "--call-time-limit", zero_is_none=False)
    if call_limit == 0:
        raise UserError("expected a positive number of seconds, got 0", field="--call-time-limit")
    hw = load_hw(args)
    spec = load_spec(args)
    space = build_space(args, spec, hw)
    # (limit searched, headroom taken off it) per --mem-limit: a percentage differs per limit
    limit_rooms = [headroom_limit(cap_to_device(lim, hw), hw, args.headroom) for lim in limits]
    limits = [lim for lim, _ in limit_rooms]

    hi = parse_bytes(args.mem_max, field="--mem-max") if args.mem_max else float(hw.device.usable_memory_bytes)
    hi, _ = headroom_limit(cap_to_device(hi, hw, "--mem-max"), hw, args.headroom)
    # after the searches: the uniform plans and the plot (matplotlib alone takes about a second)
    share = budget.search_share(min_reserve_s=PLOT_RESERVE_S, share=0.2)
    search_until = None if share is None else budget.deadline - (budget.left() - share)
    progress(f"computing the Pareto front of {spec.name} on {hw.device.count} x {hw.device.name} "
             f"up to {format_bytes(hi)} ({args.method}) ...")
    if args.method == "front":
        res = pareto_front(spec, hw, space, mem_range=(0.0, hi), progress=True, deadline=search_until,
                           time_limit_s=None)
        proven = res.proven
    else:
        res, proven = sweep_front(spec, hw, space, hi, limits=tuple(limits), resolution_bytes=resolution,
                                  time_limit_s=call_limit, progress=progress, deadline=search_until,
                                  total_time_limit_s=None)
    progress(f"front of {len(res.front)} plans from {len(res.evaluated):,} evaluated in {res.seconds:.2f} s"
             + ("" if proven else "; the time limit stopped some searches (points are best found, not proven)"))
    uniform = {}
    for s in UNIFORM:
        if s in space.strategies:
            uniform[s] = [(e.peak_memory_bytes, e.samples_per_s)
                          for _, e in uniform_candidates(spec, hw, space, s, hi, deadline=budget.deadline)]

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
    warn_if_documented(hw)              # with the answer, after every input was checked
    print(f"Pareto front of {spec.name} on {hw.device.count} x {hw.device.name}: {len(front)} plans, "
          f"{len(res.evaluated):,} evaluated, {res.seconds:.2f} s")
    print(f"  ({trust_of(hw).line()})")
    if front:
        print(f"  from {format_bytes(front[0][0])} at {front[0][1]:.2f} samples/s "
              f"to {format_bytes(front[-1][0])} at {front[-1][1]:.2f} samples/s")
    for lim, headroom in limit_rooms:
        best = best_under(front, lim)
        if best is None:
            print(f"  within {format_bytes(lim)}: nothing fits")
        else:
            print(f"  within {format_bytes(lim)}: {best[1]:.2f} samples/s at {format_bytes(best[0])}, margin "
                  f"{margin_line(best[0], hw.device.usable_memory_bytes, headroom)}: {plan_oneline(best[2])}")
    for name, pts in uniform.items():
        pts = [p for p in pts if p[0] <= hi]
        if pts:
            top = max(pts, key=lambda p: p[1])
            print(f"  uniform {name}: best {top[1]:.2f} samples/s at {format_bytes(top[0])} "
                  f"(within {format_bytes(hi)})")
    print("wrote " + ", ".join(str(p) for p in paths + [csv_path]), file=sys.stderr)
    return 0
