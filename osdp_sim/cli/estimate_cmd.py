"""osdp-sim estimate: predicted peak memory and iteration time of one plan."""

import json

from osdp_sim.cli.common import (add_hw_args, add_model_args, check_plot_path, load_hw, load_spec, positive_int,
                              warn_if_documented)
from osdp_sim.errors import UserError
from osdp_sim.hardware.trust import trust_of
from osdp_sim.jsonformat import stamped
from osdp_sim.units import format_bytes, format_seconds

HELP = "predict peak memory per device and iteration time of a plan"


def add_arguments(p) -> None:
    add_hw_args(p)
    add_model_args(p, required=False)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", help="a plan file (from osdp-sim search -o); it fixes the model, batch, "
                     "precision, optimizer, checkpointing and devices, so the flags that set those are "
                     "errors with it")
    src.add_argument("--strategy", choices=("ddp", "zero2", "zero3"), help="a uniform plan")
    p.add_argument("--micro-batch", type=positive_int, help="micro-batch size per device (uniform plans)")
    p.add_argument("--grad-accum", type=positive_int, help="gradient accumulation steps (default 1)")
    p.add_argument("--precision", choices=("fp32", "bf16"), help="default bf16")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), help="default adamw")
    p.add_argument("--checkpoint", nargs="?", const="full", choices=("full", "selective"),
                   help="activation checkpointing on every block: full recompute (the default "
                        "when given bare) or selective (torchtitan's op-level policy)")
    p.add_argument("--shard-group", type=positive_int, help="hybrid sharding: shard within groups of this size")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", action="store_true", help="with --json: include the simulated task timeline")
    p.add_argument("--plot", metavar="PNG",
                   help="write the simulated timeline and the plan strip to this PNG (and an SVG beside it)")


# Flags that shape a uniform plan; a plan file fixes all of them.
_UNIFORM_FLAGS = (("model", "--model"), ("seq_len", "--seq-len"), ("micro_batch", "--micro-batch"),
                  ("grad_accum", "--grad-accum"), ("precision", "--precision"), ("optimizer", "--optimizer"),
                  ("checkpoint", "--checkpoint"), ("shard_group", "--shard-group"))


def check_args(args) -> None:
    """Flags that would be ignored are errors, before any file is read."""
    if args.plan:
        for attr, flag in _UNIFORM_FLAGS:
            if getattr(args, attr) not in (None, False):
                raise UserError(f"conflicts with --plan: the plan file fixes it; drop {flag} (or make a "
                                f"uniform plan with --strategy instead of --plan)", field=flag)
    if args.timeline and not args.json:
        raise UserError("only adds the task timeline to the --json output; add --json (or use --plot "
                        "for a picture of it)", field="--timeline")
    if args.plot:
        check_plot_path(args.plot, "--plot")


def _plan(args, hw):
    from osdp_sim.plan import load_plan, uniform_plan
    if args.plan:
        plan = load_plan(args.plan)
        if args.gpus and args.gpus != plan.devices:
            raise UserError(f"the plan was made for {plan.devices} devices, not {args.gpus}; drop --gpus "
                            f"(a plan fixes its device count) or make a plan for {args.gpus} (osdp-sim "
                            f"search ... --gpus {args.gpus} -o plan.json)", field="--gpus")
        if plan.devices > hw.device.count:
            raise UserError(f"the plan is for {plan.devices} devices but the profile {hw.name!r} has "
                            f"{hw.device.count}", source=args.plan, field="devices")
        return plan, hw.with_devices(plan.devices)
    if not args.model:
        raise UserError("give --model with --strategy (or a --plan file)", field="--model")
    if not args.micro_batch:
        raise UserError("give --micro-batch with --strategy", field="--micro-batch")
    cfg = load_spec(args).config
    devices = hw.device.count
    shard = args.shard_group or devices
    if devices % shard:
        raise UserError(f"{shard} must divide the device count {devices}", field="--shard-group")
    if args.shard_group and args.strategy == "ddp":
        raise UserError("has no effect with --strategy ddp (nothing is sharded); drop it or use zero2/zero3",
                        field="--shard-group")
    plan = uniform_plan(cfg, args.strategy, devices=devices, micro_batch=args.micro_batch,
                        checkpoint=args.checkpoint or False, grad_accum=args.grad_accum or 1,
                        precision=args.precision or "bf16", optimizer=args.optimizer or "adamw",
                        shard_group=shard)
    return plan, hw


