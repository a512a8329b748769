"""The machine-readable form of docs/json.md (schema version 1): one schema per format, and
check(), which lists where a JSON value departs from it (an undocumented key, a missing required
key, a wrong type). tests/test_json_schema.py runs real outputs through it and checks that
docs/json.md names every key here."""

from dataclasses import dataclass

NUMBER, INTEGER, STRING, BOOLEAN, OBJECT, ARRAY, NULL = "number", "integer", "string", "boolean", "object", "array", "null"


@dataclass(frozen=True)
class F:
    """One JSON value: its type(s); for an object its documented keys (`keys`; `open`: others are
    allowed too) or, for a map with free keys, the schema of every value (`values`); for an array
    the schema of its items; `unit` of a number (bytes, s, samples/s, ...)."""

    type: str | tuple
    required: bool = True
    unit: str = ""
    keys: dict | None = None
    values: "F | None" = None
    items: "F | None" = None
    open: bool = False


def opt(f: F) -> F:
    return F(f.type, False, f.unit, f.keys, f.values, f.items, f.open)


def nullable(f: F) -> F:
    types = f.type if isinstance(f.type, tuple) else (f.type,)
    return F(types + (NULL,), f.required, f.unit, f.keys, f.values, f.items, f.open)


def obj(**keys: F) -> F:
    return F(OBJECT, keys=keys)


BYTES = F(NUMBER, unit="bytes")
SECONDS = F(NUMBER, unit="s")
COUNT = F(INTEGER)
TEXT = F(STRING)
FLAG = F(BOOLEAN)


_PY_TYPES = {STRING: str, BOOLEAN: bool, OBJECT: dict, ARRAY: list, NULL: type(None)}


def _is(value, t: str) -> bool:
    if t == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _PY_TYPES[t])


def check(value, f: F, path: str = "$") -> list[str]:
    """Where `value` departs from `f`, one line each ('$.predicted.margin_bytes: missing')."""
    types = f.type if isinstance(f.type, tuple) else (f.type,)
    if not any(_is(value, t) for t in types):
        return [f"{path}: expected {' or '.join(types)}, got {type(value).__name__}"]
    errors: list[str] = []
    if isinstance(value, dict) and f.keys is not None:
        for key, sub in f.keys.items():
            if key in value:
                errors += check(value[key], sub, f"{path}.{key}")
            elif sub.required:
                errors.append(f"{path}.{key}: missing")
        if not f.open:
            errors += [f"{path}.{key}: not documented" for key in value if key not in f.keys]
    elif isinstance(value, dict) and f.values is not None:
        for key, v in value.items():
            errors += check(v, f.values, f"{path}.{key}")
    elif isinstance(value, list) and f.items is not None:
        for i, v in enumerate(value):
            errors += check(v, f.items, f"{path}[{i}]")
    return errors


def key_paths(f: F, path: str = "") -> list[tuple[str, F]]:
    """(dotted path, schema) of every documented key, depth first."""
    out = []
    if f.keys is not None:
        for key, sub in f.keys.items():
            p = f"{path}.{key}" if path else key
            out.append((p, sub))
            out += key_paths(sub, p)
    for child, suffix in ((f.values, ".*"), (f.items, "[]")):
        if child is not None:
            out += key_paths(child, path + suffix)
    return out


# ---------------------------------------------------------------- shared parts

MEMORY_BREAKDOWN = obj(**{k: BYTES for k in ("params", "grads", "optimizer", "activations", "gathered_params",
                                             "reduce_buffers", "temporaries", "fragmentation", "context")})
TIME_BREAKDOWN = obj(**{k: SECONDS for k in (
    "forward_s", "backward_s", "recompute_s", "optimizer_s", "copy_s", "copy_exposed_s", "all_gather_s",
    "all_gather_exposed_s", "reduce_scatter_s", "reduce_scatter_exposed_s", "all_reduce_s",
    "all_reduce_exposed_s", "communication_s", "exposed_communication_s", "iteration_s", "compute_s")})
MODEL_STATES = obj(params=BYTES, grads=BYTES, optimizer=BYTES)

