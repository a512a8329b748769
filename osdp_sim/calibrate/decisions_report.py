"""The Decisions section of docs/accuracy.md and the per-plan report, from the figures of
calibrate/decisions.py."""

import math
import statistics

from osdp_sim.calibrate.decisions import (WITHIN, CaseReference, DecisionFigures, DecisionsConfig,
                                          DecisionSummary, PlanMeasurement, describe)

SECTION = "## Decisions"


def _pct(v: float | None, signed: bool = True) -> str:
    if v is None:
        return "-"
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def format_section(cfg: DecisionsConfig, figs: list[DecisionFigures], summary: list[DecisionSummary],
                   command: str, note: str = "", noise=None, identical=()) -> str:
    lines = [SECTION, "",
             "How often the search's pick and the tune's pick are the fastest plan measured (issue 15). Per "
             "(model, memory limit) case a **reference set** is run for real: the union over the "
             "profiles below of the search's top-N *distinct* plans, every feasible baseline (uniform "
             "DDP / ZeRO-2 / ZeRO-3 with checkpointing all or none, and each with per-block "
             "checkpointing) and the tune's candidates (`osdp-sim tune`'s choose_candidates). "
             "*Distinct*: plans that differ only by a permutation of identical blocks are one plan; "
             "they must differ in micro-batch, accumulation, the root's choice, or the multiset of "
             "per-block (strategy, checkpointed) choices (osdp_sim/calibrate/distinct.py "
             "`plan_signature`). Identical plans are run once. Every plan runs "
             f"{cfg.repeats} times ({cfg.warmup} warmup + {cfg.iters} timed steps, 2 gloo ranks x "
             f"{cfg.threads or 'cores/ranks'} thread), interleaved (repeat 1 of every plan, then repeat "
             "2, ...), with `--wait-idle`; its figure is the median samples/s of the ok repeats. The "
             "**measured best** is the fastest plan of the set."
             + ("" if not cfg.confirm_repeats else
                f" **Confirmation round:** the first round's best is the largest of many noisy medians, "
                "so it sits above its plan's true speed and inflates every other plan's loss against it. "
                f"After the first round, each case's *contenders* (every plan within {cfg.confirm_within:.0%} "
                "of its best, each profile's search pick, and each profile's tune candidates within "
                f"{cfg.confirm_within:.0%} of the best of them, as `osdp-sim tune --confirm` does) run "
                f"{cfg.confirm_repeats} more times, interleaved; their figure is then the median of all "
                f"{cfg.repeats + cfg.confirm_repeats} repeats, and the measured best is taken again over "
                "the set (osdp_sim/calibrate/decisions.py `contenders`)."),
             "",
             "Per profile: the *search pick* is its search's plan; *predicted gain* = its predicted "
             "samples/s over the best baseline's predicted by the same profile, minus 1; *measured gain* "
             "= its measured samples/s over the best measured baseline, minus 1; *loss* = 1 - measured "
             "/ measured best. The *tune pick* is the tune procedure on these measurements: that "
             f"profile's tune candidates (choose_candidates, with the search's next {cfg.tune_near} distinct "
             "plans, `tune --near`, read from the set's top-N), the measured fastest of them. Targets "
             "(issue 15): tune pick "
             f"within {WITHIN:.0%} of the measured best in every case; search pick within {WITHIN:.0%} in "
             "at least 7 of 8 after the model fix; predicted gain within 5 points of the measured one.",
             "", "Regenerate (runs only what is not recorded; `--report-only` rebuilds this section from "
             "the records, `--dry-run` prints the reference sets and the time estimate):", "",
             f"    {command}", ""]
    if note:
        lines += [note, ""]
    primary = "confirmed" if cfg.confirm_repeats else "first"
    firsts = {(f.case, f.profile): f for f in figs if f.round == "first"}

    def loss(f, attr):
        v = _pct(getattr(f, attr), False)
        if f.round == "first":
            return v
        return f"{v} ({_pct(getattr(firsts[(f.case, f.profile)], attr), False)})"

    lines += ["| case | profile | search pick | predicted gain | measured gain | search loss | tune pick | "
              "tune loss | measured best | plans ok |", "|---|---|---|---:|---:|---:|---|---:|---|---:|"]
    for f in figs:
        if f.round != primary:
            continue
        mark = "" if f.complete else " (partial)"
        lines.append(f"| {f.case}{mark} | {f.profile} | {f.search_pick} | {_pct(f.predicted_gain)} | "
                     f"{_pct(f.measured_gain)} | {loss(f, 'search_loss')} | {f.tune_pick or '-'} | "
                     f"{loss(f, 'tune_loss')} | {f.best or '-'}"
                     + (f", {f.best_samples_per_s:.3f} samples/s" if f.best_samples_per_s else "")
                     + f" | {f.measured_plans}/{f.reference_plans} |")
    if cfg.confirm_repeats:
        lines += ["", "Losses in parentheses: the first round alone (every plan's median of "
                  f"{cfg.repeats}), before the contenders were measured again."]
    paired = [f for f in figs if f.round == "paired"]
    if paired:
        lines += ["", f"**Paired round.** Per case, the plans that decide its figures (each profile's search "
                  "pick and tune pick, the fastest baseline and the confirmed best, then the plans within "
                  f"{cfg.paired_within:.0%} of the best, at most {cfg.paired_max_plans}) are trained side by side "
                  f"in one process group (`osdp-sim compare`, {cfg.paired_rounds} rounds, each one step of every "
                  "plan, the order rotated every round). A loss or gain is read from the paired speed ratio "
                  "(the geometric mean over rounds of the per-round ratio) and carries its standard error "
                  "(osdp_sim/records/comparison.py): what slows the machine for a few seconds slows both steps "
                  "of a round, so the ratio is resolved far better than by separate runs. The best here is the "
                  "fastest of the compared plans; a plan compared twice (two profiles reach it through "
                  "different plan-file versions) is one plan, its copies' log speeds averaged per round. The "
                  "tune pick is the one the confirmed medians chose (as `osdp-sim tune` decides, "
                  "calibrate/noise.py); the gains are over the fastest baseline by the confirmed medians.",
                  "", "| case | profile | search loss | tune pick | tune loss | predicted gain | measured gain | "
                  "best of the compared | plans | rounds |", "|---|---|---:|---|---:|---:|---:|---|---:|---:|"]
        for f in paired:
            lines.append(f"| {f.case}{'' if f.complete else ' (partial)'} | {f.profile} | "
                         f"{_pm(f.search_loss, f.search_loss_se)} | {f.tune_pick or '-'} | "
                         f"{_pm(f.tune_loss, f.tune_loss_se)} | {_pct(f.predicted_gain)} | {_pct(f.measured_gain)} | "
                         f"{f.best or '-'} | {f.measured_plans} | {f.rounds} |")
        if identical:
            z = [abs(math.log(r.ratio)) / r.se for *_l, r in identical if r.se > 0]
            lines += ["", f"**A check of the paired estimator.** {len(identical)} comparisons hold one plan twice "
                      "(two profiles reach it through different plan-file versions, so the campaign keeps both); "
                      "its two copies' true ratio is 1. Measured: "
                      + "; ".join(f"{case} {a} / {b} {r.ratio:.3f} +- {r.se:.3f}" for case, a, b, r in identical)
                      + (f". They differ by {statistics.median(z):.1f} standard errors (median; at most "
                         f"{max(z):.1f}; about 0.7 is what an honest standard error gives). The mean squared "
                         f"difference is {statistics.fmean(v * v for v in z):.2f} standard errors squared against 1 "
                         f"expected: the quoted errors are about {math.sqrt(statistics.fmean(v * v for v in z)):.2f}x "
                         "too small where above 1, from what differs between two model instances in one process "
                         "(where their tensors lie), which pairing does not cancel." if z else ".")]
    lines += ["", "| profile | round | cases | search pick best | within 3% | worst loss | tune pick best | within 3% | "
              "worst loss | mean abs(pred - meas gain) | gains within 5 pts |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s.profile} | {s.round} | {s.cases} | {s.search_best} | {s.search_within} | "
                     f"{_pct(s.search_worst_loss, False)} | {s.tune_best} | {s.tune_within} | "
                     f"{_pct(s.tune_worst_loss, False)} | "
                     + ("-" if s.mean_gain_error_points is None else f"{s.mean_gain_error_points:.1f} pts")
                     + f" | {s.gains_within_5_points} |")
    if noise is not None:
        lines += ["", f"**What the measurements can resolve.** Over the {noise.plans} contenders measured "
                  f"{cfg.repeats + cfg.confirm_repeats} times, one plan's repeats differ by "
                  f"{noise.repeat_cv:.1%} (median coefficient of variation), and the second round's medians "
                  f"sit {noise.round_shift:+.1%} from the first's (the machine between the rounds; within a "
                  "round the plans are interleaved, so the drift touches them alike). At that spread the "
                  f"difference of two plans' medians of {cfg.repeats + cfg.confirm_repeats} carries a standard "
                  f"error of about {noise.difference_se:.1%}: a loss below about twice that "
                  f"({2 * noise.difference_se:.1%}) is not told apart from zero, and the {WITHIN:.0%} targets "
                  "lie below what these runs resolve. (osdp_sim/calibrate/decisions.py `noise_of`.)"]
    lines.append("")
    import textwrap
    return "\n".join(textwrap.fill(l, 100, break_on_hyphens=False, break_long_words=False)
                     if l and not l.startswith(("|", "    ")) else l for l in lines)


