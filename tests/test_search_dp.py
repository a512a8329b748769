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
