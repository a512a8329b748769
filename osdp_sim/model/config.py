"""Architecture hyperparameters of a transformer: the input of the model description."""

from dataclasses import asdict, dataclass, fields

FAMILIES = ("gpt2", "bert", "llama")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a transformer. `family` fixes norm, MLP, bias and head conventions:

    gpt2  - pre-LN LayerNorm, GELU MLP (4h), biases, learned positions, head tied to the embedding
    bert  - post-LN LayerNorm, GELU MLP, biases, learned positions + token types, MLM head (tied)
    llama - pre-norm RMSNorm, SwiGLU MLP (three Linears), no biases, rotary positions,
            grouped-query attention (n_kv_heads), untied head
    """

    name: str
    family: str
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    seq_len: int
    n_kv_heads: int = 0          # 0 means n_heads
    ffn_hidden: int = 0          # 0 means 4 * hidden
    max_positions: int = 0       # learned position table size; 0 means seq_len
    type_vocab_size: int = 2     # bert only
    tied_head: bool = True       # llama sets False

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
        return self.hidden // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(ModelConfig))


def with_overrides(cfg: ModelConfig, **overrides) -> ModelConfig:
    """A copy with some fields replaced; keeps the name unless one is given."""
    data = cfg.to_dict()
    data.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig(**data)
