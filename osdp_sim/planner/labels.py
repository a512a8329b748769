"""Labels and stage deltas as integer arrays: fast.apply on many labels at once (used by the
exact search, dp.py, and the key graph, keygraph.py)."""

import numpy as np

from osdp_sim.costmodel.fast import NEG

NCOL = 7            # t, u, v, y, pm, m1, m2
NDELTA = 12         # dt, opt, s_n, o_v, o_y, d_y, d_v, pm, o_m1, o_m2, g_a, p_a
DT, OPT, S_N, O_V, O_Y, D_Y, D_V, PM, O_M1, O_M2, G_A, P_A = range(NDELTA)    # its columns (fast.StageOut)
ZERO = (0, 0, 0, NEG, NEG, 0, 0, 0, NEG, NEG, 0, 0)     # the deltas of a decision only recorded


def update(L: np.ndarray, D: np.ndarray, m: int, pm_sum: bool = False) -> np.ndarray:
    """fast.apply on arrays: labels (n, NCOL) and stage deltas (n, NDELTA)."""
    C = np.empty((len(L), NCOL), dtype=np.int64)
    C[:, 0] = L[:, 0] + m * D[:, 0] + D[:, 1]
    C[:, 1] = np.maximum.reduce([L[:, 1] + D[:, 2], L[:, 2] + D[:, 3], L[:, 3] + D[:, 4],
                                 L[:, 5] + D[:, 2] + D[:, 10], L[:, 6] + D[:, 2] + D[:, 11]])
    C[:, 2] = L[:, 2] + D[:, 6]
    C[:, 3] = L[:, 3] + D[:, 5]
    C[:, 4] = L[:, 4] + D[:, 7] if pm_sum else np.maximum(L[:, 4], D[:, 7])
    C[:, 5] = L[:, 3] + D[:, 8]
    C[:, 6] = L[:, 3] + D[:, 9]
    return C
