"""Calibration: recovering known coefficients from records the cost model itself generated,
leave-one-out, record checks, the CLI, and campaign files (validation, plan patterns, resume)."""

import copy
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hwfixtures import simple_hw
from osdp_sim.calibrate import analysis
from osdp_sim.calibrate.campaign import (campaign_from_dict, pending, plan_jobs,
                                         run_campaign)
from osdp_sim.calibrate.fit import Predictor, fit
from osdp_sim.calibrate.loo import leave_one_out
from osdp_sim.calibrate.params import prior_values, select_params, with_values
from osdp_sim.calibrate.runs import load_runs, plan_label
from osdp_sim.cli.main import main
from osdp_sim.costmodel import estimate
from osdp_sim.errors import UserError
from osdp_sim.plan import plan_to_dict
from osdp_sim.hardware.dump import save_profile
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model_config
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import GroupChoice, uniform_plan
from osdp_sim.records import build_record, record_name, save_record

MiB = 2**20

# A CPU-like machine: 100 GFLOP/s, 1 GB/s collectives, 200 us latency; 2 devices.
BASE = replace(simple_hw(count=2, per_node=2, busbw_gbps=1.0, latency_s=2e-4, launch_s=5e-5,
                         peak_tflops=0.1, eff=0.5, slowdown=1.1, bw_gbps=10.0), name="synthetic")
TRUTH = {"compute.efficiency_scale": 0.8, "collectives.efficiency.all_reduce": 0.6,
         "overlap_slowdown": 1.2, "memory.context_bytes": 20 * MiB, "memory.fragmentation": 0.04}


def campaign_plans(cfg, n=2):
    out = [uniform_plan(cfg, s, devices=n, micro_batch=mb) for s in ("ddp", "zero2", "zero3") for mb in (2, 8)]
    p = uniform_plan(cfg, "ddp", devices=n, micro_batch=4)
    out.append(replace(p, choices={k: GroupChoice("zero3") if k.endswith("mlp") else c
                                   for k, c in p.choices.items()}))
    out.append(uniform_plan(cfg, "zero3", devices=n, micro_batch=4, checkpoint=True))
    return out


def measured(plan, hw, rng, time_noise=0.02, memory_noise=0.002):
    e = estimate(build_spec(plan.model), hw, plan)
    return (e.iteration_time_s * math.exp(rng.gauss(0, time_noise)),
            e.peak_memory_bytes * math.exp(rng.gauss(0, memory_noise)))


def make_record(plan, time_s, memory_bytes, *, profile_name="synthetic", device="cuda", seed=0,
                threads=1, oversubscribed=False, status="ok"):
    n = plan.devices
    steps = [time_s * f for f in (0.99, 1.0, 1.01, 1.0)]
    ranks = [{"step_times_s": steps, "memory": {"tracker_peak_bytes": int(memory_bytes)}, "losses": [5.0] * 4,
              "status": "ok"} for _ in range(n)]
    env = {"torch": "2.13.0", "backend": "fsdp2", "backend_version": "2.13.0", "device_kind": device,
           "device_name": "test", "world_size": n, "threads_per_rank": threads, "cores": 2,
           "oversubscribed": oversubscribed, "hostname": "test", "python": "3.11"}
    failure = None if status == "ok" else {"rank": 0, "reason": "out of memory", "exit_code": 3,
                                           "stderr_tail": ""}
    return build_record(status=status, run_id="test-run", plan=plan,
                        hardware_profile={"name": profile_name, "path": "x.yaml"}, env=env,
                        settings={"warmup": 1, "iters": 4, "seed": seed},
                        rank_results=ranks if status == "ok" else [None] * n, predicted=None, failure=failure)


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory):
    """Records of 2 models x 8 plans (one plan repeated), measured = the cost model on the TRUTH
    coefficients, plus 2% time and 0.2% memory noise."""
    folder = tmp_path_factory.mktemp("records")
    rng = random.Random(1)
    hw_true = with_values(BASE, TRUTH)
    for name in ("gpt2-tiny", "llama-tiny"):
        for plan in campaign_plans(load_model_config(name)):
            save_record(make_record(plan, *measured(plan, hw_true, rng)), folder)
    plan = uniform_plan(load_model_config("gpt2-tiny"), "zero3", devices=2, micro_batch=8)
    for seed in (1, 2):
        save_record(make_record(plan, *measured(plan, hw_true, rng), seed=seed), folder)
    runs, excluded = load_runs([folder], BASE)
    return folder, runs, excluded


