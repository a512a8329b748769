"""Hugging Face `config.json` files as model descriptions, read as plain JSON (no transformers).

Each supported architecture maps its config keys onto ModelConfig with the defaults of the
transformers 5.x config class for keys a file leaves out. Keys that change the cost are honoured;
keys that do not (rope, norm eps, token ids, ...) are accepted; keys that would change the cost
but are not modelled (dropout above 0, ...) and keys not recognised give one warning line naming
them. docs/models.md lists them per architecture.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.model.config import ModelConfig

DEFAULT_MAX_SEQ_LEN = 4096
"""Sequence length when --seq-len is not given: min(max positions, this). Long-context configs
(Qwen2-7B: 131072) would otherwise plan for a length few train at; 4096 is the pretraining length
of Llama-2 and Phi-3-mini."""

# Keys of transformers' PretrainedConfig and of tokenizers / generation that never change cost.
_COMMON_ACCEPTED = (
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "initializer_range", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "tokenizer_class", "task_specific_params", "problem_type",
    "is_encoder_decoder", "chunk_size_feed_forward", "pruned_heads", "tie_encoder_decoder",
    "torchscript", "auto_map", "gradient_checkpointing", "finetuning_task", "prefix",
    "attn_implementation", "_attn_implementation_autoset", "num_labels", "max_length",
)
_ROPE = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")


@dataclass(frozen=True)
class Arch:
    """How one architecture's config.json becomes a ModelConfig."""

    name: str
    """The `architectures` entry (transformers class name)."""
    model_type: str
    """The config's `model_type`, used when `architectures` is missing."""
    family: str
    """ModelConfig family: block layout, embedding and head."""
    dims: dict
    """ModelConfig field -> config key, for the whole-number shape fields."""
    defaults: dict
    """config key -> the transformers 5.x config class default, used when the file leaves it out."""
    fixed: dict = field(default_factory=dict)
    """ModelConfig fields the architecture fixes (Qwen2's q/k/v bias, Phi3's fused projections)."""
    options: tuple = ()
    """Optional keys honoured beyond `dims`: attention_bias, mlp_bias, sliding_window."""
    accepted: tuple = ()
    """Keys read and ignored: they do not change parameters, FLOPs or saved tensors."""
    zero_or_warn: tuple = ()
    """Keys accepted at 0 (dropout, noise); above 0 they would change what is saved: warned."""


_DECODER_DIMS = {"n_layers": "num_hidden_layers", "hidden": "hidden_size",
                 "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
                 "ffn_hidden": "intermediate_size", "vocab_size": "vocab_size",
                 "head_size": "head_dim"}
_DECODER_ACCEPTED = _ROPE + ("rms_norm_eps", "hidden_act", "pretraining_tp",
                             "max_position_embeddings")