def run(args) -> int:
    from osdp_sim.costmodel import estimate
    from osdp_sim.model.spec import build_spec
    check_args(args)
    if args.plan:                     # the plan fixes the device count; _plan checks --gpus against it
        from osdp_sim.hardware.load import load_profile
        hw = load_profile(args.hw)
    else:
        hw = load_hw(args)
    plan, hw = _plan(args, hw)
    spec = build_spec(plan.model)
    est = estimate(spec, hw, plan)
    if args.plot:
        from osdp_sim.viz.timeline import plot_step
        plot_step(est, plan, args.plot, title=f"{spec.name} on {hw.name} x{plan.devices}: "
                  f"{est.iteration_time_s * 1e3:.1f} ms per step, peak {est.peak_memory_bytes / 2**30:.2f} GiB")
    warn_if_documented(hw)              # with the answer, after every input was checked
    if args.json:
        usable = hw.device.usable_memory_bytes
        from osdp_sim.planner.headroom import margin_bytes
        out = dict(est.to_dict(timeline=args.timeline), model=spec.name, hardware=hw.name, devices=plan.devices,
                   params=spec.param_count, usable_memory_bytes=usable,
                   margin_bytes=margin_bytes(est.peak_memory_bytes, usable), provenance=trust_of(hw).to_json())
        print(json.dumps(stamped("estimate", out), indent=1))
        return 0
    print(format_estimate(spec, hw, plan, est))
    return 0


def format_estimate(spec, hw, plan, est) -> str:
    from osdp_sim.planner.headroom import margin_line
    strategies = sorted({c.label() for c in plan.choices.values()})
    lines = [
        f"model      {spec.name} ({spec.param_count / 1e9:.3f} B params, seq {spec.seq_len})",
        f"hardware   {hw.name}: {plan.devices} x {hw.device.name}, usable {format_bytes(hw.device.usable_memory_bytes)} each",
        f"plan       {', '.join(strategies)}; micro-batch {plan.micro_batch} x accum {plan.grad_accum}; "
        f"{plan.precision}; {plan.optimizer}; shard group {plan.shard_size}; "
        f"checkpointed blocks {sum(plan.checkpoint)}/{len(plan.checkpoint)}"
        + (f" ({sum(plan.selective)} selective)" if any(plan.selective) else ""),
        "",
        f"peak memory per device   {format_bytes(est.peak_memory_bytes):>12}   (during {est.peak_during})",
    ]
    for k, v in est.memory_breakdown.items():
        lines.append(f"  {k:<22} {format_bytes(v):>12}")
    ms = est.model_states_bytes
    lines.append(f"  model states resident: params {format_bytes(ms['params'])}, grads {format_bytes(ms['grads'])}, "
                 f"optimizer {format_bytes(ms['optimizer'])}")
    tb = est.time_breakdown
    lines += ["", f"iteration time           {format_seconds(est.iteration_time_s):>12}"]
    for k in ("forward_s", "backward_s", "recompute_s", "optimizer_s"):
        lines.append(f"  {k[:-2]:<22} {format_seconds(tb[k]):>12}")
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        if tb[f"{kind}_s"] > 0:
            lines.append(f"  {kind:<22} {format_seconds(tb[kind + '_s']):>12}   exposed "
                         f"{format_seconds(tb[kind + '_exposed_s'])}")
    fits = est.peak_memory_bytes <= hw.device.usable_memory_bytes
    lines += ["",
              f"throughput               {est.samples_per_s:12.2f} samples/s   {est.tokens_per_s:,.0f} tokens/s",
              f"  ({trust_of(hw).line()})",
              f"model FLOP/s per device  {est.model_flops_per_s_per_device / 1e12:12.2f} TFLOP/s   MFU {est.mfu * 100:.1f}%",
              f"fits in device memory    {'yes' if fits else 'NO'} ({format_bytes(est.peak_memory_bytes)} of "
              f"{format_bytes(hw.device.usable_memory_bytes)} usable)",
              f"margin                   {margin_line(est.peak_memory_bytes, hw.device.usable_memory_bytes)}"]
    return "\n".join(lines)
