"""The schedule's rules are written once (costmodel/rules.py): a term added there reaches both
evaluators, estimate()'s event simulation and the search's fold (fast_estimate)."""

import random

import pytest
from searchfixtures import random_hw, random_plan, random_spec

from osdp_sim.costmodel import estimate, rules
from osdp_sim.costmodel.fast import clear_caches, fast_estimate
from osdp_sim.costmodel.lowering import CommUnit, Step
from osdp_sim.costmodel.states import StateBytes
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import GroupChoice, Plan

MIB = 2.0 ** 20


def _unit(strategy: str, **kw) -> CommUnit:
    base = dict(name="u", plan_key="g", strategy=strategy, params=1e6,
                states=StateBytes(params=4e6 / 8, grads=4e6 / 8, optimizer=8e6 / 8),
                gathered_bytes=2e6, unsharded_grad_bytes=2e6, reduce_buffer_bytes=4e6,
                all_gather_s=0.01, reduce_s=0.02, reduce_kind="reduce_scatter", replica_all_reduce_s=0.0)
    base.update(kw)
    return CommUnit(**base)


def _step(**kw) -> Step:
    base = dict(name="s", unit=1, block=0, fwd_s=0.1, bwd_s=0.2, act_bytes=100.0, act_grad_bytes=30.0,
                fwd_temp_bytes=7.0, bwd_temp_bytes=5.0, recompute_s=0.09, sac_recompute_s=0.04,
                sac_saved_bytes=20.0)
    base.update(kw)
    return Step(**base)


def _b(deltas):
    return [(d.bytes, d.category) for d in deltas]


def test_backward_record_hand_computed():
    u, s = _unit("ddp", reduce_kind="all_reduce"), _step()
    t = rules.backward(s, u, allocates_copy=True, allocates_grad=True, frees_gathered=True)
    assert t.work_s == 0.2
    # the ddp copy (2e6) cast in its pre-backward, then the activation gradient + temporaries (35)
    assert _b(t.at_start) == [(2e6, "gathered_params"), (35.0, "temporaries")]
    assert _b(t.at_end) == [(-35.0, "temporaries"), (-100.0, "activations"), (2e6, "grads"),
                            (-2e6, "gathered_params")]
    t = rules.backward(s, _unit("zero3"), allocates_copy=True, allocates_grad=False, frees_gathered=False)
    assert _b(t.at_start) == [(35.0, "temporaries")]          # only a ddp unit casts a copy
    assert _b(t.at_end) == [(-35.0, "temporaries"), (-100.0, "activations")]


def test_forward_and_recompute_records_hand_computed():
    u, s = _unit("zero3"), _step()
    # unchecked: keeps its 100 B of activations, the 7 B logits only while it runs
    t = rules.forward(s, u, None, frees_gathered=True)
    assert _b(t.at_start) == [(100.0, "activations"), (7.0, "temporaries")]
    assert _b(t.at_end) == [(-7.0, "temporaries"), (-2e6, "gathered_params")]
    # first step of a selectively checkpointed block: the 60 B input, 20 B saved mm outputs, the
    # other 40 B of its activations live only inside the forward
    t = rules.forward(s, u, rules.Checkpointed(60.0, True), frees_gathered=False)
    assert _b(t.at_start) == [(60.0, "activations"), (20.0, "activations"), (40.0, "activations"),
                              (7.0, "temporaries")]
    assert rules.net_bytes(t.at_start + t.at_end) == 80.0
    # the recompute re-saves 2 x 100 B, gives back the 60 B input and (selective) 2 x 20 B saved
    rc = rules.recompute(3, (s, s), 60.0, True, copies=(_unit("ddp"), _unit("zero3")))
    assert rc.work_s == pytest.approx(0.08) and rc.name == "recompute block3"
    assert _b(rc.at_start) == [(2e6, "gathered_params"), (200.0, "activations"), (-60.0, "activations"),
                               (-40.0, "activations")]
    assert rules.recompute(3, (s,), 60.0, False).work_s == 0.09