ARCHITECTURES: dict[str, Arch] = {a.name: a for a in (
    Arch("LlamaForCausalLM", "llama", "llama", _DECODER_DIMS,
         {"num_key_value_heads": None, "head_dim": None, "tie_word_embeddings": False,
          "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048},
         options=("attention_bias", "mlp_bias"), accepted=_DECODER_ACCEPTED,
         zero_or_warn=("attention_dropout",)),
    Arch("MistralForCausalLM", "mistral", "llama", _DECODER_DIMS,
         {"num_key_value_heads": 8, "head_dim": None, "tie_word_embeddings": False,
          "sliding_window": 4096, "max_position_embeddings": 131072},
         options=("sliding_window",), accepted=_DECODER_ACCEPTED,
         zero_or_warn=("attention_dropout",)),
    Arch("Qwen2ForCausalLM", "qwen2", "llama", _DECODER_DIMS,
         {"num_key_value_heads": 32, "head_dim": None, "tie_word_embeddings": False,
          "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
          "max_position_embeddings": 32768},
         fixed={"qkv_bias": True, "attn_out_bias": False},
         options=("use_sliding_window", "sliding_window", "max_window_layers"),
         accepted=_DECODER_ACCEPTED + ("layer_types",),
         zero_or_warn=("attention_dropout",)),
    Arch("GemmaForCausalLM", "gemma", "llama", _DECODER_DIMS,
         {"num_key_value_heads": 16, "head_dim": 256, "tie_word_embeddings": True,
          "attention_bias": False, "max_position_embeddings": 8192},
         fixed={"mlp_kind": "geglu"},
         options=("attention_bias",),
         accepted=_DECODER_ACCEPTED + ("hidden_activation", "use_bidirectional_attention"),
         zero_or_warn=("attention_dropout",)),
    Arch("Phi3ForCausalLM", "phi3", "llama", _DECODER_DIMS,
         {"num_key_value_heads": None, "head_dim": None, "tie_word_embeddings": False,
          "sliding_window": None, "max_position_embeddings": 4096},
         fixed={"fused_qkv": True, "fused_gate_up": True},
         options=("sliding_window",),
         accepted=_DECODER_ACCEPTED + ("original_max_position_embeddings",),
         zero_or_warn=("attention_dropout", "resid_pdrop", "embd_pdrop")),
    Arch("MixtralForCausalLM", "mixtral", "llama",
         dict(_DECODER_DIMS, n_experts="num_local_experts", top_k="num_experts_per_tok"),
         {"num_key_value_heads": 8, "head_dim": None, "tie_word_embeddings": False,
          "sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2,
          "max_position_embeddings": 131072},
         fixed={"fused_gate_up": True},
         options=("sliding_window",),
         accepted=_DECODER_ACCEPTED + ("output_router_logits", "router_aux_loss_coef"),
         zero_or_warn=("attention_dropout", "router_jitter_noise")),
    Arch("GPT2LMHeadModel", "gpt2", "gpt2",
         {"n_layers": "n_layer", "hidden": "n_embd", "n_heads": "n_head", "ffn_hidden": "n_inner",
          "vocab_size": "vocab_size", "max_positions": "n_positions"},
         {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None, "vocab_size": 50257,
          "n_positions": 1024, "tie_word_embeddings": True, "add_cross_attention": False},
         accepted=("activation_function", "layer_norm_epsilon", "n_ctx", "scale_attn_weights",
                   "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "summary_type",
                   "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                   "summary_first_dropout", "add_cross_attention"),
         zero_or_warn=("attn_pdrop", "embd_pdrop", "resid_pdrop")),
    Arch("BertForMaskedLM", "bert", "bert",
         {"n_layers": "num_hidden_layers", "hidden": "hidden_size", "n_heads": "num_attention_heads",
          "ffn_hidden": "intermediate_size", "vocab_size": "vocab_size",
          "max_positions": "max_position_embeddings", "type_vocab_size": "type_vocab_size"},
         {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
          "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512,
          "type_vocab_size": 2, "tie_word_embeddings": True, "add_cross_attention": False},
         accepted=("hidden_act", "layer_norm_eps", "position_embedding_type", "classifier_dropout",
                   "is_decoder", "add_cross_attention"),
         zero_or_warn=("hidden_dropout_prob", "attention_probs_dropout_prob")),
)}
_BY_MODEL_TYPE = {a.model_type: a for a in ARCHITECTURES.values()}
# Decoder dims every decoder architecture needs in the file (no default worth trusting).
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def find_config_json(path: Path) -> Path:
    """`path` itself, or the config.json of a folder (as from_pretrained folders hold it)."""
    try:
        is_dir = path.is_dir()
    except (OSError, ValueError):
        is_dir = False           # a name the OS refuses: reading it gives the one-line error
    if is_dir:
        inner = path / "config.json"
        if not inner.is_file():
            raise UserError("this folder holds no config.json; give a model YAML file, a Hugging "
                            "Face config.json, or a folder holding one", source=str(path))
        return inner
    return path


def read_hf_config(path: Path, *, seq_len: int | None = None) -> tuple[ModelConfig, dict, list[str]]:
    """(config, key_of, notes) for a config.json. key_of maps a ModelConfig field to the config
    key it came from (for error messages); notes are lines for the user (sequence length used,
    keys warned about)."""
    from osdp_sim.model.load import read_text
    src = str(path)
    from osdp_sim.fileio import parse_json
    data = parse_json(read_text(path, "config.json"), src)
    if not isinstance(data, dict):
        raise UserError("expected a JSON object (a Hugging Face config.json)", source=src)
    arch = _architecture(data, src)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_hf_dict(data, arch, source=src, name=name or "model", seq_len=seq_len)


def _architecture(data: dict, src: str) -> Arch:
    supported = ", ".join(ARCHITECTURES)
    archs = data.get("architectures")
    if archs is None:
        mt = data.get("model_type")
        if isinstance(mt, str) and mt in _BY_MODEL_TYPE:
            return _BY_MODEL_TYPE[mt]
        raise UserError(f"no `architectures` (or known model_type); supported: {supported}",
                        source=src, field="architectures")
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise UserError(f"expected a list of one architecture name, got {archs!r}", source=src,
                        field="architectures")
    if archs[0] not in ARCHITECTURES:
        raise UserError(f"unsupported architecture {archs[0]!r}; supported: {supported}",
                        source=src, field="architectures")
    return ARCHITECTURES[archs[0]]


class _Reader:
    def __init__(self, data: dict, arch: Arch, src: str):
        self.data, self.arch, self.src = data, arch, src
        self.used: set[str] = set()

    def fail(self, key: str, msg: str):
        raise UserError(msg, source=self.src, field=key)

    def get(self, key: str):
        self.used.add(key)
        if key in self.data:
            return self.data[key]
        if key in self.arch.defaults:
            return self.arch.defaults[key]
        if key in _REQUIRED:
            self.fail(key, "missing required key")
        return None

    def int(self, key: str, *, nullable: bool = True):
        v = self.get(key)
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(key, f"expected a whole number, got {v!r}")
        return v

    def bool(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            self.fail(key, f"expected true or false, got {v!r}")
        return v

    def number(self, key: str) -> float:
        v = self.get(key)
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            self.fail(key, f"expected a number >= 0, got {v!r}")
        return float(v)


def from_hf_dict(data: dict, arch: Arch, *, source: str, name: str,
                 seq_len: int | None = None) -> tuple[ModelConfig, dict, list[str]]:
    r = _Reader(data, arch, source)
    fields: dict = {}
    key_of: dict = {}
    for f, key in arch.dims.items():
        v = r.int(key)
        key_of[f] = key
        if v is not None:
            fields[f] = v
    warned: list[str] = []
    for key in arch.zero_or_warn:
        if r.number(key) > 0:
            warned.append(f"{key}={data[key]}")
    tied = r.bool("tie_word_embeddings")
    key_of["tied_head"] = "tie_word_embeddings"
    fields["tied_head"] = tied

    if arch.family == "llama":
        _decoder_fields(r, arch, fields, key_of, warned)
        positions = r.int("max_position_embeddings")
    else:
        if r.bool("add_cross_attention"):
            r.fail("add_cross_attention", "cross-attention layers are not modelled; only the "
                   "decoder-only (GPT-2) or encoder (BERT) stack is")
        positions = fields.get("max_positions")
        if arch.family == "bert":
            pet = data.get("position_embedding_type", "absolute")
            if pet != "absolute":
                warned.append(f"position_embedding_type={pet}")
            if data.get("is_decoder"):
                warned.append("is_decoder=true")
    fields.update(arch.fixed)

    notes = []
    pos_key = "n_positions" if arch.family == "gpt2" else "max_position_embeddings"
    key_of["seq_len"] = "--seq-len" if seq_len is not None else pos_key
    if (seq_len is None or arch.family != "llama") and (positions is None or positions < 1):
        r.fail(pos_key, f"expected a positive whole number, got {positions!r}")
    if seq_len is None:
        seq_len = min(positions, DEFAULT_MAX_SEQ_LEN)
        notes.append(f"{source}: {arch.name}, sequence length {seq_len} (min of {pos_key} "
                     f"{positions} and {DEFAULT_MAX_SEQ_LEN}); --seq-len overrides")
    unknown = sorted(k for k in data if k not in r.used and k not in arch.accepted
                     and k not in arch.zero_or_warn and k not in _COMMON_ACCEPTED)
    if warned or unknown:
        parts = []
        if warned:
            parts.append("not modelled (the description assumes dropout and noise off): " + ", ".join(warned))
        if unknown:
            parts.append("not recognised, ignored: " + ", ".join(unknown))
        notes.append(f"warning: {source}: " + "; ".join(parts))
    cfg = ModelConfig(name=name, family=arch.family, seq_len=seq_len,
                      source=f"hf:{source} ({arch.name})",
                      implementation="hf",
                      **{k: v for k, v in fields.items() if k in ModelConfig.field_names()})
    return cfg, key_of, notes


def _decoder_fields(r: _Reader, arch: Arch, fields: dict, key_of: dict, warned: list) -> None:
    data = r.data
    if "attention_bias" in arch.options:
        bias = r.bool("attention_bias")
        fields["qkv_bias"] = fields["attn_out_bias"] = bias
        key_of["qkv_bias"] = key_of["attn_out_bias"] = "attention_bias"
    elif "attention_bias" in data:
        r.used.add("attention_bias")
        if data["attention_bias"] is not False:
            warned.append(f"attention_bias={data['attention_bias']} ({arch.name} has no such option)")
    if "mlp_bias" in arch.options:
        fields["mlp_bias"] = r.bool("mlp_bias")
        key_of["mlp_bias"] = "mlp_bias"
    act = data.get("hidden_activation") or data.get("hidden_act") or "silu"
    r.used.update(("hidden_act", "hidden_activation"))
    if not isinstance(act, str):
        r.fail("hidden_act", f"expected an activation name, got {act!r}")
    fields["mlp_kind"] = "geglu" if act.startswith("gelu") else "swiglu"
    key_of["mlp_kind"] = "hidden_act"
    if arch.name == "Qwen2ForCausalLM":
        r.used.update(("sliding_window", "max_window_layers"))
        window = r.int("sliding_window") if r.bool("use_sliding_window") else None
        if window is not None and r.int("max_window_layers", nullable=False) > 0:
            # transformers windows only the layers from max_window_layers on: one window for all
            # layers is what the description can say, so the full-attention layers win.
            warned.append(f"use_sliding_window on layers >= max_window_layers={data.get('max_window_layers', 28)}")
            window = None
        layer_types = data.get("layer_types")
        if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types) and window is None:
            warned.append("layer_types with sliding_attention layers")
    elif "sliding_window" in arch.options:
        window = r.int("sliding_window")
    else:
        window = None
    if window is not None:
        if window < 1:
            r.fail("sliding_window", f"expected a positive whole number or null, got {window!r}")
        fields["sliding_window"] = window
        key_of["sliding_window"] = "sliding_window"
    if fields.get("n_kv_heads") is None:
        fields.pop("n_kv_heads", None)      # null means num_attention_heads
    if fields.get("head_size") is None:
        fields.pop("head_size", None)


# What `--impl hf` (validate, campaign files, tune) needs before any rank starts.

def hf_config_path(cfg, source: str | None = None) -> str:
    """The config.json a model description was read from (its `source`, 'hf:PATH (ARCH)'), as an
    absolute path: what --impl hf builds transformers' model from."""
    import os
    import re
    m = re.fullmatch(r"hf:(.+) \((\w+)\)", cfg.source or "")
    if not m:
        raise UserError(f"--impl hf runs transformers' implementation of a Hugging Face config.json; "
                        f"model {cfg.name!r} did not come from one (source {cfg.source or 'unknown'!r})",
                        source=source, field="--impl")
    path = os.path.abspath(m.group(1))
    if not os.path.isfile(path):
        raise UserError(f"the model's config.json {path} is not there (--impl hf builds the model "
                        "from it)", source=source, field="model.source")
    return path


def check_transformers(field: str = "--impl") -> None:
    import importlib.util
    if importlib.util.find_spec("transformers") is None:
        raise UserError("--impl hf runs transformers' implementation, and transformers is not "
                        "installed; install the extra: pip install -e '.[hf]'", field=field)
