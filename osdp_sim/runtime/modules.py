"""Plain torch modules for the three model families, shaped exactly like the model description.

Structure (what a plan addresses): `model.embed`, `model.blocks[i].attn` (attention with its norm
and residual), `model.blocks[i].mlp` (MLP with its norm and residual), `model.head` (final norm,
LM head and loss). Parameter counts equal `build_spec(cfg)` group by group; what each group keeps
for backward is what `OpGroup.activations` says (tests/test_runtime_activations.py measures it).
The model knows nothing about sharding: osdp_sim/runtime/parallelize.py applies a plan from outside.
"""

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from osdp_sim.errors import UserError
from osdp_sim.model.config import FAMILIES, ModelConfig, check_runtime_buildable

INIT_STD = 0.02


class RMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm that keeps only its input and the fp32 1/rms for backward.

    On CUDA torch runs a fused kernel that keeps exactly that. On CPU torch composes RMSNorm from
    pointwise ops that keep an fp32 copy of the input and of the normalised input (8h bytes per
    token in bf16 instead of 2h); the custom function below keeps the same set as CUDA does, so
    the model description holds on both.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return super().forward(x)
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def _opmath(t: torch.Tensor) -> torch.Tensor:
    """At least fp32 (bf16 computes in fp32; fp64 stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = _opmath(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * _opmath(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        x_hat = _opmath(x) * rstd
        grad_f = _opmath(grad)
        grad_weight = (grad_f * x_hat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        d_hat = grad_f * _opmath(weight)
        grad_x = rstd * (d_hat - x_hat * (d_hat * x_hat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_transposed(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


class _RotaryFunction(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin that keeps only the (fp32, shared) cos/sin tables.

    Written out by hand because the plain expression in bf16 keeps a bf16 cast of the tables per
    layer per step, an activation that scales with sequence length rather than tokens.
    """

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return (grad * cos.to(grad.dtype)
                + _rotate_half_transposed(grad * sin.to(grad.dtype)), None, None)


