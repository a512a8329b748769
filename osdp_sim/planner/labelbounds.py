"""Engine.lower_bounds's per-label part, compiled (osdp_sim/jit.py): one pass over the labels
instead of numpy's (labels, lambdas) temporaries. The same float64 operations in the same order,
so the bounds are bit-for-bit numpy's."""

import numpy as np

from osdp_sim.jit import compiled
from osdp_sim.planner.labels import T, U


@compiled
def label_bounds(C, kinv, KC, KM, j_lam, pq_max, finite, m_margin, t_margin, H, rows, lams, Mg, use_graph):
    """Per label i (C[i, T] time, C[i, U] largest event; kinv[i] its row of KC (J lambdas), KM):
    lb = max_j KC[kinv, j] - j_lam[j] * budget (only lambda = 0 without a finite limit), and with
    the key graph (use_graph) the larger of that and max_j H[rows, j] - lams[j] * budget_g.
    Returns (C[:, T] + lb - t_margin, the memory bound)."""
    n = C.shape[0]
    lb_out = np.empty(n)
    mem_out = np.empty(n)
    for i in range(n):
        u = float(C[i, U])
        k = kinv[i]
        mem = u + KM[k] - m_margin
        lb = -np.inf
        if finite:
            budget = pq_max - u + m_margin
            if budget < 0.0:
                budget = 0.0
            for j in range(j_lam.shape[0]):
                v = KC[k, j] - j_lam[j] * budget
                if v > lb:
                    lb = v
        else:
            for j in range(j_lam.shape[0]):
                if j_lam[j] == 0.0 and KC[k, j] > lb:
                    lb = KC[k, j]
        if use_graph:
            r = rows[i]
            ug = u - m_margin
            if finite:
                bg = pq_max - ug
                if bg < 0.0:
                    bg = 0.0
                lg = -np.inf
                for j in range(lams.shape[0]):
                    v = H[r, j] - bg * lams[j]
                    if v > lg:
                        lg = v
            else:
                lg = H[r, 0]
            if lg > lb:
                lb = lg
            mg = u + Mg[r] - m_margin
            if mg > mem:
                mem = mg
        lb_out[i] = float(C[i, T]) + lb - t_margin
        mem_out[i] = mem
    return lb_out, mem_out


@compiled
def compiled_label_cols():
    """(T, U) as this module's compiled code holds them (see labels.py: numba freezes them)."""
    return (T, U)
