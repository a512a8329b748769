"""Would a memory-constrained key graph bound prune the exact searches that cost the most? On one
configuration's real key graph (osdp_sim/planner/keygraph.py) this compares, at the first decision
and after the last block (its two decisions expanded with real labels, as Engine.frontier_bound
does), two lower bounds on the iteration time, printed as samples/s (larger: looser):

* `lagrangian`: what the search uses, the larger of the relaxed bound (bounds.py) and the graph's
  max over lambda of H_lambda - lambda (pq - U);
* `graph, budget`: the least time-to-go over the graph's paths whose resident + kept bytes S fit
  the label's budget pq - U, by a dynamic programme over budget buckets: S is measured above
  each level's least S and rounded down to the bucket width, the budget rounded down, so the
  result is still a lower bound of every completion that fits (U' >= U + S, keygraph.py).

If `graph, budget` were well above `lagrangian` and near the optimum, a budgeted graph would
close the configurations the exact search now spends 10-15 M labels on. It is not (docs/benchmarks.md,
"Search: history of what was tried", "A memory-budgeted key graph").

    python bench/search_graph_budget.py                       # micro-batches 6 and 7, about 15 s
    python bench/search_graph_budget.py --micro-batch 6 --buckets 4096
    python bench/search_graph_budget.py --micro-batch 6 --staircase    # the exact bound: about 3 minutes
"""

import argparse
import sys
import time

import numpy as np

import osdp_sim.planner.keygraph as keygraph
from osdp_sim.cli.common import positive_float, positive_int, run_script
from osdp_sim.costmodel.fast import TIME_Q
from osdp_sim.hardware.load import load_profile
from osdp_sim.jit import compiled
from osdp_sim.model.load import load_model
from osdp_sim.planner.bnb import _configs, _limit_q
from osdp_sim.planner.dp import Engine
from osdp_sim.planner.labels import DT, OPT, S_N, T, U, expand
from osdp_sim.planner.space import SearchSpace


@compiled
def _budget_back(tau, s_bucket, rows, h_next):
    """One level backward: H[r, b] = min over entries e of key r of tau[r, e] + h_next[rows[r, e],
    b - s_bucket[r, e]] (b >= s_bucket); a last row of inf for keys not kept."""
    nk, ne = rows.shape
    nb = h_next.shape[1]
    h = np.full((nk + 1, nb), np.inf)
    for r in range(nk):
        for e in range(ne):
            q = rows[r, e]
            sb = s_bucket[r, e]
            if q >= h_next.shape[0] - 1 or sb >= nb:
                continue
            for b in range(sb, nb):
                v = tau[r, e] + h_next[q, b - sb]
                if v < h[r, b]:
                    h[r, b] = v
    return h


@compiled
def _stair_back(tau, s, rows, nstart, ps, pt, cap):
    """One level backward, exactly: per key r, the Pareto staircase of (S above the levels' least,
    time-to-go) over its entries' successors' staircases shifted by the entry's (S, tau), points
    with S over `cap` dropped. Staircases as flat (ps, pt) with row r at nstart[r]:nstart[r + 1],
    S ascending and time descending; a last empty row for keys not kept."""
    nk, ne = rows.shape
    nn = nstart.shape[0] - 1
    starts = np.zeros(nk + 2, np.int64)
    res_s = np.empty(1 << 16)
    res_t = np.empty(1 << 16)
    tot = 0
    for r in range(nk):
        n = 0
        for e in range(ne):
            if rows[r, e] < nn:
                n += nstart[rows[r, e] + 1] - nstart[rows[r, e]]
        cs = np.empty(n)
        ct = np.empty(n)
        k = 0
        for e in range(ne):
            q = rows[r, e]
            if q >= nn:
                continue
            for i in range(nstart[q], nstart[q + 1]):
                v = ps[i] + s[r, e]
                if v <= cap:
                    cs[k] = v
                    ct[k] = pt[i] + tau[r, e]
                    k += 1
        order = np.argsort(cs[:k], kind="mergesort")
        if tot + k > res_s.shape[0]:
            m = max(2 * res_s.shape[0], tot + k)
            a = np.empty(m)
            a[:tot] = res_s[:tot]
            res_s = a
            b = np.empty(m)
            b[:tot] = res_t[:tot]
            res_t = b
        best = np.inf
        for j in range(k):
            i = order[j]
            if ct[i] < best:
                best = ct[i]
                res_s[tot] = cs[i]
                res_t[tot] = ct[i]
                tot += 1
        starts[r + 1] = tot
    starts[nk + 1] = tot
    return starts, res_s[:tot].copy(), res_t[:tot].copy()


