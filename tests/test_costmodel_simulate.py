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


def _exposed_by_scan(tasks):
    """The definition: every compute interval scanned from the first, for every comm task."""
    busy = sorted((t.start_s, t.end_s) for t in tasks if t.stream == "compute" and t.end_s > t.start_s)
    out = {}
    for i, t in enumerate(tasks):
        if t.stream == "comm":
            covered = sum(max(0.0, min(b, t.end_s) - max(a, t.start_s)) for a, b in busy)
            out[i] = max(0.0, (t.end_s - t.start_s) - covered)
    return out


@pytest.mark.parametrize("strategy,accum", [("zero3", 1), ("zero2", 2), ("ddp", 1)])
def test_exposed_comm_matches_a_full_scan_on_a_real_timeline(strategy, accum):
    # exposed_comm_s bisects to the first compute interval a collective can overlap (linear in
    # layers, not quadratic); on a 40-layer timeline it must equal the scan over every interval.
    from osdp_sim.costmodel import estimate
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.model.config import ModelConfig
    from osdp_sim.model.spec import build_spec
    from osdp_sim.plan import uniform_plan
    cfg = ModelConfig(name="l40", family="llama", n_layers=40, hidden=64, n_heads=4, n_kv_heads=2,
                      ffn_hidden=172, vocab_size=100, seq_len=32, tied_head=False)
    hw = load_profile("cpu-2core")
    plan = uniform_plan(cfg, strategy, devices=2, micro_batch=1, grad_accum=accum)
    tasks = estimate(build_spec(cfg), hw, plan).timeline
    assert sum(t.stream == "comm" for t in tasks) > 40
    exposed = exposed_comm_s(tasks)
    assert exposed.keys() == _exposed_by_scan(tasks).keys()
    for i, v in _exposed_by_scan(tasks).items():
        assert exposed[i] == pytest.approx(v, abs=1e-12)
    assert 0 < sum(exposed.values()) < sum(t.end_s - t.start_s for t in tasks if t.stream == "comm")


def test_exposed_comm_with_gaps_and_zero_length_compute():
    t = [Task("C0", "compute", 0, "fwd", start_s=0.0, end_s=0.0),
         Task("C1", "compute", 1, "fwd", start_s=1.0, end_s=2.0),
         Task("C2", "compute", 1, "fwd", start_s=4.0, end_s=5.0),
         Task("A0", "comm", 1, "all_gather", start_s=0.0, end_s=1.5),     # 1.0 exposed
         Task("A1", "comm", 1, "all_gather", start_s=2.0, end_s=4.5),     # 2.0 exposed
         Task("A2", "comm", 1, "all_gather", start_s=6.0, end_s=7.0)]     # after every compute
    assert exposed_comm_s(t) == {3: pytest.approx(1.0), 4: pytest.approx(2.0), 5: pytest.approx(1.0)}
