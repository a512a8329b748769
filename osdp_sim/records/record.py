"""Validation records: one JSON file per real run of a plan, measured beside predicted.

The schema is documented field by field in validate/README.md; the calibration stage reads these
files. A record is written for every outcome (ok, oom, failed, timeout) so that a failed run
leaves evidence instead of nothing.
"""

import hashlib
import json
import math
import os
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_json
from osdp_sim.model.config import MODEL_FIELDS, MODEL_FORMAT_VERSION, ModelConfig
from osdp_sim.model.load import config_from_dict
from osdp_sim.plan import Plan, plan_from_dict, plan_to_dict, write_json_atomic

FORMAT = "osdp-sim/record"
# Version 2: the model (and the plan, plan format 2) gained the model stage's new fields;
# version 3 the model's implementation (model.config.MODEL_FIELDS lists each version's fields)
# and the optional env.fake_world (validate --fake-world); a described model's measured groups
# (model.described). Version 4: the plan's selective checkpointing (plan format 4).
# An older record's model is compared with its plan after the same upgrade (defaults).
VERSION = MODEL_FORMAT_VERSION
READS = tuple(sorted(MODEL_FIELDS))
STATUSES = ("ok", "oom", "failed", "timeout")
TRACKER_CATEGORIES = ("Parameter", "Buffer", "Gradient", "Optstate", "Activation", "Temp", "Other",
                      "Total")

_TOP_KEYS = ("format", "version", "status", "run_id", "created", "plan", "model", "hardware_profile",
             "env", "settings", "measured", "predicted", "errors", "failure")
# Optional top-level keys: `impl` (absent means "osdp") says whose model ran: the runtime's own
# modules ("osdp") or transformers' implementation of a config.json ("hf", validate --impl hf).
_OPTIONAL_TOP_KEYS = ("impl",)
IMPLS = ("osdp", "hf")
_ENV_KEYS = ("torch", "backend", "backend_version", "device_kind", "device_name", "world_size",
             "threads_per_rank", "cores", "oversubscribed", "hostname", "python")
_SETTINGS_KEYS = ("warmup", "iters", "seed")
_MEASURED_KEYS = ("iteration_time_s", "peak_memory_bytes", "memory", "losses")
_TIME_STATS = ("mean", "median", "std", "min", "max")


@dataclass(frozen=True)
class Record:
    """A loaded record. `data` is the whole JSON object; the properties are the fields the
    calibration stage reads most."""

    data: dict
    plan: Plan
    model: ModelConfig
    source: str = ""

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def ok(self) -> bool:
        return self.data["status"] == "ok"

    @property
    def measured_iteration_time_s(self) -> float | None:
        return self.data["measured"]["iteration_time_s"]["mean"]

    @property
    def measured_peak_memory_bytes(self) -> int | None:
        return self.data["measured"]["peak_memory_bytes"]

    @property
    def impl(self) -> str:
        """Whose model ran: "osdp" (the runtime's own modules) or "hf" (transformers')."""
        return self.data.get("impl", "osdp")

    @property
    def hardware_profile(self) -> dict:
        return self.data["hardware_profile"]

    def to_dict(self) -> dict:
        return self.data


# ---------------------------------------------------------------- building

def time_stats(per_rank_times_s: list[list[float]]) -> dict:
    """Step time = the slowest rank's time for that step (the step is done when every rank is);
    statistics over steps. Ranks that reached fewer steps shorten the series to the common part."""
    n = min((len(t) for t in per_rank_times_s), default=0)
    steps = [max(t[i] for t in per_rank_times_s) for i in range(n)]
    if not steps:
        stats = {k: None for k in _TIME_STATS}
    else:
        stats = {"mean": statistics.fmean(steps), "median": statistics.median(steps),
                 "std": statistics.pstdev(steps) if len(steps) > 1 else 0.0,
                 "min": min(steps), "max": max(steps)}
    stats["per_step"] = steps
    stats["per_rank"] = per_rank_times_s
    return stats


