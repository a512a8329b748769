"""The compute-time terms by kernel (costmodel/kernels.py, rates.py, lowering.py group_times):
hand-computed numbers on the flat test profile (tests/hwfixtures.simple_hw: 100 TFLOP/s x 0.5,
1000 GB/s), the host terms, and the eager op counts recounted on the runtime's modules."""

import collections
import dataclasses

import pytest

from hwfixtures import simple_hw
from osdp_sim.costmodel.kernels import HOST_OPS, group_work, param_tensors
from osdp_sim.costmodel.lowering import group_times, unit_optimizer_s, lower
from osdp_sim.costmodel.rates import attention_time_s, gemm_shape_time_s, task_time_s
from osdp_sim.hardware.profile import HostSpec
from osdp_sim.model import ModelConfig, build_spec
from osdp_sim.model.load import load_model
from osdp_sim.plan import uniform_plan

FLAT = 100e12 * 0.5
BW = 1000e9
GPT = ModelConfig(name="g", family="gpt2", n_layers=2, hidden=256, n_heads=4, vocab_size=1024, seq_len=128)


def test_gemm_shape_time_is_the_larger_of_compute_and_memory_plus_a_launch():
    hw = simple_hw(kernel_launch_s=2e-6)
    # 1024 x 1024 x 1024: 2.147 GFLOP / 50 TFLOP/s = 42.9 us; bytes 3 x 2 MiB = 6.29 MB / 1 TB/s = 6.3 us
    assert gemm_shape_time_s(hw, 1024, 1024, 1024, "bf16", 2) == pytest.approx(2 * 1024**3 / FLAT + 2e-6)
    # 1 x 4096 x 4096 (a matrix-vector product): memory-bound, 4096^2 x 2 B dominate
    t = gemm_shape_time_s(hw, 1, 4096, 4096, "bf16", 2)
    assert t == pytest.approx((4096 + 4096 * 4096 + 4096) * 2 / BW + 2e-6)


def test_gemm_tile_quantisation_charges_the_padded_tiles():
    hw = simple_hw()
    hw = dataclasses.replace(hw, compute=dataclasses.replace(hw.compute, gemm_tile=(128, 128)))
    # M = 129 rows run 2 tiles of 128: 129 / 256 of the launched tile rows hold output
    t = gemm_shape_time_s(hw, 129, 1024, 4096, "bf16", 2)
    assert t == pytest.approx(2 * 129 * 1024 * 4096 / (FLAT * 129 / 256))


def test_attention_kernel_uses_its_own_efficiency_and_backward_ratio():
    hw = simple_hw()
    hw = dataclasses.replace(hw, compute=dataclasses.replace(
        hw.compute, attention_efficiency={"bf16": ((512, 0.1), (8192, 0.3))}))
    # halfway in log(keys) between 512 and 8192 (2048): efficiency 0.2
    assert attention_time_s(hw, 1e12, 2048, 0.0, "bf16") == pytest.approx(1e12 / (100e12 * 0.2))
    # the profile's efficiency_scale (achieved fraction in training) scales it like the GEMM curve
    scaled = dataclasses.replace(hw, compute=dataclasses.replace(hw.compute, efficiency_scale=0.7))
    assert attention_time_s(scaled, 1e12, 2048, 0.0, "bf16") == pytest.approx(1e12 / (100e12 * 0.2 * 0.7))


def test_gpt2_mlp_group_hand_computed():
    """gpt2 MLP, hidden 256, ffn 1024, 128 tokens, bf16 (cb 2) on the flat profile."""
    spec = build_spec(GPT)
    g = spec.blocks[0].groups[1]
    hw = simple_hw()
    t = group_times(spec, g, hw, "bf16", 128)
    # forward GEMMs: c_fc 128 x 1024 x 256 and c_proj 128 x 256 x 1024, each 67.1 MFLOP (compute-bound)
    assert t.slice_fwd_s["c_fc"] == pytest.approx(2 * 128 * 1024 * 256 / FLAT)
    # backward: input gradient (128 x 256 x 1024) and weight gradient (1024 x 256 x 128), same FLOPs
    assert t.slice_bwd_s["c_fc"] == pytest.approx(2 * 2 * 128 * 1024 * 256 / FLAT)
    # memory-bound, per token: LayerNorm 2h cb fwd / 3h cb bwd; residual add (2 inputs) 3h / 5h;
    # GELU (1 input) 2f / 3f; bias gradients (bwd) read each output gradient once (f + h)
    h, f = 256, 1024
    fwd_bytes = 128 * 2 * (2 * h + 3 * h + 2 * f)
    bwd_bytes = 128 * 2 * (3 * h + 5 * h + 3 * f + f + h)
    assert t.fixed_fwd_s == pytest.approx(fwd_bytes / BW)
    assert t.fixed_bwd_s == pytest.approx(bwd_bytes / BW)
    assert t.host_fwd_s == 0.0 and t.attention_fwd_s == 0.0


