"""Architecture hyperparameters of a transformer: the input of the model description."""

from dataclasses import asdict, dataclass, fields, replace

FAMILIES = ("gpt2", "bert", "llama")
# A model given by measured numbers per group (model/described.py, describe_module), not by shape.
DESCRIBED = "described"
MLP_KINDS = ("gelu", "swiglu", "geglu")
NORM_KINDS = ("layernorm", "rmsnorm")
IMPLEMENTATIONS = ("osdp", "hf")

# Per family: the value of every structural field left unset (None or "").
FAMILY_DEFAULTS = {
    "gpt2": dict(qkv_bias=True, attn_out_bias=True, mlp_bias=True, mlp_kind="gelu",
                 norm_kind="layernorm", fused_qkv=True),
    "bert": dict(qkv_bias=True, attn_out_bias=True, mlp_bias=True, mlp_kind="gelu",
                 norm_kind="layernorm", fused_qkv=False),
    "llama": dict(qkv_bias=False, attn_out_bias=False, mlp_bias=False, mlp_kind="swiglu",
                  norm_kind="rmsnorm", fused_qkv=False),
}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a transformer. `family` fixes the block layout and the embedding and head:

    gpt2  - pre-LN, learned positions, head tied to the embedding
    bert  - post-LN, learned positions + token types + embedding LayerNorm, MLM head (tied)
    llama - pre-norm, rotary positions, grouped-query attention (n_kv_heads), untied head
            (Llama, Mistral, Qwen2, Gemma, Phi3 and Mixtral are this family)

    The structural fields (biases, MLP and norm kind, fused projections) default to the family's
    conventions when left unset (None or ""): gpt2 and bert have biases, a GELU MLP of two
    Linears and LayerNorm (gpt2 one fused c_attn); llama no biases, a SwiGLU MLP of three
    Linears and RMSNorm. After construction every one of them holds its resolved value.
    """

    name: str
    """Shown in reports and used in file names."""
    family: str
    """One of FAMILIES: block layout, positions, embedding and head."""
    n_layers: int
    """Transformer blocks."""
    hidden: int
    """Model width (residual stream), elements per token."""
    n_heads: int
    """Query heads."""
    vocab_size: int
    """Token table rows (= LM head outputs)."""
    seq_len: int
    """Tokens per sample the plan trains on."""
    n_kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means n_heads."""
    ffn_hidden: int = 0
    """MLP inner width (per expert for MoE); 0 means 4 * hidden."""
    max_positions: int = 0
    """Learned position table size (gpt2, bert); 0 means seq_len."""
    type_vocab_size: int = 2
    """Token type table size (bert only)."""
    tied_head: bool = True
    """LM head shares the token table (no weight of its own); llama built-ins set False."""
    head_size: int = 0
    """Elements per attention head; 0 means hidden // n_heads (Gemma-7B: 256 at hidden 3072, 16 heads)."""
    qkv_bias: bool | None = None
    """Bias on the query, key and value projections (Qwen2: yes)."""
    attn_out_bias: bool | None = None
    """Bias on the attention output projection (Qwen2: no)."""
    mlp_bias: bool | None = None
    """Bias on the MLP Linears."""
    mlp_kind: str = ""
    """'gelu': two Linears (up, down); 'swiglu' / 'geglu': gated, three Linears (gate, up, down)."""
    norm_kind: str = ""
    """'layernorm' (weight and bias, fp32 mean and 1/std kept) or 'rmsnorm' (weight, fp32 1/rms)."""
    fused_qkv: bool | None = None
    """Query, key and value as one Linear (GPT-2 c_attn, Phi3 qkv_proj): same parameters, one
    module (what operator splitting and the largest-tensor terms see)."""
    fused_gate_up: bool = False
    """Gate and up projections as one Linear of 2 x ffn outputs (Phi3 gate_up_proj, Mixtral's
    experts in transformers 5.x)."""
    sliding_window: int = 0
    """Attention window in tokens (Mistral); 0 means the whole sequence."""
    n_experts: int = 0
    """Mixture of experts: MLP experts per block (Mixtral 8); 0 means a dense MLP."""
    top_k: int = 0
    """Experts each token is routed to (Mixtral 2); used when n_experts > 0."""
    source: str = ""
    """Where the model came from: 'builtin:NAME', 'yaml:PATH', 'hf:PATH (ARCHITECTURE)'."""
    implementation: str = "osdp"
    """Whose modules run it, which decides what is kept for backward (one of IMPLEMENTATIONS):
    'osdp' the project's runtime modules (osdp_sim/runtime/modules.py), 'hf' transformers 5.x's
    (every config.json; docs/models.md lists what they keep beyond 'osdp')."""
    described: object = None
    """family 'described' only: the measured groups (a model/described.py DescribedModel; its
    to_dict form is accepted and parsed). The shape fields then hold what the cost model reads:
    hidden (block input width), seq_len (tokens per sample), vocab_size (logits per token)."""

    def __post_init__(self):
        if isinstance(self.described, dict):
            from osdp_sim.model.described import described_from_dict
            object.__setattr__(self, "described", described_from_dict(
                self.described, source=self.source or self.name, field="model.described"))
        defaults = FAMILY_DEFAULTS.get(self.family, FAMILY_DEFAULTS["llama"])
        for name, value in defaults.items():
            if getattr(self, name) in (None, ""):
                object.__setattr__(self, name, value)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def positions(self) -> int:
        return self.max_positions or self.seq_len

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        """Query (and attention output) width: heads x head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def gated(self) -> bool:
        return self.mlp_kind != "gelu"

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    @property
    def attended_keys(self) -> int:
        """Keys one query's scores are computed against: the sequence, or the window."""
        return min(self.seq_len, self.sliding_window) if self.sliding_window else self.seq_len

    def to_dict(self) -> dict:
        """Every field; `described` as its explicit-unit dictionary, left out when there is none
        (so the other families' plan files and records are as before)."""
        data = asdict(replace(self, described=None))
        del data["described"]
        if self.described is not None:
            data["described"] = self.described.to_dict()
        return data

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(ModelConfig))


