"""Figures the calibration report puts beside the errors: error summaries, the noise floor of
repeated runs, rank correlation of predicted and measured throughput, and whether the plan the
search would pick is the one that is measured fastest."""

import math
import statistics
from dataclasses import dataclass

from osdp_sim.calibrate.fit import Prediction
from osdp_sim.calibrate.runs import Run


@dataclass(frozen=True)
class ErrorSummary:
    mape: float                  # mean |predicted - measured| / measured
    mean_signed: float           # mean (predicted - measured) / measured: the bias
    worst: float                 # signed error of the run with the largest |error|
    worst_run: int               # its index
    n: int


def errors(preds, measured) -> list[float | None]:
    """Signed relative errors; None where nothing was measured."""
    return [None if m is None else (p - m) / m for p, m in zip(preds, measured)]


def summarize(errs: list[float | None]) -> ErrorSummary:
    idx = [k for k, e in enumerate(errs) if e is not None]
    if not idx:
        return ErrorSummary(math.nan, math.nan, math.nan, -1, 0)
    i = max(idx, key=lambda k: abs(errs[k]))
    vals = [errs[k] for k in idx]
    return ErrorSummary(statistics.fmean(abs(e) for e in vals), statistics.fmean(vals), errs[i], i, len(vals))


def time_errors(runs, preds: list[Prediction]) -> list[float]:
    return errors([p.time_s for p in preds], [r.time_s for r in runs])


def memory_errors(runs, preds: list[Prediction]) -> list[float]:
    return errors([p.memory_bytes for p in preds], [r.memory_bytes for r in runs])


# ---------------------------------------------------------------- noise floor

@dataclass(frozen=True)
class RepeatGroup:
    label: str
    model_name: str
    world_size: int
    n: int
    time_mean_s: float
    time_cv: float               # sample std / mean of the runs' measured times
    time_range: float            # (max - min) / mean
    memory_range: float          # (max - min) / mean of the measured peaks


@dataclass(frozen=True)
class NoiseFloor:
    groups: tuple[RepeatGroup, ...]
    time_cv: float               # pooled: root mean square of the groups' CVs (nan without repeats)
    time_range_max: float
    memory_range_max: float
    within_run_cv: float         # median over runs of std / mean of a run's timed steps


def noise_floor(runs: list[Run]) -> NoiseFloor:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.plan_id, []).append(r)
    groups = []
    for rs in by.values():
        if len(rs) < 2:
            continue
        t = [r.time_s for r in rs]
        m = [r.memory_bytes for r in rs if r.memory_bytes is not None]
        mean_t = statistics.fmean(t)
        groups.append(RepeatGroup(rs[0].label, rs[0].model_name, rs[0].world_size, len(rs), mean_t,
                                  statistics.stdev(t) / mean_t, (max(t) - min(t)) / mean_t,
                                  (max(m) - min(m)) / statistics.fmean(m) if len(m) > 1 else math.nan))
    pooled = math.sqrt(statistics.fmean(g.time_cv ** 2 for g in groups)) if groups else math.nan
    within = statistics.median(r.time_spread for r in runs) if runs else math.nan
    return NoiseFloor(tuple(groups), pooled, max((g.time_range for g in groups), default=math.nan),
                      max((g.memory_range for g in groups if not math.isnan(g.memory_range)),
                          default=math.nan), within)


# ---------------------------------------------------------------- plans (repeats merged)

@dataclass(frozen=True)
class PlanPoint:
    plan_id: str
    label: str
    model_name: str
    world_size: int
    measured_sps: float          # samples/s from the mean measured time over repeats
    measured_memory: float | None  # largest measured peak over repeats (None: not measured)
    predicted_sps: float
    predicted_memory: float


def plan_points(runs: list[Run], preds: list[Prediction]) -> list[PlanPoint]:
    by: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        by.setdefault(r.plan_id, []).append(i)
    out = []
    for idx in by.values():
        r0 = runs[idx[0]]
        t = statistics.fmean(runs[i].time_s for i in idx)
        pt = statistics.fmean(preds[i].time_s for i in idx)
        mems = [runs[i].memory_bytes for i in idx if runs[i].memory_bytes is not None]
        out.append(PlanPoint(r0.plan_id, r0.label, r0.model_name, r0.world_size, r0.samples / t,
                             max(mems) if mems else None, r0.samples / pt,
                             max(preds[i].memory_bytes for i in idx)))
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return math.nan
    from scipy.stats import spearmanr
    rho = spearmanr(xs, ys).statistic
    return float(rho)


@dataclass(frozen=True)
class RankCorrelation:
    scope: str                   # "all plans" or "<model>, <n> ranks"
    n: int
    rho: float


