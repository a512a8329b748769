"""A model description: ordered units (embedding, blocks, head), each holding the operator groups
that a plan decides on, with parameter counts, forward FLOPs and activation bytes per token.

The activation counts follow what the runtime's torch modules (osdp_sim/runtime/modules.py) save
for backward: dropout off, attention through scaled_dot_product_attention (no s^2 term), loss
computed in fp32; a config with implementation 'hf' (every config.json) adds what transformers
5.x's modules keep beyond them (_hf_extra). docs/cost-model.md lists every term.
"""

from dataclasses import dataclass

from osdp_sim.lazy import cached_field
from osdp_sim.model.config import ModelConfig


@dataclass(frozen=True)
class LinearShape:
    """One Linear (or a stack of `copies` equal ones: the experts of an MoE layer, stored as one
    3-D parameter in transformers 5.x), of which each token passes through `active`."""

    name: str
    in_features: int
    out_features: int
    bias: bool
    copies: int = 1
    """Stacked equal Linears (MoE experts); 1 for a plain Linear."""
    active: int = 1
    """Of the copies, how many each token goes through (MoE top-k); 1 for a plain Linear."""

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.copies

    @property
    def params(self) -> int:
        return self.weight_params + (self.out_features * self.copies if self.bias else 0)

    @property
    def fwd_flops_per_token(self) -> float:
        """2 x in x out per Linear a token passes through (bias adds are elementwise, left out)."""
        return 2.0 * self.in_features * self.out_features * self.active


@dataclass(frozen=True)
class Activations:
    """Tensors kept for backward: per token, elements stored in the activation dtype plus bytes
    whose dtype does not follow the precision policy (fp32 norm statistics, logsumexp, fp32 loss
    inputs, int64 token ids); and per forward of one micro-batch, whatever its batch size, the
    same two kinds (transformers' rotary cos/sin tables, seq x head_dim; position ids; the loss)."""

    elems_per_token: float = 0.0
    fixed_bytes_per_token: float = 0.0
    elems_per_forward: float = 0.0
    """Elements (activation dtype) kept once per micro-batch forward, not per token."""
    fixed_bytes_per_forward: float = 0.0
    """Bytes of a fixed dtype kept once per micro-batch forward, not per token."""

    def bytes_per_token(self, act_dtype_bytes: int) -> float:
        """The per-token part only; bytes_for adds the per-forward part."""
        return self.elems_per_token * act_dtype_bytes + self.fixed_bytes_per_token

    def bytes_per_forward(self, act_dtype_bytes: int) -> float:
        return self.elems_per_forward * act_dtype_bytes + self.fixed_bytes_per_forward

    def bytes_for(self, act_dtype_bytes: int, tokens: float) -> float:
        """Bytes kept by one micro-batch forward of `tokens` tokens."""
        return self.bytes_per_token(act_dtype_bytes) * tokens + self.bytes_per_forward(act_dtype_bytes)

    def __add__(self, other: "Activations") -> "Activations":
        return Activations(self.elems_per_token + other.elems_per_token,
                           self.fixed_bytes_per_token + other.fixed_bytes_per_token,
                           self.elems_per_forward + other.elems_per_forward,
                           self.fixed_bytes_per_forward + other.fixed_bytes_per_forward)


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
    largest_param: int = 0
    """Elements of the largest parameter tensor when measured (described models); 0: derived
    from the shapes (costmodel/lowering.py largest_tensor)."""
    bwd_temp: Activations = Activations()
    """Per token: what the group's backward holds beyond its saved tensors and the gradients
    flowing in and out (described models measure it; the built-in families' is 0)."""
    mm_before: int = 0
    """aten.mm calls earlier in its block's forward with every group unsplit (the attention's
    bias-free Linears, for the MLP): their parity decides which of this group's mms selective
    checkpointing saves (mm_saved)."""

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
    sac_activations: Activations = Activations()
    """Kept when the block is selectively checkpointed, beyond the saved mm outputs (which depend
    on the plan's splits: costmodel/lowering.py selective_recompute): ckpt_activations plus the
    SDPA output and its fp32 logsumexp."""

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

    @cached_field
    def param_count(self) -> int:
        return sum(u.param_count for u in self.units)

    @property
    def blocks(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.kind == "block")

    @cached_field
    def groups(self) -> tuple[OpGroup, ...]:
        return tuple(g for u in self.units for g in u.groups)

    @cached_field
    def plan_keys(self) -> tuple[str, ...]:
        """Plan entries in forward order, 'root' first."""
        return tuple(dict.fromkeys(g.plan_key for g in self.groups))

    def params_of(self, plan_key: str) -> int:
        return sum(g.param_count for g in self.groups if g.plan_key == plan_key)

    @cached_field
    def fwd_flops_per_token(self) -> float:
        return sum(u.fwd_flops_per_token for u in self.units)


