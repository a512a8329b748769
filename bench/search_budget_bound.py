"""What-if, not kept in the search: a memory-indexed time-to-go in place of the key graph's
Lagrangian one (docs/benchmarks.md, "A memory-indexed time-to-go").

For mingpt-48l-1536 on titan8 at 8 GiB (every split, root zero2, the micro-batch given), it
builds the key graph, then B[decision][key, floor(budget / q)]: the least time-to-go of a
completion whose memory (each stage's S_N in buckets of q = the limit / (buckets - 1), rounded
down, so the bound stays a lower bound) fits the budget left. It prints the bound at the first
decision and the exact search's nodes (through Engine.run's thr_fn path) without and with it.

    python bench/search_budget_bound.py [--micro-batch 7] [--buckets 1024] [--time-limit 600]   # 3-4 min

--incumbent (default 24.35 samples/s, the optimum `osdp-sim search` proves on this instance,
README) is the threshold both searches must beat; --time-limit bounds the whole run (graph,
table and both searches): what the limit cuts short is printed as not finished.
"""

import argparse
import math
import sys
import time

import numpy as np

from osdp_sim.cli.common import positive_float, positive_int, run_script
from osdp_sim.costmodel.fast import TIME_Q, Config
from osdp_sim.hardware.load import load_profile
from osdp_sim.jit import compiled
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.bnb import _limit_q
from osdp_sim.planner.dp import Engine
from osdp_sim.planner.keygraph import Timeout
from osdp_sim.planner.labels import DT, OPT, S_N, T, U
from osdp_sim.planner.problem import build_problem
from osdp_sim.planner.space import SearchSpace, group_choices


@compiled
def budget_back(ds, rows, starts, m, q, B_next, nb):
    """One decision of the backward DP: B[r, j] = min over key r's entries e of
    m dt_e + opt_e + B_next[next key of e, j - bucket(S_N of e)]."""
    nk = starts.shape[0] - 1
    B = np.full((nk + 1, nb), np.inf)
    for r in range(nk):
        for e in range(starts[r], starts[r + 1]):
            nx = rows[e]
            tau = float(m * ds[e, DT] + ds[e, OPT])
            w = max(int(math.floor(float(ds[e, S_N]) / q)), 0)
            for j in range(w, nb):
                h = tau + B_next[nx, j - w]
                if h < B[r, j]:
                    B[r, j] = h
    return B


def budget_tables(eng: Engine, q: float, nb: int, deadline: float) -> list:
    """B per decision over the engine's key graph (one row per graph key, a last row of inf)."""
    G = eng.graph
    n = len(eng.positions)
    Bs = [None] * (n + 1)
    Bs[n] = np.vstack([np.zeros((len(G.levels[n]), nb)), np.full((1, nb), np.inf)])
    for g in range(n - 1, -1, -1):
        if time.perf_counter() > deadline:
            raise Timeout
        if len(G.levels[g]) == 0:
            Bs[g] = np.full((1, nb), np.inf)
            continue
        D, NKT, _codes = eng.tables(G.levels[g], g)
        starts = np.arange(0, NKT.size + 1, NKT.shape[1], dtype=np.int64)
        ds = np.ascontiguousarray(D.reshape(-1, D.shape[-1]))
        Bs[g] = budget_back(ds, G.rows_of(g + 1, NKT.reshape(-1)).astype(np.int64), starts, int(eng.pb.m), q,
                            Bs[g + 1], nb)
    return Bs


def with_budget_bound(eng: Engine, Bs: list, q: float, nb: int) -> None:
    """Raise the engine's time lower bound to t + B[decision][key, bucket of the budget left]."""
    plain = eng.lower_bounds

    def lower_bounds(g, C, CK, pq_max, graph=None, CM=None):
        lb, mem = plain(g, C, CK, pq_max, graph, CM)
        if graph is None:
            return lb, mem
        j = np.floor((pq_max - (C[:, U].astype(float) - eng.bounds.m_margin)) / q).astype(np.int64)
        b = np.where(j < 0, np.inf, Bs[g][graph.rows_of(g, CK), np.clip(j, 0, nb - 1)])
        return np.maximum(lb, np.where(j < nb, C[:, T] + b - eng.bounds.t_margin, -np.inf)), mem

    eng.lower_bounds = lower_bounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro-batch", type=positive_int, default=7)
    ap.add_argument("--buckets", type=positive_int, default=1024, help="memory buckets of the table (>= 2)")
    ap.add_argument("--incumbent", type=positive_float, default=24.35, help="samples/s both searches must beat")
    ap.add_argument("--time-limit", type=positive_float, default=600.0, help="seconds for the whole run")
    args = ap.parse_args()
    if args.buckets < 2:
        ap.error("--buckets: expected at least 2")
    deadline = time.perf_counter() + args.time_limit
    nb = args.buckets
    hw = load_profile("titan8")
    spec = build_spec(BUILTIN["mingpt-48l-1536"])
    pb = build_problem(spec, hw, Config(8, args.micro_batch, 1, 8, "bf16", "adamw", "zero2"),
                       group_choices(SearchSpace()), (False, True))
    eng = Engine(pb)
    pq = _limit_q(8 * 2**30, hw)
    thr = pb.samples / args.incumbent / TIME_Q
    t0 = time.perf_counter()
    built = eng.build_graph(pq, thr, deadline)
    print(f"key graph: {built} in {time.perf_counter() - t0:.2f} s"
          + (f", {eng.graph.size} nodes{' (merged keys)' if eng.graph.view is not None else ''}"
             if built == "built" else ""), flush=True)
    if built != "built":
        return
    q = pq / (nb - 1)
    t0 = time.perf_counter()
    try:
        Bs = budget_tables(eng, q, nb, deadline)
    except Timeout:
        print(f"budget table: not finished within --time-limit {args.time_limit:g} s", flush=True)
        return
    print(f"budget table: {time.perf_counter() - t0:.2f} s, {sum(b.nbytes for b in Bs) / 1e6:.1f} MB", flush=True)
    L, K = eng.start()
    for label in ("without", "with"):
        if label == "with":
            with_budget_bound(eng, Bs, q, nb)
        lb, _mem = eng.lower_bounds(0, L, K, pq, eng.graph, K)
        print(f"{label} the budget bound: bound at the first decision {pb.samples / (lb[0] * TIME_Q):.4f} samples/s",
              flush=True)
        t0 = time.perf_counter()
        r = eng.run(pq_max=pq, thr_q=thr, thr_fn=lambda mem_lb: np.full(len(mem_lb), thr), deadline=deadline)
        print(f"{label} the budget bound: {r.stats.nodes} nodes, {len(r.finished)} plans, "
              f"{'finished' if r.complete else 'not finished (time limit)'} in {time.perf_counter() - t0:.2f} s",
              flush=True)


if __name__ == "__main__":
    sys.exit(run_script(main))
