"""The calibration report (markdown) and its predicted-vs-measured plot."""

import math
import os
from pathlib import Path

from osdp_sim.calibrate import analysis
from osdp_sim.calibrate.calibration import TARGET_MEMORY_MAPE, TARGET_TIME_MAPE, Calibration

WHICH = {"before": "before (profile as measured)", "after": "after (in-sample)",
         "loo": "leave-one-plan-out"}
MiB = 2**20


def pct(x: float, signed: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def ms(t: float) -> str:
    return f"{t * 1e3:.1f}"


def mib(b: float | None) -> str:
    return "–" if b is None else f"{b / MiB:.1f}"


def rel(p: float, m: float | None) -> float | None:
    return None if m is None else (p - m) / m


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    return (["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def write_plot(cal: Calibration, path: str | Path) -> Path:
    from osdp_sim.viz.calibration import plot_calibration
    names = {"before": "before", "after": "after", "loo": "leave-one-out"}
    series = {names[w]: ([p.time_s for p in cal.predictions(w)], [p.memory_bytes for p in cal.predictions(w)])
              for w in cal.available()}
    return plot_calibration(path, [r.time_s for r in cal.runs], [r.memory_bytes for r in cal.runs], series,
                            title=f"{cal.base.name}: {len(cal.runs)} runs, predicted vs measured")


def render(cal: Calibration, *, plot_path: str | Path | None = None, report_path: str | Path | None = None,
           output_path: str | Path | None = None) -> str:
    r = cal.result
    runs = cal.runs
    lines = [f"# Calibration of `{cal.base.name}` on {len(runs)} runs", ""]
    models = sorted({x.model_name for x in runs})
    lines += [f"- Profile: `{cal.base.source or cal.base.name}`"
              + (f" -> `{output_path}` (`{r.profile.name}`)" if output_path else ""),
              f"- Records: {', '.join(f'`{d}`' for d in cal.record_dirs)}: {len(runs)} runs fitted "
              f"({len({x.plan_id for x in runs})} distinct plans; models {', '.join(models)}), "
              f"{len(cal.excluded)} excluded, {len(cal.eval_runs)} evaluated only",
              f"- Date: {cal.date}",
              f"- Command: `{cal.command}`" if cal.command else "",
              f"- Fit: scipy least_squares, loss `{r.loss}`, {r.nfev} evaluations, {r.message}",
              *(f"- **Stopped by the time limit**: {why}" for why in cal.stopped),
              "- Measured iteration time = median over the timed steps of the slowest rank's step; "
              "measured peak memory = tracked peak, largest over ranks.", ""]
    lines = [l for l in lines if l is not None]

    # ---- summary
    lines += ["## Summary", ""]
    rows = []
    for w in cal.available():
        t = analysis.summarize(cal.time_errors(w))
        m = analysis.summarize(cal.memory_errors(w))
        rows.append([WHICH[w], pct(t.mape, False), pct(t.mean_signed), pct(t.worst),
                     pct(m.mape, False), pct(m.mean_signed), pct(m.worst)])
    lines += _table(["predictions", "time MAPE", "time bias", "time worst", "memory MAPE", "memory bias",
                     "memory worst"], rows)
    lines.append("")
    honest = "loo" if cal.loo is not None else "after"
    t = analysis.summarize(cal.time_errors(honest))
    m = analysis.summarize(cal.memory_errors(honest))
    tag = "leave-one-plan-out" if honest == "loo" else "in-sample (leave-one-out not run)"
    lines += [f"Targets ({tag}): iteration time within {TARGET_TIME_MAPE:.0%} on average: "
              f"**{'met' if t.mape <= TARGET_TIME_MAPE else 'not met'}** ({pct(t.mape, False)}); "
              f"peak memory within {TARGET_MEMORY_MAPE:.0%}: "
              f"**{'met' if m.mape <= TARGET_MEMORY_MAPE else 'not met'}** ({pct(m.mape, False)}).", ""]
    nf = cal.noise
    lines += [f"Noise floor: identical plans repeated vary by {pct(nf.time_cv, False)} (coefficient of "
              f"variation, {len(nf.groups)} repeated plans; largest range {pct(nf.time_range_max, False)}); "
              f"within one run the timed steps vary by {pct(nf.within_run_cv, False)} (median std/mean). "
              "Time errors below the repeat variation cannot be told apart from noise.", ""]
    if r.at_bound:
        lines += [f"Coefficients the fit pushed onto a bound (the data want more than the bounds allow "
                  f"-- a sign of a structural error the coefficient stands in for): {', '.join(r.at_bound)}.", ""]
    if plot_path:
        link = os.path.relpath(plot_path, Path(report_path).parent) if report_path else str(plot_path)
        lines += [f"![predicted vs measured]({link})", ""]

    # ---- coefficients
    lines += ["## Coefficients", "",
              "Prior = the value the profile measured; the fit pays (change / sigma)^2 to move it "
              "(sigma in log units for multipliers, natural units otherwise).", ""]
    rows = []
    for p in r.params:
        before, after = r.prior[p.name], r.fitted[p.name]
        z = (p.to_internal(after) - p.to_internal(before)) / (p.sigma if p.log else 1.0)
        sig = f"{p.sigma:g} (log)" if p.log else p.show(p.sigma)
        rows.append([f"`{p.name}`", p.show(before), sig, p.show(after), f"{z:+.2f}",
                     f"[{p.show(p.lo)}, {p.show(p.hi)}]", p.why])
    lines += _table(["coefficient", "measured (prior)", "prior sigma", "fitted", "shift (sigmas)", "bounds",
                     "meaning"], rows, "lrrrrll")
    lines.append("")

    # ---- per run
    for kind in ("time", "memory"):
        title = "iteration time (ms)" if kind == "time" else "peak memory (MiB)"
        fmt = ms if kind == "time" else mib
        lines += [f"## Per run: {title}", ""]
        header = ["#", "model", "n", "plan", "measured"]
        for w in cal.available():
            header += [{"before": "before", "after": "after", "loo": "LOO"}[w], "err"]
        if kind == "time":
            header += ["step CV", "load"]
        rows = []
        errs = {w: (cal.time_errors(w) if kind == "time" else cal.memory_errors(w)) for w in cal.available()}
        for i, run in enumerate(runs):
            meas = run.time_s if kind == "time" else run.memory_bytes
            row = [str(i + 1), run.model_name, str(run.world_size), run.label, fmt(meas)]
            for w in cal.available():
                p = cal.predictions(w)[i]
                row += [fmt(p.time_s if kind == "time" else p.memory_bytes), pct(errs[w][i])]
            if kind == "time":
                row += [pct(run.time_spread, False), "–" if run.load_avg is None else f"{run.load_avg:.2f}"]
            rows.append(row)
        lines += _table(header, rows, "llrl" + "r" * (len(header) - 4))
        lines.append("")

    # ---- errors by kind of plan
    which = "loo" if cal.loo is not None else "after"
    lines += [f"## Errors by kind of plan ({WHICH[which]})", "",
              "A run counts in every row that describes it. Bias = mean signed error (negative: "
              "the model predicts too little).", ""]
    rows = [[k.kind, str(k.n), pct(k.time.mean_signed), pct(k.time.mape, False), pct(k.memory.mean_signed),
             pct(k.memory.mape, False)]
            for k in analysis.errors_by_kind(list(runs), list(cal.predictions(which)))]
    lines += _table(["plans", "runs", "time bias", "time MAPE", "memory bias", "memory MAPE"], rows)
    lines.append("")

    # ---- memory by category
    rows = memory_category_rows(cal)
    if rows:
        lines += ["## Peak memory by category (calibrated prediction vs MemTracker)", "",
                  "At the moment of each side's own peak, MiB. Parameters = sharded fp32 parameters + "
                  "gathered or compute copies; temporaries include reduce buffers. Differences "
                  "(predicted - measured) that stay put across plans point at a cost-model term, not at "
                  "a coefficient.", ""]
        lines += _table(["#", "model", "plan", "params", "grads", "optimizer", "activations", "temporaries",
                         "total", "peak during (predicted)"], rows, "lll" + "r" * 6 + "l")
        lines.append("")

    # ---- noise floor
    lines += ["## Noise floor: repeated identical plans", ""]
    if nf.groups:
        rows = [[g.model_name, str(g.world_size), g.label, str(g.n), ms(g.time_mean_s), pct(g.time_cv, False),
                 pct(g.time_range, False), pct(g.memory_range, False)] for g in nf.groups]
        lines += _table(["model", "n", "plan", "runs", "mean time (ms)", "time CV", "time range",
                         "memory range"], rows, "lrlrrrrr")
    else:
        lines.append("No plan was repeated: no between-run noise floor.")
    lines.append("")

    # ---- rank correlation
    lines += ["## Rank correlation of throughput (Spearman, predicted vs measured samples/s)", ""]
    per = {w: analysis.rank_correlations(analysis.plan_points(list(runs), list(cal.predictions(w))))
           for w in cal.available()}
    rows = []
    for k, rc in enumerate(per["before"]):
        rows.append([rc.scope, str(rc.n)] + [f"{per[w][k].rho:+.3f}" for w in cal.available()])
    lines += _table(["plans", "count"] + [WHICH[w] for w in cal.available()], rows)
    lines.append("")

    # ---- search pick
    lines += ["## Would the search pick the fastest plan?", "",
              "Among this campaign's plans for one model and world size: the plan with the highest "
              "predicted samples/s whose predicted peak fits the limit, against the plan measured fastest "
              "among those whose measured peak fits. Regret = how much slower (measured) the pick is.", ""]
    limits = list(cal.limits) or None
    rows = []
    picks = {w: analysis.search_picks(analysis.plan_points(list(runs), list(cal.predictions(w))), limits)
             for w in cal.available() if w != "before"}
    ref = picks.get("loo") or picks["after"]
    for k, c in enumerate(ref):
        row = [c.model_name, str(c.world_size), mib(c.limit_bytes), str(c.candidates),
               c.best.label if c.best else "none fits"]
        for w in picks:
            pc = picks[w][k]
            pick = pc.picked.label if pc.picked else "none predicted to fit"
            if pc.picked and not pc.picked_fits:
                pick += " (measured: does not fit)"
            row += [pick, "yes" if pc.same else "no", pct(pc.regret, False) if not pc.same else "0"]
        rows.append(row)
    header = ["model", "n", "limit (MiB)", "plans", "measured fastest that fits"]
    for w in picks:
        tag = "LOO" if w == "loo" else "calibrated"
        header += [f"pick ({tag})", "same?", "regret"]
    if rows:
        lines += _table(header, rows, "lrrrl" + "lrr" * len(picks))
    else:
        lines.append("No group of plans has peaks far enough apart for a limit to choose between them.")
    lines.append("")

    # ---- evaluated only
    if cal.eval_runs:
        lines += ["## Evaluated, not fitted", "",
                  "Runs given with --evaluate (held-out plans, or runs outside what the profile describes: "
                  "more ranks than devices, shared cores): predicted with the profile before and after "
                  "calibration, never used to fit it.", ""]
        rows = []
        for run, b, a in zip(cal.eval_runs, cal.eval_before, cal.eval_after):
            rows.append([run.model_name, str(run.world_size), "yes" if run.oversubscribed else "no", run.label,
                         ms(run.time_s), pct((b.time_s - run.time_s) / run.time_s),
                         pct((a.time_s - run.time_s) / run.time_s), mib(run.memory_bytes),
                         pct(rel(b.memory_bytes, run.memory_bytes)), pct(rel(a.memory_bytes, run.memory_bytes))])
        lines += _table(["model", "n", "oversubscribed", "plan", "time (ms)", "before", "after",
                         "memory (MiB)", "before", "after"], rows, "lrllrrrrrr")
        et = analysis.summarize([(a.time_s - x.time_s) / x.time_s for x, a in zip(cal.eval_runs, cal.eval_after)])
        em = analysis.summarize([rel(a.memory_bytes, x.memory_bytes) for x, a in zip(cal.eval_runs, cal.eval_after)])
        lines += ["", f"After calibration: time MAPE {pct(et.mape, False)} (worst {pct(et.worst)}), "
                  f"memory MAPE {pct(em.mape, False)} (worst {pct(em.worst)}).", ""]

    # ---- records
    lines += ["## Records", ""]
    lines += [f"{i + 1}. `{run.source}`" for i, run in enumerate(runs)]
    if cal.excluded:
        lines += ["", "Excluded (did not finish ok):", ""]
        lines += [f"- `{f}`: {why}" for f, why in cal.excluded]
    lines.append("")
    return "\n".join(lines)


# MemTracker category -> cost-model memory_breakdown keys
CATEGORY_MAP = {"params": (("Parameter", "Buffer"), ("params", "gathered_params", "compute_copies")),
                "grads": (("Gradient",), ("grads",)),
                "optimizer": (("Optstate",), ("optimizer",)),
                "activations": (("Activation",), ("activations",)),
                "temporaries": (("Temp", "Other"), ("temporaries", "reduce_buffers"))}


def memory_category_rows(cal: Calibration) -> list[list[str]]:
    from osdp_sim.costmodel import estimate
    hw = cal.result.profile
    rows = []
    for i, run in enumerate(cal.runs):
        tb = run.tracker_breakdown
        if not tb:
            continue
        hw_r = hw if run.world_size == hw.device.count else hw.with_devices(run.world_size)
        est = estimate(run.spec, hw_r, run.plan)
        pb = est.memory_breakdown
        cells = []
        for _, (meas_keys, pred_keys) in CATEGORY_MAP.items():
            m = sum(tb.get(k, 0) for k in meas_keys)
            p = sum(pb.get(k, 0.0) for k in pred_keys)
            cells.append(f"{mib(p)} / {mib(m)} ({(p - m) / MiB:+.1f})")
        total_m = tb.get("Total", sum(v for k, v in tb.items() if k != "Total"))
        cells.append(f"{mib(est.peak_memory_bytes)} / {mib(total_m)} ({(est.peak_memory_bytes - total_m) / MiB:+.1f})")
        rows.append([str(i + 1), run.model_name, run.label] + cells + [est.peak_during])
    return rows
