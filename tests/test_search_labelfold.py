"""The compiled label expansion and key-graph passes (planner/labelfold.py) against plain
Python references: fast.apply per (label, table entry), and per-key minima computed by hand."""

from dataclasses import fields

import numpy as np
import pytest

from osdp_sim.costmodel import fold
from osdp_sim.costmodel.fast import NEG, Label, StageOut, StagePart, apply
from osdp_sim.planner import labels
from osdp_sim.planner.labelbounds import compiled_label_cols
from osdp_sim.planner.labelfold import compiled_layout, graph_back, graph_forward, update_chain
from osdp_sim.planner.tables import TableArena
from osdp_sim.planner.labels import (DT, LAYOUT, M1, M2, NCOL, NDELTA, O_M1, O_M2, O_V, O_Y, OPT, S_N, T, U, expand,
                                     label_row, sort_by_key, unique_inverse, update)

LABEL_COLS = {"t": "T", "u": "U", "v": "V", "y": "Y", "pm": "PM", "m1": "M1", "m2": "M2"}
DELTA_COLS = {"dt": "DT", "opt": "OPT", "s_n": "S_N", "o_v": "O_V", "o_y": "O_Y", "d_y": "D_Y", "d_v": "D_V",
              "pm": "NEW_PM", "o_m1": "O_M1", "o_m2": "O_M2", "g_a": "G_A", "p_a": "P_A"}


def _rand(rng, shape, neg_cols=()):
    """Random rows; NEG ("no event") in some rows of the columns that may hold it."""
    x = rng.integers(-10**12, 10**12, shape)
    for c in neg_cols:
        x[..., c][rng.random(shape[:-1]) < 0.2] = NEG
    return x


LABEL_NEG = (M1, M2)
DELTA_NEG = (O_V, O_Y, O_M1, O_M2)


def _ref(lrow, drow, m, pm_sum):
    lab = Label(**{f: int(lrow[getattr(labels, c)]) for f, c in LABEL_COLS.items()})
    out = StageOut(None, **{f: int(drow[getattr(labels, c)]) for f, c in DELTA_COLS.items()})
    return label_row(apply(lab, out, m, pm_sum))


def test_columns_are_named_once_for_every_field_of_label_and_stageout():
    """The label columns are fast.Label's fields, the delta columns StageOut's after its key, in
    their order (fast.run_stage builds StageOut from fold.run_stages's deltas), each one column."""
    assert [f.name for f in fields(Label)] == list(LABEL_COLS)
    assert [getattr(labels, c) for c in LABEL_COLS.values()] == list(range(NCOL))
    assert [f.name for f in fields(StageOut)][1:] == list(DELTA_COLS)
    assert [getattr(labels, c) for c in DELTA_COLS.values()] == list(range(NDELTA))
    assert list(fold.STAGE_DELTAS) == list(DELTA_COLS)          # fold.run_stages writes them in that order
    assert [fold._DT, fold._OPT, fold._S_N, fold._O_V, fold._O_Y, fold._D_Y, fold._D_V, fold._NEW_PM, fold._O_M1,
            fold._O_M2, fold._G_A, fold._P_A] == list(range(NDELTA))
    assert set(fold.PART_FIXED) <= set(StagePart._fields) & set(fold.STAGE_DELTAS)
    lab = Label(*range(10, 10 + NCOL))
    assert label_row(lab) == [getattr(lab, f) for f in LABEL_COLS]


def test_compiled_loops_hold_the_current_column_layout():
    """numba freezes module constants into its cache: a stale cache would index other columns
    (touch labelfold.py and labelbounds.py to rebuild it)."""
    assert tuple(compiled_layout()) == LAYOUT
    assert tuple(compiled_label_cols()) == (T, U)


