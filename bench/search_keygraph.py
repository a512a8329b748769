"""The key graph of one search configuration (osdp_sim/planner/keygraph.py): its size and cost, the
configuration bound with and without it, and optionally the exact search on it. Reproduces the
figures docs/benchmarks.md quotes for the key graph.

    python bench/search_keygraph.py --micro-batch 7 --exact          # about 20 s
    python bench/search_keygraph.py --micro-batch 6                  # about 30 s: rules it out
    python bench/search_keygraph.py --micro-batch 5 --max-keys 100000 --max-stages 10000000   # ~3 min

(--max-keys and --max-stages are osdp-sim search's --graph-max-keys and --graph-max-sims.)
"""

import argparse
import sys
import time

import osdp_sim.planner.keygraph as keygraph
from osdp_sim.cli.common import positive_float, positive_int, run_script
from osdp_sim.costmodel.fast import TIME_Q
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.planner.bnb import TUNING, _configs, _limit_q
from osdp_sim.planner.dp import Engine
from osdp_sim.planner.space import SearchSpace


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mingpt-48l-1536")
    ap.add_argument("--hw", default="titan8")
    ap.add_argument("--mem-limit-gib", type=positive_float, default=8.0)
    ap.add_argument("--micro-batch", type=positive_int, default=7)
    ap.add_argument("--root", default="zero3")
    ap.add_argument("--incumbent", type=positive_float, default=23.82,
                    help="samples/s of the best plan known (the graph drops what cannot beat it); "
                         "23.82 is what the search has before its graphs on the default instance")
    ap.add_argument("--max-keys", type=positive_int, default=keygraph.GraphCaps.max_level_keys)
    ap.add_argument("--max-stages", type=positive_int, default=keygraph.GraphCaps.max_stage_sims)
    ap.add_argument("--exact", action="store_true", help="then the exact search of the configuration")
    args = ap.parse_args()
    spec, hw = load_model(args.model), load_profile(args.hw)
    pq = _limit_q(args.mem_limit_gib * 2**30, hw)
    (c,) = [c for c in _configs(spec, hw, SearchSpace(micro_batches=(args.micro_batch,), root_strategies=(args.root,)), pq, {})]
    samples = c.problem.samples
    sps = lambda q: samples / (q * TIME_Q) if q < float("inf") else 0.0      # noqa: E731
    eng = Engine(c.problem)
    thr = samples / args.incumbent / TIME_Q
    print(f"{args.model}, micro-batch {args.micro_batch}, root {args.root}, {args.mem_limit_gib:g} GiB, "
          f"incumbent {args.incumbent}")
    L, K = eng.start()
    print(f"  relaxed bound: first decision {sps(eng.lower_bounds(0, L, K, pq)[0][0]):.3f}, "
          f"last block decided {sps(eng.frontier_bound(TUNING.refine_depth, pq_max=pq, thr_q=thr)[0]):.3f} samples/s")
    t = time.perf_counter()
    try:
        g = keygraph.KeyGraph(eng, keygraph.lambda_grid(eng.bounds.j_lam), pq, thr,
                              caps=keygraph.GraphCaps(args.max_keys, args.max_stages))
    except keygraph.TooLarge:
        print(f"  key graph abandoned after {time.perf_counter() - t:.1f} s, {eng.stage_sims} stage simulations "
              f"(--max-keys {args.max_keys}, --max-stages {args.max_stages})")
        return
    eng.graph = g
    print(f"  key graph: {g.size} nodes, at most {max(len(x) for x in g.levels)} keys per level, "
          f"{eng.stage_sims} stage simulations, {time.perf_counter() - t:.1f} s")
    print(f"  with the graph: first decision {sps(eng.lower_bounds(0, L, K, pq, graph=g)[0][0]):.3f}, "
          f"last block decided {sps(eng.frontier_bound(TUNING.refine_depth, pq_max=pq, thr_q=thr)[0]):.3f} samples/s")
    r = eng.run(pq_max=pq, thr_q=thr, beam=TUNING.beam)
    best = max((samples / (f.t_q * TIME_Q) for f in r.finished), default=0.0)
    print(f"  beam ({TUNING.beam} labels per decision) on the graph: {best:.3f} samples/s")
    if args.exact:
        inc = max(best, args.incumbent)
        r = eng.run(pq_max=pq, thr_q=samples / inc / TIME_Q)
        opt = max((samples / (f.t_q * TIME_Q) for f in r.finished), default=None)
        print(f"  exact search on the graph: {r.stats.nodes} labels, {r.seconds:.1f} s; optimum "
              + (f"{opt:.3f} samples/s" if opt else f"no plan faster than {inc:.3f} (so {inc:.3f} is optimal)"))


if __name__ == "__main__":
    sys.exit(run_script(main))
