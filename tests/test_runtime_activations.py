"""The model description's activation counts against what the runtime modules really keep for
backward: saved tensors per group, one count per storage, parameters and buffers excluded."""

import pytest
import torch

from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.runtime.modules import build_model
from osdp_sim.runtime.saved_tensors import saved_bytes_per_group
from osdp_sim.runtime.split_linear import split_linear

BATCH = 2
TINY = ("gpt2-tiny", "bert-tiny", "llama-tiny")
# On CPU a bf16 LayerNorm keeps its mean and 1/std in bf16 (4 bytes per token) where the spec
# counts fp32 (8, as CUDA keeps): at most 0.8% of a group (BERT's embedding). fp32 is exact.
RTOL = {torch.float32: 1e-9, torch.bfloat16: 0.01}


# Llama-family shapes the runtime builds beyond the built-ins: Qwen2's q/k/v bias, Gemma's head
# size (not hidden / heads), GeGLU and tied head.
EXTRA = {
    "qwen2-like": with_overrides(BUILTIN["llama-tiny"], name="qwen2-like", qkv_bias=True),
    "gemma-like": with_overrides(BUILTIN["llama-tiny"], name="gemma-like", head_size=96,
                                 mlp_kind="geglu", tied_head=True, mlp_bias=True),
}
CONFIGS = {**BUILTIN, **EXTRA}


def _measure(name, dtype, checkpointed=()):
    cfg = CONFIGS[name]
    model = build_model(cfg, seed=0).to(dtype)
    for i in checkpointed:
        model.blocks[i].checkpointed = True
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=gen)
    return cfg, model, saved_bytes_per_group(model, idx, targets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", TINY + tuple(EXTRA))
def test_every_group_keeps_what_the_spec_says(name, dtype):
    cfg, _, measured = _measure(name, dtype)
    spec = build_spec(cfg)
    tokens = BATCH * cfg.seq_len
    dtype_bytes = torch.finfo(dtype).bits // 8
    assert set(measured) == {g.name for g in spec.groups}      # nothing saved outside a group
    for group in spec.groups:
        expected = group.activations.bytes_per_token(dtype_bytes) * tokens
        # The loss also keeps cross_entropy's 4-byte total weight: not per token, tolerated.
        assert measured[group.name] == pytest.approx(expected, rel=RTOL[dtype], abs=4), group.name


def test_hand_counted_gpt2_attention_fp32():
    # x, LN out, qkv (3h), SDPA out: 6 * 256 floats; LN mean + 1/std (8 B); logsumexp 4 heads.
    cfg, _, measured = _measure("gpt2-tiny", torch.float32)
    assert measured["block0.attn"] == BATCH * cfg.seq_len * (6 * 256 * 4 + 8 + 4 * 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", TINY)
def test_checkpointed_block_keeps_only_its_input(name, dtype):
    cfg, _, measured = _measure(name, dtype, checkpointed=(1, 2))
    spec = build_spec(cfg)
    tokens = BATCH * cfg.seq_len
    dtype_bytes = torch.finfo(dtype).bits // 8
    for i in (1, 2):
        assert f"block{i}.attn" not in measured and f"block{i}.mlp" not in measured
        unit = spec.blocks[i]
        assert measured[f"block{i}"] == unit.ckpt_activations.bytes_per_token(dtype_bytes) * tokens
        assert measured[f"block{i}"] == cfg.hidden * dtype_bytes * tokens
    # The blocks that are not checkpointed are unchanged.
    block0 = spec.blocks[0].activations.bytes_per_token(dtype_bytes) * tokens
    assert measured["block0.attn"] + measured["block0.mlp"] == pytest.approx(block0, rel=RTOL[dtype])


@pytest.mark.parametrize("name", TINY)
def test_splitting_keeps_nothing_extra(name):
    _, _, plain = _measure(name, torch.float32)
    cfg = BUILTIN[name]
    model = build_model(cfg, seed=0)
    for group in (model.blocks[0].attn, model.blocks[0].mlp):
        for child, mod in list(group.named_children()):
            if isinstance(mod, torch.nn.Linear):
                setattr(group, child, split_linear(mod, 4))
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=gen)
    split = saved_bytes_per_group(model, idx, targets)
    assert split == plain
