"""The decisions campaign's paired round (docs/accuracy.md, "Decisions"): after the confirmation
round, the plans that decide each case's figures are timed side by side in one process group
(`osdp-sim compare`, records/comparison.py), and the losses and gains are read from their paired
speed ratios.

Why: separate runs of one plan differ by 4-8% on the 2-core CPU, so the difference of two plans'
medians of 6 runs carries a standard error of about 6%, twice the 3% the targets are stated in.
Steps of two plans taken in the same rounds share the machine's state; their ratio's standard
error is the per-round spread of the log ratio (about 12% here) over sqrt(rounds): 1.2% at 100.

The deciding plans of a case: each profile's search pick, each profile's tune pick (from the
confirmed medians, as `osdp-sim tune` decides: decisions.tune_choice), the fastest baseline and
the confirmed best; then the other plans within `paired.within` of the confirmed best, fastest
first, up to `paired.max_plans` in all.
"""

import statistics
import sys
from dataclasses import replace
from pathlib import Path

from osdp_sim.calibrate.decisions import (CaseReference, DecisionFigures, DecisionsConfig, PlanMeasurement,
                                          best_baseline, describe, figures, tune_choice)


def paired_keys(cfg: DecisionsConfig, ref: CaseReference, meas: dict[str, PlanMeasurement]) -> list[str]:
    """The case's deciding plans (plan keys), in a fixed order; empty until each of them ran ok."""
    ok = {k: m.samples_per_s for k, m in meas.items() if k in ref.plans and m.status == "ok"}
    if not ok:
        return []
    must = []
    for c in ref.profiles.values():
        must.append(c.search_pick)
        must.append(tune_choice(c, meas, cfg.tune_near)[1])
    must += [best_baseline(ref, ok), max(ok, key=ok.get)]
    keys = list(dict.fromkeys(k for k in must if k in ok))     # a pick that did not run is left out
    best = max(ok.values())
    near = sorted((k for k, v in ok.items() if v >= (1 - cfg.paired_within) * best and k not in keys),
                  key=lambda k: -ok[k])
    return keys + near[:max(0, cfg.paired_max_plans - len(keys))]


def paired_path(cfg: DecisionsConfig, ref: CaseReference) -> Path:
    return cfg.out_dir / ref.case / "paired.json"


def read_paired(cfg: DecisionsConfig, ref: CaseReference, keys: list[str]):
    """(the case's comparison record, plan key -> the indices of its entries there) if the record
    is of the configured rounds and holds every plan of `keys` (in any order, perhaps with more: a
    change of the picks' rules that picks plans already compared reuses it), else None. A plan the
    record holds twice (two profiles reach it through different plan-file versions) has both its
    entries: the figures pool them."""
    from osdp_sim.calibrate.distinct import plan_key
    from osdp_sim.records.comparison import load_comparison
    path = paired_path(cfg, ref)
    if not path.is_file():
        return None
    c = load_comparison(path)
    if c.data["settings"].get("rounds") != cfg.paired_rounds:
        return None
    # keys name a plan as the reference set stored it (an older plan version's text, say): compare
    # plans as this version writes them
    where: dict[str, list[int]] = {}
    for i, p in enumerate(c.plans):
        where.setdefault(plan_key(p.plan), []).append(i)
    entries = {k: where.get(plan_key(ref.plans[k])) for k in keys}
    return None if any(v is None for v in entries.values()) else (c, entries)


def estimate_seconds(cfg: DecisionsConfig, ref: CaseReference, keys: list[str], meas: dict[str, PlanMeasurement]) -> float:
    """Rounds x the measured step times of the plans (global batch / samples/s), plus start-up."""
    steps = sum(ref.plans[k].global_batch / meas[k].samples_per_s for k in keys)
    return (cfg.paired_rounds + cfg.warmup) * steps + 15.0