@pytest.mark.parametrize("seed", range(4))
def test_expand_is_fast_apply_on_every_taken_entry_in_label_order(seed):
    rng = np.random.default_rng(seed)
    nkeys, n, k = int(rng.integers(1, 6)), int(rng.integers(0, 30)), int(rng.integers(1, 5))
    arena = TableArena(rng.integers(0, 9, k))
    key_ids = rng.choice(100, nkeys, replace=False)
    arena.add_rows(key_ids, rng.integers(0, 40, (nkeys, k)), np.stack([_rand(rng, (k, NDELTA), DELTA_NEG) for _ in key_ids]))
    D, NK, CODE = arena.gather(key_ids)
    NK[rng.random(NK.shape) < 0.3] = -1                     # pruned entries
    L = _rand(rng, (n, NCOL), LABEL_NEG)
    inv = rng.integers(0, nkeys, n)
    m, pm_sum = int(rng.integers(1, 9)), bool(seed % 2)
    C, CK, CP, CC, COL = expand(L, inv, D, NK, CODE, m, pm_sum)
    want = [(i, j) for i in range(n) for j in range(NK.shape[1]) if NK[inv[i], j] >= 0]
    assert len(C) == len(want)
    for o, (i, j) in enumerate(want):
        assert C[o].tolist() == _ref(L[i], D[inv[i], j], m, pm_sum)
        assert (CK[o], CP[o], CC[o], COL[o]) == (NK[inv[i], j], i, CODE[inv[i], j], j)
    # the same with the arena's deltas read in place (its rows of the keys, in reverse order)
    order = np.arange(nkeys)[::-1]
    C2, CK2, *_ = expand(L, order[inv], arena.deltas, NK[order], CODE, m, pm_sum,
                         drow=arena.row_of[key_ids][order])
    assert C2.tolist() == C.tolist() and CK2.tolist() == CK.tolist()
    U = update(L, D[inv, 0], m, pm_sum)
    assert [r.tolist() for r in U] == [_ref(L[i], D[inv[i], 0], m, pm_sum) for i in range(n)]


def _rand_arena(rng, n_rows, entries, n_keys):
    """A TableArena's arrays at random: deltas (rows, entries, NDELTA), new key ids (some -1: not
    taken) below n_keys."""
    D = _rand(rng, (n_rows, entries, NDELTA), DELTA_NEG) // 4
    NK = rng.integers(0, n_keys, (n_rows, entries))
    NK[rng.random(NK.shape) < 0.1] = -1
    return D, NK


@pytest.mark.parametrize("seed", range(4))
def test_forward_pass_keeps_the_least_row_per_new_key(seed):
    # one level of the key graph's forward pass: every label through its key's table row, then
    # the componentwise least new label per new key, keys ascending; the work array left at -1
    rng = np.random.default_rng(100 + seed)
    n, entries, n_keys, m, pm_sum = int(rng.integers(1, 60)), int(rng.integers(1, 9)), 30, \
        int(rng.integers(1, 9)), bool(seed % 2)
    D, NK = _rand_arena(rng, int(rng.integers(1, 12)), entries, n_keys)
    L = _rand(rng, (n, NCOL), LABEL_NEG) // 4
    trow = rng.integers(0, len(D), n)
    work = np.full(n_keys + 5, -1, dtype=np.int64)
    rows, keys = graph_forward(L, trow, D, NK, m, pm_sum, work)
    new = {}
    for i in range(n):
        for j in range(entries):
            k = int(NK[trow[i], j])
            if k >= 0:
                new.setdefault(k, []).append(_ref(L[i], D[trow[i], j], m, pm_sum))
    assert keys.tolist() == sorted(new)
    for r, k in enumerate(keys.tolist()):
        assert rows[r].tolist() == np.array(new[k]).min(axis=0).tolist()
    assert (work == -1).all()


@pytest.mark.parametrize("seed", range(4))
def test_backward_pass_takes_the_least_over_each_keys_entries(seed):
    # one level of the key graph's backward pass: per key, the least (tau + lambda s) + H of the
    # next level over its table's entries; a new key not kept there (or -1) reads the inf row
    rng = np.random.default_rng(200 + seed)
    nkeys, entries, n_keys, nnext = int(rng.integers(1, 8)), int(rng.integers(1, 6)), 20, int(rng.integers(1, 6))
    D, NK = _rand_arena(rng, int(rng.integers(1, 10)), entries, n_keys)
    D[:, :, [DT, OPT, S_N]] = rng.integers(0, 10**6, (len(D), entries, 3))
    trow = rng.integers(0, len(D), nkeys)
    next_row = np.full(n_keys, -1, dtype=np.int64)
    kept = rng.choice(n_keys, nnext, replace=False)
    next_row[kept] = np.arange(nnext)
    lams = np.r_[0.0, rng.random(4)]
    Hn = np.vstack([rng.random((nnext, len(lams))) * 1e6, np.full((1, len(lams)), np.inf)])
    Mn = np.r_[rng.random(nnext) * 1e6, np.inf]
    m = int(rng.integers(1, 9))
    H, M = graph_back(trow, D, NK, m, lams, Hn, Mn, next_row)
    for r in range(nkeys):
        t = trow[r]
        q = [nnext if NK[t, e] < 0 or next_row[NK[t, e]] < 0 else next_row[NK[t, e]] for e in range(entries)]
        for li, lam in enumerate(lams):
            assert H[r, li] == min(float(m * D[t, e, DT] + D[t, e, OPT]) + float(D[t, e, S_N]) * lam + Hn[q[e], li]
                                   for e in range(entries))
        assert M[r] == min(float(D[t, e, S_N]) + Mn[q[e]] for e in range(entries))
    assert np.isinf(H[nkeys]).all() and np.isinf(M[nkeys])


