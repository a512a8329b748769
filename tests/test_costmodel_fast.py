"""fast_estimate (the search's incremental form of the cost model) equals estimate()."""

import random
from dataclasses import replace

import pytest
from searchfixtures import random_hw, random_plan, random_spec

from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.fast import fast_estimate, run_compute, seg
from osdp_sim.costmodel.memory import peak_memory
from osdp_sim.costmodel.schedule import MemEvent
from osdp_sim.costmodel.simulate import Task, simulate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import GroupChoice


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


def test_run_compute_time_depends_on_the_queue_only_through_its_total_work():
    """What the merged key graph (planner/merged.py) rests on: the time until the next compute task
    and the work left queued are the same for a queue and for one item of its total work, and
    never larger for less work (docs/search.md, "The merged key graph")."""
    rng = random.Random(5)
    for _ in range(2000):
        s = rng.choice([1.0, 1.3, 2.0, 3.5])
        queue = []
        for i in range(rng.randint(0, 6)):
            w = rng.choice([0.0, rng.uniform(0.01, 2.0)])
            started = i == 0 and w > 0 and rng.random() < 0.5
            rem = w * rng.uniform(0.1, 1.0) if started else w
            queue.append((rem, 0.0 if started else rng.uniform(0, 5), rng.uniform(0, 5), rng.uniform(0, 5), w, started))
        new = tuple((rng.choice([0.0, rng.uniform(0.01, 2.0)]), rng.uniform(0, 5), rng.uniform(0, 5), 0.0,
                     rng.random() < 0.4) for _ in range(rng.randint(0, 4)))
        barrier = rng.randrange(len(new)) if new and rng.random() < 0.7 else None
        c = rng.uniform(0.05, 3.0)
        total = sum(q[0] for q in queue)

        def run(q):
            dur, _top, _net, left = run_compute(c, (), 0.0, tuple(q), new, barrier, s)
            return dur, sum(x[0] for x in left)
        dur, left = run(queue)
        one = [(total, 0.0, 0.0, 0.0, total, True)] if total > 0 else []
        assert run(one) == (pytest.approx(dur, rel=1e-12, abs=1e-12), pytest.approx(left, rel=1e-12, abs=1e-12))
        less = total * rng.random()
        d2, l2 = run([(less, 0.0, 0.0, 0.0, less, True)] if less > 0 else [])
        assert d2 <= dur + 1e-12 and l2 <= left + 1e-12


def _simulated(c, start_deltas, end_delta, queue, new_items, barrier, s):
    """run_compute's task as a task graph for simulate() and peak_memory(): the queue's items ready
    at time 0, the new ones issued when the compute task starts (or ready when it ends), and a next
    compute task waiting for the barrier. Returns (its start, the peak and net of the events before
    it, the items not finished by then)."""
    tasks, events = [Task("c", "compute", c, "bwd")], []
    events += [MemEvent(0, "start", d, "activations") for d in start_deltas if d]
    if end_delta:
        events.append(MemEvent(0, "end", end_delta, "activations"))
    rows = [(rem, 0.0 if started else a0, fe, ae, ()) for rem, a0, fe, ae, _w, started in queue]
    rows += [(w, a0, fe, ae, ((0, "end" if ready_at_end else "start"),)) for w, a0, fe, ae, ready_at_end in new_items]
    for w, a0, fe, ae, deps in rows:
        i = len(tasks)
        tasks.append(Task(f"q{i}", "comm", w, "reduce_scatter", deps))
        events += [MemEvent(i, "start", a0, "grads")] if a0 else []
        events += [MemEvent(i, at, d, "grads") for at, d in (("end", -fe), ("end", ae)) if d]
    deps = ((len(queue) + 1 + barrier, "end"),) if barrier is not None else ()
    tasks.append(Task("next", "compute", 1.0, "bwd", deps))
    simulate(tasks, s)
    t_next = tasks[-1].start_s
    # what happens before the next compute task starts (an item starting with it is left for it)
    seen = [e for e in events if tasks[e.task].start_s < t_next and
            (e.at == "start" or tasks[e.task].end_s <= t_next)]
    peak = peak_memory(tasks, seen).peak_bytes
    left = sum(1 for t in tasks[1:-1] if not (t.start_s < t_next and t.end_s <= t_next))
    return t_next, peak, sum(e.delta_bytes for e in seen), left


def test_run_compute_agrees_with_the_event_simulator_on_hand_built_queues():
    """The compiled fold (costmodel/fold.py) against simulate() + peak_memory(), the reference."""
    rng = random.Random(11)
    mib = 2.0 ** 20
    for _ in range(400):
        s = rng.choice([1.0, 1.3, 2.0])
        queue = []
        for i in range(rng.randint(0, 4)):
            w = rng.choice([0.0, rng.uniform(0.01, 2.0)])
            started = i == 0 and w > 0 and rng.random() < 0.5
            rem = w * rng.uniform(0.1, 0.9) if started else w
            queue.append((rem, rng.uniform(0, 5) * mib, rng.uniform(0, 5) * mib, rng.uniform(0, 5) * mib, w, started))
        new = tuple((rng.choice([0.0, rng.uniform(0.01, 2.0)]), rng.uniform(0, 5) * mib, rng.uniform(0, 5) * mib,
                     rng.choice([0.0, mib]), rng.random() < 0.4) for _ in range(rng.randint(0, 3)))
        barrier = rng.randrange(len(new)) if new and rng.random() < 0.7 else None
        start = tuple(rng.uniform(-3, 3) * mib for _ in range(rng.randint(0, 2)))
        c, end = rng.uniform(0.05, 3.0), rng.choice([0.0, rng.uniform(-3, 3) * mib])
        dur, top, net, left = run_compute(c, start, end, tuple(queue), new, barrier, s)
        t_next, peak, net_sim, left_sim = _simulated(c, start, end, tuple(queue), new, barrier, s)
        assert dur == pytest.approx(t_next, rel=1e-12)
        assert max(top, 0.0) == pytest.approx(peak, rel=1e-9, abs=1e-3)
        assert net == pytest.approx(net_sim, rel=1e-9, abs=1e-3)
        assert len(left) == left_sim


