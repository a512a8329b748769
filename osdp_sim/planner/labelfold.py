"""The label update (fast.apply on integer rows) and the label expansion of one decision,
compiled (osdp_sim/jit.py). Integer sums and maxima, so the results are exactly numpy's.

Layouts: labels (n, NCOL) int64; deltas (n, NDELTA) int64 (labels.py names the columns); a
decision's transition table per distinct key (rows r): D (keys, kmax, NDELTA), new key ids NK
(keys, kmax; -1: not taken) and codes CODE (keys, kmax)."""

import numpy as np

from osdp_sim.jit import compiled
from osdp_sim.planner.labels import (D_V, D_Y, DT, G_A, M1, M2, NCOL, NDELTA, NEW_PM, O_M1, O_M2, O_V,
                                     O_Y, OPT, P_A, PM, S_N, T, U, V, Y)


@compiled(inline=True)
def _apply_row(L, i, D, r, j, m, pm_sum, C, o):
    """C[o] = fast.apply(L[i], D[r, j]) (D as (rows, cols, NDELTA))."""
    C[o, T] = L[i, T] + m * D[r, j, DT] + D[r, j, OPT]
    u = L[i, U] + D[r, j, S_N]
    x = L[i, V] + D[r, j, O_V]
    if x > u:
        u = x
    x = L[i, Y] + D[r, j, O_Y]
    if x > u:
        u = x
    x = L[i, M1] + D[r, j, S_N] + D[r, j, G_A]
    if x > u:
        u = x
    x = L[i, M2] + D[r, j, S_N] + D[r, j, P_A]
    if x > u:
        u = x
    C[o, U] = u
    C[o, V] = L[i, V] + D[r, j, D_V]
    C[o, Y] = L[i, Y] + D[r, j, D_Y]
    if pm_sum:
        C[o, PM] = L[i, PM] + D[r, j, NEW_PM]
    else:
        C[o, PM] = max(L[i, PM], D[r, j, NEW_PM])
    C[o, M1] = L[i, Y] + D[r, j, O_M1]
    C[o, M2] = L[i, Y] + D[r, j, O_M2]


@compiled
def update_rows(L, D, m, pm_sum):
    """fast.apply on rows: label i with deltas D[i] (D as (n, 1, NDELTA))."""
    n = L.shape[0]
    C = np.empty((n, L.shape[1]), dtype=np.int64)
    for i in range(n):
        _apply_row(L, i, D, i, 0, m, pm_sum, C, i)
    return C


@compiled
def update_chain(L0, D, m, pm_sum):
    """One label through deltas D[0], D[1], ... in turn (D as (n, 1, NDELTA)): the labels before
    each and after the last, (n + 1, NCOL)."""
    n = D.shape[0]
    C = np.empty((n + 1, L0.shape[1]), dtype=np.int64)
    for col in range(L0.shape[1]):            # not C[0] = L0[0]: see fold.run_tasks
        C[0, col] = L0[0, col]
    for i in range(n):
        _apply_row(C, i, D, i, 0, m, pm_sum, C, i + 1)
    return C


@compiled
def expand(L, inv, drow, D, NK, CODE, m, pm_sum):
    """Every label i through every taken entry j of its key's table (row r = inv[i] of NK and
    CODE, row drow[r] of D: a TableArena's deltas read in place), in the order (i, j): (new
    labels, new key ids, parent rows i, codes, table columns j)."""
    n = L.shape[0]
    kmax = NK.shape[1]
    count = 0
    for i in range(n):
        r = inv[i]
        for j in range(kmax):
            if NK[r, j] >= 0:
                count += 1
    C = np.empty((count, L.shape[1]), dtype=np.int64)
    CK = np.empty(count, dtype=np.int64)
    CP = np.empty(count, dtype=np.int64)
    CC = np.empty(count, dtype=np.int64)
    COL = np.empty(count, dtype=np.int64)
    o = 0
    for i in range(n):
        r = inv[i]
        for j in range(kmax):
            if NK[r, j] >= 0:
                _apply_row(L, i, D, drow[r], j, m, pm_sum, C, o)
                CK[o] = NK[r, j]
                CP[o] = i
                CC[o] = CODE[r, j]
                COL[o] = j
                o += 1
    return C, CK, CP, CC, COL


