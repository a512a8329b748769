"""osdp-sim search: the plan of highest throughput within a memory limit, exactly, with the
uniform baselines, the OSDP knapsack DP for comparison, a certificate and an explanation."""

import json
import math
import sys
import time
from dataclasses import replace

from osdp_sim.cli.common import (add_hw_args, add_model_args, load_hw, load_spec, percent, positive_int,
                              warn_if_documented)
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable
from osdp_sim.planner.bnb import DEFAULT_TIME_LIMIT_S
from osdp_sim.planner.budget import Budget
from osdp_sim.planner.mbbound import fewest_devices_for_states, states_floor_bytes
from osdp_sim.planner.keygraph import GraphCaps
from osdp_sim.planner.space import checkpointing_allowed
from osdp_sim.units import format_bytes, parse_bytes


HELP = "find the plan of highest throughput within a memory limit (exact branch-and-bound)"


def add_space_arguments(p) -> None:
    """Options that shape the search space (shared with osdp-sim pareto)."""
    add_hw_args(p)
    add_model_args(p)
    p.add_argument("--micro-batch", metavar="B[,B...]", help="micro-batch size(s) per device to search "
                   "(default: 1, 2, 3, ... up to the largest at which some plan fits)")
    p.add_argument("--global-batch", type=positive_int, help="fix the global batch; micro-batches that "
                   "divide it are searched, with gradient accumulation making up the rest")
    p.add_argument("--strategies", default="ddp,zero2,zero3", metavar="LIST",
                   help="strategies per operator group, comma-separated (default: ddp,zero2,zero3)")
    p.add_argument("--splits", metavar="LIST",
                   help="operator-splitting granularities k to try, comma-separated (default: 1,2,4,8)")
    p.add_argument("--no-split", action="store_true", help="no operator splitting (same as --splits 1)")
    p.add_argument("--no-checkpoint", action="store_true", help="never use activation checkpointing")
    p.add_argument("--checkpoint-policy", choices=("full", "selective", "both"), default="full",
                   help="how checkpointed blocks recompute: full, selective (torchtitan's op-level "
                        "policy) or both (each configuration searched with either; default full)")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--shard-group", type=positive_int, metavar="S",
                   help="hybrid sharding: shard within groups of S devices, replicate across groups")


def add_headroom_argument(p) -> None:
    p.add_argument("--headroom", default="0", metavar="SIZE|PCT%",
                   help="memory to leave free beyond the predicted peak (which already includes the "
                        "profile's context and fragmentation margin): a size (2GiB) or a percentage (10%%) of "
                        "min(limit, the device's usable memory); the search plans for that minimum less it "
                        "(default 0)")


def headroom_limit(limit_bytes: float, hw, text: str) -> tuple[float, float]:
    """(the limit to search, the headroom in bytes): --mem-limit capped to the device, less --headroom."""
    from osdp_sim.planner.headroom import parse_headroom, planning_limit
    return planning_limit(limit_bytes, hw.device.usable_memory_bytes, parse_headroom(text))


