"""Leave-one-out: each run predicted by a profile fitted without it — the honest accuracy figure.

Repeats of one plan (same plan, world size and settings; only the seed differs) are left out
together: otherwise the twin left in the fit would carry the very measurement being predicted.
So this is leave-one-plan-out, and it equals plain leave-one-out when no plan is repeated.
"""

import sys
from dataclasses import dataclass

from osdp_sim.calibrate.fit import FitResult, Prediction, Predictor, TimeUp, fit, past


@dataclass(frozen=True)
class LooResult:
    predictions: tuple[Prediction, ...]     # per run, in the order of FitResult.runs
    folds: int                              # distinct plans = fits performed
    fitted: tuple[dict, ...]                # coefficients of each fold's fit, in fold order


def plan_groups(runs) -> list[list[int]]:
    """Indices of runs grouped by plan_id, in first-appearance order."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(r.plan_id, []).append(i)
    return list(groups.values())


def leave_one_out(full: FitResult, base_profile, *, progress="stderr", loo_starts: int = 2,
                  deadline_s: float | None = None) -> LooResult:
    """Refit without each plan in turn (started from the full fit and from the prior,
    `loo_starts` starts in all; the prior stays on the measured values) and predict the left-out
    runs. A fold that would leave no run to fit on
    predicts with the uncalibrated profile. Past `deadline_s` (time.monotonic()) it raises TimeUp
    with the folds done: a fold cut short would not be an honest prediction."""
    progress = sys.stderr if progress == "stderr" else progress
    runs = list(full.runs)
    groups = plan_groups(runs)
    preds: list[Prediction | None] = [None] * len(runs)
    fitted = []
    for n, held in enumerate(groups, 1):
        if past(deadline_s):
            raise TimeUp(f"{n - 1} of {len(groups)} folds done")
        if progress:
            print(f"osdp-sim calibrate: leave-one-out fold {n}/{len(groups)} "
                  f"({runs[held[0]].model_name} {runs[held[0]].label})", file=progress, flush=True)
        keep = [r for i, r in enumerate(runs) if i not in set(held)]
        if keep:
            f = fit(base_profile, keep, loss=full.loss, params=full.params, start=full.fitted,
                    sigma_time_log=full.sigma_time_log, sigma_memory_log=full.sigma_memory_log,
                    starts=loo_starts, deadline_s=deadline_s)
            if f.stopped:
                raise TimeUp(f"{n - 1} of {len(groups)} folds done")
            values = f.fitted
        else:
            values = {p.name: full.prior[p.name] for p in full.params}
        fitted.append(values)
        out = Predictor(base_profile, [runs[i] for i in held], full.params).predict(values)
        for i, p in zip(held, out):
            preds[i] = p
    return LooResult(predictions=tuple(preds), folds=len(groups), fitted=tuple(fitted))
