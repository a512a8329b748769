"""Selective activation checkpointing in the cost model: what a block keeps and what it
recomputes (docs/cost-model.md, "Selective activation checkpointing"), against hand counts."""

import pytest
from hwfixtures import simple_hw

from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.lowering import lower
from osdp_sim.errors import UserError
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import GroupChoice, uniform_plan

LLAMA = BUILTIN["llama-tiny"]          # h 256, 4 heads, 2 kv heads (q 256, kv 128), ffn 688, seq 128
TOKENS = 2 * 128                       # micro-batch 2


def _plan(cfg, checkpoint, **kw):
    return uniform_plan(cfg, "zero3", devices=2, micro_batch=2, checkpoint=checkpoint, **kw)


def _block_kept(low, block):
    return low.ckpt_bytes[block] + sum(s.sac_saved_bytes for s in low.steps if s.block == block)


def test_llama_selective_block_keeps_input_sdpa_and_every_second_mm_by_hand():
    low = lower(build_spec(LLAMA), simple_hw(count=2), _plan(LLAMA, "selective"))
    # bf16 per token: input 256 x 2; SDPA output 256 x 2 and its fp32 logsumexp 4 heads x 4;
    # mms q (1st, saved), k (2nd), v (3rd, saved), o (4th), gate (5th, saved), up, down (7th, saved)
    per_token = 512 + 512 + 16 + (256 + 128 + 688 + 256) * 2
    assert _block_kept(low, 0) == per_token * TOKENS == 946_176


def test_biased_linears_are_addmm_and_keep_nothing():
    gpt2 = BUILTIN["gpt2-tiny"]        # h 256, 4 heads: input + SDPA out + lse only
    low = lower(build_spec(gpt2), simple_hw(count=2), _plan(gpt2, "selective"))
    assert _block_kept(low, 1) == (512 + 512 + 16) * TOKENS


def test_qwen2_like_mlp_count_starts_odd():
    # q/k/v biased (addmm): o_proj is the 1st mm (saved), gate 2nd, up 3rd (saved), down 4th
    cfg = with_overrides(LLAMA, qkv_bias=True)
    low = lower(build_spec(cfg), simple_hw(count=2), _plan(cfg, "selective"))
    assert _block_kept(low, 0) == (512 + 512 + 16 + (256 + 688) * 2) * TOKENS


def test_split_linears_save_every_other_slice():
    # every Linear in 2 slices, each slice an mm with the full output width: one of each pair saved
    low = lower(build_spec(LLAMA), simple_hw(count=2), _plan(LLAMA, "selective", slices=2))
    per_token = 512 + 512 + 16 + (256 + 128 + 128 + 256 + 688 + 688 + 256) * 2
    assert _block_kept(low, 0) == per_token * TOKENS


def test_recompute_time_is_elementwise_plus_the_recomputed_mms_by_hand():
    hw = simple_hw(count=2, peak_tflops=100.0, eff=0.5, bw_gbps=1000.0)    # 50 TFLOP/s, 1 TB/s
    low = lower(build_spec(LLAMA), hw, _plan(LLAMA, "selective"))
    attn, mlp = [s for s in low.steps if s.block == 0]
    # recomputed memory-bound kernels (costmodel/kernels.py; CUDA's fused RMSNorm), bf16 bytes per
    # token: RMSNorm 2h, residual add 3h, rotary on q and k 9 (q + kv); MLP: RMSNorm 2h, residual
    # 3h, SiLU 2f, act(gate) * up 3f (h 256, q 256, kv 128, f 688)
    attn_mem = (2 * 256 + 3 * 256 + 9 * (256 + 128)) * 2 * TOKENS
    mlp_mem = (2 * 256 + 3 * 256 + 2 * 688 + 3 * 688) * 2 * TOKENS
    # each recomputed mm: the larger of FLOPs / 50 TFLOP/s and (MK + KN + MN) x 2 B / 1 TB/s
    roof = lambda m, n, k: max(2 * m * n * k / 50e12, (m * k + k * n + m * n) * 2 / 1e12)  # noqa: E731
    k_o = roof(TOKENS, 128, 256) + roof(TOKENS, 256, 256)       # k_proj (2nd mm), o_proj (4th)
    assert attn.sac_recompute_s == pytest.approx(attn_mem / 1e12 + k_o, rel=1e-12)
    up = roof(TOKENS, 688, 256)                                 # up_proj (6th mm)
    assert mlp.sac_recompute_s == pytest.approx(mlp_mem / 1e12 + up, rel=1e-12)
    # less than the full forward: the attention core and the saved mms are not recomputed
    assert attn.sac_recompute_s < attn.fwd_s and mlp.sac_recompute_s < mlp.fwd_s


def test_estimate_charges_the_recompute_and_the_memory():
    spec, hw = build_spec(LLAMA), simple_hw(count=2)
    none, full, sel = (estimate(spec, hw, _plan(LLAMA, c)) for c in (False, True, "selective"))
    assert full.iteration_time_s > sel.iteration_time_s > none.iteration_time_s
    assert none.peak_memory_bytes > sel.peak_memory_bytes > full.peak_memory_bytes
    assert sel.time_breakdown["recompute_s"] > 0


def test_unsupported_models_are_refused_in_one_line():
    mix = with_overrides(LLAMA, n_experts=4, top_k=2)
    with pytest.raises(UserError) as e:
        estimate(build_spec(mix), simple_hw(count=2), _plan(mix, "selective"))
    assert "mixture-of-experts" in str(e.value) and "\n" not in str(e.value)
    qwen = with_overrides(LLAMA, qkv_bias=True)
    plan = _plan(qwen, "selective")
    plan = plan.with_choices(choices={**plan.choices, "block0.attn": GroupChoice("zero3", 2, 2)})
    with pytest.raises(UserError, match="split attention"):
        estimate(build_spec(qwen), simple_hw(count=2), plan)