# A model configuration (osdp_sim/model/config.py): version 1 files hold the first twelve keys,
# version 2 all but implementation (model.config.MODEL_FIELDS).
MODEL = obj(name=TEXT, family=TEXT, n_layers=COUNT, hidden=COUNT, n_heads=COUNT, vocab_size=COUNT,
            seq_len=F(INTEGER, unit="tokens"), n_kv_heads=COUNT, ffn_hidden=COUNT, max_positions=COUNT,
            type_vocab_size=COUNT, tied_head=FLAG,
            head_size=opt(COUNT), qkv_bias=opt(FLAG), attn_out_bias=opt(FLAG), mlp_bias=opt(FLAG),
            mlp_kind=opt(TEXT), norm_kind=opt(TEXT), fused_qkv=opt(FLAG), fused_gate_up=opt(FLAG),
            sliding_window=opt(F(INTEGER, unit="tokens")), n_experts=opt(COUNT), top_k=opt(COUNT),
            source=opt(TEXT), implementation=opt(TEXT),
            # version 3: a described model's measured groups (docs/models.md, "Any torch module")
            described=opt(F(OBJECT)))

GROUP = F((STRING, OBJECT), keys={"strategy": TEXT, "slices": opt(COUNT), "sharded_slices": opt(COUNT)})

PLAN = F(OBJECT, keys={
    "format": TEXT, "version": COUNT, "model": MODEL, "devices": COUNT, "shard_group": opt(COUNT),
    "micro_batch": COUNT, "grad_accum": opt(COUNT), "reduce_every_microbatch": opt(FLAG),
    "precision": opt(TEXT), "optimizer": opt(TEXT), "groups": F(OBJECT, values=GROUP),
    "checkpoint": opt(F(ARRAY, items=COUNT)),
    "selective": opt(F(ARRAY, items=COUNT)),      # version 4
    # carried along; these are the keys osdp-sim itself writes, others are the user's
    "notes": opt(F(OBJECT, open=True, keys={
        "made_by": opt(TEXT), "name": opt(TEXT), "hardware": opt(TEXT), "mem_limit_bytes": opt(BYTES),
        "headroom_bytes": opt(BYTES), "status": opt(TEXT),
        "predicted": opt(obj(peak_memory_bytes=BYTES, iteration_time_s=SECONDS,
                             samples_per_s=F(NUMBER, unit="samples/s")))})),
})

_PREDICTION = {
    "peak_memory_bytes": BYTES, "iteration_time_s": SECONDS, "samples_per_s": F(NUMBER, unit="samples/s"),
    "tokens_per_s": F(NUMBER, unit="tokens/s"), "mfu": F(NUMBER, unit="fraction"),
    "memory_breakdown": MEMORY_BREAKDOWN, "time_breakdown": TIME_BREAKDOWN,
    "model_states_bytes": MODEL_STATES, "peak_during": TEXT,
}

# ---------------------------------------------------------------- osdp-sim/estimate

# How far the profile's numbers go (osdp_sim/hardware/trust.py).
PROVENANCE = obj(kind=TEXT, runs=nullable(COUNT), time_error=nullable(F(NUMBER, unit="fraction")),
                 memory_error=nullable(F(NUMBER, unit="fraction")))

ESTIMATE = F(OBJECT, keys={
    "format": TEXT, "version": COUNT, **_PREDICTION,
    "model_flops_per_s_per_device": F(NUMBER, unit="FLOP/s"),
    "model": TEXT, "hardware": TEXT, "devices": COUNT, "params": COUNT,
    "usable_memory_bytes": BYTES, "margin_bytes": BYTES, "provenance": PROVENANCE,
    "timeline": opt(F(ARRAY, items=obj(name=TEXT, stream=TEXT, kind=TEXT, start_s=SECONDS, end_s=SECONDS))),
})

# ---------------------------------------------------------------- osdp-sim/search

BASELINE = F(OBJECT, keys={
    "feasible": FLAG, "samples_per_s": nullable(F(NUMBER, unit="samples/s")), "peak_memory_bytes": nullable(BYTES),
    "iteration_time_s": nullable(SECONDS), "micro_batch": nullable(COUNT), "grad_accum": nullable(COUNT),
    "checkpoint": nullable(TEXT), "shard_group": opt(nullable(COUNT)), "note": opt(TEXT),
    "speedup": opt(F(NUMBER, unit="ratio")),
})

