"""Validation records as calibration data: the measured numbers of one run, the model and plan to
predict it with, and the checks that the run belongs to the profile being calibrated.

A fit may span several models; what must match is the hardware: the profile a record was validated
against (by name), the device kind, a world size the profile has devices for, the threads per
rank the profile was measured with, and no oversubscribed cores. A mismatch is a UserError naming
the record file and the field.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec, build_spec
from osdp_sim.plan.plan import Plan


@dataclass(frozen=True)
class Run:
    source: str                    # the record file
    model_name: str
    spec: ModelSpec
    plan: Plan
    world_size: int
    time_s: float                  # measured: median over timed steps of the slowest rank's step
    time_spread: float             # within the run: std / mean of the timed steps
    memory_bytes: float | None     # measured: tracked peak, largest over ranks (None: not measured)
    samples: int                   # per optimizer step, all ranks together
    plan_id: str                   # the plan and its settings, without the seed: repeats share it
    label: str                     # short description of the plan for tables
    oversubscribed: bool = False
    load_avg: float | None = None  # 1-minute load average when the run ended (other work inflates times)
    tracker_breakdown: dict | None = None   # MemTracker bytes per category at the peak (rank with the top peak)
    fake_world: bool = False       # one rank on torch's fake group (validate --fake-world): no communication measured

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.time_s


def base_names(profile: HardwareProfile) -> set[str]:
    """Names a record may carry to count as measured on this profile's hardware: the profile's
    own, and the profile it was calibrated from."""
    names = {profile.name}
    cal = (profile.provenance or {}).get("calibration") or {}
    base = cal.get("base_profile")
    if isinstance(base, dict) and isinstance(base.get("name"), str):
        names.add(base["name"])
    return names


def plan_label(plan: Plan) -> str:
    """'zero3 mb4', 'attn ddp / mlp zero3 mb4 ckpt', 'mixed(3) mb2' ..."""
    by_kind: dict[str, set] = {}
    for key, c in plan.choices.items():
        kind = key.split(".")[-1] if key != "root" else "root"
        by_kind.setdefault(kind, set()).add(c.label())
    labels = {k: sorted(v) for k, v in by_kind.items()}
    flat = {l for v in labels.values() for l in v}
    if len(flat) == 1:
        text = next(iter(flat))
    else:
        parts = []
        for kind in ("root", "attn", "mlp"):
            if kind in labels:
                v = labels[kind]
                parts.append(f"{kind} {v[0] if len(v) == 1 else 'mixed(' + str(len(v)) + ')'}")
        text = " / ".join(parts)
    text += f" mb{plan.micro_batch}"
    if plan.grad_accum > 1:
        text += f" ga{plan.grad_accum}"
    n_ckpt = sum(plan.checkpoint)
    if n_ckpt:
        text += " ckpt" if n_ckpt == len(plan.checkpoint) else f" ckpt{n_ckpt}"
    if plan.precision != "bf16":
        text += f" {plan.precision}"
    if plan.shard_size != plan.devices:
        text += f" hsdp{plan.shard_size}"
    return text


def run_from_record(record, profile: HardwareProfile, *, strict: bool = True) -> Run:
    """Check one ok record against the profile and extract what calibration needs.
    `strict` False (evaluation only): the world size may exceed the profile and cores may be
    oversubscribed; the name and device kind must still match."""
    src = record.source
    d = record.data
    env = d["env"]

    def fail(field, msg):
        raise UserError(msg, source=src, field=field)

    names = base_names(profile)
    got = d["hardware_profile"].get("name")
    if got not in names:
        fail("hardware_profile.name", f"the run was validated against profile {got!r}, but this "
             f"calibration is of {profile.name!r}; calibrate {got!r} instead, or keep the records of "
             "different hardware in different folders")
    if env["device_kind"] != profile.device.kind:
        fail("env.device_kind", f"the run was on {env['device_kind']!r} but profile {profile.name!r} "
             f"describes {profile.device.kind!r} devices")
    world = env["world_size"]
    if record.plan.devices != world:
        fail("plan.devices", f"the plan is for {record.plan.devices} devices but the run had "
             f"world_size {world}")
    fake = bool(env.get("fake_world"))
    if strict:
        if world > profile.device.count and not fake:       # a fake world runs on one device
            fail("env.world_size", f"{world} ranks, but profile {profile.name!r} has "
                 f"{profile.device.count} devices; fit only runs the hardware has (pass such runs "
                 "with --evaluate to see how far off they are)")
        if env["oversubscribed"]:
            fail("env.oversubscribed", "the ranks shared cores, so the timing is not the profile's "
                 "hardware; pass such runs with --evaluate instead of fitting them")
        threads = (profile.provenance or {}).get("threads_per_rank")
        if isinstance(threads, int) and env["threads_per_rank"] != threads:
            fail("env.threads_per_rank", f"the run used {env['threads_per_rank']} threads per rank but "
                 f"the profile was measured with {threads}")
    t = d["measured"]["iteration_time_s"]
    steps = t.get("per_step") or []
    spread = 0.0
    if len(steps) > 1 and t["mean"]:
        spread = t["std"] / t["mean"]
    settings = d["settings"]
    plan_dict = {k: v for k, v in d["plan"].items() if k != "notes"}
    plan_id = json.dumps({"plan": plan_dict, "world": world, "threads": env["threads_per_rank"],
                          "backend": env["backend"], "warmup": settings["warmup"],
                          "iters": settings["iters"]}, sort_keys=True)
    plan = record.plan
    peak = d["measured"]["peak_memory_bytes"]
    ranks = [m for m in d["measured"]["memory"]["per_rank"] if isinstance(m, dict) and m.get("tracker_breakdown")]
    top = max(ranks, key=lambda m: m.get("tracker_peak_bytes") or 0, default=None)
    return Run(source=src, model_name=record.model.name, spec=build_spec(record.model), plan=plan,
               world_size=world, time_s=float(t["median"]), time_spread=spread,
               memory_bytes=None if peak is None else float(peak),
               samples=plan.micro_batch * plan.grad_accum * plan.devices, plan_id=plan_id,
               label=plan_label(plan), oversubscribed=bool(env["oversubscribed"]),
               load_avg=env.get("load_avg_1m"),
               tracker_breakdown=dict(top["tracker_breakdown"]) if top else None, fake_world=fake)


def runs_from_records(records, profile: HardwareProfile, *, strict: bool = True
                      ) -> tuple[list[Run], list[tuple[str, str]]]:
    """(usable runs, [(file, why excluded)]) — runs that did not finish ok are excluded, not errors."""
    runs, excluded = [], []
    for r in records:
        if not r.ok:
            reason = (r.data.get("failure") or {}).get("reason") or ""
            excluded.append((r.source, f"status {r.status}" + (f": {reason[:120]}" if reason else "")))
            continue
        runs.append(run_from_record(r, profile, strict=strict))
    return runs, excluded


def load_runs(dirs, profile: HardwareProfile, *, strict: bool = True):
    from osdp_sim.records import load_records
    paths = [Path(d) for d in dirs]
    records = load_records(paths)
    if not records:
        raise UserError("no record files (*.json) found", source=", ".join(str(p) for p in paths))
    runs, excluded = runs_from_records(records, profile, strict=strict)
    runs.sort(key=lambda r: (r.model_name, r.world_size, r.label, r.source))
    return runs, excluded
