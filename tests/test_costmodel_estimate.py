"""estimate() against hand-computed expectations: communication volume, activations, liveness."""

import pytest

from hwfixtures import simple_hw
from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.lowering import lower
from osdp_sim.costmodel.memory import peak_memory
from osdp_sim.costmodel.schedule import MemEvent
from osdp_sim.costmodel.simulate import Task
from osdp_sim.model import ModelConfig, build_spec, load_model
from osdp_sim.plan import GroupChoice, uniform_plan

SMALL = ModelConfig(name="t", family="gpt2", n_layers=4, hidden=256, n_heads=4, vocab_size=1000,
                    seq_len=64)


def test_zero3_moves_one_and_a_half_times_ddp_bytes():
    hw = simple_hw(busbw_gbps=10.0)
    spec = build_spec(SMALL)
    ddp = lower(spec, hw, uniform_plan(SMALL, "ddp", devices=8, micro_batch=1, precision="fp32"))
    z3 = lower(spec, hw, uniform_plan(SMALL, "zero3", devices=8, micro_batch=1, precision="fp32"))
    for a, b in zip(ddp.units[1:], z3.units[1:]):          # blocks (the root gathers once)
        assert 2 * b.all_gather_s + b.reduce_s == pytest.approx(1.5 * a.reduce_s)
        # hand: AR of P fp32 params over 8 ranks at 10 GB/s
        assert a.reduce_s == pytest.approx(2 * 7 / 8 * 4 * a.params / 10e9)


def test_bf16_gathers_half_the_bytes_of_fp32():
    hw = simple_hw(busbw_gbps=10.0)
    spec = build_spec(SMALL)
    f32 = lower(spec, hw, uniform_plan(SMALL, "zero3", devices=8, micro_batch=1, precision="fp32"))
    b16 = lower(spec, hw, uniform_plan(SMALL, "zero3", devices=8, micro_batch=1, precision="bf16"))
    assert b16.units[1].all_gather_s == pytest.approx(f32.units[1].all_gather_s / 2)
    assert b16.units[1].reduce_s == pytest.approx(f32.units[1].reduce_s)     # reduce in fp32


def test_activation_bytes_of_a_gpt2_block():
    spec = load_model("gpt2-1.5b")
    block = spec.blocks[0]
    h, f, heads = 1600, 6400, 25
    # attention: x, LN out, qkv (3h), SDPA out = 6h (bf16) + LN stats 8 B + lse 4 B/head
    attn = 6 * h * 2 + 8 + 4 * heads
    # MLP: x, LN out, fc out (4h), GELU out (4h) (bf16) + LN stats
    mlp = (2 * h + 2 * f) * 2 + 8
    assert block.groups[0].activations.bytes_per_token(2) == attn
    assert block.groups[1].activations.bytes_per_token(2) == mlp
    assert block.ckpt_activations.bytes_per_token(2) == 2 * h


def test_liveness_peak_is_not_a_sum_of_maxima():
    tasks = [Task("a", "compute", 1, "fwd"), Task("b", "compute", 1, "fwd")]
    tasks[0].start_s, tasks[0].end_s, tasks[1].start_s, tasks[1].end_s = 0, 1, 1, 2
    events = [MemEvent(-1, "start", 10, "params"),
              MemEvent(0, "start", 100, "temporaries"), MemEvent(0, "end", -100, "temporaries"),
              MemEvent(1, "start", 70, "temporaries"), MemEvent(1, "end", -70, "temporaries")]
    p = peak_memory(tasks, events)
    assert p.peak_bytes == 110 and p.during == "a"
    assert p.breakdown == {"params": 10, "grads": 0, "optimizer": 0, "activations": 0,
                           "gathered_params": 0, "reduce_buffers": 0, "temporaries": 100}


def test_single_device_ddp_has_no_communication_and_hand_computed_states():
    hw = simple_hw(count=1, per_node=1)
    spec = build_spec(SMALL)
    est = estimate(spec, hw, uniform_plan(SMALL, "ddp", devices=1, micro_batch=2))
    assert est.time_breakdown["communication_s"] == 0
    p = spec.param_count
    assert est.model_states_bytes == {"params": 4 * p, "grads": 4 * p, "optimizer": 8 * p}


def test_throughput_counts_every_device_and_micro_batch():
    hw = simple_hw()
    spec = build_spec(SMALL)
    est = estimate(spec, hw, uniform_plan(SMALL, "zero3", devices=8, micro_batch=3, grad_accum=2))
    assert est.samples_per_s == pytest.approx(3 * 2 * 8 / est.iteration_time_s)
    assert est.tokens_per_s == pytest.approx(est.samples_per_s * SMALL.seq_len)


