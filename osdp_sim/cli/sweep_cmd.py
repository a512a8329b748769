"""osdp-sim sweep: what-if questions across a grid in one command (planner/whatif.py does the work;
this module parses the axes and prints the table, --json, --csv and --plot)."""

import json
import math
import sys

from osdp_sim.cli.common import check_plot_path, percent, warn_if_documented
from osdp_sim.cli.search_cmd import add_headroom_argument
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable
from osdp_sim.planner.whatif import DEFAULT_SWEEP_TIME_LIMIT_S, NOT_RUN, SweepAxes
from osdp_sim.units import format_bytes, parse_bytes

HELP = "what-if sweeps: the best plan and the baselines across a grid of devices, limits, models and scales"


LABELS = {"model": "model", "devices": "GPUs", "mem_limit_bytes": "limit", "seq_len": "seq",
          "micro_batch": "mb", "bandwidth_scale": "bw x", "compute_scale": "compute x"}
FLAGS = {"model": "--model", "devices": "--gpus", "mem_limit_bytes": "--mem-limit", "seq_len": "--seq-len",
         "micro_batch": "--micro-batch", "bandwidth_scale": "--bandwidth-scale", "compute_scale": "--compute-scale"}


def add_arguments(p) -> None:
    p.add_argument("--hw", required=True, help="hardware profile: a YAML path or a shipped name (osdp-sim profiles)")
    p.add_argument("--gpus", metavar="N[,N...]",
                   help="device counts (default: the profile's); past one node, whole nodes joined by the "
                        "profile's inter-node link or --inter-node's")
    p.add_argument("--model", required=True, metavar="M[,M...]", help="models: built-in names or paths")
    p.add_argument("--mem-limit", metavar="SIZE[,SIZE...]",
                   help="peak memory limits per device (default: the device's usable memory)")
    p.add_argument("--seq-len", metavar="N[,N...]", help="sequence lengths (default: the model's)")
    p.add_argument("--micro-batch", metavar="B[,B...]",
                   help="fixed micro-batches per device, one point each (default: the search picks it)")
    p.add_argument("--bandwidth-scale", metavar="X[,X...]",
                   help="factors on every intra- and inter-node bus bandwidth (tables included)")
    p.add_argument("--compute-scale", metavar="X[,X...]", help="factors on peak FLOP/s")
    add_headroom_argument(p)
    p.add_argument("--inter-node", metavar="GBPS[,LATENCY_US]",
                   help="the link between nodes for device counts past one node of a single-node profile "
                        "(busbw per node in GB/s; latency default 20 us); replaces a multi-node profile's")
    p.add_argument("--strategies", default="ddp,zero2,zero3", metavar="LIST",
                   help="strategies per operator group (default: ddp,zero2,zero3)")
    p.add_argument("--splits", metavar="LIST", help="operator-splitting granularities (default: 1,2,4,8)")
    p.add_argument("--no-split", action="store_true", help="no operator splitting (same as --splits 1)")
    p.add_argument("--no-checkpoint", action="store_true", help="never use activation checkpointing")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--gap", type=percent, default=0.0, metavar="PCT",
                   help="per point, stop proving once no plan can beat the best by more than PCT%%")
    p.add_argument("--time-limit", type=float, metavar="S", default=DEFAULT_SWEEP_TIME_LIMIT_S,
                   help="end the whole sweep within S seconds; each point gets an equal share of what is "
                        "left, points not reached are reported 'not run: time limit' "
                        f"(default {DEFAULT_SWEEP_TIME_LIMIT_S:g}; 0 = no limit)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--csv", metavar="PATH", help="also write one CSV row per point")
    p.add_argument("--plot", metavar="PATH.png",
                   help="also plot throughput and peak memory against the swept axis (an SVG beside it)")


def _items(text: str, flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t for t in items):
        raise UserError(f"expected a comma-separated list of values, got {text!r}", field=flag)
    return items


def _whole(text: str, flag: str) -> tuple[int, ...]:
    out = []
    for t in _items(text, flag):
        try:
            v = int(t)
        except ValueError:
            v = 0
        if v < 1:
            raise UserError(f"{t!r} is not a positive whole number", field=flag)
        out.append(v)
    return tuple(dict.fromkeys(out))


def _factors(text: str, flag: str) -> tuple[float, ...]:
    out = []
    for t in _items(text, flag):
        try:
            v = float(t)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"{t!r} is not a positive, finite factor", field=flag)
        out.append(v)
    return tuple(dict.fromkeys(out))


