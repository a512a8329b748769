"""What a search found, for people (format_report) and for programs (result_to_json): the plan
compressed into runs of identical blocks, its prediction, the baselines, the certificate, and why
it beats uniform ZeRO-3."""

import math
from dataclasses import replace

from osdp_sim.costmodel import Estimate, estimate
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.hardware.trust import trust_of
from osdp_sim.jsonformat import stamped
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan import GroupChoice, Plan, plan_to_dict
from osdp_sim.planner.headroom import margin_bytes, margin_line
from osdp_sim.units import format_bytes, format_seconds

BASELINE_ORDER = ("ddp", "zero2", "zero3", "ddp_per_block", "zero2_per_block", "zero3_per_block",
                  "osdp_knapsack")
BASELINE_TITLES = {"ddp": "uniform DDP", "zero2": "uniform ZeRO-2", "zero3": "uniform ZeRO-3 (FSDP)",
                   "ddp_per_block": "DDP, per-block ckpt", "zero2_per_block": "ZeRO-2, per-block ckpt",
                   "zero3_per_block": "ZeRO-3, per-block ckpt", "osdp_knapsack": "OSDP knapsack DP"}
SMALL_GAIN = 0.05
"""A gain over the strongest baseline below this fraction is reported as small: it is within the
step-time error the calibrated profiles measure (docs/accuracy.md: 6.6% leave-one-plan-out on CPU)."""


# ---------------------------------------------------------------- the plan in words

def describe_choice(c: GroupChoice) -> str:
    if not c.is_split:
        return c.strategy
    if c.strategy == "zero3":
        return f"zero3 in {c.slices} slices"
    return f"{c.strategy}, {c.sharded_slices}/{c.slices} slices zero3"


def _block_key(plan: Plan, i: int) -> tuple:
    ckpt = "selective" if plan.selective[i] else plan.checkpoint[i]     # truthy when checkpointed
    return (plan.choices[f"block{i}.attn"], plan.choices[f"block{i}.mlp"], ckpt)


def block_runs(plan: Plan) -> list[tuple[int, int, GroupChoice, GroupChoice, bool]]:
    """Runs of consecutive blocks with identical choices: (first, last, attn, mlp, checkpointed:
    False, True (full) or "selective")."""
    runs = []
    for i in range(plan.model.n_layers):
        key = _block_key(plan, i)
        if runs and runs[-1][1] == i - 1 and runs[-1][2:] == key:
            runs[-1] = (runs[-1][0], i) + key
        else:
            runs.append((i, i) + key)
    return runs


def summarize_plan(plan: Plan) -> list[str]:
    """One line per run of identical blocks, then the root, e.g.
    'blocks 0-45: attention ddp, mlp zero3 in 4 slices, checkpointed'."""
    lines = []
    for first, last, attn, mlp, ckpt in block_runs(plan):
        where = f"block {first}" if first == last else f"blocks {first}-{last}"
        lines.append(f"{where}: attention {describe_choice(attn)}, mlp {describe_choice(mlp)}"
                     + (", checkpointed" if ckpt else "") + (" (selective)" if ckpt == "selective" else ""))
    lines.append(f"root (embedding + head): {describe_choice(plan.choices['root'])}")
    return lines


def plan_oneline(plan: Plan) -> str:
    """The plan summary on one line (CSV cells, top-k lists)."""
    return f"mb {plan.micro_batch}x{plan.grad_accum}; " + "; ".join(summarize_plan(plan))


def settings_line(plan: Plan) -> str:
    shard = "all devices" if plan.shard_size == plan.devices else \
        f"groups of {plan.shard_size} ({plan.replicas} replicas)"
    return (f"micro-batch {plan.micro_batch} x {plan.grad_accum} accumulation x {plan.devices} devices "
            f"= global batch {plan.global_batch}; {plan.precision}, {plan.optimizer}; sharding over {shard}")


# ---------------------------------------------------------------- why it wins

def composition(plan: Plan) -> str:
    """How many blocks' attention and MLP use each choice, e.g.
    'attention: 46 zero2, 2 zero3; MLP: 45 zero2, 3 zero3 in 4 slices'."""
    parts = []
    for kind, title in (("attn", "attention"), ("mlp", "MLP")):
        counts: dict[str, int] = {}
        for i in range(plan.model.n_layers):
            d = describe_choice(plan.choices[f"block{i}.{kind}"])
            counts[d] = counts.get(d, 0) + 1
        parts.append(f"{title}: " + ", ".join(f"{n} {d}" for d, n in
                                              sorted(counts.items(), key=lambda kv: -kv[1])))
    return "; ".join(parts)