_LIMITS = {"mem_limit_bytes": BYTES, "usable_memory_bytes": BYTES, "headroom_bytes": BYTES}

SEARCH = F(OBJECT, keys={
    "format": TEXT, "version": COUNT, "model": TEXT, "params": COUNT, "hardware": TEXT, "devices": COUNT,
    **_LIMITS, "status": TEXT, "provenance": PROVENANCE, "plan": PLAN, "plan_summary": F(ARRAY, items=TEXT),
    "predicted": F(OBJECT, keys={**_PREDICTION, "micro_batch": COUNT, "grad_accum": COUNT,
                                 "global_batch": COUNT, "margin_bytes": BYTES}),
    "baselines": F(OBJECT, keys={name: opt(BASELINE) for name in (
        "ddp", "zero2", "zero3", "ddp_per_block", "zero2_per_block", "zero3_per_block", "osdp_knapsack")}),
    "search": obj(status=TEXT, optimal=FLAG, seconds=SECONDS, nodes=COUNT, leaves=COUNT,
                  best_bound=F(NUMBER, unit="samples/s"), gap=F(NUMBER, unit="fraction"), message=TEXT,
                  open_configs=F(ARRAY, items=obj(micro_batch=COUNT, shard_group=COUNT, root=TEXT,
                                                  bound_samples_per_s=F(NUMBER, unit="samples/s"),
                                                  reason=TEXT))),
    "top": F(ARRAY, items=obj(peak_memory_bytes=BYTES, samples_per_s=F(NUMBER, unit="samples/s"),
                              micro_batch=COUNT, grad_accum=COUNT, summary=F(ARRAY, items=TEXT))),
    "why": opt(TEXT),
})

# No plan: status "infeasible" or "time_limit" (exit code 2).
SEARCH_NO_PLAN = F(OBJECT, keys={
    "format": TEXT, "version": COUNT, "status": TEXT, "model": TEXT, "hardware": TEXT, "devices": COUNT,
    **_LIMITS, "provenance": PROVENANCE, "min_peak_memory_bytes": nullable(BYTES), "min_peak_proven": FLAG, "message": TEXT,
})

# ---------------------------------------------------------------- osdp-sim/record

_OPT_NUM = nullable(F(NUMBER))
RECORD = F(OBJECT, keys={
    "format": TEXT, "version": COUNT, "impl": opt(TEXT), "status": TEXT, "run_id": TEXT, "created": TEXT,
    "plan": PLAN, "model": MODEL, "hardware_profile": obj(name=TEXT, path=TEXT),
    "env": F(OBJECT, keys={
        "torch": TEXT, "backend": TEXT, "backend_version": TEXT, "device_kind": TEXT, "device_name": TEXT,
        "world_size": COUNT, "threads_per_rank": COUNT, "cores": COUNT, "oversubscribed": FLAG,
        "hostname": TEXT, "python": TEXT, "load_avg_1m": opt(_OPT_NUM), "load_avg_1m_before": opt(_OPT_NUM),
        "other_cpu_fraction": opt(nullable(F(NUMBER, unit="fraction")))}),
    "settings": F(OBJECT, keys={"warmup": COUNT, "iters": COUNT, "seed": COUNT,
                                "timeout_s": opt(nullable(SECONDS)), "mem_cap_bytes": opt(nullable(BYTES))}),
    "measured": F(OBJECT, keys={
        "iteration_time_s": F(OBJECT, keys={
            **{k: nullable(SECONDS) for k in ("mean", "median", "std", "min", "max")},
            "per_step": opt(F(ARRAY, items=SECONDS)),
            "per_rank": F(ARRAY, items=F(ARRAY, items=SECONDS))}),
        "peak_memory_bytes": nullable(BYTES), "peak_memory_source": opt(nullable(TEXT)),
        "memory": obj(per_rank=F(ARRAY, items=nullable(F(OBJECT, keys={
            "tracker_peak_bytes": nullable(BYTES),
            "tracker_breakdown": nullable(F(OBJECT, keys={k: BYTES for k in (
                "Parameter", "Buffer", "Gradient", "Optstate", "Activation", "Temp", "Other", "Total")})),
            "rss_hwm_bytes": nullable(BYTES), "cuda_max_allocated_bytes": nullable(BYTES),
            "cuda_max_reserved_bytes": nullable(BYTES), "tracker_error": nullable(TEXT)})))),
        "losses": F(OBJECT, keys={"mean": F(ARRAY, items=F(NUMBER)),
                                  "per_rank": F(ARRAY, items=F(ARRAY, items=F(NUMBER))),
                                  "phases": F(ARRAY, items=TEXT)}),
        "steps_reached": opt(F(ARRAY, items=nullable(obj(phase=TEXT, step=COUNT)))),
    }),
    "predicted": nullable(F(OBJECT, keys={
        "iteration_time_s": SECONDS, "peak_memory_bytes": BYTES,
        "samples_per_s": opt(F(NUMBER, unit="samples/s")),
        "memory_breakdown": opt(MEMORY_BREAKDOWN), "time_breakdown": opt(TIME_BREAKDOWN)})),
    "errors": nullable(obj(iteration_time_rel=nullable(F(NUMBER, unit="fraction")),
                           peak_memory_rel=nullable(F(NUMBER, unit="fraction")))),
    "failure": nullable(obj(rank=nullable(COUNT), reason=nullable(TEXT), exit_code=nullable(COUNT),
                            stderr_tail=nullable(TEXT))),
})

