"""`osdp-sim calibrate`: fit a hardware profile's coefficients to validation records."""

import shlex
import sys
import time
from pathlib import Path

from osdp_sim.cli.common import check_seconds, positive_int
from osdp_sim.fileio import check_writable, read_text, write_text_atomic

# 32 CPU records with leave-one-out take 3-5 minutes on 2 cores (validate/records/cpu/n2)
DEFAULT_TIME_LIMIT_S = 1800.0
EXIT_STOPPED = 4

HELP = ("fit a hardware profile's efficiency, latency, overlap and memory coefficients to measured "
        "runs (validation records); report errors before, after and leave-one-out")


def add_arguments(p) -> None:
    p.add_argument("--hw", required=True, metavar="PROFILE", help="hardware profile (YAML file or name)")
    p.add_argument("--records", required=True, nargs="+", metavar="DIR",
                   help="folders (or files) of validation records to fit on")
    p.add_argument("-o", "--output", required=True, metavar="CALIBRATED.yaml",
                   help="where to write the calibrated profile")
    p.add_argument("--report", metavar="REPORT.md", help="write the markdown report here")
    p.add_argument("--plot", metavar="PNG", help="write the predicted-vs-measured plot here")
    p.add_argument("--evaluate", nargs="+", default=[], metavar="DIR",
                   help="records to predict before and after, but not fit on (e.g. oversubscribed runs)")
    p.add_argument("--name", help="name of the calibrated profile (default: <profile>-calibrated)")
    p.add_argument("--loss", default="soft_l1",
                   help="robust loss of scipy least_squares: linear, soft_l1 (default), huber, cauchy, arctan")
    p.add_argument("--params", nargs="+", metavar="NAME",
                   help="fit only these coefficients (default: all of calibrate/params.py's set)")
    p.add_argument("--free", nargs="+", default=[], metavar="NAME",
                   help="also fit these: compute.bandwidth_efficiency, compute.backward_forward_ratio")
    p.add_argument("--mem-limit", nargs="+", default=[], metavar="SIZE",
                   help="memory limits for the search-pick check (default: two per model, between the "
                        "smallest and largest measured peak)")
    p.add_argument("--no-loo", action="store_true", help="skip leave-one-out (faster, less honest)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help="time limit of the whole command in seconds: past it the fit keeps the best "
                        "coefficients found so far, leave-one-out is not run (or not reported), the profile "
                        "and report are written and say so, and the exit code is 4 "
                        f"(default {DEFAULT_TIME_LIMIT_S:g})")
    p.add_argument("--starts", type=positive_int, metavar="N",
                   help="fit the time coefficients from N starting points (the prior and N-1 drawn from "
                        "it, fixed seed) and keep the best; default calibrate/fit.py's STARTS (8)")


def run(args) -> int:
    from osdp_sim.calibrate.calibration import calibrate
    from osdp_sim.calibrate.fit import STARTS
    from osdp_sim.calibrate.params import select_params
    from osdp_sim.calibrate.report import render, write_plot
    from osdp_sim.calibrate.runs import load_runs
    from osdp_sim.hardware.dump import save_profile
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.units import parse_bytes

    deadline_s = time.monotonic() + args.time_limit if args.time_limit is not None else None
    check_seconds(args.time_limit, "--time-limit")
    for path, flag in ((args.output, "-o"), (args.report, "--report"), (args.plot, "--plot")):
        if path:
            check_writable(path, flag)       # before the fit, not after minutes of it
    kept_head = report_head(Path(args.report)) if args.report else ""
    profile = load_profile(args.hw)
    limits = [parse_bytes(s, field="--mem-limit") for s in args.mem_limit]
    params = select_params(profile, args.params, args.free)
    runs, excluded = load_runs(args.records, profile)
    eval_runs = []
    for d in args.evaluate:
        more, more_excluded = load_runs([d], profile, strict=False)
        eval_runs += more
        excluded += more_excluded
    if not runs:
        from osdp_sim.errors import UserError
        raise UserError(f"none of the {len(excluded)} records finished ok; nothing to fit",
                        source=", ".join(args.records))
    command = "osdp-sim calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "calibrate" else ""
    cal = calibrate(profile, runs, excluded=excluded, eval_runs=eval_runs, loss=args.loss, params=params,
                    loo=not args.no_loo, limits=limits, command=command, record_dirs=args.records,
                    name=args.name, starts=args.starts or STARTS, deadline_s=deadline_s)
    out = Path(args.output)
    save_profile(cal.result.profile, out,
                 header_comment=f"Calibrated by osdp-sim calibrate on {len(runs)} runs ({cal.date}).\n"
                 f"Base profile: {profile.source}. provenance.calibration says what it was fitted on.")
    if args.plot:
        write_plot(cal, args.plot)
    text = render(cal, plot_path=args.plot, report_path=args.report, output_path=out)
    if args.report:
        write_text_atomic(Path(args.report), kept_head + text)
    _summary(cal, out, args)
    if cal.stopped:
        for why in cal.stopped:
            print(f"osdp-sim calibrate: stopped by --time-limit {args.time_limit:g}: {why}", file=sys.stderr)
        return EXIT_STOPPED
    return 0


# A report file may start with hand-written text (how to regenerate, what the numbers mean):
# everything above this line is kept when the report below it is regenerated.
KEEP_MARKER = "<!-- osdp-sim calibrate writes the report below this line; edit only above it -->"


def report_head(path: Path) -> str:
    """What the regenerated report keeps of an existing one: everything down to KEEP_MARKER (read
    before the fit, so an unreadable file is a one-line error then, not after it)."""
    if not path.exists():
        return ""
    old = read_text(path, "report")
    return old.split(KEEP_MARKER, 1)[0] + KEEP_MARKER + "\n\n" if KEEP_MARKER in old else ""


def write_report(path: Path, text: str) -> None:
    write_text_atomic(path, report_head(path) + text)


def _summary(cal, out: Path, args) -> None:
    from osdp_sim.calibrate import analysis
    from osdp_sim.calibrate.report import WHICH, pct
    r = cal.result
    print(f"calibrated {cal.base.name} on {len(cal.runs)} runs -> {out} ({r.profile.name})")
    for p in r.params:
        print(f"  {p.name:42s} {p.show(r.prior[p.name]):>12s} -> {p.show(r.fitted[p.name]):>12s}")
    for w in cal.available():
        t = analysis.summarize(cal.time_errors(w))
        m = analysis.summarize(cal.memory_errors(w))
        print(f"  {WHICH[w]:30s} time MAPE {pct(t.mape, False):>6s} (worst {pct(t.worst)}), "
              f"memory MAPE {pct(m.mape, False):>6s} (worst {pct(m.worst)})")
    print(f"  noise floor: repeats vary {pct(cal.noise.time_cv, False)}, steps within a run "
          f"{pct(cal.noise.within_run_cv, False)}")
    for what in (args.report, args.plot):
        if what:
            print(f"  wrote {what}")