def staircase_bounds(eng, graph, parts, s_from, pq, labels):
    """The exact memory-constrained bound (no buckets) of each (slot, labels, keys) in `labels`,
    least over the labels; S capped at pq less the least S still to come (U >= 0)."""
    n = len(parts)
    nl = len(graph.levels[n])
    nstart, ps, pt = np.r_[np.arange(nl + 1), nl].astype(np.int64), np.zeros(nl), np.zeros(nl)
    kept, t0, most = {}, time.perf_counter(), 0
    want = {g for g, _L, _K in labels}
    for g in range(n - 1, -1, -1):
        D, rows, smin = parts[g]
        tau = (eng.pb.m * D[..., DT] + D[..., OPT]).astype(np.float64)
        nstart, ps, pt = _stair_back(tau, (D[..., S_N] - smin).astype(np.float64), rows, nstart, ps, pt,
                                     float(pq - s_from[g]))
        most = max(most, int(np.diff(nstart).max()))
        if g in want:
            kept[g] = (nstart, ps, pt)
        if g % 16 == 0:
            print(f"    staircases at level {g}: {len(ps)} points, at most {most} per key so far, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    out = []
    for g, L, K in labels:
        nstart, ps, pt = kept[g]
        rows = graph.rows_of(g, K)
        best = np.inf
        for i in range(len(L)):
            a, z = nstart[rows[i]], nstart[rows[i] + 1]
            j = np.searchsorted(ps[a:z], pq - L[i, U] - s_from[g], side="right")
            if j:
                best = min(best, L[i, T] + pt[a + j - 1])
        out.append(best)
    return out, time.perf_counter() - t0, most


def graph_levels(eng: Engine, graph: keygraph.KeyGraph):
    """Per level: (the kept keys' deltas, their next-level rows, the least S over kept entries),
    and [g]: the least S summed over levels g..n-1 (the part of every path's S the buckets leave out)."""
    parts = []
    for g in range(len(eng.positions)):
        D, NKT, _codes = eng.tables(graph.levels[g], g)
        rows = graph.rows_of(g + 1, NKT.reshape(-1)).reshape(NKT.shape).astype(np.int64)
        kept = rows < len(graph.levels[g + 1])
        parts.append((D, rows, D[..., S_N][kept].min() if kept.any() else 0))
    s_min = np.array([p[2] for p in parts], dtype=np.float64)
    return parts, np.r_[np.cumsum(s_min[::-1])[::-1], 0.0]


def budget_tables(eng: Engine, parts: list, last_level_keys: int, width: float, buckets: int, keep_levels: int):
    """H per level < keep_levels: [row, b] the least time-to-go over kept paths whose S, measured
    above each level's least and rounded down to `width`, sums to at most b buckets."""
    h = np.vstack([np.zeros((last_level_keys, buckets + 1)), np.full((1, buckets + 1), np.inf)])
    kept_h = {}
    for g in range(len(parts) - 1, -1, -1):
        D, rows, smin = parts[g]
        tau = (eng.pb.m * D[..., DT] + D[..., OPT]).astype(np.float64)
        s_bucket = np.floor((D[..., S_N] - smin) / width).astype(np.int64)
        h = _budget_back(tau, s_bucket, rows, h)
        if g < keep_levels:
            kept_h[g] = h
    return kept_h


def bounds_at(eng, graph, L, K, g, pq, h, s_from, width):
    """The two bounds (fixed-point time) of labels L with keys K at slot g, least over them."""
    lag = eng.lower_bounds(g, L, K, pq, graph=graph)[0]
    rows = graph.rows_of(g, K)
    free = np.floor((pq - L[:, U] - s_from[g]) / width)
    nb = h.shape[1] - 1
    ok = free >= 0
    budget = np.where(ok, L[:, T] + h[rows, np.clip(free, 0, nb).astype(np.int64)], np.inf)
    return lag.min(), budget.min()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mingpt-48l-1536")
    ap.add_argument("--hw", default="titan8")
    ap.add_argument("--mem-limit-gib", type=positive_float, default=8.0)
    ap.add_argument("--micro-batch", type=positive_int, action="append",
                    help="micro-batch (repeat for several; default 6 and 7)")
    ap.add_argument("--root", default="zero2")
    ap.add_argument("--incumbent", type=positive_float, default=24.35,
                    help="samples/s of the best plan known (the graph drops what cannot beat it); "
                         "24.35 is the search's incumbent when it builds these graphs")
    ap.add_argument("--buckets", type=positive_int, default=1024)
    ap.add_argument("--staircase", action="store_true",
                    help="also the exact bound without buckets (a Pareto staircase per key; minutes)")
    ap.add_argument("--lambda-points", type=positive_int, default=keygraph.N_LAMBDA,
                    help="points of the key graph's lambda grid (keygraph.N_LAMBDA)")
    ap.add_argument("--lambda-widen", type=positive_float, default=keygraph.LAMBDA_WIDEN,
                    help="how far the grid reaches past the bound's breakpoints each way (keygraph.LAMBDA_WIDEN)")
    args = ap.parse_args()
    keygraph.N_LAMBDA, keygraph.LAMBDA_WIDEN = args.lambda_points, args.lambda_widen
    spec, hw = load_model(args.model), load_profile(args.hw)
    pq = _limit_q(args.mem_limit_gib * 2**30, hw)
    print(f"{args.model} on {args.hw}, {args.mem_limit_gib:g} GiB, root {args.root}, every split with "
          f"checkpointing, incumbent {args.incumbent} samples/s, {args.buckets} budget buckets", flush=True)
    for mb in args.micro_batch or [6, 7]:
        (c,) = list(_configs(spec, hw, SearchSpace(micro_batches=(mb,), root_strategies=(args.root,)), pq, {}))
        samples = c.problem.samples
        sps = lambda q: samples / (q * TIME_Q) if q < float("inf") else 0.0      # noqa: E731
        eng = Engine(c.problem)
        thr = samples / args.incumbent / TIME_Q
        t0 = time.perf_counter()
        graph = keygraph.KeyGraph(eng, keygraph.lambda_grid(eng.bounds.j_lam), pq, thr,
                                  caps=keygraph.GraphCaps(100_000, 10_000_000))
        t_graph = time.perf_counter() - t0
        if len(graph.levels[-1]) == 0:
            print(f"micro-batch {mb}: no plan fits and beats the incumbent (the key graph is empty)", flush=True)
            continue
        L, K = eng.start()
        parts, s_from = graph_levels(eng, graph)
        width = (pq - L[0, U] - s_from[0]) / args.buckets
        h = budget_tables(eng, parts, len(graph.levels[-1]), width, args.buckets, 3)
        t_budget = time.perf_counter() - t0 - t_graph
        print(f"micro-batch {mb}: graph {graph.size} nodes {t_graph:.1f} s, budget pass {t_budget:.1f} s; "
              f"bucket width {width * 2**-10 / 2**20:.2f} MiB", flush=True)
        labels = [(0, L, K)]
        for g in range(2):                                   # the last block's two decisions
            D, NKT, CODE = eng.tables(K, g)
            L, K, _p, _c, _j = expand(L, np.arange(len(L)), D, NKT, CODE, eng.pb.m, eng.pm_sum)
            labels.append((g + 1, L, K))
        read = (labels[0], labels[2])
        for g, L, K in read:
            lag, budget = bounds_at(eng, graph, L, K, g, pq, h[g], s_from, width)
            where = "first decision" if g == 0 else f"after the last block ({len(L)} labels)"
            print(f"  {where}: lagrangian {sps(lag):.3f}, graph budget {sps(budget):.3f} samples/s", flush=True)
        if args.staircase:
            exact, secs, most = staircase_bounds(eng, graph, parts, s_from, pq, read)
            print(f"  exact staircases ({secs:.1f} s, at most {most} points per key): first decision "
                  f"{sps(exact[0]):.3f}, after the last block {sps(exact[1]):.3f} samples/s", flush=True)


if __name__ == "__main__":
    sys.exit(run_script(main))
