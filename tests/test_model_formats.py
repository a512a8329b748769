"""Plan and record format 2 (the model stage's new fields): every committed plan and record,
all written in format 1, still loads, with its model upgraded to the family defaults."""

import json
from pathlib import Path

import pytest

from osdp_sim.errors import UserError
from osdp_sim.model import BUILTIN, build_spec, load_model_config
from osdp_sim.model.config import V1_FIELDS, with_overrides
from osdp_sim.plan import load_plan, plan_to_dict, uniform_plan
from osdp_sim.plan.io import VERSION as PLAN_VERSION
from osdp_sim.records import load_record
from osdp_sim.records.record import VERSION as RECORD_VERSION

ROOT = Path(__file__).resolve().parents[1]
# Copies of validate/plans/*.json as committed in format 1 (validate/run_table.py regenerates the
# committed ones in the current format): the old format is checked on these.
PLANS = sorted((ROOT / "tests" / "data" / "plan-v1").glob("*.json"))
COMMITTED_PLANS = sorted((ROOT / "validate" / "plans").glob("*.json"))
RECORDS = sorted(p for p in (ROOT / "validate" / "records").rglob("*.json") if not p.name.startswith("."))


def test_versions_bumped():
    assert PLAN_VERSION == 3 and RECORD_VERSION == 3


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
    assert rec.model.source in ("", *(f"builtin:{n}" for n in BUILTIN))
    if rec.model.name in BUILTIN:
        assert build_spec(rec.model).param_count == build_spec(BUILTIN[rec.model.name]).param_count


def test_new_plan_holds_every_model_field(tmp_path):
    plan = uniform_plan(load_model_config("llama-tiny"), "zero3", devices=2, micro_batch=1)
    d = plan_to_dict(plan)
    assert d["version"] == 3 and d["model"]["source"] == "builtin:llama-tiny"
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


def test_committed_records_keep_their_names_in_format_2():
    """A campaign finds the records it made before the bump: the name a run gets from its plan
    written in format 2 is the name its format 1 record has."""
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