def _attention_flops_per_token(cfg: ModelConfig) -> float:
    # scores Q K^T and the weighted sum A V: 2 x keys x (heads x head_dim) each, over the keys a
    # query attends (the sequence, or the sliding window).
    return 4.0 * cfg.attended_keys * cfg.q_dim


def _linear_flops(linears: tuple[LinearShape, ...]) -> float:
    return sum(l.fwd_flops_per_token for l in linears)


def _norm_params(cfg: ModelConfig) -> int:
    return cfg.hidden if cfg.norm_kind == "rmsnorm" else 2 * cfg.hidden   # RMSNorm has no bias


def _norm_fixed_bytes(cfg: ModelConfig) -> float:
    # fp32 1/rms (RMSNorm); fp32 mean and 1/std (LayerNorm). On CPU a bf16 LayerNorm keeps them in
    # bf16 (4 bytes, not 8): under 0.2% of a group, left out.
    return 4.0 if cfg.norm_kind == "rmsnorm" else 8.0


def _lse_bytes(cfg: ModelConfig) -> float:
    return 4.0 * cfg.n_heads   # SDPA's fp32 logsumexp, one per head per token


# Activations below are what osdp_sim/runtime/modules.py keeps for backward, measured by
# tests/test_runtime_activations.py (saved tensors, one count per storage, parameters excluded).
# Shared by every family's attention: SDPA (flash kernel, CPU and CUDA) keeps q, k, v, its output
# and the logsumexp. Its output is laid out (batch, seq, heads, head_dim), so the transpose back to
# (batch, seq, hidden) for the output projection needs no copy and that Linear's saved input is the
# SDPA output itself (no separate "contiguous copy" term).

_ATTN_NAMES = {"gpt2": ("c_attn", "c_proj"), "bert": ("query", "key", "value", "dense"),
               "llama": ("q_proj", "k_proj", "v_proj", "o_proj")}


def _attention(cfg: ModelConfig) -> tuple[tuple[LinearShape, ...], Activations]:
    h, q, kv = cfg.hidden, cfg.q_dim, cfg.kv_dim
    names = _ATTN_NAMES[cfg.family]
    out_name = names[-1]
    if cfg.fused_qkv:
        qkv_name = names[0] if cfg.family == "gpt2" else "qkv_proj"
        lin = (LinearShape(qkv_name, h, q + 2 * kv, cfg.qkv_bias),)
    else:
        q_name, k_name, v_name = names[:3] if cfg.family != "gpt2" else ("q_proj", "k_proj", "v_proj")
        lin = (LinearShape(q_name, h, q, cfg.qkv_bias), LinearShape(k_name, h, kv, cfg.qkv_bias),
               LinearShape(v_name, h, kv, cfg.qkv_bias))
    lin += (LinearShape(out_name, q, h, cfg.attn_out_bias),)
    fixed = _norm_fixed_bytes(cfg) + _lse_bytes(cfg)
    if cfg.family == "bert":
        # x (query/key/value input), q, k, v (separate Linears), SDPA out (dense input),
        # residual sum (LN input)
        return lin, Activations(2.0 * h + 2.0 * q + 2.0 * kv, fixed)
    if cfg.fused_qkv and cfg.family == "gpt2":
        # x (LN input), LN out (c_attn input), qkv (q, k, v are views of it), SDPA out (c_proj input)
        return lin, Activations(2.0 * h + (q + 2.0 * kv) + q, fixed)
    if cfg.fused_qkv:
        # As transformers 5.x's Phi3 keeps it (measured, tests/test_hf_measure.py): x, norm out,
        # q and k after rotary, v (a copy: the fused output itself is not kept), SDPA out and
        # the output projection's input (a copy of it)
        return lin, Activations(2.0 * h + 3.0 * q + 2.0 * kv, fixed)
    # x (norm input), norm out (q/k/v input), q after rotary, k after rotary and v (SDPA's GQA
    # keeps them unexpanded), SDPA out (o_proj input). Rotary keeps only its shared cos/sin tables.
    return lin, Activations(2.0 * h + 2.0 * q + 2.0 * kv, fixed)


