"""The compiled settling of a decision's labels (planner/labelsettle.py) against the separate
steps it replaces in dp.Engine._expand: the bounds (planner/labelbounds.py, checked here against
their definition in numpy), the pruning, the sort (np.lexsort) and dp.pareto_by_key."""

import numpy as np
import pytest

from osdp_sim.planner.dp import pareto_by_key
from osdp_sim.planner.labelbounds import label_bounds
from osdp_sim.planner.labels import NCOL, T, U
from osdp_sim.planner.labelsettle import settle, sort_rows

J, LAMS = 6, 5


def _instance(seed: int, use_graph: bool):
    """Labels with many ties (small values, duplicated rows), their key rows, graph rows and the
    bound arrays; keys 0..nkeys-1 with one key-term row each."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 600))
    nkeys = int(rng.integers(1, 12))
    C = rng.integers(0, int(rng.integers(2, 6)), (n, NCOL)).astype(np.int64)
    C[:, T] = rng.integers(0, 40, n)
    C[:, U] = rng.integers(0, 60, n)
    if n > 3:
        C[: n // 4] = C[1]                                        # exact duplicates
    CK = rng.integers(0, nkeys, n).astype(np.int64)
    kinv = CK.copy()                                              # key k has key-term row k
    KC = rng.uniform(-20, 40, (nkeys, J))
    KM = rng.uniform(0, 30, nkeys)
    j_lam = np.sort(rng.uniform(0, 0.5, J))
    j_lam[0] = 0.0
    nrows = int(rng.integers(1, 8))
    H = rng.uniform(-20, 45, (nrows + 1, LAMS))
    H[nrows] = np.inf                                             # the row of keys the graph dropped
    Mg = rng.uniform(0, 35, nrows + 1)
    lams = np.concatenate([[0.0], np.sort(rng.uniform(0.01, 0.6, LAMS - 1))])
    rows = rng.integers(0, nrows + 1, n).astype(np.int64) if use_graph else np.zeros(0, dtype=np.int64)
    return C, CK, kinv, KC, KM, j_lam, H, Mg, lams, rows


def _definition(C, kinv, KC, KM, j_lam, pq_max, finite, m_margin, t_margin, H, rows, lams, Mg, use_graph):
    """The bounds as Engine.lower_bounds defines them, in numpy."""
    u = C[:, U].astype(float)
    mem = u + KM[kinv] - m_margin
    if finite:
        budget = np.maximum(pq_max - u + m_margin, 0.0)
        lb = np.max(KC[kinv] - j_lam[None, :] * budget[:, None], axis=1)
    else:
        lb = np.max(np.where(j_lam[None, :] == 0.0, KC[kinv], -np.inf), axis=1)
    if use_graph:
        if finite:
            bg = np.maximum(pq_max - (u - m_margin), 0.0)
            lg = np.max(H[rows] - bg[:, None] * lams[None, :], axis=1)
        else:
            lg = H[rows, 0]
        lb = np.maximum(lb, lg)
        mem = np.maximum(mem, u + Mg[rows] - m_margin)
    return C[:, T].astype(float) + lb - t_margin, mem


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("use_graph", [False, True], ids=["separable", "graph"])
@pytest.mark.parametrize("finite", [False, True], ids=["no-limit", "limit"])
def test_label_bounds_are_their_definition_and_stop_only_past_the_threshold(seed, use_graph, finite):
    """Bit for bit the numpy definition with stop_at = inf; with a threshold, every bound below
    it exact and every bound at or above it returned at or above it (so pruning is unchanged)."""
    C, _CK, kinv, KC, KM, j_lam, H, Mg, lams, rows = _instance(100 + seed, use_graph)
    pq_max = 70.0 if finite else 0.0
    args = (C, kinv, KC, KM, j_lam, pq_max, finite, 0.5, 0.25, H, rows, lams, Mg, use_graph)
    want_lb, want_mem = _definition(*args)
    lb, mem = label_bounds(*args, np.inf)
    assert np.array_equal(lb, want_lb) and np.array_equal(mem, want_mem)
    thr = float(np.median(want_lb[np.isfinite(want_lb)])) if np.isfinite(want_lb).any() else 0.0
    lb_s, mem_s = label_bounds(*args, thr)
    below = want_lb < thr
    assert np.array_equal(lb_s[below], want_lb[below]) and np.all(lb_s[~below] >= thr)
    assert np.array_equal(mem_s, want_mem)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("first_col", [0, 1])
def test_sort_rows_is_lexsort_by_key_then_columns(seed, first_col):
    """Stable; from column 1 (the least-memory search, time zeroed) when first_col is 1."""
    C, CK, kinv, _KC, KM, *_ = _instance(200 + seed, False)
    rng = np.random.default_rng(seed)
    if seed % 2:                                                  # runs long enough to be merged
        C[:, T] = rng.integers(0, 2, len(C))
    idx = np.flatnonzero(rng.random(len(C)) < 0.7).astype(np.int64)
    cols = tuple(C[idx, c] for c in range(NCOL - 1, first_col - 1, -1))
    want = idx[np.lexsort(cols + (CK[idx],))]
    assert sort_rows(C, kinv, len(KM), idx, first_col).tolist() == want.tolist()


def _separate_steps(C, CK, kinv, rows, KC, KM, j_lam, pq_max, finite, H, lams, Mg, use_graph, thr_q, memory_only,
                    top_k):
    """dp.Engine._expand's steps after the expansion, as it runs them without labelsettle."""
    lb, mem = label_bounds(C, kinv, KC, KM, j_lam, pq_max, finite, 0.5, 0.25, H, rows, lams, Mg, use_graph, np.inf)
    ok_mem = (mem <= pq_max) if finite else np.ones(len(C), dtype=bool)
    ok_t = lb < thr_q
    live = np.flatnonzero(ok_mem & ok_t)
    rank = (mem if memory_only else lb)[live]
    Cl, CKl = C[live].copy(), CK[live]
    if memory_only:
        Cl[:, T] = 0
    order = np.lexsort(tuple(Cl[:, c] for c in range(NCOL - 1, -1, -1)) + (CKl,))     # stable
    keep = pareto_by_key(Cl[order], CKl[order], top_k)
    return (live[order][keep], rank[order][keep], int(np.count_nonzero(~ok_mem)),
            int(np.count_nonzero(ok_mem & ~ok_t)), int(len(live) - np.count_nonzero(keep)))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("use_graph", [False, True], ids=["separable", "graph"])