def build_record(*, status: str, run_id: str, plan: Plan, hardware_profile: dict, env: dict,
                 settings: dict, rank_results: list[dict | None], predicted: dict | None,
                 failure: dict | None = None, created: str | None = None, impl: str = "osdp") -> dict:
    """Assemble a record from the per-rank results the worker writes (see runtime/worker.py).
    `rank_results[r]` is None for a rank that wrote nothing (killed before its first write)."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} not in {STATUSES}")
    results = [r or {} for r in rank_results]
    times = [list(r.get("step_times_s", [])) for r in results]
    memory = [_rank_memory(r) for r in results]
    peaks = [m["tracker_peak_bytes"] for m in memory if m["tracker_peak_bytes"] is not None]
    peak_source = "memtracker"
    if not peaks:
        peaks = [m["cuda_max_allocated_bytes"] for m in memory if m["cuda_max_allocated_bytes"] is not None]
        peak_source = "cuda_max_allocated" if peaks else None
    losses = [list(r.get("losses", [])) for r in results]
    n_loss = min((len(l) for l in losses), default=0)
    measured = {
        "iteration_time_s": time_stats(times),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "peak_memory_source": peak_source,
        "memory": {"per_rank": memory},
        "losses": {"mean": [statistics.fmean(l[i] for l in losses) for i in range(n_loss)],
                   "per_rank": losses,
                   "phases": results[0].get("loss_phases", []) if results else []},
        "steps_reached": [r.get("reached") for r in results],
    }
    errors = None
    if predicted is not None:
        errors = {"iteration_time_rel": _rel(predicted.get("iteration_time_s"),
                                             measured["iteration_time_s"]["mean"]),
                  "peak_memory_rel": _rel(predicted.get("peak_memory_bytes"), measured["peak_memory_bytes"])}
    if impl not in IMPLS:
        raise ValueError(f"impl {impl!r} not in {IMPLS}")
    return {
        "format": FORMAT,
        "version": VERSION,
        **({"impl": impl} if impl != "osdp" else {}),
        "status": status,
        "run_id": run_id,
        "created": created or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "plan": plan_to_dict(plan),
        "model": plan.model.to_dict(),
        "hardware_profile": dict(hardware_profile),
        "env": dict(env),
        "settings": dict(settings),
        "measured": measured,
        "predicted": predicted,
        "errors": errors,
        "failure": failure,
    }


def _rank_memory(r: dict) -> dict:
    m = r.get("memory", {})
    return {"tracker_peak_bytes": m.get("tracker_peak_bytes"),
            "tracker_breakdown": m.get("tracker_breakdown"),
            "rss_hwm_bytes": m.get("rss_hwm_bytes"),
            "cuda_max_allocated_bytes": m.get("cuda_max_allocated_bytes"),
            "cuda_max_reserved_bytes": m.get("cuda_max_reserved_bytes"),
            "tracker_error": m.get("tracker_error")}


def _rel(predicted, measured):
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def predict(plan: Plan, hw, impl: str = "osdp") -> dict:
    """The record's `predicted` block: the cost model's prediction for `plan` on profile `hw`
    (resized to the plan's device count), of the model `impl` runs."""
    from osdp_sim.costmodel import estimate
    from osdp_sim.model.config import for_implementation
    from osdp_sim.model.spec import build_spec
    if hw.device.count != plan.devices:
        hw = hw.with_devices(plan.devices)
    return predicted_from_estimate(estimate(build_spec(for_implementation(plan.model, impl)), hw, plan))


def predicted_from_estimate(est) -> dict:
    """The record's `predicted` block from a costmodel Estimate."""
    return {"iteration_time_s": est.iteration_time_s,
            "peak_memory_bytes": int(est.peak_memory_bytes),
            "samples_per_s": est.samples_per_s,
            "memory_breakdown": {k: int(v) for k, v in est.memory_breakdown.items()},
            "time_breakdown": dict(est.time_breakdown)}


# ---------------------------------------------------------------- naming and writing

def plan_identity(plan: dict) -> dict:
    """What names a run: the plan dict without its notes, written in the oldest format whose
    model fields say everything its model holds (its `source` aside, which format 1 lacks), so
    that a run keeps its record name across format bumps and a campaign still finds the records
    it made before."""
    d = {k: v for k, v in plan.items() if k != "notes"}
    model = d.get("model")
    if not isinstance(model, dict) or not isinstance(d.get("version"), int):
        return d
    for version in sorted(MODEL_FIELDS):
        if version >= d["version"]:
            break
        older = {k: model[k] for k in MODEL_FIELDS[version] if k in model}
        try:
            upgraded = ModelConfig(**older).to_dict()
        except (TypeError, UserError):      # e.g. a described model: no older format holds it
            return d
        if all(model.get(k) == v for k, v in upgraded.items() if k != "source"):
            d.update(version=version, model=older)
            break
    return d


def plan_hash(plan: Plan) -> str:
    """Stable hash of what a plan decides (its notes excluded)."""
    d = plan_identity(plan_to_dict(plan))
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def record_name(record: dict) -> str:
    """Deterministic file name: the same plan run with the same settings replaces its record."""
    plan = record["plan"]
    env, s = record["env"], record["settings"]
    d = plan_identity(plan)
    h = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]
    model = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(record["model"]["name"]))
    cap = f"-cap{s['mem_cap_bytes']}" if s.get("mem_cap_bytes") else ""
    impl = record.get("impl", "osdp")
    tag = "" if impl == "osdp" else f"-{impl}"     # osdp runs keep the names they had before impl
    fake = "-fake" if env.get("fake_world") else ""
    return (f"{model}-{h}{tag}-{env['backend']}-{env['device_kind']}-n{env['world_size']}{fake}"
            f"-t{env['threads_per_rank']}-w{s['warmup']}-i{s['iters']}-s{s['seed']}{cap}.json")


