"""Decision quality as a measured figure (issue 15, docs/accuracy.md "Decisions"): per (model,
memory limit) case, a reference set of plans is run for real, and the search's pick and the tune's
pick of each profile are compared with the measured best of that set.

The reference set of a case is the union, over the case file's profiles, of the search's top-N
distinct plans, every feasible baseline (uniform ddp / zero2 / zero3 with checkpointing all or
none, and the same strategies with per-block checkpointing) and the tune's candidates
(tune.choose_candidates); identical plans are measured once. Measurements do not depend on the
profile, so the set is measured once and every profile's picks are judged on the same numbers.

"Distinct": calibrate/distinct.py.
"""

import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from osdp_sim.calibrate.decisions_config import (BASELINES, DEFAULT_RUN_S, DecisionCase,  # noqa: F401
                                                 DecisionsConfig, load_config, load_profile_ref)
from osdp_sim.calibrate.distinct import describe, plan_key, plan_signature, top_distinct  # noqa: F401
from osdp_sim.errors import UserError
from osdp_sim.plan import Plan, plan_from_dict, plan_to_dict, write_json_atomic

WITHIN = 0.03
"""A pick within this fraction of the measured best counts as a good decision (issue 15's 3%)."""

# ---------------------------------------------------------------- the reference set

@dataclass
class ProfileChoices:
    """What one profile picks in one case (plan keys into CaseReference.plans)."""

    search_pick: str
    """The search's plan (its top 1)."""
    top: list[str]
    """The top-N distinct plans, best first (the pick first)."""
    baselines: dict[str, str]
    """Baseline name (ddp, zero3_per_block, ...) -> plan, the feasible ones."""
    tune: list[tuple[str, str]]
    """The tune's candidates under this profile: (label, plan key)."""
    predicted_samples_per_s: dict[str, float]
    """Plan key -> this profile's predicted samples/s, for the plans it chose (pick, top, baselines,
    tune candidates), as predicted when it chose them."""
    profile_sha: str = ""
    """sha256 of the profile's text."""
    profile_ref: str = ""
    """The REV:PATH it was read from (a fixed text: not loaded again), else empty."""


@dataclass
class CaseReference:
    """A case's reference set and each profile's choices (out_dir/<case>/reference.json)."""

    case: str
    key: dict
    """What the set was made from (model, limit, micro-batches, N, baselines, tune K/B)."""
    plans: dict[str, Plan]
    """Plan key -> plan, every plan to measure."""
    labels: dict[str, list[str]]
    """Plan key -> why it is in the set ('before: search pick', 'after: zero3', ...)."""
    profiles: dict[str, ProfileChoices]

    def to_json(self) -> dict:
        return {"case": self.case, "key": self.key,
                "plans": [{"key": k, "labels": self.labels[k], "plan": plan_to_dict(p)}
                          for k, p in self.plans.items()],
                "profiles": {n: {"search_pick": c.search_pick, "top": c.top, "baselines": c.baselines,
                                 "tune": [list(t) for t in c.tune],
                                 "predicted_samples_per_s": c.predicted_samples_per_s,
                                 "profile_sha": c.profile_sha, "profile_ref": c.profile_ref}
                             for n, c in self.profiles.items()}}

    @staticmethod
    def from_json(data: dict, source: str) -> "CaseReference":
        try:
            plans, labels = {}, {}
            for p in data["plans"]:
                plans[p["key"]] = plan_from_dict(p["plan"])
                labels[p["key"]] = list(p["labels"])
            profiles = {n: ProfileChoices(c["search_pick"], list(c["top"]), dict(c["baselines"]),
                                          [tuple(t) for t in c["tune"]],
                                          {k: float(v) for k, v in c["predicted_samples_per_s"].items()},
                                          str(c["profile_sha"]), str(c["profile_ref"]))
                        for n, c in data["profiles"].items()}
            return CaseReference(data["case"], data["key"], plans, labels, profiles)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"unreadable reference set ({e}); delete it to make it again",
                            source=source, field="plans") from None


