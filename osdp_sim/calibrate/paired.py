"""Run several plans side by side and record their paired speed ratios (`osdp-sim compare`, the
decisions campaign's paired round). The per-rank program is runtime/compare.py; the record and its
estimator are records/comparison.py."""

import shutil
import sys
from dataclasses import dataclass

from osdp_sim.errors import UserError
from osdp_sim.plan import Plan, plan_to_dict
from osdp_sim.records.comparison import Comparison, build_comparison, load_comparison, save_comparison


@dataclass(frozen=True)
class CompareSettings:
    """How a comparison runs."""

    device: str = "cpu"
    backend: str = "fsdp2"
    warmup: int = 2
    """Untimed steps of every plan before the rounds."""
    rounds: int = 30
    """Timed rounds; each is one step of every plan. The ratio's standard error falls as
    1/sqrt(rounds): about 12% / sqrt(rounds) on the 2-core CPU (docs/accuracy.md)."""
    seed: int = 0
    threads: int | None = None
    """CPU threads per rank (default: cores / ranks)."""
    timeout_s: float = 900.0
    """Limit of the whole run; the rounds finished before it are kept."""


def run_comparison(plans: list[Plan], labels: list[str], hw_ref: str, out_path, settings: CompareSettings,
                   *, echo="stderr") -> Comparison:
    """Run `plans` interleaved on real ranks, write the comparison record to `out_path`
    (atomically, whatever the outcome) and return it loaded."""
    from osdp_sim.hardware.load import load_profile, resolve_profile_path
    from osdp_sim.model.hf import hf_config_path
    from osdp_sim.records import predict
    from osdp_sim.runtime.launch import available_cores, check_cpu_ranks, launch

    if len(plans) < 2:
        raise UserError(f"expected at least 2 plans to compare, got {len(plans)}", field="--plan")
    devices = {p.devices for p in plans}
    if len(devices) > 1:
        raise UserError(f"the plans are for different device counts ({sorted(devices)}); compare plans made "
                        "for one count", field="--plan")
    nproc = plans[0].devices
    if settings.device == "cpu":
        check_cpu_ranks(nproc, field="--plan")
    hw = load_profile(hw_ref)
    hw_info = {"name": hw.name, "path": str(resolve_profile_path(hw_ref))}
    impls = [p.model.implementation for p in plans]
    entries = [{"plan": plan_to_dict(p), "impl": impl,
                "hf_config": hf_config_path(p.model) if impl == "hf" else None}
               for p, impl in zip(plans, impls)]
    predicted = [predict(p, hw, impl)["samples_per_s"] for p, impl in zip(plans, impls)]
    threads = settings.threads or max(1, available_cores() // nproc)
    spec = {"mode": "compare", "entries": entries, "backend": settings.backend, "device": settings.device,
            "warmup": settings.warmup, "rounds": settings.rounds, "seed": settings.seed,
            "threads_per_rank": threads, "timeout_s": settings.timeout_s}
    outcome = launch(spec, nproc, timeout_s=settings.timeout_s, echo=echo)
    record = build_comparison(
        status=outcome.status, run_id=outcome.run_id, plans=plans, labels=labels, impls=impls,
        hardware_profile=hw_info, env=outcome.env, rank_results=outcome.rank_results,
        settings={"warmup": settings.warmup, "rounds": settings.rounds, "seed": settings.seed,
                  "timeout_s": settings.timeout_s},
        predicted_samples_per_s=predicted, failure=outcome.failure)
    save_comparison(record, out_path)
    if outcome.status == "ok":
        shutil.rmtree(outcome.run_dir, ignore_errors=True)
    elif echo:
        reason = (outcome.failure or {}).get("reason", "unknown")
        print(f"osdp-sim compare: {outcome.status}: {reason} (rank logs in {outcome.run_dir}); "
              f"{record['rounds_completed']} rounds recorded", file=sys.stderr if echo == "stderr" else echo)
    return load_comparison(out_path)


def format_comparison(c: Comparison) -> str:
    """The table `osdp-sim compare` prints: each plan's measured and predicted samples/s, and its
    paired speed ratio to the measured best with that ratio's standard error."""
    from osdp_sim.calibrate.distinct import describe
    lines = [f"{c.rounds} rounds ({c.status}); ratio: paired speed over the measured best's, +- one standard error",
             f"{'plan':<34}{'measured':>10}{'predicted':>11}{'ratio to best':>17}   what it is"]
    best = c.best
    pred_best = c.plans[best].predicted_samples_per_s if best is not None else None
    for i, p in enumerate(c.plans):
        r = c.ratio(i, best) if best is not None else None
        ratio = "-" if r is None else ("best" if i == best else f"{r.ratio:.3f} +- {r.se:.3f}")
        meas = "-" if p.samples_per_s is None else f"{p.samples_per_s:.3f}"
        pred = "-" if p.predicted_samples_per_s is None else f"{p.predicted_samples_per_s:.3f}"
        lines.append(f"{p.label[:33]:<34}{meas:>10}{pred:>11}{ratio:>17}   {describe(p.plan)}")
    if pred_best:
        fastest = max(range(len(c.plans)), key=lambda i: c.plans[i].predicted_samples_per_s or 0)
        lines.append(f"predicted fastest: {c.plans[fastest].label}; measured best: {c.plans[best].label}")
    lines.append("(samples/s of the whole job: global batch / mean step time)")
    return "\n".join(lines)

