"""`osdp-sim compare`: plans timed side by side (runtime/compare.py), the paired estimator and the
comparison record (records/comparison.py), and the decisions campaign's paired round
(calibrate/decisions_paired.py). Real gloo ranks for the runs; hand-computed numbers for the
estimator."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from osdp_sim.calibrate.decisions import CaseReference, DecisionsConfig, PlanMeasurement, ProfileChoices
from osdp_sim.calibrate.distinct import plan_key
from osdp_sim.cli.main import main
from osdp_sim.errors import UserError
from osdp_sim.model.config import ModelConfig
from osdp_sim.plan import plan_to_dict, save_plan, uniform_plan
from osdp_sim.records.comparison import (build_comparison, best_index, comparison_from_dict, load_comparison,
                                         paired_ratio, round_times, save_comparison)
from osdp_sim.runtime.compare import round_order

from hwfixtures import ROUND_CPU_PROFILE_YAML as CPU_PROFILE

CFG = ModelConfig(name="tiny", family="gpt2", n_layers=2, hidden=64, n_heads=2, vocab_size=256, seq_len=32)
PLAN_A = uniform_plan(CFG, "zero3", devices=2, micro_batch=2, precision="fp32")
PLAN_B = uniform_plan(CFG, "zero2", devices=2, micro_batch=4, precision="fp32")



# ---------------------------------------------------------------- the estimator, by hand

def test_paired_ratio_is_the_geometric_mean_of_per_round_speed_ratios():
    # speeds a: 4/1 = 4, 4/2 = 2; b: 2, 2 -> per-round ratios 2 and 1; log mean ln2/2 -> sqrt(2);
    # stdev of (ln 2, 0) = ln2/sqrt(2) = 0.49013, over sqrt(2) rounds -> se 0.34657
    r = paired_ratio([1.0, 2.0], 4, [2.0, 2.0], 4)
    assert r.ratio == pytest.approx(math.sqrt(2))
    assert r.se == pytest.approx(0.34657, abs=1e-5)
    assert r.rounds == 2


def test_paired_ratio_counts_samples_not_steps_and_common_rounds_only():
    # a: 8 samples in 2 s = 4/s; b: 4 samples in 1 s = 4/s: equal speed; b's third round unpaired
    r = paired_ratio([2.0], 8, [1.0, 1.0, 5.0], 4)
    assert (r.ratio, r.se, r.rounds) == (pytest.approx(1.0), 0.0, 1)
    assert paired_ratio([], 1, [1.0], 1) is None


def test_best_is_the_largest_mean_log_speed():
    # plan 0: ln 2, ln 2 (mean 0.693); plan 1: ln 4, ln(2/1.5) (mean 0.837) -> plan 1, although its
    # mean step time (1.0 s) equals plan 0's
    assert best_index([[1.0, 1.0], [0.5, 1.5]], [2, 2]) == 1
    assert best_index([[], [1.0]], [1, 1]) is None


def test_a_round_is_the_slowest_rank_over_the_rounds_every_rank_finished():
    assert round_times([[1.0, 3.0, 2.0], [2.0, 1.0]]) == [2.0, 3.0]


def test_every_round_rotates_which_plan_goes_first():
    assert [round_order(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def _comparison(times_per_rank, *, status="ok", plans=(PLAN_A, PLAN_B)):
    ranks = [{"step_times_s": t, "env": {}} for t in times_per_rank]
    return build_comparison(status=status, run_id="r", plans=list(plans), labels=[f"p{i}" for i in range(len(plans))],
                            impls=["osdp"] * len(plans), hardware_profile={"name": "x", "path": "x.yaml"},
                            env={"world_size": 2}, settings={"warmup": 0, "rounds": 3, "seed": 0, "timeout_s": 60},
                            rank_results=ranks, predicted_samples_per_s=[None] * len(plans))


def test_the_record_keeps_the_rounds_every_rank_finished_and_reads_back(tmp_path):
    # rank 1 stopped after 2 rounds: 2 rounds count; round times are the slower rank's
    data = _comparison([[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], [[1.5, 0.5], [2.0, 4.0]]], status="failed")
    assert data["rounds_completed"] == 2
    assert data["plans"][0]["step_times_s"] == [1.5, 1.0]
    assert data["plans"][1]["step_times_s"] == [2.0, 4.0]
    # plan 0: 4 samples per step, speeds 2.667, 4; plan 1: 8 samples, speeds 4, 2 -> plan 0 faster
    # by exp(mean(ln(2.667/4), ln(4/2))) = exp((-0.405 + 0.693)/2) = 1.1547
    assert data["best"] == 0
    assert data["plans"][1]["ratio_to_best"] == pytest.approx(1 / 1.1547, rel=1e-4)
    c = load_comparison(save_comparison(data, tmp_path / "c.json"))
    assert c.status == "failed" and c.rounds == 2 and c.plans[1].plan == PLAN_B
    assert c.ratio(0, 1).ratio == pytest.approx(1.1547, rel=1e-4)


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(format="osdp-sim/record"), "format"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.pop("rounds_completed"), "rounds_completed"),
    (lambda d: d["plans"][1].update(step_times_s=[1.0]), "plans[1].step_times_s"),
    (lambda d: d["plans"][0].update(step_times_s=[1.0, -1.0, 1.0]), "plans[0].step_times_s"),
    (lambda d: d.update(best=7), "best"),
    (lambda d: d["plans"][0].update(impl="jax"), "plans[0].impl"),
    (lambda d: d.update(plans=d["plans"][:1]), "plans"),
])
def test_a_bad_record_is_an_error_naming_the_file_and_field(tmp_path, edit, field):
    data = _comparison([[[1.0] * 3, [2.0] * 3], [[1.0] * 3, [2.0] * 3]])
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as e:
        load_comparison(path)
    assert str(e.value).startswith(f"{path}: {field}:")


# ---------------------------------------------------------------- real runs

@pytest.fixture
def files(tmp_path):
    hw = tmp_path / "cpu.yaml"
    hw.write_text(CPU_PROFILE)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_plan(PLAN_A, a)
    save_plan(PLAN_B, b)
    return hw, a, b


@pytest.mark.slow
def test_compare_runs_two_plans_side_by_side_and_writes_the_record(files, tmp_path, capsys):
    hw, a, b = files
    out = tmp_path / "c.json"
    rc = main(["compare", "--plan", str(a), "--plan", str(b), "--label", "zero3", "--label", "zero2",
               "--hw", str(hw), "--rounds", "3", "--warmup", "1", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    c = load_comparison(out)
    assert c.status == "ok" and c.rounds == 3
    assert [p.label for p in c.plans] == ["zero3", "zero2"]
    assert all(len(p.step_times_s) == 3 and min(p.step_times_s) > 0 for p in c.plans)
    assert c.plans[c.best].samples_per_s == max(p.samples_per_s for p in c.plans)
    assert all(p.predicted_samples_per_s > 0 for p in c.plans)
    assert "3 rounds (ok)" in text and "best" in text


@pytest.mark.slow
def test_a_rank_that_fails_mid_run_keeps_the_finished_rounds(tmp_path):
    from osdp_sim.runtime.launch import launch
    entries = [{"plan": plan_to_dict(p), "impl": "osdp", "hf_config": None} for p in (PLAN_A, PLAN_B)]
    spec = {"mode": "compare", "entries": entries, "backend": "fsdp2", "device": "cpu", "warmup": 1,
            "rounds": 4, "seed": 0, "threads_per_rank": 1}
    # steps count over plans: warmup 0-1, round 1 steps 2-3, round 2 steps 4-5: fails in round 2
    out = launch(spec, 2, timeout_s=120, run_dir=str(tmp_path / "run"), echo=None,
                 extra_env={"OSDP_SIM_FAULT": "error:1:4"})
    assert out.status == "failed" and out.failure["rank"] == 1
    data = build_comparison(status=out.status, run_id=out.run_id, plans=[PLAN_A, PLAN_B], labels=["a", "b"],
                            impls=["osdp", "osdp"], hardware_profile={"name": "t", "path": "t"}, env=out.env,
                            settings={"warmup": 1, "rounds": 4, "seed": 0, "timeout_s": 120},
                            rank_results=out.rank_results, predicted_samples_per_s=[None, None],
                            failure=out.failure)
    c = load_comparison(save_comparison(data, tmp_path / "c.json"))
    assert c.rounds == 1 and c.data["failure"]["rank"] == 1


@pytest.mark.parametrize("args,needle", [
    (["--plan", "A"], "--plan: give at least two plans to compare"),
    (["--plan", "A", "--plan", "B", "--label", "x"], "--label: expected one --label per --plan (2), got 1"),
    (["--plan", "A", "--plan", "missing.json"], "missing.json"),
    (["--plan", "A", "--plan", "B", "--timeout", "0"], "--timeout"),
])
def test_bad_arguments_are_one_line_errors(files, tmp_path, capsys, args, needle):
    hw, a, b = files
    args = [str(a) if x == "A" else str(b) if x == "B" else str(tmp_path / x) if x == "missing.json" else x
            for x in args]
    rc = main(["compare", *args, "--hw", str(hw), "-o", str(tmp_path / "c.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err


def test_plans_for_different_device_counts_are_refused(files, tmp_path, capsys):
    hw, a, _ = files
    four = tmp_path / "four.json"
    save_plan(uniform_plan(CFG, "zero3", devices=4, micro_batch=2, precision="fp32"), four)
    rc = main(["compare", "--plan", str(a), "--plan", str(four), "--hw", str(hw), "-o", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "different device counts ([2, 4])" in err


# ---------------------------------------------------------------- the decisions campaign's paired round

def _case(tmp_path):
    plans = {n: uniform_plan(CFG, s, devices=2, micro_batch=mb, precision="fp32")
             for n, s, mb in [("pick", "zero3", 2), ("tuned", "zero3", 4), ("base", "zero2", 2),
                              ("best", "zero2", 4), ("near", "ddp", 4), ("far", "ddp", 2)]}
    keys = {n: plan_key(p) for n, p in plans.items()}
    ref = CaseReference("c", {}, {keys[n]: p for n, p in plans.items()}, {keys[n]: [n] for n in plans},
                        {"only": ProfileChoices(search_pick=keys["pick"], top=[keys["pick"]],
                                                baselines={"zero2": keys["base"]},
                                                tune=[("tuned", keys["tuned"]), ("pick", keys["pick"])],
                                                predicted_samples_per_s={keys["pick"]: 11.0, keys["base"]: 10.0,
                                                                         keys["tuned"]: 9.0})})
    sps = {"pick": 9.0, "tuned": 9.5, "base": 9.2, "best": 10.0, "near": 9.6, "far": 5.0}
    meas = {keys[n]: PlanMeasurement("ok", v, 6, 6) for n, v in sps.items()}
    cfg = DecisionsConfig(name="t", source="t.yaml", out_dir=tmp_path, run_hardware="x", profiles={"only": "x"},
                          cases=(), paired_rounds=2, paired_within=0.05, paired_max_plans=5)
    return cfg, ref, meas, keys, plans


def test_the_paired_set_is_the_picks_the_best_baseline_the_best_then_the_near_ones(tmp_path):
    from osdp_sim.calibrate.decisions_paired import paired_keys
    cfg, ref, meas, keys, _ = _case(tmp_path)
    # the tune picks its fastest candidate (tuned 9.5 over pick 9.0); near: within 5% of 10.0
    assert paired_keys(cfg, ref, meas) == [keys[n] for n in ("pick", "tuned", "base", "best", "near")]
    cfg4 = dataclasses.replace(cfg, paired_max_plans=4)
    assert paired_keys(cfg4, ref, meas) == [keys[n] for n in ("pick", "tuned", "base", "best")]


def test_paired_figures_read_losses_and_gains_from_the_ratios(tmp_path):
    from osdp_sim.calibrate.decisions_paired import paired_figures, paired_path
    cfg, ref, meas, keys, plans = _case(tmp_path)
    order = ["pick", "tuned", "base", "best", "near"]
    # 2 rounds; step times chosen so the speeds (samples/s) are, per round:
    speeds = {"pick": (9.0, 9.0), "tuned": (9.5, 9.5), "base": (8.0, 8.0), "best": (10.0, 10.0), "near": (10.0, 12.5)}
    ranks = [{"step_times_s": [[plans[n].global_batch / s for s in speeds[n]] for n in order]}] * 2
    data = build_comparison(status="ok", run_id="r", plans=[plans[n] for n in order], labels=order,
                            impls=["osdp"] * 5, hardware_profile={"name": "x", "path": "x"}, env={},
                            settings={"warmup": 0, "rounds": 2, "seed": 0, "timeout_s": 1},
                            rank_results=ranks, predicted_samples_per_s=[None] * 5)
    paired_path(cfg, ref).parent.mkdir(parents=True)
    save_comparison(data, paired_path(cfg, ref))
    (f,) = paired_figures(cfg, ref, meas)
    # best: near (log mean of 10 and 12.5 beats best's 10, 10); pick over near: exp(mean(ln .9, ln .72))
    # = sqrt(0.648) = 0.80498 -> loss 0.19502
    assert f.best.startswith("near")
    assert f.search_loss == pytest.approx(1 - math.sqrt(0.9 * 0.72))
    assert f.tune_pick == "tuned" and f.tune_loss == pytest.approx(1 - math.sqrt(0.95 * 0.76))
    # gain over the fastest baseline by the confirmed medians ("base"): 9/8 - 1
    assert f.measured_gain == pytest.approx(0.125)
    assert f.predicted_gain == pytest.approx(0.1)
    assert f.rounds == 2 and f.round == "paired" and f.complete
    # a record of other plans (or other rounds) is not read as this case's
    data["settings"]["rounds"] = 3
    Path(paired_path(cfg, ref)).write_text(json.dumps(data))
    assert paired_figures(cfg, ref, meas) == []


COMMITTED = sorted(Path(__file__).resolve().parents[1].glob("validate/decisions/**/paired.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_every_committed_comparison_loads(path):
    c = load_comparison(path)
    assert c.rounds == len(c.plans[0].step_times_s) and c.best is not None


def test_one_plan_reached_twice_is_reported_as_a_check_of_the_estimator(tmp_path):
    from osdp_sim.calibrate.decisions_paired import identical_pairs, paired_path
    k_a, k_twice, k_b = plan_key(PLAN_A), "older text of " + plan_key(PLAN_A), plan_key(PLAN_B)
    ref = CaseReference("c", {}, {k_a: PLAN_A, k_twice: PLAN_A, k_b: PLAN_B},
                        {k_a: ["before: pick"], k_twice: ["after: pick"], k_b: ["zero2"]},
                        {"before": ProfileChoices(k_a, [k_a], {"zero2": k_b}, [], {k_a: 1.0, k_b: 1.0}),
                         "after": ProfileChoices(k_twice, [k_twice], {"zero2": k_b}, [], {k_twice: 1.0, k_b: 1.0})})
    meas = {k: PlanMeasurement("ok", 10.0, 6, 6) for k in (k_a, k_twice, k_b)}
    cfg = DecisionsConfig(name="t", source="t.yaml", out_dir=tmp_path, run_hardware="x", profiles={},
                          cases=(), paired_rounds=2)
    # A's two copies: 4 samples in 0.4 s and 0.5 s against 0.5 s and 0.4 s -> ratios 1.25, 0.8 -> 1.0
    times = [[0.4, 0.5], [0.5, 0.4], [0.8, 0.8]]
    data = build_comparison(status="ok", run_id="r", plans=[PLAN_A, PLAN_A, PLAN_B], labels=["a", "a2", "b"],
                            impls=["osdp"] * 3, hardware_profile={"name": "x", "path": "x"}, env={},
                            settings={"warmup": 0, "rounds": 2, "seed": 0, "timeout_s": 1},
                            rank_results=[{"step_times_s": times}] * 2, predicted_samples_per_s=[None] * 3)
    paired_path(cfg, ref).parent.mkdir(parents=True)
    save_comparison(data, paired_path(cfg, ref))
    ((case, a, b, r),) = identical_pairs(cfg, [ref], meas)
    assert (case, a, b) == ("c", "a", "a2")
    # logs ln 1.25, ln 0.8 = +-0.22314: mean 0 -> ratio 1; stdev 0.31557 / sqrt(2) = 0.22314
    assert r.ratio == pytest.approx(1.0) and r.se == pytest.approx(0.22314, abs=1e-5)
    # in the figures the two copies are one plan, their log speeds averaged per round: A runs at 10
    # and 8 samples/s in both rounds (geometric mean sqrt(80)), B (8 samples in 0.8 s) at 10: B is
    # the best and both profiles' pick (A) is 1 - sqrt(0.8) behind it, with no spread
    from osdp_sim.calibrate.decisions_paired import paired_figures
    before, after = paired_figures(cfg, ref, meas)
    assert before.best.startswith("b (") and before.measured_plans == 2
    assert before.search_loss == after.search_loss == pytest.approx(1 - math.sqrt(0.8))
    assert before.search_loss_se == pytest.approx(0.0, abs=1e-12)
