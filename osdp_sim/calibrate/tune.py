"""Measure before committing to a plan: the search's pick, the best plans at other micro-batches
and the strongest baselines are each run for a few steps (the campaign machinery: real ranks,
records kept, failures recorded, resumable), the measured fastest is the answer, and the profile
is refitted on these runs together with the records it was calibrated on.

What the candidates differ in is what the time model is least sure of (docs/tune.md): the
micro-batch (GEMM efficiency and per-kernel costs by batch), the amount of recomputation, the
strategy mix (the baselines: one strategy everywhere, checkpointing all-or-none or per block) and
which groups are sharded (the search's next-best distinct plans). Permutations of the pick's
blocks are not candidates."""

import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from osdp_sim.calibrate.campaign import (Campaign, Job, expected_record_name, recorded_status,
                                         run_campaign)
from osdp_sim.calibrate.distinct import top_distinct
from osdp_sim.costmodel import estimate
from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan import Plan, plan_from_dict, plan_to_dict, save_plan, write_json_atomic

STATUSES = {
    "measured": "every candidate was run; the plan is the measured fastest",
    "partial": "the time limit stopped the runs; the plan is the fastest of those measured (resume "
               "with the same command and --out)",
    "no_run": "no candidate ran to the end (all failed, ran out of memory or were not started); no plan",
}
"""TuneResult.status values."""


@dataclass(frozen=True)
class Candidate:
    """A plan the tune measures."""

    label: str
    """What it is: 'search pick', 'best at micro-batch 4', a baseline's name."""
    plan: Plan
    predicted_samples_per_s: float
    predicted_peak_bytes: float


@dataclass(frozen=True)
class Measured:
    """A candidate after its runs."""

    candidate: Candidate
    status: str
    """ok when at least one repeat ran ok; else the status of its last record (oom, failed,
    timeout) or 'not run' (the time limit came first)."""
    samples_per_s: float | None
    """Median over the repeats that ran ok (samples/s of the whole job)."""
    peak_memory_bytes: float | None
    """Largest measured peak (per rank) over the ok repeats."""
    records: tuple[str, ...]
    repeats_samples_per_s: tuple[float, ...] = ()
    """Every ok repeat's samples/s."""
    paired_ratio: float | None = None
    """With a paired comparison (RunSettings.paired_rounds): its speed over the paired best's."""
    paired_se: float | None = None
    """The standard error of paired_ratio."""


@dataclass
class TuneResult:
    """The tune's answer (status: one of STATUSES)."""

    status: str
    plan: Plan | None
    """The measured fastest candidate's plan (None when none ran ok)."""
    ranking: list[Measured]
    """Every candidate, measured fastest first (those not measured last, by prediction)."""
    spearman: float | None
    """Rank correlation of predicted and measured samples/s over the ok candidates (None below 3)."""
    profile: HardwareProfile | None
    """The refitted profile (None when not refitted)."""
    refit_runs: int = 0
    """Runs the refit used: the tune's plus the profile's earlier records found on disk."""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    paired: dict | None = None
    """The paired comparison of the contenders, when one ran: path, status, rounds."""
    chosen: str | None = None
    """Label of the candidate whose plan is `plan`: the measured fastest, or the search's pick when
    the fastest's lead over it is within noise (choose)."""

    @property
    def search_pick(self) -> Measured:
        return next(m for m in self.ranking if m.candidate.label == "search pick")

    def to_json(self) -> dict:
        from osdp_sim.jsonformat import stamped
        return stamped("tune", {
            "status": self.status, "seconds": self.seconds, "spearman": self.spearman,
            "plan": None if self.plan is None else plan_to_dict(self.plan),
            "ranking": [{"label": m.candidate.label, "status": m.status,
                         "predicted_samples_per_s": m.candidate.predicted_samples_per_s,
                         "predicted_peak_bytes": m.candidate.predicted_peak_bytes,
                         "measured_samples_per_s": m.samples_per_s,
                         "measured_peak_bytes": m.peak_memory_bytes, "records": list(m.records),
                         "paired_ratio_to_best": m.paired_ratio, "paired_se": m.paired_se}
                        for m in self.ranking],
            "refit_runs": self.refit_runs, "notes": list(self.notes), "paired": self.paired,
            "chosen": self.chosen})


