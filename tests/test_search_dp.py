"""dp.pareto_by_key, the dominance filter of the exact search, against its definition."""

import numpy as np
import pytest

from osdp_sim.planner.dp import pareto_by_key


def _sorted_instance(rng, n, ncol, nkeys, span):
    C = rng.integers(0, span, size=(n, ncol))
    CK = rng.integers(0, nkeys, size=n)
    order = np.lexsort(tuple(C[:, c] for c in range(ncol - 1, -1, -1)) + (CK,))
    return C[order], CK[order]


@pytest.mark.parametrize("seed", range(30))
def test_keeps_exactly_the_rows_no_earlier_row_of_their_key_dominates(seed):
    # few distinct values: many ties, equal rows and long chains of dominated rows
    rng = np.random.default_rng(seed)
    C, CK = _sorted_instance(rng, int(rng.integers(2, 400)), 7, int(rng.integers(1, 6)), int(rng.integers(2, 6)))
    keep = pareto_by_key(C, CK, 1)
    for i in range(len(C)):
        dominated = any(CK[j] == CK[i] and np.all(C[j] <= C[i]) for j in range(i))
        assert keep[i] == (not dominated)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("top_k", [2, 3])
def test_top_k_keeps_the_rows_fewer_than_k_kept_rows_of_their_key_dominate(seed, top_k):
    rng = np.random.default_rng(100 + seed)
    C, CK = _sorted_instance(rng, int(rng.integers(2, 300)), 7, int(rng.integers(1, 6)), int(rng.integers(2, 6)))
    keep = pareto_by_key(C, CK, top_k)
    for i in range(len(C)):
        dominators = sum(1 for j in range(i) if keep[j] and CK[j] == CK[i] and np.all(C[j] <= C[i]))
        assert keep[i] == (dominators < top_k)


def test_checkpoint_markers_intern_by_value_and_never_equal_other_keys():
    """CkMlpDone and DeferredMlp (keystore.py) are values: equal markers share one id, markers of
    different kinds, inner keys or choices do not, and neither equals a plain key or a tuple."""
    from osdp_sim.planner.bounds import KEY_CKMLP_DONE, KEY_DEFERRED, KEY_PLAIN
    from osdp_sim.planner.keystore import CkMlpDone, DeferredMlp, KeyStore
    store = KeyStore()
    plain = store.intern((None, ()))
    done, deferred = store.intern(CkMlpDone(plain)), store.intern(DeferredMlp(plain, 2))
    assert len({plain, done, deferred}) == 3
    assert store.intern(CkMlpDone(plain)) == done and store.intern(DeferredMlp(plain, 2)) == deferred
    assert store.intern(DeferredMlp(plain, 1)) not in (plain, done, deferred)
    assert CkMlpDone(plain) != (plain,) and DeferredMlp(plain, 2) != (plain, 2)
    assert store.rows[[plain, done, deferred], 0].tolist() == [KEY_PLAIN, KEY_CKMLP_DONE, KEY_DEFERRED]
    assert store.rows[deferred, -1] == 2
