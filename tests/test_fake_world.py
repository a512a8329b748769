"""validate --fake-world N: one process as rank 0 of an N-device plan on torch's fake process
group. Real shard sizes, so the tracked peak is the N-device job's (checked against the cost
model within 1% on 8-rank plans); collectives move nothing, so the record says communication was
not measured and calibration predicts those runs with communication free."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from osdp_sim.calibrate.runs import load_runs                       # noqa: E402
from osdp_sim.costmodel import estimate                             # noqa: E402
from osdp_sim.hardware.load import load_profile                     # noqa: E402
from osdp_sim.model.load import load_model                          # noqa: E402
from osdp_sim.plan import GroupChoice, save_plan, uniform_plan      # noqa: E402
from osdp_sim.records import load_record                            # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HW = str(ROOT / "hwprofiles" / "cpu-2core-calibrated.yaml")


def _validate(*args, out: Path):
    r = subprocess.run([sys.executable, "-m", "osdp_sim.cli.main", "validate", "--hw", HW, "--warmup", "1",
                        "--iters", "2", "--threads", "1", "--records-dir", str(out), *args],
                       capture_output=True, text=True, timeout=300)
    return r


def _mixed_plan(model: str, devices: int):
    spec = load_model(model)
    p = uniform_plan(spec.config, "zero3", devices=devices, micro_batch=2)
    ch = dict(p.choices)
    ch["block0.attn"] = GroupChoice("ddp")
    ch["block0.mlp"] = GroupChoice("zero2", 2, 1)
    ch["block1.mlp"] = GroupChoice("zero3", 4, 4)
    ch["root"] = GroupChoice("zero2")
    ck = tuple(i == 1 for i in range(spec.config.n_layers))
    from dataclasses import replace
    return replace(p, choices=ch, checkpoint=ck)


def test_without_communication_leaves_compute_alone():
    hw = load_profile(HW)
    spec = load_model("gpt2-tiny")
    plan = uniform_plan(spec.config, "zero3", devices=2, micro_batch=2)
    real, free = estimate(spec, hw, plan), estimate(spec, hw.without_communication(), plan)
    assert real.time_breakdown["communication_s"] > 0
    assert free.time_breakdown["communication_s"] < 1e-15
    assert free.iteration_time_s == pytest.approx(free.time_breakdown["compute_s"], rel=1e-12)
    assert free.time_breakdown["compute_s"] == pytest.approx(real.time_breakdown["compute_s"], rel=1e-12)
    assert free.peak_memory_bytes == pytest.approx(real.peak_memory_bytes, rel=0.02)


@pytest.mark.parametrize("model,kind", [("gpt2-tiny", "uniform"), ("gpt2-tiny", "mixed"), ("llama-tiny", "uniform")])
def test_eight_rank_plan_in_one_process_matches_the_predicted_peak(tmp_path, model, kind):
    if kind == "uniform":
        r = _validate("--model", model, "--strategy", "zero3", "--micro-batch", "2", "--fake-world", "8", out=tmp_path)
    else:
        plan_file = tmp_path / "plan.json"
        save_plan(_mixed_plan(model, 8), plan_file)
        r = _validate("--plan", str(plan_file), "--fake-world", "8", out=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (path,) = tmp_path.glob("*-n8-fake-*.json")
    rec = load_record(path)
    env = rec.data["env"]
    assert env["fake_world"] == env["world_size"] == 8 and len(rec.data["measured"]["memory"]["per_rank"]) == 1
    hw = load_profile(HW).with_devices(8)
    spec = load_model(model)
    job = estimate(spec, hw, rec.plan)                              # the 8-device job's peak
    step = estimate(spec, hw.without_communication(), rec.plan)     # its step with collectives free
    assert rec.data["predicted"]["peak_memory_bytes"] == int(job.peak_memory_bytes)
    assert rec.data["predicted"]["iteration_time_s"] == pytest.approx(step.iteration_time_s, rel=1e-12)
    assert rec.measured_peak_memory_bytes == pytest.approx(job.peak_memory_bytes, rel=0.01)
    losses = rec.data["measured"]["losses"]["mean"]
    assert all(l == l and abs(l) < 1e4 for l in losses)          # finite: the local shards were initialised


def test_fake_runs_calibrate_without_communication(tmp_path):
    r = _validate("--model", "gpt2-tiny", "--strategy", "zero2", "--micro-batch", "1", "--fake-world", "4", out=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    hw = load_profile(HW)                       # 2 devices: a fake world of 4 still fits (one device ran)
    runs, excluded = load_runs([tmp_path], hw)
    assert len(runs) == 1 and not excluded and runs[0].fake_world
    from osdp_sim.calibrate.calibration import calibrate
    from osdp_sim.calibrate.fit import predict_runs
    (pred,) = predict_runs(hw, runs)
    free = estimate(runs[0].spec, hw.with_devices(4).without_communication(), runs[0].plan)
    assert pred.time_s == pytest.approx(free.iteration_time_s, rel=1e-9)
    cal = calibrate(hw, runs, loo=False, starts=1, progress=None)
    names = {p.name for p in cal.result.params}
    assert "compute.efficiency_scale" in names
    assert not any(n.startswith("collectives.") or n == "overlap_slowdown" for n in names)


@pytest.mark.parametrize("args,field", [
    (["--model", "gpt2-tiny", "--strategy", "zero3", "--micro-batch", "1", "--fake-world", "4", "--nproc", "4"], "--nproc"),
    (["--model", "gpt2-tiny", "--strategy", "zero3", "--micro-batch", "1", "--fake-world", "4", "--backend", "fairscale"], "--backend"),
])
def test_conflicts_are_one_line(tmp_path, args, field):
    r = _validate(*args, out=tmp_path)
    assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr


def test_a_plan_for_other_devices_is_refused(tmp_path):
    plan_file = tmp_path / "plan.json"
    save_plan(uniform_plan(load_model("gpt2-tiny").config, "zero3", devices=2, micro_batch=1), plan_file)
    r = _validate("--plan", str(plan_file), "--fake-world", "8", out=tmp_path)
    assert r.returncode == 2 and "devices" in r.stderr and "--fake-world 8" in r.stderr