# ---------------------------------------------------------------- candidates

def choose_candidates(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space, *,
                      k: int = 3, baselines: int = 2, near: int = 2,
                      time_limit_s: float | None = 60.0) -> list[Candidate]:
    """The search's pick, its `near` next-best distinct plans (they differ from the pick in the
    multiset of per-block choices, the root or the checkpointing: calibrate/distinct.py
    plan_signature), the best plan at each of the k - 1 other micro-batches predicted fastest,
    and the `baselines` fastest distinct baselines (uniform strategies, checkpointing all-or-none
    or per block). Duplicates (the same plan reached twice) are listed once."""
    from osdp_sim.planner.baselines import per_block_baselines, uniform_baselines
    from osdp_sim.planner.bnb import search
    t0 = time.perf_counter()

    def left(share: float = 1.0):
        if time_limit_s is None:
            return None
        return max(1.0, (time_limit_s - (time.perf_counter() - t0)) * share)

    if near > 0:
        res, top = top_distinct(spec, hw, mem_limit_bytes, space, 1 + near, time_limit_s=left(0.5))
    else:
        res, top = search(spec, hw, mem_limit_bytes, space, time_limit_s=left(0.5)), []
    if res.plan is None:
        from osdp_sim.units import format_bytes
        raise UserError(f"no plan fits {format_bytes(mem_limit_bytes)} per device ({res.status}); "
                        "run osdp-sim search for the least memory a plan needs", field="--mem-limit")
    out = [Candidate("search pick", res.plan, res.prediction.samples_per_s, res.prediction.peak_memory_bytes)]
    out += [Candidate(f"search top {i + 1}", p, e.samples_per_s, e.peak_memory_bytes)
            for i, (p, e) in enumerate(top) if i > 0]
    if k > 1:
        others = []
        for mb in _other_micro_batches(space, res.plan.micro_batch):
            r = search(spec, hw, mem_limit_bytes, replace(space, micro_batches=(mb,)), time_limit_s=left(0.1))
            if r.plan is not None:
                others.append(Candidate(f"best at micro-batch {mb}", r.plan, r.prediction.samples_per_s,
                                        r.prediction.peak_memory_bytes))
        out += sorted(others, key=lambda c: -c.predicted_samples_per_s)[:k - 1]
    if baselines > 0:
        found = uniform_baselines(spec, hw, mem_limit_bytes, space)
        found.update(per_block_baselines(spec, hw, mem_limit_bytes, space))
        fits = sorted((b for b in found.values() if b.feasible), key=lambda b: -b.samples_per_s)
        out += [Candidate(b.name, b.plan, b.samples_per_s, b.peak_memory_bytes) for b in fits]
    seen, unique = set(), []
    n_base = 0
    for c in out:
        key = json.dumps(plan_to_dict(c.plan), sort_keys=True)
        if key in seen:
            continue
        is_base = not c.label.startswith(("search ", "best at"))
        if is_base and n_base >= baselines:
            continue
        n_base += is_base
        seen.add(key)
        unique.append(c)
    return unique


def check_runnable(spec: ModelSpec) -> None:
    """What validate cannot run is refused before the search, not after every run failed."""
    from osdp_sim.model.config import DESCRIBED, check_runtime_buildable
    cfg = spec.config
    if cfg.family == DESCRIBED:
        raise UserError("a described module runs from Python (osdp_sim.runtime.factory), not through "
                        "validate; tune its plans there", source=cfg.source or cfg.name, field="--model")
    if cfg.implementation == "hf":
        from osdp_sim.model.hf import check_transformers, hf_config_path
        check_transformers(field="--model")
        hf_config_path(cfg)
    else:
        check_runtime_buildable(cfg)


def _other_micro_batches(space, picked: int) -> list[int]:
    if space.micro_batches is not None:
        return [m for m in space.micro_batches if m != picked]
    return [m for m in range(1, 2 * picked + 2) if m != picked]


# ---------------------------------------------------------------- running

