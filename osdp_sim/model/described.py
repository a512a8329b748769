"""A model given by measured numbers per operator group (describe_module, a `described:` model
YAML, a plan or record embedding one) instead of architecture hyperparameters.

Plain data, no torch: the same explicit-unit dictionary is the `described:` section of a model
YAML and the `model.described` object of a plan file or record, so one parser (described_from_dict)
reads all of them and names the keys as written. docs/models.md ("Any torch module") lists every key.
"""

import math
from dataclasses import dataclass

from osdp_sim.errors import UserError
from osdp_sim.model.spec import Activations, LinearShape

# Bounds that keep every number finite and the description small (as model/load.py's).
_MAX_INT = 2 ** 50
_MAX_BLOCKS = 100_000

_GROUP_KEYS = ("other_params", "flops_per_token", "act_elems_per_token",
               "act_fixed_bytes_per_token", "largest_param", "bwd_temp_elems_per_token",
               "bwd_temp_fixed_bytes_per_token", "linears")
_LINEAR_KEYS = ("name", "in_features", "out_features", "bias")
_BLOCK_KEYS = ("repeat", "checkpoint_elems_per_token", "checkpoint_fixed_bytes_per_token",
               "attn", "mlp")
_TOP_KEYS = ("name", "seq_len", "hidden", "logits_per_token", "embed", "blocks", "head",
             "input_elems_per_token", "input_fixed_bytes_per_token")


@dataclass(frozen=True)
class DescribedGroup:
    """One operator group's measured numbers (units as named)."""

    linears: tuple[LinearShape, ...]
    other_params: int
    """Parameters outside `linears` (norms, embeddings, convolutions, free parameters)."""
    flops_per_token: float
    act_elems_per_token: float
    """Saved-for-backward elements per token that follow the activation dtype."""
    act_fixed_bytes_per_token: float
    """Saved-for-backward bytes per token whose dtype does not (fp32 statistics, int64 labels)."""
    largest_param: int
    """Elements of the group's largest parameter tensor (the optimizer's CPU temporaries)."""
    bwd_temp_elems_per_token: float = 0.0
    """Backward transient beyond the saved tensors and the gradients in and out, per token."""
    bwd_temp_fixed_bytes_per_token: float = 0.0

    @property
    def activations(self) -> Activations:
        return Activations(self.act_elems_per_token, self.act_fixed_bytes_per_token)

    @property
    def bwd_temp(self) -> Activations:
        return Activations(self.bwd_temp_elems_per_token, self.bwd_temp_fixed_bytes_per_token)

    def to_dict(self) -> dict:
        return {"other_params": self.other_params, "flops_per_token": self.flops_per_token,
                "act_elems_per_token": self.act_elems_per_token,
                "act_fixed_bytes_per_token": self.act_fixed_bytes_per_token,
                "largest_param": self.largest_param,
                "bwd_temp_elems_per_token": self.bwd_temp_elems_per_token,
                "bwd_temp_fixed_bytes_per_token": self.bwd_temp_fixed_bytes_per_token,
                "linears": [{"name": l.name, "in_features": l.in_features,
                             "out_features": l.out_features, "bias": l.bias} for l in self.linears]}


@dataclass(frozen=True)
class DescribedBlock:
    """`repeat` consecutive equal blocks."""

    attn: DescribedGroup
    mlp: DescribedGroup
    checkpoint_elems_per_token: float
    """What a checkpointed block keeps (its input), elements per token in the activation dtype."""
    checkpoint_fixed_bytes_per_token: float = 0.0
    repeat: int = 1

    def to_dict(self) -> dict:
        return {"repeat": self.repeat, "checkpoint_elems_per_token": self.checkpoint_elems_per_token,
                "checkpoint_fixed_bytes_per_token": self.checkpoint_fixed_bytes_per_token,
                "attn": self.attn.to_dict(), "mlp": self.mlp.to_dict()}


