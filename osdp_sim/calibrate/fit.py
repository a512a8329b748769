"""Fit a hardware profile's free coefficients to measured runs (scipy.optimize.least_squares).

Residuals, all in units of their stated noise so they can be summed:
- iteration time of each run:  log(predicted / measured) / SIGMA_TIME_LOG  (5%: CPU step times
  vary 2-11% within a run and 1.5-14.5% between runs of one plan, docs/validation.md "Noise");
- peak memory of each run:     log(predicted / measured) / SIGMA_MEMORY_LOG (1%: the tracked peak
  is deterministic, and a 3% miss must weigh as much as a 3-sigma timing miss);
- each coefficient's prior:    (u - u_measured) / sigma in params.py's internal coordinates.
The robust loss (soft_l1 by default, f_scale 1 = one sigma) keeps one pathological run from
dragging every coefficient. Bounds come from params.py; the trust-region-reflective method
respects them.
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np

from osdp_sim.calibrate.params import Param, get_value, prior_values, select_params, with_values
from osdp_sim.calibrate.runs import Run
from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile

SIGMA_TIME_LOG = 0.05
SIGMA_MEMORY_LOG = 0.01
# Stop when the cost changes by less than this fraction: far below the noise of the runs.
FTOL = 1e-6
XTOL = 1e-6
STARTS = 8
LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")


@dataclass(frozen=True)
class Prediction:
    time_s: float
    memory_bytes: float


@dataclass(frozen=True)
class FitResult:
    profile: HardwareProfile           # the calibrated profile
    params: tuple[Param, ...]
    prior: dict                        # name -> measured value (the prior's centre)
    fitted: dict                       # name -> fitted value
    runs: tuple[Run, ...]
    before: tuple[Prediction, ...]     # per run, with the profile as given
    after: tuple[Prediction, ...]      # per run, with the calibrated profile
    success: bool
    message: str
    nfev: int
    cost: float
    loss: str
    sigma_time_log: float = SIGMA_TIME_LOG
    sigma_memory_log: float = SIGMA_MEMORY_LOG
    at_bound: tuple[str, ...] = field(default=())   # coefficients the fit pushed onto a bound
    stopped: str = ""                  # why the fit ended before converging (its time limit), or ""


class TimeUp(Exception):
    """A calibration's time limit passed: raised in least_squares' residuals, caught by _solve."""


def past(deadline_s: float | None) -> bool:
    return deadline_s is not None and time.monotonic() > deadline_s


class Predictor:
    """Predicts every run for a set of coefficient values. Estimates are cached on the
    coefficients that change the simulated step; memory-only coefficients (context, fragmentation)
    are applied to the cached live-tensor peak exactly as costmodel.estimate does:
    peak = live * (1 + fragmentation) + context."""

    def __init__(self, profile: HardwareProfile, runs, params: tuple[Param, ...]):
        self.profile = profile
        self.runs = list(runs)
        self.params = params
        self.time_names = [p.name for p in params if p.affects == "time"]
        self._cache: dict[tuple, list[tuple[float, float]]] = {}
        self.evaluations = 0

    def _timed(self, values: dict) -> list[tuple[float, float]]:
        """(iteration time, live-tensor peak) of every run."""
        key = tuple(values[n] for n in self.time_names)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        from osdp_sim.costmodel import estimate
        hw = with_values(self.profile, {n: values[n] for n in self.time_names})
        out = []
        for r in self.runs:
            hw_r = hw if r.world_size == hw.device.count else hw.with_devices(r.world_size)
            est = estimate(r.spec, hw_r, r.plan)
            mb = est.memory_breakdown
            live = est.peak_memory_bytes - mb.get("fragmentation", 0.0) - mb.get("context", 0.0)
            # a fake group's collectives moved nothing: its step is predicted with them free
            step_s = estimate(r.spec, hw_r.without_communication(), r.plan).iteration_time_s \
                if r.fake_world else est.iteration_time_s
            out.append((step_s, live))
        self.evaluations += 1
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = out
        return out

    def predict(self, values: dict) -> list[Prediction]:
        mem = with_values(self.profile, {n: values[n] for n in values
                                         if n in ("memory.context_bytes", "memory.fragmentation")}).memory
        return [Prediction(t, live * (1.0 + mem.fragmentation) + mem.context_bytes)
                for t, live in self._timed(values)]


def values_of(profile: HardwareProfile, params) -> dict:
    return {p.name: get_value(profile, p.name) for p in params}


def fit(profile: HardwareProfile, runs, *, loss: str = "soft_l1", params: tuple[Param, ...] | None = None,
        start: dict | None = None, sigma_time_log: float = SIGMA_TIME_LOG,
        sigma_memory_log: float = SIGMA_MEMORY_LOG, max_nfev: int | None = None,
        starts: int = STARTS, deadline_s: float | None = None, progress=None) -> FitResult:
    """Fit `params` (default: params.default_params) to `runs` (calibrate.runs.Run, ok runs only).
    `start`: initial coefficient values (default: the prior); the prior stays on the measured
    values either way, so a warm start changes the path, not the answer. `starts`: the time
    coefficients are fitted from `start` and from starts - 1 points drawn from the prior; the
    lowest cost wins. `deadline_s` (time.monotonic()): past it, the time stage ends with the
    lowest-cost coefficients evaluated so far (FitResult.stopped says so). The memory stage runs
    on regardless: with the time coefficients fixed it reuses the cached step simulations, so it
    costs milliseconds. `progress`: a file for one line per start of the time stage.

    Two stages, because the problem separates: the time coefficients against the time residuals,
    then the memory coefficients against the memory residuals with the time coefficients fixed.
    Predicted memory does not depend on the memory coefficients' partners in time except through
    the order of allocations in the simulated step, which is piecewise constant: finite
    differences across such a jump would hand the optimiser a meaningless, huge slope."""
    if loss not in LOSSES:
        raise UserError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}", field="--loss")
    runs = list(runs)
    if not runs:
        raise UserError("no usable runs to fit (every record failed or none was given)")
    params = tuple(params or select_params(profile))
    prior = prior_values(profile, params)
    init = dict(prior)
    init.update({k: v for k, v in (start or {}).items() if k in init})
    pred = Predictor(profile, runs, params)
    t_meas = np.array([r.time_s for r in runs])
    has_mem = np.array([r.memory_bytes is not None for r in runs])
    m_meas = np.array([r.memory_bytes for r in runs if r.memory_bytes is not None], dtype=float)
    time_ps = tuple(p for p in params if p.affects == "time")
    mem_ps = tuple(p for p in params if p.affects == "memory") if has_mem.any() else ()
    fitted = dict(init)

    def time_residuals(vals: dict) -> np.ndarray:
        t = np.array([p.time_s for p in pred.predict(vals)])
        return np.log(t / t_meas) / sigma_time_log

    def mem_residuals(vals: dict) -> np.ndarray:
        m = np.array([p.memory_bytes for p in pred.predict(vals)])[has_mem]
        return np.log(np.maximum(m, 1.0) / m_meas) / sigma_memory_log

    stages = [(time_ps, time_residuals), (mem_ps, mem_residuals)]
    success, messages, nfev, cost, at_bound, stopped = True, [], 0, 0.0, [], ""
    for ps, data_residuals in stages:
        if not ps:
            continue
        timed = ps is time_ps
        r = _solve(ps, prior, fitted, data_residuals, loss, max_nfev,
                   extra_starts=starts - 1 if timed else 0, deadline_s=deadline_s if timed else None,
                   progress=progress if timed else None)
        stopped = stopped or r["stopped"]
        fitted.update(r["values"])
        success &= r["success"]
        messages.append(r["message"])
        nfev += r["nfev"]
        cost += r["cost"]
        at_bound += r["at_bound"]
    fitted = {p.name: tidy(p, fitted[p.name]) for p in params}
    return FitResult(profile=with_values(profile, fitted), params=params, prior=prior, fitted=fitted,
                     runs=tuple(runs), before=tuple(pred.predict(values_of(profile, params))),
                     after=tuple(pred.predict(fitted)), success=success, message="; ".join(m.rstrip(".") for m in messages),
                     nfev=nfev, cost=cost, loss=loss, sigma_time_log=sigma_time_log,
                     sigma_memory_log=sigma_memory_log, at_bound=tuple(at_bound), stopped=stopped)


def tidy(p: Param, x: float) -> float:
    """4 significant digits (the runs' noise is far above that); an additive coefficient within a
    thousandth of its sigma of zero is zero."""
    x = float(x)
    if not p.log and abs(x) < 1e-3 * p.sigma:
        x = 0.0
    elif x != 0.0:
        x = float(f"{x:.4g}")
    return min(max(x, p.lo), p.hi)


def robust_cost(f: np.ndarray, loss: str) -> float:
    """least_squares' cost of residuals `f` (f_scale 1): 0.5 * sum(rho(f**2))."""
    z = f * f
    rho = {"linear": lambda: z, "soft_l1": lambda: 2.0 * (np.sqrt(1.0 + z) - 1.0),
           "huber": lambda: np.where(z <= 1.0, z, 2.0 * np.sqrt(z) - 1.0),
           "cauchy": lambda: np.log1p(z), "arctan": lambda: np.arctan(z)}[loss]()
    return 0.5 * float(np.sum(rho))


@dataclass
class _BestSeen:
    """The lowest-cost point least_squares evaluated: the answer when the time limit cuts it short."""
    loss: str
    u: np.ndarray | None = None
    cost: float = math.inf
    evaluations: int = 0

    def offer(self, u: np.ndarray, f: np.ndarray) -> None:
        self.evaluations += 1
        c = robust_cost(f, self.loss)
        if c < self.cost:
            self.u, self.cost = np.array(u, dtype=float), c


def _solve(ps: tuple[Param, ...], prior: dict, fixed: dict, data_residuals, loss: str,
           max_nfev: int | None, extra_starts: int = 0, deadline_s: float | None = None,
           progress=None) -> dict:
    """least_squares over the coefficients `ps`, the others held at `fixed`; with `extra_starts`,
    also from that many points drawn from the prior (fixed seed), keeping the lowest cost: the
    time model has several local minima (a per-op overhead, a slower GEMM and a worse overlap
    can each stand in for the others)."""
    from scipy.optimize import least_squares

    u_prior = np.array([p.to_internal(prior[p.name]) for p in ps])
    # Additive coefficients are already in sigmas internally (u = x / sigma); log ones are not.
    sig = np.array([p.sigma if p.log else 1.0 for p in ps])
    lo, hi = (np.array(b) for b in zip(*(p.internal_bounds() for p in ps)))

    def values(u) -> dict:
        v = dict(fixed)
        v.update({p.name: min(max(p.from_internal(x), p.lo), p.hi) for p, x in zip(ps, u)})
        return v

    def all_residuals(u):
        return np.concatenate([data_residuals(values(u)), (u - u_prior) / sig])

    seen = _BestSeen(loss)

    def residuals(u):
        if past(deadline_s):
            raise TimeUp
        f = all_residuals(u)
        seen.offer(u, f)
        return f

    # Start strictly inside the bounds: trf scales the gradient by the distance to an active
    # bound, so a start on the bound (a prior of 0 latency, 0 context) would stop at once.
    inset = np.minimum(0.1, 0.01 * (hi - lo))
    u0 = np.clip(np.array([p.to_internal(fixed[p.name]) for p in ps]), lo + inset, hi - inset)
    starts = [u0]
    u_prior_in = np.clip(u_prior, lo + inset, hi - inset)
    if extra_starts and not np.allclose(u0, u_prior_in):
        starts.append(u_prior_in)             # a warm start's first alternative: the prior itself
    rng = np.random.default_rng(0)
    while len(starts) < 1 + extra_starts:
        z = np.clip(rng.standard_normal(len(ps)), -2.0, 2.0)
        starts.append(np.clip(u_prior + z * sig, lo + inset, hi - inset))
    best_x, best_cost, success, message, nfev, stopped = None, math.inf, False, "", 0, ""
    for k, u in enumerate(starts, 1):
        if progress and len(starts) > 1:
            print(f"osdp-sim calibrate: time coefficients, start {k}/{len(starts)}", file=progress, flush=True)
        try:
            if best_x is not None and past(deadline_s):
                raise TimeUp
            r = least_squares(residuals, u, bounds=(lo, hi), loss=loss, f_scale=1.0, method="trf",
                              diff_step=1e-6, x_scale=1.0, max_nfev=max_nfev, ftol=FTOL, xtol=XTOL)
        except TimeUp:
            if seen.u is None:                   # the limit passed before any evaluation
                seen.offer(starts[0], all_residuals(starts[0]))
            if seen.cost < best_cost - 1e-9:
                best_x, best_cost = seen.u, seen.cost
            stopped = (f"time limit reached during start {k} of {len(starts)}: kept the lowest-cost "
                       f"coefficients of {seen.evaluations} evaluations")
            success, message = False, stopped
            nfev = seen.evaluations
            break
        if r.cost < best_cost - 1e-9:
            best_x, best_cost, success, message = r.x, float(r.cost), bool(r.success), str(r.message)
        nfev += r.nfev
    at_bound = [p.name for p, x, a, b, x0 in zip(ps, best_x, lo, hi, u_prior)
                if min(abs(x - a), abs(x - b)) < 1e-6 and abs(x - x0) > 1e-6]
    return {"values": {k: v for k, v in values(best_x).items() if k in {q.name for q in ps}},
            "success": success, "message": message, "nfev": int(nfev), "cost": best_cost,
            "at_bound": at_bound, "stopped": stopped}


def predict_runs(profile: HardwareProfile, runs) -> list[Prediction]:
    """Plain predictions of the runs with a profile (no fitting)."""
    params = select_params(profile)
    return Predictor(profile, runs, params).predict(values_of(profile, params))


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def log_error(predicted: float, measured: float) -> float:
    return math.log(predicted / measured)