def uniform_zero3_like(plan: Plan) -> Plan:
    """Uniform ZeRO-3 with everything else (batch, checkpointing, shard group) as in `plan`."""
    return replace(plan, choices={k: GroupChoice("zero3") for k in plan.choices}, notes={})


def explain(spec: ModelSpec, hw: HardwareProfile, plan: Plan, est: Estimate, baselines: dict) -> str:
    """Two or three sentences: what the plan shards, replicates and splits; what that changes
    against uniform ZeRO-3 at the same batch and checkpointing (all-gather time, exposed
    communication, step time, peak memory); the speedup over the best uniform ZeRO-3 that fits."""
    n_groups = 2 * plan.model.n_layers
    blocks = [c for k, c in plan.choices.items() if k != "root"]
    kept = [c for c in blocks if c.strategy != "zero3"]
    partial = sum(1 for c in kept if c.is_split)
    sharded = [c for c in blocks if c.strategy == "zero3"]
    sharded_split = sum(1 for c in sharded if c.is_split)
    split = partial + sharded_split
    root = describe_choice(plan.choices["root"])
    parts = []
    if kept:
        parts.append(f"keeps the parameters of {len(kept)} of {n_groups} block groups from forward to "
                     f"backward with ZeRO-2 or DDP instead of re-sharding them"
                     + (f" ({partial} of them with some slices on ZeRO-3)" if partial else ""))
    if sharded:
        parts.append(f"re-shards {f'the other {len(sharded)}' if kept else f'all {len(sharded)} block groups'} "
                     f"with ZeRO-3"
                     + (f" ({sharded_split} of them split into slices gathered one at a time)"
                        if sharded_split else ""))
    what = "The plan " + _join(parts) + f" ({composition(plan)}; root {root})."
    z3 = estimate(spec, hw, uniform_zero3_like(plan))
    tb, zb = est.time_breakdown, z3.time_breakdown
    ck = sum(plan.checkpoint)
    changes = [_change("all-gather time per step", zb["all_gather_s"], tb["all_gather_s"], format_seconds),
               _change("exposed communication", zb["exposed_communication_s"], tb["exposed_communication_s"],
                       format_seconds),
               _change("the step", z3.iteration_time_s, est.iteration_time_s, format_seconds)]
    if split:
        changes.append(_change("the gathered parameters live at the memory peak",
                               z3.memory_breakdown.get("gathered_params", 0.0),
                               est.memory_breakdown.get("gathered_params", 0.0), format_bytes))
    sentence = (f"{what} Against uniform ZeRO-3 at the same batch (micro-batch {plan.micro_batch} x "
                f"{plan.grad_accum}, {ck} of {len(plan.checkpoint)} blocks checkpointed) it {_join(changes)}, "
                f"at {_signed_bytes(est.peak_memory_bytes - z3.peak_memory_bytes)} of peak memory "
                f"({format_bytes(z3.peak_memory_bytes)} -> {format_bytes(est.peak_memory_bytes)}).")
    b = baselines.get("zero3")
    if b is not None and b.feasible:
        sentence += (f" The best uniform ZeRO-3 that fits (micro-batch {b.micro_batch}"
                     f"{', checkpointed' if b.checkpoint else ''}) reaches {b.samples_per_s:.2f} samples/s; "
                     f"this plan {est.samples_per_s:.2f} ({est.samples_per_s / b.samples_per_s:.2f}x).")
    elif b is not None:
        sentence += " Uniform ZeRO-3 does not fit the limit at any batch in the space."
    return sentence + _gain_over_strongest(est, baselines, hw)


def strongest_baseline(baselines: dict):
    """The fastest feasible uniform baseline, per-block checkpointing included (None if none fits)."""
    fits = [b for n, b in baselines.items() if n != "osdp_knapsack" and b.feasible]
    return max(fits, key=lambda b: b.samples_per_s, default=None)


def _gain_over_strongest(est: Estimate, baselines: dict, hw: HardwareProfile) -> str:
    b = strongest_baseline(baselines)
    if b is None:
        return ""
    gain = est.samples_per_s / b.samples_per_s - 1.0
    ck = {"all": "every block checkpointed", "off": "no checkpointing"}.get(
        b.checkpoint_label, f"{b.checkpoint_label} checkpointed")
    where = f"{BASELINE_TITLES.get(b.name, b.name)}, micro-batch {b.micro_batch}, {ck}, {b.samples_per_s:.2f} samples/s"
    if gain >= SMALL_GAIN:
        return f" Over the strongest uniform plan ({where}) it gains {gain:.1%}."
    err = trust_of(hw).time_error
    within = f"the profile's step-time error ({err:.1%} leave-one-plan-out)" if err is not None \
        else "the step-time error of a calibrated profile"
    return (f" Over the strongest uniform plan ({where}) the gain is small, {gain:.1%}: within {within}; "
            f"measure both before relying on it (osdp-sim validate).")


