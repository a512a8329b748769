"""Resolve a model argument: a built-in name or a YAML file describing the shape."""

import sys
from pathlib import Path


from osdp_sim.errors import UserError
from osdp_sim.model.config import (DESCRIBED, FAMILIES, IMPLEMENTATIONS, MLP_KINDS, MODEL_FIELDS,
                                   MODEL_FORMAT_VERSION, NORM_KINDS, ModelConfig, with_overrides)
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import ModelSpec, build_spec

# Bounds that keep every count finite in floating point (parameters, FLOPs, bytes) and the model
# description small enough to build: no published transformer comes near them.
MAX_LAYERS = 100_000
MAX_DIM = 2 ** 40

# Every ModelConfig field: (type, minimum). Ints are checked against MAX_DIM (MAX_LAYERS for
# n_layers, MAX_EXPERTS for n_experts); `str` fields must be non-empty (but `source`).
FIELD_TYPES: dict[str, tuple[type, int]] = {
    "name": (str, 0), "family": (str, 0), "n_layers": (int, 1), "hidden": (int, 1),
    "n_heads": (int, 1), "vocab_size": (int, 1), "seq_len": (int, 1), "n_kv_heads": (int, 0),
    "ffn_hidden": (int, 0), "max_positions": (int, 0), "type_vocab_size": (int, 1),
    "tied_head": (bool, 0), "head_size": (int, 0), "qkv_bias": (bool, 0),
    "attn_out_bias": (bool, 0), "mlp_bias": (bool, 0), "mlp_kind": (str, 0), "norm_kind": (str, 0),
    "fused_qkv": (bool, 0), "fused_gate_up": (bool, 0), "sliding_window": (int, 0),
    "n_experts": (int, 0), "top_k": (int, 0), "source": (str, 0), "implementation": (str, 0),
}
MAX_EXPERTS = 2 ** 16

# YAML key -> ModelConfig field
YAML_KEYS = {
    "name": "name", "family": "family", "layers": "n_layers", "hidden": "hidden", "heads": "n_heads",
    "kv_heads": "n_kv_heads", "ffn": "ffn_hidden", "vocab": "vocab_size", "seq_len": "seq_len",
    "max_positions": "max_positions", "type_vocab": "type_vocab_size", "tied_head": "tied_head",
    "head_dim": "head_size", "qkv_bias": "qkv_bias", "attn_out_bias": "attn_out_bias",
    "mlp_bias": "mlp_bias", "mlp": "mlp_kind", "norm": "norm_kind", "fused_qkv": "fused_qkv",
    "fused_gate_up": "fused_gate_up", "sliding_window": "sliding_window", "experts": "n_experts",
    "top_k": "top_k", "implementation": "implementation",
}
_REQUIRED = ("family", "layers", "hidden", "heads", "vocab", "seq_len")
_YAML_KEY_OF = {f: k for k, f in YAML_KEYS.items()}


def load_model_config(arg: str, *, notes: list | None = None, **overrides) -> ModelConfig:
    """`arg` is a built-in name (see `osdp-sim models`), a model YAML file, a Hugging Face
    config.json or a folder holding one. Lines for the user (the sequence length a config.json
    gets, keys it ignores) go to `notes` if given, else to stderr once the config is valid."""
    given = {k: v for k, v in overrides.items() if v is not None}
    lines: list[str] = []
    path = Path(arg)
    if arg in BUILTIN:
        cfg, key_of = BUILTIN[arg], None
    elif arg.endswith(".json") or _probe(path, Path.is_dir) or path.name == "config.json":
        from osdp_sim.model.hf import find_config_json, read_hf_config
        json_path = find_config_json(path)
        cfg, keys, lines = read_hf_config(json_path, seq_len=given.get("seq_len"))
        key_of, arg = keys.get, str(json_path)
    elif arg.endswith((".yaml", ".yml")) or _probe(path, Path.exists):
        cfg, key_of = _config_from_yaml(path), _YAML_KEY_OF.get
    else:
        raise UserError(f"unknown model {arg!r}; use a built-in name ({', '.join(sorted(BUILTIN))}), "
                        "a model YAML file or a Hugging Face config.json", field="--model")
    cfg = with_overrides(cfg, **given)
    validate_config(cfg, source=arg, key_of=_override_key_of(given, key_of))
    if notes is not None:
        notes.extend(lines)
    else:
        for line in lines:
            print(line, file=sys.stderr)
    return cfg


