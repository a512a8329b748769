"""The new labels of one decision settled in one compiled call (osdp_sim/jit.py): their bounds,
the pruning by them, the sort by (key, columns) and the dominance within each key, as
dp.Engine._expand's separate steps (Engine.lower_bounds, the sort, dp.pareto_by_key) compute
them, without a numpy temporary per step.

It calls labelbounds.memory_bound, labelbounds.time_bound and dominance.pareto_segments, whose
machine code numba copies into this module's cache, which is keyed on this file only: after
changing either, touch this file (tests/test_search_labelsettle.py checks the call against the
separate steps)."""

import numpy as np

from osdp_sim.jit import compiled
from osdp_sim.planner.dominance import pareto_segments
from osdp_sim.planner.labelbounds import memory_bound, time_bound


INSERTION_MAX = 24               # runs up to this long are sorted by insertion, longer ones merged


@compiled(inline=True)
def _before(C, a, b, first_col):
    """Label a sorts strictly before label b of the same key: by columns first_col.. in order."""
    for col in range(first_col, C.shape[1]):
        if C[a, col] != C[b, col]:
            return C[a, col] < C[b, col]
    return False


@compiled
def _sort_run(C, order, lo, hi, first_col, buf):
    """order[lo:hi] (label rows of one key) in place, in the stable order of columns first_col..:
    insertion for short runs, else a bottom-up merge sort through buf."""
    if hi - lo <= INSERTION_MAX:
        for i in range(lo + 1, hi):
            x = order[i]
            j = i - 1
            while j >= lo and _before(C, x, order[j], first_col):
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = x
        return
    src, dst = order, buf
    in_buf = False                       # whether the sorted run lies in buf
    width = 1
    while width < hi - lo:
        for s0 in range(lo, hi, 2 * width):
            mid = min(s0 + width, hi)
            end = min(s0 + 2 * width, hi)
            i, j, o = s0, mid, s0
            while i < mid and j < end:
                if _before(C, src[j], src[i], first_col):
                    dst[o] = src[j]
                    j += 1
                else:
                    dst[o] = src[i]
                    i += 1
                o += 1
            while i < mid:
                dst[o] = src[i]
                i += 1
                o += 1
            while j < end:
                dst[o] = src[j]
                j += 1
                o += 1
        src, dst = dst, src
        in_buf = not in_buf
        width *= 2
    if in_buf:
        for i in range(lo, hi):
            order[i] = buf[i]


@compiled
def sort_rows(C, krank, nkeys, idx, first_col):
    """idx (label rows) in the stable order of (key, columns first_col..), given each label's key
    as its rank krank among the nkeys keys (ascending key ids): a counting sort by key, then each
    key's run by the columns."""
    n = idx.shape[0]
    start = np.zeros(nkeys + 1, dtype=np.int64)
    for i in idx:
        start[krank[i] + 1] += 1
    for k in range(nkeys):
        start[k + 1] += start[k]
    fill = start[:nkeys].copy()
    order = np.empty(n, dtype=np.int64)
    for i in idx:
        k = krank[i]
        order[fill[k]] = i
        fill[k] += 1
    buf = np.empty(n, dtype=np.int64)
    for k in range(nkeys):
        if start[k + 1] - start[k] > 1:
            _sort_run(C, order, start[k], start[k + 1], first_col, buf)
    return order


@compiled
def prune_sort(C, kinv, rows, KC, KM, j_lam, pq_max, finite, m_margin, t_margin, H, lams, Mg, use_graph,
               thr_q, memory_only):
    """Labels C (kinv[i]: the row of KC and KM of label i's key, its rank among the decision's keys
    in ascending key ids; rows[i] its row of the key graph, read with use_graph) whose memory bound is <= pq_max (with a finite limit) and
    whose time bound is < thr_q. Returns (their rows in the stable order of (key, columns; T left
    out under memory_only); the bound the beam ranks each by: memory under memory_only, else time;
    labels pruned by memory; labels pruned by time)."""
    n = C.shape[0]
    live = np.empty(n, dtype=np.int64)
    rank = np.empty(n)
    pruned_memory = pruned_bound = 0
    nlive = 0
    for i in range(n):
        k, r = kinv[i], (rows[i] if use_graph else 0)
        mem = memory_bound(C, i, k, r, KM, Mg, m_margin, use_graph)
        if finite and not mem <= pq_max:
            pruned_memory += 1
            continue
        lb = time_bound(C, i, k, r, KC, j_lam, pq_max, finite, m_margin, t_margin, H, lams, use_graph, thr_q)
        if not lb < thr_q:
            pruned_bound += 1
            continue
        live[nlive] = i
        rank[i] = mem if memory_only else lb
        nlive += 1
    order = sort_rows(C, kinv, KM.shape[0], live[:nlive], 1 if memory_only else 0)    # column 0 is T
    return order, rank[order], pruned_memory, pruned_bound


@compiled
def settle(C, kinv, rows, KC, KM, j_lam, pq_max, finite, m_margin, t_margin, H, lams, Mg, use_graph,
           thr_q, memory_only, top_k):
    """prune_sort, then the labels dominated (dp.pareto_by_key) by top_k or more kept labels of
    their key dropped: (rows kept, in prune_sort's order; their beam ranks; labels pruned by
    memory; by time; dominated)."""
    order, rank, pruned_memory, pruned_bound = prune_sort(C, kinv, rows, KC, KM, j_lam, pq_max, finite,
                                                          m_margin, t_margin, H, lams, Mg, use_graph, thr_q,
                                                          memory_only)
    nlive = order.shape[0]
    Cs = np.empty((nlive, C.shape[1]), dtype=np.int64)
    nseg = 0
    starts = np.empty(nlive, dtype=np.int64)
    for o in range(nlive):
        for col in range(C.shape[1]):        # not Cs[o] = C[...]: see fold.run_tasks
            Cs[o, col] = C[order[o], col]
        if o == 0 or kinv[order[o]] != kinv[order[o - 1]]:
            starts[nseg] = o
            nseg += 1
    ends = np.empty(nseg, dtype=np.int64)
    for s in range(nseg):
        ends[s] = starts[s + 1] if s + 1 < nseg else nlive
    keep = np.ones(nlive, dtype=np.bool_)
    if nlive > 1:
        pareto_segments(Cs, starts[:nseg], ends, top_k, keep)
    kept = np.flatnonzero(keep)
    return order[kept], rank[kept], pruned_memory, pruned_bound, nlive - kept.shape[0]