@dataclass(frozen=True)
class RunSettings:
    """How each candidate is run (validate's options)."""

    hardware: str
    """The profile as validate takes it (a file or a name)."""
    out_dir: Path
    """Records under out_dir/records; candidates.json, tune.json, plan.json beside them."""
    device: str = "cpu"
    backend: str = "fsdp2"
    warmup: int = 2
    iters: int = 6
    repeats: int = 1
    seed: int = 0
    threads: int | None = None
    timeout_s: float = 600.0
    confirm: int = 2
    """Extra repeats of the contenders after the first round: every candidate whose first-round
    median is within confirm_within of the fastest (0: none)."""
    confirm_within: float = 0.08
    """About twice the spread between repeats of one plan on an idle machine (4.7% on the 2-core
    CPU, docs/accuracy.md): candidates closer than this to the fastest are not told apart by one
    round."""
    paired_rounds: int = 0
    """Instead of `confirm` more runs, time the contenders side by side for this many rounds
    (osdp-sim compare, calibrate/paired.py) and rank them by their paired ratios (0: do not)."""


def _campaign(settings: RunSettings, name: str) -> Campaign:
    return Campaign(name=name, source=str(settings.out_dir), hardware=settings.hardware,
                    device=settings.device, records_dir=settings.out_dir / "records",
                    backend=settings.backend, warmup=settings.warmup, iters=settings.iters,
                    threads=settings.threads, seed=settings.seed, timeout_s=settings.timeout_s, runs=())


