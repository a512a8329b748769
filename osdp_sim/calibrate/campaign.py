"""Measurement campaigns: a YAML list of runs (models x plans x ranks x repeats) executed through
`osdp-sim validate`, one record per run, resumable.

File format (validate/README.md, section Campaigns, documents it with examples):

    name: cpu
    hardware: hwprofiles/cpu-2core.yaml   # profile for predictions (path or shipped name)
    device: cpu                           # cpu | cuda
    records_dir: validate/records/cpu     # records go to <records_dir>/n<nproc>/
    backend: fsdp2                        # optional (fsdp2 | fairscale), default fsdp2
    warmup: 2
    iters: 6
    threads: 1                            # torch threads per rank (optional: validate's default)
    seed: 0                               # optional; repeat r of a plan uses seed + r
    timeout_s: 600                        # optional, per run
    plan_defaults: {precision: fp32}      # optional, merged into every plan spec
    runs:
      - model: gpt2-tiny
        nproc: 2
        repeats: 1                        # optional, default 1
        plans:
          - {strategy: zero3, micro_batch: 4}
          - {groups: {attn: ddp, mlp: zero3}, micro_batch: 4}
          - {groups: {default: zero2, mlp: {strategy: zero2, slices: 2, sharded_slices: 1}}, micro_batch: 4}
          - {strategy: zero3, micro_batch: 8, checkpoint: true, repeats: 3}
          - {search: {mem_limit: 300MiB}, micro_batch: 4}

Relative paths are relative to the current directory (run campaigns from the repository root).
A run's record name is deterministic (records.record_name: plan hash, backend, device, ranks,
threads, warmup, iters, seed), so a rerun of the campaign skips every run already recorded.
"""

import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_yaml
from osdp_sim.plan.plan import OPTIMIZERS, PRECISIONS, SPLITS, STRATEGIES, Plan

DEVICES = ("cpu", "cuda")
BACKENDS = ("fsdp2", "fairscale")
_TOP = {"name", "hardware", "device", "records_dir", "backend", "warmup", "iters", "threads", "seed",
        "timeout_s", "plan_defaults", "runs", "description", "impl"}
_RUN = {"model", "nproc", "plans", "repeats", "seq_len", "impl"}
IMPLS = ("osdp", "hf")
_PLAN = {"strategy", "slices", "groups", "search", "file", "micro_batch", "grad_accum", "checkpoint",
         "precision", "optimizer", "shard_group", "reduce_every_microbatch", "repeats", "name"}
_PATTERNS = ("default", "root", "attn", "mlp")
MAX_COUNT = 2**31 - 1          # counts (ranks, steps, repeats, micro-batch) above it are a slip
MAX_TIMEOUT_S = 1e6            # 11.6 days for one run


@dataclass(frozen=True)
class Campaign:
    name: str
    source: str
    hardware: str
    device: str
    records_dir: Path
    backend: str
    warmup: int
    iters: int
    threads: int | None
    seed: int
    timeout_s: float
    runs: tuple["CampaignRun", ...]


@dataclass(frozen=True)
class CampaignRun:
    model: str
    nproc: int
    plans: tuple[dict, ...]          # validated plan specs (plan_defaults merged)
    repeats: int
    seq_len: int | None
    field: str                       # runs[i], for error messages
    impl: str = "osdp"               # whose model runs: osdp-sim's modules or transformers' (hf)


@dataclass(frozen=True)
class Job:
    """One validate invocation."""

    model: str
    nproc: int
    plan: Plan
    seed: int
    repeat: int
    record_path: Path
    label: str
    field: str                       # runs[i].plans[j]
    impl: str = "osdp"


@dataclass
class CampaignSummary:
    total: int
    skipped: int = 0
    ran: int = 0
    ok: int = 0
    failed: list = field(default_factory=list)       # (job label, status, record path)
    wall_s: float = 0.0
    left: int = 0                                    # runs not started (or stopped) at the time limit


# A run the campaign's time limit stopped: validate was ended and no record written, so the run
# is pending again on resume. Not a record status.
STOPPED = "stopped"


# ---------------------------------------------------------------- reading

def load_campaign(path: str | os.PathLike) -> Campaign:
    return campaign_from_dict(read_yaml(path, "campaign"), str(path))


