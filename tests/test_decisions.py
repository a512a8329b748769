"""The decisions campaign (validate/decisions.py, osdp_sim/calibrate/decisions.py): distinct plans,
the figures computed from records (hand-made records -> hand-computed table values), the section
replaced in place, the profile from a git revision, and a real run on 2 gloo ranks that resumes."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from osdp_sim.calibrate import decisions as d
from osdp_sim.calibrate import decisions_report as rep
from osdp_sim.errors import UserError
from osdp_sim.model.load import load_model_config
from osdp_sim.plan import GroupChoice, uniform_plan

ROOT = Path(__file__).resolve().parents[1]
HW = "hwprofiles/cpu-2core-calibrated.yaml"


def _cfg(tmp: Path, **kw) -> d.DecisionsConfig:
    base = dict(name="t", source="t.yaml", out_dir=tmp, run_hardware=str(ROOT / HW),
                profiles={"before": str(ROOT / HW)}, cases=(), repeats=2, warmup=1, iters=2)
    return d.DecisionsConfig(**{**base, **kw})


def test_permuted_blocks_are_one_plan_and_other_differences_are_not():
    cfg = load_model_config("gpt2-tiny")
    p = uniform_plan(cfg, "zero3", devices=2, micro_batch=2)
    a = replace(p, choices={**p.choices, "block0.mlp": GroupChoice("zero2")}, checkpoint=(True, False, False, False))
    b = replace(p, choices={**p.choices, "block2.mlp": GroupChoice("zero2")}, checkpoint=(False, False, True, False))
    c = replace(p, choices={**p.choices, "block2.mlp": GroupChoice("zero2")}, checkpoint=(True, False, False, False))
    assert d.plan_signature(a) == d.plan_signature(b) and d.plan_key(a) != d.plan_key(b)
    assert d.plan_signature(a) != d.plan_signature(c)       # which block is checkpointed with the zero2 MLP
    assert d.plan_signature(a) != d.plan_signature(replace(a, micro_batch=3))
    assert d.plan_signature(a) != d.plan_signature(replace(a, choices={**a.choices, "root": GroupChoice("zero2")}))
    assert d.describe(a) == "mb 2, ckpt 1/4, attn zero3, mlp 3x zero3 1x zero2, root zero3"


def test_top_distinct_has_no_two_permutations():
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.model.load import load_model
    from osdp_sim.planner.space import SearchSpace
    spec, hw = load_model("gpt2-tiny"), load_profile(ROOT / HW)
    res, top = d.top_distinct(spec, hw, 120 * 2**20, SearchSpace(micro_batches=(2, 4, 6)), 4)
    sigs = [d.plan_signature(p) for p, _e in top]
    assert len(top) == 4 and len(set(sigs)) == 4
    assert d.plan_key(top[0][0]) == d.plan_key(res.plan)
    sps = [e.samples_per_s for _p, e in top]
    assert sps == sorted(sps, reverse=True)


def _record(plan, path: Path, step_s: float | None, status: str = "ok"):
    from osdp_sim.records import build_record, save_record_as
    env = {"torch": None, "backend": "fsdp2", "backend_version": None, "device_kind": "cpu", "device_name": None,
           "world_size": 2, "threads_per_rank": 1, "cores": 2, "oversubscribed": False, "hostname": "h",
           "python": "3"}
    ranks = [{"step_times_s": [step_s, step_s * 3, step_s]} if step_s else None] * 2    # median = step_s
    failure = None if status == "ok" else {"rank": None, "reason": "x", "exit_code": 3, "stderr_tail": ""}
    save_record_as(build_record(status=status, run_id="r", plan=plan, hardware_profile={"name": "h", "path": HW},
                                env=env, settings={"warmup": 1, "iters": 3, "seed": 0}, rank_results=ranks,
                                predicted=None, failure=failure), path)


def test_figures_are_computed_from_the_records(tmp_path):
    m = load_model_config("gpt2-tiny")
    pick = replace(uniform_plan(m, "zero3", devices=2, micro_batch=4), choices={
        **uniform_plan(m, "zero3", devices=2, micro_batch=4).choices, "root": GroupChoice("zero2")})
    z3 = uniform_plan(m, "zero3", devices=2, micro_batch=4)
    z2 = uniform_plan(m, "zero2", devices=2, micro_batch=2)
    other = uniform_plan(m, "zero3", devices=2, micro_batch=2, checkpoint=True)
    oom = uniform_plan(m, "ddp", devices=2, micro_batch=8)
    keys = [d.plan_key(p) for p in (pick, z3, z2, other, oom)]
    kp, k3, k2, ko, kd = keys
    ref = d.CaseReference("c", {}, dict(zip(keys, (pick, z3, z2, other, oom))),
                          {k: [lab] for k, lab in zip(keys, ("before: search pick", "before: zero3", "before: zero2",
                                                              "before: top 2", "before: ddp"))},
                          {"before": d.ProfileChoices(kp, [kp, ko], {"zero3": k3, "zero2": k2, "ddp": kd},
                                                      [("search pick", kp), ("zero3", k3)],
                                                      {kp: 11.0, k3: 10.0, k2: 8.0, ko: 9.0, kd: 12.0}),
                           "after": d.ProfileChoices(ko, [ko], {"zero3": k3}, [("search pick", ko), ("zero2", k2)],
                                                     {kp: 1.0, k3: 2.0, k2: 1.0, ko: 2.5, kd: 1.0})})
    cfg = _cfg(tmp_path, repeats=2)
    jobs = d.jobs_for(cfg, [ref])
    # global batch 8 (mb 4 x 2 ranks) or 4 (mb 2): samples/s = global batch / median step time
    steps = {kp: (0.8, 1.0), k3: (1.0, 1.0), k2: (0.5, 0.4), ko: (0.5, 0.5), kd: (None, None)}
    for (k, r), job in jobs.items():
        _record(job.plan, job.record_path, steps[k][r], "ok" if steps[k][r] else "oom")
    meas = d.measure(jobs, 2)
    assert meas[kp].samples_per_s == pytest.approx(9.0)          # median of 10 and 8
    assert meas[k3].samples_per_s == pytest.approx(8.0)
    assert meas[k2].samples_per_s == pytest.approx(9.0)          # median of 8 and 10
    assert meas[ko].samples_per_s == pytest.approx(8.0)
    assert meas[kd].status == "oom" and meas[kd].samples_per_s is None
    due = {k: 2 for k in keys}
    before, after = d.figures(ref, meas, due)
    assert before.complete and before.measured_plans == 4 and before.reference_plans == 5
    # predicted: pick 11 over the best baseline predicted, ddp 12 (its oom is a measured fact only)
    assert before.predicted_gain == pytest.approx(11 / 12 - 1)
    assert before.measured_gain == pytest.approx(0.0)            # 9 over zero2's 9
    assert before.search_loss == 0.0 and before.search_is_best  # the first of the ties at 9: the pick
    assert before.tune_pick == "search pick" and before.tune_loss == 0.0
    assert after.predicted_gain == pytest.approx(2.5 / 2.0 - 1)
    assert after.measured_gain == pytest.approx(8 / 9 - 1)
    assert after.search_loss == pytest.approx(1 - 8 / 9) and not after.search_is_best
    # the tune keeps its search pick (8, 8): zero2's lead, median 9 of (8, 10), is 12.5%, within 2
    # standard errors of the difference: 1.2533 x (1.414 / 9) / sqrt(2) = 13.9% (the pick's repeats agree)
    assert after.tune_pick == "search pick" and after.tune_loss == pytest.approx(1 - 8 / 9)
    s_before, s_after = d.summarize([before, after])
    assert (s_after.cases, s_after.search_best, s_after.search_within, s_after.tune_within) == (1, 0, 0, 0)
    assert s_after.search_worst_loss == pytest.approx(1 / 9)
    assert s_after.mean_gain_error_points == pytest.approx(abs(0.25 - (8 / 9 - 1)) * 100)
    assert s_before.mean_gain_error_points == pytest.approx(abs(11 / 12 - 1) * 100)
    text = rep.format_section(cfg, [before, after], [s_before, s_after], "python validate/decisions.py X")
    assert "| c | after | mb 2, ckpt 4/4, attn zero3, mlp zero3, root zero3 | +25.0% | -11.1% | 11.1% | search pick | 11.1% |" in text
    assert "| after | first | 1 | 0 | 0 | 11.1% | 0 | 0 | 11.1% | 36.1 pts | 0 |" in text
    # one repeat missing: provisional, not counted
    next(j for (k, r), j in jobs.items() if k == k2 and r == 1).record_path.unlink()
    partial = d.figures(ref, d.measure(jobs, 2), due)
    assert not partial[0].complete and d.summarize(partial)[0].cases == 0


def test_contenders_are_measured_again_and_the_figures_use_all_their_repeats(tmp_path):
    m = load_model_config("gpt2-tiny")
    z3 = uniform_plan(m, "zero3", devices=2, micro_batch=4)
    pick = replace(z3, choices={**z3.choices, "root": GroupChoice("zero2")})
    plans = {"pick": pick, "a": z3, "b": uniform_plan(m, "zero2", devices=2, micro_batch=4),
             "c": uniform_plan(m, "ddp", devices=2, micro_batch=4),
             "d": uniform_plan(m, "zero3", devices=2, micro_batch=4, checkpoint=True)}
    key = {n: d.plan_key(p) for n, p in plans.items()}
    ref = d.CaseReference("c", {}, {key[n]: p for n, p in plans.items()}, {key[n]: [f"before: {n}"] for n in plans},
                          {"before": d.ProfileChoices(key["pick"], [key["pick"], key["a"]],
                                                      {"zero2": key["b"], "ddp": key["c"]},
                                                      [("search pick", key["pick"]), ("zero2", key["b"])],
                                                      {key[n]: 1.0 for n in plans})})
    cfg = _cfg(tmp_path, repeats=3, confirm_repeats=3, confirm_within=0.08)
    first_sps = {"a": (10, 11, 12), "pick": (10, 10.5, 9), "b": (10.2,) * 3, "c": (5,) * 3, "d": (10.2, 10.25, 10.3)}
    jobs = d.jobs_for(cfg, [ref])
    name = {v: n for n, v in key.items()}
    for (k, r), job in jobs.items():           # global batch 8: step time = 8 / samples/s
        _record(job.plan, job.record_path, 8 / first_sps[name[k]][r])
    first = d.measure(jobs, 3)
    # a is the best (11); d within 8% of it (10.25); the pick (10) as the search pick; b (10.2) as
    # the tune's best candidate, and the pick within 8% of b; c (5) is not a contender
    assert {name[k] for k in d.contenders(cfg, ref, first)} == {"a", "pick", "b", "d"}
    confirm = d.confirm_jobs(cfg, [ref], first)
    assert sorted(r for _k, r in confirm) == [3] * 4 + [4] * 4 + [5] * 4
    again = {"a": 9, "pick": 10.5, "b": 10.2, "d": 10}
    for (k, r), job in confirm.items():
        _record(job.plan, job.record_path, 8 / again[name[k]])
    figs, meas = d.all_figures(cfg, [ref], {**jobs, **confirm})
    assert meas[key["a"]].samples_per_s == pytest.approx(9.5)      # median of 9, 9, 9, 10, 11, 12
    assert meas[key["a"]].first_samples_per_s == pytest.approx(11)
    assert meas[key["pick"]].samples_per_s == pytest.approx(10.5)
    assert meas[key["d"]].samples_per_s == pytest.approx(10.1)     # median of 10, 10, 10, 10.2, 10.25, 10.3
    (f1, f2) = figs
    assert (f1.round, f2.round) == ("first", "confirmed") and f1.complete and f2.complete
    # first round: zero2 (10.2) leads the pick (10 of 10, 10.5, 9) by 2%, within 2 errors of the
    # difference (the pick's median: 1.2533 x 0.764 / 9.83 / sqrt(3) = 5.6%): the tune keeps its pick
    assert f1.search_loss == pytest.approx(1 - 10 / 11) and f1.tune_pick == "search pick"
    assert f1.tune_loss == pytest.approx(1 - 10 / 11)
    assert f2.search_loss == 0.0 and f2.tune_pick == "search pick" and f2.tune_loss == 0.0
    assert f2.best_samples_per_s == pytest.approx(10.5)
    # a contender's confirmation missing: the confirmed figures are provisional, the first round's not
    next(iter(confirm.values())).record_path.unlink()
    f1, f2 = d.all_figures(cfg, [ref], {**jobs, **confirm})[0]
    assert f1.complete and not f2.complete
    s1, s2 = d.summarize([f1, f2])
    assert (s1.round, s1.cases, s2.round, s2.cases) == ("first", 1, "confirmed", 0)


def test_the_section_is_replaced_and_the_rest_kept():
    doc = "# A\n\nintro\n\n## Targets\n\nt\n\n# Calibration\n\n## Summary\n\nx\n"
    first = rep.replace_section(doc, "## Decisions\n\nv1\n")
    assert first == "# A\n\nintro\n\n## Targets\n\nt\n\n## Decisions\n\nv1\n\n# Calibration\n\n## Summary\n\nx\n"
    second = rep.replace_section(first, "## Decisions\n\nv2\n")
    assert second == first.replace("v1", "v2")
    assert rep.replace_section("", "## Decisions\n\nv\n") == "## Decisions\n\nv\n"
    # above calibrate's marker: its rewrite of what follows keeps the section
    from osdp_sim.cli.calibrate_cmd import KEEP_MARKER
    marked = f"# A\n\nt\n\n{KEEP_MARKER}\n\n# Calibration\n"
    out = rep.replace_section(marked, "## Decisions\n\nv1\n")
    assert out == f"# A\n\nt\n\n## Decisions\n\nv1\n\n{KEEP_MARKER}\n\n# Calibration\n"
    assert rep.replace_section(out, "## Decisions\n\nv2\n") == out.replace("v1", "v2")


def test_a_profile_from_a_git_revision():
    hw, sha = d.load_profile_ref(f"HEAD:{HW}")
    import hashlib
    text = subprocess.run(["git", "show", f"HEAD:{HW}"], capture_output=True, check=True, cwd=ROOT).stdout
    assert sha == hashlib.sha256(text).hexdigest() and hw.name == "cpu-2core-calibrated"
    with pytest.raises(UserError, match="git show"):
        d.load_profile_ref(f"no-such-rev:{HW}")


CASES = """\
name: t
out_dir: {out}
run_hardware: {hw}
profiles: {{before: {hw}}}
repeats: 1
warmup: 1
iters: 2
threads: 1
precision: fp32
top_n: 1
tune: {{candidates: 1, baselines: 1}}
baselines: [zero3_per_block]
run_seconds: {{gpt2-tiny: 9}}
cases:
  - {{name: tiny-100, model: gpt2-tiny, mem_limit: 100MiB, micro_batches: [4]}}
