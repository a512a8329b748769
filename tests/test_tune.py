"""osdp-sim tune end to end on 2 gloo ranks: two candidates (the search's pick and the strongest
baseline), real runs, the measured ranking, one refit; resuming runs nothing twice; a run that
fails is recorded and the tune says it has no plan instead of crashing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from osdp_sim.calibrate.tune import choose_candidates, spearman       # noqa: E402
from osdp_sim.hardware.load import load_profile                        # noqa: E402
from osdp_sim.model.load import load_model                             # noqa: E402
from osdp_sim.planner.space import SearchSpace                         # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HW = str(ROOT / "hwprofiles" / "cpu-2core-calibrated.yaml")
ARGS = ["--hw", HW, "--model", "gpt2-tiny", "--mem-limit", "80MiB", "--precision", "fp32", "--candidates", "1", "--near", "0",
        "--baselines", "1", "--warmup", "1", "--iters", "2", "--refit-starts", "1", "--time-limit", "400", "--confirm", "0"]


def _tune(out: Path, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "osdp_sim.cli.main", "tune", *ARGS, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def test_candidates_are_the_pick_other_micro_batches_and_distinct_baselines():
    spec, hw = load_model("gpt2-tiny"), load_profile(HW)
    cands = choose_candidates(spec, hw, 80 * 2**20, SearchSpace(micro_batches=(1, 2, 3, 4)), k=3, baselines=2,
                              near=2)
    labels = [c.label for c in cands]
    assert labels[:3] == ["search pick", "search top 2", "search top 3"]
    assert sum(l.startswith("best at micro-batch") for l in labels) == 2
    assert len(labels) == 7 and len({json.dumps(c.plan.choices, default=str) + str(c.plan.micro_batch)
                                     + str(c.plan.checkpoint) for c in cands}) == 7
    # the near-ties are distinct plans (not permutations of the pick's blocks), no faster than the pick
    from osdp_sim.calibrate.decisions import plan_signature
    assert len({plan_signature(c.plan) for c in cands[:3]}) == 3
    assert cands[1].predicted_samples_per_s >= cands[2].predicted_samples_per_s
    mbs = [c.plan.micro_batch for c in cands if c.label.startswith("best at")]
    assert cands[0].plan.micro_batch not in mbs
    pick = cands[0].predicted_samples_per_s
    assert all(c.predicted_samples_per_s <= pick * (1 + 1e-12) for c in cands)   # the search is exact
    assert all(c.predicted_peak_bytes <= 80 * 2**20 for c in cands)


def test_spearman():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None


def test_tune_runs_ranks_refits_and_resumes(tmp_path):
    out = tmp_path / "tune"
    r = _tune(out)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "tune.json").read_text())
    assert res["format"] == "osdp-sim/tune" and res["status"] == "measured"
    assert [m["label"] for m in res["ranking"]].count("search pick") == 1 and len(res["ranking"]) == 2
    measured = [m["measured_samples_per_s"] for m in res["ranking"]]
    assert all(m["status"] == "ok" for m in res["ranking"]) and measured == sorted(measured, reverse=True)
    for m in res["ranking"]:
        assert m["measured_peak_bytes"] == pytest.approx(m["predicted_peak_bytes"], rel=0.03)
        assert len(m["records"]) == 1 and Path(m["records"][0]).is_file()
    from osdp_sim.plan import load_plan, plan_from_dict
    from osdp_sim.records import load_record
    best = load_record(res["ranking"][0]["records"][0]).plan      # the measured fastest run's plan
    assert load_plan(out / "plan.json") == plan_from_dict(res["plan"]) == best
    prof = load_profile(str(out / "profile.yaml"))
    cal = prof.provenance["calibration"]
    assert cal["records"]["count"] == res["refit_runs"] >= 2 + 30   # the tune's runs and the profile's own
    assert "measured fastest" in r.stdout and "refitted on" in r.stdout
    assert "campaign tune-gpt2-tiny: run 1/2" in r.stderr            # progress

    again = _tune(out, "--no-refit")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 runs, 2 already recorded, 0 to run" in again.stderr
    assert json.loads((out / "tune.json").read_text())["ranking"] == res["ranking"]

    # resumed with a confirmation round that takes both (within 100%): one more run each, and each
    # candidate's figure is the median of its two runs
    confirmed = _tune(out, "--no-refit", "--confirm", "1", "--confirm-within", "100")
    assert confirmed.returncode == 0, confirmed.stderr[-3000:]
    assert "confirming 2 candidates" in confirmed.stderr and "2 runs, 0 already recorded, 2 to run" in confirmed.stderr
    res2 = json.loads((out / "tune.json").read_text())
    for m in res2["ranking"]:
        runs = [load_record(p) for p in m["records"]]
        assert len(runs) == 2 and {r.data["settings"]["seed"] for r in runs} == {0, 1}
        sps = [r.plan.global_batch / r.data["measured"]["iteration_time_s"]["median"] for r in runs]
        assert m["measured_samples_per_s"] == pytest.approx(sum(sps) / 2)

    # resumed with a paired comparison of both (osdp-sim compare, 3 rounds) instead: the ranking and
    # the plan follow the paired ratios; resumed again, the comparison is read back, not run
    paired = _tune(out, "--no-refit", "--paired", "3", "--confirm-within", "100")
    assert paired.returncode == 0, paired.stderr[-3000:]
    assert "comparing the 2 candidates" in paired.stderr and "paired ratio to best" in paired.stdout
    res3 = json.loads((out / "tune.json").read_text())
    assert res3["paired"] == {"path": str(out / "paired.json"), "status": "ok", "rounds": 3}
    ratios = [m["paired_ratio_to_best"] for m in res3["ranking"]]
    assert ratios[0] == pytest.approx(1.0) and ratios[1] <= 1.0
    from osdp_sim.records.comparison import load_comparison
    c = load_comparison(out / "paired.json")
    # the plan is the paired best, unless its lead over the search's pick is within noise (choose)
    fastest = res3["ranking"][0]["label"]
    want = c.plans[c.best].plan if res3["chosen"] == fastest else next(p.plan for p in c.plans if p.label == "search pick")
    assert res3["chosen"] in (fastest, "search pick") and plan_from_dict(res3["plan"]) == want and c.rounds == 3
    again = _tune(out, "--no-refit", "--paired", "3", "--confirm-within", "100")
    assert again.returncode == 0 and "paired comparison of 2 contenders is recorded" in again.stderr
    assert json.loads((out / "tune.json").read_text())["ranking"] == res3["ranking"]


def test_the_search_pick_is_kept_unless_a_lead_over_it_is_beyond_noise():
    from osdp_sim.calibrate.tune import Candidate, Measured, choose
    plan = load_model("gpt2-tiny")  # any object: choose reads labels and numbers only

    def m(label, *sps, ratio=None, se=None):
        return Measured(Candidate(label, plan, 1.0, 1.0), "ok", sorted(sps)[len(sps) // 2], 1.0, (), tuple(sps),
                        ratio, se)
    # medians 10.4 against 10.0: lead 4%; spreads sd 0.4 over mean 10.4 and 0.4 over 10: median SEs
    # 1.2533 x 0.03846 / sqrt(3) = 0.02783 and 0.02894, together 0.04015 -> 4% < 2 x 4.0%: kept
    best, pick = m("zero2", 10.0, 10.4, 10.8), m("search pick", 9.6, 10.0, 10.4)
    chosen, why = choose([best, pick])
    assert chosen is pick and "kept the search's pick: zero2 measured +4.0% +- 4.0% ahead" in why
    # twice the lead: 8% > 2 x 4.1%
    assert choose([m("zero2", 10.4, 10.8, 11.2), pick])[0].candidate.label == "zero2"
    # one run each: no spread, any lead counts; a tie keeps the pick
    assert choose([m("zero2", 10.1), m("search pick", 10.0)])[0].candidate.label == "zero2"
    assert choose([m("zero2", 10.0), m("search pick", 10.0)])[0].candidate.label == "search pick"
    # paired: 1 / 0.98 - 1 = 2.04% against 2 x 1.2%: kept; against 2 x 0.9%: the fastest
    assert choose([m("zero2", 10, ratio=1.0, se=0.0), m("search pick", 9, ratio=0.98, se=0.012)])[0].candidate.label == "search pick"
    assert choose([m("zero2", 10, ratio=1.0, se=0.0), m("search pick", 9, ratio=0.98, se=0.009)])[0].candidate.label == "zero2"


def test_failed_runs_are_recorded_and_the_tune_has_no_plan(tmp_path):
    out = tmp_path / "tune"
    r = _tune(out, "--no-refit", env={"OSDP_SIM_FAULT": "error:0:0"})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr.split("campaign")[0]
    res = json.loads((out / "tune.json").read_text())
    assert res["status"] == "no_run" and res["plan"] is None
    assert {m["status"] for m in res["ranking"]} == {"failed"}
    records = list((out / "records").rglob("*.json"))
    assert len(records) == 2 and all(json.loads(p.read_text())["status"] == "failed" for p in records)
    assert not (out / "plan.json").exists()


def test_bad_input_is_one_line(tmp_path):
    r = _tune(tmp_path / "t", "--run-timeout", "nan")
    assert r.returncode == 2 and "--run-timeout" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "candidates.json").write_text(json.dumps({"key": {"model": "other"}, "candidates": []}))
    r = _tune(tmp_path / "u")
    assert r.returncode == 2 and "candidates.json" in r.stderr and "Traceback" not in r.stderr


def test_a_config_json_model_is_run_as_transformers_implements_it(tmp_path):
    # the candidates are predicted with the description of transformers' modules (implementation
    # hf): their runs must be validate --impl hf, with the hf record names
    from osdp_sim.calibrate.campaign import validate_command
    from osdp_sim.calibrate.tune import RunSettings, _campaign, jobs_for
    spec, hw = load_model(str(ROOT / "validate" / "models" / "llama-tiny-hf"), notes=[]), load_profile(HW)
    cands = choose_candidates(spec, hw, 200 * 2**20, SearchSpace(micro_batches=(1, 2)), k=1, baselines=1)
    camp = _campaign(RunSettings(hardware=HW, out_dir=tmp_path), "t")
    jobs = jobs_for(cands, camp, 1)
    assert jobs and all(j.impl == "hf" and "-hf-" in j.record_path.name for j in jobs)
    cmd = validate_command(camp, jobs[0], tmp_path / "p.json", 1)
    assert cmd[cmd.index("--impl") + 1] == "hf"


def test_a_model_validate_cannot_run_is_refused_before_the_search(tmp_path):
    from osdp_sim.calibrate.tune import RunSettings, tune
    from osdp_sim.errors import UserError
    import dataclasses
    from osdp_sim.model.spec import build_spec
    spec = load_model(str(ROOT / "tests" / "data" / "hf" / "mixtral-8x7b-v0.1"), notes=[], seq_len=128)
    # Mixtral as a YAML of the runtime's modules: experts, which those modules do not build
    osdp = build_spec(dataclasses.replace(spec.config, implementation="osdp", source="yaml:x.yaml"))
    with pytest.raises(UserError, match="cannot build"):      # experts: the runtime's modules have none
        tune(osdp, load_profile(HW), 2**40, SearchSpace(), RunSettings(hardware=HW, out_dir=tmp_path), log=None)
    assert not (tmp_path / "candidates.json").exists()