def rank_correlations(points: list[PlanPoint]) -> list[RankCorrelation]:
    """Spearman's rho of predicted vs measured samples/s: over every plan, then per model and
    world size (across models, throughput differs by model size, which is easy to rank)."""
    out = [RankCorrelation("all plans", len(points),
                           spearman([p.predicted_sps for p in points], [p.measured_sps for p in points]))]
    for (model, world), ps in _by_group(points).items():
        if len(ps) >= 3:
            out.append(RankCorrelation(f"{model}, {world} ranks", len(ps),
                                       spearman([p.predicted_sps for p in ps], [p.measured_sps for p in ps])))
    return out


def _by_group(points: list[PlanPoint]) -> dict:
    out: dict[tuple, list[PlanPoint]] = {}
    for p in points:
        out.setdefault((p.model_name, p.world_size), []).append(p)
    return out


# ---------------------------------------------------------------- the search's pick

@dataclass(frozen=True)
class PickCheck:
    model_name: str
    world_size: int
    limit_bytes: float
    candidates: int
    picked: PlanPoint | None     # highest predicted samples/s among plans predicted to fit
    best: PlanPoint | None       # highest measured samples/s among plans measured to fit
    picked_fits: bool            # the pick's measured peak is within the limit

    @property
    def same(self) -> bool:
        return self.picked is not None and self.best is not None and self.picked.plan_id == self.best.plan_id

    @property
    def regret(self) -> float:
        """How much slower (measured) the pick is than the measured best; nan if it does not fit."""
        if self.picked is None or self.best is None or not self.picked_fits:
            return math.nan
        return 1.0 - self.picked.measured_sps / self.best.measured_sps


def auto_limits(points: list[PlanPoint]) -> list[float]:
    """Two limits that bind: between the smallest and the largest measured peak of the group,
    at about a third and two thirds of the way, rounded to whole MiB."""
    peaks = sorted(p.measured_memory for p in points if p.measured_memory is not None)
    if len(peaks) < 3 or peaks[-1] <= peaks[0] * 1.02:
        return []
    lo, hi = peaks[0], peaks[-1]
    return sorted({float(round((lo + f * (hi - lo)) / 2**20) * 2**20) for f in (1 / 3, 2 / 3)})


def search_picks(points: list[PlanPoint], limits: list[float] | None = None) -> list[PickCheck]:
    """Per model and world size: for each memory limit, the plan a search over these plans would
    pick (by prediction) against the one measured fastest. `limits` None: auto_limits per group."""
    out = []
    for (model, world), ps in _by_group(points).items():
        ps = [p for p in ps if p.measured_memory is not None]   # feasibility needs a measured peak
        if len(ps) < 2:
            continue
        for limit in (limits if limits else auto_limits(ps)):
            fit_pred = [p for p in ps if p.predicted_memory <= limit]
            fit_meas = [p for p in ps if p.measured_memory <= limit]
            picked = max(fit_pred, key=lambda p: p.predicted_sps, default=None)
            best = max(fit_meas, key=lambda p: p.measured_sps, default=None)
            out.append(PickCheck(model, world, limit, len(ps), picked, best,
                                 picked is not None and picked.measured_memory <= limit))
    return out


# ---------------------------------------------------------------- errors by kind of plan

def plan_kinds(run: Run) -> list[str]:
    """The features of a run's plan that errors may depend on (a run has several)."""
    plan = run.plan
    strategies = {c.strategy for c in plan.choices.values()}
    kinds = [f"model {run.model_name}"]
    split = any(c.is_split for c in plan.choices.values())
    if len(strategies) == 1 and not split:
        kinds.append(f"uniform {next(iter(strategies))}")
    elif not split:
        kinds.append("mixed strategies")
    if split:
        kinds.append("operator splitting")
    if any(plan.checkpoint):
        kinds.append("checkpointing")
    if plan.grad_accum > 1:
        kinds.append("gradient accumulation")
    kinds.append(f"micro-batch {plan.micro_batch}")
    return kinds


@dataclass(frozen=True)
class KindErrors:
    kind: str
    n: int
    time: ErrorSummary
    memory: ErrorSummary


def errors_by_kind(runs: list[Run], preds: list[Prediction]) -> list[KindErrors]:
    t = time_errors(runs, preds)
    m = memory_errors(runs, preds)
    by: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        for k in plan_kinds(r):
            by.setdefault(k, []).append(i)
    order = lambda k: (k.split(" ")[0] != "model", k.startswith("micro-batch"), k)
    return [KindErrors(k, len(idx), summarize([t[i] for i in idx]), summarize([m[i] for i in idx]))
            for k, idx in sorted(by.items(), key=lambda kv: order(kv[0]))]
