"""`osdp-sim campaign FILE`: run every plan of a measurement campaign through `osdp-sim validate`,
skipping runs already recorded (so an interrupted campaign resumes where it stopped)."""

from osdp_sim.cli.common import check_seconds, percent

# The longest shipped campaign (validate/campaigns/a100x8.yaml) is about an hour; a campaign
# stopped at its limit resumes where it stopped.
DEFAULT_TIME_LIMIT_S = 86400.0
EXIT_STOPPED = 4

HELP = ("run a measurement campaign (validate/campaigns/*.yaml): every plan through `osdp-sim validate`, "
        "one record each, resumable")


def add_arguments(p) -> None:
    p.add_argument("campaign", metavar="FILE", help="campaign file (validate/campaigns/*.yaml)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the runs and which are recorded already; run nothing")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the runs whose record says failed, oom or timeout")
    p.add_argument("--wait-idle", type=percent, metavar="PCT", nargs="?", const=15.0,
                   help="before each run wait until other work keeps the CPUs at most PCT%% busy "
                        "(default 15 when given without a value): CPU timings are only comparable on an "
                        "idle machine")
    p.add_argument("--max-foreign", type=percent, metavar="PCT",
                   help="run again (up to 3 times) a run during which other processes used more than PCT%% "
                        "of the CPUs; every attempt is logged to <records_dir>/campaign-log.jsonl")
    p.add_argument("--nice", type=int, metavar="N",
                   help="run each validate (and its ranks) at this niceness increment; -20 (root only) "
                        "lets a run keep its cores when other work shares the machine")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help="time limit of the whole campaign in seconds: no run starts after it and the run "
                        "going on then is stopped, unrecorded; start the same command again to resume "
                        f"(exit code 4 when runs are left; default {DEFAULT_TIME_LIMIT_S:g}, a day)")
    p.add_argument("--only", metavar="TEXT",
                   help="run only the runs whose description contains TEXT (e.g. 'gpt2-tiny n2')")


def run(args) -> int:
    import time
    from osdp_sim.calibrate.campaign import load_campaign, pending, plan_jobs, run_campaign, validate_runner
    from osdp_sim.hardware.load import load_profile

    started_s = time.monotonic()                 # the time limit counts planning (searches) too
    check_seconds(args.time_limit, "--time-limit")

    c = load_campaign(args.campaign)
    hw = load_profile(c.hardware)
    jobs = plan_jobs(c, hw=hw)
    if args.only:
        jobs = [j for j in jobs if args.only in j.label]
    if args.dry_run:
        todo = {id(j) for j in pending(jobs, retry_failed=args.retry_failed)}
        for i, j in enumerate(jobs, 1):
            state = "to run" if id(j) in todo else "recorded"
            print(f"{i:3d}/{len(jobs)}  {state:8s}  {j.label}, seed {j.seed}  -> {j.record_path}")
        print(f"{len(todo)} of {len(jobs)} to run")
        return 0
    todo = pending(jobs, retry_failed=args.retry_failed)
    if c.device == "cuda" and todo:
        from osdp_sim.runtime.launch import check_gpus
        check_gpus(max(j.nproc for j in todo), "the campaign runs on cuda", source=args.campaign,
                   field="device", cpu_fix="a campaign file with device: cpu and a CPU profile")
    from osdp_sim.errors import UserError
    from osdp_sim.fileio import check_writable
    try:
        check_writable(c.records_dir, folder=True)
    except UserError as e:               # named as the campaign file's field
        raise UserError(f"{e}; give a writable folder", source=args.campaign, field="records_dir") from None
    max_busy = None if args.wait_idle is None else args.wait_idle / 100.0
    max_foreign = None if args.max_foreign is None else args.max_foreign / 100.0
    runner = validate_runner
    if args.nice:
        import functools
        import os
        if args.nice < 0 and hasattr(os, "geteuid") and os.geteuid() != 0:
            from osdp_sim.errors import UserError
            raise UserError("a negative niceness (higher priority) needs root; drop --nice or run as root",
                            field="--nice")
        runner = functools.partial(validate_runner, nice=args.nice)
    s = run_campaign(c, jobs=jobs, retry_failed=args.retry_failed, hw=hw, max_busy=max_busy,
                     max_foreign=max_foreign, runner=runner, log_extra={"nice": args.nice or 0},
                     time_limit_s=max(0.0, args.time_limit - (time.monotonic() - started_s)))
    print(f"campaign {c.name}: {s.total} runs: {s.skipped} already recorded, {s.ran} run now "
          f"({s.ok} ok, {len(s.failed)} not ok) in {s.wall_s / 60:.1f} min")
    for label, status, path in s.failed:
        print(f"  {status}: {label} ({path})")
    if s.left:
        print(f"stopped by --time-limit {args.time_limit:g}: {s.left} runs left; start the same command "
              "again to resume")
    print(f"records in {c.records_dir}/; fit with: osdp-sim calibrate --hw {c.hardware} "
          f"--records {c.records_dir}/n<N> -o CALIBRATED.yaml --report REPORT.md --plot PLOT.png")
    return 1 if s.failed else EXIT_STOPPED if s.left else 0