def test_peak_at_least_resident_states_plus_saved_activations():
    hw = simple_hw()
    spec = build_spec(SMALL)
    for strategy in ("ddp", "zero2", "zero3"):
        plan = uniform_plan(SMALL, strategy, devices=8, micro_batch=4)
        est = estimate(spec, hw, plan)
        low = lower(spec, hw, plan)
        resident = sum(u.states.params + u.states.optimizer for u in low.units)
        acts = sum(s.act_bytes for s in low.steps)
        assert est.peak_memory_bytes >= resident + acts


def test_hybrid_sharding_adds_a_cross_group_all_reduce_of_the_sharded_grads():
    hw = simple_hw(count=16, per_node=8, busbw_gbps=100.0, inter_gbps=10.0)
    spec = build_spec(SMALL)
    plan = uniform_plan(SMALL, "zero3", devices=16, micro_batch=1, shard_group=8, precision="fp32")
    low = lower(spec, hw, plan)
    u = low.units[1]
    # all-reduce of P/8 fp32 grads across 2 replicas on the inter-node link: 2(1/2) * 4P/8 / 10 GB/s,
    # with the 8 replica groups of a node sharing its link: x 8
    assert u.replica_all_reduce_s == pytest.approx(8 * 1.0 * 4 * u.params / 8 / 10e9)
    assert u.all_gather_s == pytest.approx(7 / 8 * 4 * u.params / 100e9)
    assert u.states.params == pytest.approx(4 * u.params / 8)


def test_split_choice_lowers_to_one_unit_per_sharded_slice():
    hw = simple_hw()
    spec = build_spec(SMALL)
    plan = uniform_plan(SMALL, "zero3", devices=8, micro_batch=1)
    choices = dict(plan.choices)
    choices["block0.mlp"] = GroupChoice("ddp", 4, 2)
    low = lower(spec, hw, plan.with_choices(choices=choices))
    names = [u.name for u in low.units if u.plan_key == "block0.mlp"]
    assert names == ["block0.mlp", "block0.mlp/c_fc.s0", "block0.mlp/c_fc.s1",
                     "block0.mlp/c_proj.s0", "block0.mlp/c_proj.s1"]
    g = spec.blocks[0].groups[1]
    units = [u for u in low.units if u.plan_key == "block0.mlp"]
    assert sum(u.params for u in units) == pytest.approx(g.param_count)
    assert units[1].params == pytest.approx(256 * 1024 / 4)     # one quarter of c_fc's weight


def test_head_backward_peak_holds_the_loss_gradient_but_no_weight_gradient():
    # gpt2-tiny, zero2 on 2 ranks, micro-batch 8 (the CPU campaign's run): the peak is the start
    # of the head's backward. Live then: fp32 params and AdamW states sharded over 2, the bf16
    # copies zero2 keeps from forward, all saved activations and the loss gradient, 8 B per
    # logit. Not live: the root's unsharded gradient (it appears when the head's backward ends)
    # and any input gradient of the head.
    spec = load_model("gpt2-tiny")
    plan = uniform_plan(spec.config, "zero2", devices=2, micro_batch=8)
    e = estimate(spec, simple_hw(count=2), plan)
    P = 5_289_472
    logits = 8 * 128 * 8192
    acts = sum(s.act_bytes for s in lower(spec, simple_hw(count=2), plan).steps)
    b = e.memory_breakdown
    assert b["grads"] == 0
    assert b["temporaries"] == 8 * logits == 67_108_864
    assert b["params"] + b["gathered_params"] == 4 * P / 2 + 2 * P == 21_157_888
    assert b["optimizer"] == 8 * P / 2
    assert e.peak_memory_bytes == pytest.approx(21_157_888 + 21_157_888 + acts + 67_108_864)
    assert e.peak_during == "bwd head"


def test_unsharded_gradient_is_allocated_when_the_first_backward_step_ends():
    from osdp_sim.costmodel.schedule import build_step
    spec = build_spec(SMALL)
    plan = uniform_plan(SMALL, "zero3", devices=2, micro_batch=1)
    low = lower(spec, simple_hw(count=2), plan)
    sched = build_step(low, reduce=True, grads_resident=False, unsharded_grads_resident=False,
                       optimizer=True)
    names = [t.name for t in sched.tasks]
    ug = [(names[ev.task], ev.at, ev.delta_bytes) for ev in sched.events
          if ev.category == "grads" and ev.delta_bytes > 0 and not names[ev.task].startswith("RS")]
    # root (embedding 1000 x 256 + positions 64 x 256 + final norm 512) in bf16, after the head
    root = (1000 * 256 + 64 * 256 + 512) * 2
    assert ug[0] == ("bwd head", "end", root)
    assert all(at == "end" and name.startswith("bwd ") for name, at, _ in ug)