def case_space(cfg: DecisionsConfig, case: DecisionCase):
    from osdp_sim.planner.space import SearchSpace
    return SearchSpace(micro_batches=case.micro_batches, precision=cfg.precision, devices=case.ranks)


def case_spec(case: DecisionCase):
    from osdp_sim.model.load import load_model
    extra = {} if case.seq_len is None else {"seq_len": case.seq_len}
    return load_model(case.model, notes=[], **extra)


def _fixed(ref: str) -> bool:
    """REV:PATH with REV a commit hash: a text that cannot change."""
    return ":" in ref and not Path(ref).exists() and bool(re.fullmatch(r"[0-9a-f]{7,40}", ref.split(":", 1)[0]))


def add_profile(cfg: DecisionsConfig, case: DecisionCase, ref: CaseReference, name: str, hw0, sha: str,
                log=sys.stderr) -> None:
    """Put profile `name`'s choices in `case` (its search's top-N distinct plans, its baselines,
    its tune candidates) into `ref`, with its predictions of those plans."""
    from osdp_sim.calibrate.tune import choose_candidates
    from osdp_sim.planner.baselines import PER_BLOCK, UNIFORM, per_block_baselines, uniform_baselines
    spec, space = case_spec(case), case_space(cfg, case)
    hw = hw0 if hw0.device.count == case.ranks else hw0.with_devices(case.ranks)
    pred: dict[str, float] = {}

    def add(plan: Plan, label: str, sps: float) -> str:
        k = plan_key(plan)
        ref.plans.setdefault(k, plan)
        if label not in ref.labels.setdefault(k, []):
            ref.labels[k].append(label)
        pred[k] = sps
        return k

    res, top = top_distinct(spec, hw, case.mem_limit_bytes, space, cfg.top_n,
                            time_limit_s=cfg.search_time_limit_s)
    if res.plan is None:
        raise UserError(f"no plan fits under profile {name} ({res.status})", source=cfg.source,
                        field=f"cases[{cfg.cases.index(case)}].mem_limit")
    pick = add(res.plan, f"{name}: search pick", res.prediction.samples_per_s)
    top_keys = [pick] + [add(p, f"{name}: top {i + 1}", e.samples_per_s) for i, (p, e) in enumerate(top) if i > 0]
    uni = [s for s in cfg.baselines if s in UNIFORM]
    per = [s for s in UNIFORM if PER_BLOCK[s] in cfg.baselines]
    found = uniform_baselines(spec, hw, case.mem_limit_bytes, space, uni) if uni else {}
    if per:
        found.update(per_block_baselines(spec, hw, case.mem_limit_bytes, space, per,
                                         deadline=time.perf_counter() + 3 * cfg.search_time_limit_s))
    base = {b.name: add(b.plan, f"{name}: {b.name}", b.samples_per_s) for b in found.values() if b.feasible}
    # the tune's near-ties are the search's top distinct plans, already in the set (figures adds them)
    cands = choose_candidates(spec, hw, case.mem_limit_bytes, space, k=cfg.tune_candidates,
                              baselines=cfg.tune_baselines, near=0, time_limit_s=cfg.search_time_limit_s)
    tune = [(c.label, add(c.plan, f"{name}: tune {c.label}", c.predicted_samples_per_s)) for c in cands]
    ref.profiles[name] = ProfileChoices(pick, top_keys, base, tune, pred, sha)
    _say(log, f"decisions: {case.name} under {name}: search pick {describe(res.plan)}, "
              f"{len(top)} distinct top plans, {len(base)} baselines, {len(tune)} tune candidates")


def drop_profile(ref: CaseReference, name: str) -> None:
    ref.profiles.pop(name, None)
    for k in list(ref.plans):
        ref.labels[k] = [l for l in ref.labels[k] if not l.startswith(f"{name}: ")]
        if not ref.labels[k]:
            del ref.labels[k], ref.plans[k]


