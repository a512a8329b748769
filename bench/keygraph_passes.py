"""The key graph's own passes (osdp_sim/planner/keygraph.py: the forward pass over the levels and
the backward pass of H and M), timed apart from the stage simulations they need: the graph is
built once (its tables then held by the engine), then built again `--reps` times, and the median
of those rebuilds is its passes' time. With --base, the same in a clone of that commit, in
alternating rounds in this run, and the ratio.

    python bench/keygraph_passes.py                       # mingpt-48l-1536, micro-batch 6, about 30 s
    python bench/keygraph_passes.py --base b60ad23~1      # and against the commit before (about 1 min)
    python bench/keygraph_passes.py --model mingpt-48l-2048 --micro-batch 4 --incumbent 10.12 --caps-factor 10

Instance: titan8, 8 GiB, root zero2, every split, the threshold of the incumbent the search has
when it builds this graph (24.35 samples/s at micro-batch 6 on mingpt-48l-1536).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from readme_command import fresh_clone, tree_env

from osdp_sim.cli.common import positive_float, positive_int, run_script
from osdp_sim.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def measure(model: str, micro_batch: int, root: str, incumbent: float, reps: int, caps_factor: int = 1) -> dict:
    import osdp_sim.planner.keygraph as keygraph
    from osdp_sim.costmodel.fast import TIME_Q
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.model.load import load_model
    from osdp_sim.planner.bnb import _configs, _limit_q
    from osdp_sim.planner.dp import Engine
    from osdp_sim.planner.space import SearchSpace
    spec, hw = load_model(model), load_profile("titan8")
    pq = _limit_q(8 * 2**30, hw)
    space = SearchSpace(micro_batches=(micro_batch,), root_strategies=(root,))
    (c,) = list(_configs(spec, hw, space, pq, {}))
    eng = Engine(c.problem)
    thr = c.problem.samples / incumbent / TIME_Q
    lams = keygraph.lambda_grid(eng.bounds.j_lam)
    caps = keygraph.GraphCaps().scaled(caps_factor)
    t = time.perf_counter()
    try:
        g = keygraph.KeyGraph(eng, lams, pq, thr, caps=caps)
    except keygraph.TooLarge:
        raise UserError(f"the key graph passes its caps ({caps.max_level_keys} keys on a level or "
                        f"{caps.max_stage_sims} stage simulations); a larger --caps-factor builds it",
                        field="--caps-factor") from None
    first = time.perf_counter() - t
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        keygraph.KeyGraph(eng, lams, pq, thr, caps=caps)
        times.append(time.perf_counter() - t)
    return {"nodes": g.size, "first_s": first, "passes_s": statistics.median(times)}


def _run(tree: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--json", "--model", args.model, "--micro-batch", str(args.micro_batch),
           "--root", args.root, "--incumbent", str(args.incumbent), "--reps", str(args.reps),
           "--caps-factor", str(args.caps_factor)]
    out = subprocess.run(cmd, env=tree_env(tree), capture_output=True, text=True, timeout=600)
    if out.returncode != 0:              # the child's one-line error (run_script), or its last line
        last = (out.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(last.split(": error: ", 1)[-1] + ("" if tree == ROOT else f" (in the clone of {args.base})"))
    return json.loads(out.stdout.splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mingpt-48l-1536")
    ap.add_argument("--micro-batch", type=positive_int, default=6)
    ap.add_argument("--root", default="zero2")
    ap.add_argument("--incumbent", type=positive_float, default=24.35)
    ap.add_argument("--reps", type=positive_int, default=5)
    ap.add_argument("--caps-factor", type=positive_int, default=1,
                    help="GraphCaps scaled by this (10: the search's second try, mingpt-48l-2048 micro-batch 4)")
    ap.add_argument("--rounds", type=positive_int, default=2, help="alternating rounds with --base")
    ap.add_argument("--base", help="a commit to compare against, run from a clone of it")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(measure(args.model, args.micro_batch, args.root, args.incumbent, args.reps, args.caps_factor)))
        return
    if not args.base:
        head = _run(ROOT, args)
        print(f"{args.model} micro-batch {args.micro_batch}: key graph of {head['nodes']} nodes, first build "
              f"{head['first_s']:.2f} s, its passes {head['passes_s']:.3f} s (median of {args.reps})")
        return
    with tempfile.TemporaryDirectory() as d:
        base_tree = fresh_clone(args.base, Path(d))
        head = _run(ROOT, args)                # each tree's compile (cached beside it), not timed
        _run(base_tree, args)
        base_s, head_s = [], []
        for r in range(args.rounds):
            b, h = _run(base_tree, args), _run(ROOT, args)
            base_s.append(b["passes_s"])
            head_s.append(h["passes_s"])
            nodes = f"{h['nodes']} nodes" if b["nodes"] == h["nodes"] else \
                f"{b['nodes']} nodes there, {h['nodes']} here: other graphs, the ratio compares unlike work"
            print(f"round {r + 1}: {args.base} {b['passes_s']:.3f} s, this tree {h['passes_s']:.3f} s ({nodes})",
                  flush=True)
        mb, mh = statistics.median(base_s), statistics.median(head_s)
        print(f"{args.model} micro-batch {args.micro_batch}, key graph of {head['nodes']} nodes: passes "
              f"{mb:.3f} s -> {mh:.3f} s, {mb / mh:.2f}x")


if __name__ == "__main__":
    sys.exit(run_script(main))
