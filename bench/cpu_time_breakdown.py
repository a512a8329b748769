"""Where one transformer block's CPU time goes, measured against what the cost model charges
(issue 15: micro-batch versus recomputation on the 2-core CPU).

    python bench/cpu_time_breakdown.py [--hw hwprofiles/cpu-2core-calibrated.yaml] \
        [--model gpt2-small-cpu] [--micro-batch 1,2,3,4,6,8] [--repeats 7] \
        [--tune validate/tune/gpt2-small-cpu-260MiB] [--time-limit 240]

One block of the built-in model (osdp_sim/runtime/modules.py), in the plan's compute dtype (bf16),
one process, 1 thread: forward, backward, and a checkpointed block's backward (which recomputes
the forward), wall time median over --repeats, plus one torch.profiler pass per micro-batch that
splits the time into GEMMs (addmm/mm/bmm, per shape), attention (SDPA), the other ops
(norms, GELU, residuals, copies) and what is in no op (autograd engine, Python). The model's
charge for the same block comes from lowering.py's terms on the same profile. Last, the tune's
candidates are re-simulated with every block's compute replaced by the measured one (same
schedule and communication): does measured block compute restore the measured order?
"""

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from osdp_sim.cli.common import run_script
from osdp_sim.costmodel.estimate import _simulate, estimate
from osdp_sim.costmodel.kernels import HOST_OPS
from osdp_sim.costmodel.lowering import group_times, lower
from osdp_sim.costmodel.rates import gemm_efficiency, gemm_shape_time_s, task_time_s
from osdp_sim.errors import UserError
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.plan import uniform_plan
from osdp_sim.plan.io import plan_from_dict

GEMM_OPS = ("aten::addmm", "aten::mm", "aten::bmm")


def _model_block(spec, hw, mb: int, dtype: str) -> dict:
    """The cost model's terms for one block at micro-batch mb (seconds; lowering.group_times, no
    FSDP2 collective calls: those are charged to the unit's steps)."""
    tokens = mb * spec.config.seq_len
    gemm = attn = elem = host = bwd = rec = 0.0
    for g in spec.blocks[0].groups:
        t = group_times(spec, g, hw, dtype, tokens)
        gemm += sum(t.slice_fwd_s.values())
        attn += t.attention_fwd_s
        elem += t.fixed_fwd_s - t.attention_fwd_s
        host += t.host_fwd_s
        dev_f = t.fixed_fwd_s + sum(t.slice_fwd_s.values())
        bwd += task_time_s(hw, t.fixed_bwd_s + sum(t.slice_bwd_s.values()), t.host_bwd_s)
        rec += task_time_s(hw, dev_f, t.host_fwd_s)
    fwd = task_time_s(hw, gemm + attn + elem, host)
    return {"gemm": gemm, "attn": attn, "elem": elem, "launch": host, "fwd": fwd, "bwd": bwd, "recompute": rec}


