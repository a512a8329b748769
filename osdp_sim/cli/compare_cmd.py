"""`osdp-sim compare --plan A.json --plan B.json ...`: train several plans side by side in one
process group, their timed steps interleaved round by round, and report each plan's speed over
the measured best's with the standard error of that paired ratio (validate/README.md, "Comparing
plans side by side")."""

import sys

from osdp_sim.cli.common import check_seconds, nonneg_int, positive_int
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable

HELP = ("time several plans side by side (steps interleaved in one process group) and report their "
        "paired speed ratios: near-ties told apart in a fraction of the runs separate validations need")
DEFAULT_ROUNDS = 30
DEFAULT_TIMEOUT_S = 900.0
MAX_SEED = 2**32 - 1


def add_arguments(p) -> None:
    p.add_argument("--plan", action="append", required=True, metavar="PLAN.json",
                   help="a plan file (give --plan at least twice; all for one device count)")
    p.add_argument("--label", action="append", metavar="TEXT",
                   help="a name per --plan, in the same order (default: the file name)")
    p.add_argument("--hw", required=True, metavar="PROFILE", help="hardware profile for the predictions")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: the profile's device kind")
    p.add_argument("--backend", choices=("fsdp2",), default="fsdp2")
    p.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS,
                   help=f"timed rounds, one step of every plan each (default {DEFAULT_ROUNDS}); the ratio's "
                        "standard error falls as 1/sqrt(rounds)")
    p.add_argument("--warmup", type=nonneg_int, default=2, help="untimed steps of every plan first (default 2)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--threads", type=positive_int, help="CPU threads per rank (default: cores / ranks)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"limit of the whole run (default {DEFAULT_TIMEOUT_S:g} s); the rounds finished "
                        "before it are recorded")
    p.add_argument("-o", "--output", default="comparison.json", metavar="FILE",
                   help="the comparison record (default comparison.json)")


def run(args) -> int:
    from osdp_sim.calibrate.paired import CompareSettings, format_comparison, run_comparison
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.plan import load_plan

    check_seconds(args.timeout, "--timeout")
    if args.seed > MAX_SEED:
        raise UserError(f"expected at most {MAX_SEED}, got {args.seed}", field="--seed")
    if len(args.plan) < 2:
        raise UserError("give at least two plans to compare", field="--plan")
    if args.label and len(args.label) != len(args.plan):
        raise UserError(f"expected one --label per --plan ({len(args.plan)}), got {len(args.label)}",
                        field="--label")
    check_writable(args.output, "-o")
    plans = [load_plan(p) for p in args.plan]
    labels = args.label or list(args.plan)
    hw = load_profile(args.hw)
    device = args.device or hw.device.kind
    if device == "cuda":
        from osdp_sim.runtime.launch import check_gpus
        check_gpus(plans[0].devices, "--device cuda" if args.device else
                   f"the profile {hw.name!r} describes cuda devices", field="--device")
    settings = CompareSettings(device=device, backend=args.backend, warmup=args.warmup, rounds=args.rounds,
                               seed=args.seed, threads=args.threads, timeout_s=args.timeout)
    c = run_comparison(plans, labels, args.hw, args.output, settings)
    print(format_comparison(c))
    print(f"record     {args.output}")
    if c.status != "ok":
        print(f"osdp-sim compare: {c.status}; the {c.rounds} rounds finished are in the record", file=sys.stderr)
        return 3 if c.status == "oom" else 1
    return 0