@pytest.mark.parametrize("memory_only", [False, True], ids=["time", "memory-only"])
@pytest.mark.parametrize("top_k", [1, 3])
def test_settle_keeps_what_the_separate_steps_keep(seed, use_graph, memory_only, top_k):
    """The same labels in the same order, the same beam ranks and the same counts of labels
    pruned by memory, by time and dominated, with and without a limit and a threshold."""
    C, CK, kinv, KC, KM, j_lam, H, Mg, lams, rows = _instance(300 + seed, use_graph)
    rng = np.random.default_rng(seed)
    finite = bool(seed % 3)
    pq_max = float(rng.uniform(40, 90)) if finite else np.inf
    thr_q = float(rng.uniform(20, 80)) if seed % 4 else np.inf
    got = settle(C, kinv, rows, KC, KM, j_lam, pq_max if finite else 0.0, finite, 0.5, 0.25, H, lams, Mg,
                 use_graph, thr_q, memory_only, top_k)
    want = _separate_steps(C, CK, kinv, rows, KC, KM, j_lam, pq_max if finite else 0.0, finite, H, lams, Mg,
                           use_graph, thr_q, memory_only, top_k)
    assert got[0].tolist() == want[0].tolist()
    assert np.array_equal(got[1], want[1])
    assert got[2:] == want[2:]


def test_the_instances_exercise_every_outcome():
    """Across the seeds above some labels are pruned by memory, some by time, some dominated and
    some kept (else the comparison would not test those paths)."""
    totals = np.zeros(4, dtype=np.int64)
    for seed in range(12):
        C, CK, kinv, KC, KM, j_lam, H, Mg, lams, rows = _instance(300 + seed, True)
        sel, _rank, n_mem, n_time, n_dom = settle(C, kinv, rows, KC, KM, j_lam, 60.0, True, 0.5, 0.25, H, lams,
                                                  Mg, True, 50.0, False, 1)
        totals += [n_mem, n_time, n_dom, len(sel)]
    assert np.all(totals > 0), totals


def test_a_search_with_the_dominance_in_chunks_returns_the_same(monkeypatch):
    """Past dp.PARETO_CHUNK_ROWS labels a decision prunes and sorts in one call and filters
    dominance in chunks of keys (deadline checks between them); with the limit at 3 labels every
    decision takes that path, and the search returns the same plan, prediction and node count."""
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.model.families import BUILTIN
    from osdp_sim.model.spec import build_spec
    from osdp_sim.planner import dp
    from osdp_sim.planner.bnb import search
    from osdp_sim.planner.space import SearchSpace

    spec, hw = build_spec(BUILTIN["gpt2-124m"]), load_profile("titan8")

    def run():
        r = search(spec, hw, 2 * 2**30, SearchSpace(splits=(1, 2)), time_limit_s=60, top_k=2)
        return r.status, r.nodes, r.plan, r.prediction.samples_per_s, [t.plan for t in r.top]

    whole = run()
    calls = []
    real = dp.pareto_by_key
    monkeypatch.setattr(dp, "PARETO_CHUNK_ROWS", 3)
    monkeypatch.setattr(dp, "pareto_by_key", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    chunked = run()
    assert whole[0] == "optimal" and chunked == whole
    assert sum(n > 3 for n in calls) > 10                 # the chunked path ran, on many decisions