def _profile_split(fn, torch) -> dict:
    """Self CPU time of one call of fn by category, and the GEMMs by (op, shapes)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    out = {"gemm": 0.0, "attn": 0.0, "other": 0.0, "ops": 0}
    gemms = {}
    for e in prof.events():
        self_s = e.self_cpu_time_total / 1e6
        out["ops"] += 1
        if e.name in GEMM_OPS:
            out["gemm"] += self_s
            shapes = [tuple(s) for s in e.input_shapes if s]
            key = (e.name, tuple(shapes))
            gemms.setdefault(key, []).append(self_s)
        elif "attention" in e.name:
            out["attn"] += self_s
        else:
            out["other"] += self_s
    return out, gemms


def _gemm_mnk(name: str, shapes) -> tuple[int, int, int] | None:
    mats = [s for s in shapes if len(s) == 2]
    if len(mats) < 2:
        return None
    (m, k), (k2, n) = mats[-2], mats[-1]
    return (m, n, k) if k == k2 else None


def _measure(torch, cfg, mbs, repeats: int, deadline: float, dtype, sibling: bool) -> dict:
    sib = []
    try:
        return _measure_all(torch, cfg, mbs, repeats, deadline, dtype, sibling, sib)
    finally:
        for p in sib:
            p.kill()
            p.wait()


def _measure_all(torch, cfg, mbs, repeats, deadline, dtype, sibling, sibs) -> dict:
    from osdp_sim.runtime.modules import build_model
    torch.set_num_threads(1)
    block = build_model(cfg).blocks[0].to(dtype)
    seq, hidden = cfg.seq_len, cfg.hidden
    res = {}
    for mb in mbs:
        if time.monotonic() > deadline:
            print(f"time limit reached before micro-batch {mb}; stopping", flush=True)
            break
        sib = _start_sibling(mb, cfg.name) if sibling else None
        if sib is not None:
            sibs.append(sib)
            time.sleep(1.5)          # its import and first steps
        x = torch.randn(mb, seq, hidden, dtype=dtype, requires_grad=True)
        g = torch.randn(mb, seq, hidden, dtype=dtype)

        def fwd(ckpt):
            block.checkpointed = ckpt
            return block(x)

        def timed(ckpt):
            t0 = time.perf_counter()
            y = fwd(ckpt)
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            x.grad = None
            block.zero_grad(set_to_none=True)
            return t1 - t0, t2 - t1

        for _ in range(2):
            timed(False), timed(True)
        plain, ck = [], []
        for _ in range(repeats):     # interleaved so drift hits both alike
            plain.append(timed(False))
            ck.append(timed(True))
        med = lambda xs: statistics.median(xs)
        r = {"fwd": med(p[0] for p in plain), "bwd": med(p[1] for p in plain),
             "ckpt_fwd": med(c[0] for c in ck), "ckpt_bwd": med(c[1] for c in ck)}
        r["recompute"] = r["ckpt_bwd"] - r["bwd"]
        y = fwd(False)
        r["prof_fwd"], gf = _profile_split(lambda: fwd(False), torch)
        y = fwd(False)
        r["prof_bwd"], gb = _profile_split(lambda: y.backward(g), torch)
        x.grad = None
        block.zero_grad(set_to_none=True)
        r["gemms_fwd"], r["gemms_bwd"] = gf, gb
        if sib is not None:
            sib.kill()
            sib.wait()
        res[mb] = r
        print(f"  measured micro-batch {mb}{' (sibling busy)' if sibling else ''}: fwd {r['fwd'] * 1e3:.1f} ms, bwd {r['bwd'] * 1e3:.1f} ms, "
              f"recompute {r['recompute'] * 1e3:.1f} ms", flush=True)
    block.checkpointed = False
    return res


def _sibling(mb: int, model: str) -> int:
    """The other rank's share of the machine: the same block's forward and backward, until killed."""
    import torch
    from osdp_sim.model.load import load_model_config
    from osdp_sim.runtime.modules import build_model
    torch.set_num_threads(1)
    cfg = load_model_config(model)
    block = build_model(cfg).blocks[0].to(torch.bfloat16)
    x = torch.randn(mb, cfg.seq_len, cfg.hidden, dtype=torch.bfloat16, requires_grad=True)
    while True:
        block(x).sum().backward()


def _start_sibling(mb: int, model: str):
    return subprocess.Popen([sys.executable, __file__, "--sibling-of", str(mb), "--model", model],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _measure_whole(torch, cfg, plans, repeats: int, dtype, sibling: bool, deadline: float) -> dict:
    sib = []
    try:
        return _measure_whole_all(torch, cfg, plans, repeats, dtype, sibling, deadline, sib)
    finally:
        for p in sib:
            p.kill()
            p.wait()


def _measure_whole_all(torch, cfg, plans, repeats, dtype, sibling, deadline, sibs) -> dict:
    """Forward + backward (+ recompute) of the whole model, one process, with each plan's
    checkpointed blocks: the compute alone, without FSDP, communication or the optimizer."""
    from osdp_sim.runtime.modules import build_model
    model = build_model(cfg).to(dtype)
    out = {}
    for label, plan in plans:
        if time.monotonic() > deadline:
            print(f"time limit reached before the whole model of {label!r}; stopping", flush=True)
            break
        mb = plan.micro_batch
        sib = _start_sibling(mb, cfg.name) if sibling else None
        if sib is not None:
            sibs.append(sib)
            time.sleep(1.5)
        for blk, on in zip(model.blocks, plan.checkpoint):
            blk.checkpointed = on
        idx = torch.randint(cfg.vocab_size, (mb, cfg.seq_len))
        ts = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            model(idx, idx).backward()
            ts.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        if sib is not None:
            sib.kill()
            sib.wait()
        out[label] = statistics.median(ts[1:])
        print(f"  measured whole model, {label}: fwd+bwd {out[label] * 1e3:.0f} ms", flush=True)
    return out


def _fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def _rescored(spec, hw, plan, blk_fwd: dict, blk_bwd: dict, model_fwd: dict, model_bwd: dict) -> float:
    """Iteration time of `plan` with each block step's forward and backward scaled so that the block
    costs what was measured at the plan's micro-batch (the model's split over the block's steps,
    the schedule, the communication and the root kept)."""
    low = lower(spec, hw, plan)
    mb = plan.micro_batch
    sf, sb = blk_fwd[mb] / model_fwd[mb], blk_bwd[mb] / model_bwd[mb]
    steps = tuple(dataclasses.replace(s, fwd_s=s.fwd_s * sf, bwd_s=s.bwd_s * sb) if s.block >= 0 else s
                  for s in low.steps)
    low = dataclasses.replace(low, steps=steps)
    t, _, _ = _simulate(low, hw, reduce=True, grads_resident=False, unsharded_grads_resident=False,
                        optimizer=True)
    return t


def _measured_profile(hw, meas, precision: str, fwd_fixed_s: float, launches_per_fwd: int):
    """The profile with its compute terms replaced by this run's measurements (no model code
    changed): the GEMM curve and peak from the GEMMs at the model's own shapes, the per-kernel
    cost from the block forward's fixed part over the launches the model counts in it, the
    backward/forward ratio measured."""
    by_size = {}
    for r in meas.values():
        for pas in ("fwd", "bwd"):
            for (name, shapes), ts in r[f"gemms_{pas}"].items():
                mnk = _gemm_mnk(name, shapes)
                if mnk:
                    f = 2.0 * mnk[0] * mnk[1] * mnk[2]
                    by_size.setdefault(round(f / 1e9, 4), []).append(f / statistics.median(ts))
    rates = {g: statistics.median(v) for g, v in by_size.items()}
    peak = max(rates.values())
    curve = tuple((g, rates[g] / peak) for g in sorted(rates))
    c = hw.compute
    compute = dataclasses.replace(
        c, peak_flops={**c.peak_flops, precision: peak},
        gemm_efficiency={**c.gemm_efficiency, precision: curve}, efficiency_scale=1.0)
    host = dataclasses.replace(hw.host, op_s=max(fwd_fixed_s, 0.0) / launches_per_fwd)
    return dataclasses.replace(hw, compute=compute, host=host)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="hwprofiles/cpu-2core-calibrated.yaml")
    ap.add_argument("--model", default="gpt2-small-cpu")
    ap.add_argument("--micro-batch", default="1,2,3,4,6,8")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tune", default="validate/tune/gpt2-small-cpu-260MiB",
                    help="an osdp-sim tune --out folder whose candidates are re-simulated ('' to skip)")
    ap.add_argument("--time-limit", type=float, default=240.0, help="seconds for the measurement")
    ap.add_argument("--alone", action="store_true",
                    help="measure with the other core idle (default: a second process runs the same "
                         "block at the same micro-batch, as the other rank does in a 2-rank run)")
    ap.add_argument("--sibling-of", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sibling_of:
        return _sibling(args.sibling_of, args.model)
    try:
        mbs = [int(v) for v in args.micro_batch.split(",")]
    except ValueError:
        raise UserError(f"expected whole numbers separated by commas, got {args.micro_batch!r}",
                        field="--micro-batch") from None
    if any(m < 1 for m in mbs) or args.repeats < 1:
        raise UserError("micro-batches and --repeats must be >= 1", field="--micro-batch")
    hw = load_profile(args.hw)
    spec = load_model(args.model)
    cfg = spec.config
    precision = uniform_plan(cfg, "zero3", devices=2, micro_batch=1).precision
    if args.tune:        # the dtype the tune's plans ran in
        try:
            first = json.loads((Path(args.tune) / "candidates.json").read_text())["candidates"][0]
            precision = plan_from_dict(first["plan"]).precision
        except (OSError, KeyError, IndexError, ValueError) as e:
            raise UserError(f"cannot read {Path(args.tune) / 'candidates.json'}: {e}", field="--tune") from None
    import torch
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    print(f"{args.model}, one block, {precision}, 1 thread, profile {hw.name}: "
          f"kernel_launch {hw.compute.kernel_launch_s * 1e6:.0f} us, host op {hw.host.op_s * 1e6:.1f} us, "
          f"efficiency_scale {hw.compute.efficiency_scale}", flush=True)
    deadline = time.monotonic() + args.time_limit
    meas = _measure(torch, cfg, mbs, args.repeats, deadline, dtype, not args.alone)
    mbs = sorted(meas)
    model = {mb: _model_block(spec, hw, mb, precision) for mb in mbs}

    ms = lambda s: f"{s * 1e3:8.1f}"
    print("\n## Block totals (ms): model vs measured")
    print("| mb | model fwd | meas fwd | model bwd | meas bwd | bwd/fwd meas | model recompute | meas recompute |"
          " meas/model fwd | meas/model bwd |")
    for mb in mbs:
        m, r = model[mb], meas[mb]
        print(f"| {mb} |{ms(m['fwd'])} |{ms(r['fwd'])} |{ms(m['bwd'])} |{ms(r['bwd'])} | "
              f"{r['bwd'] / r['fwd']:.2f} |{ms(m['recompute'])} |{ms(r['recompute'])} | "
              f"{r['fwd'] / m['fwd']:.2f} | {r['bwd'] / m['bwd']:.2f} |")

    print("\n## Forward by term (ms): model [gemm, attention core, elementwise; of which launches] vs "
          "measured self CPU [gemm, attention, other ops, outside ops]")
    print("| mb | model gemm | model attn | model elem | model launches | meas gemm | meas attn | "
          "meas other | meas outside ops | ops |")
    for mb in mbs:
        m, p, r = model[mb], meas[mb]["prof_fwd"], meas[mb]
        outside = r["fwd"] - (p["gemm"] + p["attn"] + p["other"])
        print(f"| {mb} |{ms(m['gemm'])} |{ms(m['attn'])} |{ms(m['elem'])} |{ms(m['launch'])} |"
              f"{ms(p['gemm'])} |{ms(p['attn'])} |{ms(p['other'])} |{ms(outside)} | {p['ops']} |")
    print("\n## Backward by term (ms, measured self CPU; the model charges each backward kernel)")
    print("| mb | model bwd | meas gemm | meas attn | meas other | meas outside ops | ops |")
    for mb in mbs:
        p, r = meas[mb]["prof_bwd"], meas[mb]
        outside = r["bwd"] - (p["gemm"] + p["attn"] + p["other"])
        print(f"| {mb} |{ms(model[mb]['bwd'])} |{ms(p['gemm'])} |{ms(p['attn'])} |{ms(p['other'])} |"
              f"{ms(outside)} | {p['ops']} |")

    print("\n## GEMMs per shape (forward and backward), achieved vs the profile's rate")
    print("| mb | pass | op | M x N x K | GFLOP | meas ms | model ms | meas GFLOP/s | model GFLOP/s (no launch) |")
    peak = hw.compute.peak_flops[precision]
    cb = 2 if precision == "bf16" else 4
    for mb in mbs:
        for pas in ("fwd", "bwd"):
            for (name, shapes), ts in sorted(meas[mb][f"gemms_{pas}"].items()):
                mnk = _gemm_mnk(name, shapes)
                if mnk is None:
                    continue
                f = 2.0 * mnk[0] * mnk[1] * mnk[2]
                t = statistics.median(ts)
                print(f"| {mb} | {pas} | {name[6:]} | {mnk[0]} x {mnk[1]} x {mnk[2]} | {f / 1e9:.3f} |"
                      f"{ms(t)} |{ms(gemm_shape_time_s(hw, *mnk, precision, cb))} | {f / t / 1e9:.1f} | "
                      f"{peak * gemm_efficiency(hw, f, precision) / 1e9:.1f} |")

    toks = [mb * cfg.seq_len for mb in mbs]
    fwd_fixed_s = _fit_line(toks, [meas[mb]["fwd"] for mb in mbs])[0] if len(mbs) >= 2 else 0.0
    print("\n## Linear fit per block, t = fixed + per_token x tokens (forward + backward)")
    for label, ys in (("model fwd+bwd", [model[mb]["fwd"] + model[mb]["bwd"] for mb in mbs]),
                      ("measured fwd+bwd", [meas[mb]["fwd"] + meas[mb]["bwd"] for mb in mbs]),
                      ("model recompute", [model[mb]["recompute"] for mb in mbs]),
                      ("measured recompute", [meas[mb]["recompute"] for mb in mbs])):
        if len(mbs) >= 2:
            a, b = _fit_line(toks, ys)
            print(f"  {label:20s} fixed {a * 1e3:7.2f} ms  per 128 tokens {b * 128 * 1e3:7.2f} ms")

    if args.tune:
        tune_dir = Path(args.tune)
        try:
            cands = json.loads((tune_dir / "candidates.json").read_text())["candidates"]
            ranking = {r["label"]: r for r in json.loads((tune_dir / "tune.json").read_text())["ranking"]}
        except (OSError, KeyError, ValueError) as e:
            raise UserError(f"cannot read the tune's candidates.json / tune.json: {e}", field="--tune") from None
        mfwd = {mb: model[mb]["fwd"] for mb in mbs}
        mbwd = {mb: model[mb]["bwd"] + 0.0 for mb in mbs}
        mrec_f = {mb: meas[mb]["fwd"] for mb in mbs}
        mrec_b = {mb: meas[mb]["bwd"] for mb in mbs}
        print("\n## The tune's candidates: measured step vs model step vs model with measured block compute")
        print("  (measured-compute column: every block's forward/recompute scaled to the measured block "
              "forward, backward to the measured backward; comm, schedule, root as the model)")
        launches = sum(HOST_OPS.get((cfg.family, g.kind), (0, 0))[0] for g in spec.blocks[0].groups)
        hw_m = _measured_profile(hw, meas, precision, fwd_fixed_s, max(launches, 1))
        cm = hw_m.compute
        print(f"  measured-terms profile: peak {cm.peak_flops[precision] / 1e9:.1f} GFLOP/s, host op "
              f"{hw_m.host.op_s * 1e6:.1f} us ({launches} ops per block forward), "
              f"curve {[(g, round(e, 3)) for g, e in cm.gemm_efficiency[precision]]}")
        print("| candidate | mb | ckpt blocks | measured step s | model step s | model, measured block compute s |"
              " model, measured-terms profile s | measured samples/s | model samples/s | rescored samples/s |"
              " measured-terms samples/s |")
        rows, whole_rows, fixed_rows = [], [], []
        todo = [(c["label"], plan_from_dict(c["plan"])) for c in cands
                if ranking.get(c["label"], {}).get("measured_samples_per_s") is not None
                and plan_from_dict(c["plan"]).micro_batch in meas]
        whole = _measure_whole(torch, cfg, todo, max(2, args.repeats // 2), dtype, not args.alone, deadline)
        todo = [(lab, p) for lab, p in todo if lab in whole]
        for c in cands:
            plan = plan_from_dict(c["plan"])
            r = ranking.get(c["label"])
            if c["label"] not in whole:
                continue
            est = estimate(spec, hw, plan)
            t_fix = _rescored(spec, hw, plan, mrec_f, mrec_b, mfwd, mbwd)
            samples = plan.micro_batch * plan.devices * plan.grad_accum
            t_meas = samples / r["measured_samples_per_s"]
            est_m = estimate(spec, hw_m, plan)
            n_coll = sum(1 for t in est_m.timeline if t.stream != "compute")
            fixed_rows.append((c["label"], samples, t_meas, est_m.iteration_time_s, n_coll))
            b = est.time_breakdown
            whole_rows.append((c["label"], t_meas, whole[c["label"]],
                               b["forward_s"] + b["backward_s"] + b["recompute_s"], b["optimizer_s"],
                               b["exposed_communication_s"]))
            rows.append((c["label"], r["measured_samples_per_s"], samples / t_fix, est.samples_per_s,
                         est_m.samples_per_s))
            print(f"| {c['label']} | {plan.micro_batch} | {sum(plan.checkpoint)} | {t_meas:.3f} | "
                  f"{est.iteration_time_s:.3f} | {t_fix:.3f} | {est_m.iteration_time_s:.3f} | "
                  f"{r['measured_samples_per_s']:.3f} | {est.samples_per_s:.3f} | {samples / t_fix:.3f} | "
                  f"{est_m.samples_per_s:.3f} |")
        if not rows:
            print("\n  no candidate at a measured micro-batch (time limit?); nothing to re-simulate")
            return 0
        print("\n## Whole model: measured step (2 ranks) vs its compute alone (1 process, fwd+bwd+recompute)")
        print("| candidate | measured step s | measured compute alone s | rest (FSDP, comm, optimizer) s |"
              " model fwd+bwd+recompute s | model optimizer s | model exposed comm s |")
        for lab, tm, tw, mc, mo, me in whole_rows:
            print(f"| {lab} | {tm:.3f} | {tw:.3f} | {tm - tw:.3f} | {mc:.3f} | {mo:.3f} | {me:.3f} |")
        # The fixed cost the measured-terms profile leaves out, as one cost per collective call
        # (FSDP2's per-unit hooks, copy-in/out and the gloo call itself), fitted as the median.
        per_call = statistics.median((tm - tp) / n for _, _, tm, tp, n in fixed_rows)
        print(f"\n## Measured-terms profile + a fixed host cost per collective call, fitted "
              f"(median over the candidates): {per_call * 1e3:.2f} ms per call")
        print("| candidate | collective calls | measured step s | measured-terms s | + per-call cost s |"
              " measured samples/s | predicted samples/s |")
        for lab, smp, tm, tp, n in fixed_rows:
            print(f"| {lab} | {n} | {tm:.3f} | {tp:.3f} | {tp + n * per_call:.3f} | {smp / tm:.3f} |"
                  f" {smp / (tp + n * per_call):.3f} |")
        for i, (lab, smp, tm, tp, n) in enumerate(fixed_rows):
            rows[i] = rows[i] + (smp / (tp + n * per_call),)
        order = lambda k: [row[0] for row in sorted(rows, key=lambda row: -row[k])]
        print(f"\n  measured order:        {order(1)}\n  model order:           {order(3)}"
              f"\n  rescored order:        {order(2)}\n  measured-terms order:  {order(4)}"
              f"\n  + per-call cost order: {order(5)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
