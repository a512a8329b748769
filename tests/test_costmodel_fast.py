"""fast_estimate (the search's incremental form of the cost model) equals estimate()."""

import random
from dataclasses import replace

import pytest
from searchfixtures import random_hw, random_plan, random_spec

from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.fast import fast_estimate, run_compute, seg
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec


def test_seg_overlap_formula():
    # both streams at 1/1.5 while overlapped: 2 s of compute and 1 s of gather take 1.5 + 1
    assert seg(2.0, 1.0, 1.5) == pytest.approx(2.5)
    assert seg(1.0, 0.0, 1.5) == 1.0


def test_run_compute_barrier_waits_behind_queued_reduction():
    # 1 s compute; 3 s reduction queued; the next task waits for a 1 s gather behind it (s = 1)
    dur, top, net, left = run_compute(1.0, (10.0,), -10.0, ((3.0, 0.0, 0.0, 0.0, 3.0, True),),
                                      ((1.0, 5.0, 0.0, 0.0, False),), 0, 1.0)
    assert dur == pytest.approx(4.0)
    assert top == pytest.approx(10.0)        # the gather's 5 bytes start after the compute freed 10
    assert net == pytest.approx(5.0)          # +10 - 10 + 5
    assert left == ()


def test_run_compute_passes_on_what_it_does_not_run():
    # s = 2: 1 s of compute beside a 3 s reduction both run at 1/2, so after 2 s the compute is
    # done and the reduction has 2 s left, passed on as started; the item behind it is untouched
    q = ((3.0, 0.0, 0.0, 0.0, 3.0, True), (1.0, 0.0, 0.0, 0.0, 1.0, False))
    dur, top, net, left = run_compute(1.0, (), 0.0, q, (), None, 2.0)
    assert dur == pytest.approx(2.0)
    assert left == ((pytest.approx(2.0), 0.0, 0.0, 0.0, 3.0, True), q[1])
    # a zero-work gather the next task waits for starts with that task, not in this one
    dur, top, net, left = run_compute(1.0, (), 0.0, (), ((0.0, 4.0, 0.0, 0.0, True),), 0, 1.0)
    assert (dur, net, left) == (1.0, 0.0, ((0.0, 4.0, 0.0, 0.0, 0.0, False),))


def test_run_compute_drains_the_queue_up_to_the_barrier():
    # s = 1: the compute (1 s) overlaps the first reduction (2 s); then the rest runs alone:
    # reduction 1 ends at 2 s, reduction 2 at 3 s, the gather (3 bytes) runs 3-4 s
    q = ((2.0, 0.0, 0.0, 0.0, 2.0, True), (1.0, 0.0, 0.0, 0.0, 1.0, False))
    dur, top, net, left = run_compute(1.0, (), 0.0, q, ((1.0, 3.0, 0.0, 0.0, False),), 0, 1.0)
    assert (dur, top, net, left) == (pytest.approx(4.0), 3.0, 3.0, ())


@pytest.mark.parametrize("kind, seed", [("cuda", s) for s in range(4)] + [("cpu", 1000 + s) for s in range(2)])
def test_random_plans_match_estimate(kind, seed):
    # CPU devices change the reduce buffers (gloo's copy) and the AdamW temporaries
    rng = random.Random(seed)
    for _ in range(20):
        spec = random_spec(rng, rng.randint(1, 4))
        hw = random_hw(rng)
        hw = replace(hw, device=replace(hw.device, kind=kind))
        plan = random_plan(rng, spec, hw)
        e, f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
        assert f.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)
        assert f.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
        assert f.samples_per_s == pytest.approx(e.samples_per_s, rel=1e-9)


def test_real_profile_and_model():
    hw = load_profile("titan8")
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=4))
    rng = random.Random(7)
    for _ in range(6):
        plan = random_plan(rng, spec, hw)
        e, f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
        assert f.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)
        assert f.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
