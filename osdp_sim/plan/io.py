"""Versioned JSON plan files: every command reads and writes this format."""

import json
import os

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_json, write_text_atomic
from osdp_sim.model.config import MODEL_FIELDS, MODEL_FORMAT_VERSION
from osdp_sim.model.load import config_from_dict
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import OPTIMIZERS, PRECISIONS, SPLITS, STRATEGIES, GroupChoice, Plan

FORMAT = "osdp-sim/plan"
# Version 2 (model stage, issue 13): the embedded model gained head_size, biases, mlp_kind,
# norm_kind, fused projections, sliding_window, n_experts, top_k and source. Version 3: the
# model's implementation ('osdp' or 'hf'), and a described model's measured groups under
# model.described (model/described.py). What each version's model holds is listed once, in
# model.config.MODEL_FIELDS; older files are read with the later fields at their defaults.
# Version 4 (issue 16): "selective", the checkpointed blocks that use selective (op-level)
# activation checkpointing; absent in older files (every checkpointed block recomputes fully).
VERSION = MODEL_FORMAT_VERSION
READS = tuple(sorted(MODEL_FIELDS))
# Counts (devices, micro-batch, accumulation steps) above a 32-bit integer are a slip, not a plan.
MAX_COUNT = 2**31 - 1


def plan_to_dict(plan: Plan) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": plan.model.to_dict(),
        "devices": plan.devices,
        "shard_group": plan.shard_size,
        "micro_batch": plan.micro_batch,
        "grad_accum": plan.grad_accum,
        "reduce_every_microbatch": plan.reduce_every_microbatch,
        "precision": plan.precision,
        "optimizer": plan.optimizer,
        "groups": {k: _choice_to_dict(c) for k, c in plan.choices.items()},
        "checkpoint": [i for i, on in enumerate(plan.checkpoint) if on],
        **({"selective": [i for i, on in enumerate(plan.selective) if on]} if any(plan.selective) else {}),
        "notes": plan.notes,
    }


def _choice_to_dict(c: GroupChoice) -> dict:
    d = {"strategy": c.strategy}
    if c.is_split:
        d["slices"] = c.slices
        d["sharded_slices"] = c.sharded_slices
    return d


def plan_from_dict(data, *, source: str = "<plan>") -> Plan:
    def err(field, msg):
        return UserError(msg, source=source, field=field)

    if not isinstance(data, dict):
        raise err(None, "expected a JSON object (an osdp-sim plan file)")
    if data.get("format") != FORMAT:
        raise err("format", f"expected {FORMAT!r}; is this a plan written by osdp-sim?")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READS:
        raise err("version", f"unsupported version {data.get('version')!r}; this osdp-sim reads versions "
                  f"{', '.join(map(str, READS))}")
    known = {"format", "version", "model", "devices", "shard_group", "micro_batch", "grad_accum",
             "reduce_every_microbatch", "precision", "optimizer", "groups", "checkpoint", "notes"}
    if version >= 4:
        known.add("selective")
    for key in data:
        if key not in known:
            raise err(key, f"unknown key; expected some of {sorted(known)}")
    for key in ("model", "devices", "micro_batch", "groups"):
        if key not in data:
            raise err(key, "missing required key")
    model = config_from_dict(data["model"], source=source, version=version)
    groups = data["groups"]
    if not isinstance(groups, dict):
        raise err("groups", "expected an object mapping group names to strategies")
    if len(groups) != 1 + 2 * model.n_layers:
        # Before build_spec: a layer count that does not match the groups (n_layers: 4000000000)
        # is a mistake to name, not a model to build.
        raise err(*_group_mismatch(groups, model))
    spec = build_spec(model)

    def pos_int(key, default=None):
        v = data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_COUNT:
            raise err(key, f"expected a whole number in 1..{MAX_COUNT}, got {_show(v)}")
        return v

    devices = pos_int("devices")
    micro_batch = pos_int("micro_batch")
    grad_accum = pos_int("grad_accum", 1)
    shard_group = pos_int("shard_group", devices)
    if shard_group > devices or devices % shard_group:
        raise err("shard_group", f"must divide devices ({devices}), got {shard_group}")
    precision = _choice(data.get("precision", "bf16"), PRECISIONS, "precision", err)
    optimizer = _choice(data.get("optimizer", "adamw"), OPTIMIZERS, "optimizer", err)
    rem = data.get("reduce_every_microbatch", True)
    if not isinstance(rem, bool):
        raise err("reduce_every_microbatch", f"expected true or false, got {_show(rem)}")

    missing = [k for k in spec.plan_keys if k not in groups]
    if missing:
        raise err(f"groups.{missing[0]}", f"missing; the model {model.name!r} has groups "
                  f"{spec.plan_keys[0]} .. {spec.plan_keys[-1]}")
    choices = {}
    for key, value in groups.items():
        if key not in spec.plan_keys:
            raise err(f"groups.{key}", f"no such group in model {model.name!r} "
                      f"(expected root, block0.attn .. block{model.n_layers - 1}.mlp)")
        choices[key] = _choice_from_dict(value, f"groups.{key}", err, splittable=key != "root")
    ckpt = data.get("checkpoint", [])
    if not isinstance(ckpt, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ckpt):
        raise err("checkpoint", "expected a list of block indices (whole numbers)")
    bad = [i for i in ckpt if not 0 <= i < model.n_layers]
    if bad:
        raise err("checkpoint", f"block {bad[0]} out of range 0..{model.n_layers - 1}")
    set_ckpt = set(ckpt)
    sel = data.get("selective", [])
    if not isinstance(sel, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in sel):
        raise err("selective", "expected a list of block indices (whole numbers)")
    bad = [i for i in sel if i not in set_ckpt]
    if bad:
        raise err("selective", f"block {_show(bad[0])} is not in checkpoint; a selective block is "
                  "a checkpointed one")
    set_sel = set(sel)
    notes = data.get("notes", {})
    if not isinstance(notes, dict):
        raise err("notes", "expected an object")
    return Plan(model=model, devices=devices, micro_batch=micro_batch,
                choices={k: choices[k] for k in spec.plan_keys},
                checkpoint=tuple(i in set_ckpt for i in range(model.n_layers)),
                selective=tuple(i in set_sel for i in range(model.n_layers)),
                grad_accum=grad_accum, precision=precision, optimizer=optimizer,
                shard_group=shard_group, reduce_every_microbatch=rem, notes=notes)