def campaign_from_dict(data, source: str = "<campaign>") -> Campaign:
    def fail(fld, msg):
        raise UserError(msg, source=source, field=fld)

    if not isinstance(data, dict):
        fail(None, "expected a mapping with keys name, hardware, device, records_dir, warmup, iters, runs")
    _keys(data, _TOP, ("name", "hardware", "device", "records_dir", "warmup", "iters", "runs"), "", fail)
    name = _text(data["name"], "name", fail)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        fail("name", f"use letters, digits, '-', '_' or '.', got {name!r}")
    device = data["device"]
    if device not in DEVICES:
        fail("device", f"expected one of {', '.join(DEVICES)}, got {device!r}")
    backend = data.get("backend", "fsdp2")
    if backend not in BACKENDS:
        fail("backend", f"expected one of {', '.join(BACKENDS)}, got {backend!r}")
    warmup = _int(data["warmup"], "warmup", fail, lo=0)
    iters = _int(data["iters"], "iters", fail, lo=1)
    threads = None if data.get("threads") is None else _int(data["threads"], "threads", fail, lo=1)
    seed = _int(data.get("seed", 0), "seed", fail, lo=0)
    default_impl = _impl(data.get("impl", "osdp"), "impl", fail)
    timeout = _seconds(data.get("timeout_s", 600), "timeout_s", fail)
    if "description" in data and not isinstance(data["description"], str):
        fail("description", f"expected text, got {data['description']!r}")
    defaults = data.get("plan_defaults") or {}
    if not isinstance(defaults, dict):
        fail("plan_defaults", "expected a mapping of plan keys (e.g. {precision: fp32})")
    for k in defaults:
        if k not in _PLAN - {"strategy", "groups", "search", "file", "name"}:
            fail(f"plan_defaults.{k}", "not a key that can have a default; expected some of micro_batch, "
                 "grad_accum, checkpoint, precision, optimizer, shard_group, reduce_every_microbatch, repeats")
    hardware = _text(data["hardware"], "hardware", fail)
    from osdp_sim.hardware.load import resolve_profile_path
    try:
        resolve_profile_path(hardware)
    except UserError as e:
        fail("hardware", str(e).split(": ", 1)[-1])
    runs_raw = data["runs"]
    if not isinstance(runs_raw, list) or not runs_raw:
        fail("runs", "expected a non-empty list of {model, nproc, plans}")
    runs = []
    from osdp_sim.model.config import check_runtime_buildable
    from osdp_sim.model.load import load_model_config
    for i, r in enumerate(runs_raw):
        f = f"runs[{i}]"
        if not isinstance(r, dict):
            fail(f, "expected a mapping {model, nproc, plans, repeats}")
        _keys(r, _RUN, ("model", "nproc", "plans"), f, fail)
        model = _text(r["model"], f"{f}.model", fail)
        seq_len = None if r.get("seq_len") is None else _int(r["seq_len"], f"{f}.seq_len", fail, lo=1)
        impl = _impl(r.get("impl", default_impl), f"{f}.impl", fail)
        try:
            cfg = load_model_config(model, seq_len=seq_len, notes=[])
            if impl == "hf":
                # transformers builds the model from the config.json the description came from
                from osdp_sim.model.hf import check_transformers, hf_config_path
                check_transformers(field=f"{f}.impl")
                hf_config_path(cfg)
            else:
                # the runtime's own modules: a model they cannot build fails here, once
                check_runtime_buildable(cfg)
        except UserError as e:
            fail(e.field if e.field and e.field.startswith(f) else f"{f}.model", str(e).split(": ", 1)[-1])
        nproc = _int(r["nproc"], f"{f}.nproc", fail, lo=1)
        repeats = _int(r.get("repeats", 1), f"{f}.repeats", fail, lo=1)
        plans_raw = r["plans"]
        if not isinstance(plans_raw, list) or not plans_raw:
            fail(f"{f}.plans", "expected a non-empty list of plan specs")
        plans = []
        for j, p in enumerate(plans_raw):
            pf = f"{f}.plans[{j}]"
            if isinstance(p, str):
                p = {"strategy": p}
            if not isinstance(p, dict):
                fail(pf, "expected a plan spec mapping, e.g. {strategy: zero3, micro_batch: 4}")
            spec = {**defaults, **p}
            _check_plan_spec(spec, pf, fail)
            plans.append(spec)
        runs.append(CampaignRun(model, nproc, tuple(plans), repeats, seq_len, f, impl))
    return Campaign(name=name, source=source, hardware=hardware,
                    device=device, records_dir=Path(_text(data["records_dir"], "records_dir", fail)),
                    backend=backend, warmup=warmup, iters=iters, threads=threads, seed=seed,
                    timeout_s=float(timeout), runs=tuple(runs))


