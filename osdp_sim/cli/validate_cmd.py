"""osdp-sim validate: run a plan for real on N ranks and record measured beside predicted."""

import os
import shutil
import sys

from osdp_sim.cli.common import add_model_args, byte_size, check_seconds, nonneg_int, positive_int
from osdp_sim.errors import UserError
from osdp_sim.model.hf import check_transformers, hf_config_path
from osdp_sim.fileio import check_writable
from osdp_sim.units import format_bytes, format_seconds

HELP = "run a plan for real (N ranks, gloo on CPU or NCCL on GPU) and record measured vs predicted"

EXIT_FAILED = 1
EXIT_OOM = 3
MAX_SEED = 2**32 - 1         # the ranks' token generators seed with seed * 100003 + rank (64 bits)


def add_arguments(p) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", help="a plan file (from osdp-sim search -o)")
    src.add_argument("--strategy", choices=("ddp", "zero2", "zero3"),
                     help="run a uniform plan instead (with --model and --micro-batch)")
    p.add_argument("--hw", required=True,
                   help="hardware profile for the prediction: a YAML path or a shipped name")
    add_model_args(p, required=False)
    p.add_argument("--micro-batch", type=positive_int, help="micro-batch per rank (with --strategy)")
    p.add_argument("--grad-accum", type=positive_int, help="with --strategy (default 1)")
    p.add_argument("--precision", choices=("fp32", "bf16"), help="with --strategy (default bf16)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), help="with --strategy (default adamw)")
    p.add_argument("--checkpoint", nargs="?", const="full", choices=("full", "selective"),
                   help="with --strategy: checkpoint every block, full recompute (bare) or selective "
                        "(torchtitan's op-level policy)")
    p.add_argument("--nproc", type=positive_int,
                   help="ranks to start (default and required: the plan's device count)")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="where to run (default: the profile's device kind)")
    p.add_argument("--backend", choices=("fsdp2", "fairscale"), default="fsdp2")
    p.add_argument("--impl", choices=("osdp", "hf"), default="osdp",
                   help="whose model runs: osdp-sim's own modules (default) or transformers' "
                        "implementation of the --model config.json (hf; needs the extra hf)")
    p.add_argument("--fake-world", type=positive_int, metavar="N",
                   help="run one process as rank 0 of an N-device plan on torch's fake process group: "
                        "real shard sizes (peak memory of the N-device job) and real compute, collectives "
                        "move nothing (communication not measured; the record says so)")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--iters", type=positive_int, default=10, help="timed steps (default 10)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help=f"model init and token seed, 0 to {MAX_SEED} (default 0)")
    p.add_argument("--threads", type=positive_int,
                   help="torch threads per rank (default: cores // ranks, at least 1)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="time limit of the whole command in seconds, from its start (loading, prediction, "
                        "the ranks' start-up and steps): past it every rank is stopped and the run is "
                        "recorded as timeout (default 300)")
    p.add_argument("--mem-cap", type=byte_size,
                   help="per-rank memory cap (e.g. 200MiB): on CPU the run is 'oom' when the tracked "
                        "peak exceeds it; on GPU it is enforced with set_per_process_memory_fraction")
    out = p.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", help="write the record to this file")
    out.add_argument("--records-dir", default="records",
                     help="folder for the record, named from the plan hash and settings (default ./records)")
    p.add_argument("--run-dir", help="keep the per-rank logs and results here (default: a temporary "
                                     "folder, removed after a successful run)")



def _plan(args, hw, nproc_default: int):
    from osdp_sim.plan import load_plan, uniform_plan
    if args.plan:
        plan = load_plan(args.plan)
    else:
        if not args.model:
            raise UserError("give --model with --strategy (or a --plan file)", field="--model")
        if not args.micro_batch:
            raise UserError("give --micro-batch with --strategy", field="--micro-batch")
        from osdp_sim.model.load import load_model_config
        cfg = load_model_config(args.model, seq_len=args.seq_len)
        plan = uniform_plan(cfg, args.strategy, devices=args.nproc or nproc_default,
                            micro_batch=args.micro_batch, checkpoint=args.checkpoint or False,
                            grad_accum=args.grad_accum or 1, precision=args.precision or "bf16",
                            optimizer=args.optimizer or "adamw",
                            notes={"made_by": "osdp-sim validate --strategy"})
    nproc = args.nproc or plan.devices
    if nproc != plan.devices:
        raise UserError(f"--nproc {nproc} but the plan is for {plan.devices} devices; run with --nproc "
                        f"{plan.devices}, or make a plan for {nproc} devices (osdp-sim search ... "
                        f"--gpus {nproc} -o plan.json)", source=args.plan, field="devices")
    if args.impl == "hf":
        hf_config_path(plan.model, source=args.plan or args.model)
    else:
        from osdp_sim.model.config import check_runtime_buildable
        check_runtime_buildable(plan.model, source=args.plan or args.model)
    return runtime_plan(plan, args.impl)


RUNTIME_IMPLEMENTATION_NOTE = {
    "osdp": ("osdp-sim validate: note: {model} runs on the runtime's own modules, so it is predicted "
             "as they keep it (implementation osdp, not {was}: transformers' modules keep more for "
             "backward, docs/models.md)"),
    "hf": ("osdp-sim validate: note: {model} runs on transformers' implementation (--impl hf), so it "
           "is predicted as that keeps it (implementation hf, not {was})"),
}


def runtime_plan(plan, impl: str):
    """The plan as run on `impl`'s modules ('osdp': the runtime's own; 'hf': transformers', --impl
    hf): its model predicted and recorded with that implementation
    (model.config.for_implementation), with a note on stderr when that changes the model's."""
    import dataclasses
    from osdp_sim.model.config import for_implementation
    model = for_implementation(plan.model, impl)
    if model == plan.model:
        return plan
    print(RUNTIME_IMPLEMENTATION_NOTE[impl].format(model=plan.model.name, was=plan.model.implementation),
          file=sys.stderr)
    return dataclasses.replace(plan, model=model)


# Flags that shape a uniform plan; a plan file fixes all of them (and would silently win).
_UNIFORM_FLAGS = (("model", "--model"), ("seq_len", "--seq-len"), ("micro_batch", "--micro-batch"),
                  ("grad_accum", "--grad-accum"), ("precision", "--precision"), ("optimizer", "--optimizer"),
                  ("checkpoint", "--checkpoint"))


def check_args(args) -> None:
    """What can be told from the flags alone, before any file is read or rank started."""
    if args.plan:
        for attr, flag in _UNIFORM_FLAGS:
            if getattr(args, attr) not in (None, False):
                raise UserError(f"conflicts with --plan: the plan file fixes it; drop {flag} (or run a "
                                "uniform plan with --strategy instead of --plan)", field=flag)
    check_seconds(args.timeout, "--timeout")
    if args.impl == "hf":
        check_transformers()
        if args.backend != "fsdp2":
            raise UserError("--impl hf applies the plan with FSDP2 (osdp_sim.runtime.apply); drop "
                            "--backend fairscale", field="--backend")
    if args.fake_world:
        if args.nproc:
            raise UserError("conflicts with --fake-world (one process runs as rank 0 of N; the plan has "
                            "N devices)", field="--nproc")
        if args.backend != "fsdp2":
            raise UserError("--fake-world runs FSDP2 only", field="--backend")
    if args.fake_world and args.impl == "hf":
        raise UserError("--fake-world builds the runtime's own modules on the meta device; run "
                        "transformers' implementation (--impl hf) on real ranks", field="--fake-world")
    if args.threads and args.threads > _cores():
        # more threads in one rank than cores only oversubscribes; 100000 failed in torch's setup
        raise UserError(f"expected at most {_cores()} (the cores this process may use), got {args.threads}",
                        field="--threads")
    if args.seed > MAX_SEED:
        raise UserError(f"expected at most {MAX_SEED}, got {args.seed}", field="--seed")
    if args.output:
        check_writable(args.output, "-o")
    else:
        check_writable(args.records_dir, "--records-dir", folder=True)
    if args.run_dir:
        check_writable(args.run_dir, "--run-dir", folder=True)


def _cores() -> int:
    from osdp_sim.runtime.launch import available_cores
    return available_cores()


def run(args) -> int:
    import time
    from osdp_sim.hardware.load import load_profile, resolve_profile_path
    from osdp_sim.plan import plan_to_dict
    from osdp_sim.records import predict
    from osdp_sim.runtime import launch as launcher

    started_s = time.monotonic()                     # --timeout covers the whole command
    check_args(args)
    torchrun = launcher.under_torchrun()
    if torchrun and args.fake_world:
        raise UserError("--fake-world runs one process itself; start it without torchrun", field="--fake-world")
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.fake_world
    hw = load_profile(args.hw)
    hw_info = {"name": hw.name, "path": str(resolve_profile_path(args.hw))}
    plan = _plan(args, hw, world or hw.device.count)
    if args.fake_world and plan.devices != args.fake_world:
        raise UserError(f"the plan is for {plan.devices} devices, not the --fake-world {args.fake_world}",
                        source=args.plan, field="devices")
    ranks_here = 1 if args.fake_world else plan.devices
    if torchrun and plan.devices != world:
        raise UserError(f"torchrun started {world} ranks but the plan is for {plan.devices} devices",
                        source=args.plan, field="devices")
    device = args.device or hw.device.kind
    if device == "cuda":
        launcher.check_gpus(ranks_here if not torchrun else int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                            "--device cuda" if args.device else f"the profile {hw.name!r} describes cuda devices",
                            field="--device")
    if device == "cpu" and not torchrun:
        launcher.check_cpu_ranks(ranks_here, source=args.plan,
                                 field="devices" if args.plan else "--nproc")
    if plan.devices > hw.device.count:
        print(f"osdp-sim validate: note: the profile {hw.name!r} describes {hw.device.count} devices; "
              f"predicting for {plan.devices}", file=sys.stderr)
    predicted = predict(plan, hw, args.impl)
    if args.fake_world and predicted is not None:
        # a fake group's collectives take no time: the step is predicted with communication free;
        # the peak as the real job's (the buffers FSDP2 allocates do not depend on who fills them)
        predicted = dict(predicted, **{k: v for k, v in predict(plan, hw.without_communication()).items()
                                       if k not in ("peak_memory_bytes", "memory_breakdown")})
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torchrun else ranks_here
    threads = args.threads or max(1, launcher.available_cores() // ranks_per_node)
    spec = {"plan": plan_to_dict(plan), "backend": args.backend, "device": device,
            "warmup": args.warmup, "iters": args.iters, "seed": args.seed, "threads_per_rank": threads,
            "mem_cap_bytes": args.mem_cap, "timeout_s": args.timeout, "fake_world": args.fake_world,
            "impl": args.impl}
    if args.impl == "hf":
        spec["hf_config"] = hf_config_path(plan.model, source=args.plan or args.model)
    if device == "cpu" and ranks_here * threads > launcher.available_cores() and not torchrun:
        print(f"osdp-sim validate: note: {ranks_here} ranks x {threads} threads on "
              f"{launcher.available_cores()} cores is oversubscribed; times will be noisy and slow "
              "(the record says so)", file=sys.stderr)

    if torchrun:
        if args.run_dir:
            spec["run_dir"] = args.run_dir
        outcome = launcher.run_in_process(spec)
        if outcome is None:
            return 0                                   # not rank 0: rank 0 writes the record
    else:
        outcome = launcher.launch(spec, ranks_here, timeout_s=args.timeout, run_dir=args.run_dir,
                                  started_s=started_s)
        if args.fake_world:
            outcome.env.update(world_size=args.fake_world, fake_world=args.fake_world)

    if torchrun and outcome.status == "failed" and _cause_already_recorded(args, outcome, plan, spec):
        sys.stderr.flush()
        os._exit(EXIT_FAILED)      # a peer's failure record names the cause; do not overwrite it
    record, path = _write_record(args, outcome, plan, hw_info, spec, predicted)
    if outcome.status == "ok":
        print(format_record(record))
        print(f"record     {path}")
        if not args.run_dir and not torchrun:
            shutil.rmtree(outcome.run_dir, ignore_errors=True)
        return 0
    f = outcome.failure or {}
    logs = f"; rank logs in {outcome.run_dir}" if outcome.run_dir else ""
    print(f"osdp-sim validate: {outcome.status}: {f.get('reason', 'unknown')} (record: {path}{logs})",
          file=sys.stderr)
    code = EXIT_OOM if outcome.status == "oom" else EXIT_FAILED
    if torchrun:
        # Peers may be blocked in a collective: leave without process-group teardown; torchrun
        # sees the non-zero exit and stops them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _cause_already_recorded(args, outcome, plan, spec) -> bool:
    """Under torchrun every failing rank writes the record; a rank that failed only because a peer
    died ("connection closed") leaves the peer's record of the same run in place."""
    from osdp_sim.records import load_record, record_name
    from osdp_sim.runtime.launch import is_peer_error
    if not is_peer_error((outcome.failure or {}).get("reason", "")):
        return False
    from pathlib import Path
    path = Path(args.output) if args.output else Path(args.records_dir) / record_name(
        {"plan": spec["plan"], "model": plan.model.to_dict(), "env": outcome.env,
         "settings": _settings(args), "impl": args.impl})
    try:
        data = load_record(path).data
    except UserError:
        return False
    from datetime import datetime, timedelta, timezone
    started = datetime.now(timezone.utc) - timedelta(seconds=outcome.wall_s + 5)
    # torchrun's run id repeats when a user reuses --rdzv-id: the record must also be this run's age
    return data["run_id"] == outcome.run_id and datetime.fromisoformat(data["created"]) >= started


def _settings(args) -> dict:
    return {"warmup": args.warmup, "iters": args.iters, "seed": args.seed,
            "timeout_s": args.timeout, "mem_cap_bytes": args.mem_cap}


def _write_record(args, outcome, plan, hw_info, spec, predicted):
    from osdp_sim.records import build_record, save_record, save_record_as
    settings = _settings(args)
    record = build_record(status=outcome.status, run_id=outcome.run_id, plan=plan,
                          hardware_profile=hw_info, env=outcome.env, settings=settings,
                          rank_results=outcome.rank_results, predicted=predicted,
                          failure=outcome.failure, impl=args.impl)
    path = save_record_as(record, args.output) if args.output else save_record(record, args.records_dir)
    return record, path


def format_record(record: dict) -> str:
    m, p, e, env = record["measured"], record["predicted"] or {}, record["errors"] or {}, record["env"]
    t = m["iteration_time_s"]
    plan = record["plan"]
    over = " (oversubscribed)" if env["oversubscribed"] else ""
    lines = [
        f"run        {record['model']['name']}{' (transformers)' if record.get('impl') == 'hf' else ''}: "
        f"{env['world_size']} ranks x {env['threads_per_rank']} "
        f"thread(s) on {env['device_kind']} ({env['device_name']}, {env['cores']} cores){over}, "
        f"{env['backend']}, micro-batch {plan['micro_batch']} x accum {plan['grad_accum']}",
        f"steps      {record['settings']['warmup']} warmup + 1 memory + {record['settings']['iters']} timed",
        "",
        f"{'':22}{'measured':>14}{'predicted':>14}{'error':>10}",
        f"{'iteration time':22}{format_seconds(t['mean']):>14}{_fmt(p.get('iteration_time_s'), format_seconds):>14}"
        f"{_pct(e.get('iteration_time_rel')):>10}",
        f"{'  median / std':22}{format_seconds(t['median']):>14}  std {format_seconds(t['std'])}"
        f" ({t['std'] / t['mean'] * 100:.1f}%), min {format_seconds(t['min'])}, max {format_seconds(t['max'])}",
        f"{'peak memory (tracked)':22}{_fmt(m['peak_memory_bytes'], format_bytes):>14}"
        f"{_fmt(p.get('peak_memory_bytes'), format_bytes):>14}{_pct(e.get('peak_memory_rel')):>10}",
    ]
    rss = [r["rss_hwm_bytes"] for r in m["memory"]["per_rank"] if r.get("rss_hwm_bytes")]
    if rss:
        lines.append(f"{'process RSS high-water':22}{format_bytes(max(rss)):>14}   (whole process, secondary)")
    cuda = [r["cuda_max_reserved_bytes"] for r in m["memory"]["per_rank"] if r.get("cuda_max_reserved_bytes")]
    if cuda:
        lines.append(f"{'cuda max reserved':22}{format_bytes(max(cuda)):>14}")
    errs = {r["tracker_error"] for r in m["memory"]["per_rank"] if r.get("tracker_error")}
    if errs:
        lines.append(f"warning: MemTracker failed, no tracked peak: {sorted(errs)[0]}")
    losses = m["losses"]["mean"]
    if losses:
        lines.append(f"{'loss':22}{losses[0]:>14.4f} -> {losses[-1]:.4f} (mean over ranks, first -> last step)")
    return "\n".join(lines)


def _fmt(v, f):
    return "-" if v is None else f(v)


def _pct(v):
    return "-" if v is None else f"{v * 100:+.1f}%"