def test_reductions_record_hand_computed():
    u = _unit("zero3", replica_all_reduce_s=0.005)
    rs, rep = rules.reductions(u, grads_resident=False)
    assert (rs.name, rs.kind, rs.work_s) == ("RS u", "reduce_scatter", 0.02)
    assert _b(rs.at_start) == [(4e6, "reduce_buffers")]
    # frees the buffer and the unsharded gradient, allocates the sharded one (4e6 / 8)
    assert _b(rs.at_end) == [(-4e6, "reduce_buffers"), (-2e6, "grads"), (5e5, "grads")]
    assert (rep.kind, rep.work_s, rep.at_start, rep.at_end) == ("all_reduce", 0.005, (), ())
    (rs,) = rules.reductions(_unit("zero2"), grads_resident=True)
    assert _b(rs.at_end) == [(-4e6, "reduce_buffers"), (-2e6, "grads")]


@pytest.fixture(autouse=True)
def _fresh_caches():
    # the cost model caches units and their records: a patched rule must not meet (or leave) them
    clear_caches()
    yield
    clear_caches()


def _wrap(monkeypatch, name, extra):
    orig = getattr(rules, name)
    monkeypatch.setattr(rules, name, lambda *a, **k: extra(orig(*a, **k)))
    clear_caches()


@pytest.mark.parametrize("seed", range(3))
def test_a_new_backward_temporary_reaches_both_evaluators(monkeypatch, seed):
    # a made-up 64 MiB workspace held by every backward step: written once, in rules.backward
    rng = random.Random(seed)
    spec = random_spec(rng, rng.randint(2, 4))
    hw = random_hw(rng)
    plan = random_plan(rng, spec, hw)
    before_e, before_f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
    _wrap(monkeypatch, "backward", lambda t: t._replace(at_start=t.at_start + (rules.Delta(64 * MIB, rules.TEMPORARIES),),
                                                     at_end=t.at_end + (rules.Delta(-64 * MIB, rules.TEMPORARIES),)))
    after_e, after_f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
    assert after_e.peak_memory_bytes > before_e.peak_memory_bytes
    assert after_f.peak_memory_bytes == pytest.approx(after_e.peak_memory_bytes, rel=1e-9)
    assert before_f.peak_memory_bytes == pytest.approx(before_e.peak_memory_bytes, rel=1e-9)


def test_a_new_collective_reaches_both_evaluators(monkeypatch):
    # a made-up 5 ms collective after every reduction (say, a gradient-norm all-reduce)
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=3))
    hw = load_profile("titan8")
    choices = {g.plan_key: GroupChoice("zero3") for g in spec.groups}
    plan = Plan(model=spec.config, devices=8, micro_batch=2, choices=choices, checkpoint=(True, False, True))
    before = estimate(spec, hw, plan)
    _wrap(monkeypatch, "reductions",
          lambda cs: cs + (rules.Collective("norm", "all_reduce", 0.005),))
    after_e, after_f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
    assert after_e.iteration_time_s > before.iteration_time_s + 0.005      # the root's is exposed
    assert after_f.iteration_time_s == pytest.approx(after_e.iteration_time_s, rel=1e-9)


def test_a_new_forward_term_reaches_both_evaluators(monkeypatch):
    # a made-up 32 MiB kept per forward step (say, an fp32 copy of the block input)
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=3))
    hw = load_profile("titan8")
    choices = {g.plan_key: GroupChoice(s) for g, s in zip(spec.groups, ["zero2", "zero3", "ddp"] * 9)}
    plan = Plan(model=spec.config, devices=8, micro_batch=1, choices=choices, checkpoint=(False, True, False))
    before = estimate(spec, hw, plan)
    _wrap(monkeypatch, "forward",
          lambda t: t._replace(at_start=t.at_start + (rules.Delta(32 * MIB, rules.ACTIVATIONS),)))
    after_e, after_f = estimate(spec, hw, plan), fast_estimate(spec, hw, plan)
    assert after_e.peak_memory_bytes > before.peak_memory_bytes + 32 * MIB
    assert after_f.peak_memory_bytes == pytest.approx(after_e.peak_memory_bytes, rel=1e-9)
