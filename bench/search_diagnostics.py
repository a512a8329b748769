"""Why the exact search is slow on the 28-choice space (docs/benchmarks.md, "Search: history of
what was tried"): keys, labels and labels per key along the inner search of one configuration,
and the bound's per-block price of every uniform checkpointed choice against its real per-block time.

    python bench/search_diagnostics.py [--decisions 12] [--seconds 25]

Instance: mingpt-48l-1536 on titan8, 8 GiB, micro-batch 7, root zero2, incumbent 23.82 samples/s.
"""

import argparse
import sys
import time

import numpy as np

from osdp_sim.cli.common import positive_float, positive_int, run_script
from osdp_sim.costmodel.fast import TIME_Q, Config, fast_estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.bnb import _limit_q
from osdp_sim.planner.dp import Engine
from osdp_sim.planner.keystore import CkMlpDone, DeferredMlp
from osdp_sim.planner.problem import build_problem
from osdp_sim.planner.space import SearchSpace, group_choices

INCUMBENT_SPS = 23.82


def _base_key(eng: Engine, key: tuple) -> tuple:
    """The key without the work left of the reduction at the head of the queue."""
    if isinstance(key, CkMlpDone):
        return ("ckmlp done", _base_key(eng, eng.keys[key.key_id]))
    if isinstance(key, DeferredMlp):
        return ("deferred", _base_key(eng, eng.keys[key.key_id]), key.choice)
    pend, queue = key
    if queue:
        queue = ((None,) + tuple(queue[0][1:]),) + tuple(queue[1:])
    return pend, queue


def label_growth(pb, hw, decisions: int, seconds: float) -> None:
    eng = Engine(pb)
    expand = eng._expand
    deadline = time.perf_counter() + seconds

    def counted(g, L, K, *a, **kw):
        out = expand(g, L, K, *a, **kw)
        keys = np.unique(out[1])
        base = {_base_key(eng, eng.keys[int(k)]) for k in keys}
        print(f"  decision {g:3d}: {len(out[0]):8d} labels on {len(keys):5d} keys "
              f"({len(base):5d} without the reduction residual), {len(out[0]) / max(len(keys), 1):6.1f} per key",
              flush=True)
        if g + 1 >= decisions:
            raise TimeoutError
        return out

    eng._expand = counted
    try:
        eng.run(pq_max=_limit_q(8 * 2**30, hw), thr_q=pb.samples / INCUMBENT_SPS / TIME_Q, deadline=deadline)
    except TimeoutError:
        pass


def choice_slack(spec48, hw, cfg, choices) -> None:
    specs = {48: spec48, 49: build_spec(with_overrides(spec48.config, n_layers=49))}
    pbs = {n: build_problem(specs[n], hw, cfg, choices, (False, True)) for n in specs}
    bnd = Engine(pbs[48]).bounds
    b = pbs[48].blocks[20]
    ta, tm = bnd.terms[b.attn_shape], bnd.terms[b.mlp_shape]
    print("  choice (every block, checkpointed)              real ms   bound ms (below: no re-gather / re-gather)")
    for i, c in enumerate(choices):
        if not (ta.z3[i] or tm.z3[i]):
            continue                                 # the re-gathering choices: priced with cke
        t = {n: fast_estimate(specs[n], hw, pbs[n].plan([i] * len(pbs[n].blocks), [i] * len(pbs[n].blocks),
                                                         [True] * len(pbs[n].blocks))).iteration_time_s
             for n in specs}
        real = (t[49] - t[48]) * 1e3
        free = (ta.cke[:, i] + tm.cke[:, i]).max() * TIME_Q * 1e3
        ex = (ta.cke[:, i] + ta.ex[:, i] + tm.cke[:, i]).max() * TIME_Q * 1e3
        name = f"{c.strategy} {c.sharded_slices}/{c.slices}" if c.is_split else c.strategy
        print(f"  {name:45s} {real:8.2f}   {free:7.2f} ({(real - free) / real:5.1%})   "
              f"{ex:7.2f} ({(real - ex) / real:5.1%})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=positive_int, default=12)
    ap.add_argument("--seconds", type=positive_float, default=25.0)
    args = ap.parse_args()
    hw = load_profile("titan8")
    spec = build_spec(BUILTIN["mingpt-48l-1536"])
    cfg = Config(8, 7, 1, 8, "bf16", "adamw", "zero2")
    choices = group_choices(SearchSpace())
    print("mingpt-48l-1536, titan8, 8 GiB, micro-batch 7, root zero2, 28 choices per group:")
    label_growth(build_problem(spec, hw, cfg, choices, (False, True)), hw, args.decisions, args.seconds)
    print("per-block time of uniform checkpointed plans (49 minus 48 layers) vs the bound's price:")
    choice_slack(spec, hw, cfg, choices)


if __name__ == "__main__":
    sys.exit(run_script(main))