def run_paired(cfg: DecisionsConfig, refs: list[CaseReference], meas: dict[str, PlanMeasurement], *,
               time_limit_s: float, max_busy: float | None, log=sys.stderr) -> int:
    """Run every case's comparison that is not recorded yet (the cases whose confirmation is
    complete), within time_limit_s; returns how many are left."""
    import time
    from osdp_sim.calibrate.campaign import wait_until_idle
    from osdp_sim.calibrate.paired import CompareSettings, run_comparison
    t0 = time.monotonic()
    todo = [(ref, keys) for ref in refs
            if len(keys := paired_keys(cfg, ref, meas)) > 1 and read_paired(cfg, ref, keys) is None]
    ests = [estimate_seconds(cfg, ref, keys, meas) for ref, keys in todo]
    print(f"decisions {cfg.name}: paired round: {len(todo)} cases to compare, {cfg.paired_rounds} rounds each; "
          f"estimated {sum(ests) / 60:.1f} min", file=log, flush=True)
    left = len(todo)
    for i, (ref, keys) in enumerate(todo, 1):
        est = ests[i - 1]
        spent = time.monotonic() - t0
        if spent + est > time_limit_s:
            print(f"decisions {cfg.name}: paired round stopped by the time limit ({left} cases left; "
                  "rerun to resume)", file=log, flush=True)
            break
        if max_busy is not None:
            wait_until_idle(max_busy, log=log, deadline_s=t0 + time_limit_s)
        print(f"  [{i}/{len(todo)}] {ref.case}: {len(keys)} plans x {cfg.paired_rounds} rounds, about "
              f"{est / 60:.1f} min (paired round about {sum(ests[i - 1:]) / 60:.1f} min left, "
              f"{spent / 60:.1f} min spent)",
              file=log, flush=True)
        settings = CompareSettings(warmup=cfg.warmup, rounds=cfg.paired_rounds, threads=cfg.threads,
                                   timeout_s=min(max(60.0, 3 * est), max(60.0, time_limit_s - spent)))
        labels = [ref.labels[k][0] for k in keys]
        paired_path(cfg, ref).parent.mkdir(parents=True, exist_ok=True)
        c = run_comparison([ref.plans[k] for k in keys], labels, cfg.run_hardware, paired_path(cfg, ref),
                           settings, echo=None)
        left -= 1
        print(f"      {c.status}, {c.rounds} rounds; best {c.plans[c.best].label if c.best is not None else '-'}",
              file=log, flush=True)
    return left


def paired_figures(cfg: DecisionsConfig, ref: CaseReference, meas: dict[str, PlanMeasurement]) -> list[DecisionFigures]:
    """Each profile's figures from the case's comparison record; [] when it has none."""
    keys = paired_keys(cfg, ref, meas)
    if len(keys) == 1:           # the picks, the baseline and the best are one plan: nothing to compare
        return [replace(f, round="paired", search_loss_se=0.0, tune_loss_se=0.0)
                for f in figures(ref, meas, {}, "paired", cfg.tune_near)]
    got = read_paired(cfg, ref, keys) if keys else None
    if got is None or got[0].rounds == 0:
        return []
    c, entries = got
    # one plan held twice is one plan: its copies are pooled, and the best is the best plan
    plans = {tuple(v) for v in entries.values()}
    for i in range(len(c.plans)):
        if not any(i in v for v in plans):
            plans.add((i,))
    best = max(plans, key=lambda v: statistics.fmean(c.log_speeds(list(v))))
    ok = {k: m.samples_per_s for k, m in meas.items() if k in ref.plans and m.status == "ok"}
    base_k = best_baseline(ref, ok)

    def ratio(k, other=best):
        return c.pooled_ratio(entries[k], list(other)) if k in entries else None

    out = []
    for name, ch in ref.profiles.items():
        pred = ch.predicted_samples_per_s
        pred_base = max((pred[k] for k in ch.baselines.values()), default=None)
        pick = ratio(ch.search_pick)
        tune_lab, tune_k = tune_choice(ch, meas, cfg.tune_near)
        tune = ratio(tune_k)
        gain = ratio(ch.search_pick, entries[base_k]) if base_k in entries else None
        out.append(DecisionFigures(
            case=ref.case, profile=name, round="paired", complete=c.status == "ok",
            search_pick=describe(ref.plans[ch.search_pick]),
            predicted_gain=pred[ch.search_pick] / pred_base - 1 if pred_base else 0.0,
            measured_gain=None if gain is None else gain.ratio - 1,
            search_loss=None if pick is None else max(0.0, 1 - pick.ratio), tune_pick=tune_lab,
            tune_loss=None if tune is None else max(0.0, 1 - tune.ratio),
            best=f"{' = '.join(c.plans[i].label for i in best)} ({describe(c.plans[best[0]].plan)})",
            best_samples_per_s=statistics.fmean(c.plans[i].samples_per_s for i in best),
            measured_plans=len(plans), reference_plans=len(ref.plans),
            search_loss_se=None if pick is None else pick.se,
            tune_loss_se=None if tune is None else tune.se, rounds=c.rounds))
    return out


def identical_pairs(cfg: DecisionsConfig, refs: list[CaseReference], meas: dict[str, PlanMeasurement]):
    """(case, label a, label b, PairedRatio) for every two entries of a case's comparison that are
    the same plan (two profiles' choices can reach one plan through different plan-file versions):
    a built-in check of the paired estimator, whose true ratio is 1."""
    from osdp_sim.calibrate.distinct import plan_key
    out = []
    for ref in refs:
        keys = paired_keys(cfg, ref, meas)
        got = read_paired(cfg, ref, keys) if keys else None
        if got is None:
            continue
        c = got[0]
        same = [plan_key(p.plan) for p in c.plans]
        for a in range(len(same)):
            for b in range(a + 1, len(same)):
                if same[a] == same[b]:
                    out.append((ref.case, c.plans[a].label, c.plans[b].label, c.ratio(a, b)))
    return out