# ---------------------------------------------------------------- osdp-sim/sweep

_AXIS = opt(F(ARRAY, items=F((NUMBER, STRING))))
SWEEP_POINT = F(OBJECT, keys={
    "model": TEXT, "devices": COUNT, "mem_limit_bytes": BYTES, "seq_len": COUNT, "micro_batch": nullable(COUNT),
    "bandwidth_scale": F(NUMBER, unit="ratio"), "compute_scale": F(NUMBER, unit="ratio"), "status": TEXT,
    "samples_per_s": nullable(F(NUMBER, unit="samples/s")), "tokens_per_s": nullable(F(NUMBER, unit="tokens/s")),
    "peak_memory_bytes": nullable(BYTES), "iteration_time_s": nullable(SECONDS),
    "gap": nullable(F(NUMBER, unit="fraction")), "best_bound_samples_per_s": nullable(F(NUMBER, unit="samples/s")),
    "plan": nullable(TEXT),
    "baselines": F(OBJECT, keys={name: opt(BASELINE) for name in ("ddp", "zero2", "zero3")}),
    "min_peak_memory_bytes": nullable(BYTES), "min_peak_proven": nullable(FLAG),
    "seconds": nullable(SECONDS), "message": TEXT,
    "headroom_bytes": BYTES, "usable_memory_bytes": nullable(BYTES), "margin_bytes": nullable(BYTES),
})
SWEEP = F(OBJECT, keys={
    "format": TEXT, "version": COUNT, "hardware": TEXT,
    "axes": F(OBJECT, keys={k: _AXIS for k in ("model", "devices", "mem_limit_bytes", "seq_len", "micro_batch",
                                                "bandwidth_scale", "compute_scale")}),
    "time_limit_s": nullable(SECONDS), "seconds": SECONDS, "complete": FLAG, "inter_node": nullable(TEXT),
    "provenance": PROVENANCE,
    "points": F(ARRAY, items=SWEEP_POINT),
})

# format name -> (schema(s), versions this schema covers)
FORMATS = {
    "osdp-sim/estimate": ((ESTIMATE,), (1,)),
    "osdp-sim/search": ((SEARCH, SEARCH_NO_PLAN), (1,)),
    "osdp-sim/plan": ((PLAN,), (1, 2, 3, 4)),
    "osdp-sim/record": ((RECORD,), (1, 2, 3, 4)),
    "osdp-sim/sweep": ((SWEEP,), (1,)),
}


def validate(value) -> list[str]:
    """Check a JSON output against its format's schema: its format and version must be known; the
    search format's two shapes are told apart by the presence of a plan."""
    if not isinstance(value, dict) or value.get("format") not in FORMATS:
        return [f"$.format: not one of {sorted(FORMATS)}"]
    schemas, versions = FORMATS[value["format"]]
    if value.get("version") not in versions:
        return [f"$.version: {value.get('version')!r} not among {versions}"]
    schema = schemas[0] if len(schemas) == 1 or "plan" in value else schemas[1]
    return check(value, schema)
