"""Mixture of experts in the cost model: expert stacks timed as one GEMM per expert over the
tokens routed to it (balanced load), split along the experts; hand-computed on a flat-efficiency
profile (tests/hwfixtures.simple_hw: 100 TFLOP/s peak x 0.5, no launch cost)."""

import pytest

from hwfixtures import simple_hw
from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.lowering import linear_time_s, lower
from osdp_sim.model import ModelConfig, build_spec
from osdp_sim.plan import GroupChoice, uniform_plan

MOE = ModelConfig(name="moe", family="llama", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                  vocab_size=1024, seq_len=128, ffn_hidden=512, tied_head=False, n_experts=8,
                  top_k=2, fused_gate_up=True)
FLAT = 100e12 * 0.5


def test_expert_stack_time_is_one_gemm_per_expert_over_its_routed_tokens():
    hw = simple_hw(kernel_launch_s=1e-6)
    spec = build_spec(MOE)
    gate_up = [l for l in spec.blocks[0].groups[1].linears if l.name == "experts.gate_up_proj"][0]
    tokens = 128
    # 8 GEMMs, each of 128 x 2 / 8 = 32 tokens x (256 -> 1024): 2 x 32 x 256 x 1024 FLOPs + a launch
    per_expert = 2 * 32 * 256 * 1024 / FLAT + 1e-6
    assert linear_time_s(hw, gate_up, tokens, "bf16") == pytest.approx(8 * per_expert)
    # split in 4: a slice holds 2 experts
    assert linear_time_s(hw, gate_up, tokens, "bf16", 4) == pytest.approx(2 * per_expert)


def test_moe_mlp_forward_time_is_router_plus_k_experts():
    hw = simple_hw()
    spec = build_spec(MOE)
    plan = uniform_plan(MOE, "zero3", devices=8, micro_batch=1)
    low = lower(spec, hw, plan)
    step = [s for s in low.steps if s.name == "block0.mlp"][0]
    tokens = 128
    gemm_flops = tokens * (2 * 256 * 8 + 2 * (2 * 256 * 1024 + 512 * 256 * 2))
    # + elementwise work: reads and writes what it saves, 2 x 11,320 B per token (bf16:
    # 2 x (512 + 2 x (256 + 4 x 512 + 256 + 1)) + 4 + 4 x 8 + 8 x 2) at 1000 GB/s
    act = tokens * (2 * (512 + 2 * (256 + 4 * 512 + 256 + 1)) + 4 + 32 + 16)
    assert act == tokens * 11_320
    assert step.fwd_s == pytest.approx(gemm_flops / FLAT + 2 * act / 1000e9)


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