def save_record(record: dict, folder: str | os.PathLike) -> Path:
    """Write atomically (temp file + fsync + rename) into `folder` under record_name(record)."""
    _check(record, "<new record>")
    path = Path(folder) / record_name(record)
    write_json_atomic(path, record)
    return path


def save_record_as(record: dict, path: str | os.PathLike) -> Path:
    _check(record, "<new record>")
    write_json_atomic(path, record)
    return Path(path)


# ---------------------------------------------------------------- loading

def load_record(path: str | os.PathLike) -> Record:
    src = str(path)
    data = read_json(path, "record", "; a partly written record?")
    return record_from_dict(data, source=src)


def record_from_dict(data, *, source: str = "<record>") -> Record:
    _check(data, source)
    plan = plan_from_dict(data["plan"], source=f"{source} (plan)")
    if plan.model != config_from_dict(data["model"], source=source, version=data["version"]):
        raise UserError("does not match plan.model; the record was edited or mixed up",
                        source=source, field="model")
    return Record(data=data, plan=plan, model=plan.model, source=source)


def load_records(dirs, *, status: str | None = None) -> list[Record]:
    """Every *.json record under the given folders (or files), sorted by path. Hidden files
    (the temporaries of an interrupted write) are skipped."""
    if isinstance(dirs, (str, os.PathLike)):
        dirs = [dirs]
    paths = []
    for d in dirs:
        p = Path(d)
        try:
            if p.is_file():
                paths.append(p)
            elif p.is_dir():
                paths.extend(q for q in p.rglob("*.json") if not q.name.startswith("."))
            else:
                raise UserError("no such records folder or file", source=str(d))
        except OSError as e:                    # a name too long, a folder that cannot be listed
            raise UserError(f"cannot read this records folder or file ({e.strerror})", source=str(d)) from None
    out = [load_record(p) for p in sorted(paths)]
    return [r for r in out if status is None or r.status == status]


# Bounds far above any real run: larger values are a slip or a corrupted file.
MAX_SECONDS = 1e7          # 115 days for one step
MAX_BYTES = 2**60          # 1 EiB per device
MAX_RANKS = 2**31 - 1


