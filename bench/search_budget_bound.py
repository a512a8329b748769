"""What-if, not kept in the search: a memory-indexed time-to-go in place of the key graph's
Lagrangian one (docs/benchmarks.md, "A memory-indexed time-to-go").

For mingpt-48l-1536 on titan8 at 8 GiB (every split, root zero2, the micro-batch given), it
builds the key graph, then B[decision][key, floor(budget / q)]: the least time-to-go of a
completion whose memory (each stage's S_N in buckets of q = the limit / (buckets - 1), rounded
down, so the bound stays a lower bound) fits the budget left. It prints the bound at the first
decision and the exact search's nodes (through Engine.run's thr_fn path) without and with it.

    python bench/search_budget_bound.py [micro-batch, default 7] [buckets, default 1024]   # 2-4 min
"""

import math
import sys
import time

import numpy as np
import numba
from osdp_sim.costmodel.fast import TIME_Q, Config
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.bnb import _limit_q
from osdp_sim.planner import dp as dpm
from osdp_sim.planner.dp import Engine
from osdp_sim.planner.labels import DT, OPT, S_N, U, T
from osdp_sim.planner.problem import build_problem
from osdp_sim.planner.space import SearchSpace, group_choices

NB = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
mb = int(sys.argv[1]) if len(sys.argv) > 1 else 7
BEST = 24.35

@numba.njit(cache=True)
def budget_back(ds, rows, starts, m, q, B_next, nb):
    nk = starts.shape[0] - 1
    B = np.full((nk + 1, nb), np.inf)
    for r in range(nk):
        for e in range(starts[r], starts[r + 1]):
            nx = rows[e]
            tau = float(m * ds[e, DT] + ds[e, OPT])
            w = int(math.floor(float(ds[e, S_N]) / q))
            if w < 0:
                w = 0
            for j in range(w, nb):
                h = tau + B_next[nx, j - w]
                if h < B[r, j]:
                    B[r, j] = h
    return B

hw = load_profile("titan8")
spec = build_spec(BUILTIN["mingpt-48l-1536"])
cfg = Config(8, mb, 1, 8, "bf16", "adamw", "zero2")
pb = build_problem(spec, hw, cfg, group_choices(SearchSpace()), (False, True))
eng = Engine(pb)
pq = _limit_q(8 * 2**30, hw)
thr = pb.samples / BEST / TIME_Q
t0 = time.perf_counter()
print(eng.build_graph(pq, thr), "graph", time.perf_counter() - t0, eng.graph.size, eng.graph.view is not None)
G = eng.graph
n = len(eng.positions)
q = pq / (NB - 1)
t0 = time.perf_counter()
Bs = [None] * (n + 1)
Bs[n] = np.vstack([np.zeros((len(G.levels[n]), NB)), np.full((1, NB), np.inf)])
for g in range(n - 1, -1, -1):
    if len(G.levels[g]) == 0:
        Bs[g] = np.full((1, NB), np.inf); continue
    D, NKT, _c = eng.tables(G.levels[g], g)
    entries = NKT.shape[1]
    starts = np.arange(0, len(NKT) * entries + 1, entries, dtype=np.int64)
    ds = np.ascontiguousarray(D.reshape(-1, D.shape[-1]))
    rws = G.rows_of(g + 1, NKT.reshape(-1)).astype(np.int64)
    Bs[g] = budget_back(ds, rws, starts, int(pb.m), q, Bs[g + 1], NB)
print("budget table", time.perf_counter() - t0, "s", sum(b.nbytes for b in Bs) / 1e6, "MB")

orig = Engine.lower_bounds
def patched(self, g, C, CK, pq_max, graph=None, CM=None):
    lb, mem = orig(self, g, C, CK, pq_max, graph, CM)
    if graph is not None and USE:
        rows = graph.rows_of(g, CK)
        bud = pq_max - (C[:, U].astype(float) - self.bounds.m_margin)
        j = np.floor(bud / q).astype(np.int64)
        okj = (j >= 0) & (j < NB)
        jj = np.clip(j, 0, NB - 1)
        b = Bs[g][rows, jj]
        b = np.where(j < 0, np.inf, b)
        b2 = np.where(okj | (j < 0), C[:, T] + b - self.bounds.t_margin, -np.inf)
        lb = np.maximum(lb, b2)
    return lb, mem
Engine.lower_bounds = patched
L, K = eng.start()
for USE in (False, True):
    lb, mem = eng.lower_bounds(0, L, K, pq, G, K)
    print("USE", USE, "start bound sps", pb.samples / (lb[0] * TIME_Q))
    t0 = time.perf_counter()
    r = eng.run(pq_max=pq, thr_q=thr, thr_fn=lambda m_: thr)
    print("USE", USE, "nodes", r.stats.nodes, "finished", len(r.finished), "s", time.perf_counter() - t0, flush=True)
