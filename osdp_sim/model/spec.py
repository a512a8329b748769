"""A model description: ordered units (embedding, blocks, head), each holding the operator groups
that a plan decides on, with parameter counts, forward FLOPs and activation bytes per token.

The activation counts follow what the runtime's torch modules (osdp_sim/runtime/modules.py) save
for backward: dropout off, attention through scaled_dot_product_attention (no s^2 term), loss
computed in fp32. docs/cost-model.md lists every term.
"""

from dataclasses import dataclass
from functools import cached_property

from osdp_sim.model.config import ModelConfig


@dataclass(frozen=True)
class LinearShape:
    name: str
    in_features: int
    out_features: int
    bias: bool

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features

    @property
    def params(self) -> int:
        return self.weight_params + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class Activations:
    """Tensors kept for backward, per token: elements stored in the activation dtype, plus bytes
    whose dtype does not follow the precision policy (fp32 norm statistics, logsumexp, fp32 loss
    inputs, int64 token ids)."""

    elems_per_token: float = 0.0
    fixed_bytes_per_token: float = 0.0

    def bytes_per_token(self, act_dtype_bytes: int) -> float:
        return self.elems_per_token * act_dtype_bytes + self.fixed_bytes_per_token

    def __add__(self, other: "Activations") -> "Activations":
        return Activations(self.elems_per_token + other.elems_per_token,
                           self.fixed_bytes_per_token + other.fixed_bytes_per_token)


@dataclass(frozen=True)
class OpGroup:
    """The smallest thing a plan decides on: one FSDP unit (or one split family of them).

    plan_key names the plan entry that decides it: 'root' for embedding and head (one FSDP root
    unit, shared because the head may be tied to the embedding), 'block{i}.attn', 'block{i}.mlp'.
    """

    name: str
    kind: str                      # embed | attn | mlp | head
    plan_key: str
    linears: tuple[LinearShape, ...]
    other_params: int              # norms, embeddings, biases outside `linears`
    fwd_flops_per_token: float
    activations: Activations

    @property
    def param_count(self) -> int:
        return sum(l.params for l in self.linears) + self.other_params

    @property
    def splittable_params(self) -> int:
        """Linear weights: what operator splitting cuts into slices (biases and norms are not)."""
        return sum(l.weight_params for l in self.linears)

    @property
    def splittable(self) -> bool:
        return self.kind in ("attn", "mlp")


@dataclass(frozen=True)
class Unit:
    """A unit of the forward order: embedding, one transformer block, or the head."""

    name: str
    kind: str                      # embed | block | head
    index: int                     # block index; -1 for embed and head
    groups: tuple[OpGroup, ...]
    ckpt_activations: Activations  # kept for backward when the block is checkpointed

    @property
    def param_count(self) -> int:
        return sum(g.param_count for g in self.groups)

    @property
    def fwd_flops_per_token(self) -> float:
        return sum(g.fwd_flops_per_token for g in self.groups)

    @property
    def activations(self) -> Activations:
        out = Activations()
        for g in self.groups:
            out = out + g.activations
        return out


@dataclass(frozen=True)
class ModelSpec:
    config: ModelConfig
    units: tuple[Unit, ...]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @cached_property
    def param_count(self) -> int:
        return sum(u.param_count for u in self.units)

    @property
    def blocks(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.kind == "block")

    @cached_property
    def groups(self) -> tuple[OpGroup, ...]:
        return tuple(g for u in self.units for g in u.groups)

    @cached_property
    def plan_keys(self) -> tuple[str, ...]:
        """Plan entries in forward order, 'root' first."""
        return tuple(dict.fromkeys(g.plan_key for g in self.groups))

    def params_of(self, plan_key: str) -> int:
        return sum(g.param_count for g in self.groups if g.plan_key == plan_key)

    @cached_property
    def fwd_flops_per_token(self) -> float:
        return sum(u.fwd_flops_per_token for u in self.units)


def _attention_flops_per_token(cfg: ModelConfig) -> float:
    # scores Q K^T and the weighted sum A V over the full sequence: 2 * s * h each.
    return 4.0 * cfg.seq_len * cfg.hidden


def _linear_flops(linears: tuple[LinearShape, ...]) -> float:
    return sum(2.0 * l.weight_params for l in linears)


def _norm_params(cfg: ModelConfig) -> int:
    return cfg.hidden if cfg.family == "llama" else 2 * cfg.hidden   # RMSNorm has no bias


def _norm_fixed_bytes(cfg: ModelConfig) -> float:
    # fp32 1/rms (RMSNorm); fp32 mean and 1/std (LayerNorm). On CPU a bf16 LayerNorm keeps them in
    # bf16 (4 bytes, not 8): under 0.2% of a group, left out.
    return 4.0 if cfg.family == "llama" else 8.0


def _lse_bytes(cfg: ModelConfig) -> float:
    return 4.0 * cfg.n_heads   # SDPA's fp32 logsumexp, one per head per token


# Activations below are what osdp_sim/runtime/modules.py keeps for backward, measured by
# tests/test_runtime_activations.py (saved tensors, one count per storage, parameters excluded).
# Shared by every family's attention: SDPA (flash kernel, CPU and CUDA) keeps q, k, v, its output
# and the logsumexp. Its output is laid out (batch, seq, heads, head_dim), so the transpose back to
# (batch, seq, hidden) for the output projection needs no copy and that Linear's saved input is the
# SDPA output itself (no separate "contiguous copy" term).


