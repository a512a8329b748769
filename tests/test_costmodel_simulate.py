"""The two-stream simulation on small hand-built schedules whose critical path is known."""

import pytest

from osdp_sim.costmodel.simulate import ScheduleError, Task, exposed_comm_s, simulate


def test_prefetch_chain_forward():
    # AG0 exposed (2), then C0 (3) overlaps AG1 (4): C1 waits for AG1 -> starts at 6; ends 9.
    t = [Task("AG0", "comm", 2, "all_gather"),
         Task("C0", "compute", 3, "fwd", ((0, "end"),)),
         Task("AG1", "comm", 4, "all_gather", ((1, "start"),)),
         Task("C1", "compute", 3, "fwd", ((2, "end"),))]
    assert simulate(t) == pytest.approx(9.0)
    assert (t[3].start_s, t[3].end_s) == (6.0, 9.0)
    exposed = exposed_comm_s(t)
    assert exposed[0] == pytest.approx(2.0)      # nothing to hide the first gather behind
    assert exposed[2] == pytest.approx(1.0)      # 4 s gather under 3 s compute


def test_overlap_slowdown_window():
    # Both start together: window = max + (s - 1) * min = 5 + 0.5 * 3 = 6.5 with slowdown 1.5
    t = [Task("C", "compute", 3, "fwd"), Task("A", "comm", 5, "all_reduce")]
    assert simulate(t, slowdown=1.5) == pytest.approx(6.5)
    assert t[0].end_s == pytest.approx(4.5)      # compute stretched by 1.5 while overlapped


def test_comm_stream_is_fifo_and_serialises():
    # RS issued after C0 ends; AG issued at C0 start queues first; C1 needs AG.
    t = [Task("C0", "compute", 1, "bwd"),
         Task("AG", "comm", 2, "all_gather", ((0, "start"),)),
         Task("RS", "comm", 2, "reduce_scatter", ((0, "end"),)),
         Task("C1", "compute", 1, "bwd", ((1, "end"),))]
    assert simulate(t) == pytest.approx(4.0)     # AG 0-2, C1 2-3, RS 2-4
    assert t[2].start_s == pytest.approx(2.0)


def test_dependency_on_a_later_task_is_an_error():
    t = [Task("C0", "compute", 1, "fwd", ((1, "end"),)), Task("C1", "compute", 1, "fwd")]
    with pytest.raises(ScheduleError):
        simulate(t)


def test_zero_work_tasks_take_no_time():
    t = [Task("A", "comm", 0, "all_gather"), Task("C", "compute", 2, "fwd", ((0, "end"),))]
    assert simulate(t) == pytest.approx(2.0)
