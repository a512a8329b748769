"""Does a stage's time depend on the queued communication only through its total work? The
evidence behind the merged key graph (planner/merged.py, docs/search.md "The merged key graph"),
which merges keys by (pending step, total queued work rounded down) for the time part of the bound.

For random partial plans of one configuration it replaces the key's queue by one started item of
the same total work (or of a random smaller one), completes both keys with the same random
decisions, and compares the total schedule time; then it counts how many keys of the
configuration's key graph remain when keys are merged that way, for a few rounding grids. With
--abstract-graph it builds that merged graph (planner/merged.py: keys of pending step and total
queued work rounded down; memory known only through the sums of resident + kept bytes S, the one
part of a label that does not depend on the queue) and prints its bound at the start, against
the incumbent and the real-key graph's.

    python bench/search_queue_work.py --micro-batch 6      # about 40 s
    python bench/search_queue_work.py --model gpt2-1.5b --micro-batch 6 --incumbent 21.9 --abstract-graph 0,1e-4,1e-3
"""

import argparse
import random
import sys
import time

import numpy as np

import osdp_sim.planner.keygraph as keygraph
from osdp_sim.cli.common import float_list, positive_float, positive_int, run_script
from osdp_sim.costmodel.fast import TIME_Q
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.planner.bnb import _configs, _limit_q
from osdp_sim.planner.dp import Engine
from osdp_sim.planner.keystore import CkMlpDone, DeferredMlp
from osdp_sim.planner.merged import MergedView
from osdp_sim.planner.space import SearchSpace


def compare_paths(eng: Engine, rng: random.Random, trials: int, smaller: bool) -> str:
    n = len(eng.positions)
    codes = lambda g, kid: [int(x) for x in eng.table(kid, g)[0]]      # noqa: E731
    tests = differ = above = 0
    worst = 0.0
    sizes = []
    for _ in range(trials):
        _l, K = eng.start()
        kid = int(K[0])
        g0 = rng.randrange(2, n - 4)
        for g in range(g0):
            kid, _d = eng._stage(kid, g, rng.choice(codes(g, kid)))
        key = eng.keys[kid]
        if isinstance(key, (CkMlpDone, DeferredMlp)) or len(key[1]) < 2:
            continue
        pend, queue = key
        sizes.append(len(queue))
        work = sum(q[0] for q in queue) * (rng.random() if smaller else 1.0)
        kc = eng.intern((pend, ((work, 0.0, 0.0, 0.0, work, True),)))
        t_real = t_one = 0
        for g in range(g0, n):
            cd = rng.choice(codes(g, kid))
            kid, d_real = eng._stage(kid, g, cd)
            kc, d_one = eng._stage(kc, g, cd)
            t_real += d_real[0]
            t_one += d_one[0]
        tests += 1
        if t_one != t_real:
            differ += 1
            worst = max(worst, abs(t_one - t_real) / t_real)
        above += t_one > t_real + 64            # beyond fixed-point rounding
    what = "a random smaller total" if smaller else "the same total work"
    return (f"  queue ({min(sizes)}-{max(sizes)} items) -> one item of {what}: {tests} random completions, "
            f"time differs on {differ} "
            f"(largest {worst:.2e} relative), above the real time on {above}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mingpt-48l-1536")
    ap.add_argument("--micro-batch", type=positive_int, default=6)
    ap.add_argument("--trials", type=positive_int, default=300)
    ap.add_argument("--abstract-graph", metavar="GRIDS", type=float_list, default=(),
                    help="also build the merged graph for these rounding grids in seconds (comma-separated; 0: exact total work)")
    ap.add_argument("--incumbent", type=positive_float, default=23.82,
                    help="samples/s the graph must beat (23.82: what the search has on mingpt-48l-1536 before its graphs)")
    args = ap.parse_args()
    spec, hw = load_model(args.model), load_profile("titan8")
    pq = _limit_q(8 * 2**30, hw)
    (c,) = _configs(spec, hw, SearchSpace(micro_batches=(args.micro_batch,), root_strategies=("zero2",)), pq, {})
    print(f"{args.model}, micro-batch {args.micro_batch}, root zero2, titan8, 8 GiB")
    rng = random.Random(0)
    print(compare_paths(Engine(c.problem), rng, args.trials, smaller=False))
    print(compare_paths(Engine(c.problem), rng, args.trials, smaller=True))
    thr = c.problem.samples / args.incumbent / TIME_Q
    for grid_s in args.abstract_graph:
        eng = Engine(c.problem)
        view = MergedView(eng, grid_s)
        t = time.perf_counter()
        g = keygraph.KeyGraph(view, keygraph.lambda_grid(eng.bounds.j_lam), pq, thr,
                              caps=keygraph.GraphCaps(100_000, 10_000_000))
        L, K = eng.start()
        lb = eng.lower_bounds(0, L, K, pq, graph=g, CM=K)[0][0]        # the start is its own merge
        bound = c.problem.samples / (lb * TIME_Q) if np.isfinite(lb) else 0.0
        print(f"  merged graph, total work // {grid_s:g} s: {g.size} nodes, at most "
              f"{max(len(x) for x in g.levels)} per level, {eng.stage_sims} stage simulations, "
              f"{time.perf_counter() - t:.1f} s; bound at the start {bound:.3f} samples/s "
              f"(incumbent {args.incumbent})", flush=True)
    eng = Engine(c.problem)
    t = time.perf_counter()
    built = eng.build_graph(pq, thr, merged_ok=False)
    print(f"  key graph over real keys: {built}, {time.perf_counter() - t:.1f} s")
    if eng.graph is None:
        return
    L, K = eng.start()
    lb = eng.lower_bounds(0, L, K, pq, graph=eng.graph)[0][0]
    print(f"  its bound at the start: {c.problem.samples / (lb * TIME_Q) if np.isfinite(lb) else 0.0:.3f} samples/s")

    levels = eng.graph.levels
    print(f"  real keys: at most {max(len(x) for x in levels)} per level, {eng.graph.size} in all")
    for grid_s in (0.0, 1e-5, 1e-4, 1e-3):
        view = MergedView(eng, grid_s)
        sets = [{view.merge(int(k)) for k in lvl} for lvl in levels]
        print(f"  merged by (pending, total work{'' if grid_s == 0 else f' // {grid_s:g} s'}): "
              f"at most {max(len(x) for x in sets)} per level, {sum(len(x) for x in sets)} in all")


if __name__ == "__main__":
    sys.exit(run_script(main))