def parse_axes(args) -> SweepAxes:
    """The axes from the command line (each a one-line UserError when malformed)."""
    return SweepAxes(
        model=tuple(dict.fromkeys(_items(args.model, "--model"))),
        devices=_whole(args.gpus, "--gpus") if args.gpus else None,
        mem_limit_bytes=tuple(dict.fromkeys(float(parse_bytes(t, field="--mem-limit"))
                                            for t in _items(args.mem_limit, "--mem-limit")))
        if args.mem_limit else None,
        seq_len=_whole(args.seq_len, "--seq-len") if args.seq_len else None,
        micro_batch=_whole(args.micro_batch, "--micro-batch") if args.micro_batch else None,
        bandwidth_scale=_factors(args.bandwidth_scale, "--bandwidth-scale") if args.bandwidth_scale else None,
        compute_scale=_factors(args.compute_scale, "--compute-scale") if args.compute_scale else None)


def build_space(args):
    from osdp_sim.plan import SPLITS, STRATEGIES
    from osdp_sim.planner.space import SearchSpace
    strategies = tuple(dict.fromkeys(_items(args.strategies, "--strategies")))
    for s in strategies:
        if s not in STRATEGIES:
            raise UserError(f"unknown value {s!r}; expected some of {', '.join(STRATEGIES)}", field="--strategies")
    if args.no_split and args.splits:
        raise UserError("conflicts with --splits (--no-split means --splits 1); give one of them",
                        field="--no-split")
    splits = (1,) if args.no_split else (_whole(args.splits, "--splits") if args.splits else SearchSpace.splits)
    for k in splits:
        if k not in SPLITS:
            raise UserError(f"unknown value {k}; expected some of {', '.join(map(str, SPLITS))}", field="--splits")
    return SearchSpace(strategies=strategies, splits=tuple(sorted(set(splits) | {1})),
                       checkpoint=(False,) if args.no_checkpoint else (False, True),
                       precision=args.precision, optimizer=args.optimizer)


def progress(msg: str) -> None:
    print(f"osdp-sim sweep: {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.planner.whatif import parse_inter_node, sweep
    from osdp_sim.cli.search_cmd import time_limit_arg
    from osdp_sim.planner.headroom import parse_headroom

    if args.csv:
        check_writable(args.csv, "--csv")
    if args.plot:
        check_plot_path(args.plot, "--plot")
    if args.gap >= 100.0:
        raise UserError(f"expected a percentage below 100, got {args.gap:g}", field="--gap")
    limit_s = time_limit_arg(args.time_limit)
    axes = parse_axes(args)
    space = build_space(args)
    inter = parse_inter_node(args.inter_node) if args.inter_node else None
    hw = load_profile(args.hw)
    headroom = parse_headroom(args.headroom)
    res = sweep(hw, axes, space, time_limit_s=limit_s, inter=inter, rel_gap=args.gap / 100.0, progress=progress,
                headroom=headroom)
    if args.csv:
        write_csv(args.csv, res)
        progress(f"CSV written to {args.csv}")
    if args.plot:
        from osdp_sim.viz.sweep import plot_sweep
        plot_sweep(res, args.plot)
        progress(f"plot written to {args.plot}")
    warn_if_documented(hw)              # with the answer, after every input was checked
    if args.json:
        print(json.dumps(to_json(res), indent=1))
    else:
        print(format_table(res))
    return 0


def to_json(res) -> dict:
    return res.to_json()


def axis_cell(a: str, v) -> str:
    if a == "mem_limit_bytes":
        return format_bytes(v)
    if isinstance(v, float):
        return f"{v:g}"
    return "auto" if v is None else str(v)


def short_plan(plan) -> str:
    """'mb 2x1, ckpt 0/32, groups 1 zero2 + 63 zero3, root zero2': batch, checkpointing and how
    many operator groups take each choice (zero2(1/2 z3): zero2 with 1 of 2 slices ZeRO-3)."""
    counts: dict = {}
    for k, c in plan.choices.items():
        if k != "root":
            name = (c.strategy if c.slices == 1 else f"zero3({c.slices} slices)" if c.strategy == "zero3"
                    else f"{c.strategy}({c.sharded_slices}/{c.slices} z3)")
            counts[name] = counts.get(name, 0) + 1
    mix = " + ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (f"mb {plan.micro_batch}x{plan.grad_accum}, ckpt {sum(plan.checkpoint)}/{len(plan.checkpoint)}, "
            f"groups {mix}, root {plan.choices['root'].strategy}")