def _probe(path: Path, test) -> bool:
    """Path.is_dir / exists, False where the OS refuses the name (too long, ...)."""
    try:
        return test(path)
    except (OSError, ValueError):
        return False


def _override_key_of(given: dict, key_of):
    """Errors in an overridden field name the flag (--seq-len), others the file's key."""
    def name(field: str) -> str:
        if field in given:
            return "--" + field.replace("_", "-")
        return (key_of(field) if key_of else None) or field
    return name


def load_model(arg: str, *, notes: list | None = None, **overrides) -> ModelSpec:
    return build_spec(load_model_config(arg, notes=notes, **overrides))


def config_from_dict(data: dict, *, source: str, version: int = MODEL_FORMAT_VERSION) -> ModelConfig:
    """A ModelConfig from its to_dict() form (as stored in plan files and records); errors name
    the field as `model.<field>`. A file of format `version` holds MODEL_FIELDS[version]: the
    upgrade is that later fields take their defaults (version 1: the family's structure and
    source ""; versions 1 and 2: implementation 'osdp')."""
    if not isinstance(data, dict):
        raise UserError("expected a mapping of model fields", source=source, field="model")
    known = set(MODEL_FIELDS[version])
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise UserError(f"unknown key {unknown[0]!r}; expected some of {sorted(known)}",
                        source=source, field=f"model.{unknown[0]}")
    for name, value in data.items():
        if name != "described":
            check_value(value, FIELD_TYPES[name][0], source=source, field=f"model.{name}",
                        allow_empty=name == "source")
    if "described" in data:
        from osdp_sim.model.described import described_from_dict
        data = dict(data, described=described_from_dict(data["described"], source=source,
                                                        field="model.described"))
    try:
        cfg = ModelConfig(**data)
    except TypeError as e:
        raise UserError(f"incomplete model description ({e})", source=source, field="model") from None
    validate_config(cfg, source=source, key_of=lambda f: f"model.{f}")
    return cfg


def read_text(path: Path, kind: str = "model") -> str:
    """The file's text as UTF-8 (fileio.read_text: a folder, an unreadable, huge or non-UTF-8 file
    is a UserError naming it), a missing one pointing at the built-in names."""
    from osdp_sim import fileio
    src = str(path)
    try:
        if not path.exists():
            raise UserError("file not found; give a built-in model name or an existing model file",
                            source=src)
    except (OSError, ValueError) as e:   # a name the OS refuses (too long, a NUL byte)
        raise UserError(f"not a usable file name ({e.__class__.__name__})", source=repr(src)) from None
    return fileio.read_text(path, kind)


def check_value(value, want: type, *, source: str, field: str, allow_empty: bool = False) -> None:
    """Type check with the YAML/JSON reading in mind: true is not a number, 2.0 not a whole one."""
    if want is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UserError(f"expected a whole number, got {value!r}", source=source, field=field)
    if want is bool and not isinstance(value, bool):
        raise UserError(f"expected true or false, got {value!r}", source=source, field=field)
    if want is str and (not isinstance(value, str) or (not value and not allow_empty)):
        raise UserError(f"expected text, got {value!r}", source=source, field=field)


def _config_from_yaml(path: Path) -> ModelConfig:
    src = str(path)
    if _probe(path, Path.is_dir):
        raise UserError("is a folder, not a model YAML file", source=src)
    from osdp_sim.fileio import parse_yaml
    data = parse_yaml(read_text(path), src)        # alias expansion and nesting bounded
    if isinstance(data, dict) and "described" in data:
        return _described_from_yaml(data, path)
    if not isinstance(data, dict):
        raise UserError("expected a mapping with keys " + ", ".join(_REQUIRED), source=src)
    for key in data:
        if key not in YAML_KEYS:
            raise UserError(f"unknown key; expected one of {sorted(YAML_KEYS)}", source=src, field=str(key))
    for key in _REQUIRED:
        if key not in data:
            raise UserError("missing required key", source=src, field=key)
    for key, value in data.items():
        check_value(value, FIELD_TYPES[YAML_KEYS[key]][0], source=src, field=key)
    fields = {YAML_KEYS[k]: v for k, v in data.items()}
    fields.setdefault("name", path.stem)
    fields["source"] = f"yaml:{path}"
    fields.setdefault("tied_head", data["family"] != "llama")
    return ModelConfig(**fields)


