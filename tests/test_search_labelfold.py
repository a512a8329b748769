"""The compiled label expansion and key-graph passes (planner/labelfold.py) against plain
Python references: fast.apply per (label, table entry), and per-key minima computed by hand."""

import numpy as np
import pytest

from osdp_sim.costmodel.fast import NEG, Label, StageOut, apply
from osdp_sim.planner.keygraph import _merge_min
from osdp_sim.planner.labelfold import graph_back
from osdp_sim.planner.labels import NCOL, NDELTA, expand, padded, unique_inverse, update


def _rand(rng, shape, neg_cols=()):
    """Random rows; NEG ("no event") in some rows of the columns that may hold it."""
    x = rng.integers(-10**12, 10**12, shape)
    for c in neg_cols:
        x[..., c][rng.random(shape[:-1]) < 0.2] = NEG
    return x


LABEL_NEG = (5, 6)                  # m1, m2
DELTA_NEG = (3, 4, 8, 9)            # o_v, o_y, o_m1, o_m2


def _ref(lrow, drow, m, pm_sum):
    lab = Label(*map(int, lrow))
    d = list(map(int, drow))
    out = StageOut(None, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11])
    a = apply(lab, out, m, pm_sum)
    return [a.t, a.u, a.v, a.y, a.pm, a.m1, a.m2]


@pytest.mark.parametrize("seed", range(4))
def test_expand_is_fast_apply_on_every_taken_entry_in_label_order(seed):
    rng = np.random.default_rng(seed)
    nkeys, n = int(rng.integers(1, 6)), int(rng.integers(0, 30))
    tabs = []
    for _ in range(nkeys):
        k = int(rng.integers(1, 5))
        tabs.append((rng.integers(0, 9, k), rng.integers(0, 40, k), _rand(rng, (k, NDELTA), DELTA_NEG)))
    D, NK, CODE = padded(tabs)
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
    U = update(L, D[inv, 0], m, pm_sum)
    assert [r.tolist() for r in U] == [_ref(L[i], D[inv[i], 0], m, pm_sum) for i in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_least_row_per_key_and_backward_pass_match_loops(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 200))
    C, CK = _rand(rng, (n, NCOL), LABEL_NEG), rng.integers(0, 20, n)
    rows, keys = _merge_min(C, CK)
    assert keys.tolist() == sorted(set(CK.tolist()))
    for r, k in enumerate(keys):
        assert rows[r].tolist() == C[CK == k].min(axis=0).tolist()
    # one level of the key graph's backward pass: min over each key's entries
    nkeys, nnext, lams = int(rng.integers(1, 8)), int(rng.integers(1, 6)), np.r_[0.0, rng.random(4)]
    sizes = rng.integers(1, 5, nkeys)
    ds = rng.integers(0, 10**6, (int(sizes.sum()), NDELTA))
    nxt = rng.integers(0, nnext + 1, len(ds))                 # nnext: the next level's inf row
    Hn = np.vstack([rng.random((nnext, len(lams))) * 1e6, np.full((1, len(lams)), np.inf)])
    Mn = np.r_[rng.random(nnext) * 1e6, np.inf]
    m = int(rng.integers(1, 9))
    H, M = graph_back(ds, nxt, np.r_[0, np.cumsum(sizes)].astype(np.int64), m, lams, Hn, Mn)
    e = 0
    for r in range(nkeys):
        es = range(e, e + sizes[r])
        for li, lam in enumerate(lams):
            assert H[r, li] == min(float(m * ds[x, 0] + ds[x, 1]) + float(ds[x, 2]) * lam + Hn[nxt[x], li] for x in es)
        assert M[r] == min(float(ds[x, 2]) + Mn[nxt[x]] for x in es)
        e += sizes[r]
    assert np.isinf(H[nkeys]).all() and np.isinf(M[nkeys])


@pytest.mark.parametrize("seed", range(6))
def test_unique_inverse_is_numpys_sorted_or_not(seed):
    rng = np.random.default_rng(200 + seed)
    K = rng.integers(0, 30, int(rng.integers(0, 100)))
    for keys in (K, np.sort(K)):
        u, inv = unique_inverse(keys)
        u0, inv0 = np.unique(keys, return_inverse=True)
        assert u.tolist() == u0.tolist() and inv.tolist() == inv0.tolist()