HF_LIKE = {   # the structures whose transformers terms differ, at a size the test runs quickly
    "llama": with_overrides(BUILTIN["llama-tiny"], n_layers=3, implementation="hf"),
    "gemma": with_overrides(BUILTIN["llama-tiny"], n_layers=3, head_size=96, mlp_kind="geglu",
                            tied_head=True, implementation="hf"),
    "mixtral": with_overrides(BUILTIN["llama-tiny"], n_layers=3, n_experts=4, top_k=2,
                              fused_gate_up=True, implementation="hf"),
    "gpt2": with_overrides(BUILTIN["gpt2-tiny"], n_layers=3, implementation="hf"),
    "bert": with_overrides(BUILTIN["bert-tiny"], n_layers=3, implementation="hf"),
}


@pytest.mark.parametrize("name", HF_LIKE)
def test_per_forward_terms_match_estimate(name):
    """Descriptions with implementation 'hf' hold terms kept once per forward (rotary tables,
    position ids, Gemma's 1 + weight): fast_estimate charges them as estimate() does, and both
    charge them (a micro-batch of one sample keeps more than the per-token terms say)."""
    spec = build_spec(HF_LIKE[name])
    assert any(g.activations.bytes_per_forward(2) > 0 for g in spec.groups)
    hw = load_profile("titan8")
    rng = random.Random(11)
    for _ in range(6):
        plan = random_plan(rng, spec, hw)
        e, f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
        assert f.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)
        assert f.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
    # estimate() charges the per-forward bytes: zero them and the peak drops
    from osdp_sim.model.spec import Activations, ModelSpec
    plan = replace(random_plan(rng, spec, hw), checkpoint=(False,) * len(spec.blocks))
    per_token = ModelSpec(spec.config, tuple(replace(u, groups=tuple(
        replace(g, activations=Activations(g.activations.elems_per_token, g.activations.fixed_bytes_per_token))
        for g in u.groups)) for u in spec.units))
    assert estimate(per_token, hw, plan).peak_memory_bytes < estimate(spec, hw, plan).peak_memory_bytes


def _selective_spec(rng: random.Random, layers: int):
    """gpt2 (every Linear biased: addmm, nothing saved), llama (GQA, bias-free: mms saved) or
    qwen2-like (biased q/k/v: the MLP's mm count starts odd)."""
    kind = rng.choice(["gpt2", "llama", "qwen2"])
    if kind == "gpt2":
        return random_spec(rng, layers)
    cfg = with_overrides(BUILTIN["llama-tiny"], n_layers=layers, hidden=rng.choice([64, 128]),
                         seq_len=rng.choice([16, 64]), vocab_size=rng.choice([256, 2048]),
                         qkv_bias=kind == "qwen2")
    return build_spec(cfg)


@pytest.mark.parametrize("kind, seed", [("cuda", 2000 + s) for s in range(4)] + [("cpu", 3000)])
def test_random_plans_with_selective_blocks_match_estimate(kind, seed):
    rng = random.Random(seed)
    for _ in range(20):
        spec = _selective_spec(rng, rng.randint(1, 4))
        hw = random_hw(rng)
        hw = replace(hw, device=replace(hw.device, kind=kind))
        plan = random_plan(rng, spec, hw)
        sel = tuple(c and rng.random() < 0.6 for c in plan.checkpoint)
        choices = dict(plan.choices)
        for u in spec.blocks:               # check_selective: no split attention before an odd MLP
            if sel[u.index] and u.groups[1].mm_before % 2:
                choices[u.groups[0].plan_key] = GroupChoice("zero3")
        plan = replace(plan, choices=choices, selective=sel)
        e, f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
        assert f.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)
        assert f.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)


def test_the_compiled_overlap_segment_is_fast_seg():
    """fold.run_stages compiles fast.seg in (fold._seg); numba's cache of fold.py does not see a
    change to fast.py, so a stale cache would show here."""
    from osdp_sim.costmodel import fold
    rng = random.Random(7)
    cases = [(0.0, 2.0, 1.5), (2.0, 0.0, 1.5), (1.0, 1.0, 1.0)] + \
        [(rng.uniform(0, 3), rng.uniform(0, 3), rng.uniform(1, 3)) for _ in range(50)]
    for c, a, s in cases:
        assert fold._seg(c, a, s) == seg(c, a, s)
    assert seg(1.0, 3.0, 2.0) == 4.0              # 2 * 1 overlapped + 2 alone