def _mlp_linears(cfg: ModelConfig, copies: int = 1, active: int = 1, prefix: str = "") -> tuple:
    h, f, b = cfg.hidden, cfg.ffn, cfg.mlp_bias
    if not cfg.gated:
        names = {"gpt2": ("c_fc", "c_proj"), "bert": ("intermediate", "output")}.get(
            cfg.family, ("fc1", "fc2"))
        return (LinearShape(prefix + names[0], h, f, b, copies, active),
                LinearShape(prefix + names[1], f, h, b, copies, active))
    if cfg.fused_gate_up:
        up = (LinearShape(prefix + "gate_up_proj", h, 2 * f, b, copies, active),)
    else:
        up = (LinearShape(prefix + "gate_proj", h, f, b, copies, active),
              LinearShape(prefix + "up_proj", h, f, b, copies, active))
    return up + (LinearShape(prefix + "down_proj", f, h, b, copies, active),)


def _mlp(cfg: ModelConfig) -> tuple[tuple[LinearShape, ...], Activations]:
    h, f = cfg.hidden, cfg.ffn
    stats = _norm_fixed_bytes(cfg)
    # Per token through one MLP (or one expert): gated - its input, gate out (activation input),
    # activation out and up out (product inputs; a fused gate_up output is one storage of 2f),
    # product (down input); GELU - its input, fc out (GELU input), GELU out (proj input).
    per_pass = (h + 4.0 * f) if cfg.gated else (h + 2.0 * f)
    if not cfg.moe:
        # plus the block's x (norm input; BERT: the residual sum, LN input)
        return _mlp_linears(cfg), Activations(h + per_pass, stats)
    e, k = cfg.n_experts, cfg.top_k
    router = LinearShape("router", h, e, False)
    experts = _mlp_linears(cfg, copies=e, active=k, prefix="experts.")
    # MoE (dropless top-k, transformers' Mixtral): x, norm out (router input and the rows each
    # expert gathers), per token-expert pair the gathered rows (h), the expert's MLP tensors,
    # its output (h) and routing weight (1), both kept by the weighting product. Fixed: the fp32
    # softmax of the router logits (E) and the int64 top-k indices (k). Every token has exactly k
    # pairs, so this holds however the tokens are balanced across experts.
    elems = 2.0 * h + k * (per_pass + h + 1.0)
    return (router,) + experts, Activations(elems, stats + 4.0 * e + 8.0 * k)


# What transformers 5.x's modules keep beyond the above (implementation 'hf'), measured per group
# by tests/test_hf_measure.py (saved-tensor hooks, sdpa attention, grouped_mm experts) and listed
# with their sources in docs/cost-model.md, "transformers' own modules".

def _hf_norm(cfg: ModelConfig) -> Activations:
    """One RMSNorm beyond the description's input, output and fp32 1/rms."""
    h = cfg.hidden
    if cfg.norm_kind != "rmsnorm":
        return Activations()            # nn.LayerNorm keeps what the description says
    if cfg.mlp_kind == "geglu":
        # GemmaRMSNorm (Gemma is the supported GeGLU architecture): x.float() (4h, in place of
        # the input), the fp32 normalised tensor (4h) and, once per forward, fp32 1 + weight.
        return Activations(-h, 8.0 * h, 0.0, 4.0 * h)
    # LlamaRMSNorm (Qwen2, Phi3, Mixtral alike): x.float() (4h) and the normalised tensor cast
    # back (h elements), in place of the input (h elements).
    return Activations(0.0, 4.0 * h)