"""


def _script(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "validate" / "decisions.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})    # this checkout's osdp_sim


def test_the_tune_pick_defers_to_the_search_unless_a_lead_is_beyond_noise():
    c = d.ProfileChoices("p", ["p"], {}, [("search pick", "p"), ("zero2", "z")], {})

    def m(*v):
        return d.PlanMeasurement("ok", sorted(v)[len(v) // 2], len(v), len(v), repeats_samples_per_s=v)
    # z leads by 10.8 / 10 - 1 = 8%; errors 1.2533 x cv / sqrt(3): z 0.4 / 10.8 -> 2.68%, p 0.4 / 10 ->
    # 2.89%, together 3.94%: 8% > 7.9% overrules; a 4% lead (10.4) does not
    assert d.tune_choice(c, {"p": m(9.6, 10.0, 10.4), "z": m(10.4, 10.8, 11.2)}, 0) == ("zero2", "z")
    assert d.tune_choice(c, {"p": m(9.6, 10.0, 10.4), "z": m(10.0, 10.4, 10.8)}, 0) == ("search pick", "p")
    assert d.tune_choice(c, {"z": m(10.0)}, 0) == ("zero2", "z")          # the pick did not run
    assert d.tune_choice(c, {}, 0) == (None, None)


def test_bad_case_file_is_one_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(CASES.format(out=tmp_path / "o", hw=ROOT / HW).replace("repeats: 1", "repeats: 0"))
    r = _script(f, "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "repeats" in r.stderr and str(f) in r.stderr
    f.write_text(CASES.format(out=tmp_path / "o", hw=ROOT / HW) + "confirm: {repeats: 1, within: 8}\n")
    r = _script(f, "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "confirm.within" in r.stderr and str(f) in r.stderr
    for bad, field in (("paired: {rounds: 2, max_plans: 1}", "paired.max_plans"),
                       ("paired: {rounds: 2, within: 1.5}", "paired.within"), ("paired: {round: 2}", "paired")):
        f.write_text(CASES.format(out=tmp_path / "o", hw=ROOT / HW) + bad + "\n")
        r = _script(f, "--dry-run")
        assert r.returncode == 2 and "Traceback" not in r.stderr and f"{f}: {field}:" in r.stderr, r.stderr


def test_a_real_campaign_runs_reports_and_resumes(tmp_path):
    pytest.importorskip("torch")
    f, out, doc = tmp_path / "c.yaml", tmp_path / "o", tmp_path / "acc.md"
    f.write_text(CASES.format(out=out, hw=ROOT / HW))
    doc.write_text("# Accuracy\n\nkept\n")
    dry = _script(f, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "2 runs (1 repeats), 0 recorded, 2 to run; estimated 0.3 min" in dry.stdout, dry.stdout
    assert not list(out.rglob("records/**/*.json"))
    r = _script(f, "--doc", doc)
    assert r.returncode == 0, r.stderr[-3000:]
    records = sorted(out.rglob("n2/*.json"))
    assert len(records) == 2
    res = json.loads((out / "decisions.json").read_text())
    (case,) = res["cases"]
    assert case["measured_plans"] == 2 and case["complete"]
    from osdp_sim.records import load_record
    sps = {d.plan_key(rec.plan): rec.plan.global_batch / rec.data["measured"]["iteration_time_s"]["median"]
           for rec in map(load_record, records)}
    ref = json.loads((out / "tiny-100" / "reference.json").read_text())
    pick = ref["profiles"]["before"]["search_pick"]
    assert case["search_loss"] == pytest.approx(1 - sps[pick] / max(sps.values()))
    text = doc.read_text()
    assert text.startswith("# Accuracy\n\nkept\n") and "## Decisions" in text and "| tiny-100 | before |" in text
    again = _script(f, "--doc", doc)
    assert "2 recorded, 0 to run" in again.stdout and doc.read_text() == text
    only = _script(f, "--report-only", "--doc", doc)
    assert only.returncode == 0 and doc.read_text() == text


def test_a_paired_round_compares_the_deciding_plans_side_by_side(tmp_path):
    pytest.importorskip("torch")
    from osdp_sim.records.comparison import load_comparison
    f, out = tmp_path / "c.yaml", tmp_path / "o"
    f.write_text(CASES.format(out=out, hw=ROOT / HW) + "paired: {rounds: 2}\n")
    r = _script(f, "--no-doc")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "paired round: 1 cases to compare, 2 rounds each" in r.stdout + r.stderr
    c = load_comparison(out / "tiny-100" / "paired.json")
    assert c.status == "ok" and c.rounds == 2 and len(c.plans) == 2        # the pick and the baseline
    res = json.loads((out / "decisions.json").read_text())
    (case,) = res["paired_round"]["cases"]
    ref = json.loads((out / "tiny-100" / "reference.json").read_text())
    pick = [i for i, p in enumerate(c.plans) if d.plan_key(p.plan) == ref["profiles"]["before"]["search_pick"]]
    assert case["search_loss"] == pytest.approx(max(0.0, 1 - c.ratio(pick[0], c.best).ratio))
    assert case["rounds"] == 2 and case["search_loss_se"] is not None
    assert "**Paired round.**" in r.stdout and "| before | paired | 1 |" in r.stdout
    again = _script(f, "--no-doc")
    assert "paired round: 0 cases to compare" in again.stdout + again.stderr


def test_a_profile_added_later_keeps_the_choices_already_made(tmp_path, monkeypatch):
    case = d.DecisionCase("c", "gpt2-tiny", 100 * 2**20, (2, 4))
    cfg = _cfg(tmp_path, cases=(case,), top_n=2, baselines=("zero3", "zero2"), tune_candidates=1, tune_baselines=1,
               profiles={"before": f"HEAD:{HW}"})
    calls = []
    real = d.add_profile
    monkeypatch.setattr(d, "add_profile", lambda *a, **k: (calls.append(a[3]), real(*a, **k)))
    monkeypatch.chdir(ROOT)
    (first,) = d.references(cfg, log=None)
    assert calls == ["before"] and d.plan_key(first.plans[first.profiles["before"].search_pick]) in first.plans
    (again,) = d.references(cfg, log=None)
    assert calls == ["before"] and again.to_json() == first.to_json()
    cfg2 = replace(cfg, profiles={"before": f"HEAD:{HW}", "after": str(ROOT / "hwprofiles" / "cpu-2core.yaml")})
    (both,) = d.references(cfg2, log=None)
    assert calls == ["before", "after"]
    assert both.profiles["before"].search_pick == first.profiles["before"].search_pick
    assert set(first.plans) <= set(both.plans)
    (dropped,) = d.references(cfg, log=None)
    assert calls == ["before", "after"] and dropped.to_json() == first.to_json()
    with pytest.raises(UserError, match="--report-only"):
        d.references(cfg2, log=None, rebuild=False)


def test_failed_runs_are_recorded_and_left_out(tmp_path):
    pytest.importorskip("torch")
    f, out = tmp_path / "c.yaml", tmp_path / "o"
    f.write_text(CASES.format(out=out, hw=ROOT / HW))
    r = _script(f, "--no-doc", env={"OSDP_SIM_FAULT": "error:0:0"})
    assert r.returncode == 0, r.stderr[-3000:]
    records = list(out.rglob("n2/*.json"))
    assert len(records) == 2 and all(json.loads(p.read_text())["status"] == "failed" for p in records)
    (case,) = json.loads((out / "decisions.json").read_text())["cases"]
    assert case["measured_plans"] == 0 and case["search_loss"] is None and case["complete"]
    assert "| tiny-100 | before |" in r.stdout
    assert "| before | first | 0 | 0 | 0 | - |" in r.stdout          # nothing measured: no case to count


def test_the_noise_figures_are_computed_from_the_repeats():
    def m(v):
        return d.PlanMeasurement("ok", 0.0, len(v), len(v), 0.0, 3, tuple(v))
    # A: mean 10, sd sqrt(16/5), cv 0.17889; B: mean 21, sd sqrt(6/5), cv 0.05216 -> median 0.11553
    # shifts: A 10 / 10 - 1 = 0, B 22 / 20 - 1 = 0.1 -> median 0.05
    n = d.noise_of({"a": m((10, 12, 8, 10, 12, 8)), "b": m((20, 20, 20, 22, 22, 22)),
                    "c": d.PlanMeasurement("ok", 1.0, 3, 3, 1.0, 3, (1, 1, 1))}, 3, 6)   # c: no second round
    assert n.plans == 2
    assert n.repeat_cv == pytest.approx((0.178885 + 0.052164) / 2, rel=1e-4)
    assert n.round_shift == pytest.approx(0.05)
    assert n.difference_se == pytest.approx(2 ** 0.5 * 1.2533 * n.repeat_cv / 6 ** 0.5)
    assert d.noise_of({"c": d.PlanMeasurement("ok", 1.0, 3, 3, 1.0, 3, (1, 1, 1))}, 3, 6) is None
