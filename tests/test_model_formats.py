"""Plan and record formats 2 (the model stage's new fields) and 3 (the model's implementation):
every committed plan and record, all written in format 1, and frozen format 2 plans still load,
their models upgraded to the defaults, and keep the names their records have."""

import json
from pathlib import Path

import pytest

from osdp_sim.errors import UserError
from osdp_sim.model import BUILTIN, build_spec, load_model_config
from osdp_sim.model.config import MODEL_FIELDS, V1_FIELDS, ModelConfig, for_implementation, with_overrides
from osdp_sim.plan import load_plan, plan_from_dict, plan_to_dict, uniform_plan
from osdp_sim.plan.io import VERSION as PLAN_VERSION
from osdp_sim.records import load_record
from osdp_sim.records.record import VERSION as RECORD_VERSION

ROOT = Path(__file__).resolve().parents[1]
# Copies of validate/plans/*.json as committed in format 1 (validate/run_table.py regenerates the
# committed ones in the current format): the old format is checked on these.
PLANS = sorted((ROOT / "tests" / "data" / "plan-v1").glob("*.json"))
# Plans written by osdp-sim at format 2 (commit 2438aab), with the hash that named their records
# then in their notes: a built-in and a config.json model (Qwen2, which format 1 cannot say).
PLANS_V2 = sorted((ROOT / "tests" / "data" / "plan-v2").glob("*.json"))
COMMITTED_PLANS = sorted((ROOT / "validate" / "plans").glob("*.json"))
RECORDS = sorted(p for p in (ROOT / "validate" / "records").rglob("*.json") if not p.name.startswith("."))


def test_versions_bumped():
    assert PLAN_VERSION == 4 and RECORD_VERSION == 4
    assert MODEL_FIELDS[4] == MODEL_FIELDS[3] == ModelConfig.field_names()       # the newest version holds every field


@pytest.mark.parametrize("path", PLANS_V2, ids=[p.name for p in PLANS_V2])
def test_format_2_plans_load_as_the_runtime_modules_and_keep_their_hash(path):
    from osdp_sim.records.record import plan_hash
    d = json.loads(path.read_text())
    assert d["version"] == 2 and "implementation" not in d["model"]
    plan = load_plan(path)
    assert plan.model.implementation == "osdp"        # what a format 2 prediction used
    assert plan_to_dict(plan)["version"] == 4
    assert plan_hash(plan) == d["notes"]["plan_hash_at_format_2"]
    # The same model as transformers runs it is another plan: another name.
    hf = dict(d, version=3, model=dict(d["model"], implementation="hf"))
    assert plan_hash(plan_from_dict(hf)) != plan_hash(plan)


def test_format_2_model_with_an_implementation_is_refused(tmp_path):
    d = json.loads(PLANS_V2[0].read_text())
    d["model"]["implementation"] = "osdp"
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="model.implementation"):
        load_plan(tmp_path / "p.json")


def test_a_bad_implementation_is_one_line(tmp_path):
    d = plan_to_dict(uniform_plan(load_model_config("llama-tiny"), "zero3", devices=2, micro_batch=1))
    d["model"]["implementation"] = "vllm"
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        load_plan(tmp_path / "p.json")
    assert "model.implementation" in str(e.value) and "osdp, hf" in str(e.value) and "\n" not in str(e.value)


def test_config_json_plan_keeps_hf_through_a_round_trip(tmp_path):
    cfg = load_model_config(str(ROOT / "tests" / "data" / "hf" / "qwen2-7b"), notes=[], seq_len=512)
    plan = uniform_plan(cfg, "zero3", devices=2, micro_batch=1)
    d = plan_to_dict(plan)
    assert d["version"] == 4 and d["model"]["implementation"] == "hf"
    (tmp_path / "p.json").write_text(json.dumps(d))
    assert load_plan(tmp_path / "p.json") == plan
    from osdp_sim.records.record import plan_identity
    assert plan_identity(d)["version"] == 3
    osdp = plan_to_dict(uniform_plan(for_implementation(cfg, "osdp"), "zero3", devices=2, micro_batch=1))
    assert plan_identity(osdp)["version"] == 2 and "implementation" not in plan_identity(osdp)["model"]


