"""`osdp-sim tune`: measure the search's pick against the plans the model is least sure of and
the strongest baselines, keep the measured fastest, refit the profile (docs/tune.md)."""

import math
import sys
from pathlib import Path

from osdp_sim.cli.common import check_seconds, nonneg_int, percent, positive_int, warn_if_documented
from osdp_sim.cli.search_cmd import add_space_arguments, build_space, cap_to_device
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable
from osdp_sim.units import format_bytes, parse_bytes

HELP = ("run the search's pick, the best plans at other micro-batches and the strongest baselines for a "
        "few steps each, keep the measured fastest and refit the profile on the runs")
DEFAULT_TIME_LIMIT_S = 1800.0



def add_arguments(p) -> None:
    add_space_arguments(p)
    p.add_argument("--mem-limit", required=True, metavar="SIZE", help="peak memory limit per device")
    p.add_argument("--candidates", type=positive_int, default=3, metavar="K",
                   help="the search's pick and the best plans at the K-1 other micro-batches predicted "
                        "fastest (default 3)")
    p.add_argument("--near", type=nonneg_int, default=2, metavar="N",
                   help="also the search's N next-best distinct plans at the pick's settings (near-ties the "
                        "model ranks within its error; default 2)")
    p.add_argument("--baselines", type=nonneg_int, default=2, metavar="B",
                   help="also run the B fastest distinct uniform baselines, per-block checkpointing "
                        "included (default 2)")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs per candidate, interleaved (default 1)")
    p.add_argument("--confirm", type=nonneg_int, default=2, metavar="N",
                   help="after the first round, N more runs of every candidate within --confirm-within of "
                        "the fastest, interleaved, so near-ties are told apart (default 2; 0: none)")
    p.add_argument("--confirm-within", type=percent, default=8.0, metavar="PCT",
                   help="what counts as a near-tie, in percent of the fastest (default 8: about twice the "
                        "spread between repeats of one plan)")
    p.add_argument("--paired", type=nonneg_int, default=0, metavar="ROUNDS",
                   help="instead of --confirm's runs, train the candidates within --confirm-within of the fastest "
                        "side by side for ROUNDS rounds (osdp-sim compare) and keep the paired best: near-ties "
                        "told apart to about 12%% / sqrt(ROUNDS) on the 2-core CPU (default 0: off)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("fsdp2", "fairscale"), default="fsdp2")
    p.add_argument("--warmup", type=nonneg_int, default=2, help="untimed steps per run (default 2)")
    p.add_argument("--iters", type=positive_int, default=6, help="timed steps per run (default 6)")
    p.add_argument("--threads", type=positive_int, help="CPU threads per rank (default: cores / ranks)")
    p.add_argument("--run-timeout", type=float, default=600.0, metavar="S", help="limit per run (default 600 s)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for the records, candidates.json, tune.json and plan.json; a second "
                        "tune with the same folder resumes")
    p.add_argument("-o", "--profile-out", metavar="PROFILE.yaml",
                   help="write the refitted profile here (default: DIR/profile.yaml)")
    p.add_argument("--no-refit", action="store_true", help="do not refit the profile")
    p.add_argument("--refit-on", choices=("all", "tune"), default="all",
                   help="refit on the tune's runs and the records the profile was calibrated on (all, the "
                        "default) or on the tune's runs alone (tune: when the machine has changed since)")
    p.add_argument("--refit-starts", type=positive_int, default=2,
                   help="starting points of the refit (calibrate --starts; default 2)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help=f"limit of the whole tune in seconds (default {DEFAULT_TIME_LIMIT_S:g}); what it "
                        "stops is left for a resumed tune")


def run(args) -> int:
    from osdp_sim.calibrate.tune import STATUSES, RunSettings, tune, write_outputs
    from osdp_sim.cli.common import load_hw, load_spec
    check_seconds(args.time_limit, "--time-limit")
    if not (math.isfinite(args.run_timeout) and args.run_timeout > 0):
        raise UserError(f"expected a positive number of seconds, got {args.run_timeout}", field="--run-timeout")
    out_dir = Path(args.out)
    profile_out = Path(args.profile_out) if args.profile_out else out_dir / "profile.yaml"
    for path, flag in ((out_dir / "tune.json", "--out"), (profile_out, "-o")):
        check_writable(path, flag)
    hw = load_hw(args)
    spec = load_spec(args)
    space = build_space(args, spec, hw)
    limit = cap_to_device(parse_bytes(args.mem_limit, field="--mem-limit"), hw)
    warn_if_documented(hw)
    settings = RunSettings(hardware=args.hw, out_dir=out_dir, device=args.device, backend=args.backend,
                           warmup=args.warmup, iters=args.iters, repeats=args.repeats,
                           threads=args.threads, timeout_s=args.run_timeout, confirm=args.confirm,
                           confirm_within=args.confirm_within / 100.0, paired_rounds=args.paired)
    res = tune(spec, hw, limit, space, settings, k=args.candidates, baselines=args.baselines, near=args.near,
               refit=not args.no_refit, refit_starts=args.refit_starts, refit_on=args.refit_on,
               time_limit_s=args.time_limit)
    written = write_outputs(res, out_dir, None if args.no_refit else profile_out)
    print(format_tune(res, spec, hw, limit))
    for w in written:
        print(f"  wrote {w}")
    if res.status == "no_run":
        print(f"osdp-sim tune: {STATUSES['no_run']}", file=sys.stderr)
        return 2
    return 0


def format_tune(res, spec, hw, limit_bytes: float) -> str:
    from osdp_sim.calibrate.tune import STATUSES
    from osdp_sim.costmodel import estimate
    lines = [f"tune {spec.name} on {hw.name} within {format_bytes(limit_bytes)}: {res.status} "
             f"({STATUSES[res.status]}), {res.seconds:.0f} s", ""]
    paired = res.paired is not None and any(m.paired_ratio is not None for m in res.ranking)
    rows = [("", "predicted samples/s", "measured samples/s", "predicted peak", "measured peak", "status")
            + (("paired ratio to best",) if paired else ())]
    for m in res.ranking:
        c = m.candidate
        rows.append((c.label, f"{c.predicted_samples_per_s:.3f}",
                     "-" if m.samples_per_s is None else f"{m.samples_per_s:.3f}",
                     format_bytes(c.predicted_peak_bytes),
                     "-" if m.peak_memory_bytes is None else format_bytes(m.peak_memory_bytes), m.status)
                    + ((("-" if m.paired_ratio is None else f"{m.paired_ratio:.3f} +- {m.paired_se:.3f}"),)
                       if paired else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
              for r in rows]
    ok = [m for m in res.ranking if m.status == "ok"]
    if ok:
        best, pick = ok[0], res.search_pick
        lines.append("")
        how = (f" (paired best of {sum(m.paired_ratio is not None for m in ok)} over {res.paired['rounds']} rounds)"
               if paired else "")
        lines.append(f"measured fastest: {best.candidate.label}, {best.samples_per_s:.3f} samples/s{how}")
        if res.chosen and res.chosen != best.candidate.label:
            lines.append(f"chosen: {res.chosen} (the fastest's lead is within noise; see the note)")
        if paired and pick.paired_ratio is not None and pick is not best:
            lines.append(f"the search's pick measured {pick.paired_ratio - 1:+.1%} +- {pick.paired_se:.1%} against it, "
                         f"side by side (predicted {pick.candidate.predicted_samples_per_s / best.candidate.predicted_samples_per_s - 1:+.1%})")
        elif pick.samples_per_s is not None and pick is not best:
            lines.append(f"the search's pick measured {pick.samples_per_s / best.samples_per_s - 1:+.1%} "
                         f"against it (predicted {pick.candidate.predicted_samples_per_s / best.candidate.predicted_samples_per_s - 1:+.1%})")
        if res.spearman is not None:
            lines.append(f"rank correlation of predicted and measured: {res.spearman:.2f} over {len(ok)} plans")
    if res.profile is not None:
        lines.append(f"refitted on {res.refit_runs} runs; its predictions of the candidates:")
        for m in ok:
            lines.append(f"  {m.candidate.label}: {estimate(spec, res.profile, m.candidate.plan).samples_per_s:.3f} "
                         f"samples/s (measured {m.samples_per_s:.3f})")
    lines += [f"note: {n}" for n in res.notes]
    return "\n".join(lines)