def _impl(v, fld: str, fail) -> str:
    if v not in IMPLS:
        fail(fld, f"expected one of {', '.join(IMPLS)}, got {_short(v)}")
    return v


def _check_plan_spec(p: dict, f: str, fail) -> None:
    for k in p:
        if k not in _PLAN:
            fail(f"{f}.{k}", f"unknown key; expected some of {', '.join(sorted(_PLAN))}")
    kinds = [k for k in ("strategy", "groups", "search", "file") if k in p]
    if len(kinds) != 1:
        fail(f, "give exactly one of strategy (uniform), groups (per-group choices), search "
             "({mem_limit: ...}: the plan the search picks) or file (a plan JSON)"
             + (f"; got {', '.join(kinds)}" if kinds else ""))
    if "file" not in p and "micro_batch" not in p:
        fail(f"{f}.micro_batch", "missing; every plan needs a micro-batch per rank")
    for k in ("micro_batch", "grad_accum", "shard_group", "repeats"):
        if k in p:
            _int(p[k], f"{f}.{k}", fail, lo=1)
    if "strategy" in p:
        if p["strategy"] not in STRATEGIES:
            fail(f"{f}.strategy", f"expected one of {', '.join(STRATEGIES)}, got {p['strategy']!r}")
        k = p.get("slices", 1)
        if isinstance(k, bool) or not isinstance(k, int) or k not in SPLITS:
            fail(f"{f}.slices", f"expected one of {', '.join(map(str, SPLITS))} (a whole number), got {k!r}")
        if p.get("slices", 1) > 1 and p["strategy"] != "zero3":
            fail(f"{f}.slices", "a uniform split shards every slice: use strategy zero3, or groups with "
                 "{strategy: ddp|zero2, slices: k, sharded_slices: j} for partial splits")
    elif "slices" in p:
        fail(f"{f}.slices", "only with strategy; inside groups give {strategy, slices, sharded_slices}")
    if "groups" in p and not isinstance(p["groups"], dict):
        fail(f"{f}.groups", "expected a mapping such as {attn: ddp, mlp: zero3} (keys default, root, attn, "
             "mlp, block<i>, block<i>.attn, block<i>.mlp)")
    if "search" in p:
        s = p["search"]
        extra = {"strategies", "splits", "checkpoint", "time_limit_s"}
        if not isinstance(s, dict) or set(s) - {"mem_limit"} - extra or "mem_limit" not in s:
            fail(f"{f}.search", "expected {mem_limit: SIZE} and optionally strategies, splits, checkpoint "
                 "(lists) and time_limit_s, e.g. {mem_limit: 300MiB, splits: [1, 2]}")
        allowed = {"strategies": STRATEGIES, "splits": SPLITS, "checkpoint": (False, True)}
        for k, values in allowed.items():
            if k not in s:
                continue
            ok = isinstance(s[k], list) and s[k] and all(
                any(type(v) is type(a) and v == a for a in values) for v in s[k])
            if not ok:
                fail(f"{f}.search.{k}", f"expected a non-empty list of {', '.join(map(str, values))}, "
                     f"got {s[k]!r}")
        if "time_limit_s" in s:
            _seconds(s["time_limit_s"], f"{f}.search.time_limit_s", fail)
        from osdp_sim.units import parse_bytes
        parse_bytes(s["mem_limit"], field=f"{f}.search.mem_limit")
    for k in ("file", "name"):
        if k in p:
            _text(p[k], f"{f}.{k}", fail)
    if "precision" in p and p["precision"] not in PRECISIONS:
        fail(f"{f}.precision", f"expected one of {', '.join(PRECISIONS)}, got {p['precision']!r}")
    if "optimizer" in p and p["optimizer"] not in OPTIMIZERS:
        fail(f"{f}.optimizer", f"expected one of {', '.join(OPTIMIZERS)}, got {p['optimizer']!r}")
    if "reduce_every_microbatch" in p and not isinstance(p["reduce_every_microbatch"], bool):
        fail(f"{f}.reduce_every_microbatch", "expected true or false")
    c = p.get("checkpoint", False)
    if not (isinstance(c, bool) or c in ("all", "none") or
            (isinstance(c, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in c))):
        fail(f"{f}.checkpoint", f"expected true/false, all, none or a list of block indices, got {c!r}")