@pytest.fixture(scope="module")
def fitted(synthetic_runs):
    return fit(BASE, synthetic_runs[1], starts=2)


# ---------------------------------------------------------------- fitting

def test_fit_recovers_the_coefficients_that_generated_the_runs(fitted):
    f = fitted.fitted
    assert f["compute.efficiency_scale"] == pytest.approx(0.8, rel=0.03)
    assert f["memory.fragmentation"] == pytest.approx(0.04, abs=0.006)
    assert f["memory.context_bytes"] == pytest.approx(20 * MiB, abs=2 * MiB)
    runs = fitted.runs
    after_t = analysis.summarize(analysis.time_errors(runs, fitted.after))
    after_m = analysis.summarize(analysis.memory_errors(runs, fitted.after))
    before_t = analysis.summarize(analysis.time_errors(runs, fitted.before))
    assert before_t.mape > 0.15                 # the unperturbed profile is far off
    assert after_t.mape < 0.03                  # within the 2% noise
    assert after_m.mape < 0.004 and abs(after_m.worst) < 0.01


def test_leave_one_plan_out_predicts_unseen_plans_and_holds_repeats_out_together(synthetic_runs):
    runs = [r for r in synthetic_runs[1] if r.model_name == "gpt2-tiny"]     # 10 runs: keep it fast
    full = fit(BASE, runs, starts=1)
    loo = leave_one_out(full, BASE, progress=None, loo_starts=1)
    assert len(runs) == 10 and loo.folds == 8   # the three repeats of one plan are one fold
    t = analysis.summarize(analysis.time_errors(runs, loo.predictions))
    m = analysis.summarize(analysis.memory_errors(runs, loo.predictions))
    assert t.mape < 0.04 and m.mape < 0.006


def test_memory_shortcut_equals_the_cost_model(synthetic_runs):
    runs = synthetic_runs[1][:4]
    params = select_params(BASE)
    values = {p.name: prior_values(BASE, params)[p.name] for p in params}
    values.update({"memory.context_bytes": 7 * MiB, "memory.fragmentation": 0.11,
                   "collectives.efficiency.all_gather": 0.5})
    preds = Predictor(BASE, runs, params).predict(values)
    hw = with_values(BASE, values)
    for r, p in zip(runs, preds):
        e = estimate(r.spec, hw, r.plan)
        assert p.memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
        assert p.time_s == pytest.approx(e.iteration_time_s, rel=1e-12)


def test_prior_of_a_calibrated_profile_stays_on_the_measured_value():
    params = select_params(BASE)
    cal = replace(with_values(BASE, {"compute.efficiency_scale": 0.7}),
                  provenance={"calibration": {"coefficients": {"compute.efficiency_scale":
                                                               {"before": 1.0, "after": 0.7}}}})
    assert prior_values(cal, params)["compute.efficiency_scale"] == 1.0


def test_plan_labels():
    cfg = load_model_config("gpt2-tiny")
    assert plan_label(uniform_plan(cfg, "zero3", devices=2, micro_batch=4, checkpoint=True)) == "zero3 mb4 ckpt"
    p = uniform_plan(cfg, "ddp", devices=2, micro_batch=8)
    p = replace(p, choices={k: GroupChoice("zero3") if k.endswith("mlp") else c for k, c in p.choices.items()})
    assert plan_label(p) == "root ddp / attn ddp / mlp zero3 mb8"


# ---------------------------------------------------------------- record checks

def _one_record_dir(tmp_path, **kw):
    plan = uniform_plan(load_model_config("gpt2-tiny"), "zero3", devices=kw.pop("devices", 2), micro_batch=4)
    rec = make_record(plan, 0.1, 100 * MiB, **kw)
    return rec, tmp_path