def _check(data, source: str) -> None:
    def err(field, msg):
        return UserError(msg, source=source, field=field)

    if not isinstance(data, dict):
        raise err(None, "expected a JSON object (an osdp-sim validation record)")
    if data.get("format") != FORMAT:
        raise err("format", f"expected {FORMAT!r}, got {_show(data.get('format'))}; is this a record "
                  "written by `osdp-sim validate`?")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READS:
        raise err("version", f"unsupported version {_show(version)}; this osdp-sim reads "
                  f"versions {', '.join(map(str, READS))}")
    for key in _TOP_KEYS:
        if key not in data:
            raise err(key, "missing required field")
    for key in data:
        if key not in _TOP_KEYS and key not in _OPTIONAL_TOP_KEYS:
            raise err(key, f"unknown field; expected some of {', '.join(_TOP_KEYS + _OPTIONAL_TOP_KEYS)}")
    if "impl" in data and data["impl"] not in IMPLS:
        raise err("impl", f"expected one of {', '.join(IMPLS)}, got {_show(data['impl'])}")
    if not isinstance(data["status"], str) or data["status"] not in STATUSES:
        raise err("status", f"expected one of {', '.join(STATUSES)}, got {_show(data['status'])}")
    ok = data["status"] == "ok"
    for key in ("run_id", "created"):
        _text(data[key], key, err)
    try:
        datetime.fromisoformat(data["created"])
    except ValueError:
        raise err("created", f"expected an ISO 8601 time, got {_show(data['created'])}") from None
    for key in ("plan", "model", "hardware_profile", "env", "settings", "measured"):
        if not isinstance(data[key], dict):
            raise err(key, "expected an object")
    _need(data["hardware_profile"], ("name", "path"), "hardware_profile", err)
    for key in ("name", "path"):
        _text(data["hardware_profile"][key], f"hardware_profile.{key}", err)
    env = data["env"]
    _need(env, _ENV_KEYS, "env", err)
    for key in ("world_size", "threads_per_rank", "cores"):
        _int(env[key], f"env.{key}", err, minimum=1)
    for key in ("backend", "device_kind"):
        _text(env[key], f"env.{key}", err)
    if env.get("fake_world") is not None:
        _int(env["fake_world"], "env.fake_world", err, minimum=1)
        if env["fake_world"] != env["world_size"]:
            raise err("env.fake_world", f"{env['fake_world']} differs from world_size {env['world_size']}")
    if not isinstance(env["oversubscribed"], bool):
        raise err("env.oversubscribed", f"expected true or false, got {_show(env['oversubscribed'])}")
    for key in ("load_avg_1m", "load_avg_1m_before", "other_cpu_fraction"):
        if key in env:
            _num(env[key], f"env.{key}", err, nullable=True, maximum=1e6)
    _need(data["settings"], _SETTINGS_KEYS, "settings", err)
    for key in _SETTINGS_KEYS:
        _int(data["settings"][key], f"settings.{key}", err, minimum=0)
    if data["settings"].get("mem_cap_bytes") is not None:
        _int(data["settings"]["mem_cap_bytes"], "settings.mem_cap_bytes", err, minimum=1, maximum=MAX_BYTES)
    if "timeout_s" in data["settings"]:
        _num(data["settings"]["timeout_s"], "settings.timeout_s", err, nullable=True, maximum=MAX_SECONDS)
    m = data["measured"]
    _need(m, _MEASURED_KEYS, "measured", err)
    t = m["iteration_time_s"]
    if not isinstance(t, dict):
        raise err("measured.iteration_time_s", "expected an object")
    _need(t, _TIME_STATS + ("per_rank",), "measured.iteration_time_s", err)
    for key in _TIME_STATS:
        _num(t[key], f"measured.iteration_time_s.{key}", err, nullable=not ok, maximum=MAX_SECONDS,
             positive=ok and key != "std")
    _seconds_lists(t["per_rank"], "measured.iteration_time_s.per_rank", err, depth=2)
    if "per_step" in t:
        _seconds_lists(t["per_step"], "measured.iteration_time_s.per_step", err, depth=1)
    # null when no rank got through the memory step, or MemTracker failed (memory.per_rank says why)
    _num(m["peak_memory_bytes"], "measured.peak_memory_bytes", err, nullable=True, maximum=MAX_BYTES)
    if not isinstance(m["memory"], dict) or not isinstance(m["memory"].get("per_rank"), list):
        raise err("measured.memory.per_rank", "expected a list with one object per rank")
    per_rank = m["memory"]["per_rank"]
    ran = 1 if env.get("fake_world") else env["world_size"]      # a fake world runs rank 0 alone
    if len(per_rank) != ran:
        raise err("measured.memory.per_rank", f"has {len(per_rank)} entries for "
                  f"world_size {env['world_size']}" + (" on a fake group (one rank runs)" if env.get("fake_world") else ""))
    for r, mem in enumerate(per_rank):
        _rank_memory_check(mem, f"measured.memory.per_rank[{r}]", err)
    if not isinstance(m["losses"], dict):
        raise err("measured.losses", "expected an object {mean, per_rank, phases}")
    if data["predicted"] is not None:
        p = data["predicted"]
        if not isinstance(p, dict):
            raise err("predicted", "expected an object or null")
        _need(p, ("iteration_time_s", "peak_memory_bytes"), "predicted", err)
        _num(p["iteration_time_s"], "predicted.iteration_time_s", err, maximum=MAX_SECONDS)
        _num(p["peak_memory_bytes"], "predicted.peak_memory_bytes", err, maximum=MAX_BYTES)
        for key in ("memory_breakdown", "time_breakdown"):
            if key in p:
                _number_map(p[key], f"predicted.{key}", err)
    if data["errors"] is not None:
        e = data["errors"]
        if not isinstance(e, dict):
            raise err("errors", "expected an object or null")
        for key, v in e.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v)):
                raise err(f"errors.{key}", f"expected a finite number or null, got {_show(v)}")
    if not ok:
        f = data["failure"]
        if not isinstance(f, dict):
            raise err("failure", f"a record with status {data['status']!r} must say why (an object)")
        _need(f, ("rank", "reason", "exit_code", "stderr_tail"), "failure", err)
        for key in ("rank", "exit_code"):
            if f[key] is not None and (isinstance(f[key], bool) or not isinstance(f[key], int)):
                raise err(f"failure.{key}", f"expected a whole number or null, got {_show(f[key])}")
        for key in ("reason", "stderr_tail"):
            if f[key] is not None and not isinstance(f[key], str):
                raise err(f"failure.{key}", f"expected text or null, got {_show(f[key])}")
    elif data["failure"] is not None:
        raise err("failure", "must be null when status is 'ok'")