def test_attention_group_executes_half_the_causal_scores():
    spec = build_spec(GPT)
    w = group_work(GPT, spec.blocks[0].groups[0], 128, 2, cpu=False)
    # scores and weighted sum: 4 x keys x q_dim per token, half of it under a causal mask
    assert w.attention.flops == pytest.approx(128 * 4 * 128 * 256 * 0.5)
    assert [(gm.m, gm.n, gm.k) for gm in w.gemms] == [(128, 768, 256), (128, 256, 256)]


def test_host_dispatch_bounds_an_asynchronous_device_and_adds_on_a_cpu():
    gpu = dataclasses.replace(simple_hw(), host=HostSpec(op_s=1e-5, async_device=True))
    cpu = dataclasses.replace(gpu, host=HostSpec(op_s=1e-5, async_device=False))
    assert task_time_s(gpu, 3e-4, 1e-4) == 3e-4          # device-bound
    assert task_time_s(gpu, 3e-5, 1e-4) == 1e-4          # host-bound: the GPU waits
    assert task_time_s(cpu, 3e-4, 1e-4) == pytest.approx(4e-4)
    # gpt2 MLP: 11 eager ops in forward, 30 in backward (HOST_OPS) at 10 us each
    spec = build_spec(GPT)
    t = group_times(spec, spec.blocks[0].groups[1], gpu, "bf16", 128)
    assert (t.host_fwd_s, t.host_bwd_s) == (pytest.approx(11e-5), pytest.approx(30e-5))


def test_collective_calls_are_charged_in_forward_and_backward_but_not_in_the_recompute():
    call = 1e-3
    hw = dataclasses.replace(simple_hw(), host=HostSpec(call_s=call, async_device=False))
    base_hw = dataclasses.replace(hw, host=HostSpec(async_device=False))
    spec = build_spec(GPT)
    # zero3: an all-gather before forward; before backward another, then the reduce-scatter;
    # ddp (a (world, 1) mesh, resharded after forward): the same over one rank, + the all-reduce
    for strategy, calls_f, calls_b in (("zero3", 1, 2), ("zero2", 1, 1), ("ddp", 1, 3)):
        plan = uniform_plan(GPT, strategy, devices=8, micro_batch=1)
        base, low = lower(spec, base_hw, plan), lower(spec, hw, plan)
        for s0, s1 in zip(base.steps, low.steps):
            if s1.block >= 0:
                assert s1.fwd_s - s0.fwd_s == pytest.approx(calls_f * call), strategy
                assert s1.bwd_s - s0.bwd_s == pytest.approx(calls_b * call), strategy
                assert s1.recompute_work_s == pytest.approx(s0.recompute_work_s)


def test_optimizer_host_work_per_tensor():
    spec = build_spec(GPT)
    g = spec.blocks[0].groups[1]
    assert param_tensors(GPT, g) == 6                     # LN weight, bias; c_fc, c_proj weights and biases
    cpu = dataclasses.replace(simple_hw(), host=HostSpec(dtensor_op_s=1e-5, async_device=False))
    low = lower(spec, cpu, uniform_plan(GPT, "zero3", devices=8, micro_batch=1))
    u = [x for x in low.units if x.name == g.name][0]
    device = u.states.params / 4 * 72 / BW     # AdamW, weight decay 0: 72 B per parameter
    # single-tensor AdamW: 10 ops per parameter tensor on DTensors, after the device's streaming
    assert unit_optimizer_s(cpu, u, "adamw") == pytest.approx(device + 10 * 6 * 1e-5)


def test_host_op_counts_match_the_runtime_modules():
    torch = pytest.importorskip("torch")
    from osdp_sim.runtime.modules import _GROUPS
    from osdp_sim.runtime.op_count import OpCounter

    torch.manual_seed(0)
    for name in ("gpt2-tiny", "llama-tiny", "bert-tiny"):
        cfg = load_model(name).config
        for kind, cls in zip(("attn", "mlp"), _GROUPS[cfg.family]):
            m = cls(cfg).to(torch.bfloat16)
            x = torch.randn(2, cfg.seq_len, cfg.hidden, dtype=torch.bfloat16, requires_grad=True)
            with OpCounter() as f:
                y = m(x)
            grad = torch.randn_like(y)
            with OpCounter() as b:
                y.backward(grad)
            assert (f.ops, b.ops) == HOST_OPS[(cfg.family, kind)], (name, kind)