@dataclass(frozen=True)
class DescribedModel:
    name: str
    seq_len: int
    """Tokens per sample: the second dimension of the block input (batch, tokens, hidden)."""
    hidden: int
    """Width of the block input and output (the gradient flowing between blocks)."""
    logits_per_token: int
    """The loss input's elements per token, rounded up (an LM: the vocabulary; a classifier over
    a sequence: classes / tokens, at least 1). The cost model's head temporaries scale with it."""
    embed: DescribedGroup
    blocks: tuple[DescribedBlock, ...]
    head: DescribedGroup
    input_elems_per_token: float = 0.0
    """The batch the caller holds through the step, beyond what the model saves of it, per
    token: elements in the activation dtype and fixed bytes, a fit exact at fp32 and bf16 (a
    floating input of x elements saved as itself in fp32 but held beside its bf16 cast:
    elements -2x, fixed bytes 8x, so 0 in fp32 and 4x bytes in bf16).
    Charged to the embedding step's activations."""
    input_fixed_bytes_per_token: float = 0.0

    @property
    def n_blocks(self) -> int:
        return sum(b.repeat for b in self.blocks)

    def block_list(self, n_layers: int) -> list[DescribedBlock]:
        """One entry per block. n_layers other than n_blocks (the planner's n+1 extrapolation,
        planner/knapsack.py) repeats the last block or drops blocks from the end."""
        out = [b for b in self.blocks for _ in range(b.repeat)]
        out = out[:n_layers]
        return out + [out[-1]] * (n_layers - len(out))

    def to_dict(self) -> dict:
        return {"name": self.name, "seq_len": self.seq_len, "hidden": self.hidden,
                "logits_per_token": self.logits_per_token, "embed": self.embed.to_dict(),
                "blocks": [b.to_dict() for b in self.blocks], "head": self.head.to_dict(),
                "input_elems_per_token": self.input_elems_per_token,
                "input_fixed_bytes_per_token": self.input_fixed_bytes_per_token}


def compress_blocks(blocks: list[DescribedBlock]) -> tuple[DescribedBlock, ...]:
    """Consecutive equal blocks as one entry with `repeat`."""
    out: list[DescribedBlock] = []
    for b in blocks:
        if out and _same(out[-1], b):
            last = out[-1]
            out[-1] = DescribedBlock(last.attn, last.mlp, last.checkpoint_elems_per_token,
                                     last.checkpoint_fixed_bytes_per_token, last.repeat + b.repeat)
        else:
            out.append(b)
    return tuple(out)


def _same(a: DescribedBlock, b: DescribedBlock) -> bool:
    return (a.attn, a.mlp, a.checkpoint_elems_per_token, a.checkpoint_fixed_bytes_per_token) == \
        (b.attn, b.mlp, b.checkpoint_elems_per_token, b.checkpoint_fixed_bytes_per_token)


# ---------------------------------------------------------------- reading

def described_from_dict(data, *, source: str, field: str = "described") -> DescribedModel:
    """Parse and check the explicit-unit dictionary; errors name `field.key` as written."""
    def fail(key: str, msg: str):
        raise UserError(msg, source=source, field=key)

    m = _mapping(data, _TOP_KEYS, field, source)
    for key in _TOP_KEYS[:7]:
        if key not in m:
            fail(f"{field}.{key}", "missing required key")
    name = m["name"]
    if not isinstance(name, str) or not name:
        fail(f"{field}.name", f"expected text, got {name!r}")
    blocks_data = m["blocks"]
    if not isinstance(blocks_data, list) or not blocks_data:
        fail(f"{field}.blocks", "expected a non-empty list of blocks")
    blocks = tuple(_block(b, f"{field}.blocks[{i}]", source) for i, b in enumerate(blocks_data))
    total = sum(b.repeat for b in blocks)
    if total > _MAX_BLOCKS:
        fail(f"{field}.blocks", f"{total} blocks; at most {_MAX_BLOCKS}")
    d = DescribedModel(name=name, seq_len=_int(m["seq_len"], f"{field}.seq_len", source, 1),
                          hidden=_int(m["hidden"], f"{field}.hidden", source, 1),
                          logits_per_token=_int(m["logits_per_token"], f"{field}.logits_per_token",
                                                source, 1),
                          embed=_group(m["embed"], f"{field}.embed", source), blocks=blocks,
                          head=_group(m["head"], f"{field}.head", source),
                          input_elems_per_token=_num(m.get("input_elems_per_token", 0),
                                                     f"{field}.input_elems_per_token", source,
                                                     signed=True),
                          input_fixed_bytes_per_token=_num(m.get("input_fixed_bytes_per_token", 0),
                                                           f"{field}.input_fixed_bytes_per_token",
                                                           source))
    if d.input_elems_per_token * 2 + d.input_fixed_bytes_per_token < 0:
        raise UserError("the held input is negative in bf16 (input_elems_per_token x 2 + "
                        "input_fixed_bytes_per_token)", source=source,
                        field=f"{field}.input_elems_per_token")
    return d