# The model fields each version of the plan and record formats holds: the one place a version is
# added (plan/io.py and records/record.py write MODEL_FORMAT_VERSION and read every key here). A
# file of an older version is read with the fields it lacks at their defaults, which is what its
# predictions used (a version 1 or 2 model ran on the runtime's modules: implementation 'osdp').
V1_FIELDS = ("name", "family", "n_layers", "hidden", "n_heads", "vocab_size", "seq_len",
             "n_kv_heads", "ffn_hidden", "max_positions", "type_vocab_size", "tied_head")
V2_FIELDS = V1_FIELDS + ("head_size", "qkv_bias", "attn_out_bias", "mlp_bias", "mlp_kind",
                         "norm_kind", "fused_qkv", "fused_gate_up", "sliding_window", "n_experts",
                         "top_k", "source")
MODEL_FIELDS = {1: V1_FIELDS, 2: V2_FIELDS, 3: V2_FIELDS + ("implementation", "described")}
MODEL_FIELDS[4] = MODEL_FIELDS[3]   # version 4 changed the plan (selective checkpointing), not the model
MODEL_FORMAT_VERSION = max(MODEL_FIELDS)


def differs_from_family(cfg: ModelConfig) -> list[str]:
    """Fields that take cfg away from its family's built-in structure (what the runtime's own
    modules build): empty for every built-in model."""
    if cfg.family == DESCRIBED:
        return []
    out = [name for name, value in FAMILY_DEFAULTS[cfg.family].items() if getattr(cfg, name) != value]
    if cfg.head_size and cfg.head_size * cfg.n_heads != cfg.hidden:
        out.append("head_size")
    if cfg.fused_gate_up:
        out.append("fused_gate_up")
    if cfg.family == "bert" and not cfg.tied_head:
        out.append("tied_head")
    if cfg.sliding_window and cfg.sliding_window < cfg.seq_len:
        out.append("sliding_window")
    if cfg.n_experts:
        out.append("n_experts")
    return out


# What the runtime's modules build beyond their family's structure: the llama modules take
# biases, a head size and a GeGLU activation from the config (Qwen2, Gemma).
RUNTIME_OPTIONS = {"gpt2": (), "bert": (),
                   "llama": ("qkv_bias", "attn_out_bias", "mlp_bias", "mlp_kind", "head_size")}


def runtime_gaps(cfg: ModelConfig) -> list[str]:
    """Fields the runtime's own modules cannot build as cfg has them."""
    ok = RUNTIME_OPTIONS.get(cfg.family, ())
    return [f for f in differs_from_family(cfg)
            if f not in ok or (f == "mlp_kind" and cfg.mlp_kind == "gelu")]


def check_runtime_buildable(cfg: ModelConfig, source: str | None = None) -> None:
    """The runtime's own torch modules build the three families (and RUNTIME_OPTIONS); a config
    that differs otherwise (fused projections, experts, a window shorter than the sequence, ...)
    would run as a different model, so it is refused rather than measured wrongly."""
    from osdp_sim.errors import UserError
    if cfg.family == DESCRIBED:
        raise UserError("a described model has no built-in modules; run it with its own torch "
                        "module through osdp_sim.runtime.apply_plan (docs/runtime.md, 'Running a "
                        "described module')", source=source or cfg.source or cfg.name, field="--model")
    gaps = runtime_gaps(cfg)
    if gaps:
        raise UserError(f"the runtime's {cfg.family} modules cannot build this model as it is "
                        f"({', '.join(gaps)} differ from the built-in structure); run transformers' own "
                        "implementation of it instead: --impl hf (campaigns: impl: hf)",
                        source=source or cfg.source or cfg.name, field="--model")


def for_implementation(cfg: ModelConfig, impl: str) -> ModelConfig:
    """The model as it is predicted when `impl`'s modules run it: validate and campaign run the
    runtime's own modules ('osdp'), so a config.json model (implementation 'hf') is predicted as
    those modules keep it there. The one place that decides it (validate's --impl hf keeps 'hf')."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"implementation {impl!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
    return cfg if cfg.implementation == impl else with_overrides(cfg, implementation=impl)


def with_overrides(cfg: ModelConfig, **overrides) -> ModelConfig:
    """A copy with some fields replaced; keeps the name unless one is given."""
    data = cfg.to_dict()
    data.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig(**data)