class Rotary(nn.Module):
    """Rotary position tables (HF rotate-half convention), non-persistent fp32 buffers."""

    def __init__(self, head_dim: int, max_seq: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.max_seq, self.base = head_dim, max_seq, base
        cos, sin = self._tables(torch.get_default_device())
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.head_dim
        inv_freq = 1.0 / self.base ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
        freqs = torch.outer(torch.arange(self.max_seq, dtype=torch.float32, device=device), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def init_buffers(self) -> None:
        """Recompute the tables where the buffers now live (after a meta-device build and
        to_empty, runtime/fake_world.py)."""
        cos, sin = self._tables(self.cos.device)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (B, heads, T, head_dim)
        t = x.shape[-2]
        return _RotaryFunction.apply(x, self.cos[:t], self.sin[:t])


def _attention(q, k, v, *, causal: bool) -> torch.Tensor:
    """(B, T, heads*d) views in, (B, T, heads*d) contiguous out, through SDPA (no s^2 kept)."""
    gqa = q.shape[1] != k.shape[1]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    b, h, t, d = y.shape
    return y.transpose(1, 2).contiguous().view(b, t, h * d)


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    b, t, c = x.shape
    return x.view(b, t, n, c // n).transpose(1, 2)


class Embedding(nn.Module):
    """Token table (+ learned positions for gpt2/bert, + token types and a LayerNorm for bert).

    Positions and the (always 0) token type are added as slices of their tables, so backward keeps
    only the int64 token ids, not position or type ids.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.positions = nn.Embedding(cfg.positions, cfg.hidden) if cfg.family != "llama" else None
        if cfg.family == "bert":
            self.token_types = nn.Embedding(cfg.type_vocab_size, cfg.hidden)
            self.norm = nn.LayerNorm(cfg.hidden, eps=1e-12)
        else:
            self.token_types = None
            self.norm = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx)
        if self.positions is not None:
            x = x + self.positions.weight[: idx.shape[1]]
        if self.token_types is not None:
            x = x + self.token_types.weight[0]
        if self.norm is not None:
            x = self.norm(x)
        return x


class GPT2Attention(nn.Module):
    """Pre-LN causal self-attention: x + c_proj(attn(c_attn(ln(x))))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden
        self.n_heads = cfg.n_heads
        self.norm = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)

    def forward(self, x):
        q, k, v = self.c_attn(self.norm(x)).split(x.shape[-1], dim=-1)
        y = _attention(_heads(q, self.n_heads), _heads(k, self.n_heads), _heads(v, self.n_heads),
                       causal=True)
        return x + self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden)
        self.c_fc = nn.Linear(cfg.hidden, cfg.ffn)
        self.c_proj = nn.Linear(cfg.ffn, cfg.hidden)

    def forward(self, x):
        return x + self.c_proj(F.gelu(self.c_fc(self.norm(x))))


class BertAttention(nn.Module):
    """Post-LN bidirectional self-attention: ln(x + dense(attn(query(x), key(x), value(x))))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden
        self.n_heads = cfg.n_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dense = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h, eps=1e-12)

    def forward(self, x):
        n = self.n_heads
        y = _attention(_heads(self.query(x), n), _heads(self.key(x), n), _heads(self.value(x), n),
                       causal=False)
        return self.norm(x + self.dense(y))


class BertMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate = nn.Linear(cfg.hidden, cfg.ffn)
        self.output = nn.Linear(cfg.ffn, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=1e-12)

    def forward(self, x):
        return self.norm(x + self.output(F.gelu(self.intermediate(x))))


class LlamaAttention(nn.Module):
    """Pre-RMSNorm causal grouped-query attention with rotary positions; no biases unless the
    config has them (Qwen2: q/k/v); head size from the config (Gemma: not hidden / heads)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, q, kv = cfg.hidden, cfg.q_dim, cfg.kv_dim
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.kv_heads
        self.norm = RMSNorm(h, eps=1e-6)
        self.q_proj = nn.Linear(h, q, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, kv, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, kv, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q, h, bias=cfg.attn_out_bias)
        self.rotary = Rotary(cfg.head_dim, cfg.seq_len)

    def forward(self, x):
        y = self.norm(x)
        q = self.rotary(_heads(self.q_proj(y), self.n_heads))
        k = self.rotary(_heads(self.k_proj(y), self.n_kv_heads))
        v = _heads(self.v_proj(y), self.n_kv_heads)
        return x + self.o_proj(_attention(q, k, v, causal=True))


class LlamaMLP(nn.Module):
    """Pre-RMSNorm gated MLP: x + down(act(gate(n)) * up(n)), act SiLU (SwiGLU) or tanh GELU
    (GeGLU, Gemma)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, f, b = cfg.hidden, cfg.ffn, cfg.mlp_bias
        self.norm = RMSNorm(h, eps=1e-6)
        self.gate_proj = nn.Linear(h, f, bias=b)
        self.up_proj = nn.Linear(h, f, bias=b)
        self.down_proj = nn.Linear(f, h, bias=b)
        self.act = F.silu if cfg.mlp_kind == "swiglu" else partial(F.gelu, approximate="tanh")

    def forward(self, x):
        y = self.norm(x)
        return x + self.down_proj(self.act(self.gate_proj(y)) * self.up_proj(y))


class Block(nn.Module):
    """attn then mlp; `checkpointed` recomputes both in backward and keeps only the block input."""

    def __init__(self, attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.checkpointed = False

    def forward(self, x):
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self._run, x, use_reentrant=False)
        return self._run(x)

    def _run(self, x):
        return self.mlp(self.attn(x))


class Head(nn.Module):
    """Final norm (gpt2, llama) or MLM transform (bert), the LM head, and the fp32 loss.

    A tied decoder weight is passed in by the model rather than registered here, so the head's own
    parameters are exactly the spec's head group.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden
        self.family = cfg.family
        if cfg.family == "bert":
            self.transform = nn.Linear(h, h)
            self.norm = nn.LayerNorm(h, eps=1e-12)
            self.decoder_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
            self.lm_head = None
        else:
            self.transform = None
            self.norm = RMSNorm(h, eps=1e-6) if cfg.family == "llama" else nn.LayerNorm(h)
            self.decoder_bias = None
            self.lm_head = None if cfg.tied_head else nn.Linear(h, cfg.vocab_size, bias=False)

    def forward(self, x, targets, tied_weight=None):
        if self.transform is not None:
            x = F.gelu(self.transform(x))
        x = self.norm(x)
        if self.lm_head is not None:
            logits = self.lm_head(x)
        else:
            logits = F.linear(x, tied_weight, self.decoder_bias)
        logits = logits.float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


_GROUPS = {"gpt2": (GPT2Attention, GPT2MLP), "bert": (BertAttention, BertMLP),
           "llama": (LlamaAttention, LlamaMLP)}


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        attn_cls, mlp_cls = _GROUPS[cfg.family]
        self.config = cfg
        self.tied = cfg.family == "bert" or cfg.tied_head
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(attn_cls(cfg), mlp_cls(cfg)) for _ in range(cfg.n_layers))
        self.head = Head(cfg)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over all tokens (next-token for gpt2/llama, MLM targets for bert)."""
        if idx.shape[1] > self.config.seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} > the model's {self.config.seq_len}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets, self.embed.tokens.weight if self.tied else None)


def _init_weights(model: TransformerLM, cfg: ModelConfig, generator: torch.Generator) -> None:
    """Normal(0, 0.02) matrices and tables, zero biases, unit norm weights; GPT-2's 1/sqrt(2L)
    scaling on the projections that write into the residual stream."""
    residual_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    residual_names = ("c_proj", "o_proj", "down_proj", "dense", "output")
    for name, p in model.named_parameters():
        if p.is_meta:
            continue
        with torch.no_grad():
            if p.dim() >= 2:
                std = residual_std if name.rsplit(".", 2)[-2] in residual_names else INIT_STD
                p.copy_(torch.randn(p.shape, generator=generator) * std)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def build_model(cfg: ModelConfig, seed: int = 0) -> TransformerLM:
    """The model of `cfg` with a deterministic initialisation from `seed`.

    Built on the current default device: `with torch.device('meta'): build_model(cfg)` counts the
    parameters of a large model without allocating them.
    """
    if cfg.family not in FAMILIES:
        raise UserError(f"unknown family {cfg.family!r}; expected one of {', '.join(FAMILIES)}",
                        source=cfg.name, field="family")
    if (not cfg.head_size and cfg.hidden % cfg.n_heads) or cfg.n_heads % cfg.kv_heads:
        raise UserError("hidden must be a multiple of n_heads and n_heads of n_kv_heads",
                        source=cfg.name, field="n_heads")
    check_runtime_buildable(cfg)
    model = TransformerLM(cfg)
    _init_weights(model, cfg, torch.Generator().manual_seed(seed))
    return model