def _mapping(data, keys: tuple, field: str, source: str) -> dict:
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping with keys {', '.join(keys)}", source=source, field=field)
    for key in data:
        if key not in keys:
            raise UserError(f"unknown key; expected some of {', '.join(keys)}", source=source,
                            field=f"{field}.{key}")
    return data


def _int(value, field: str, source: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _MAX_INT:
        raise UserError(f"expected a whole number in {minimum}..{_MAX_INT}, got {value!r}",
                        source=source, field=field)
    return value


def _num(value, field: str, source: str, signed: bool = False) -> float:
    low = -_MAX_INT if signed else 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= _MAX_INT:
        raise UserError(f"expected a number in {low}..{_MAX_INT}, got {value!r}", source=source, field=field)
    return float(value)


def _group(data, field: str, source: str) -> DescribedGroup:
    g = _mapping(data, _GROUP_KEYS, field, source)
    for key in _GROUP_KEYS[:3]:
        if key not in g:
            raise UserError("missing required key", source=source, field=f"{field}.{key}")
    lin_data = g.get("linears", [])
    if not isinstance(lin_data, list):
        raise UserError("expected a list of {name, in_features, out_features, bias}", source=source,
                        field=f"{field}.linears")
    linears = tuple(_linear(l, f"{field}.linears[{i}]", source) for i, l in enumerate(lin_data))
    other = _int(g["other_params"], f"{field}.other_params", source)
    largest_default = max([l.weight_params for l in linears] + [other, 0])
    return DescribedGroup(linears=linears, other_params=other,
                          flops_per_token=_num(g["flops_per_token"], f"{field}.flops_per_token", source),
                          act_elems_per_token=_num(g["act_elems_per_token"],
                                                   f"{field}.act_elems_per_token", source),
                          act_fixed_bytes_per_token=_num(g.get("act_fixed_bytes_per_token", 0),
                                                         f"{field}.act_fixed_bytes_per_token", source),
                          largest_param=_int(g.get("largest_param", largest_default),
                                             f"{field}.largest_param", source),
                          bwd_temp_elems_per_token=_num(g.get("bwd_temp_elems_per_token", 0),
                                                        f"{field}.bwd_temp_elems_per_token", source),
                          bwd_temp_fixed_bytes_per_token=_num(
                              g.get("bwd_temp_fixed_bytes_per_token", 0),
                              f"{field}.bwd_temp_fixed_bytes_per_token", source))


def _linear(data, field: str, source: str) -> LinearShape:
    l = _mapping(data, _LINEAR_KEYS, field, source)
    for key in _LINEAR_KEYS[1:3]:
        if key not in l:
            raise UserError("missing required key", source=source, field=f"{field}.{key}")
    name = l.get("name", "linear")
    if not isinstance(name, str):
        raise UserError(f"expected text, got {name!r}", source=source, field=f"{field}.name")
    bias = l.get("bias", False)
    if not isinstance(bias, bool):
        raise UserError(f"expected true or false, got {bias!r}", source=source, field=f"{field}.bias")
    return LinearShape(name, _int(l["in_features"], f"{field}.in_features", source, 1),
                       _int(l["out_features"], f"{field}.out_features", source, 1), bias)


def _block(data, field: str, source: str) -> DescribedBlock:
    b = _mapping(data, _BLOCK_KEYS, field, source)
    for key in ("attn", "mlp", "checkpoint_elems_per_token"):
        if key not in b:
            raise UserError("missing required key", source=source, field=f"{field}.{key}")
    return DescribedBlock(
        attn=_group(b["attn"], f"{field}.attn", source), mlp=_group(b["mlp"], f"{field}.mlp", source),
        checkpoint_elems_per_token=_num(b["checkpoint_elems_per_token"],
                                        f"{field}.checkpoint_elems_per_token", source),
        checkpoint_fixed_bytes_per_token=_num(b.get("checkpoint_fixed_bytes_per_token", 0),
                                              f"{field}.checkpoint_fixed_bytes_per_token", source),
        repeat=_int(b.get("repeat", 1), f"{field}.repeat", source, 1))


def described_yaml(cfg) -> str:
    """The model YAML text of a described ModelConfig (load_model reads it back)."""
    import yaml
    if cfg.described is None:
        raise UserError(f"model {cfg.name!r} is not a described one", field="model")
    return yaml.safe_dump({"described": cfg.described.to_dict()}, sort_keys=False)