@pytest.mark.parametrize("kw, field", [
    ({"profile_name": "titan8"}, "hardware_profile.name"),
    ({"device": "cpu"}, "env.device_kind"),
    ({"devices": 4}, "env.world_size"),
    ({"oversubscribed": True}, "env.oversubscribed"),
])
def test_mismatched_records_name_the_file_and_field(tmp_path, kw, field):
    rec, folder = _one_record_dir(tmp_path, **kw)
    path = save_record(rec, folder)
    with pytest.raises(UserError) as e:
        load_runs([folder], BASE)
    assert e.value.source == str(path) and e.value.field == field


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(format="something-else"), "format"),
    (lambda d: d["measured"].pop("peak_memory_bytes"), "measured.peak_memory_bytes"),
    (lambda d: d["env"].pop("world_size"), "env.world_size"),
    (lambda d: d["measured"]["iteration_time_s"].update(median=None), "measured.iteration_time_s.median"),
])
def test_malformed_records_name_the_file_and_field(tmp_path, edit, field):
    rec, folder = _one_record_dir(tmp_path)
    d = copy.deepcopy(rec)
    edit(d)
    path = folder / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        load_runs([folder], BASE)
    assert e.value.source == str(path) and e.value.field == field


def test_threads_must_match_the_profiles_measurement(tmp_path):
    rec, folder = _one_record_dir(tmp_path, threads=2)
    save_record(rec, folder)
    prof = replace(BASE, provenance={"threads_per_rank": 1})
    with pytest.raises(UserError, match="threads") as e:
        load_runs([folder], prof)
    assert e.value.field == "env.threads_per_rank"


def test_failed_runs_are_excluded_not_fitted(tmp_path):
    rec, folder = _one_record_dir(tmp_path)
    save_record(rec, folder)
    plan = uniform_plan(load_model_config("gpt2-tiny"), "ddp", devices=2, micro_batch=64)
    save_record(make_record(plan, 0, 0, status="oom"), folder)
    runs, excluded = load_runs([folder], BASE)
    assert len(runs) == 1 and len(excluded) == 1 and "status oom" in excluded[0][1]


# ---------------------------------------------------------------- the command

def test_calibrate_command_writes_profile_report_and_plot(tmp_path, synthetic_runs, capsys):
    folder = synthetic_runs[0]
    hw_path = tmp_path / "synthetic.yaml"
    save_profile(BASE, hw_path)
    out, report, plot = tmp_path / "cal.yaml", tmp_path / "report.md", tmp_path / "cal.png"
    rc = main(["calibrate", "--hw", str(hw_path), "--records", str(folder), "-o", str(out),
               "--report", str(report), "--plot", str(plot), "--no-loo", "--starts", "2"])
    assert rc == 0
    cal = load_profile(out)
    assert cal.name == "synthetic-calibrated"
    prov = cal.provenance["calibration"]
    assert prov["records"]["count"] == 18 and len(prov["records"]["files"]) == 18
    assert prov["coefficients"]["compute.efficiency_scale"]["before"] == 1.0
    assert prov["coefficients"]["compute.efficiency_scale"]["after"] == pytest.approx(0.8, rel=0.03)
    assert cal.compute.efficiency_scale == pytest.approx(0.8, rel=0.03)
    text = report.read_text()
    for heading in ("## Summary", "## Coefficients", "## Per run: iteration time", "## Per run: peak memory",
                    "## Noise floor", "## Rank correlation", "## Would the search pick"):
        assert heading in text
    assert plot.stat().st_size > 10_000
    # A calibrated profile accepts the records of its base profile and recalibrates to the same place.
    rc = main(["calibrate", "--hw", str(out), "--records", str(folder), "-o", str(tmp_path / "again.yaml"),
               "--no-loo", "--starts", "2"])
    assert rc == 0
    again = load_profile(tmp_path / "again.yaml")
    assert again.name == "synthetic-calibrated"
    assert again.compute.efficiency_scale == pytest.approx(cal.compute.efficiency_scale, rel=1e-3)


