"""Labels and stage deltas as integer arrays: fast.apply on many labels at once (used by the
exact search, dp.py, and the key graph, keygraph.py)."""

import numpy as np

from osdp_sim.costmodel.fast import NEG

NCOL = 7            # t, u, v, y, pm, m1, m2
NDELTA = 12         # dt, opt, s_n, o_v, o_y, d_y, d_v, pm, o_m1, o_m2, g_a, p_a
DT, OPT, S_N, O_V, O_Y, D_Y, D_V, PM, O_M1, O_M2, G_A, P_A = range(NDELTA)    # its columns (fast.StageOut)
ZERO = (0, 0, 0, NEG, NEG, 0, 0, 0, NEG, NEG, 0, 0)     # the deltas of a decision only recorded


def update(L: np.ndarray, D: np.ndarray, m: int, pm_sum: bool = False) -> np.ndarray:
    """fast.apply on arrays: labels (n, NCOL) and stage deltas (n, NDELTA) (compiled: labelfold.py)."""
    from osdp_sim.planner.labelfold import update_rows
    D = np.ascontiguousarray(D, dtype=np.int64)
    return update_rows(np.ascontiguousarray(L, dtype=np.int64), D.reshape(len(D), 1, D.shape[-1]), int(m), bool(pm_sum))


def padded(tabs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Transition tables (codes, new key ids, deltas) of some keys as labelfold.expand's arrays:
    deltas (keys, kmax, NDELTA), new key ids (keys, kmax; -1 past a table's end), codes."""
    kmax = max(len(t[0]) for t in tabs)
    D = np.zeros((len(tabs), kmax, NDELTA), dtype=np.int64)
    NK = np.full((len(tabs), kmax), -1, dtype=np.int64)
    CODE = np.zeros((len(tabs), kmax), dtype=np.int64)
    for r, (codes, nks, ds) in enumerate(tabs):
        D[r, :len(codes)] = ds
        NK[r, :len(codes)] = nks
        CODE[r, :len(codes)] = codes
    return D, NK, CODE


def expand(L: np.ndarray, inv: np.ndarray, D: np.ndarray, NK: np.ndarray, CODE: np.ndarray, m: int,
           pm_sum: bool = False):
    """Labels L, label i on table row inv[i], through every taken entry (labelfold.expand):
    (labels, new key ids, parent rows, codes, table columns)."""
    from osdp_sim.planner.labelfold import expand as expand_c
    return expand_c(np.ascontiguousarray(L, dtype=np.int64), np.asarray(inv, dtype=np.int64), D, NK, CODE,
                    int(m), bool(pm_sum))


def unique_inverse(K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(K, return_inverse=True), without its sort when K is already sorted (the search's
    labels come out of each decision sorted by key)."""
    K = np.asarray(K)
    if len(K) and np.all(K[1:] >= K[:-1]):
        first = np.r_[True, K[1:] != K[:-1]]
        return K[first], np.cumsum(first) - 1
    return np.unique(K, return_inverse=True)