MARKER = "<!-- osdp-sim calibrate writes the report below this line"
"""Where calibrate's generated report starts (cli/calibrate_cmd.py KEEP_MARKER): the section stays above."""


def replace_section(doc: str, section: str) -> str:
    """doc with its "## Decisions" section (to the next heading of level 1 or 2, or calibrate's
    marker) replaced by `section`; without one, `section` goes before calibrate's marker, else
    before the second level-1 heading, else at the end."""
    lines = doc.splitlines(keepends=True)
    body = section if section.endswith("\n") else section + "\n"

    def stop(l):
        return l.startswith("# ") or l.startswith("## ") or l.startswith(MARKER)

    start = next((i for i, l in enumerate(lines) if l.rstrip("\n") == SECTION), None)
    if start is None:
        marks = [i for i, l in enumerate(lines) if l.startswith(MARKER)]
        tops = [i for i, l in enumerate(lines) if l.startswith("# ")]
        at = marks[0] if marks else (tops[1] if len(tops) > 1 else len(lines))
        before = "".join(lines[:at])
        sep = "" if before.endswith("\n\n") or not before else ("\n" if before.endswith("\n") else "\n\n")
        return before + sep + body + ("\n" if at < len(lines) else "") + "".join(lines[at:])
    end = next((i for i in range(start + 1, len(lines)) if stop(lines[i])), len(lines))
    return "".join(lines[:start]) + body + ("\n" if end < len(lines) else "") + "".join(lines[end:])


