"""Where one search's time goes, by phase of the outer loop (planner/bnb.py, docs/search.md "The
algorithm"): each phase's method is wrapped with a timer, and the inner searches (dp.Engine.run)
are split into probes, beams and exact searches. The nested search without splits (part of the
incumbent) is counted apart. Phases nest (a probe runs inside probe_or_graph), so the rows do not
add up to the total.

    python bench/search_phases.py                           # mingpt-48l-1536, about 10 s
    python bench/search_phases.py --model mingpt-48l-2048

Instance: titan8, 8 GiB, every split with checkpointing, every micro-batch (as search_bench.py's
--targets).
"""

import argparse
import collections
import sys
import time

from osdp_sim.cli.common import positive_float, run_script

GiB = 2**30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mingpt-48l-1536")
    ap.add_argument("--mem-limit-gib", type=positive_float, default=8.0)
    args = ap.parse_args()
    import osdp_sim.planner.bnb as bnb
    import osdp_sim.planner.dp as dp
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.model.load import load_model
    from osdp_sim.planner.space import SearchSpace
    spec, hw = load_model(args.model), load_profile("titan8")
    seconds, calls = collections.defaultdict(float), collections.Counter()
    depth = [0]

    def timed(owner, name, label_of=lambda a, k: None):
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            label = f"{'nested' if depth[0] > 1 else 'outer'} {label_of(a, k) or name}"
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[label] += time.perf_counter() - t
                calls[label] += 1
        setattr(owner, name, wrapper)

    for name in ("uniform_plans", "refine_bounds", "beams", "probe_or_graph", "exact_searches"):
        timed(bnb._Search, name)
    timed(bnb._Lister, "first_round", lambda a, k: "list configurations")
    timed(dp.Engine, "build_graph", lambda a, k: "key graphs")
    timed(dp.Engine, "run", lambda a, k: "run: beam" if k.get("beam") else
          "run: probe" if k.get("max_nodes") else "run: exact")
    search = bnb.search

    def counted(*a, **k):
        depth[0] += 1
        try:
            return search(*a, **k)
        finally:
            depth[0] -= 1
    bnb.search = counted
    t = time.perf_counter()
    r = bnb.search(spec, hw, args.mem_limit_gib * GiB, SearchSpace(), time_limit_s=120)
    total = time.perf_counter() - t
    print(f"{args.model}, titan8, {args.mem_limit_gib:g} GiB: {r.status} in {total:.2f} s, {r.nodes} nodes")
    for label, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {label:32s} {s:6.2f} s  ({calls[label]} calls)")


if __name__ == "__main__":
    sys.exit(run_script(main))