def add_arguments(p) -> None:
    add_space_arguments(p)
    p.add_argument("--mem-limit", required=True, metavar="SIZE",
                   help="peak memory limit per device, e.g. 8GiB, 16GB, 12000MiB")
    add_headroom_argument(p)
    p.add_argument("--time-limit", type=float, metavar="S", default=DEFAULT_TIME_LIMIT_S,
                   help="end the command within S seconds (search, baselines and all), with the best plan "
                        f"so far and its proven gap (default {DEFAULT_TIME_LIMIT_S:g}; 0 = run until optimal)")
    p.add_argument("--gap", type=percent, default=0.0, metavar="PCT",
                   help="stop proving once no plan can beat the best found by more than PCT%% "
                        "(default 0: proven optimal); the report certifies the gap left")
    p.add_argument("--top-k", type=positive_int, default=1, metavar="K", help="also list the K best plans")
    p.add_argument("--graph-max-keys", type=positive_int, default=GraphCaps.max_level_keys, metavar="N",
                   help="a configuration's key graph (the exact bound) is abandoned past N keys on one level "
                        f"(default {GraphCaps.max_level_keys}); raise it, with --graph-max-sims, to prove "
                        "communication-bound configurations, at minutes per configuration")
    p.add_argument("--graph-max-sims", type=positive_int, default=GraphCaps.max_stage_sims, metavar="N",
                   help="... or past N new stage simulations, about 50-70 us each "
                        f"(default {GraphCaps.max_stage_sims})")
    p.add_argument("-o", "--output", metavar="PLAN.json",
                   help="write the plan file (read by osdp-sim estimate --plan and osdp-sim validate)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise ValueError(text)
    return v


def _list_arg(text: str, flag: str, allowed=None, cast=str) -> tuple:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UserError(f"expected a comma-separated list, got {text!r}", field=flag)
    out = []
    for t in items:
        try:
            v = cast(t)
        except ValueError:
            raise UserError(f"{t!r} is not a positive whole number", field=flag) from None
        if allowed is not None and v not in allowed:
            raise UserError(f"unknown value {t!r}; expected some of {', '.join(map(str, allowed))}",
                            field=flag)
        out.append(v)
    return tuple(dict.fromkeys(out))


def build_space(args, spec, hw):
    """A SearchSpace from the command line (hw already cut to --gpus)."""
    from osdp_sim.plan import SPLITS, STRATEGIES
    from osdp_sim.planner.space import SearchSpace
    strategies = _list_arg(args.strategies, "--strategies", STRATEGIES)
    if args.no_split and args.splits:
        raise UserError("conflicts with --splits (--no-split means --splits 1); give one of them",
                        field="--no-split")
    splits = (1,) if args.no_split else (_list_arg(args.splits, "--splits", SPLITS, int) if args.splits
                                         else SearchSpace.splits)
    if 1 not in splits:
        splits = (1,) + splits
    devices = hw.device.count
    if args.shard_group and (args.shard_group > devices or devices % args.shard_group):
        raise UserError(f"{args.shard_group} must divide the device count {devices}", field="--shard-group")
    if args.global_batch and args.global_batch % devices:
        raise UserError(f"{args.global_batch} is not a multiple of the {devices} devices", field="--global-batch")
    mbs = _list_arg(args.micro_batch, "--micro-batch", cast=_positive) if args.micro_batch else None
    if args.global_batch and mbs and not any((args.global_batch // devices) % mb == 0 for mb in mbs):
        raise UserError(f"no micro-batch of {', '.join(map(str, mbs))} x {devices} devices divides "
                        f"--global-batch {args.global_batch}", field="--micro-batch")
    return SearchSpace(strategies=strategies, splits=tuple(sorted(splits)),
                       checkpoint=(False,) if args.no_checkpoint else
                       {"full": (False, True), "selective": (False, "selective"),
                        "both": (False, True, "selective")}[args.checkpoint_policy],
                       micro_batches=tuple(sorted(mbs)) if mbs else None,
                       global_batch=args.global_batch,
                       shard_groups=(args.shard_group,) if args.shard_group else None,
                       precision=args.precision, optimizer=args.optimizer, devices=devices)


def describe_space(space, hw) -> str:
    """One line: what the space lets vary (for plot subtitles and progress)."""
    from osdp_sim.planner.space import devices_of, shard_groups_of
    n = devices_of(space, hw)
    mbs = ",".join(map(str, space.micro_batches)) if space.micro_batches else "1.. (up to what fits)"
    groups = shard_groups_of(space, hw, n)
    return (f"{space.precision}, {space.optimizer}; strategies {','.join(space.strategies)}; "
            f"splits {','.join(map(str, space.splits))}; checkpointing "
            f"{_checkpointing_label(space)}; micro-batches {mbs}"
            + (f"; global batch {space.global_batch}" if space.global_batch else "")
            + (f"; shard groups {','.join(map(str, groups))}" if groups != (n,) else ""))


def progress(msg: str) -> None:
    print(f"osdp-sim: {msg}", file=sys.stderr, flush=True)


def time_limit_arg(seconds: float | None, flag: str = "--time-limit", zero_is_none: bool = True) -> float | None:
    """A --time-limit value: a finite number of seconds >= 0 (0: no limit, when zero_is_none)."""
    if seconds is None:
        return None
    if not (math.isfinite(seconds) and seconds >= 0):
        raise UserError(f"expected a finite number of seconds >= 0, got {seconds}", field=flag)
    return None if seconds == 0 and zero_is_none else float(seconds)


def cap_to_device(limit_bytes: float, hw, flag: str = "--mem-limit") -> float:
    """A memory limit above the device's usable memory is capped to it, with a note."""
    usable = hw.device.usable_memory_bytes
    if limit_bytes > usable:
        progress(f"{flag} {format_bytes(limit_bytes)} is more than the {format_bytes(usable)} usable per device "
                 f"({hw.device.name}); using {format_bytes(usable)}")
        return float(usable)
    return limit_bytes


def run(args) -> int:
    from osdp_sim.planner.baselines import all_baselines
    from osdp_sim.planner.beside import Beside
    from osdp_sim.planner.bnb import search
    from osdp_sim.planner.report import explain, format_report, no_plan_to_json

    if args.output:
        check_writable(args.output, "-o")        # before the search, not after it
    budget = Budget(time_limit_arg(args.time_limit))
    limit = parse_bytes(args.mem_limit, field="--mem-limit")
    if args.gap >= 100.0:
        raise UserError(f"expected a percentage below 100, got {args.gap:g}", field="--gap")
    hw = load_hw(args)
    spec = load_spec(args)
    space = build_space(args, spec, hw)
    limit, headroom = headroom_limit(cap_to_device(limit, hw), hw, args.headroom)

    progress(f"searching {spec.name} on {hw.device.count} x {hw.device.name} within {format_bytes(limit)}"
             + (f" ({format_bytes(headroom)} headroom left free)" if headroom else "") + f": {describe_space(space, hw)} ...")
    # the baselines on the second core meanwhile, where that can pay (planner/beside.py)
    with Beside(all_baselines, spec, hw, limit, space, deadline=budget.deadline) as beside:
        result = search(spec, hw, limit, space, time_limit_s=budget.search_share(), top_k=args.top_k, progress=True,
                        graph_caps=GraphCaps(args.graph_max_keys, args.graph_max_sims), rel_gap=args.gap / 100.0)
        if result.plan is not None:
            progress(f"search {result.status} in {result.seconds:.2f} s; "
                     + ("collecting the baselines evaluated beside it ..." if beside.in_process
                        else "evaluating baselines ..."))
            baselines = beside.result()
    if result.plan is None:
        if result.status == "time_limit":
            msg = (f"time limit reached before any plan was found (no plan can exceed "
                   f"{result.best_bound_samples_per_s:.4g} samples/s); a longer --time-limit searches further")
            least = None
        else:
            msg = infeasible_message(spec, hw, limit, space, result, args, budget.deadline)
            if headroom:
                msg += (f" ({format_bytes(limit)} is the limit less --headroom {format_bytes(headroom)}; "
                        "the sizes above are peaks, before any headroom)")
            least = result.min_peak_memory_bytes
        if args.json:
            print(json.dumps(no_plan_to_json(spec, hw, limit, result, msg, min_peak_memory_bytes=least,
                                             headroom_bytes=headroom), indent=1))
        print(f"osdp-sim search: {msg}", file=sys.stderr)
        return 2
    for b in baselines.values():
        if b.note:
            progress(f"baseline {b.name}: {b.note}")
    why = explain(spec, hw, result.plan, result.prediction, baselines)

    if args.output:
        from osdp_sim.plan import save_plan
        save_plan(_with_notes(result, spec, hw, limit, headroom), args.output)
        progress(f"plan written to {args.output}")
    warn_if_documented(hw)              # with the answer, after every input was checked
    if args.json:
        full = replace(result, baselines=baselines, headroom_bytes=headroom)     # what osdp_sim.search returns
        print(json.dumps(full.to_json(explanation=why), indent=1))
    else:
        print(format_report(spec, hw, limit, result, baselines, explanation=why, top_k=args.top_k,
                            headroom_bytes=headroom))
    return 0


def _with_notes(result, spec, hw, limit, headroom_bytes: float = 0.0):
    e = result.prediction
    notes = {"made_by": "osdp-sim search", "hardware": hw.name, "mem_limit_bytes": limit,
             "headroom_bytes": headroom_bytes,
             "status": result.status, "predicted": {"peak_memory_bytes": e.peak_memory_bytes,
                                                    "iteration_time_s": e.iteration_time_s,
                                                    "samples_per_s": e.samples_per_s}}
    return replace(result.plan, notes=notes)


def infeasible_message(spec, hw, limit, space, result, args, deadline: float | None = None) -> str:
    """Nothing fits: the least peak memory any plan in the space reaches (or a proven lower bound
    on it when the time ran out), and what would fit on this device."""
    least = result.min_peak_memory_bytes
    usable = hw.device.usable_memory_bytes
    exact = result.min_peak_proven
    devices = fewest_devices_for_states(spec, hw, space.optimizer, min(limit, usable))
    states_floor = states_floor_bytes(spec, hw, space.optimizer, hw.device.count)
    if not exact and states_floor > least:
        least = states_floor             # the fully sharded model states alone: a tighter proven bound
    msg = (f"no plan of {spec.name} fits {format_bytes(limit)} per device on {hw.device.count} devices: "
           + (f"the least peak memory any plan in the space reaches is {format_bytes(least)}" if exact else
              f"the least peak memory any plan in the space reaches is at least {format_bytes(least)} "
              "(a proven bound: the least-peak search did not prove the exact least)"))
    found = None
    if not exact and result.min_peak_plan is not None:
        from osdp_sim.costmodel import estimate
        found = estimate(spec, hw, result.min_peak_plan).peak_memory_bytes
    if exact and least <= usable:
        msg += f". To fit, try --mem-limit {_round_up_mib(least)}MiB or more"
    elif found is not None and found <= usable:
        msg += f"; the leanest plan found needs {format_bytes(found)}: try --mem-limit {_round_up_mib(found)}MiB"
    elif least <= usable:
        msg += f". To fit, --mem-limit must be at least {_round_up_mib(least)}MiB"
    else:
        msg += f", more than the {format_bytes(usable)} usable per device ({hw.device.name})"
    from osdp_sim.hardware.load import load_profile
    profile = load_profile(args.hw)            # all its devices (--gpus may have cut hw)
    beyond = devices is not None and devices > profile.device.count
    hints = []
    # When the states alone need more devices than the profile has, no relaxation within it can
    # fit: leave the time to the plan on that many devices.
    for label, peak, proven in ([] if beyond or devices is None else
                                _relaxations(spec, hw, space, profile, deadline)):
        if peak < least and peak <= usable:
            what = "leanest plan" if proven else "a plan of"
            hints.append(f"{label} ({what} {format_bytes(peak)}{', fits' if peak <= limit else ''})")
    if hints:
        msg += ("; or " if least <= usable else ". To fit, try ") + "; or ".join(hints)
    if devices is not None and devices > hw.device.count:
        msg += (f". Its model states alone ({spec.param_count / 1e9:.2f} B parameters) need at least {devices} "
                f"devices to fit {format_bytes(min(limit, usable))} (fully sharded, nothing else counted)")
    if beyond and devices <= MAX_HINT_DEVICES:
        per_node = profile.device.per_node
        more = _leanest_on(spec, profile, space, devices, deadline)
        if more is not None:
            count, peak, proven = more
            msg += (f"; on {count} devices ({-(-count // per_node)} nodes of {per_node}: a multi-node profile) "
                    f"the {'leanest plan needs' if proven else 'leanest plan found needs'} {format_bytes(peak)}"
                    f"{', fits' if peak <= limit else ''}")
    return msg


MAX_HINT_DEVICES = 65536                  # beyond: the count is said, no plan on that many is searched


def _leanest_on(spec, hw, space, devices: int, deadline: float | None):
    """(devices, peak, proven) of the leanest plan on `devices` rounded up to whole nodes (and, if
    that does not fit, on twice as many), within the deadline; None when no time is left."""

    from osdp_sim.costmodel import estimate
    from osdp_sim.planner.bnb import min_peak
    per_node = hw.device.per_node
    count = -(-devices // per_node) * per_node
    for n in (count, 2 * count):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        gb = space.global_batch if space.global_batch and space.global_batch % n == 0 else None
        # Memory does not depend on the link between nodes: the profile's own shape serves.
        h = replace(hw, device=replace(hw.device, count=n))
        mp = min_peak(spec, h, replace(space, devices=n, shard_groups=None, global_batch=gb),
                      deadline=deadline, time_limit_s=None)
        if mp.proven and math.isfinite(mp.peak_bytes):
            found = (n, mp.peak_bytes, True)
        elif mp.plan is not None:
            found = (n, estimate(spec, h, mp.plan).peak_memory_bytes, False)
        else:
            return None
        if found[1] <= hw.device.usable_memory_bytes:
            return found
    return found


def _round_up_mib(n_bytes: float) -> int:
    return int(-(-n_bytes // 2**20))


def _relaxations(spec, hw, space, profile, deadline: float | None = None):
    """(label, peak, proven) with one restriction of the space lifted at a time: checkpointing,
    the micro-batch, more devices (all of the profile's, or twice as many on a larger profile,
    each with its own shard groups), sharding over all devices. The peak is min_peak() of that
    space (proven), or, when the deadline stops it, the leanest plan it found."""
    from osdp_sim.costmodel import estimate

    from osdp_sim.planner.bnb import min_peak
    from osdp_sim.planner.space import devices_of, shard_groups_of
    n = devices_of(space, hw)
    tried = []
    if not checkpointing_allowed(space):
        tried.append(("allowing checkpointing (drop --no-checkpoint)", hw, replace(space, checkpoint=(False, True))))
    if space.micro_batches is not None and min(space.micro_batches) > 1:
        tried.append(("micro-batch 1", hw, replace(space, micro_batches=(1,), global_batch=None)))
    profile_devices = profile.device.count

    def on(devices: int):
        gb = space.global_batch if space.global_batch and space.global_batch % devices == 0 else None
        return profile.with_devices(devices), replace(space, devices=devices, shard_groups=None, global_batch=gb)

    if n < profile_devices:
        tried.append((f"all {profile_devices} devices of the profile (--gpus {profile_devices})", *on(profile_devices)))
    else:
        tried.append((f"{2 * n} devices (a larger hardware profile)", *on(2 * n)))
    if min(shard_groups_of(space, hw, n)) < n:
        tried.append(("sharding over all devices (drop --shard-group)", hw, replace(space, shard_groups=(n,))))
    out = []
    for label, h, sp in tried:
        if deadline is not None and time.perf_counter() > deadline:
            break
        mp = min_peak(spec, h, sp, deadline=deadline, time_limit_s=None)
        if mp.proven and math.isfinite(mp.peak_bytes):
            out.append((label, mp.peak_bytes, True))
        elif mp.plan is not None:
            out.append((label, estimate(spec, h, mp.plan).peak_memory_bytes, False))
    return out


def _checkpointing_label(space) -> str:
    if not checkpointing_allowed(space):
        return "off"
    policies = [p for p, on in (("full", True in space.checkpoint),
                                ("selective", "selective" in space.checkpoint)) if on]
    return "allowed (" + ", ".join(policies) + ")"