def reference_key(cfg: DecisionsConfig, case: DecisionCase) -> dict:
    """What a case's reference set depends on besides the profiles (each profile's choices carry
    the hash of its text)."""
    return {"model": case.model, "seq_len": case.seq_len, "mem_limit_bytes": case.mem_limit_bytes,
            "micro_batches": list(case.micro_batches), "ranks": case.ranks, "precision": cfg.precision,
            "top_n": cfg.top_n, "baselines": list(cfg.baselines),
            "tune": [cfg.tune_candidates, cfg.tune_baselines]}


def reference_path(cfg: DecisionsConfig, case: DecisionCase) -> Path:
    return cfg.out_dir / case.name / "reference.json"


def read_reference(cfg: DecisionsConfig, case: DecisionCase) -> CaseReference | None:
    path = reference_path(cfg, case)
    if not path.is_file():
        return None
    from osdp_sim.fileio import read_json
    return CaseReference.from_json(read_json(path, "reference set"), str(path))


def references(cfg: DecisionsConfig, *, log=sys.stderr, rebuild: bool = True) -> list[CaseReference]:
    """Every case's reference set, kept in out_dir/<case>/reference.json. A profile's choices are
    made once and read back while its text (sha256) and the case are unchanged, so the "before"
    picks stay those of the code and profile that made them; a new or changed profile adds its
    choices (rebuild=False: refuse instead), a profile no longer named is dropped. Profiles are
    loaded only when their choices must be made."""
    loaded: dict[str, tuple] = {}

    def profile(name):
        if name not in loaded:
            loaded[name] = load_profile_ref(cfg.profiles[name], source=cfg.source, field=f"profiles.{name}")
        return loaded[name]

    out = []
    for case in cfg.cases:
        ref = read_reference(cfg, case)
        key = reference_key(cfg, case)
        if ref is None or ref.key != key:
            ref = CaseReference(case.name, key, {}, {}, {})
        changed = False
        for name in list(ref.profiles):
            if name not in cfg.profiles:
                drop_profile(ref, name)
                changed = True
        for name in cfg.profiles:
            have = ref.profiles.get(name)
            ref_text = cfg.profiles[name]
            if have is not None and have.profile_ref == ref_text:
                continue                # a commit's file: fixed (a path or branch is re-hashed)
            hw, sha = profile(name)
            if have is not None and have.profile_sha == sha:
                continue
            if not rebuild:
                raise UserError(f"no choices of profile {name} made from {ref_text}; run without "
                                "--report-only first", source=str(reference_path(cfg, case)), field="profiles")
            if have is not None:
                drop_profile(ref, name)
            _say(log, f"decisions: {case.name}: choosing under profile {name} ({ref_text})")
            add_profile(cfg, case, ref, name, hw, sha, log=log)
            ref.profiles[name].profile_ref = ref_text if _fixed(ref_text) else ""
            changed = True
        ref.profiles = {n: ref.profiles[n] for n in cfg.profiles}
        if changed:
            reference_path(cfg, case).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(reference_path(cfg, case), ref.to_json())
        out.append(ref)
    return out


# ---------------------------------------------------------------- runs

def campaign_of(cfg: DecisionsConfig):
    from osdp_sim.calibrate.campaign import Campaign
    return Campaign(name=cfg.name, source=cfg.source, hardware=cfg.run_hardware, device="cpu",
                    records_dir=cfg.out_dir / "records", backend="fsdp2", warmup=cfg.warmup,
                    iters=cfg.iters, threads=cfg.threads, seed=0, timeout_s=cfg.run_timeout_s, runs=())