def _rank_memory_check(mem, where, err):
    if mem is None:
        return
    if not isinstance(mem, dict):
        raise err(where, "expected an object or null")
    for key in ("tracker_peak_bytes", "rss_hwm_bytes", "cuda_max_allocated_bytes", "cuda_max_reserved_bytes"):
        if key in mem:
            _num(mem[key], f"{where}.{key}", err, nullable=True, maximum=MAX_BYTES)
    if mem.get("tracker_breakdown") is not None:
        _number_map(mem["tracker_breakdown"], f"{where}.tracker_breakdown", err, maximum=MAX_BYTES)


def _seconds_lists(v, where, err, *, depth):
    if not isinstance(v, list):
        raise err(where, "expected a list of seconds" if depth == 1 else "expected a list of lists of seconds")
    for i, x in enumerate(v):
        if depth > 1:
            _seconds_lists(x, f"{where}[{i}]", err, depth=depth - 1)
        else:
            _num(x, f"{where}[{i}]", err, maximum=MAX_SECONDS)


def _number_map(v, where, err, *, maximum=float("inf")):
    if not isinstance(v, dict):
        raise err(where, "expected an object of numbers")
    for key, x in v.items():
        _num(x, f"{where}.{key}", err, maximum=maximum, allow_negative=True)


def _need(d, keys, where, err):
    if not isinstance(d, dict):
        raise err(where, "expected an object")
    for k in keys:
        if k not in d:
            raise err(f"{where}.{k}", "missing required field")


def _text(v, field, err):
    if not isinstance(v, str) or not v:
        raise err(field, f"expected text, got {_show(v)}")


def _int(v, field, err, *, minimum=0, maximum=MAX_RANKS):
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
        raise err(field, f"expected a whole number in {minimum}..{maximum}, got {_show(v)}")


def _num(v, field, err, *, nullable=False, maximum=float("inf"), positive=False, allow_negative=False):
    if v is None and nullable:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise err(field, f"expected a finite number, got {_show(v)}")
    if positive and v <= 0:
        raise err(field, f"expected a number > 0 for an ok run, got {_show(v)}")
    if (v < 0 and not allow_negative) or abs(v) > maximum:
        raise err(field, f"expected a number in 0..{maximum:g}, got {_show(v)}")


def _show(v) -> str:
    """A value as written in the file, cut to one short line."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