def _keys(d: dict, known: set, required: tuple, where: str, fail) -> None:
    for k in d:
        if k not in known:
            fail(f"{where}.{k}" if where else str(k), f"unknown key; expected some of {', '.join(sorted(known))}")
    for k in required:
        if k not in d:
            fail(f"{where}.{k}" if where else k, "missing required key")


def _text(v, fld: str, fail) -> str:
    if not isinstance(v, str) or not v.strip():
        fail(fld, f"expected a non-empty text, got {v!r}")
    return v


def _int(v, fld: str, fail, *, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= MAX_COUNT:
        fail(fld, f"expected a whole number in {lo}..{MAX_COUNT}, got {_short(v)}")
    return v


def _seconds(v, fld: str, fail) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0 < v <= MAX_TIMEOUT_S:
        fail(fld, f"expected a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {_short(v)}")
    return float(v)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- plans

def build_plan(spec: dict, model_cfg, nproc: int, *, hw=None, source: str = "<campaign>",
               field: str = "plan") -> Plan:
    """A Plan from a campaign plan spec (already checked by _check_plan_spec)."""
    from osdp_sim.model.spec import build_spec
    from osdp_sim.plan import load_plan, plan_from_dict
    from osdp_sim.plan.io import VERSION as PLAN_VERSION

    def fail(fld, msg):
        raise UserError(msg, source=source, field=f"{field}.{fld}" if fld else field)

    if "file" in spec:
        plan = load_plan(spec["file"])
        # `source` says where each came from (a plan file of format 1 has none) and
        # `implementation` whose modules it was made for: not the model
        same = {"source": "", "implementation": ""}
        if plan.model.to_dict() | same != model_cfg.to_dict() | same:
            fail("file", f"the plan is for model {plan.model.name!r}, the run for {model_cfg.name!r}")
        if plan.devices != nproc:
            fail("file", f"the plan is for {plan.devices} devices, the run has nproc {nproc}")
        import dataclasses
        from osdp_sim.model.config import for_implementation
        return dataclasses.replace(plan, model=for_implementation(plan.model, model_cfg.implementation))
    spec_ = build_spec(model_cfg)
    n = model_cfg.n_layers
    ckpt = spec.get("checkpoint", False)
    if ckpt is True or ckpt == "all":
        blocks = list(range(n))
    elif ckpt is False or ckpt == "none":
        blocks = []
    else:
        bad = [i for i in ckpt if not 0 <= i < n]
        if bad:
            fail("checkpoint", f"block {bad[0]} out of range 0..{n - 1} for {model_cfg.name}")
        blocks = list(ckpt)
    common = {"model": model_cfg.to_dict(), "devices": nproc, "micro_batch": spec["micro_batch"],
              "grad_accum": spec.get("grad_accum", 1), "precision": spec.get("precision", "bf16"),
              "optimizer": spec.get("optimizer", "adamw"), "shard_group": spec.get("shard_group", nproc),
              "reduce_every_microbatch": spec.get("reduce_every_microbatch", True), "checkpoint": blocks}
    if spec.get("shard_group", nproc) > nproc or nproc % spec.get("shard_group", nproc):
        fail("shard_group", f"must divide nproc ({nproc}), got {spec['shard_group']}")
    if "search" in spec:
        return _search_plan(spec, model_cfg, nproc, hw, common, fail)
    if "strategy" in spec:
        k = spec.get("slices", 1)
        groups = {key: ({"strategy": spec["strategy"], "slices": k} if key != "root" and k > 1
                        else spec["strategy"]) for key in spec_.plan_keys}
    else:
        groups = _expand_groups(spec["groups"], spec_.plan_keys, fail)
    d = {"format": "osdp-sim/plan", "version": PLAN_VERSION, **common, "groups": groups,
         "notes": {"made_by": "osdp-sim campaign"}}
    return plan_from_dict(d, source=f"{source}: {field}")


def _expand_groups(groups: dict, plan_keys, fail) -> dict:
    """Patterns -> one choice per plan key. Precedence: block<i>.attn/mlp (exact) > block<i> >
    attn / mlp > default; root: root > default."""
    for key in groups:
        if key not in _PATTERNS and key not in plan_keys and not re.fullmatch(r"block\d+", str(key)):
            fail(f"groups.{key}", f"unknown group pattern; use default, root, attn, mlp, block<i> or an exact "
                 f"key such as {plan_keys[1]}")
        if re.fullmatch(r"block\d+", str(key)) and f"{key}.attn" not in plan_keys:
            fail(f"groups.{key}", "no such block in this model")
    out = {}
    for key in plan_keys:
        if key == "root":
            cands = ["root", "default"]
        else:
            block, kind = key.split(".")
            cands = [key, block, kind, "default"]
        choice = next((groups[c] for c in cands if c in groups), None)
        if choice is None:
            fail(f"groups.{cands[-2] if key != 'root' else 'root'}", f"no choice for {key}; add it or a "
                 "default")
        out[key] = choice
    return out


def _search_plan(spec: dict, model_cfg, nproc: int, hw, common: dict, fail) -> Plan:
    """The plan the exact search (osdp_sim.planner.bnb) picks under the memory limit, at this
    micro-batch (and accumulation, precision, optimizer, shard group)."""
    from osdp_sim.model.spec import build_spec
    from osdp_sim.units import parse_bytes
    try:
        from osdp_sim.planner.bnb import search
        from osdp_sim.planner.space import SearchSpace
    except ImportError:
        fail("search", "the exact search (osdp_sim.planner.bnb) is not available in this installation")
    if hw is None:
        fail("search", "needs the campaign's hardware profile")
    s = spec["search"]
    limit = parse_bytes(s["mem_limit"], field="search.mem_limit")
    hw_n = hw if hw.device.count == nproc else hw.with_devices(nproc)
    mb, ga = common["micro_batch"], common["grad_accum"]
    kw = {k: tuple(s[k]) for k in ("strategies", "splits", "checkpoint") if k in s}
    try:
        space = SearchSpace(micro_batches=(mb,), global_batch=mb * ga * nproc if ga > 1 else None,
                            shard_groups=(common["shard_group"],), precision=common["precision"],
                            optimizer=common["optimizer"], devices=nproc, **kw)
    except UserError as e:
        fail(f"search.{e.field}" if e.field else "search", str(e).split(": ")[-1])
    result = search(build_spec(model_cfg), hw_n, limit, space, time_limit_s=float(s.get("time_limit_s", 120)))
    if result.plan is None:
        fail("search.mem_limit", f"no plan fits in {s['mem_limit']} for {model_cfg.name} at micro-batch {mb} "
             f"on {hw.name}")
    from dataclasses import replace
    return replace(result.plan, notes={"made_by": "osdp-sim campaign (search)", "hardware": hw.name,
                                       "mem_limit_bytes": limit, "status": result.status})


# ---------------------------------------------------------------- jobs

def plan_jobs(c: Campaign, *, hw=None) -> list[Job]:
    """Every validate invocation of the campaign, in file order, duplicates removed (the same plan,
    ranks and seed listed twice is one run)."""
    from osdp_sim.model.config import for_implementation
    from osdp_sim.model.load import load_model_config
    from osdp_sim.runtime.launch import available_cores
    if hw is None and any("search" in p for run in c.runs for p in run.plans):
        from osdp_sim.hardware.load import load_profile
        hw = load_profile(c.hardware)
    jobs, seen = [], set()
    for run in c.runs:
        # Runs are predicted (and named) as the implementation that runs them keeps it (impl: the
        # runtime's own modules or transformers'), as validate does (validate_cmd.runtime_plan).
        cfg = for_implementation(load_model_config(run.model, seq_len=run.seq_len), run.impl)
        threads = c.threads or max(1, available_cores() // run.nproc)
        for j, spec in enumerate(run.plans):
            fld = f"{run.field}.plans[{j}]"
            plan = build_plan(spec, cfg, run.nproc, hw=hw, source=c.source, field=fld)
            repeats = spec.get("repeats", run.repeats)
            for k in range(repeats):
                seed = c.seed + k
                name = expected_record_name(plan, backend=c.backend, device=c.device, world=run.nproc,
                                            threads=threads, warmup=c.warmup, iters=c.iters, seed=seed,
                                            impl=run.impl)
                path = c.records_dir / f"n{run.nproc}" / name
                if path in seen:
                    continue
                seen.add(path)
                from osdp_sim.calibrate.runs import plan_label
                jobs.append(Job(run.model, run.nproc, plan, seed, k, path,
                                f"{run.model}{' (hf)' if run.impl == 'hf' else ''} n{run.nproc} "
                                f"{spec.get('name') or plan_label(plan)}"
                                + (f" (repeat {k + 1}/{repeats})" if repeats > 1 else ""), fld, run.impl))
    return jobs


def expected_record_name(plan: Plan, *, backend: str, device: str, world: int, threads: int, warmup: int,
                         iters: int, seed: int, impl: str = "osdp") -> str:
    """The file name `osdp-sim validate --records-dir` gives this run's record (records.record_name)."""
    from osdp_sim.plan import plan_to_dict
    from osdp_sim.records import record_name
    return record_name({"plan": plan_to_dict(plan), "model": {"name": plan.model.name},
                        "env": {"backend": backend, "device_kind": device, "world_size": world,
                                "threads_per_rank": threads},
                        "settings": {"warmup": warmup, "iters": iters, "seed": seed}, "impl": impl})


def recorded_status(path: Path) -> str | None:
    """The status of the record at `path`, or None when there is none (or it cannot be read: a
    half-written or edited file is run again)."""
    if not path.is_file():
        return None
    from osdp_sim.records import load_record
    try:
        return load_record(path).status
    except UserError:
        return None


def pending(jobs: list[Job], *, retry_failed: bool = False) -> list[Job]:
    out = []
    for j in jobs:
        status = recorded_status(j.record_path)
        if status is None or (retry_failed and status != "ok"):
            out.append(j)
    return out


# ---------------------------------------------------------------- running

def validate_command(c: Campaign, job: Job, plan_file: Path, threads: int) -> list[str]:
    return [sys.executable, "-m", "osdp_sim.cli.main", "validate", "--plan", str(plan_file),
            "--hw", c.hardware, "--nproc", str(job.nproc), "--device", c.device, "--backend", c.backend,
            "--warmup", str(c.warmup), "--iters", str(c.iters), "--seed", str(job.seed),
            "--threads", str(threads), "--timeout", f"{c.timeout_s:g}", "-o", str(job.record_path)] \
        + (["--impl", job.impl] if job.impl != "osdp" else [])


def validate_runner(c: Campaign, job: Job, *, log="stderr", nice: int | None = None,
                    deadline_s: float | None = None) -> str:
    """Run one job with `osdp-sim validate` in a subprocess; returns the record's status. When
    validate dies without writing a record, a failed record is written here so the campaign
    keeps the evidence and moves on. `nice`: the run's scheduling priority (os.nice increment,
    inherited by its ranks); -20 lets a run keep its cores against other work on the machine.
    `deadline_s` (time.monotonic()): the campaign's time limit; a run still going then is stopped
    and left unrecorded (STOPPED), so that a resumed campaign runs it again."""
    log = sys.stderr if log == "stderr" else log
    budget_s = c.timeout_s + 120
    stopped_by_deadline = False
    if deadline_s is not None:
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            return STOPPED
        stopped_by_deadline = left_s < budget_s
        budget_s = min(budget_s, left_s)
    from osdp_sim.plan import save_plan
    from osdp_sim.runtime.launch import available_cores
    threads = c.threads or max(1, available_cores() // job.nproc)
    job.record_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="osdp-sim-campaign-") as tmp:
        plan_file = Path(tmp) / "plan.json"
        save_plan(job.plan, plan_file)
        cmd = validate_command(c, job, plan_file, threads)
        logfile = Path(tmp) / "validate.log"
        try:
            with open(logfile, "wb") as out:
                rc = _run_validate(cmd, out, budget_s, nice)
        except KeyboardInterrupt:
            _echo_kept_folder(logfile.read_text(errors="replace"), log)   # the log goes with tmp
            raise
        text = logfile.read_text(errors="replace")
    status = recorded_status(job.record_path)
    if status is None and rc is None and stopped_by_deadline:
        _echo_kept_folder(text, log)
        return STOPPED
    if status is None:
        tail = "\n".join(text.splitlines()[-40:])
        _write_failed_record(c, job, threads, rc, tail)
        status = "failed"
    if status != "ok" and log:
        lines = [l for l in text.splitlines() if l.strip()][-6:]
        for l in lines:
            print(f"    | {l}", file=log)
    return status


def _echo_kept_folder(validate_output: str, log) -> None:
    """A validate stopped by Ctrl-C, SIGTERM or the campaign's limit says where it left its run
    folder (rank logs); its output is in a temporary file, so repeat that line."""
    for line in validate_output.splitlines():
        if "rank logs kept in" in line and log:
            print(f"    | {line}", file=log, flush=True)


def _run_validate(cmd: list[str], out, timeout_s: float, nice: int | None) -> int | None:
    """Run validate to its end; its exit code, None past `timeout_s`. However this ends (timeout,
    Ctrl-C, SIGTERM on the campaign), validate is gone after it: SIGTERM first, so its launcher
    stops its ranks, then SIGKILL (the ranks die with it through PDEATHSIG)."""
    from osdp_sim.runtime.launch import _install_term_handler, _restore_term_handler
    prev_term = _install_term_handler()          # SIGTERM -> KeyboardInterrupt: the finally runs
    proc = None
    try:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=(lambda: os.nice(nice)) if nice else None)
        with _boosted(proc.pid, nice):
            return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _restore_term_handler(prev_term)


class _boosted:
    """While a run lasts, give every process it starts (its ranks) the niceness `nice`, and their
    scheduler autogroups too: the launcher starts each rank in its own session, and with
    kernel.sched_autogroup_enabled a session's processes compete as one group whose weight only
    /proc/<pid>/autogroup sets. Best effort, Linux only; our own processes only."""

    def __init__(self, root_pid: int, nice: int | None):
        self.root, self.nice = root_pid, nice
        self.done: set[int] = set()
        self.stop = None

    def __enter__(self):
        if self.nice and sys.platform.startswith("linux"):
            import threading
            self.stop = threading.Event()
            threading.Thread(target=self._loop, daemon=True).start()
        return self

    def __exit__(self, *exc):
        if self.stop is not None:
            self.stop.set()

    def _loop(self):
        while not self.stop.wait(0.1):
            for pid in _descendants(self.root) - self.done:
                self.done.add(pid)
                try:
                    os.setpriority(os.PRIO_PROCESS, pid, self.nice)
                    Path(f"/proc/{pid}/autogroup").write_text(str(self.nice))
                except OSError:
                    pass


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _write_failed_record(c: Campaign, job: Job, threads: int, rc, tail: str) -> None:
    import platform
    import socket
    from osdp_sim.hardware.load import load_profile, resolve_profile_path
    from osdp_sim.records import build_record, save_record_as
    from osdp_sim.runtime.launch import available_cores, new_run_id
    try:
        hw = load_profile(c.hardware)
        hw_info = {"name": hw.name, "path": str(resolve_profile_path(c.hardware))}
    except UserError:
        hw_info = {"name": c.hardware, "path": c.hardware}
    cores = available_cores()
    env = {"torch": None, "backend": c.backend, "backend_version": None, "device_kind": c.device,
           "device_name": None, "world_size": job.nproc, "threads_per_rank": threads, "cores": cores,
           "oversubscribed": c.device == "cpu" and job.nproc * threads > cores,
           "hostname": socket.gethostname(), "python": platform.python_version()}
    reason = ("osdp-sim validate timed out and was killed" if rc is None
              else f"osdp-sim validate exited with code {rc} without writing a record")
    record = build_record(status="failed", run_id=new_run_id(), plan=job.plan, hardware_profile=hw_info,
                          env=env, settings={"warmup": c.warmup, "iters": c.iters, "seed": job.seed},
                          rank_results=[None] * job.nproc, predicted=None,
                          failure={"rank": None, "reason": reason, "exit_code": rc, "stderr_tail": tail},
                          impl=job.impl)
    save_record_as(record, job.record_path)


def cpu_busy_fraction(sample_s: float = 2.0) -> float | None:
    """Fraction of all cores busy over `sample_s` seconds (Linux /proc/stat), None elsewhere."""
    from osdp_sim.runtime.launch import machine_cpu_s
    before = machine_cpu_s()
    time.sleep(sample_s)
    after = machine_cpu_s()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return min(1.0, (after[0] - before[0]) / (after[1] - before[1]))    # float sums reach 1 + 1e-12


def wait_until_idle(max_busy: float, *, log="stderr", poll_s: float = 10.0, sample_s: float = 2.0,
                    deadline_s: float | None = None) -> float:
    """Block until other work leaves the CPUs at most `max_busy` busy (a fraction), or until
    `deadline_s` (time.monotonic()); returns the seconds waited. CPU step times are only
    comparable when nothing else runs."""
    log = sys.stderr if log == "stderr" else log
    waited, said = 0.0, -60.0
    while True:
        busy = cpu_busy_fraction(sample_s)
        if busy is None or busy <= max_busy or _past(deadline_s):
            return waited
        if log and waited - said >= 60:
            print(f"    waiting for an idle machine: CPUs {busy:.0%} busy (limit {max_busy:.0%}), "
                  f"waited {waited:.0f} s", file=log, flush=True)
            said = waited
        time.sleep(poll_s)
        waited += poll_s + sample_s


def run_campaign(c: Campaign, *, runner=validate_runner, retry_failed: bool = False, hw=None,
                 log="stderr", jobs: list[Job] | None = None, max_busy: float | None = None,
                 max_foreign: float | None = None, attempts: int = 3,
                 log_extra: dict | None = None, time_limit_s: float | None = None) -> CampaignSummary:
    """Run every job not yet recorded, in order; a failure is recorded and the campaign goes on.
    `max_busy`: before each run, wait until the CPUs are at most this busy (wait_until_idle).
    `max_foreign`: a run during which other work used more than this share of the CPUs is run
    again (its record replaced), up to `attempts` times; the last attempt is kept either way.
    Every attempt is logged to <records_dir>/campaign-log.jsonl (wall time, foreign CPU share:
    runtime.launch.other_cpu_fraction, the measure the record's env.other_cpu_fraction uses).
    `time_limit_s`: no run starts after it, and the run going on at it is stopped unrecorded (the
    runner gets `deadline_s`); summary.left counts the runs a resumed campaign will do."""
    from osdp_sim.runtime.launch import cpu_account, other_cpu_fraction
    log = sys.stderr if log == "stderr" else log
    jobs = plan_jobs(c, hw=hw) if jobs is None else jobs
    todo = pending(jobs, retry_failed=retry_failed)
    summary = CampaignSummary(total=len(jobs), skipped=len(jobs) - len(todo))
    if log:
        print(f"campaign {c.name}: {len(jobs)} runs, {summary.skipped} already recorded, "
              f"{len(todo)} to run", file=log, flush=True)
    durations: list[float] = []
    t_start = time.monotonic()
    deadline_s = None if time_limit_s is None else t_start + time_limit_s
    timed = {} if deadline_s is None else {"deadline_s": deadline_s}
    order = {id(j): i for i, j in enumerate(jobs)}
    for n, job in enumerate(todo):
        if _past(deadline_s):
            summary.left = len(todo) - n
            break
        if log:
            eta = _eta(durations, len(todo) - n)
            print(f"campaign {c.name}: run {order[id(job)] + 1}/{len(jobs)} ({n + 1} of {len(todo)} "
                  f"this time) {job.label}, seed {job.seed}{eta}", file=log, flush=True)
        for attempt in range(1, attempts + 1):
            if max_busy is not None:
                wait_until_idle(max_busy, log=log, deadline_s=deadline_s)
            t0, before = time.monotonic(), cpu_account()
            status = runner(c, job, log=log, **timed)
            wall, after = time.monotonic() - t0, cpu_account()
            if status == STOPPED:
                break
            foreign = other_cpu_fraction(before, after)
            _log_attempt(c, job, status, attempt, wall, foreign, log_extra)
            disturbed = (max_foreign is not None and foreign is not None and foreign > max_foreign
                         and status == "ok")
            if log:
                extra = f", other work used {foreign:.0%} of the CPUs" if foreign is not None else ""
                print(f"campaign {c.name}:   {status} in {wall:.0f} s{extra} -> {job.record_path}",
                      file=log, flush=True)
            if not disturbed or attempt == attempts or _past(deadline_s):
                break
            if log:
                print(f"campaign {c.name}:   disturbed (limit {max_foreign:.0%}): running it again",
                      file=log, flush=True)
            job.record_path.unlink(missing_ok=True)
        if status == STOPPED:
            if log:
                print(f"campaign {c.name}:   stopped at the time limit, not recorded", file=log, flush=True)
            summary.left = len(todo) - n
            break
        durations.append(wall)
        summary.ran += 1
        if status == "ok":
            summary.ok += 1
        else:
            summary.failed.append((job.label, status, str(job.record_path)))
    summary.wall_s = time.monotonic() - t_start
    return summary


def _past(deadline_s: float | None) -> bool:
    return deadline_s is not None and time.monotonic() >= deadline_s


def _log_attempt(c: Campaign, job: Job, status: str, attempt: int, wall_s: float, foreign: float | None,
                 extra: dict | None = None) -> None:
    import json
    from datetime import datetime, timezone
    line = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "campaign": c.name,
            "record": str(job.record_path), "label": job.label, "seed": job.seed, "attempt": attempt,
            "status": status, "wall_s": round(wall_s, 2),
            "foreign_cpu_fraction": None if foreign is None else round(foreign, 4), **(extra or {})}
    c.records_dir.mkdir(parents=True, exist_ok=True)
    with open(c.records_dir / "campaign-log.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def _eta(durations: list[float], remaining: int) -> str:
    if not durations:
        return ""
    left = statistics.fmean(durations) * remaining
    return f", about {left / 60:.0f} min left" if left >= 90 else f", about {left:.0f} s left"
