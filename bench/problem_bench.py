"""The set-up of a search's configurations: build_problem (every group's steps under every choice)
at micro-batches 1..N of one model, best of three passes with the cost model's caches warm (the
group times and units repeat across passes; the steps are rebuilt, as a search rebuilds them per
configuration). Compare two commits by running it with PYTHONPATH set to each.

    python bench/problem_bench.py [--model gpt2-tiny] [--hw cpu-2core] [--micro-batches 150]
"""

import argparse
import time

from osdp_sim.costmodel.fast import Config
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.planner.problem import build_problem
from osdp_sim.planner.space import SearchSpace, group_choices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--hw", default="cpu-2core")
    ap.add_argument("--micro-batches", type=int, default=150)
    args = ap.parse_args()
    spec, hw = load_model(args.model), load_profile(args.hw)
    choices = group_choices(SearchSpace())
    n = hw.device.count
    best = float("inf")
    for rep in range(3):
        t = time.perf_counter()
        for mb in range(1, args.micro_batches + 1):
            build_problem(spec, hw, Config(n, mb, 1, n, "bf16", "adamw", "zero3"), choices, (False, True))
        best = min(best, time.perf_counter() - t)
        print(f"pass {rep + 1}/3: {time.perf_counter() - t:.3f} s", flush=True)
    print(f"build_problem {args.model} on {args.hw}, {len(choices)} choices per group, micro-batches "
          f"1-{args.micro_batches}: {best:.3f} s best of 3 ({best / args.micro_batches * 1e3:.2f} ms each)")


if __name__ == "__main__":
    main()