def test_table_arena_keeps_each_keys_table_through_growth():
    rng = np.random.default_rng(7)
    arena = TableArena(np.array([3, 1, 4]))
    want = {}
    kids = rng.choice(5000, 300, replace=False)                # past the initial 16 rows and 64 ids
    lo = 0
    while lo < len(kids):                                       # rows added one to 40 at a time
        chunk = kids[lo:lo + int(rng.integers(1, 41))]
        nks, ds = rng.integers(0, 99, (len(chunk), 3)), rng.integers(-50, 50, (len(chunk), 3, NDELTA))
        assert arena.missing(chunk).tolist() == chunk.tolist()
        arena.add_rows(chunk, nks, ds)
        want.update({int(kid): (nks[r], ds[r]) for r, kid in enumerate(chunk)})
        lo += len(chunk)
    ask = np.array(list(want)[::-7] + [5001, 5002])
    assert arena.missing(ask).tolist() == [5001, 5002]
    D, NK, CODE = arena.gather(ask[:-2])
    for r, kid in enumerate(ask[:-2]):
        assert NK[r].tolist() == want[int(kid)][0].tolist() and D[r].tolist() == want[int(kid)][1].tolist()
        assert CODE[r].tolist() == [3, 1, 4]
        t = arena.table(int(kid))
        assert t.new_keys.tolist() == want[int(kid)][0].tolist() and t.codes.tolist() == [3, 1, 4]
    NK[:] = -1                                                 # the gathered copy is the caller's
    assert arena.gather(ask[:1])[1].tolist() == [want[int(ask[0])][0].tolist()]


@pytest.mark.parametrize("seed", range(6))
def test_unique_inverse_is_numpys_sorted_or_not(seed):
    rng = np.random.default_rng(200 + seed)
    K = rng.integers(0, 30, int(rng.integers(0, 100)))
    far = rng.integers(0, 10**9, int(rng.integers(1, 50)))          # ids too sparse to mark
    for keys in (K, np.sort(K), far, np.r_[far, 10**6, 0]):
        u, inv = unique_inverse(keys)
        u0, inv0 = np.unique(keys, return_inverse=True)
        assert u.tolist() == u0.tolist() and inv.tolist() == inv0.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_sort_by_key_is_lexsort_of_key_then_every_column(seed):
    """Stable, ties on key and time broken by the other columns, exact duplicates by position."""
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(0, 400))
    C = rng.integers(0, int(rng.integers(1, 4)), (n, NCOL))
    if n > 2:
        C[: n // 3] = C[0]                                       # duplicate labels
    K = rng.integers(0, int(rng.integers(1, 6)), n)
    want = np.lexsort(tuple(C[:, c] for c in range(NCOL - 1, -1, -1)) + (K,))
    assert sort_by_key(C, K).tolist() == want.tolist()


@pytest.mark.parametrize("pm_sum", [False, True])
def test_update_chain_is_update_applied_in_turn(pm_sum):
    """labelfold.update_chain (dp.Engine.path's labels) returns the label before each delta row and
    after the last, as labels.update one row at a time."""
    rng = np.random.default_rng(3)
    L0 = _rand(rng, (1, NCOL), LABEL_NEG)
    D = _rand(rng, (40, NDELTA), DELTA_NEG)
    chain = update_chain(L0, D.reshape(40, 1, NDELTA), 3, pm_sum)
    want = [L0]
    for d in D:
        want.append(update(want[-1], d[None, :], 3, pm_sum))
    assert np.array_equal(chain, np.vstack(want))
