"""bench/external.py and bench/external_runs.yaml: the published runs load, every counted run has a
source and a number, the document has one row per counted run, and the conversions are right."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from osdp_sim.costmodel import estimate
from osdp_sim.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "external.py"
RUNS = ROOT / "bench" / "external_runs.yaml"


@pytest.fixture(scope="module")
def ext():
    spec = importlib.util.spec_from_file_location("bench_external", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_external"] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(ext):
    return ext.load_runs(RUNS)


def test_every_counted_run_has_a_source_a_number_and_a_mapping(ext, runs):
    counted = [r for r in runs if r.counted]
    assert len(counted) >= 5
    for r in counted:
        assert r.source_ref.strip() and r.source_quote.strip(), r.id
        assert r.measured.tokens_per_s_per_gpu > 0, r.id
        if "torchtitan" in r.source_ref:                  # torchtitan logs memory; llm-foundry's table not
            assert r.measured.active_gib or r.measured.reserved_gib, r.id
        assert r.model and r.hw and r.plan, r.id
        assert r.setup["nodes"] == 1, r.id          # multi-node rows are not counted yet
    for r in runs:
        if not r.counted:
            assert r.why, r.id


def test_the_published_numbers_are_the_quoted_ones(runs):
    by_id = {r.id: r for r in runs}
    tt = by_id["tt2412-8b-fsdp"]
    assert tt.measured.tokens_per_s_per_gpu == 5762 and tt.measured.reserved_gib == 82.4
    assert "| FSDP | 5,762 | 82.4 |" in tt.source_quote
    assert tt.setup["seq_len"] == 8192 and tt.plan.micro_batch == 2 and tt.plan.checkpoint == "selective-op"
    pr = by_id["pr165-fsdp2-ac"]
    assert (pr.measured.tokens_per_s_per_gpu_low, pr.measured.tokens_per_s_per_gpu_high) == (6100, 6300)
    assert "23.92% peak active, 32.64% peak reserved, 6100-6300 WPS" in pr.source_quote
    assert by_id["pr165-fsdp1-ac"].setup["fsdp"] == "FSDP1" and pr.setup["fsdp"] == "FSDP2"


def test_percent_of_capacity_converts_by_hand(ext, runs):
    # PR 165: "can convert against 95.0396 GiB GPU memory"; 23.92% of it = 22.7335 GiB (by hand:
    # 0.2392 x 95.0396 = 22.73347), 32.64% = 31.0209 GiB
    assert ext.pct_to_gib(23.92, 95.0396) == pytest.approx(22.73347, abs=1e-5)
    pr = next(r for r in runs if r.id == "pr165-fsdp2-ac")
    assert pr.measured.active_gib == pytest.approx(22.73347, abs=1e-5)
    assert pr.measured.reserved_gib == pytest.approx(31.02093, abs=1e-5)
    assert pr.measured.tokens_per_s_per_gpu == 6200


def test_samples_per_s_to_tokens_per_s_per_gpu_by_hand(ext):
    # 40 samples/s over 8 GPUs at seq 2048: 40 x 2048 / 8 = 10,240 tokens/s on each GPU
    assert ext.tokens_per_s_per_gpu(40.0, 2048, 8) == 10240.0


def test_prediction_comes_from_estimate(ext, runs):
    r = next(r for r in runs if r.id == "pr165-fsdp2-ac")
    c = ext.compare(r)
    cfg, spec, hw = ext.run_inputs(r)
    plan = ext.build_plan(cfg, r.plan, 8, checkpoint=True)
    est = estimate(spec, hw, plan)
    assert c.as_run.tokens_per_s_per_gpu == pytest.approx(est.tokens_per_s / 8)
    assert c.as_run.reserved_gib == pytest.approx(est.peak_memory_bytes / 2**30)
    frag = est.memory_breakdown["fragmentation"]
    assert c.as_run.live_peak_gib == pytest.approx((est.peak_memory_bytes - frag) / 2**30)
    assert c.throughput_ratio() == pytest.approx(est.tokens_per_s / 8 / 6200)


def test_last_block_strategy_applies_to_the_last_block_only(ext, runs):
    r = next(r for r in runs if r.id == "pr165-fsdp2-ac")
    cfg, _spec, _hw = ext.run_inputs(r)
    plan = ext.build_plan(cfg, r.plan, 8, checkpoint=True)
    assert plan.choices["block31.attn"].strategy == "zero2" and plan.choices["block31.mlp"].strategy == "zero2"
    assert {plan.choices[k].strategy for k in plan.choices if not k.startswith("block31.")} == {"zero3"}
    assert all(plan.checkpoint)


def test_selective_runs_are_predicted_as_run(ext, runs):
    c = ext.compare(next(r for r in runs if r.id == "tt2412-8b-fsdp"))
    assert c.as_run is not None and c.verdict() != "not expressible yet"
    cfg, spec, hw = ext.run_inputs(c.run)
    plan = ext.build_plan(cfg, c.run.plan, 8, "selective-op")
    assert all(plan.selective) and all(plan.checkpoint)
    full = ext.predict(spec, cfg, hw, c.run.plan, 8, "full", "full")
    none = ext.predict(spec, cfg, hw, c.run.plan, 8, "none", "none")
    # selective lies between full and none in memory and in recompute
    assert full.live_peak_gib < c.as_run.live_peak_gib < none.live_peak_gib
    assert none.tokens_per_s_per_gpu > c.as_run.tokens_per_s_per_gpu > full.tokens_per_s_per_gpu


def test_targets(ext, runs):
    r = next(r for r in runs if r.id == "pr165-fsdp2-ac")
    base = ext.compare(r).as_run

    def verdict(tokens, live_gib):
        from dataclasses import replace
        p = replace(base, tokens_per_s_per_gpu=tokens, live_peak_gib=live_gib)
        return ext.Comparison(r, "x", False, (p,))
    active = r.measured.active_gib
    assert verdict(6200 * 1.14, active * 1.04).meets()
    assert not verdict(6200 * 1.16, active).meets()
    assert not verdict(6200, active * 0.94).meets()
    assert verdict(6200 * 1.75, active * 0.9).verdict() == "misses: throughput +75%, active -10%"


def test_the_document_has_one_row_per_counted_run(tmp_path, runs):
    out = tmp_path / "ev.md"
    p = subprocess.run([sys.executable, str(SCRIPT), "-o", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "external: pr165-fsdp2-ac" in p.stderr        # progress on stderr
    text = out.read_text()
    assert text.startswith("# External validation")
    assert "python bench/external.py" in text.split("## Counted runs")[0]
    assert "held out" in text.lower()
    section = text.split("## Counted runs")[1].split("\n\n")[1]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| run |")]
    counted = [r.id for r in runs if r.counted]
    assert [ln.split(" | ")[0][2:] for ln in rows] == counted
    assert "not expressible yet" not in text
    for r in runs:
        if not r.counted:
            assert f"| {r.id} | {r.status} |" in text


def test_check_exits_1_on_a_miss_and_bad_input_is_one_line(tmp_path):
    data = yaml.safe_load(RUNS.read_text())
    data["runs"] = [r for r in data["runs"] if r["id"] == "pr165-fsdp2-ac"]
    data["fits"] = []                                                 # their runs are not in this file
    data["runs"][0]["measured"]["tokens_per_s_per_gpu"] = 1          # certainly a miss
    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump(data))
    p = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(f), "-o", str(tmp_path / "a.md"), "--check"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and (tmp_path / "a.md").exists()
    del data["runs"][0]["source"]
    f.write_text(yaml.safe_dump(data))
    p = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(f), "-o", str(tmp_path / "b.md")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("external.py: error: ")
    assert "missing 'source'" in p.stderr and not (tmp_path / "b.md").exists()


def test_a_counted_run_without_a_plan_is_refused(ext):
    d = {"id": "x", "title": "t", "status": "counted", "source": {"ref": "r", "quote": "q"},
         "setup": {"devices": 8, "seq_len": 2048}, "measured": {"tokens_per_s_per_gpu": 1},
         "model": "llama-7b", "hw": "h100x8"}
    with pytest.raises(UserError, match="needs a plan"):
        ext.run_from_dict(d, "f.yaml")
    d["measured"] = {"tokens_per_s_per_gpu": [2, 1]}
    with pytest.raises(UserError, match="above high"):
        ext.run_from_dict(d, "f.yaml")


def test_log_quoted_runs_carry_the_quoted_numbers(runs):
    # torchtitan runs read from a training log: both ends of the tokens/s range and the logged
    # reserved memory appear in the quoted log lines (thousands separated as torchtitan prints them)
    logged = [r for r in runs if r.id.startswith(("pr822-", "pr1287-", "pr355-"))]
    assert len(logged) == 6
    for r in logged:
        m = r.measured
        for tokens in (m.tokens_per_s_per_gpu_low, m.tokens_per_s_per_gpu_high):
            assert f"{tokens:,.0f}" in r.source_quote, r.id
        assert f"memory: {m.reserved_gib:.2f}GiB" in r.source_quote, r.id
        assert r.setup["nodes"] == 1 and r.setup["local_batch"] == r.plan.micro_batch == 1, r.id


def test_reshard_policies_map_onto_strategies(ext, runs):
    # torchtitan's reshard_after_forward policy: 'always' every block resharded (zero3), 'default' all
    # but the last block, 'never' none (zero2)
    by_id = {r.id: r for r in runs}
    expected = {"pr822-8b-always": {"zero3"}, "pr822-8b-never": {"zero2"}}
    for rid, strategies in expected.items():
        cfg, _spec, _hw = ext.run_inputs(by_id[rid])
        plan = ext.build_plan(cfg, by_id[rid].plan, 8, checkpoint=False)
        assert {plan.choices[k].strategy for k in plan.choices if k.startswith("block")} == strategies
    cfg, _spec, _hw = ext.run_inputs(by_id["pr822-8b-default"])
    plan = ext.build_plan(cfg, by_id["pr822-8b-default"].plan, 8, checkpoint=False)
    assert plan.choices["block31.mlp"].strategy == "zero2" and plan.choices["block0.attn"].strategy == "zero3"


def test_mpt_rows_take_the_table_columns_and_the_shape_its_param_count(ext, runs):
    # llm-foundry's columns: MicroBatchSize, GradAccum, Activation Checkpointing, NumParams; the model
    # file's parameter count is within 0.1% of the table's NumParams at that sequence length
    mpt = [r for r in runs if r.id.startswith("mpt-")]
    assert len(mpt) == 21
    for r in mpt:
        cols = [c.strip() for c in r.source_quote.strip("|").split("|")]
        assert int(cols[1]) == r.setup["seq_len"] and int(cols[2]) == r.setup["devices"] == 8, r.id
        assert (int(cols[7]), int(cols[8])) == (r.plan.micro_batch, r.plan.grad_accum), r.id
        assert r.plan.checkpoint == ("full" if cols[17] == "True" else "none"), r.id
        assert int(cols[12]) == r.measured.tokens_per_s_per_gpu, r.id
        _cfg, spec, _hw = ext.run_inputs(r)
        assert spec.param_count == pytest.approx(int(cols[19]), rel=1e-3), r.id


def test_grad_accum_reaches_the_plan_and_bad_values_are_refused(ext, runs):
    r = next(r for r in runs if r.id == "mpt-30b-s2048-h100")
    cfg, _spec, _hw = ext.run_inputs(r)
    assert ext.build_plan(cfg, r.plan, 8, checkpoint=True).grad_accum == 21
    d = {"id": "x", "title": "t", "status": "counted", "source": {"ref": "r", "quote": "q"},
         "setup": {"devices": 8, "seq_len": 2048}, "measured": {"tokens_per_s_per_gpu": 1},
         "model": "llama-7b", "hw": "h100x8",
         "plan": {"strategy": "zero3", "micro_batch": 1, "checkpoint": "none", "grad_accum": 0}}
    with pytest.raises(UserError, match="grad_accum"):
        ext.run_from_dict(d, "f.yaml")


def _fit_module():
    spec = importlib.util.spec_from_file_location("bench_external_fit", ROOT / "bench" / "external_fit.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_external_fit"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_gpu_profiles_carry_what_the_fit_gives(ext, runs):
    """The fit recomputed from the documented figures gives the value each profile carries, and
    the held-out error written into its provenance."""
    from osdp_sim.hardware.load import load_profile
    fit_mod = _fit_module()
    fits = ext.load_fits(RUNS, runs)
    assert {f.name for f in fits} == {"hopper", "ampere"}
    by_id = {r.id: r for r in runs}
    for f in fits:
        value = fit_mod.fit_one(f, by_id)
        errors = fit_mod.held_out(f, value, runs, fits)
        assert errors and all(r.startswith("mpt") for r in f.fit_on)     # fitted on MPT, judged on the rest
        for p in f.profiles:
            hw = load_profile(str(ROOT / p))
            assert hw.compute.efficiency_scale == pytest.approx(value, abs=1e-4), p
            assert hw.provenance["published_fit"]["held_out_mape"] == pytest.approx(sum(errors) / len(errors), abs=1e-4)
            assert hw.provenance["published_fit"]["runs"] == len(f.fit_on)


def test_a_fit_writes_the_value_and_its_provenance_into_the_profile_text(ext, tmp_path):
    fit_mod = _fit_module()
    src = (ROOT / "hwprofiles" / "a100x8.yaml").read_text()
    prof = tmp_path / "p.yaml"
    prof.write_text(src)
    fit = ext.Fit("ampere", "compute.efficiency_scale", ("a", "b"), ("p.yaml",))
    fit_mod.write_value(prof, fit, 0.5, 2, [0.1, 0.2])
    fit_mod.write_value(prof, fit, 0.6, 2, [0.1, 0.3])            # a second fit replaces, not adds
    text = prof.read_text()
    assert text.count("efficiency_scale:") == 1 and text.count("published_fit:") == 1
    from osdp_sim.hardware.load import load_profile
    hw = load_profile(str(prof))
    assert hw.compute.efficiency_scale == 0.6
    assert hw.provenance["published_fit"]["held_out_mape"] == pytest.approx(0.2)
    assert hw.provenance["kind"] == "documented"
    # every other line of the file is kept, comments included
    kept = [ln for ln in text.splitlines() if "efficiency_scale:" not in ln and "published_fit:" not in ln]
    assert kept == [ln for ln in src.splitlines() if "efficiency_scale:" not in ln and "published_fit:" not in ln]


def test_a_fit_naming_a_run_not_in_the_file_is_one_line(ext, runs, tmp_path):
    data = yaml.safe_load(RUNS.read_text())
    data["fits"][0]["fit_on"] = ["no-such-run"]
    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match="not a counted run"):
        ext.load_fits(f, ext.load_runs(f))
    data["fits"][0]["fit_on"] = ["mpt-1b-s2048-h100"]
    data["fits"][0]["coefficient"] = "overlap_slowdown"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match="coefficient"):
        ext.load_fits(f, ext.load_runs(f))