def _cpu(hw):
    from dataclasses import replace
    return replace(hw, device=replace(hw.device, kind="cpu"))


def test_cpu_adamw_step_holds_two_copies_of_the_largest_local_tensor():
    # gpt2-small-cpu, ddp on 2 CPU ranks (campaign run: MemTracker 505,237,908 B at the step).
    # Replicated fp32 params, grads and AdamW m, v: 16 B per parameter; the single-tensor AdamW
    # loop adds sqrt(v) and the denominator for the token table (8192 x 512 fp32) at once.
    spec = load_model("gpt2-small-cpu")
    P = spec.param_count
    e = estimate(spec, _cpu(simple_hw(count=2)), uniform_plan(spec.config, "ddp", devices=2, micro_batch=2))
    assert e.peak_during == "optimizer step"
    assert e.peak_memory_bytes == 16 * P + 2 * 4 * 8192 * 512 == 505_233_408


def test_cuda_adamw_step_holds_sqrt_v_of_every_local_parameter():
    # On CUDA tensors torch's AdamW runs its foreach loop: sqrt(v) of every local parameter in one
    # call, 4 B per local parameter on top of the 16 B of states (measured on one H200: gpt2-1.5b
    # and llama-7b peak there, docs/accuracy-h200x1.md). gpt2-small-cpu, micro-batch 2.
    spec = load_model("gpt2-small-cpu")
    P = spec.param_count
    hw = simple_hw(count=2)
    ddp = estimate(spec, hw, uniform_plan(spec.config, "ddp", devices=2, micro_batch=2))
    assert ddp.peak_during == "optimizer step"
    assert ddp.peak_memory_bytes == 20 * P == 589_598_720
    assert ddp.memory_breakdown["temporaries"] == 4 * P
    zero3 = estimate(spec, hw, uniform_plan(spec.config, "zero3", devices=2, micro_batch=2))
    assert zero3.peak_during == "optimizer step"
    assert zero3.peak_memory_bytes == (16 + 4) * P / 2 == 294_799_360
    # the fast model used by the search agrees
    from osdp_sim.costmodel.fast import fast_estimate
    assert fast_estimate(spec, hw, uniform_plan(spec.config, "ddp", devices=2, micro_batch=2)).peak_memory_bytes \
        == pytest.approx(ddp.peak_memory_bytes, rel=1e-9)


def test_gloo_reduce_scatter_holds_a_copy_of_its_input():
    # gpt2-small-cpu, zero3 on 2 CPU ranks, micro-batch 2 (MemTracker 269,931,932 B during the
    # root's reduction). Live then: sharded fp32 params and AdamW states (6 B per parameter), the
    # blocks' sharded fp32 grads (2 B per parameter), and for the root's R parameters its bf16
    # gradient (2 B), the fp32 reduce-scatter input (4 B) and gloo's copy of that (4 B).
    spec = load_model("gpt2-small-cpu")
    P, R = spec.param_count, spec.params_of("root")
    hw = _cpu(simple_hw(count=2))
    e = estimate(spec, hw, uniform_plan(spec.config, "zero3", devices=2, micro_batch=2))
    assert e.peak_during == "RS root"
    assert e.peak_memory_bytes == 6 * P + 2 * (P - R) + 10 * R == 269_926_400
    # on a GPU (NCCL) the collective needs no copy: 4 B per root parameter less at that moment
    plan = uniform_plan(spec.config, "zero3", devices=2, micro_batch=2)
    root = lower(spec, simple_hw(count=2), plan).units[0]
    assert root.reduce_buffer_bytes == 4 * R


def test_ddp_units_make_their_compute_copy_in_their_own_backward_not_at_the_prefetch():
    # gpt2-tiny ddp mb8 on 2 ranks (MemTracker: Temp = 8 B per logit exactly, no prefetched
    # copy): at the head's backward peak only the root's bf16 copy is gathered, although the
    # prefetch of block3.mlp (a copy task on the gather stream) has been issued.
    spec = load_model("gpt2-tiny")
    plan = uniform_plan(spec.config, "ddp", devices=2, micro_batch=8)
    e = estimate(spec, simple_hw(count=2), plan)
    R = spec.params_of("root")
    assert e.memory_breakdown["gathered_params"] == 2 * R == 4_260_864
    assert e.memory_breakdown["temporaries"] == 8 * 8 * 128 * 8192
    assert "AG(bwd) block3.mlp" in [t.name for t in e.timeline]
