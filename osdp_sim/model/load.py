"""Resolve a model argument: a built-in name or a YAML file describing the shape."""

import math
from pathlib import Path

import yaml

from osdp_sim.errors import UserError
from osdp_sim.model.config import FAMILIES, ModelConfig, with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import ModelSpec, build_spec

_YAML_KEYS = {
    "name": str, "family": str, "layers": int, "hidden": int, "heads": int, "kv_heads": int,
    "ffn": int, "vocab": int, "seq_len": int, "max_positions": int, "type_vocab": int,
    "tied_head": bool,
}
_REQUIRED = ("family", "layers", "hidden", "heads", "vocab", "seq_len")


def load_model_config(arg: str, **overrides) -> ModelConfig:
    """`arg` is a built-in name (see `osdp-sim models`) or a path to a YAML file."""
    if arg in BUILTIN:
        cfg = BUILTIN[arg]
    elif arg.endswith((".yaml", ".yml")) or Path(arg).is_file():
        cfg = _config_from_yaml(Path(arg))
    else:
        raise UserError(f"unknown model {arg!r}; use a built-in name ({', '.join(sorted(BUILTIN))}) "
                        "or a YAML file", field="--model")
    cfg = with_overrides(cfg, **overrides)
    validate_config(cfg, source=arg)
    return cfg


def load_model(arg: str, **overrides) -> ModelSpec:
    return build_spec(load_model_config(arg, **overrides))


def config_from_dict(data: dict, *, source: str) -> ModelConfig:
    """A ModelConfig from its to_dict() form (as stored in plan files and records)."""
    if not isinstance(data, dict):
        raise UserError("expected a mapping of model fields", source=source, field="model")
    known = set(ModelConfig.field_names())
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"unknown key {unknown[0]!r}; expected some of {sorted(known)}",
                        source=source, field=f"model.{unknown[0]}")
    try:
        cfg = ModelConfig(**data)
    except TypeError as e:
        raise UserError(f"incomplete model description ({e})", source=source, field="model") from None
    validate_config(cfg, source=source)
    return cfg


def _config_from_yaml(path: Path) -> ModelConfig:
    src = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError("file not found; give a built-in model name or an existing YAML file",
                        source=src) from None
    except yaml.YAMLError as e:
        raise UserError(f"not valid YAML ({str(e).splitlines()[0]})", source=src) from None
    if not isinstance(data, dict):
        raise UserError("expected a mapping with keys " + ", ".join(_REQUIRED), source=src)
    for key in data:
        if key not in _YAML_KEYS:
            raise UserError(f"unknown key; expected one of {sorted(_YAML_KEYS)}", source=src, field=key)
    for key in _REQUIRED:
        if key not in data:
            raise UserError("missing required key", source=src, field=key)
    for key, value in data.items():
        want = _YAML_KEYS[key]
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"expected a whole number, got {value!r}", source=src, field=key)
        if want is bool and not isinstance(value, bool):
            raise UserError(f"expected true or false, got {value!r}", source=src, field=key)
        if want is str and not isinstance(value, str):
            raise UserError(f"expected text, got {value!r}", source=src, field=key)
    family = data["family"]
    return ModelConfig(
        name=data.get("name", path.stem), family=family, n_layers=data["layers"],
        hidden=data["hidden"], n_heads=data["heads"], n_kv_heads=data.get("kv_heads", 0),
        ffn_hidden=data.get("ffn", 0), vocab_size=data["vocab"], seq_len=data["seq_len"],
        max_positions=data.get("max_positions", 0), type_vocab_size=data.get("type_vocab", 2),
        tied_head=data.get("tied_head", family != "llama"))


def validate_config(cfg: ModelConfig, *, source: str) -> None:
    if cfg.family not in FAMILIES:
        raise UserError(f"unknown family {cfg.family!r}; expected one of {', '.join(FAMILIES)}",
                        source=source, field="family")
    for name in ("n_layers", "hidden", "n_heads", "vocab_size", "seq_len"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"must be a positive whole number, got {v!r}", source=source, field=name)
    for name in ("n_kv_heads", "ffn_hidden", "max_positions"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise UserError(f"must be a whole number >= 0, got {v!r}", source=source, field=name)
    if cfg.hidden % cfg.n_heads:
        raise UserError(f"hidden {cfg.hidden} is not divisible by heads {cfg.n_heads}",
                        source=source, field="heads")
    if cfg.n_heads % cfg.kv_heads:
        raise UserError(f"heads {cfg.n_heads} is not a multiple of kv_heads {cfg.kv_heads}",
                        source=source, field="kv_heads")
    if cfg.family != "llama" and cfg.seq_len > cfg.positions:
        raise UserError(f"seq_len {cfg.seq_len} exceeds the position table ({cfg.positions})",
                        source=source, field="seq_len")
    if cfg.family == "llama" and cfg.tied_head:
        pass  # allowed: some LLaMA-style models tie; the spec then has no head weight
    if not math.isfinite(cfg.hidden):
        raise UserError("hidden must be finite", source=source, field="hidden")