def format_details(refs: list[CaseReference], meas: dict[str, PlanMeasurement]) -> str:
    """Every reference plan of every case: labels, each profile's prediction, the measurement."""
    out = ["# Decisions: every reference plan", ""]
    for ref in refs:
        profs = list(ref.profiles)
        out += [f"## {ref.case}", "",
                "| plan | in the set as | " + " | ".join(f"predicted ({p})" for p in profs)
                + " | measured samples/s | first round | status |",
                "|---|---|" + "---:|" * len(profs) + "---:|---:|---|"]
        rows = sorted(ref.plans, key=lambda k: -(meas[k].samples_per_s or 0) if k in meas else 0)
        for k in rows:
            m = meas.get(k)
            out.append(f"| {describe(ref.plans[k])} | {'; '.join(ref.labels[k])} | "
                       + " | ".join(_num(ref.profiles[p].predicted_samples_per_s.get(k)) for p in profs)
                       + f" | {'-' if not m or m.samples_per_s is None else f'{m.samples_per_s:.3f}'} | "
                       f"{'-' if not m or m.first_samples_per_s is None else f'{m.first_samples_per_s:.3f}'} | "
                       f"{m.status if m else 'not run'}" + (f" ({m.repeats_ok}/{m.repeats_recorded} ok)" if m else "")
                       + " |")
        out.append("")
    return "\n".join(out)


def results_json(figs: list[DecisionFigures], summary: list[DecisionSummary]) -> dict:
    """`cases` and `summary` of the primary round (the confirmed one when there is one), and the
    first round's beside them under `first_round` when a confirmation ran (docs/json.md)."""
    from dataclasses import asdict
    from osdp_sim.jsonformat import stamped
    primary = "confirmed" if any(f.round == "confirmed" for f in figs) else "first"
    out = {"cases": [asdict(f) for f in figs if f.round == primary],
           "summary": [asdict(s) for s in summary if s.round == primary]}
    if primary == "confirmed":
        out["first_round"] = {"cases": [asdict(f) for f in figs if f.round == "first"],
                              "summary": [asdict(s) for s in summary if s.round == "first"]}
    if any(f.round == "paired" for f in figs):
        out["paired_round"] = {"cases": [asdict(f) for f in figs if f.round == "paired"],
                               "summary": [asdict(s) for s in summary if s.round == "paired"]}
    return stamped("decisions", out)


def _pm(v: float | None, se: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1%}" + ("" if se is None else f" +- {se:.1%}")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
