"""The dominance filter of dp.pareto_by_key, compiled (osdp_sim/jit.py).

The rows are any integer columns (the search's labels, labels.py); they are sorted by (key,
columns in index order...), so a row can only be dominated (<= in every column) by an earlier
row of its key, and its first column (labels.T) is then <= already; dominance is transitive, so the kept
rows of the key suffice. Before scanning them a row is tested against two shortcuts that settle
most rows: below the least kept value in some column, nothing dominates it; else the kept rows
least in each column are tried first."""

import numpy as np

from osdp_sim.jit import compiled


@compiled
def _dominates(C, j, i):
    for col in range(1, C.shape[1]):
        if C[j, col] > C[i, col]:
            return False
    return True


@compiled
def pareto_segments(C, starts, ends, top_k, keep):
    """keep[i] = False for the rows of segments [starts[s], ends[s]) dominated by at least top_k
    kept rows of their segment (equal rows: the first ones are kept)."""
    ncol = C.shape[1]
    kept = np.empty(C.shape[0], dtype=np.int64)
    least = np.empty(ncol, dtype=np.int64)             # per column: the kept row least in it
    for s in range(starts.shape[0]):
        nk = 0
        for i in range(starts[s], ends[s]):
            if nk > 0 and top_k == 1:
                free = False
                for col in range(1, ncol):
                    if C[i, col] < C[least[col], col]:
                        free = True
                        break
                if not free:
                    dom = False
                    for col in range(1, ncol):
                        if _dominates(C, least[col], i):
                            dom = True
                            break
                    if not dom:
                        for a in range(nk):
                            if _dominates(C, kept[a], i):
                                dom = True
                                break
                    if dom:
                        keep[i] = False
                        continue
            elif nk > 0:
                count = 0
                for a in range(nk):
                    if _dominates(C, kept[a], i):
                        count += 1
                        if count >= top_k:
                            break
                if count >= top_k:
                    keep[i] = False
                    continue
            kept[nk] = i
            nk += 1
            for col in range(1, ncol):
                if nk == 1 or C[i, col] < C[least[col], col]:
                    least[col] = i
    return keep
