"""Does a stage's time depend on the queued communication only through its total work? Evidence
for the next step of the key graph (docs/search.md, "What would go further"): if it does, keys
could be merged by (pending step, total queued work rounded down) for the time part of the bound.

For random partial plans of one configuration it replaces the key's queue by one started item of
the same total work (or of a random smaller one), completes both keys with the same random
decisions, and compares the total schedule time; then it counts how many keys of the
configuration's key graph remain when keys are merged that way, for a few rounding grids.

    python bench/search_queue_work.py --micro-batch 6      # about 40 s
"""

import argparse
import math
import random

from osdp_sim.costmodel.fast import TIME_Q
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.search.bnb import _configs, _limit_q
from osdp_sim.search.dp import Engine
from osdp_sim.search.space import SearchSpace


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
        if key[0] in ("C", "D") or len(key[1]) < 2:
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
    ap.add_argument("--micro-batch", type=int, default=6)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--incumbent", type=float, default=23.82,
                    help="samples/s the graph must beat (23.82: what the search has on mingpt-48l-1536 before its graphs)")
    args = ap.parse_args()
    spec, hw = load_model(args.model), load_profile("titan8")
    pq = _limit_q(8 * 2**30, hw)
    (c,) = _configs(spec, hw, SearchSpace(micro_batches=(args.micro_batch,), root_strategies=("zero2",)), pq, {})
    print(f"{args.model}, micro-batch {args.micro_batch}, root zero2, titan8, 8 GiB")
    rng = random.Random(0)
    print(compare_paths(Engine(c.problem), rng, args.trials, smaller=False))
    print(compare_paths(Engine(c.problem), rng, args.trials, smaller=True))
    eng = Engine(c.problem)
    print(f"  key graph: {eng.build_graph(pq, c.problem.samples / args.incumbent / TIME_Q)}")
    if eng.graph is None:
        return

    def merged(kid: int, grid_s: float):
        key, tag = eng.keys[kid], ()
        if key[0] in ("C", "D"):
            tag, key = key[:1] + key[2:], eng.keys[key[1]]
        pend, queue = key
        work = sum(q[0] for q in queue)
        return tag + (pend, work if grid_s == 0 else math.floor(work / grid_s))
    levels = eng.graph.levels
    print(f"  real keys: at most {max(len(x) for x in levels)} per level, {eng.graph.size} in all")
    for grid_s in (0.0, 1e-5, 1e-4, 1e-3):
        sets = [{merged(int(k), grid_s) for k in lvl} for lvl in levels]
        print(f"  merged by (pending, total work{'' if grid_s == 0 else f' // {grid_s:g} s'}): "
              f"at most {max(len(x) for x in sets)} per level, {sum(len(x) for x in sets)} in all")


if __name__ == "__main__":
    main()