def _change(what: str, before: float, after: float, fmt) -> str:
    if abs(after - before) <= 1e-9 * max(abs(before), 1e-30):
        return f"leaves {what} at {fmt(after)}"
    verb = "cuts" if after < before else "raises"
    return f"{verb} {what} from {fmt(before)} to {fmt(after)}"


def _signed_bytes(delta_bytes: float) -> str:
    return ("+" if delta_bytes >= 0 else "-") + format_bytes(abs(delta_bytes))


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# ---------------------------------------------------------------- JSON

def _est_dict(est: Estimate) -> dict:
    return {"peak_memory_bytes": est.peak_memory_bytes, "iteration_time_s": est.iteration_time_s,
            "samples_per_s": est.samples_per_s, "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
            "memory_breakdown": dict(est.memory_breakdown), "time_breakdown": dict(est.time_breakdown),
            "model_states_bytes": dict(est.model_states_bytes), "peak_during": est.peak_during}


def _certificate(result) -> dict:
    return {"status": result.status, "optimal": result.status == "optimal", "seconds": result.seconds,
            "nodes": result.nodes, "leaves": result.leaves, "best_bound": result.best_bound_samples_per_s,
            "gap": result.gap, "message": result.message, "open_configs": [o.to_dict() for o in result.open_configs]}


def result_to_json(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, result,
                   baselines: dict, *, explanation: str | None = None, headroom_bytes: float = 0.0) -> dict:
    """One JSON-ready object (format osdp-sim/search, docs/json.md): plan, predicted, baselines,
    search certificate, top plans, why. mem_limit_bytes is the limit searched (headroom taken off)."""
    plan, est = result.plan, result.prediction
    usable = hw.device.usable_memory_bytes
    out = {"model": spec.name, "params": spec.param_count, "hardware": hw.name,
           "devices": plan.devices if plan else hw.device.count, "mem_limit_bytes": mem_limit_bytes,
           "usable_memory_bytes": usable, "headroom_bytes": headroom_bytes, "status": result.status,
           "provenance": trust_of(hw).to_json()}
    if plan is not None:
        out["plan"] = plan_to_dict(plan)
        out["plan_summary"] = summarize_plan(plan)
        out["predicted"] = dict(_est_dict(est), micro_batch=plan.micro_batch, grad_accum=plan.grad_accum,
                                global_batch=plan.global_batch,
                                margin_bytes=margin_bytes(est.peak_memory_bytes, usable))
    else:
        out["min_peak_memory_bytes"] = result.min_peak_memory_bytes
    out["baselines"] = {}
    for name, b in baselines.items():
        d = b.to_dict()
        if plan is not None and b.feasible:
            d["speedup"] = est.samples_per_s / b.samples_per_s
        out["baselines"][name] = d
    out["search"] = _certificate(result)
    out["top"] = [{"peak_memory_bytes": t.prediction.peak_memory_bytes, "samples_per_s": t.prediction.samples_per_s,
                   "micro_batch": t.plan.micro_batch, "grad_accum": t.plan.grad_accum,
                   "summary": summarize_plan(t.plan)} for t in result.top]
    if explanation is not None:
        out["why"] = explanation
    return stamped("search", out)


def no_plan_to_json(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, result, message: str,
                    *, min_peak_memory_bytes: float | None, headroom_bytes: float = 0.0) -> dict:
    """The search --json object when no plan was found (status infeasible or time_limit)."""
    least = min_peak_memory_bytes
    return stamped("search", {
        "status": result.status, "model": spec.name, "hardware": hw.name, "devices": hw.device.count,
        "mem_limit_bytes": mem_limit_bytes, "usable_memory_bytes": hw.device.usable_memory_bytes,
        "headroom_bytes": headroom_bytes, "provenance": trust_of(hw).to_json(),
        "min_peak_memory_bytes": least if least is None or math.isfinite(least) else None,
        "min_peak_proven": result.min_peak_proven, "message": message})


# ---------------------------------------------------------------- text