def test_calibrate_command_mismatch_is_one_line_exit_2(tmp_path, capsys):
    rec, folder = _one_record_dir(tmp_path, profile_name="other")
    save_record(rec, folder)
    hw_path = tmp_path / "synthetic.yaml"
    save_profile(BASE, hw_path)
    rc = main(["calibrate", "--hw", str(hw_path), "--records", str(folder), "-o", str(tmp_path / "o.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and "hardware_profile.name" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- campaigns

CAMPAIGN = {
    "name": "test", "hardware": "titan8", "device": "cpu", "records_dir": "RECORDS", "warmup": 1, "iters": 3,
    "threads": 1, "plan_defaults": {"precision": "fp32"},
    "runs": [{"model": "gpt2-tiny", "nproc": 2, "plans": [
        {"strategy": "ddp", "micro_batch": 4},
        {"strategy": "zero3", "micro_batch": 4, "checkpoint": True, "repeats": 2},
        {"groups": {"attn": "ddp", "mlp": "zero3", "root": "zero2"}, "micro_batch": 4},
        {"groups": {"default": "zero2", "block1": "zero3",
                    "mlp": {"strategy": "zero2", "slices": 2, "sharded_slices": 1}}, "micro_batch": 2},
        {"strategy": "zero3", "micro_batch": 4, "checkpoint": True},     # duplicate of repeat 1: one run
    ]}],
}


def _campaign(tmp_path, **changes):
    d = copy.deepcopy(CAMPAIGN)
    d["records_dir"] = str(tmp_path / "records")
    d.update(changes)
    return d


def test_campaign_plans_expand_patterns(tmp_path):
    c = campaign_from_dict(_campaign(tmp_path), "c.yaml")
    jobs = plan_jobs(c)
    assert len(jobs) == 5
    mixed = jobs[3].plan
    assert mixed.choices["block0.attn"] == GroupChoice("ddp") and mixed.choices["block3.mlp"] == GroupChoice("zero3")
    assert mixed.choices["root"] == GroupChoice("zero2") and mixed.precision == "fp32"
    split = jobs[4].plan
    assert split.choices["block0.mlp"] == GroupChoice("zero2", 2, 1)
    assert split.choices["block1.attn"] == GroupChoice("zero3")       # block1 beats the default
    assert split.choices["block1.mlp"] == GroupChoice("zero3")        # block<i> beats attn/mlp patterns
    assert [j.seed for j in jobs[1:3]] == [0, 1] and jobs[1].plan.checkpoint == (True,) * 4
    assert all(j.record_path.parent == tmp_path / "records" / "n2" for j in jobs)


@pytest.mark.parametrize("change, field", [
    ({"device": "tpu"}, "device"),
    ({"iters": 0}, "iters"),
    ({"bogus": 1}, "bogus"),
    ({"runs": []}, "runs"),
    ({"runs": [{"model": "nope", "nproc": 2, "plans": [{"strategy": "ddp", "micro_batch": 1}]}]}, "runs[0].model"),
    ({"runs": [{"model": "gpt2-tiny", "nproc": 2, "plans": [{"strategy": "ddp"}]}]}, "runs[0].plans[0].micro_batch"),
    ({"runs": [{"model": "gpt2-tiny", "nproc": 2, "plans": [{"strategy": "zero4", "micro_batch": 1}]}]},
     "runs[0].plans[0].strategy"),
    ({"runs": [{"model": "gpt2-tiny", "nproc": 2,
                "plans": [{"strategy": "ddp", "groups": {}, "micro_batch": 1}]}]}, "runs[0].plans[0]"),
    ({"runs": [{"model": "gpt2-tiny", "nproc": 2, "plans": [{"search": {"limit": 1}, "micro_batch": 1}]}]},
     "runs[0].plans[0].search"),
    ({"runs": [{"model": "gpt2-tiny", "nproc": 2, "plans": [{"strategy": "ddp", "micro_batch": 1,
                                                             "checkpoint": "some"}]}]},
     "runs[0].plans[0].checkpoint"),
])
def test_campaign_file_errors_name_the_field(tmp_path, change, field):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_campaign(tmp_path, **change)))
    from osdp_sim.calibrate.campaign import load_campaign
    with pytest.raises(UserError) as e:
        load_campaign(path)
    assert e.value.source == str(path) and e.value.field == field


def _one_plan(**plan):
    return {"runs": [{"model": "gpt2-tiny", "nproc": 2, "plans": [{"micro_batch": 1, **plan}]}]}


@pytest.mark.parametrize("change, field, words", [
    ({"timeout_s": float("nan")}, "timeout_s", "got nan"),
    ({"timeout_s": float("inf")}, "timeout_s", "got inf"),
    ({"timeout_s": 1e30}, "timeout_s", "(0, 1e+06]"),
    ({"iters": 10**30}, "iters", "1..2147483647"),
    ({"warmup": 2.0}, "warmup", "got 2.0"),
    ({"description": ["x"]}, "description", "expected text"),
    ({"hardware": "no-such-profile"}, "hardware", "no hardware profile of that name"),
    (_one_plan(strategy="zero3", slices=2.0), "runs[0].plans[0].slices", "got 2.0"),
    (_one_plan(strategy="zero3", slices="4"), "runs[0].plans[0].slices", "got '4'"),
    (_one_plan(file=5), "runs[0].plans[0].file", "expected a non-empty text"),
    (_one_plan(search={"mem_limit": "1GiB", "time_limit_s": float("nan")}),
     "runs[0].plans[0].search.time_limit_s", "got nan"),
    (_one_plan(search={"mem_limit": "1GiB", "time_limit_s": "10"}),
     "runs[0].plans[0].search.time_limit_s", "got '10'"),
    (_one_plan(search={"mem_limit": "1GiB", "splits": [True]}), "runs[0].plans[0].search.splits",
     "got [True]"),
    (_one_plan(search={"mem_limit": "1GiB", "strategies": ["zero4"]}), "runs[0].plans[0].search.strategies",
     "ddp, zero2, zero3"),
    (_one_plan(search={"mem_limit": "1GiB", "checkpoint": [1]}), "runs[0].plans[0].search.checkpoint",
     "got [1]"),
])
def test_campaign_values_are_type_and_range_checked(tmp_path, change, field, words):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_campaign(tmp_path, **change)))
    from osdp_sim.calibrate.campaign import load_campaign
    with pytest.raises(UserError) as e:
        load_campaign(path)
    assert e.value.source == str(path) and e.value.field == field, str(e.value)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_campaign_file_encoding_aliases_and_directory(tmp_path):
    from osdp_sim.calibrate.campaign import load_campaign
    path = tmp_path / "latin1.yaml"
    path.write_bytes((yaml.safe_dump(_campaign(tmp_path)) + "description: caf\xe9\n").encode("latin-1"))
    with pytest.raises(UserError, match=rf"^{path}: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_campaign(path)
    with pytest.raises(UserError, match=rf"^{tmp_path}: is a directory, not a campaign file"):
        load_campaign(tmp_path)
    loop = tmp_path / "loop.yaml"
    loop.write_text(yaml.safe_dump(_campaign(tmp_path)) + "x: &x [*x]\n")
    with pytest.raises(UserError, match=r"loop\.yaml: a YAML alias refers to a node that contains it"):
        load_campaign(loop)


def test_campaign_group_pattern_errors_name_the_field(tmp_path):
    d = _campaign(tmp_path, runs=[{"model": "gpt2-tiny", "nproc": 2,
                                   "plans": [{"groups": {"attn": "ddp", "mlp": "zero3"}, "micro_batch": 1}]}])
    c = campaign_from_dict(d, "c.yaml")
    with pytest.raises(UserError) as e:
        plan_jobs(c)
    assert e.value.field == "runs[0].plans[0].groups.root"


def test_record_names_match_what_validate_writes(tmp_path):
    c = campaign_from_dict(_campaign(tmp_path), "c.yaml")
    for job in plan_jobs(c):
        rec = make_record(job.plan, 0.1, 50 * MiB, device="cpu", seed=job.seed)
        rec["settings"] = {"warmup": 1, "iters": 3, "seed": job.seed}
        assert record_name(rec) == job.record_path.name


def test_campaign_resumes_skipping_recorded_runs(tmp_path, capsys):
    c = campaign_from_dict(_campaign(tmp_path), "c.yaml")
    jobs = plan_jobs(c)
    for job in jobs:                 # every run recorded (as validate would name them)
        rec = make_record(job.plan, 0.1, 50 * MiB, device="cpu", seed=job.seed, profile_name="titan8")
        rec["settings"] = {"warmup": 1, "iters": 3, "seed": job.seed}
        save_record(rec, job.record_path.parent)
    assert pending(jobs) == []
    summary = run_campaign(c, jobs=jobs)        # the real runner: nothing may be started
    assert summary.ran == 0 and summary.skipped == 5
    jobs[2].record_path.unlink()
    jobs[3].record_path.write_text("{ half a file")
    assert pending(jobs) == [jobs[2], jobs[3]]
    failed = make_record(jobs[0].plan, 0, 0, device="cpu", status="oom", profile_name="titan8")
    failed["settings"] = {"warmup": 1, "iters": 3, "seed": 0}
    save_record(failed, jobs[0].record_path.parent)
    assert pending(jobs) == [jobs[2], jobs[3]]
    assert pending(jobs, retry_failed=True) == [jobs[0], jobs[2], jobs[3]]


def test_a_run_without_a_memory_measurement_still_counts_for_time(tmp_path, synthetic_runs):
    folder = synthetic_runs[0]
    files = sorted(folder.glob("*.json"))[:6]
    for f in files:
        d = json.loads(f.read_text())
        (tmp_path / f.name).write_text(json.dumps(d))
    d = json.loads(files[0].read_text())
    d["measured"]["peak_memory_bytes"] = None          # MemTracker failed on that run
    (tmp_path / files[0].name).write_text(json.dumps(d))
    runs, _ = load_runs([tmp_path], BASE)
    assert sum(r.memory_bytes is None for r in runs) == 1
    res = fit(BASE, runs, params=select_params(BASE, ["compute.efficiency_scale", "memory.fragmentation"]))
    errs = analysis.memory_errors(runs, res.after)
    assert sum(e is None for e in errs) == 1
    assert analysis.summarize(errs).n == 5


@pytest.mark.slow
def test_campaign_runs_a_real_validate_then_skips_it_on_resume(tmp_path):
    model = tmp_path / "tiny2.yaml"
    model.write_text(yaml.safe_dump({"name": "gpt2-2l", "family": "gpt2", "layers": 2, "hidden": 64, "heads": 2,
                                     "vocab": 512, "seq_len": 32}))
    d = {"name": "real", "hardware": "titan8", "device": "cpu", "records_dir": str(tmp_path / "rec"),
         "warmup": 1, "iters": 2, "threads": 1,
         "runs": [{"model": str(model), "nproc": 2, "plans": [{"strategy": "zero3", "micro_batch": 2}]}]}
    c = campaign_from_dict(d, "real.yaml")
    first = run_campaign(c, log=None)
    assert (first.ran, first.ok, first.failed) == (1, 1, [])
    [job] = plan_jobs(c)
    from osdp_sim.records import load_record
    rec = load_record(job.record_path)
    assert rec.ok and rec.model.n_layers == 2 and rec.data["settings"]["iters"] == 2
    again = run_campaign(c, log=None)
    assert (again.ran, again.skipped) == (0, 1)
    [line] = [json.loads(l) for l in (tmp_path / "rec" / "campaign-log.jsonl").read_text().splitlines()]
    assert line["status"] == "ok" and line["record"] == str(job.record_path) and line["wall_s"] > 1
    assert line["foreign_cpu_fraction"] is None or 0.0 <= line["foreign_cpu_fraction"] <= 1.0


def test_idle_wait_samples_the_cpus():
    from osdp_sim.calibrate.campaign import cpu_busy_fraction, wait_until_idle
    busy = cpu_busy_fraction(0.2)
    assert busy is None or 0.0 <= busy <= 1.0
    assert wait_until_idle(1.0, log=None, sample_s=0.2) == 0.0      # never more than 100% busy


def test_a_validate_past_its_time_is_stopped_and_reaped(tmp_path):
    import os
    import sys
    from osdp_sim.calibrate.campaign import _run_validate
    pid_file = tmp_path / "pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with open(tmp_path / "log", "wb") as out:
        assert _run_validate([sys.executable, "-c", sleeper], out, 3.0, None) is None
        assert _run_validate([sys.executable, "-c", "raise SystemExit(3)"], out, 30.0, None) == 3
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    # SIGTERM on the campaign stops it like Ctrl-C and takes validate (and so its ranks) with it
    import signal
    import threading
    pid_file.unlink()
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with open(tmp_path / "log", "wb") as out, pytest.raises(KeyboardInterrupt):
        _run_validate([sys.executable, "-c", sleeper], out, 30.0, None)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_campaign_with_an_unwritable_records_dir_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "name": "x", "hardware": "cpu-2core", "device": "cpu", "records_dir": str(tmp_path / "afile" / "r"),
        "warmup": 1, "iters": 2, "runs": [{"model": "gpt2-tiny", "nproc": 2,
                                           "plans": [{"strategy": "zero3", "micro_batch": 2}]}]}))
    assert main(["campaign", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"records_dir: {tmp_path}/afile/r: cannot create it" in err


def test_report_with_evaluated_runs(tmp_path, synthetic_runs):
    """Runs passed with --evaluate (here: 4-rank, oversubscribed) are predicted, not fitted."""
    folder = synthetic_runs[0]
    extra = tmp_path / "n4"
    plan = uniform_plan(load_model_config("gpt2-tiny"), "zero3", devices=4, micro_batch=4)
    save_record(make_record(plan, 0.5, 90 * MiB, oversubscribed=True), extra)
    hw_path = tmp_path / "synthetic.yaml"
    save_profile(BASE, hw_path)
    report = tmp_path / "r.md"
    rc = main(["calibrate", "--hw", str(hw_path), "--records", str(folder), "--evaluate", str(extra),
               "-o", str(tmp_path / "o.yaml"), "--report", str(report), "--plot", str(tmp_path / "p.png"),
               "--no-loo", "--starts", "1"])
    assert rc == 0
    text = report.read_text()
    assert "## Evaluated, not fitted" in text and "| gpt2-tiny | 4 | yes | zero3 mb4 |" in text


def test_report_keeps_the_hand_written_text_above_the_marker(tmp_path):
    from osdp_sim.cli.calibrate_cmd import KEEP_MARKER, write_report
    path = tmp_path / "accuracy.md"
    write_report(path, "# generated 1\n")
    assert path.read_text() == "# generated 1\n"            # no marker: the report alone
    path.write_text("# Accuracy\n\nHow to regenerate.\n\n" + KEEP_MARKER + "\n\nold report\n")
    write_report(path, "# generated 2\n")
    assert path.read_text() == "# Accuracy\n\nHow to regenerate.\n\n" + KEEP_MARKER + "\n\n# generated 2\n"


def test_a_cuda_campaign_without_a_gpu_is_a_one_line_error_before_any_run(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks a machine without a GPU")
    text = yaml.safe_load((Path(__file__).resolve().parents[1] / "validate/campaigns/h200x1.yaml").read_text())
    text["records_dir"], text["hardware"] = str(tmp_path / "records"), "h200x1"
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(text))
    assert main(["campaign", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"osdp-sim campaign: error: {path}: device: the campaign runs on cuda, "
                              "but this torch sees no GPU")
    assert not (tmp_path / "records").exists()


# ---------------------------------------------------------------- time limit and output paths

REPO = Path(__file__).resolve().parents[1]


def test_calibrate_time_limit_keeps_the_best_fit_so_far(tmp_path, capsys):
    # the committed CPU records take minutes with leave-one-out; 1 s must end about then, with a
    # profile and report that say what was cut short
    import time
    out, report = tmp_path / "cal.yaml", tmp_path / "cal.md"
    t0 = time.monotonic()
    rc = main(["calibrate", "--hw", "cpu-2core", "--records", str(REPO / "validate/records/cpu/n2"),
               "-o", str(out), "--report", str(report), "--time-limit", "1"])
    took = time.monotonic() - t0
    assert rc == 4 and took < 1 + 15, took
    err = capsys.readouterr().err
    assert "stopped by --time-limit 1: fit: time limit reached during start 1 of 8" in err
    assert "leave-one-out: not run" in err
    hw = load_profile(out)
    block = hw.provenance["calibration"]
    assert block["leave_one_out"] == "not run" and len(block["stopped_by_time_limit"]) == 2
    # the coefficients kept are the best evaluated: better than the profile as measured
    errs = block["errors"]["iteration_time"]
    assert errs["after"]["mape"] < errs["before"]["mape"]
    assert "**Stopped by the time limit**: fit: time limit reached" in report.read_text()


@pytest.mark.parametrize("extra,needle", [
    (["--time-limit", "0"], "--time-limit: expected a positive, finite number of seconds"),
    (["--time-limit", "nan"], "--time-limit: expected a positive, finite number of seconds"),
    (["-o", "{d}"], "{d}: -o: is a folder"),
    (["--plot", "/proc/p.png"], "/proc/p.png: --plot: cannot write a file in /proc"),
    (["--report", "/proc/r.md"], "/proc/r.md: --report: cannot write a file in /proc"),
])
def test_calibrate_bad_flags_are_errors_before_the_fit(tmp_path, capsys, extra, needle):
    argv = ["calibrate", "--hw", "cpu-2core", "--records", str(REPO / "validate/records/cpu/n2"),
            "-o", str(tmp_path / "o.yaml")] + [a.format(d=tmp_path) for a in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle.format(d=tmp_path) in err and "\n" not in err and "fitting" not in err


def _recording_runner(sleep_s: float, seen: list):
    """A stand-in for validate_runner: records the run as ok after `sleep_s` (no ranks)."""
    import time

    def runner(c, job, *, log=None, deadline_s=None):
        seen.append((job.label, deadline_s))
        time.sleep(sleep_s)
        rec = make_record(job.plan, 0.1, 50 * MiB, device="cpu", seed=job.seed, profile_name="titan8")
        rec["settings"] = {"warmup": 1, "iters": 3, "seed": job.seed}
        save_record(rec, job.record_path.parent)
        return "ok"
    return runner


def test_campaign_time_limit_stops_between_runs_and_resumes(tmp_path):
    import time
    c = campaign_from_dict(_campaign(tmp_path), "c.yaml")
    jobs = plan_jobs(c)
    seen: list = []
    t0 = time.monotonic()
    first = run_campaign(c, jobs=jobs, runner=_recording_runner(0.4, seen), log=None, time_limit_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 0.4 + 0.5          # no run starts after the limit
    n = first.ran                                            # 3 on an idle machine (0, 0.4, 0.8 s)
    assert 1 <= n <= 3 and first.left == 5 - n and all(d is not None for _, d in seen)
    assert pending(jobs) == jobs[n:]                         # resumable: the rest is still to run
    again = run_campaign(c, jobs=jobs, runner=_recording_runner(0.0, seen), log=None, time_limit_s=60)
    assert (again.skipped, again.ran, again.left) == (n, 5 - n, 0) and pending(jobs) == []


def test_a_run_going_on_at_the_campaign_limit_is_stopped_unrecorded(tmp_path, monkeypatch):
    import sys
    import time
    from osdp_sim.calibrate import campaign
    c = campaign_from_dict(_campaign(tmp_path), "c.yaml")
    job = plan_jobs(c)[0]
    # validate stand-in that never ends: the campaign's deadline, not its timeout_s, must end it;
    # on SIGTERM it says where it kept its rank logs, as validate does
    stand_in = ("import signal, sys, time\n"
                "def stop(*a):\n"
                "    print('osdp-sim validate: interrupted (signal 15; rank logs kept in /tmp/R)', flush=True)\n"
                "    sys.exit(130)\n"
                "signal.signal(signal.SIGTERM, stop)\n"
                "time.sleep(60)\n")
    monkeypatch.setattr(campaign, "validate_command", lambda *a: [sys.executable, "-c", stand_in])
    import io
    log = io.StringIO()
    t0 = time.monotonic()
    assert campaign.validate_runner(c, job, log=log, deadline_s=t0 + 1.5) == campaign.STOPPED
    assert time.monotonic() - t0 < 10
    assert not job.record_path.exists()                      # no failed record: it runs on resume
    assert "rank logs kept in /tmp/R" in log.getvalue()      # its output was a temporary file
    assert campaign.validate_runner(c, job, log=None, deadline_s=t0) == campaign.STOPPED


def test_campaign_time_limit_flag_is_checked(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_campaign(tmp_path)))
    for bad in ("0", "-1", "nan", "inf"):
        assert main(["campaign", str(path), "--time-limit", bad]) == 2
        assert "--time-limit: expected a positive, finite number of seconds" in capsys.readouterr().err
    assert not (tmp_path / "records").exists()


def _llama_config_json(tmp_path):
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 172,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "max_position_embeddings": 64}))
    return d


def test_campaign_runs_of_a_config_json_are_predicted_as_the_runtime_modules(tmp_path):
    """The runs execute the runtime's own modules: a config.json model ('hf') is planned,
    predicted and named as implementation 'osdp'."""
    from osdp_sim.model import load_model_config
    from osdp_sim.records.record import plan_identity
    model = str(_llama_config_json(tmp_path))
    assert load_model_config(model, notes=[]).implementation == "hf"
    c = campaign_from_dict(_campaign(tmp_path, runs=[{"model": model, "nproc": 2, "plans": [
        {"strategy": "zero3", "micro_batch": 1}]}]), "c.yaml")
    [job] = plan_jobs(c)
    assert job.plan.model.implementation == "osdp"
    assert plan_identity(plan_to_dict(job.plan))["version"] < 3      # names as before format 3


def test_validate_predicts_a_config_json_as_the_runtime_modules(tmp_path, capsys):
    from osdp_sim.cli.validate_cmd import runtime_plan
    from osdp_sim.model import load_model_config
    from osdp_sim.plan import uniform_plan
    cfg = load_model_config(str(_llama_config_json(tmp_path)), notes=[])
    plan = uniform_plan(cfg, "zero3", devices=2, micro_batch=1)
    ran = runtime_plan(plan, "osdp")
    assert ran.model.implementation == "osdp" and ran.choices == plan.choices
    err = capsys.readouterr().err
    assert "implementation osdp" in err and len(err.strip().splitlines()) == 1
    assert runtime_plan(ran, "osdp") is ran and capsys.readouterr().err == ""