def _baseline_cell(b) -> str:
    if b is None:
        return "-"
    if b.feasible:
        return f"{b.samples_per_s:.4g}"
    return f"OOM {format_bytes(b.peak_memory_bytes)}" if b.peak_memory_bytes else "OOM"


def format_table(res) -> str:
    axes = res.axes.swept()
    head = [LABELS[a] for a in axes] + ["status", "samples/s", "tokens/s", "peak", "margin", "gap", "DDP", "ZeRO-2",
                                        "ZeRO-3", "vs best", "plan"]
    rows = []
    for p in res.points:
        cells = [axis_cell(a, getattr(p, a)) for a in axes]
        best_base = max((b.samples_per_s for b in p.baselines.values() if b.feasible), default=None)
        if p.samples_per_s is not None:
            cells += [p.status, f"{p.samples_per_s:.4g}", f"{p.tokens_per_s:,.0f}",
                      format_bytes(p.peak_memory_bytes), format_bytes(p.margin_bytes), f"{100 * p.gap:.2f}%"]
        elif p.status == NOT_RUN:
            cells += ["not run: time limit", "-", "-", "-", "-", "-"]
        elif p.min_peak_memory_bytes is not None:
            least = format_bytes(p.min_peak_memory_bytes)
            cells += [p.status, "-", "-", f"needs {least}" if p.min_peak_proven else f"needs >= {least}", "-", "-"]
        else:
            cells += [p.status, "-", "-", "-", "-", "-"]
        cells += [_baseline_cell(p.baselines.get(s)) for s in ("ddp", "zero2", "zero3")]
        cells.append(f"{p.samples_per_s / best_base:.2f}x" if p.samples_per_s and best_base else "-")
        cells.append(short_plan(p.plan) if p.plan is not None else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = [f"sweep on {res.hardware}: {len(res.points)} points in {res.seconds:.1f} s"
             + (f" (time limit {res.time_limit_s:g} s)" if res.time_limit_s is not None else "")]
    lines.append(res.trust.line())
    if res.inter_node:
        lines.append(f"inter-node link: {res.inter_node}")
    for r in [head] + rows:
        lines.append("  ".join(c.ljust(w) if i in (0, len(r) - 1) or i < len(axes) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    lines.append("margin: what the plan leaves free of the device's usable memory (its peak already holds the "
                 "profile's context and fragmentation margin; --headroom keeps more free)")
    lines.append("DDP, ZeRO-2, ZeRO-3: uniform baselines' samples/s at their best batch setting (OOM: the least "
                 "peak any of its plans needs); vs best: the plan over the best of them")
    notes = [(p, p.message) for p in res.points if p.message and p.status != NOT_RUN]
    for p, m in notes:
        lines.append(f"  {', '.join(axis_cell(a, getattr(p, a)) for a in axes)}: {m}")
    if not res.complete:
        lines.append(f"{sum(p.status == NOT_RUN for p in res.points)} points not run: time limit "
                     "(a longer --time-limit reaches them)")
    return "\n".join(lines)


CSV_COLUMNS = ("model", "devices", "mem_limit_bytes", "seq_len", "micro_batch", "bandwidth_scale", "compute_scale",
               "status", "samples_per_s", "tokens_per_s", "peak_memory_bytes", "iteration_time_s", "gap",
               "ddp_samples_per_s", "zero2_samples_per_s", "zero3_samples_per_s", "zero3_peak_memory_bytes",
               "min_peak_memory_bytes", "min_peak_proven", "plan", "message")


def write_csv(path: str, res) -> None:
    import csv
    import io

    from osdp_sim.fileio import write_text_atomic
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for p in res.points:
        d = p.to_dict()
        for s in ("ddp", "zero2", "zero3"):
            b = p.baselines.get(s)
            d[f"{s}_samples_per_s"] = b.samples_per_s if b else None
        z = p.baselines.get("zero3")
        d["zero3_peak_memory_bytes"] = z.peak_memory_bytes if z else None
        w.writerow(["" if d[c] is None else d[c] for c in CSV_COLUMNS])
    write_text_atomic(path, buf.getvalue())