def _group_mismatch(groups: dict, model) -> tuple[str, str]:
    """(field, message) for groups that do not list root, block0.attn .. block<n-1>.mlp exactly;
    stops at the first missing key, so it costs what the file holds, not n_layers."""
    last = f"block{model.n_layers - 1}.mlp"
    if "root" not in groups:
        return "groups.root", f"missing; the model {model.name!r} has groups root .. {last}"
    for i in range(model.n_layers):
        for part in ("attn", "mlp"):
            if f"block{i}.{part}" not in groups:
                return (f"groups.block{i}.{part}", f"missing; the model {model.name!r} has "
                        f"{model.n_layers} blocks, groups root .. {last}")
    known = {"root"} | {f"block{i}.{p}" for i in range(model.n_layers) for p in ("attn", "mlp")}
    extra = next(k for k in groups if k not in known)
    return (f"groups.{extra}", f"no such group in model {model.name!r} "
            f"(expected root, block0.attn .. {last})")


def _choice(value, allowed: tuple, field: str, err) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise err(field, f"expected one of {', '.join(allowed)}, got {_show(value)}")
    return value


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value) -> str:
    """A value as the user wrote it, cut short (a huge list or number stays one short line)."""
    text = json.dumps(value) if isinstance(value, (dict, list, str, bool)) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _choice_from_dict(value, field, err, *, splittable: bool) -> GroupChoice:
    if isinstance(value, str):
        value = {"strategy": value}
    if not isinstance(value, dict):
        raise err(field, 'expected a strategy name or {"strategy": ..., "slices": k, "sharded_slices": j}')
    for key in value:
        if key not in ("strategy", "slices", "sharded_slices"):
            raise err(f"{field}.{key}", "unknown key; expected strategy, slices, sharded_slices")
    if "strategy" not in value:
        raise err(f"{field}.strategy", f"missing; expected one of {', '.join(STRATEGIES)}")
    strategy = _choice(value["strategy"], STRATEGIES, f"{field}.strategy", err)
    k = value.get("slices", 1)
    if not _whole(k) or k not in SPLITS:
        raise err(f"{field}.slices", f"expected one of {', '.join(map(str, SPLITS))} (a whole number), "
                  f"got {_show(k)}")
    if k > 1 and not splittable:
        raise err(f"{field}.slices", "the root group (embedding and head) cannot be split")
    j = value.get("sharded_slices", k if strategy == "zero3" else 0)
    if not _whole(j) or not 0 <= j <= k:
        raise err(f"{field}.sharded_slices", f"expected a whole number in 0..{k}, got {_show(j)}")
    if strategy == "zero3" and j != k:
        raise err(f"{field}.sharded_slices", "a zero3 group shards every slice; use strategy ddp or "
                  "zero2 for the replicated slices of a partly sharded group")
    if strategy != "zero3" and j == k and k > 1:
        raise err(f"{field}.sharded_slices", "all slices sharded is strategy zero3")
    return GroupChoice(strategy, k, j)


def save_plan(plan: Plan, path: str | os.PathLike) -> None:
    write_json_atomic(path, plan_to_dict(plan))


def load_plan(path: str | os.PathLike) -> Plan:
    return plan_from_dict(read_json(path, "plan"), source=str(path))


def write_json_atomic(path: str | os.PathLike, data) -> None:
    """JSON written atomically (temporary file, fsync, rename): never half a file."""
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
