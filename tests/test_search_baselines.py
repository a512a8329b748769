"""Uniform baselines: each strategy at its own best batch setting within the limit."""

import pytest

from hwfixtures import GiB, simple_hw
from osdp_sim.costmodel import estimate
from osdp_sim.model.load import load_model
from osdp_sim.plan import uniform_plan
from osdp_sim.planner.baselines import uniform_baselines, uniform_candidates
from osdp_sim.planner.space import SearchSpace

SPEC = load_model("gpt2-tiny")
HW = simple_hw(count=4, per_node=4, busbw_gbps=5.0, latency_s=20e-6, launch_s=5e-6)


def space(**kw):
    base = dict(strategies=("ddp", "zero2", "zero3"), splits=(1,), checkpoint=(False, True),
                micro_batches=(1, 2, 4), global_batch=None, shard_groups=(4,), precision="bf16",
                optimizer="adamw", devices=4, root_strategies=("ddp", "zero2", "zero3"))
    base.update(kw)
    return SearchSpace(**base)


def est(strategy, mb, ckpt, accum=1):
    return estimate(SPEC, HW, uniform_plan(SPEC.config, strategy, devices=4, micro_batch=mb,
                                           checkpoint=ckpt, grad_accum=accum))


def test_unlimited_memory_takes_the_largest_batch_without_recompute():
    b = uniform_baselines(SPEC, HW, 1000 * GiB, space())
    for name in ("ddp", "zero2", "zero3"):
        e = est(name, 4, False)
        assert b[name].feasible and b[name].micro_batch == 4 and b[name].checkpoint is False
        assert b[name].samples_per_s == e.samples_per_s
        assert b[name].peak_memory_bytes == e.peak_memory_bytes
        assert b[name].iteration_time_s == e.iteration_time_s
        assert b[name].plan.choices["root"].strategy == name


def test_each_strategy_at_its_own_best_batch_within_the_limit():
    # gpt2-tiny on 4 devices (MiB): ZeRO-3 mb 4 needs 89.3 plain, 74.8 checkpointed; ZeRO-2 mb 4
    # checkpointed 79.3; DDP needs 88.8 even at mb 1. Within 80 MiB both ZeRO stages checkpoint
    # to reach micro-batch 4 (recompute costs less than halving the batch); DDP fits nowhere.
    lim = 80 * 2**20
    assert est("zero3", 4, False).peak_memory_bytes > lim >= est("zero3", 4, True).peak_memory_bytes
    b = uniform_baselines(SPEC, HW, lim, space())
    for name in ("zero2", "zero3"):
        e = est(name, 4, True)
        assert (b[name].micro_batch, b[name].checkpoint) == (4, True)
        assert b[name].samples_per_s == e.samples_per_s > est(name, 2, False).samples_per_s
    assert not b["ddp"].feasible and b["ddp"].samples_per_s is None
    assert b["ddp"].peak_memory_bytes == est("ddp", 1, False).peak_memory_bytes   # the least DDP needs
    assert b["ddp"].to_dict() == {"feasible": False, "samples_per_s": None,
                                  "peak_memory_bytes": b["ddp"].peak_memory_bytes, "iteration_time_s": None,
                                  "micro_batch": None, "grad_accum": None, "checkpoint": None,
                                  "shard_group": None}


def test_global_batch_fixes_accumulation_per_micro_batch():
    s = space(global_batch=16)
    cands = uniform_candidates(SPEC, HW, s, "zero3")
    assert sorted({(p.micro_batch, p.grad_accum) for p, _ in cands}) == [(1, 4), (2, 2), (4, 1)]
    assert all(p.global_batch == 16 for p, _ in cands)
    b = uniform_baselines(SPEC, HW, 1000 * GiB, s)["zero3"]
    assert b.samples_per_s == max(e.samples_per_s for _, e in cands)


