"""A rough compute breakdown of one training step, in one process on one thread, with no FSDP:
forward, backward and AdamW of a plan's model at its micro-batch, bf16 through torch.autocast (not
the same casts as FSDP2's mixed precision, so only indicative), against the cost model's
time_breakdown for the plan. docs/validation.md quotes it.

    python validate/compute_breakdown.py [--plan validate/plans/zero3.json] [--hw hwprofiles/cpu-2core.yaml]
"""

import argparse
import statistics
import sys
import time

import torch

from osdp_sim.cli.common import positive_int, run_script
from osdp_sim.costmodel import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.spec import build_spec
from osdp_sim.plan import load_plan
from osdp_sim.runtime.modules import build_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default="validate/plans/zero3.json")
    ap.add_argument("--hw", default="hwprofiles/cpu-2core.yaml")
    ap.add_argument("--iters", type=positive_int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    plan = load_plan(args.plan)
    cfg = plan.model
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    times = {"forward": [], "backward": [], "adamw": []}
    for i in range(args.iters + 3):
        tok = torch.randint(0, cfg.vocab_size, (plan.micro_batch, cfg.seq_len + 1), generator=g)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=plan.precision == "bf16"):
            loss = model(tok[:, :-1], tok[:, 1:])
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if i >= 3:                                           # warm-up steps not counted
            for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[k].append(v)
    bd = estimate(build_spec(cfg), load_profile(args.hw), plan).time_breakdown
    pred = {"forward": bd["forward_s"], "backward": bd["backward_s"], "adamw": bd["optimizer_s"]}
    print(f"{cfg.name}, micro-batch {plan.micro_batch}, one process, one thread, median of {args.iters} steps:")
    for k, v in times.items():
        p = pred[k]
        print(f"  {k:9s} measured {statistics.median(v) * 1e3:7.1f} ms   predicted "
              + (f"{p * 1e3:7.1f} ms   ratio {statistics.median(v) / p:.2f}" if p else "-"))


if __name__ == "__main__":
    sys.exit(run_script(main))
