"""Engine.lower_bounds's per-label part, compiled (osdp_sim/jit.py): one pass over the labels
instead of numpy's (labels, lambdas) temporaries. The same float64 operations, so the bounds are
bit-for-bit numpy's (a maximum is exact in any order)."""

import numpy as np

from osdp_sim.jit import compiled
from osdp_sim.planner.labels import T, U


@compiled(inline=True)
def memory_bound(C, i, k, r, KM, Mg, m_margin, use_graph):
    """The memory bound of label i (C[i, U] its largest event; k its row of KM, r its row of the
    key graph's Mg, read only with use_graph): U + KM[k] - m_margin, or the graph's if larger."""
    u = float(C[i, U])
    mem = u + KM[k] - m_margin
    if use_graph:
        mg = u + Mg[r] - m_margin
        if mg > mem:
            mem = mg
    return mem


@compiled(inline=True)
def time_bound(C, i, k, r, KC, j_lam, pq_max, finite, m_margin, t_margin, H, lams, use_graph, stop_at):
    """The time bound of label i (C[i, T] its time, C[i, U] its largest event; k its row of KC
    (J lambdas), r its row of the key graph's H, read only with use_graph): C[i, T] + lb -
    t_margin, lb the largest of max_j KC[k, j] - j_lam[j] * budget (only lambda = 0 without a
    finite limit) and, with the graph, max_j H[r, j] - lams[j] * budget_g. The maximum does not
    depend on the order its terms are read in, so the graph's, the tighter almost everywhere, is
    read first; once the bound reaches stop_at (a pruning threshold) the rest is not read and the
    value returned is only known to be >= stop_at (inf: always the bound)."""
    u = float(C[i, U])
    t = float(C[i, T])
    lb = -np.inf
    if use_graph:
        if finite:
            bg = pq_max - (u - m_margin)
            if bg < 0.0:
                bg = 0.0
            for j in range(lams.shape[0]):
                v = H[r, j] - bg * lams[j]
                if v > lb:
                    lb = v
                    if t + lb - t_margin >= stop_at:
                        return t + lb - t_margin
        else:
            lb = H[r, 0]
            if t + lb - t_margin >= stop_at:
                return t + lb - t_margin
    if finite:
        budget = pq_max - u + m_margin
        if budget < 0.0:
            budget = 0.0
        for j in range(j_lam.shape[0]):
            v = KC[k, j] - j_lam[j] * budget
            if v > lb:
                lb = v
                if t + lb - t_margin >= stop_at:
                    return t + lb - t_margin
    else:
        for j in range(j_lam.shape[0]):
            if j_lam[j] == 0.0 and KC[k, j] > lb:
                lb = KC[k, j]
    return t + lb - t_margin


@compiled
def label_bounds(C, kinv, KC, KM, j_lam, pq_max, finite, m_margin, t_margin, H, rows, lams, Mg, use_graph,
                 stop_at):
    """time_bound and memory_bound of every label i, its key row kinv[i] and graph row rows[i]
    (read only with use_graph): (time bounds, memory bounds). A time bound >= stop_at is only
    known to be >= stop_at (inf: every bound exact)."""
    n = C.shape[0]
    lb_out = np.empty(n)
    mem_out = np.empty(n)
    for i in range(n):
        r = rows[i] if use_graph else 0
        mem_out[i] = memory_bound(C, i, kinv[i], r, KM, Mg, m_margin, use_graph)
        lb_out[i] = time_bound(C, i, kinv[i], r, KC, j_lam, pq_max, finite, m_margin, t_margin, H, lams, use_graph,
                               stop_at)
    return lb_out, mem_out


@compiled
def compiled_label_cols():
    """(T, U) as this module's compiled code holds them (see labels.py: numba freezes them)."""
    return (T, U)