def test_checkpointing_excluded_by_the_space_is_never_used():
    b = uniform_baselines(SPEC, HW, 1000 * GiB, space(checkpoint=(False,)))
    cands = uniform_candidates(SPEC, HW, space(checkpoint=(False,)), "zero2")
    assert len(cands) == 3 and not any(any(p.checkpoint) for p, _ in cands)
    assert b["zero2"].checkpoint is False


def test_ddp_ignores_shard_groups():
    s = space(shard_groups=(2, 4))
    assert len(uniform_candidates(SPEC, HW, s, "ddp")) == 3 * 2
    assert len(uniform_candidates(SPEC, HW, s, "zero3")) == 3 * 2 * 2
    assert {p.shard_size for p, _ in uniform_candidates(SPEC, HW, s, "zero3")} == {2, 4}


@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3"])
def test_nothing_fits_reports_the_least_memory(name):
    b = uniform_baselines(SPEC, HW, 1024, space())[name]
    assert not b.feasible
    assert b.peak_memory_bytes == min(est(name, mb, ck).peak_memory_bytes for mb in (1, 2, 4)
                                      for ck in (False, True))


def _brute_per_block(strategy, lim, mbs=(1, 2, 4)):
    """Every checkpoint subset at every micro-batch of the uniform strategy: the best that fits."""
    import itertools
    from dataclasses import replace
    best = None
    for mb in mbs:
        for ck in itertools.product((False, True), repeat=SPEC.config.n_layers):
            plan = replace(uniform_plan(SPEC.config, strategy, devices=4, micro_batch=mb), checkpoint=ck)
            e = estimate(SPEC, HW, plan)
            if e.peak_memory_bytes <= lim and (best is None or e.samples_per_s > best[0].samples_per_s):
                best = (e, mb, ck)
    return best


@pytest.mark.parametrize("lim_mib", [60, 70, 76, 80, 1000])
@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_per_block_checkpointing_baseline_is_the_best_uniform_plan_over_checkpoint_subsets(name, lim_mib):
    from osdp_sim.planner.baselines import per_block_baselines
    lim = lim_mib * 2**20
    b = per_block_baselines(SPEC, HW, lim, space())[f"{name}_per_block"]
    brute = _brute_per_block(name, lim)
    if brute is None:
        assert not b.feasible
        return
    e, mb, ck = brute
    assert b.feasible and b.samples_per_s == pytest.approx(e.samples_per_s, rel=1e-9)
    assert b.peak_memory_bytes <= lim
    assert {c.strategy for c in b.plan.choices.values()} == {name}
    assert not any(c.is_split for c in b.plan.choices.values())
    assert b.shard_group == 4
    # never worse than the uniform baseline with all-or-nothing checkpointing
    u = uniform_baselines(SPEC, HW, lim, space())[name]
    assert not u.feasible or b.samples_per_s >= u.samples_per_s * (1 - 1e-12)


def test_per_block_baseline_beats_all_or_nothing_where_some_blocks_suffice():
    # 76 MiB: zero3 mb 4 fits only with recompute; checkpointing one of gpt2-tiny's blocks is
    # enough, so the per-block baseline is faster than checkpointing them all.
    from osdp_sim.planner.baselines import per_block_baselines
    lim = 76 * 2**20
    b = per_block_baselines(SPEC, HW, lim, space())["zero3_per_block"]
    u = uniform_baselines(SPEC, HW, lim, space())["zero3"]
    assert b.samples_per_s > u.samples_per_s
    assert 0 < sum(b.plan.checkpoint) < SPEC.config.n_layers


def test_per_block_baselines_skipped_when_the_space_fixes_checkpointing():
    from osdp_sim.planner.baselines import per_block_baselines
    b = per_block_baselines(SPEC, HW, 1000 * GiB, space(checkpoint=(False,)))
    assert set(b) == {"ddp_per_block", "zero2_per_block", "zero3_per_block"}
    assert all(not x.feasible and "fixes checkpointing" in x.note for x in b.values())
