"""planner/front.py against hand-computed numbers: the staircase of a front and the line test."""

import numpy as np

from osdp_sim.costmodel.fast import MEM_Q, TIME_Q
from osdp_sim.planner.front import FrontStairs, lambda_pruned
from osdp_sim.planner.labels import NCOL, T, U


def _stairs():
    # two plans found: 1 GiB estimate() peak at 10 samples/s, 2 GiB at 20 samples/s; no
    # fragmentation or context, so a label peak q is q * MEM_Q bytes
    gib = 2.0 ** 30
    return FrontStairs.of(np.array([gib, 2 * gib]), np.array([10.0, 20.0]), 40.0, 4 * gib / MEM_Q, 0.0, 0.0)


def test_stairs_times_steps_and_upper_ends():
    st = _stairs()
    gib_q = 2.0 ** 30 / MEM_Q
    # 40 samples per iteration: 4 s at 10 samples/s, 2 s at 20
    assert np.allclose(st.time_q * TIME_Q, [4.0, 2.0])
    # step 0 ends at the next plan's peak (rounded up by the slack and one unit), step 1 at the limit
    assert st.upper_q[0] == 2 * gib_q * (1 + 1e-9) + 1.0
    assert st.upper_q[1] == 4 * gib_q
    assert list(st.step_of(np.array([0.5, 1.0, 1.5, 2.0, 3.0]) * gib_q)) == [-1, 0, 0, 1, 1]
    thr = st.threshold(np.array([0.5, 1.5, 3.0]) * gib_q) * TIME_Q
    assert np.isinf(thr[0]) and np.allclose(thr[1:], [4.0, 2.0])


def test_suffix_max_by_hand():
    st = FrontStairs(np.array([1.0, 2.0]), np.array([100.0, 60.0]), np.array([10.0, 30.0]), 0.0, 0.0)
    sm = st.suffix_max(np.array([0.0, 1.0, 3.0]))
    # lambda 0: max(100, 60), 60; lambda 1: max(110, 90), 90; lambda 3: max(130, 150), 150
    assert sm.tolist() == [[100.0, 110.0, 150.0], [60.0, 90.0, 150.0]]


def test_line_test_prunes_only_above_every_step():
    st = FrontStairs(np.array([1.0, 2.0]), np.array([100.0, 60.0]), np.array([10.0, 30.0]), 0.0, 0.0)
    lams = np.array([3.0])
    sm = st.suffix_max(lams)
    C = np.zeros((3, NCOL), dtype=np.int64)
    # t + c + 3 U against 150 on step 0: label 0 is 40 + 50 + 3 * 20 = 150 (pruned, a tie),
    # label 1 one unit less (kept); label 2 is on no step (kept whatever its bound)
    C[:, T] = [40, 39, 1000]
    C[:, U] = [20, 20, 20]
    KC = np.array([[50.0]])
    step = np.array([0, 0, -1], dtype=np.int64)
    kinv = np.zeros(3, dtype=np.int64)
    no_rows = np.zeros(0, dtype=np.int64)
    no_h = np.zeros((0, 0))
    out = lambda_pruned(C, step, kinv, KC, lams, sm, no_rows, no_h, np.zeros(0), no_h, False, 0.0, 0.0)
    assert out.tolist() == [True, False, False]
    # the margins loosen the test: a time margin of 1 keeps label 0 as well
    out = lambda_pruned(C, step, kinv, KC, lams, sm, no_rows, no_h, np.zeros(0), no_h, False, 0.0, 1.0)
    assert out.tolist() == [False, False, False]
    # the graph's terms H (row per label) prune on their own lambdas
    H = np.array([[200.0]])
    rows = np.zeros(3, dtype=np.int64)
    out = lambda_pruned(C, step, kinv, np.array([[0.0]]), lams, sm, rows, H, np.array([0.0]),
                        st.suffix_max(np.array([0.0])), True, 0.0, 0.0)
    # lambda 0 against max(100, 60) = 100: 39 + 200 >= 100 prunes labels 0 and 1
    assert out.tolist() == [True, True, False]