def _hf_extra(cfg: ModelConfig) -> dict[str, Activations]:
    """Per group kind (and 'rotary', block 0's attention alone), what transformers keeps beyond
    the 'osdp' description."""
    h, s = cfg.hidden, cfg.seq_len
    norm = _hf_norm(cfg)
    out = {"embed": Activations(), "attn": norm, "mlp": norm, "head": norm, "rotary": Activations()}
    if cfg.family == "llama":
        # The rotary cos/sin, (1, seq, head_dim) each in the activation dtype, computed once per
        # forward and kept by block 0's q/k products (the later blocks share them).
        out["rotary"] = Activations(elems_per_forward=2.0 * s * cfg.head_dim)
    else:
        out["embed"] = Activations(fixed_bytes_per_forward=8.0 * s)   # int64 position ids (1, seq)
    if cfg.family == "gpt2":
        # GPT2Attention hands SDPA contiguous copies of q and v (k stays a view of c_attn's
        # output); gelu_new (NewGELUActivation, tanh formula in plain ops) keeps three more
        # ffn-wide tensors than one GELU.
        out["attn"] += Activations(float(cfg.q_dim + cfg.kv_dim))
        out["mlp"] += Activations(3.0 * cfg.ffn)
    if cfg.moe:
        e, k = cfg.n_experts, cfg.top_k
        # MixtralTopKRouter / transformers.integrations.moe: per pair the routing weight in fp32
        # (4, in place of one activation element), the sort permutation, its // top_k and the
        # inverse permutation (int64); per token the top-k weights and their sum before the
        # renormalising division (fp32); per forward grouped_mm's int32 expert offsets.
        out["mlp"] += Activations(-1.0 * k, 28.0 * k + 4.0 + 4.0 * k, 0.0, 4.0 * e)
    if cfg.family == "bert":
        # BertForMaskedLM's loss runs on the logits in the activation dtype (no fp32 upcast):
        # log-softmax in V elements, not 4V bytes; its scalar loss likewise.
        out["head"] += Activations(float(cfg.vocab_size), -4.0 * cfg.vocab_size, 1.0)
    else:
        out["head"] += Activations(fixed_bytes_per_forward=4.0)   # the fp32 scalar loss
    return out


def mm_calls(l: LinearShape, slices: int = 1) -> int:
    """aten.mm calls of one Linear's forward: a bias-free Linear is one mm (a biased one runs as
    aten.addmm); split into k slices, k mms (the slices have no bias; it is added after)."""
    return slices if slices > 1 else int(not l.bias)


def mm_saved(before: int) -> bool:
    """torchtitan's selective policy saves the 1st, 3rd, ... mm of a block: the call after
    `before` earlier ones is saved when `before` is even."""
    return before % 2 == 0


def selective_supported(cfg: ModelConfig) -> str:
    """'' when selective checkpointing is modelled for this model, else why not."""
    if cfg.described is not None:
        return ("selective checkpointing is not modelled for a described model (its saved op "
                "outputs are not measured); use full checkpointing")
    if cfg.moe:
        return ("selective checkpointing is not modelled for mixture-of-experts models; use full "
                "checkpointing")
    return ""


def _described_group(name: str, kind: str, plan_key: str, g) -> OpGroup:
    return OpGroup(name, kind, plan_key, g.linears, g.other_params, g.flops_per_token,
                   g.activations, g.largest_param, g.bwd_temp)


def _described_spec(cfg: ModelConfig) -> ModelSpec:
    """The measured groups as they are (model/described.py); blocks beyond the described ones
    repeat the last (the planner's n+1 extrapolation)."""
    d = cfg.described
    if cfg.seq_len != d.seq_len:
        # per-token numbers hold at the measured length only (attention grows with it)
        from osdp_sim.errors import UserError
        raise UserError(f"the described model {cfg.name!r} was measured at seq_len {d.seq_len}; "
                        f"describe it again at {cfg.seq_len}", source=cfg.source or None,
                        field="seq_len")
    embed = _described_group("embed", "embed", "root", d.embed)
    # the batch the caller holds through the step: live from the first forward step on
    embed = OpGroup(embed.name, embed.kind, embed.plan_key, embed.linears, embed.other_params,
                    embed.fwd_flops_per_token, embed.activations + Activations(
                        d.input_elems_per_token, d.input_fixed_bytes_per_token),
                    embed.largest_param, embed.bwd_temp)
    units = [Unit("embed", "embed", -1, (embed,), Activations())]
    for i, b in enumerate(d.block_list(cfg.n_layers)):
        groups = tuple(_described_group(f"block{i}.{k}", k, f"block{i}.{k}", getattr(b, k))
                       for k in ("attn", "mlp"))
        units.append(Unit(f"block{i}", "block", i, groups,
                          Activations(b.checkpoint_elems_per_token, b.checkpoint_fixed_bytes_per_token)))
    units.append(Unit("head", "head", -1, (_described_group("head", "head", "root", d.head),),
                      Activations()))
    return ModelSpec(cfg, tuple(units))


