"""One calibration end to end, as data: the fit, leave-one-out, the runs only evaluated, and the
figures the report shows. The CLI builds it, report.py renders it, provenance() stores it."""

import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from osdp_sim.calibrate import analysis
from osdp_sim.calibrate.fit import STARTS, FitResult, Prediction, TimeUp, fit, past, predict_runs
from osdp_sim.calibrate.loo import LooResult, leave_one_out
from osdp_sim.calibrate.params import select_params
from osdp_sim.calibrate.runs import Run, base_names
from osdp_sim.hardware.profile import HardwareProfile

TARGET_TIME_MAPE = 0.10
TARGET_MEMORY_MAPE = 0.03


@dataclass(frozen=True)
class Calibration:
    base: HardwareProfile                   # as given
    result: FitResult
    loo: LooResult | None
    excluded: tuple[tuple[str, str], ...]   # (file, why) records not used
    eval_runs: tuple[Run, ...]              # evaluated only (e.g. oversubscribed)
    eval_before: tuple[Prediction, ...]
    eval_after: tuple[Prediction, ...]
    noise: analysis.NoiseFloor
    limits: tuple[float, ...]               # memory limits asked for (empty: automatic)
    date: str
    command: str
    record_dirs: tuple[str, ...]
    stopped: tuple[str, ...] = ()           # what the time limit cut short, in words

    @property
    def runs(self) -> tuple[Run, ...]:
        return self.result.runs

    def time_errors(self, which: str) -> list[float]:
        return analysis.time_errors(self.runs, self.predictions(which))

    def memory_errors(self, which: str) -> list[float]:
        return analysis.memory_errors(self.runs, self.predictions(which))

    def predictions(self, which: str) -> tuple[Prediction, ...]:
        if which == "before":
            return self.result.before
        if which == "after":
            return self.result.after
        if which == "loo":
            if self.loo is None:
                raise ValueError("leave-one-out was not run")
            return self.loo.predictions
        raise ValueError(which)

    def available(self) -> list[str]:
        return ["before", "after"] + (["loo"] if self.loo is not None else [])


def calibrate(profile: HardwareProfile, runs, *, excluded=(), eval_runs=(), loss: str = "soft_l1",
              params=None, loo: bool = True, limits=(), command: str = "", record_dirs=(),
              name: str | None = None, progress="stderr", starts: int = STARTS,
              deadline_s: float | None = None) -> Calibration:
    """The fit, leave-one-out and the evaluated runs. Past `deadline_s` (time.monotonic()) the fit
    keeps the best coefficients found so far and leave-one-out is skipped (or the rest of it);
    Calibration.stopped says what was cut short."""
    progress = sys.stderr if progress == "stderr" else progress
    if runs and all(r.fake_world for r in runs):
        # nothing measured says anything about communication: keep those coefficients as they are
        params = tuple(p for p in (params or select_params(profile)) if not _communication(p.name))
        if progress:
            print("osdp-sim calibrate: every run is on a fake process group (communication not measured): "
                  "the collective and overlap coefficients are not fitted", file=progress, flush=True)
    if progress:
        print(f"osdp-sim calibrate: fitting {len(runs)} runs", file=progress, flush=True)
    result = fit(profile, runs, loss=loss, params=params, starts=starts, deadline_s=deadline_s,
                 progress=progress)
    stopped = [f"fit: {result.stopped}"] if result.stopped else []
    loo_result = None
    if loo and (result.stopped or past(deadline_s)):
        stopped.append("leave-one-out: not run (time limit reached)")
    elif loo:
        try:
            loo_result = leave_one_out(result, profile, progress=progress, deadline_s=deadline_s)
        except TimeUp as e:
            stopped.append(f"leave-one-out: not reported, time limit reached ({e})")
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    eval_runs = tuple(eval_runs)
    cal = Calibration(base=profile, result=result, loo=loo_result, excluded=tuple(excluded),
                      eval_runs=eval_runs,
                      eval_before=tuple(predict_runs(profile, eval_runs)) if eval_runs else (),
                      eval_after=tuple(predict_runs(result.profile, eval_runs)) if eval_runs else (),
                      noise=analysis.noise_floor(list(runs)), limits=tuple(limits), date=date,
                      command=command, record_dirs=tuple(str(d) for d in record_dirs),
                      stopped=tuple(stopped))
    base = sorted(base_names(profile) - {profile.name}) or [profile.name]
    new_name = name or f"{base[0]}-calibrated"
    desc = (f"{profile.description} -- calibrated on {len(runs)} runs"
            if profile.description else f"calibrated on {len(runs)} runs")
    calibrated = replace(result.profile, name=new_name, description=desc, source="",
                         provenance=provenance(cal, base[0], starts))
    return replace(cal, result=replace(result, profile=calibrated))


def _communication(param_name: str) -> bool:
    return param_name.startswith("collectives.") or param_name == "overlap_slowdown"


def _plain(x):
    """numpy scalars and tuples -> plain YAML-safe values."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return float(f"{f:.6g}")


def error_block(cal: Calibration, kind: str) -> dict:
    out = {}
    for which in cal.available():
        errs = cal.time_errors(which) if kind == "time" else cal.memory_errors(which)
        s = analysis.summarize(errs)
        out[which] = {"mape": s.mape, "bias": s.mean_signed, "worst": s.worst,
                      "worst_record": cal.runs[s.worst_run].source if s.worst_run >= 0 else None}
    return out


def provenance(cal: Calibration, base_name: str, starts: int = STARTS) -> dict:
    """What the calibrated profile was fitted on, kept in its provenance. The profile's previous
    provenance (how it was measured) stays beside it under its own keys."""
    r = cal.result
    prev = dict(cal.base.provenance or {})
    prev.pop("calibration", None)
    block = {
        "tool": "osdp-sim calibrate",
        "command": cal.command,
        "date": cal.date,
        "base_profile": {"name": base_name, "path": cal.base.source},
        "records": {"dirs": list(cal.record_dirs), "count": len(r.runs),
                    "files": [run.source for run in r.runs],
                    "excluded": [f"{f}: {why}" for f, why in cal.excluded],
                    "models": sorted({run.model_name for run in r.runs})},
        "method": (f"scipy least_squares (trf, loss {r.loss}); residuals log(pred/meas) over sigma "
                   f"{r.sigma_time_log} (iteration time, median of timed steps) and "
                   f"{r.sigma_memory_log} (peak memory), plus one prior residual per coefficient "
                   f"toward its measured value; time coefficients first ({starts} starts), then memory"),
        "coefficients": {p.name: {"before": r.prior[p.name], "after": r.fitted[p.name],
                                  "prior_sigma": p.sigma, "prior_in": "log" if p.log else "natural units",
                                  "bounds": [p.lo, p.hi]} for p in r.params},
        "errors": {"iteration_time": error_block(cal, "time"), "peak_memory": error_block(cal, "memory")},
        "leave_one_out": ("leave-one-plan-out: repeats of a plan are held out together"
                          if cal.loo is not None else "not run"),
        **({"stopped_by_time_limit": list(cal.stopped)} if cal.stopped else {}),
        "noise_floor": {"repeat_time_cv": cal.noise.time_cv, "within_run_time_cv": cal.noise.within_run_cv,
                        "repeat_groups": len(cal.noise.groups)},
    }
    return _plain({**prev, "calibration": block})