def _job(cfg: DecisionsConfig, c, ref: CaseReference, i: int, k: str, plan: Plan, r: int, label_total: int):
    from osdp_sim.calibrate.campaign import Job, expected_record_name
    from osdp_sim.runtime.launch import available_cores
    n = plan.devices
    threads = c.threads or max(1, available_cores() // n)
    impl = plan.model.implementation
    name = expected_record_name(plan, backend=c.backend, device=c.device, world=n, threads=threads,
                                warmup=c.warmup, iters=c.iters, seed=c.seed + r, impl=impl)
    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", plan.model.name)
    label = f"{ref.case}: {ref.labels[k][0]}" + (f" (repeat {r + 1}/{label_total})" if label_total > 1 else "")
    return Job(model=plan.model.name, nproc=n, plan=plan, seed=c.seed + r, repeat=r,
               record_path=c.records_dir / folder / f"n{n}" / name, label=label,
               field=f"{ref.case}.plans[{i}]", impl=impl)


def jobs_for(cfg: DecisionsConfig, refs: list[CaseReference]) -> dict[tuple[str, int], "object"]:
    """(plan key, repeat) -> Job, the first round: `repeats` of every plan, ordered repeat-major
    over every case (repeat 1 of every plan, then repeat 2, ...). A plan in two cases (same model)
    is one job: its records serve both."""
    c = campaign_of(cfg)
    jobs = {}
    for r in range(cfg.repeats):
        for ref in refs:
            for i, (k, plan) in enumerate(ref.plans.items()):
                if (k, r) not in jobs:
                    jobs[(k, r)] = _job(cfg, c, ref, i, k, plan, r, cfg.repeats)
    return jobs


def contenders(cfg: DecisionsConfig, ref: CaseReference, first: dict[str, "PlanMeasurement"]) -> list[str]:
    """The plans of a case whose comparison decides its figures, to be measured again: those whose
    first-round median is within confirm_within of the case's best, each profile's search pick,
    and each profile's tune candidates within confirm_within of the best of them (the tune's own
    confirmation, calibrate/tune.py). Empty until every plan of the case has its first round.

    Why: the first round's best is the largest of ~20 medians of 3 noisy runs (4.7% between
    repeats here), so it sits above its plan's true speed, and every other plan's loss against it
    is inflated by the same amount; measuring the contenders again, independently of the round that
    selected them, removes that bias where it matters."""
    if any(k not in first or first[k].repeats_recorded < cfg.repeats for k in ref.plans):
        return []
    ok = {k: first[k].samples_per_s for k in ref.plans if first[k].samples_per_s}
    if not ok:
        return []
    near = 1.0 - cfg.confirm_within
    best = max(ok.values())
    keep = {k for k, v in ok.items() if v >= near * best}
    for ch in ref.profiles.values():
        if ch.search_pick in ok:
            keep.add(ch.search_pick)
        tuned = [k for _label, k in ch.tune if k in ok] + [k for k in ch.top[1:1 + cfg.tune_near] if k in ok]
        if tuned:
            top = max(ok[k] for k in tuned)
            keep.update(k for k in tuned if ok[k] >= near * top)
    return [k for k in ref.plans if k in keep]


def confirm_jobs(cfg: DecisionsConfig, refs: list[CaseReference], first: dict[str, "PlanMeasurement"]) -> dict:
    """(plan key, repeat) -> Job of the confirmation round: confirm_repeats more of every case's
    contenders, repeat-major over all cases like the first round."""
    c = campaign_of(cfg)
    total = cfg.repeats + cfg.confirm_repeats
    chosen = [(ref, contenders(cfg, ref, first)) for ref in refs]
    jobs = {}
    for r in range(cfg.repeats, total):
        for ref, keys in chosen:
            index = {k: i for i, k in enumerate(ref.plans)}
            for k in keys:
                if (k, r) not in jobs:
                    jobs[(k, r)] = _job(cfg, c, ref, index[k], k, ref.plans[k], r, total)
    return jobs


def estimate_seconds(cfg: DecisionsConfig, jobs: list) -> float:
    return sum(cfg.run_seconds.get(j.model, DEFAULT_RUN_S) for j in jobs)


@dataclass(frozen=True)
class PlanMeasurement:
    """A reference plan after its runs."""

    status: str
    """ok (at least one repeat ok), else the last record's status, or 'not run'."""
    samples_per_s: float | None
    """Median over every ok repeat (first round and confirmation) of global batch / median step time."""
    repeats_ok: int
    repeats_recorded: int
    """Over the first round and the confirmation."""
    first_samples_per_s: float | None = None
    """The same median over the first round's repeats alone."""
    first_recorded: int = 0
    """First-round repeats recorded."""
    repeats_samples_per_s: tuple[float, ...] = ()
    """Every ok repeat's samples/s, in repeat order (the first round's first)."""
    first_ok: int = 0
    """How many of those are the first round's."""


def measure(jobs: dict, repeats: int) -> dict[str, PlanMeasurement]:
    """Plan key -> its measurement, from the records on disk (repeats below `repeats` are the
    first round, the rest the confirmation)."""
    from osdp_sim.calibrate.campaign import recorded_status
    from osdp_sim.records import load_record
    per_key: dict[str, list[tuple[int, object]]] = {}
    for (k, r), j in jobs.items():
        per_key.setdefault(k, []).append((r, j))
    out = {}
    for k, rjobs in per_key.items():
        sps, first, last, n, n_first = [], [], "not run", 0, 0
        for r, j in sorted(rjobs, key=lambda t: t[0]):
            if recorded_status(j.record_path) is None:
                continue
            rec = load_record(j.record_path)
            n += 1
            n_first += r < repeats
            last = rec.status
            if rec.ok:
                v = j.plan.global_batch / rec.data["measured"]["iteration_time_s"]["median"]
                sps.append(v)
                if r < repeats:
                    first.append(v)
        out[k] = PlanMeasurement("ok" if sps else last, statistics.median(sps) if sps else None, len(sps), n,
                                 statistics.median(first) if first else None, n_first, tuple(sps), len(first))
    return out


def first_round(meas: dict[str, PlanMeasurement]) -> dict[str, PlanMeasurement]:
    """The measurements as the first round alone gives them."""
    return {k: PlanMeasurement("ok" if m.first_samples_per_s else m.status, m.first_samples_per_s,
                               m.first_ok, m.first_recorded, m.first_samples_per_s, m.first_recorded,
                               m.repeats_samples_per_s[:m.first_ok], m.first_ok)
            for k, m in meas.items()}


@dataclass(frozen=True)
class Noise:
    """How well the measurements can tell plans apart (the contenders, measured in both rounds)."""

    plans: int
    """Plans with every repeat of both rounds ok."""
    repeat_cv: float
    """Median over those plans of the coefficient of variation between their repeats."""
    round_shift: float
    """Median over those plans of (second round's median / first round's) - 1: the machine's drift
    between the rounds (they may be sessions apart; within a round the plans are interleaved)."""
    difference_se: float
    """Standard error of the difference of two plans' medians at that spread and that many repeats
    (median SE ~ 1.2533 sigma / sqrt(n), the difference sqrt(2) x that), as a fraction."""


def noise_of(meas: dict[str, PlanMeasurement], repeats: int, total: int) -> Noise | None:
    full = [m.repeats_samples_per_s for m in meas.values()
            if m.repeats_recorded == total and len(m.repeats_samples_per_s) == total and total > repeats]
    if len(full) < 2:
        return None
    cv = statistics.median(statistics.stdev(v) / statistics.fmean(v) for v in full)
    shift = statistics.median(statistics.median(v[repeats:]) / statistics.median(v[:repeats]) - 1 for v in full)
    return Noise(len(full), cv, shift, 2 ** 0.5 * 1.2533 * cv / total ** 0.5)


# ---------------------------------------------------------------- figures

@dataclass(frozen=True)
class DecisionFigures:
    """One profile's decisions in one case, judged on the measurements."""

    case: str
    profile: str
    round: str
    """'first' (the first round's medians), 'confirmed' (the contenders' medians over both rounds) or
    'paired' (the paired comparison of the confirmed round's deciding plans: decisions_paired.py)."""
    complete: bool
    """Every reference plan has all its repeats recorded (else the figures are provisional)."""
    search_pick: str
    """describe() of the search's pick."""
    predicted_gain: float
    """pred(pick) / pred(best baseline) - 1, both predicted by this profile, over its feasible baselines."""
    measured_gain: float | None
    """meas(pick) / meas(best baseline) - 1, over every baseline of the reference set that ran ok."""
    search_loss: float | None
    """1 - meas(pick) / meas(best): 0 when the pick is the measured best."""
    tune_pick: str | None
    """Label of the tune's candidate (under this profile) measured fastest."""
    tune_loss: float | None
    """1 - meas(tune pick) / meas(best)."""
    best: str | None
    """describe() of the measured best plan of the reference set, with its first label."""
    best_samples_per_s: float | None
    measured_plans: int
    """Reference plans that ran ok."""
    reference_plans: int
    search_loss_se: float | None = None
    """Paired round only: the standard error of search_loss (records/comparison.py)."""
    tune_loss_se: float | None = None
    """Paired round only: the standard error of tune_loss."""
    rounds: int = 0
    """Paired round only: the rounds the comparison finished."""

    @property
    def search_is_best(self) -> bool:
        return self.search_loss == 0.0

    @property
    def tune_is_best(self) -> bool:
        return self.tune_loss == 0.0

    @property
    def gain_error_points(self) -> float | None:
        """|predicted - measured gain| in percentage points."""
        if self.measured_gain is None:
            return None
        return abs(self.predicted_gain - self.measured_gain) * 100


def figures(ref: CaseReference, meas: dict[str, PlanMeasurement], expected: dict[str, int],
            round_name: str = "first", tune_near: int = 0) -> list[DecisionFigures]:
    """Each profile's figures in this case. expected: plan key -> the repeats it is due (the first
    round's, plus the confirmation's for a contender). tune_near: the tune's candidates include the
    search's next tune_near distinct plans (tune --near; the set's top-N holds them)."""
    ok = {k: m.samples_per_s for k, m in meas.items() if k in ref.plans and m.status == "ok"}
    complete = all(meas.get(k) is not None and meas[k].repeats_recorded >= expected.get(k, 0) for k in ref.plans)
    best_k = max(ok, key=ok.get) if ok else None
    best_sps = ok[best_k] if best_k else None
    base_k = best_baseline(ref, ok)
    base_meas = [ok[base_k]] if base_k else []
    out = []
    for name, c in ref.profiles.items():
        pred = c.predicted_samples_per_s
        pred_base = max((pred[k] for k in c.baselines.values()), default=None)
        pick_sps = ok.get(c.search_pick)
        tune_lab, tune_k = tune_choice(c, meas, tune_near)
        out.append(DecisionFigures(
            case=ref.case, profile=name, round=round_name, complete=complete,
            search_pick=describe(ref.plans[c.search_pick]),
            predicted_gain=pred[c.search_pick] / pred_base - 1 if pred_base else 0.0,
            measured_gain=pick_sps / max(base_meas) - 1 if pick_sps and base_meas else None,
            search_loss=_loss(pick_sps, best_sps), tune_pick=tune_lab,
            tune_loss=_loss(ok.get(tune_k), best_sps),
            best=None if best_k is None else f"{ref.labels[best_k][0]} ({describe(ref.plans[best_k])})",
            best_samples_per_s=best_sps, measured_plans=len(ok), reference_plans=len(ref.plans)))
    return out


def tune_choice(c: ProfileChoices, meas: dict[str, PlanMeasurement], tune_near: int) -> tuple[str | None, str | None]:
    """(label, plan key) of the tune's pick, as calibrate/tune.py `choose` makes it: of the
    profile's tune candidates and the search's next tune_near distinct plans, the measured fastest,
    unless its lead over the search's pick is within noise (calibrate/noise.py: SIGNIFICANCE
    standard errors of the difference of the medians, from the repeats); (None, None) when none
    was measured."""
    from osdp_sim.calibrate.noise import lead, overrules
    ok = {k: m for k, m in meas.items() if m.status == "ok" and m.samples_per_s}
    near = [(f"search top {i + 1}", k) for i, k in enumerate(c.top[1:1 + tune_near], 1)]
    tune_ok = [(lab, k) for lab, k in c.tune + near if k in ok]
    if not tune_ok:
        return None, None
    fastest = max(tune_ok, key=lambda t: ok[t[1]].samples_per_s)
    pick = next((t for t in tune_ok if t[0] == "search pick"), None)
    if pick is None or pick[1] == fastest[1]:
        return fastest
    gap, se = lead(list(ok[fastest[1]].repeats_samples_per_s), list(ok[pick[1]].repeats_samples_per_s))
    return fastest if overrules(gap, se) else pick


def best_baseline(ref: CaseReference, ok: dict[str, float]) -> str | None:
    """The measured fastest baseline of any profile (ok: plan key -> samples/s)."""
    base = {k for c in ref.profiles.values() for k in c.baselines.values()}
    keys = [k for k in ref.plans if k in base and k in ok]      # the set's order: ties go to the first
    return max(keys, key=ok.get) if keys else None


def _loss(sps: float | None, best: float | None) -> float | None:
    if sps is None or not best:
        return None
    return max(0.0, 1.0 - sps / best)


@dataclass(frozen=True)
class DecisionSummary:
    """One profile over the complete cases."""

    profile: str
    round: str
    """As DecisionFigures.round."""
    cases: int
    """Complete cases counted."""
    search_best: int
    """Cases whose search pick is the measured best."""
    search_within: int
    """... within WITHIN of it."""
    search_worst_loss: float | None
    tune_best: int
    tune_within: int
    tune_worst_loss: float | None
    mean_gain_error_points: float | None
    """Mean |predicted - measured gain| in percentage points."""
    gains_within_5_points: int


def summarize(figs: list[DecisionFigures]) -> list[DecisionSummary]:
    out = []
    for prof, rnd in dict.fromkeys((f.profile, f.round) for f in figs):
        fs = [f for f in figs if f.profile == prof and f.round == rnd and f.complete and f.search_loss is not None]
        sl = [f.search_loss for f in fs]
        tl = [f.tune_loss for f in fs if f.tune_loss is not None]
        ge = [f.gain_error_points for f in fs if f.gain_error_points is not None]
        out.append(DecisionSummary(
            prof, rnd, len(fs), sum(l == 0.0 for l in sl), sum(l <= WITHIN for l in sl), max(sl, default=None),
            sum(l == 0.0 for l in tl), sum(l <= WITHIN for l in tl), max(tl, default=None),
            statistics.fmean(ge) if ge else None, sum(e <= 5.0 for e in ge)))
    return out


def _say(log, msg: str) -> None:
    if log:
        print(msg, file=log, flush=True)


def all_figures(cfg: DecisionsConfig, refs: list[CaseReference], jobs: dict) -> tuple[list[DecisionFigures], dict]:
    """Every case's figures on the first round alone and, with a confirmation round, on the
    confirmed medians; and the measurements (plan key -> PlanMeasurement). jobs: both rounds'."""
    meas = measure(jobs, cfg.repeats)
    expected = Counter(k for k, _r in jobs)
    first_expected = {k: min(n, cfg.repeats) for k, n in expected.items()}
    first = first_round(meas)
    figs = []
    for ref in refs:
        figs += figures(ref, first, first_expected, "first", cfg.tune_near)
        if cfg.confirm_repeats:
            figs += figures(ref, meas, expected, "confirmed", cfg.tune_near)
    return figs, meas
