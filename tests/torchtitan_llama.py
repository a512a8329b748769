"""A torchtitan-style Llama in plain torch (the structure of torchtitan's models/llama3/model.py,
shrunk): a model osdp-sim did not write and has no built-in layout for, run through LAYOUT.

tok_embeddings -> layers (an nn.ModuleDict "0", "1", ... of TransformerBlock: attention_norm,
attention (wq, wk, wv, wo), ffn_norm, feed_forward (w1, w2, w3)) -> norm -> output.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osdp_sim.model.layout import GroupLayout, ModelLayout, SplitTarget

# The documented worked example (docs/runtime.md, osdp_sim/model/layout.py).
LAYOUT = ModelLayout(
    name="torchtitan-llama",
    blocks="layers",
    attn=GroupLayout(modules=("attention_norm", "attention"),
                     splits=tuple(SplitTarget(f"attention.{w}") for w in ("wq", "wk", "wv", "wo"))),
    mlp=GroupLayout(modules=("ffn_norm", "feed_forward"),
                    splits=tuple(SplitTarget(f"feed_forward.{w}") for w in ("w1", "w2", "w3"))),
    root=("tok_embeddings", "norm", "output"),
)


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 256
    ffn_dim: int = 128
    max_seq_len: int = 32
    rope_theta: float = 10000.0


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    return torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end).float(), freqs))


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x, freqs_cis):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_dim, bias=False)
        self.w2 = nn.Linear(a.ffn_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.attention = Attention(a)
        self.feed_forward = FeedForward(a)
        self.attention_norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=1e-5)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(a.dim // a.n_heads, a.max_seq_len,
                                                               a.rope_theta), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[: tokens.shape[1]]
        for layer in self.layers.values():
            h = layer(h, freqs_cis)
        return self.output(self.norm(h)).float()


def build(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelArgs(**kw))
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=0.02)
    return model


def loss_fn(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
