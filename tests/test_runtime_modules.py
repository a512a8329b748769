"""The runtime's torch modules have exactly the model description's shapes and behave as their
family says (causal or not, tied or not), deterministically."""

import math

import pytest
import torch

from osdp_sim.errors import UserError
from osdp_sim.model.config import ModelConfig, with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.runtime.modules import RMSNorm, Rotary, _rotate_half, build_model
from osdp_sim.runtime.saved_tensors import group_modules

SMALL = {
    "gpt2": ModelConfig(name="g", family="gpt2", n_layers=2, hidden=32, n_heads=4, vocab_size=128,
                        seq_len=16),
    "bert": ModelConfig(name="b", family="bert", n_layers=2, hidden=32, n_heads=4, vocab_size=128,
                        seq_len=16),
    "llama": ModelConfig(name="l", family="llama", n_layers=2, hidden=32, n_heads=4, n_kv_heads=2,
                         vocab_size=128, seq_len=16, ffn_hidden=88, tied_head=False),
}


# What the llama modules build beyond the built-ins (Qwen2's q/k/v bias, Gemma's head size,
# GeGLU, tied head); config.json shapes of those architectures run on them.
LLAMA_OPTIONS = {
    "qwen2-like": with_overrides(BUILTIN["llama-tiny"], qkv_bias=True),
    "gemma-like": with_overrides(BUILTIN["llama-tiny"], head_size=96, mlp_kind="geglu",
                                 tied_head=True, attn_out_bias=True, mlp_bias=True),
}


@pytest.mark.parametrize("name", sorted(BUILTIN) + sorted(LLAMA_OPTIONS))
def test_parameter_counts_equal_the_spec_group_by_group(name):
    cfg = BUILTIN.get(name) or LLAMA_OPTIONS[name]
    spec = build_spec(cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == spec.param_count
    modules = group_modules(model)
    for group in spec.groups:
        module = modules[group.name]
        assert sum(p.numel() for p in module.parameters()) == group.param_count, group.name
        linears = {n: m for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
        assert [(n, m.in_features, m.out_features, m.bias is not None) for n, m in linears.items()] \
            == [(l.name, l.in_features, l.out_features, l.bias) for l in group.linears], group.name


def test_known_totals():
    # nanoGPT's GPT-2 124M count and HF bert-large-uncased with its MLM head (no pooler).
    with torch.device("meta"):
        assert sum(p.numel() for p in build_model(BUILTIN["gpt2-124m"]).parameters()) == 124_439_808
        assert sum(p.numel() for p in build_model(BUILTIN["bert-large"]).parameters()) == 335_174_458


def _batch(cfg, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen)
    return idx, torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_init_is_deterministic_and_the_loss_starts_near_uniform(family):
    cfg = SMALL[family]
    a, b, c = build_model(cfg, seed=3), build_model(cfg, seed=3), build_model(cfg, seed=4)
    for (n, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), n
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))
    loss = a(*_batch(cfg))
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert loss.item() == pytest.approx(math.log(cfg.vocab_size), abs=0.05)


@pytest.mark.parametrize("family,causal", [("gpt2", True), ("llama", True), ("bert", False)])
def test_attention_is_causal_only_for_decoders(family, causal):
    cfg = SMALL[family]
    attn = build_model(cfg).blocks[0].attn
    x = torch.randn(1, cfg.seq_len, cfg.hidden)
    y = x.clone()
    y[:, 10:] += 1.0
    early_unchanged = torch.allclose(attn(x)[:, :10], attn(y)[:, :10], atol=1e-6)
    assert early_unchanged == causal


@pytest.mark.parametrize("family,tied", [("gpt2", True), ("bert", True), ("llama", False)])
def test_head_is_tied_to_the_token_table_as_the_family_says(family, tied):
    cfg = SMALL[family]
    model = build_model(cfg)
    idx = torch.randint(0, 10, (2, cfg.seq_len))          # rows >= 10 are never looked up
    model(idx, torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))).backward()
    unused_rows_grad = model.embed.tokens.weight.grad[10:].abs().sum().item()
    assert (unused_rows_grad > 0) == tied
    assert (model.head.lm_head is None) == tied


def test_llama_uses_grouped_query_attention():
    attn = build_model(SMALL["llama"]).blocks[0].attn
    assert attn.k_proj.out_features == attn.v_proj.out_features == 2 * 8   # kv heads * head dim
    assert attn.q_proj.out_features == 32


def test_rms_norm_matches_torch_forward_and_backward():
    x = torch.randn(3, 5, 32, requires_grad=True)
    ours, ref = RMSNorm(32, eps=1e-6), torch.nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.rand(32) + 0.5)
        ref.weight.copy_(ours.weight)
    g = torch.randn(3, 5, 32)
    y1 = ours(x)
    gx1, gw1 = torch.autograd.grad(y1, (x, ours.weight), g)
    y2 = ref(x)
    gx2, gw2 = torch.autograd.grad(y2, (x, ref.weight), g)
    torch.testing.assert_close(y1, y2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gx1, gx2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw1, gw2, rtol=1e-5, atol=1e-5)


def test_rms_norm_and_rotary_gradients_are_exact_in_double():
    norm = RMSNorm(8, eps=1e-6).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: norm(t), (x,))
    rot = Rotary(8, 6).double()
    q = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rot(t), (q,))
    plain = q * rot.cos[:6] + _rotate_half(q) * rot.sin[:6]
    torch.testing.assert_close(rot(q), plain)


def test_bad_inputs():
    with pytest.raises(UserError, match="family"):
        build_model(with_overrides(SMALL["gpt2"], family="t5"))
    with pytest.raises(UserError, match="n_heads"):
        build_model(with_overrides(SMALL["gpt2"], n_heads=5))
    model = build_model(SMALL["gpt2"])
    with pytest.raises(ValueError, match="sequence length 17"):
        model(torch.zeros(1, 17, dtype=torch.long), torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("change,field", [({"fused_qkv": True}, "fused_qkv"),
                                          ({"n_experts": 4, "top_k": 2}, "n_experts"),
                                          ({"sliding_window": 64}, "sliding_window")])
def test_configs_the_modules_cannot_build_are_refused(change, field):
    with pytest.raises(UserError, match=field):
        build_model(with_overrides(BUILTIN["llama-tiny"], **change))
