"""One digest per search, for changes that must not change what the search returns: run it
before and after (e.g. the base commit from a `git worktree`) and compare the lines.

    python bench/search_digest.py            # about 25 s on a 2-core machine
    python bench/search_digest.py --big      # mingpt-48l-1536 with every split, no time limit (about 1 min)

A digest hashes a search's status, nodes, leaves, best bound, prediction and plan (top 3: every
plan kept), or a front's points; the "result" digest beside it leaves out the nodes and leaves (for
changes that prune differently but must return the same); the times printed are not hashed."""

import argparse
import hashlib
import time

from osdp_sim.api import load_model
from osdp_sim.hardware.load import load_profile
from osdp_sim.planner.bnb import pareto_front, search
from osdp_sim.planner.space import SearchSpace

GiB = 2**30


def _plan_text(plan) -> str:
    return f"{plan.micro_batch} {sorted((k, str(v)) for k, v in plan.choices.items())} {plan.checkpoint}"


def digest(r, counts: bool = True) -> str:
    text = (f"{r.status} {r.best_bound_samples_per_s!r} {r.prediction.samples_per_s!r} "
            f"{_plan_text(r.plan)} {[(_plan_text(t.plan), t.prediction.samples_per_s) for t in r.top]}")
    if counts:
        text = f"{r.status} {r.nodes} {r.leaves} " + text[len(r.status) + 1:]
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="mingpt-48l-1536 with every split instead")
    args = ap.parse_args()
    hw = load_profile("hwprofiles/titan8.yaml")
    cases = [("gpt2-1.5b", 8, SearchSpace(), 1), ("mingpt-48l-1536", 8, SearchSpace(splits=(1,)), 1),
             ("mingpt-48l-1536", 8, SearchSpace(splits=(1,)), 3), ("gpt2-124m", 2, SearchSpace(), 1),
             ("gpt2-124m", 2, SearchSpace(), 3), ("gpt2-350m", 4, SearchSpace(splits=(1, 2)), 1),
             ("gpt2-350m", 4, SearchSpace(splits=(1, 2)), 3)]
    if args.big:
        cases = [("mingpt-48l-1536", 8, SearchSpace(), 1)]
    for name, gib, space, top_k in cases:
        t = time.perf_counter()
        r = search(load_model(name), hw, gib * GiB, space, time_limit_s=None, top_k=top_k)
        print(f"{name} {gib} GiB splits {','.join(map(str, space.splits))} top {top_k}: {digest(r)} "
              f"(result {digest(r, counts=False)}; {r.status}, {r.nodes} nodes; "
              f"{time.perf_counter() - t:.2f} s)", flush=True)
    if not args.big:
        t = time.perf_counter()
        f = pareto_front(load_model("gpt2-124m"), hw, SearchSpace(splits=(1,), micro_batches=(1, 2, 4)),
                         time_limit_s=None)
        pts = hashlib.sha256(repr([(a, b) for a, b, _p in f.front]).encode()).hexdigest()[:16]
        print(f"gpt2-124m front, splits 1, micro-batches 1,2,4: {pts} ({len(f.front)} points, {f.nodes} nodes; "
              f"{time.perf_counter() - t:.2f} s)")


if __name__ == "__main__":
    main()
