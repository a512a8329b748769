"""Mixture of experts in the cost model: expert stacks timed as one GEMM per expert over the
tokens routed to it (balanced load), split along the experts; hand-computed on a flat-efficiency
profile (tests/hwfixtures.simple_hw: 100 TFLOP/s peak x 0.5, no launch cost)."""

import pytest

from hwfixtures import simple_hw
from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.lowering import group_times, lower
from osdp_sim.model import ModelConfig, build_spec
from osdp_sim.plan import GroupChoice, uniform_plan

MOE = ModelConfig(name="moe", family="llama", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                  vocab_size=1024, seq_len=128, ffn_hidden=512, tied_head=False, n_experts=8,
                  top_k=2, fused_gate_up=True)
FLAT = 100e12 * 0.5


def test_expert_stack_time_is_one_gemm_per_expert_over_its_routed_tokens():
    hw = simple_hw(kernel_launch_s=1e-6)
    spec = build_spec(MOE)
    g = spec.blocks[0].groups[1]
    tokens = 128
    # 8 GEMMs, each of 128 x 2 / 8 = 32 tokens x (256 -> 1024): 2 x 32 x 256 x 1024 FLOPs (0.34 us)
    # or, larger, its bytes (32 x 256 + 256 x 1024 + 32 x 1024) x 2 B at 1000 GB/s (0.61 us); + a launch
    per_expert = max(2 * 32 * 256 * 1024 / FLAT, (32 * 256 + 256 * 1024 + 32 * 1024) * 2 / 1000e9) + 1e-6
    assert group_times(spec, g, hw, "bf16", tokens).slice_fwd_s["experts.gate_up_proj"] == pytest.approx(8 * per_expert)
    # split in 4: a slice holds 2 experts
    assert group_times(spec, g, hw, "bf16", tokens, 4).slice_fwd_s["experts.gate_up_proj"] == pytest.approx(2 * per_expert)


def test_moe_mlp_forward_time_is_router_plus_k_experts():
    hw = simple_hw()
    spec = build_spec(MOE)
    plan = uniform_plan(MOE, "zero3", devices=8, micro_batch=1)
    low = lower(spec, hw, plan)
    step = [s for s in low.steps if s.name == "block0.mlp"][0]
    tokens = 128
    # each GEMM: the larger of FLOPs / 50 TFLOP/s and (MK + KN + MN) x 2 B / 1000 GB/s
    roof = lambda m, n, k: max(2 * m * n * k / FLAT, (m * k + k * n + m * n) * 2 / 1000e9)  # noqa: E731
    gemms = roof(tokens, 8, 256) + 8 * (roof(32, 1024, 256) + roof(32, 256, 512))
    # memory-bound kernels per token (kernels.group_work, bf16, h 256, f 512, top-2 of 8, CUDA's
    # fused RMSNorm): norm 2h, residual add 3h, SiLU 2 x 2f, act(gate) * up 3 x 2f, the routed
    # rows gathered, weighted and added back 3 x 2h, all x 2 B
    h, f, k = 256, 512, 2
    mem = tokens * 2 * (2 * h + 3 * h + 2 * f * k + 3 * f * k + 3 * k * h)
    # + FSDP2's copy-out of the gathered parameters (read and write, bf16)
    copy_out = 2 * spec.blocks[0].groups[1].param_count * 2
    assert step.fwd_s == pytest.approx(gemms + (mem + copy_out) / 1000e9)


def test_splitting_an_moe_mlp_along_experts_keeps_its_parameters():
    hw = simple_hw()
    spec = build_spec(MOE)
    plan = uniform_plan(MOE, "zero3", devices=8, micro_batch=1)
    choices = dict(plan.choices)
    choices["block0.mlp"] = GroupChoice("zero3", 4, 4)
    split = plan.with_choices(choices=choices)
    low = lower(spec, hw, split)
    units = [u for u in low.units if u.plan_key == "block0.mlp"]
    assert sum(u.params for u in units) == pytest.approx(spec.blocks[0].groups[1].param_count)
    names = [u.name for u in units]
    assert "block0.mlp/experts.gate_up_proj.s3" in names
    gate_up = [u for u in units if u.name == "block0.mlp/experts.gate_up_proj.s0"][0]
    assert gate_up.params == pytest.approx(8 * 256 * 1024 / 4)      # 2 of the 8 experts
    est = estimate(spec, hw, split)
    assert est.peak_memory_bytes > 0 and est.iteration_time_s > 0