@compiled
def graph_forward(L, trow, deltas, new_keys, m, pm_sum, slot):
    """One level of keygraph.py's forward pass: every label i through every entry of its key's
    table (row trow[i] of a TableArena's deltas (rows, entries, NDELTA) and new_keys (rows,
    entries), -1: not taken) and, per new key, the componentwise least new label: (those labels,
    the keys in ascending order). slot: a work array, -1 at every key id that may occur, left so
    (a key's slot marks it seen: no sort of the new labels)."""
    n = L.shape[0]
    kmax = new_keys.shape[1]
    ncol = L.shape[1]
    groups = 0
    for i in range(n):
        r = trow[i]
        for j in range(kmax):
            k = new_keys[r, j]
            if k >= 0 and slot[k] < 0:
                slot[k] = groups
                groups += 1
    keys = np.empty(groups, dtype=np.int64)
    least = np.empty((groups, ncol), dtype=np.int64)
    seen = np.zeros(groups, dtype=np.bool_)
    row = np.empty((1, ncol), dtype=np.int64)
    for i in range(n):
        r = trow[i]
        for j in range(kmax):
            k = new_keys[r, j]
            if k < 0:
                continue
            q = slot[k]
            _apply_row(L, i, deltas, r, j, m, pm_sum, row, 0)
            if seen[q]:
                for c in range(ncol):
                    if row[0, c] < least[q, c]:
                        least[q, c] = row[0, c]
            else:
                seen[q] = True
                keys[q] = k
                for c in range(ncol):
                    least[q, c] = row[0, c]
    order = np.argsort(keys)
    out = np.empty((groups, ncol), dtype=np.int64)
    out_keys = np.empty(groups, dtype=np.int64)
    for a in range(groups):
        q = order[a]
        out_keys[a] = keys[q]
        for c in range(ncol):
            out[a, c] = least[q, c]
        slot[keys[q]] = -1
    return out, out_keys


@compiled
def graph_back(trow, deltas, new_keys, m, lams, H_next, M_next, next_row):
    """One level of keygraph.py's backward pass: per key r (its table: row trow[r] of a
    TableArena's deltas (rows, entries, NDELTA) and new_keys (rows, entries)), H[r, l] = min over
    entries e of (tau + s lams[l]) + H_next[q, l] and M[r] = min_e s + M_next[q], tau = m dt + opt
    and s = S_N of the entry, q = next_row[its new key] (its row at the next level; -1, or a new
    key of -1: not kept there, the last row of H_next and M_next, inf). A last row of inf is
    appended to both."""
    nk = trow.shape[0]
    kmax = new_keys.shape[1]
    nl = lams.shape[0]
    H = np.full((nk + 1, nl), np.inf)
    M = np.full(nk + 1, np.inf)
    for r in range(nk):
        t = trow[r]
        for e in range(kmax):
            k = new_keys[t, e]
            q = next_row[k] if k >= 0 else -1
            if q < 0:
                continue                  # the inf row: inf + anything is no new minimum
            tau = float(m * deltas[t, e, DT] + deltas[t, e, OPT])
            s = float(deltas[t, e, S_N])
            for l in range(nl):
                h = (tau + s * lams[l]) + H_next[q, l]
                if h < H[r, l]:
                    H[r, l] = h
            v = s + M_next[q]
            if v < M[r]:
                M[r] = v
    return H, M


@compiled
def compiled_layout():
    """labels.LAYOUT as this module's compiled code holds it, in its order (numba freezes module
    constants: a cache compiled before labels.py changed holds the old ones)."""
    return (T, U, V, Y, PM, M1, M2, NCOL, DT, OPT, S_N, O_V, O_Y, D_Y, D_V, NEW_PM, O_M1, O_M2, G_A, P_A, NDELTA)