def test_there_are_committed_files_to_check():
    assert len(PLANS) >= 3 and len(RECORDS) >= 50


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_committed_plans_load(path):
    plan = load_plan(path)
    assert json.loads(path.read_text())["version"] == 1
    builtin = BUILTIN[plan.model.name]
    assert plan.model == with_overrides(builtin, source="")      # v1 knows no source
    assert build_spec(plan.model).param_count == build_spec(builtin).param_count


@pytest.mark.parametrize("path", RECORDS, ids=[str(p.relative_to(ROOT / "validate" / "records")) for p in RECORDS])
def test_committed_records_load(path):
    rec = load_record(path)
    if rec.model.source.startswith("hf:"):
        # a committed config.json (validate/models): the source names it, relative to the root
        config = rec.model.source[3:].split(" (")[0]
        assert (ROOT / config).is_file(), rec.model.source
        assert rec.model.implementation == ("hf" if rec.data.get("impl") == "hf" else "osdp")
        return
    assert rec.model.source in ("", *(f"builtin:{n}" for n in BUILTIN))
    if rec.model.name in BUILTIN:
        assert build_spec(rec.model).param_count == build_spec(BUILTIN[rec.model.name]).param_count


def test_new_plan_holds_every_model_field(tmp_path):
    plan = uniform_plan(load_model_config("llama-tiny"), "zero3", devices=2, micro_batch=1)
    d = plan_to_dict(plan)
    assert d["version"] == 4 and d["model"]["source"] == "builtin:llama-tiny"
    assert d["model"]["implementation"] == "osdp"
    assert d["model"]["qkv_bias"] is False and d["model"]["mlp_kind"] == "swiglu"
    (tmp_path / "p.json").write_text(json.dumps(d))
    assert load_plan(tmp_path / "p.json") == plan


def test_v1_plan_with_a_v2_model_key_is_refused(tmp_path):
    d = json.loads(PLANS[0].read_text())
    d["model"]["n_experts"] = 8
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="model.n_experts"):
        load_plan(tmp_path / "p.json")


def test_v1_fields_are_the_old_ones():
    d = json.loads(PLANS[0].read_text())
    assert sorted(d["model"]) == sorted(V1_FIELDS)


def test_committed_records_keep_their_names_in_format_3():
    """A campaign finds the records it made before the bumps: the name a run gets from its plan
    written in format 3 is the name its format 1 record has."""
    from osdp_sim.records import record_name
    named = 0
    for path in RECORDS:
        rec = load_record(path)
        if record_name(rec.data) != path.name:
            continue                 # saved under a name of its own (save_record_as)
        named += 1
        assert record_name(dict(rec.data, plan=plan_to_dict(rec.plan))) == path.name
    assert named >= 50


def test_a_model_format_1_cannot_say_gets_a_new_name():
    from osdp_sim.records.record import plan_identity
    plan = uniform_plan(load_model_config("llama-tiny"), "zero3", devices=2, micro_batch=1)
    assert plan_identity(plan_to_dict(plan))["version"] == 1
    qwen = with_overrides(load_model_config("llama-tiny"), qkv_bias=True)
    d = plan_identity(plan_to_dict(uniform_plan(qwen, "zero3", devices=2, micro_batch=1)))
    assert d["version"] == 2 and d["model"]["qkv_bias"] is True


@pytest.mark.parametrize("path", COMMITTED_PLANS, ids=[p.name for p in COMMITTED_PLANS])
def test_committed_plans_load_in_whichever_format_they_were_written(path):
    plan = load_plan(path)
    assert json.loads(path.read_text())["version"] in (1, PLAN_VERSION)
    assert build_spec(plan.model).param_count == build_spec(BUILTIN[plan.model.name]).param_count


def test_yaml_may_say_implementation_hf(tmp_path):
    text = "family: llama\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 256\nseq_len: 32\n"
    (tmp_path / "m.yaml").write_text(text)
    assert load_model_config(str(tmp_path / "m.yaml")).implementation == "osdp"
    (tmp_path / "m.yaml").write_text(text + "implementation: hf\n")
    cfg = load_model_config(str(tmp_path / "m.yaml"))
    assert cfg.implementation == "hf"
    assert build_spec(cfg).groups[1].activations != build_spec(for_implementation(cfg, "osdp")).groups[1].activations
    (tmp_path / "m.yaml").write_text(text + "implementation: torch\n")
    with pytest.raises(UserError) as e:
        load_model_config(str(tmp_path / "m.yaml"))
    assert str(e.value).startswith(f"{tmp_path / 'm.yaml'}: implementation:") and "osdp, hf" in str(e.value)
