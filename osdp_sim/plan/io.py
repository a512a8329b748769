"""Versioned JSON plan files: every command reads and writes this format."""

import json
import os

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_json, write_text_atomic
from osdp_sim.model.load import config_from_dict
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import OPTIMIZERS, PRECISIONS, SPLITS, STRATEGIES, GroupChoice, Plan

FORMAT = "osdp-sim/plan"
VERSION = 2
# Version 2 (model stage, issue 13): the embedded model gained head_size, biases, mlp_kind,
# norm_kind, fused projections, sliding_window, n_experts, top_k and source. Version 1 files
# are read with those at their defaults (model.load.config_from_dict).
READS = (1, 2)


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
    if data.get("version") not in READS or isinstance(data.get("version"), bool):
        raise err("version", f"unsupported version {data.get('version')!r}; this osdp-sim reads versions "
                  f"{', '.join(map(str, READS))}")
    known = {"format", "version", "model", "devices", "shard_group", "micro_batch", "grad_accum",
             "reduce_every_microbatch", "precision", "optimizer", "groups", "checkpoint", "notes"}
    for key in data:
        if key not in known:
            raise err(key, f"unknown key; expected some of {sorted(known)}")
    for key in ("model", "devices", "micro_batch", "groups"):
        if key not in data:
            raise err(key, "missing required key")
    model = config_from_dict(data["model"], source=source, version=data["version"])
    spec = build_spec(model)

    def pos_int(key, default=None):
        v = data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise err(key, f"expected a positive whole number, got {v!r}")
        return v

    devices = pos_int("devices")
    micro_batch = pos_int("micro_batch")
    grad_accum = pos_int("grad_accum", 1)
    shard_group = pos_int("shard_group", devices)
    if shard_group > devices or devices % shard_group:
        raise err("shard_group", f"must divide devices ({devices}), got {shard_group}")
    precision = data.get("precision", "bf16")
    if precision not in PRECISIONS:
        raise err("precision", f"expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    optimizer = data.get("optimizer", "adamw")
    if optimizer not in OPTIMIZERS:
        raise err("optimizer", f"expected one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    rem = data.get("reduce_every_microbatch", True)
    if not isinstance(rem, bool):
        raise err("reduce_every_microbatch", f"expected true or false, got {rem!r}")

    groups = data["groups"]
    if not isinstance(groups, dict):
        raise err("groups", "expected an object mapping group names to strategies")
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
        raise err("checkpoint", "expected a list of block indices")
    bad = [i for i in ckpt if not 0 <= i < model.n_layers]
    if bad:
        raise err("checkpoint", f"block {bad[0]} out of range 0..{model.n_layers - 1}")
    notes = data.get("notes", {})
    if not isinstance(notes, dict):
        raise err("notes", "expected an object")
    return Plan(model=model, devices=devices, micro_batch=micro_batch,
                choices={k: choices[k] for k in spec.plan_keys},
                checkpoint=tuple(i in set(ckpt) for i in range(model.n_layers)),
                grad_accum=grad_accum, precision=precision, optimizer=optimizer,
                shard_group=shard_group, reduce_every_microbatch=rem, notes=notes)


def _choice_from_dict(value, field, err, *, splittable: bool) -> GroupChoice:
    if isinstance(value, str):
        value = {"strategy": value}
    if not isinstance(value, dict):
        raise err(field, 'expected a strategy name or {"strategy": ..., "slices": k, "sharded_slices": j}')
    for key in value:
        if key not in ("strategy", "slices", "sharded_slices"):
            raise err(f"{field}.{key}", "unknown key; expected strategy, slices, sharded_slices")
    strategy = value.get("strategy")
    if strategy not in STRATEGIES:
        raise err(f"{field}.strategy", f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    k = value.get("slices", 1)
    if k not in SPLITS or isinstance(k, bool):
        raise err(f"{field}.slices", f"expected one of {SPLITS}, got {k!r}")
    if k > 1 and not splittable:
        raise err(f"{field}.slices", "the root group (embedding and head) cannot be split")
    j = value.get("sharded_slices", k if strategy == "zero3" else 0)
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j <= k:
        raise err(f"{field}.sharded_slices", f"expected a whole number in 0..{k}, got {j!r}")
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
