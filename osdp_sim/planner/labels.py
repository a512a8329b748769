"""Labels and stage deltas as integer arrays: fast.apply on many labels at once (used by the
exact search, dp.py, and the key graph, keygraph.py).

The columns are named here once; every array of the search and its compiled loops
(labelfold.py, labelbounds.py) indexes them by these names. numba freezes them into the compiled
modules' caches, which are keyed on their own files only: after changing a column here, touch
labelfold.py and labelbounds.py (tests/test_search_labelfold.py checks the compiled layout)."""

from typing import NamedTuple

import numpy as np

from osdp_sim.costmodel.fast import NEG

# Label columns (fast.Label, in its field order), fixed point (fast.TIME_Q s, fast.MEM_Q bytes):
T = 0        # grad_accum * schedule time + optimizer time so far (TIME_Q)
U = 1        # largest live-byte event so far, relative to the undecided steps' Res + kept (MEM_Q)
V = 2        # Res of the processed steps: the base of new forward events (MEM_Q)
Y = 3        # live bytes at the current backward point, same reference (MEM_Q)
PM = 4       # largest local parameter bytes so far, or their sum under pm_sum (MEM_Q)
M1 = 5       # a checkpointed MLP done ahead of its attention: its level after the last re-gather (MEM_Q; NEG none)
M2 = 6       # ... and its events after the recompute starts (MEM_Q; NEG none)
NCOL = 7

# Stage-delta columns (fast.StageOut's fields after the key, in their order), fixed point:
DT = 0       # schedule time of the newly finished segments, times grad_accum in the label (TIME_Q)
OPT = 1      # optimizer time of the new units (TIME_Q)
S_N = 2      # Res + kept bytes of the new steps: shifts every past event (MEM_Q)
O_V = 3      # new forward events, relative to V before the stage (MEM_Q; NEG none)
O_Y = 4      # new backward events, relative to Y before the stage (MEM_Q; NEG none)
D_Y = 5      # change of Y (MEM_Q)
D_V = 6      # change of V: Res of the new steps (MEM_Q)
NEW_PM = 7   # largest local parameter bytes among the new units (StageOut.pm; MEM_Q)
O_M1 = 8     # "ckmlp": level after its last re-gather, relative to Y (MEM_Q; NEG none)
O_M2 = 9     # "ckmlp": events after the recompute starts, relative to Y (MEM_Q; NEG none)
G_A = 10     # "ckattn": the attention's re-gathered bytes, added to M1's events (MEM_Q)
P_A = 11     # "ckattn": those + the attention's recomputed activations, added to M2's (MEM_Q)
NDELTA = 12

LAYOUT = (T, U, V, Y, PM, M1, M2, NCOL, DT, OPT, S_N, O_V, O_Y, D_Y, D_V, NEW_PM, O_M1, O_M2, G_A, P_A, NDELTA)


def _zero() -> tuple:
    d = [0] * NDELTA
    for c in (O_V, O_Y, O_M1, O_M2):
        d[c] = NEG
    return tuple(d)


ZERO = _zero()      # the deltas of a decision only recorded: no time, no bytes, no event


def label_row(lab) -> list[int]:
    """A fast.Label as one row of label columns."""
    row = [0] * NCOL
    row[T], row[U], row[V], row[Y], row[PM], row[M1], row[M2] = lab.t, lab.u, lab.v, lab.y, lab.pm, lab.m1, lab.m2
    return row


def peaks(L: np.ndarray) -> np.ndarray:
    """The final live-byte peak of complete labels (fast.finish): the optimizer's temporary last."""
    return np.maximum(L[:, U], L[:, Y] + L[:, PM])


class Table(NamedTuple):
    """The transitions of one key at one decision slot (dp.Engine.table): one entry per code allowed there."""

    codes: np.ndarray         # (entries,) the decision codes (dp.py: a choice, + len(choices) if checkpointed)
    new_keys: np.ndarray      # (entries,) the key id each code leads to
    deltas: np.ndarray        # (entries, NDELTA) the stage deltas of each code


def update(L: np.ndarray, D: np.ndarray, m: int, pm_sum: bool = False) -> np.ndarray:
    """fast.apply on arrays: labels (n, NCOL) and stage deltas (n, NDELTA) (compiled: labelfold.py)."""
    from osdp_sim.planner.labelfold import update_rows
    D = np.ascontiguousarray(D, dtype=np.int64)
    return update_rows(np.ascontiguousarray(L, dtype=np.int64), D.reshape(len(D), 1, D.shape[-1]), int(m), bool(pm_sum))


def expand(L: np.ndarray, inv: np.ndarray, D: np.ndarray, NK: np.ndarray, CODE: np.ndarray, m: int,
           pm_sum: bool = False, drow: np.ndarray | None = None):
    """Labels L, label i on table row inv[i], through every taken entry (labelfold.expand):
    (labels, new key ids, parent rows, codes, table columns). drow: the row of D of each table
    row (D a TableArena's deltas, read in place); None: D holds the tables' rows in order."""
    from osdp_sim.planner.labelfold import expand as expand_c
    drow = np.arange(len(NK), dtype=np.int64) if drow is None else np.asarray(drow, dtype=np.int64)
    return expand_c(np.ascontiguousarray(L, dtype=np.int64), np.asarray(inv, dtype=np.int64), drow, D, NK, CODE,
                    int(m), bool(pm_sum))


def run_starts(K: np.ndarray) -> np.ndarray:
    """[i]: K[i] differs from K[i - 1] (True at 0): where each run of equal values starts."""
    first = np.empty(len(K), dtype=bool)
    if len(K):
        first[0] = True
        np.not_equal(K[1:], K[:-1], out=first[1:])
    return first


def unique_inverse(K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(K, return_inverse=True) for key ids, without its sort: when K is already sorted
    (the search's labels come out of each decision sorted by key) by comparing neighbours, else,
    key ids being small integers, by marking them in an array as long as the largest."""
    K = np.asarray(K)
    if len(K) and np.all(K[1:] >= K[:-1]):
        first = run_starts(K)
        return K[first], np.cumsum(first) - 1
    if len(K) >= 256 and K.min() >= 0 and K.max() < 8 * len(K):
        seen = np.zeros(int(K.max()) + 1, dtype=bool)
        seen[K] = True
        u = np.flatnonzero(seen)
        row = np.empty(len(seen), dtype=np.int64)
        row[u] = np.arange(len(u))
        return u.astype(K.dtype), row[K]
    return np.unique(K, return_inverse=True)


def sort_by_key(C: np.ndarray, CK: np.ndarray) -> np.ndarray:
    """The stable order of labels C by (key CK, then every column in order): np.lexsort's, with
    two sort passes where key and time decide and the other columns read only within their ties."""
    order = np.lexsort((C[:, T], CK))
    ks, ts = CK[order], C[order, T]
    tie = (ks[1:] == ks[:-1]) & (ts[1:] == ts[:-1])
    if not tie.any():
        return order
    in_run = np.zeros(len(order), dtype=bool)                      # positions in a run of ties
    in_run[:-1] |= tie
    in_run[1:] |= tie
    at = np.flatnonzero(in_run)
    run = np.cumsum(np.concatenate(([True], ~tie)))[at]
    sub = order[at]
    order[at] = sub[np.lexsort(tuple(C[sub, c] for c in range(NCOL - 1, 0, -1)) + (run,))]
    return order