def format_report(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, result,
                  baselines: dict, *, explanation: str | None = None, top_k: int = 1,
                  headroom_bytes: float = 0.0) -> str:
    plan, est = result.plan, result.prediction
    lines = [f"model      {spec.name} ({spec.param_count / 1e9:.3f} B params, seq {spec.seq_len})",
             f"hardware   {hw.name}: {plan.devices} x {hw.device.name}; limit {format_bytes(mem_limit_bytes)} "
             f"per device" + (f" ({format_bytes(headroom_bytes)} of headroom kept free below "
                              f"{format_bytes(mem_limit_bytes + headroom_bytes)})" if headroom_bytes else ""), ""]
    lines.append("plan")
    lines += [f"  {s}" for s in summarize_plan(plan)]
    lines.append(f"  {settings_line(plan)}")
    ck = sum(plan.checkpoint)
    sel = sum(plan.selective)
    lines.append(f"  checkpointing: {ck} of {len(plan.checkpoint)} blocks"
                 + (f" ({sel} selective)" if sel else ""))

    lines += ["", f"peak memory     {format_bytes(est.peak_memory_bytes):>11} of {format_bytes(mem_limit_bytes)} "
              f"limit ({est.peak_memory_bytes / mem_limit_bytes:.1%}), during {est.peak_during}"]
    for k, v in est.memory_breakdown.items():
        if v:
            lines.append(f"  {k:<20} {format_bytes(v):>11}")
    lines.append(f"margin          {margin_line(est.peak_memory_bytes, hw.device.usable_memory_bytes, headroom_bytes)}")
    tb = est.time_breakdown
    lines += ["", f"iteration time  {format_seconds(est.iteration_time_s):>11}   compute {format_seconds(tb['compute_s'])}, "
              f"communication {format_seconds(tb['communication_s'])} of which exposed "
              f"{format_seconds(tb['exposed_communication_s'])}"]
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        if tb[f"{kind}_s"] > 0:
            lines.append(f"  {kind:<20} {format_seconds(tb[kind + '_s']):>11}   exposed "
                         f"{format_seconds(tb[kind + '_exposed_s'])}")
    lines += ["", f"throughput      {est.samples_per_s:11.2f} samples/s   {est.tokens_per_s:,.0f} tokens/s   "
              f"MFU {est.mfu:.1%}", f"  ({trust_of(hw).line()})"]

    lines += ["", "baselines (each at its own best micro-batch)"]
    rows = [("", "fits", "micro-batch", "checkpoint", "shards over", "peak memory", "samples/s", "this plan")]
    for name in BASELINE_ORDER:
        b = baselines.get(name)
        if b is None:
            continue
        if b.feasible:
            rows.append((BASELINE_TITLES[name], "yes", f"{b.micro_batch}x{b.grad_accum}", b.checkpoint_label,
                         str(b.shard_group), format_bytes(b.peak_memory_bytes), f"{b.samples_per_s:.2f}",
                         f"{est.samples_per_s / b.samples_per_s:.2f}x"))
        elif b.note and b.note.startswith("skipped"):
            rows.append((BASELINE_TITLES[name], "-", "-", "-", "-", "-", "-", "-"))
        else:
            need = f">= {format_bytes(b.peak_memory_bytes)}" if b.peak_memory_bytes else "-"
            rows.append((BASELINE_TITLES[name], "no", "-", "-", "-", need, "-", "-"))
    lines += ["  " + r for r in _table(rows)]
    lines += [f"  {BASELINE_TITLES[n]}: {baselines[n].note}" for n in BASELINE_ORDER
              if baselines.get(n) is not None and baselines[n].note]

    lines += ["", "certificate"]
    lines.append(f"  status {result.status}; {result.nodes:,} nodes, {result.leaves:,} leaves evaluated; "
                 f"best bound {result.best_bound_samples_per_s:.2f} samples/s; gap {result.gap:.2%}; "
                 f"{format_seconds(result.seconds)}")
    if result.message:
        lines.append(f"  {result.message}")
    if top_k > 1 and result.top:
        lines += ["", f"top {min(top_k, len(result.top))} plans"]
        for i, t in enumerate(result.top[:top_k], 1):
            lines.append(f"  {i}. {t.prediction.samples_per_s:.2f} samples/s, "
                         f"{format_bytes(t.prediction.peak_memory_bytes)}: {plan_oneline(t.plan)}")
    if explanation:
        lines += ["", "why", "  " + explanation]
    return "\n".join(lines)


def _table(rows) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in
                      enumerate(zip(r, widths))).rstrip() for r in rows]