def build_spec(cfg: ModelConfig) -> ModelSpec:
    """Units in forward order: embed, block0..block{L-1}, head."""
    h, f = cfg.hidden, cfg.ffn
    bias = cfg.family != "llama"
    kv_dim = cfg.kv_heads * cfg.head_dim
    norm = _norm_params(cfg)
    stats = _norm_fixed_bytes(cfg)
    units: list[Unit] = []

    # Embedding: token table (+ learned positions, + token types for BERT, + BERT's embedding LN).
    # Positions and token type are added as table slices, which keep nothing.
    embed_params = cfg.vocab_size * h
    embed_act = Activations(0.0, 8.0)                    # int64 token ids kept by the lookup
    if cfg.family in ("gpt2", "bert"):
        embed_params += cfg.positions * h
    if cfg.family == "bert":
        embed_params += cfg.type_vocab_size * h + norm
        embed_act = Activations(float(h), 8.0 + stats)   # LN input and its statistics
    units.append(Unit("embed", "embed", -1, (
        OpGroup("embed", "embed", "root", (), embed_params, 0.0, embed_act),), Activations()))

    for i in range(cfg.n_layers):
        if cfg.family == "llama":
            attn_lin = (LinearShape("q_proj", h, h, False), LinearShape("k_proj", h, kv_dim, False),
                        LinearShape("v_proj", h, kv_dim, False), LinearShape("o_proj", h, h, False))
            mlp_lin = (LinearShape("gate_proj", h, f, False), LinearShape("up_proj", h, f, False),
                       LinearShape("down_proj", f, h, False))
            # x (RMSNorm input), norm out (q/k/v input), q after rotary (h), k after rotary and v
            # (kv_dim each; SDPA's GQA keeps them unexpanded), SDPA out (o_proj input). Rotary keeps
            # only its shared cos/sin tables, RMSNorm its input and fp32 1/rms.
            attn_act = Activations(4.0 * h + 2.0 * kv_dim, stats + _lse_bytes(cfg))
            # x, norm out (gate/up input), gate out (silu input), silu out and up out (product
            # inputs), product (down_proj input)
            mlp_act = Activations(2.0 * h + 4.0 * f, stats)
        elif cfg.family == "gpt2":
            attn_lin = (LinearShape("c_attn", h, 3 * h, bias), LinearShape("c_proj", h, h, bias))
            mlp_lin = (LinearShape("c_fc", h, f, bias), LinearShape("c_proj", f, h, bias))
            # x (LN input), LN out (c_attn input), qkv (3h; q, k, v are views of it), SDPA out
            # (c_proj input)
            attn_act = Activations(6.0 * h, stats + _lse_bytes(cfg))
            # x (LN input), LN out (c_fc input), fc out (GELU input), GELU out (c_proj input)
            mlp_act = Activations(2.0 * h + 2.0 * f, stats)
        else:  # bert, post-LN
            attn_lin = (LinearShape("query", h, h, bias), LinearShape("key", h, h, bias),
                        LinearShape("value", h, h, bias), LinearShape("dense", h, h, bias))
            mlp_lin = (LinearShape("intermediate", h, f, bias), LinearShape("output", f, h, bias))
            # x (query/key/value input), q, k, v (separate Linears), SDPA out (dense input),
            # residual sum (LN input)
            attn_act = Activations(6.0 * h, stats + _lse_bytes(cfg))
            # x (intermediate input), fc out (GELU input), GELU out (output input), residual sum
            # (LN input)
            mlp_act = Activations(2.0 * h + 2.0 * f, stats)
        attn = OpGroup(f"block{i}.attn", "attn", f"block{i}.attn", attn_lin, norm,
                       _linear_flops(attn_lin) + _attention_flops_per_token(cfg), attn_act)
        mlp = OpGroup(f"block{i}.mlp", "mlp", f"block{i}.mlp", mlp_lin, norm,
                      _linear_flops(mlp_lin), mlp_act)
        # A checkpointed block keeps only its input (torch.utils.checkpoint, non-reentrant).
        units.append(Unit(f"block{i}", "block", i, (attn, mlp), Activations(float(h), 0.0)))

    # Head: final norm + LM head (tied: no weight of its own), loss on fp32 log-probabilities.
    # The loss keeps the fp32 log_softmax output and the int64 targets; the logits themselves are
    # not kept (the Linear keeps its input, log_softmax its output).
    loss_bytes = 4.0 * cfg.vocab_size + 8.0
    if cfg.family == "bert":
        head_lin = (LinearShape("transform", h, h, True),)
        head_other = norm + cfg.vocab_size   # transform LN + decoder bias (decoder weight tied)
        # transform in (last block out), GELU in, LN in, decoder in
        head_act = Activations(4.0 * h, stats + loss_bytes)
        head_flops = _linear_flops(head_lin) + 2.0 * h * cfg.vocab_size
    else:
        head_lin = () if cfg.tied_head else (LinearShape("lm_head", h, cfg.vocab_size, False),)
        head_other = norm
        head_act = Activations(2.0 * h, stats + loss_bytes)  # norm in (last block out), head in
        head_flops = 2.0 * h * cfg.vocab_size
    units.append(Unit("head", "head", -1, (
        OpGroup("head", "head", "root", head_lin, head_other, head_flops, head_act),), Activations()))
    return ModelSpec(cfg, tuple(units))