def jobs_for(cands: list[Candidate], c: Campaign, repeats: int, *, first: int = 0,
             which: list[int] | None = None) -> list[Job]:
    """Interleaved: every candidate once, then every candidate again, ... (so slow drift of the
    machine touches all candidates alike). Repeats first .. first + repeats - 1 of the candidates
    `which` (indices; default all)."""
    from osdp_sim.runtime.launch import available_cores
    jobs = []
    total = first + repeats
    for r in range(first, total):
        for i, cand in enumerate(cands):
            if which is not None and i not in which:
                continue
            n = cand.plan.devices
            threads = c.threads or max(1, available_cores() // n)
            # whose modules run it: the implementation its description follows (a config.json
            # model is transformers', validate --impl hf), so prediction and run are of one model
            impl = cand.plan.model.implementation
            name = expected_record_name(cand.plan, backend=c.backend, device=c.device, world=n,
                                        threads=threads, warmup=c.warmup, iters=c.iters, seed=c.seed + r,
                                        impl=impl)
            jobs.append(Job(model=cand.plan.model.name, nproc=n, plan=cand.plan, seed=c.seed + r, repeat=r,
                            record_path=c.records_dir / f"n{n}" / name,
                            label=cand.label + (f" (repeat {r + 1}/{total})" if total > 1 else ""),
                            field=f"candidates[{i}]", impl=impl))
    return jobs


def measured(cands: list[Candidate], jobs: list[Job]) -> list[Measured]:
    from osdp_sim.records import load_record
    out = []
    for i, cand in enumerate(cands):
        mine = [j for j in jobs if j.field == f"candidates[{i}]"]
        sps, peaks, paths, last = [], [], [], "not run"
        for j in mine:
            if recorded_status(j.record_path) is None:
                continue
            rec = load_record(j.record_path)
            paths.append(str(j.record_path))
            last = rec.status
            if rec.ok:
                step_s = rec.data["measured"]["iteration_time_s"]["median"]
                sps.append(cand.plan.global_batch / step_s)
                peaks.append(float(rec.measured_peak_memory_bytes))
        out.append(Measured(cand, "ok" if sps else last, statistics.median(sps) if sps else None,
                            max(peaks) if peaks else None, tuple(paths), tuple(sps)))
    return out


def contenders(first: list[Measured], within: float) -> list[int]:
    """Indices of the candidates measured ok whose samples/s is within `within` of the fastest."""
    ok = [m.samples_per_s for m in first if m.status == "ok"]
    if not ok:
        return []
    best = max(ok)
    return [i for i, m in enumerate(first) if m.status == "ok" and m.samples_per_s >= (1 - within) * best]


def spearman(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    from scipy.stats import spearmanr
    return float(spearmanr(xs, ys).statistic)


# ---------------------------------------------------------------- the whole loop

DRIFT = 0.15
"""A refit whose predictions of the tune's own runs are off by more than this (mean absolute
relative error) says so: the earlier records then describe another state of the machine."""


def tune(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space, settings: RunSettings, *,
         k: int = 3, baselines: int = 2, near: int = 2, refit: bool = True, refit_starts: int = 2,
         refit_on: str = "all", time_limit_s: float | None = 1800.0, log=sys.stderr) -> TuneResult:
    """choose_candidates, run each `settings.repeats` times, run the contenders (those within
    settings.confirm_within of the fastest) settings.confirm more times, rank by measurement
    (median over each candidate's ok repeats), refit.

    The candidates are written to out_dir/candidates.json first; a second call with the same
    out_dir (and the same model, profile and limit) reuses them and runs only what has no record
    yet, so a stopped tune resumes. The time limit covers the whole call: a tenth (at most 60 s)
    for choosing, the refit a fifth of what the runs leave (at least 30 s)."""
    t0 = time.monotonic()

    def left():
        return None if time_limit_s is None else time_limit_s - (time.monotonic() - t0)

    check_runnable(spec)
    out_dir = settings.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    key = {"model": spec.name, "seq_len": spec.seq_len, "hardware": hw.name,
           "mem_limit_bytes": mem_limit_bytes, "k": k, "baselines": baselines, "near": near}
    cands = _load_candidates(out_dir / "candidates.json", key, spec)
    if cands is None:
        choose_s = None if time_limit_s is None else min(60.0, 0.1 * time_limit_s)
        _say(log, f"tune: choosing candidates (search, its near-ties, other micro-batches, baselines) ...")
        cands = choose_candidates(spec, hw, mem_limit_bytes, space, k=k, baselines=baselines, near=near,
                                  time_limit_s=choose_s)
        write_json_atomic(out_dir / "candidates.json", {
            "key": key, "candidates": [{"label": c.label, "plan": plan_to_dict(c.plan),
                                        "predicted_samples_per_s": c.predicted_samples_per_s,
                                        "predicted_peak_bytes": c.predicted_peak_bytes} for c in cands]})
    else:
        _say(log, f"tune: resuming with the {len(cands)} candidates of {out_dir / 'candidates.json'}")
    for c in cands:
        _say(log, f"tune:   {c.label}: predicted {c.predicted_samples_per_s:.3f} samples/s, "
                  f"peak {c.predicted_peak_bytes / 2**20:.1f} MiB")

    camp = _campaign(settings, f"tune-{spec.name}")
    jobs = jobs_for(cands, camp, settings.repeats)
    runs_left = left()
    run_limit = None if runs_left is None else max(1.0, runs_left - max(30.0, 0.2 * runs_left) * refit)
    t_runs = time.monotonic()
    summary = run_campaign(camp, jobs=jobs, log=log, time_limit_s=run_limit)
    comparison, which, notes = None, [], []
    if settings.paired_rounds and not summary.left:
        which = contenders(measured(cands, jobs), settings.confirm_within)
        if len(which) > 1:
            limit2 = None if run_limit is None else max(1.0, run_limit - (time.monotonic() - t_runs))
            comparison = _compare(cands, which, measured(cands, jobs), settings, limit2, log)
            if comparison.status != "ok":
                notes.append(f"paired comparison: {comparison.status} after {comparison.rounds} rounds "
                             f"({(comparison.data['failure'] or {}).get('reason', 'no reason given')})")
    elif settings.confirm and not summary.left:
        which = contenders(measured(cands, jobs), settings.confirm_within)
        if len(which) > 1:
            more = jobs_for(cands, camp, settings.confirm, first=settings.repeats, which=which)
            _say(log, f"tune: confirming {len(which)} candidates within {settings.confirm_within:.0%} of the "
                      f"fastest: {settings.confirm} more repeat(s) each")
            limit2 = None if run_limit is None else max(1.0, run_limit - (time.monotonic() - t_runs))
            summary = run_campaign(camp, jobs=more, log=log, time_limit_s=limit2)
            jobs = jobs + more
    ranked = measured(cands, jobs)
    paired_first = []
    if comparison is not None and comparison.best is not None and comparison.rounds >= 2:
        for j, i in enumerate(which):
            r = comparison.ratio(j, comparison.best)
            ranked[i] = replace(ranked[i], paired_ratio=r.ratio, paired_se=r.se)
        paired_first = sorted((ranked[i] for i in which), key=lambda m: -m.paired_ratio)
    ok = [m for m in ranked if m.status == "ok"]
    # the contenders in their paired order first (all within confirm_within of the fastest median),
    # then the other candidates by their medians
    ranking = paired_first + sorted((m for m in ok if m.paired_ratio is None), key=lambda m: -m.samples_per_s) + \
        sorted((m for m in ranked if m.status != "ok"), key=lambda m: -m.candidate.predicted_samples_per_s)
    rho = spearman([m.candidate.predicted_samples_per_s for m in ok], [m.samples_per_s for m in ok])
    status = "no_run" if not ok else ("partial" if summary.left else "measured")
    notes += [f"{m.candidate.label}: {m.status}" for m in ranked if m.status not in ("ok", "not run")]
    chosen, why = choose(ranking)
    if why:
        notes.append(why)
    best = chosen.candidate.plan if chosen else None
    result = TuneResult(status, best, ranking, rho, None, notes=notes, chosen=chosen.candidate.label if chosen else None,
                        paired=None if comparison is None else {
                            "path": str(out_dir / "paired.json"), "status": comparison.status,
                            "rounds": comparison.rounds})
    if refit and ok:
        result.profile, result.refit_runs = _refit(hw, [str(camp.records_dir)], refit_starts, left(), log,
                                                   notes, with_earlier=refit_on == "all")
        err = statistics.fmean(abs(estimate(spec, result.profile, m.candidate.plan).samples_per_s / m.samples_per_s - 1)
                               for m in ok)
        if err > DRIFT:
            notes.append(f"the refitted profile predicts the tune's own runs {err:.0%} off on average: the "
                         "earlier records describe another state of this machine (load, clocks, cores); "
                         "refit on the tune's runs alone (--refit-on tune) or re-run the profile's campaign")
    result.seconds = time.monotonic() - t0
    return result


def choose(ranking: list[Measured]) -> tuple[Measured | None, str]:
    """The tune's answer from its ranking (measured fastest first) and why, when it is not the
    fastest: the search's pick is kept unless the fastest's lead over it is beyond noise
    (calibrate/noise.py: SIGNIFICANCE standard errors of the paired ratio, or of the difference of
    the two medians from their repeats' spread; with one run each, any lead counts)."""
    from osdp_sim.calibrate.noise import SIGNIFICANCE, lead, overrules
    ok = [m for m in ranking if m.status == "ok"]
    if not ok:
        return None, ""
    best = ok[0]
    pick = next((m for m in ok if m.candidate.label == "search pick"), None)
    if pick is None or pick is best:
        return best, ""
    if best.paired_ratio is not None and pick.paired_ratio is not None:
        gap, se = best.paired_ratio / pick.paired_ratio - 1, pick.paired_se
    else:
        gap, se = lead(list(best.repeats_samples_per_s), list(pick.repeats_samples_per_s))
    if overrules(gap, se):
        return best, ""
    if se is None:                                   # one run each and no lead: a tie
        return pick, f"kept the search's pick: {best.candidate.label} measured the same"
    return pick, (f"kept the search's pick: {best.candidate.label} measured {gap:+.1%} +- {se:.1%} ahead of it, "
                  f"within {SIGNIFICANCE:g} standard errors")


def _compare(cands: list[Candidate], which: list[int], first: list[Measured], settings: RunSettings,
             seconds_left: float | None, log):
    """The contenders `which` timed side by side (out_dir/paired.json; a finished comparison of
    the same plans and rounds is read back, so a resumed tune does not run it again)."""
    from osdp_sim.calibrate.distinct import plan_key
    from osdp_sim.calibrate.paired import CompareSettings, run_comparison
    from osdp_sim.records.comparison import load_comparison
    path = settings.out_dir / "paired.json"
    plans = [cands[i].plan for i in which]
    if path.is_file():
        done = load_comparison(path)
        if (done.status == "ok" and done.data["settings"].get("rounds") == settings.paired_rounds
                and [plan_key(p.plan) for p in done.plans] == [plan_key(p) for p in plans]):
            _say(log, f"tune: the paired comparison of {len(plans)} contenders is recorded ({path})")
            return done
    step_s = sum(cands[i].plan.global_batch / first[i].samples_per_s for i in which)
    est_s = (settings.paired_rounds + settings.warmup) * step_s + 15.0
    timeout = max(60.0, 3 * est_s) if seconds_left is None else max(1.0, seconds_left)
    _say(log, f"tune: comparing the {len(plans)} candidates within {settings.confirm_within:.0%} of the fastest "
              f"side by side: {settings.paired_rounds} rounds, about {est_s / 60:.1f} min")
    cs = CompareSettings(device=settings.device, backend=settings.backend, warmup=settings.warmup,
                         rounds=settings.paired_rounds, seed=settings.seed, threads=settings.threads,
                         timeout_s=timeout)
    return run_comparison(plans, [cands[i].label for i in which], settings.hardware, path, cs, echo=log)


def _refit(hw: HardwareProfile, tune_dirs: list[str], starts: int, seconds_left, log, notes, *,
           with_earlier: bool = True):
    from osdp_sim.calibrate.calibration import calibrate
    from osdp_sim.calibrate.runs import load_runs
    earlier = (((hw.provenance or {}).get("calibration") or {}).get("records") or {}).get("dirs") or []
    if not with_earlier:
        earlier = []
    found, missing = [], []
    for d in earlier:
        where = _find_dir(d, hw.source)
        (found if where else missing).append(where or d)
    if missing:
        notes.append("refit without the profile's earlier records not found here: " + ", ".join(missing))
    runs, _ = load_runs(tune_dirs + found, hw, strict=False)
    deadline = None if seconds_left is None else time.monotonic() + max(10.0, seconds_left)
    _say(log, f"tune: refitting {hw.name} on {len(runs)} runs (the tune's and {len(found)} earlier record folders)")
    cal = calibrate(hw, runs, loo=False, starts=starts, deadline_s=deadline, progress=log,
                    record_dirs=tune_dirs + found, command="osdp-sim tune")
    if cal.stopped:
        notes += [f"refit: {s}" for s in cal.stopped]
    return cal.result.profile, len(runs)


def _find_dir(rel: str, profile_source: str) -> str | None:
    """A record folder named in a profile's provenance (relative to where calibrate ran, usually
    the repository root): here, or above the profile's own file."""
    if Path(rel).is_dir():
        return rel
    if profile_source:
        for parent in Path(profile_source).resolve().parents:
            if (parent / rel).is_dir():
                return str(parent / rel)
    return None


def _load_candidates(path: Path, key: dict, spec: ModelSpec) -> list[Candidate] | None:
    if not path.is_file():
        return None
    from osdp_sim.fileio import read_json
    data = read_json(path, "candidates")
    stored = data.get("key") if isinstance(data, dict) else None
    if isinstance(stored, dict) and "near" not in stored:
        stored = {**stored, "near": 0}          # written before tunes ran the search's near-ties
    if stored != key:
        raise UserError("made by a tune of another model, profile or limit; use another --out folder "
                        "or delete the file", source=str(path), field="key")
    try:
        return [Candidate(c["label"], plan_from_dict(c["plan"]), float(c["predicted_samples_per_s"]),
                          float(c["predicted_peak_bytes"])) for c in data["candidates"]]
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"unreadable candidate ({e})", source=str(path), field="candidates") from None


def _say(log, msg: str) -> None:
    if log:
        print(msg, file=log, flush=True)


def write_outputs(result: TuneResult, out_dir: Path, profile_path: Path | None) -> list[Path]:
    """tune.json (the ranking), plan.json (the measured best) and the refitted profile."""
    from osdp_sim.hardware.dump import save_profile
    written = []
    write_json_atomic(out_dir / "tune.json", result.to_json())
    written.append(out_dir / "tune.json")
    if result.plan is not None:
        save_plan(result.plan, out_dir / "plan.json")
        written.append(out_dir / "plan.json")
    if result.profile is not None and profile_path is not None:
        save_profile(result.profile, profile_path,
                     header_comment=f"Refitted by osdp-sim tune on {result.refit_runs} runs.")
        written.append(profile_path)
    return written