def build_spec(cfg: ModelConfig) -> ModelSpec:
    """Units in forward order: embed, block0..block{L-1}, head."""
    if cfg.described is not None:
        return _described_spec(cfg)
    h = cfg.hidden
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
    hf = _hf_extra(cfg) if cfg.implementation == "hf" else None
    if hf:
        embed_act += hf["embed"]
    units.append(Unit("embed", "embed", -1, (
        OpGroup("embed", "embed", "root", (), embed_params, 0.0, embed_act),), Activations()))

    attn_lin, attn_act = _attention(cfg)
    mlp_lin, mlp_act = _mlp(cfg)
    if hf:
        attn_act, mlp_act = attn_act + hf["attn"], mlp_act + hf["mlp"]
    attn_flops = _linear_flops(attn_lin) + _attention_flops_per_token(cfg)
    mlp_flops = _linear_flops(mlp_lin)
    for i in range(cfg.n_layers):
        act = attn_act + hf["rotary"] if hf and i == 0 else attn_act
        attn = OpGroup(f"block{i}.attn", "attn", f"block{i}.attn", attn_lin, norm, attn_flops, act)
        mlp = OpGroup(f"block{i}.mlp", "mlp", f"block{i}.mlp", mlp_lin, norm, mlp_flops, mlp_act,
                      mm_before=sum(mm_calls(l) for l in attn_lin))
        # A checkpointed block keeps only its input (torch.utils.checkpoint, non-reentrant); in
        # transformers also the rotary tables, an input of every block, until block 0's backward.
        ckpt = Activations(float(h), 0.0) + (hf["rotary"] if hf and i == 0 else Activations())
        # Selective: also the outputs of the ops torchtitan's policy saves. SDPA's are its output
        # (q_dim) and fp32 logsumexp, in transformers' modules as in ours; the saved mm outputs
        # depend on the plan's splits (costmodel/lowering.py selective_recompute).
        sac = ckpt + Activations(float(cfg.q_dim), _lse_bytes(cfg))
        units.append(Unit(f"block{i}", "block", i, (attn, mlp), ckpt, sac))

    # Head: final norm + LM head (tied: no weight of its own), loss on fp32 log-probabilities.
    # The loss keeps the fp32 log_softmax output and the int64 targets; the logits themselves are
    # not kept (the Linear keeps its input, log_softmax its output).
    loss_bytes = 4.0 * cfg.vocab_size + 8.0
    if cfg.family == "bert":
        head_lin = (LinearShape("transform", h, h, True),)
        if not cfg.tied_head:
            # HF BertForMaskedLM with tie_word_embeddings false: the decoder gets its own weight,
            # and its bias is then a separate parameter from the head's `bias` (transformers 5.x)
            head_lin += (LinearShape("decoder", h, cfg.vocab_size, True),)
        head_other = norm + cfg.vocab_size   # transform LN + decoder bias (weight tied by default)
        # transform in (last block out), GELU in, LN in, decoder in
        head_act = Activations(4.0 * h, stats + loss_bytes)
        head_flops = _linear_flops(head_lin[:1]) + 2.0 * h * cfg.vocab_size
    else:
        head_lin = () if cfg.tied_head else (LinearShape("lm_head", h, cfg.vocab_size, False),)
        head_other = norm
        head_act = Activations(2.0 * h, stats + loss_bytes)  # norm in (last block out), head in
        head_flops = 2.0 * h * cfg.vocab_size
    if hf:
        head_act += hf["head"]
    units.append(Unit("head", "head", -1, (
        OpGroup("head", "head", "root", head_lin, head_other, head_flops, head_act),), Activations()))
    return ModelSpec(cfg, tuple(units))