def described_config(d, *, source: str = "") -> ModelConfig:
    """The ModelConfig carrying a DescribedModel: the shape fields are what the cost model reads
    (hidden, seq_len, vocab_size = logits per token, n_layers); the rest keep their defaults."""
    return ModelConfig(name=d.name, family=DESCRIBED, n_layers=d.n_blocks, hidden=d.hidden,
                       n_heads=1, vocab_size=d.logits_per_token, seq_len=d.seq_len,
                       tied_head=False, source=source, described=d)


def _described_from_yaml(data: dict, path: Path) -> ModelConfig:
    from osdp_sim.model.described import described_from_dict
    src = str(path)
    extra = [k for k in data if k != "described"]
    if extra:
        raise UserError("a described model file holds only the `described:` section",
                        source=src, field=str(extra[0]))
    section = data["described"]
    if isinstance(section, dict) and "name" not in section:
        section = dict(section, name=path.stem)
    return described_config(described_from_dict(section, source=src), source=f"yaml:{path}")


def validate_config(cfg: ModelConfig, *, source: str, key_of=None) -> None:
    """Ranges and consistency of a config. `key_of(field)` is the key as the user wrote it
    (`layers` in a YAML file, `model.n_layers` in a plan file); errors name that key."""
    def key(field: str) -> str:
        return (key_of(field) if key_of else None) or field

    def fail(field: str, msg: str):
        raise UserError(msg, source=source, field=key(field))

    for name, (want, minimum) in FIELD_TYPES.items():
        v = getattr(cfg, name)
        if name == "source" and v == "":
            continue
        check_value(v, want, source=source, field=key(name))
        if want is int:
            top = {"n_layers": MAX_LAYERS, "n_experts": MAX_EXPERTS}.get(name, MAX_DIM)
            if not minimum <= v <= top:
                fail(name, f"must be a whole number in {minimum}..{top}, got {v!r}")
    if cfg.family == DESCRIBED or cfg.described is not None:
        _validate_described(cfg, fail)
        return
    if cfg.family not in FAMILIES:
        fail("family", f"unknown family {cfg.family!r}; expected one of "
             f"{', '.join(FAMILIES + (DESCRIBED,))}")
    if cfg.mlp_kind not in MLP_KINDS:
        fail("mlp_kind", f"expected one of {', '.join(MLP_KINDS)}, got {cfg.mlp_kind!r}")
    if cfg.norm_kind not in NORM_KINDS:
        fail("norm_kind", f"expected one of {', '.join(NORM_KINDS)}, got {cfg.norm_kind!r}")
    if cfg.implementation not in IMPLEMENTATIONS:
        fail("implementation", f"expected one of {', '.join(IMPLEMENTATIONS)}, got {cfg.implementation!r}")
    if not cfg.head_size and cfg.hidden % cfg.n_heads:
        fail("n_heads", f"hidden {cfg.hidden} is not divisible by heads {cfg.n_heads}; "
             "give the head size explicitly if it differs")
    if cfg.n_heads % cfg.kv_heads:
        fail("n_kv_heads", f"heads {cfg.n_heads} is not a multiple of kv_heads {cfg.kv_heads}")
    if cfg.family != "llama" and cfg.seq_len > cfg.positions:
        fail("seq_len", f"seq_len {cfg.seq_len} exceeds the position table ({cfg.positions})")
    if cfg.fused_gate_up and not cfg.gated:
        fail("fused_gate_up", f"a {cfg.mlp_kind} MLP has no gate to fuse; use a gated MLP (swiglu, geglu)")
    if cfg.n_experts and not 1 <= cfg.top_k <= cfg.n_experts:
        fail("top_k", f"must be in 1..{cfg.n_experts} (the experts), got {cfg.top_k}")
    if not cfg.n_experts and cfg.top_k:
        fail("top_k", "is for mixture-of-experts models; set the number of experts too")


def _validate_described(cfg: ModelConfig, fail) -> None:
    """A described model's shape fields must be the ones its measured groups imply."""
    d = cfg.described
    if d is None:
        fail("described", "family described needs the measured groups (model.described)")
    if cfg.family != DESCRIBED:
        fail("family", f"a model with measured groups has family {DESCRIBED!r}, got {cfg.family!r}")
    for name, want in (("n_layers", d.n_blocks), ("hidden", d.hidden), ("seq_len", d.seq_len),
                       ("vocab_size", d.logits_per_token)):
        if getattr(cfg, name) != want:
            fail(name, f"is {getattr(cfg, name)} but the described groups say {want}")
