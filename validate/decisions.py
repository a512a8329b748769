"""The plan-quality ("decisions") campaign of issue 15: per (model, memory limit) case, the search's
pick and the tune's pick of each profile against the measured best of a reference set
(osdp_sim/calibrate/decisions.py; docs/accuracy.md, section Decisions). Run from the repository root:

    python validate/decisions.py validate/campaigns/decisions-cpu.yaml --wait-idle    # resumable
    python validate/decisions.py validate/campaigns/decisions-cpu.yaml --dry-run      # sets + estimate
    python validate/decisions.py validate/campaigns/decisions-cpu.yaml --report-only  # from the records

The Decisions section of --doc (default docs/accuracy.md) is written or replaced, the rest of the
file kept; out_dir/decisions.json (figures) and out_dir/report.md (every reference plan) beside
the records.
"""

import argparse
import sys
import time
from pathlib import Path

from osdp_sim.cli.common import percent, run_script

DEFAULT_DOC = "docs/accuracy.md"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Measure the search's and the tune's picks against the "
                                             "measured best of a reference set (issue 15).")
    ap.add_argument("cases", metavar="FILE", help="case file (validate/campaigns/decisions-cpu.yaml)")
    ap.add_argument("--dry-run", action="store_true", help="print the reference sets (made, or read back, and kept in "
                         "out_dir/<case>/reference.json) and the estimate; run nothing")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild the report from the records and reference sets on disk; run nothing")
    ap.add_argument("--wait-idle", type=percent, metavar="PCT", nargs="?", const=15.0,
                    help="before each run wait until other work keeps the CPUs at most PCT%% busy (default 15)")
    ap.add_argument("--time-limit", type=float, metavar="S",
                    help="limit of the whole campaign (default: the case file's time_limit_s); what it "
                         "stops a rerun resumes")
    ap.add_argument("--doc", default=DEFAULT_DOC, help=f"markdown file whose Decisions section is written "
                                                       f"(default {DEFAULT_DOC})")
    ap.add_argument("--no-doc", action="store_true", help="write no markdown file, print the section")
    args = ap.parse_args(argv)

    from osdp_sim.calibrate import decisions as d
    from osdp_sim.calibrate import decisions_report as rep
    from osdp_sim.cli.common import check_seconds
    from osdp_sim.fileio import check_writable
    from osdp_sim.plan import write_json_atomic
    check_seconds(args.time_limit, "--time-limit")
    if args.dry_run and args.report_only:
        from osdp_sim.errors import UserError
        raise UserError("give one of --dry-run and --report-only", field="--dry-run")
    cfg = d.load_config(args.cases)
    if not args.no_doc and not args.dry_run:
        check_writable(args.doc, "--doc")
    t0 = time.monotonic()
    refs = d.references(cfg, rebuild=not args.report_only)
    jobs = d.jobs_for(cfg, refs)
    from osdp_sim.calibrate.campaign import pending, run_campaign
    todo = pending(list(jobs.values()))
    est_s = d.estimate_seconds(cfg, todo)
    print(f"decisions {cfg.name}: {len(cfg.cases)} cases, {sum(len(r.plans) for r in refs)} reference plans "
          f"({len({k for k, _r in jobs})} to run: a plan in two cases runs once), {len(jobs)} runs ({cfg.repeats} repeats), "
          f"{len(jobs) - len(todo)} recorded, {len(todo)} to run; estimated {est_s / 60:.1f} min "
          f"(run_seconds of the case file)", flush=True)
    if args.dry_run:
        for r in refs:
            print(f"\n{r.case}: {len(r.plans)} plans")
            for k, p in r.plans.items():
                preds = ", ".join(f"{n} {c.predicted_samples_per_s[k]:.3f}" for n, c in r.profiles.items()
                                  if k in c.predicted_samples_per_s)
                print(f"  {d.describe(p)}  [{'; '.join(r.labels[k])}]  predicted samples/s: {preds}")
        if cfg.paired_rounds:
            from osdp_sim.calibrate import decisions_paired as dp
            conf = {**jobs, **d.confirm_jobs(cfg, refs, d.measure(jobs, cfg.repeats))}
            meas = d.measure(conf, cfg.repeats)
            print(f"\npaired round ({cfg.paired_rounds} rounds; a case's set is known once its runs are recorded):")
            for r in refs:
                keys = dp.paired_keys(cfg, r, meas)
                state = ("recorded" if keys and dp.read_paired(cfg, r, keys) else
                         f"about {dp.estimate_seconds(cfg, r, keys, meas) / 60:.1f} min" if keys else "not yet known")
                print(f"  {r.case}: {', '.join(r.labels[k][0] for k in keys) or '-'} ({state})")
        return 0
    limit_s = args.time_limit or cfg.time_limit_s
    if not args.report_only and todo:
        summary = run_campaign(d.campaign_of(cfg), jobs=list(jobs.values()),
                               time_limit_s=max(1.0, limit_s - (time.monotonic() - t0)),
                               max_busy=None if args.wait_idle is None else args.wait_idle / 100.0)
        print(f"decisions {cfg.name}: ran {summary.ran} ({summary.ok} ok, {len(summary.failed)} failed or "
              f"out of memory) in {summary.wall_s / 60:.1f} min"
              + (f"; {summary.left} left for a rerun" if summary.left else ""), flush=True)
    if cfg.confirm_repeats:
        confirm = d.confirm_jobs(cfg, refs, d.measure(jobs, cfg.repeats))
        left = pending(list(confirm.values()))
        print(f"decisions {cfg.name}: confirmation round: {len({k for k, _r in confirm})} contenders x "
              f"{cfg.confirm_repeats} repeats, {len(confirm) - len(left)} recorded, {len(left)} to run; "
              f"estimated {d.estimate_seconds(cfg, left) / 60:.1f} min", flush=True)
        if not args.report_only and left:
            summary = run_campaign(d.campaign_of(cfg), jobs=list(confirm.values()),
                                   time_limit_s=max(1.0, limit_s - (time.monotonic() - t0)),
                                   max_busy=None if args.wait_idle is None else args.wait_idle / 100.0)
            print(f"decisions {cfg.name}: confirmation ran {summary.ran} ({summary.ok} ok) in "
                  f"{summary.wall_s / 60:.1f} min" + (f"; {summary.left} left for a rerun" if summary.left else ""),
                  flush=True)
        jobs = {**jobs, **confirm}
    if cfg.paired_rounds and not args.report_only:
        from osdp_sim.calibrate import decisions_paired as dp
        dp.run_paired(cfg, refs, d.measure(jobs, cfg.repeats),
                      time_limit_s=max(1.0, limit_s - (time.monotonic() - t0)),
                      max_busy=None if args.wait_idle is None else args.wait_idle / 100.0)
    figs, meas = d.all_figures(cfg, refs, jobs)
    if cfg.paired_rounds:
        from osdp_sim.calibrate import decisions_paired as dp
        figs += [f for ref in refs for f in dp.paired_figures(cfg, ref, meas)]
    summ = d.summarize(figs)
    command = f"python validate/decisions.py {args.cases} --wait-idle"
    primary = "confirmed" if cfg.confirm_repeats else "first"
    done = {f.case for f in figs if f.complete and f.round == primary}
    note = ""
    if len(done) < len(cfg.cases):
        recorded = len(jobs) - len(pending(list(jobs.values())))
        note = ("**Not run yet** (written while the machine was shared): the table gives each profile's "
                "pick and its predicted gain; the measured columns fill in once the command above has run "
                "on an idle machine." if recorded == 0 else
                f"**Not complete:** {len(done)} of {len(cfg.cases)} cases fully measured ({recorded} of "
                f"{len(jobs)} runs recorded); rows marked (partial) are provisional and the summary counts "
                "complete cases only. Run the command above on an idle machine to finish.")
    noise = d.noise_of(meas, cfg.repeats, cfg.repeats + cfg.confirm_repeats) if cfg.confirm_repeats else None
    identical = []
    if cfg.paired_rounds:
        from osdp_sim.calibrate import decisions_paired as dp
        identical = dp.identical_pairs(cfg, refs, meas)
    section = rep.format_section(cfg, figs, summ, command, note, noise, identical)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cfg.out_dir / "decisions.json", rep.results_json(figs, summ))
    (cfg.out_dir / "report.md").write_text(rep.format_details(refs, meas))
    if args.no_doc:
        print(section)
    else:
        doc = Path(args.doc)
        doc.write_text(rep.replace_section(doc.read_text() if doc.is_file() else "", section))
        print(f"wrote the Decisions section of {doc}")
    print(f"wrote {cfg.out_dir / 'decisions.json'} and {cfg.out_dir / 'report.md'}")
    for s in summ:
        print(f"  {s.profile} ({s.round} round): {s.cases} complete cases; search pick best {s.search_best}, within 3% "
              f"{s.search_within}; tune pick best {s.tune_best}, within 3% {s.tune_within}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
