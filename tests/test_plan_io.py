"""Plan files: round trip, and malformed files give one clear line naming file and field."""

import json

import pytest

from osdp_sim.errors import UserError
from osdp_sim.model import load_model_config
from osdp_sim.plan import GroupChoice, load_plan, plan_to_dict, save_plan, uniform_plan

CFG = load_model_config("gpt2-tiny")


def _good() -> dict:
    plan = uniform_plan(CFG, "zero3", devices=2, micro_batch=4, checkpoint=True)
    choices = dict(plan.choices)
    choices["block1.mlp"] = GroupChoice("ddp", 4, 2)
    return plan_to_dict(plan.with_choices(choices=choices))


def test_round_trip(tmp_path):
    plan = uniform_plan(CFG, "zero2", devices=2, micro_batch=3, grad_accum=2, precision="fp32")
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan
    d = _good()
    (tmp_path / "q.json").write_text(json.dumps(d))
    q = load_plan(tmp_path / "q.json")
    assert q.choices["block1.mlp"] == GroupChoice("ddp", 4, 2)
    assert q.checkpoint == (True,) * 4


def test_group_given_as_plain_strategy_name(tmp_path):
    d = _good()
    d["groups"]["block0.attn"] = "ddp"
    (tmp_path / "p.json").write_text(json.dumps(d))
    assert load_plan(tmp_path / "p.json").choices["block0.attn"] == GroupChoice("ddp")


def _mut(fn):
    d = _good()
    fn(d)
    return d


BAD = [
    ("not json", "{oops", "line 1"),
    ("not an object", "[1, 2]", "JSON object"),
    ("wrong format", _mut(lambda d: d.update(format="other")), "format"),
    ("wrong version", _mut(lambda d: d.update(version=7)), "version"),
    ("unknown key", _mut(lambda d: d.update(speed=3)), "speed"),
    ("missing groups", _mut(lambda d: d.pop("groups")), "groups"),
    ("missing model", _mut(lambda d: d.pop("model")), "model"),
    ("zero devices", _mut(lambda d: d.update(devices=0)), "devices"),
    ("string micro-batch", _mut(lambda d: d.update(micro_batch="4")), "micro_batch"),
    ("shard group not dividing", _mut(lambda d: d.update(shard_group=3, devices=4)), "shard_group"),
    ("bad precision", _mut(lambda d: d.update(precision="fp8")), "precision"),
    ("bad optimizer", _mut(lambda d: d.update(optimizer="lamb")), "optimizer"),
    ("bad strategy", _mut(lambda d: d["groups"].update({"block0.attn": "zero4"})), "groups.block0.attn.strategy"),
    ("bad slices", _mut(lambda d: d["groups"].update({"block0.attn": {"strategy": "ddp", "slices": 3, "sharded_slices": 1}})), "slices"),
    ("too many sharded", _mut(lambda d: d["groups"].update({"block0.attn": {"strategy": "ddp", "slices": 2, "sharded_slices": 5}})), "sharded_slices"),
    ("split root", _mut(lambda d: d["groups"].update({"root": {"strategy": "zero3", "slices": 2}})), "root"),
    ("missing group", _mut(lambda d: d["groups"].pop("block2.mlp")), "block2.mlp"),
    ("extra group", _mut(lambda d: d["groups"].update({"block9.attn": "ddp"})), "block9.attn"),
    ("checkpoint out of range", _mut(lambda d: d.update(checkpoint=[0, 7])), "checkpoint"),
    ("bad model field", _mut(lambda d: d["model"].update(hidden=-1)), "hidden"),
    ("unknown model field", _mut(lambda d: d["model"].update(colour=1)), "colour"),
    ("model bool as text", _mut(lambda d: d["model"].update(tied_head="false")), "model.tied_head"),
    ("model name a number", _mut(lambda d: d["model"].update(name=5)), "model.name"),
    ("model float layers", _mut(lambda d: d["model"].update(n_layers=4.0)), "model.n_layers"),
    ("model bool hidden", _mut(lambda d: d["model"].update(hidden=True)), "model.hidden"),
    ("model negative type vocab", _mut(lambda d: d["model"].update(type_vocab_size=-2)), "model.type_vocab_size"),
    ("model not a mapping", _mut(lambda d: d.update(model=[1])), "model"),
]


@pytest.mark.parametrize("name,content,needle", BAD, ids=[b[0] for b in BAD])
def test_malformed_plan_files(tmp_path, name, content, needle):
    f = tmp_path / "plan.json"
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(UserError) as e:
        load_plan(f)
    msg = str(e.value)
    assert str(f) in msg and needle in msg and "\n" not in msg


def test_missing_plan_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_plan(tmp_path / "nope.json")


TYPED = [
    ("float slices 4.0", lambda d: d["groups"].update({"block0.mlp": {"strategy": "zero3", "slices": 4.0}}),
     "groups.block0.mlp.slices", "got 4.0"),
    ("float slices 2.0 is a slices error", lambda d: d["groups"].update(
        {"block0.mlp": {"strategy": "ddp", "slices": 2.0, "sharded_slices": 1}}),
     "groups.block0.mlp.slices", "whole number"),
    ("bool slices", lambda d: d["groups"].update({"block0.mlp": {"strategy": "zero3", "slices": True}}),
     "groups.block0.mlp.slices", "got true"),
    ("float sharded_slices", lambda d: d["groups"].update(
        {"block0.mlp": {"strategy": "ddp", "slices": 2, "sharded_slices": 1.0}}),
     "groups.block0.mlp.sharded_slices", "got 1.0"),
    ("strategy not text", lambda d: d["groups"].update({"block0.mlp": {"strategy": ["zero3"]}}),
     "groups.block0.mlp.strategy", 'got ["zero3"]'),
    ("strategy missing", lambda d: d["groups"].update({"block0.mlp": {"slices": 2}}),
     "groups.block0.mlp.strategy", "missing"),
    ("bool version", lambda d: d.update(version=True), "version", "unsupported"),
    ("float version", lambda d: d.update(version=1.0), "version", "unsupported"),
    ("float devices", lambda d: d.update(devices=2.0), "devices", "got 2.0"),
    ("bool micro-batch", lambda d: d.update(micro_batch=True), "micro_batch", "got true"),
    ("huge grad_accum", lambda d: d.update(grad_accum=10**40), "grad_accum", "1..2147483647"),
    ("negative shard group", lambda d: d.update(shard_group=-2), "shard_group", "got -2"),
    ("precision not text", lambda d: d.update(precision=16), "precision", "got 16"),
    ("optimizer null", lambda d: d.update(optimizer=None), "optimizer", "got null"),
    ("reduce flag as text", lambda d: d.update(reduce_every_microbatch="false"), "reduce_every_microbatch",
     'got "false"'),
    ("float checkpoint index", lambda d: d.update(checkpoint=[0.0]), "checkpoint", "whole numbers"),
    ("notes a list", lambda d: d.update(notes=[]), "notes", "object"),
]


@pytest.mark.parametrize("mutate,field,needle", [t[1:] for t in TYPED], ids=[t[0] for t in TYPED])
def test_plan_fields_are_type_checked_and_named(tmp_path, mutate, field, needle):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(_mut(mutate)))
    with pytest.raises(UserError) as e:
        load_plan(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: {field}: "), msg
    assert needle in msg and "\n" not in msg, msg


def test_plan_file_encoding_nesting_and_directory_errors(tmp_path):
    latin = tmp_path / "latin1.json"
    latin.write_bytes(json.dumps(_good()).replace("zero3", "z\u00e9ro3", 1).encode("latin-1"))
    with pytest.raises(UserError, match=rf"^{latin}: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_plan(latin)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    with pytest.raises(UserError, match=rf"^{deep}: not a usable JSON file \(nested too deeply\)"):
        load_plan(deep)
    with pytest.raises(UserError, match=rf"^{tmp_path}: is a directory, not a plan file"):
        load_plan(tmp_path)


def test_saved_plan_has_the_umask_mode(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        save_plan(uniform_plan(CFG, "zero3", devices=2, micro_batch=1), tmp_path / "p.json")
    finally:
        os.umask(old)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644


def test_a_layer_count_that_does_not_match_the_groups_is_named_without_building_the_model(tmp_path):
    import time
    d = _good()
    d["model"]["n_layers"] = 100_000                         # the most a model may have: named at once
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"plan\.json: groups\.block4\.attn: missing; the model 'gpt2-tiny' "
                                        r"has 100000 blocks"):
        load_plan(f)
    assert time.monotonic() - t0 < 5
    d["model"]["n_layers"] = 4 * 10**9                      # beyond it: the model field itself is named
    f.write_text(json.dumps(d))
    with pytest.raises(UserError, match=r"plan\.json: model\.n_layers: must be a whole number in 1\.\.100000"):
        load_plan(f)


# ---- format 4: selective activation checkpointing (issue 16) ----

def test_selective_blocks_round_trip_and_are_written_as_indices(tmp_path):
    plan = uniform_plan(CFG, "zero3", devices=2, micro_batch=2, checkpoint=True)
    plan = plan.with_choices(selective=(True, False, True, False))
    save_plan(plan, tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["version"] == 4 and d["selective"] == [0, 2] and d["checkpoint"] == [0, 1, 2, 3]
    back = load_plan(tmp_path / "p.json")
    assert back == plan
    assert [back.checkpoint_policy(i) for i in range(4)] == ["selective", "full", "selective", "full"]


def test_a_plan_without_selective_blocks_has_no_selective_key():
    d = plan_to_dict(uniform_plan(CFG, "zero3", devices=2, micro_batch=2, checkpoint=True))
    assert "selective" not in d


@pytest.mark.parametrize("value,needle", [([5], "not in checkpoint"), ([True], "block indices"),
                                          ("0", "block indices")])
def test_bad_selective_lists_are_named(tmp_path, value, needle):
    d = _good()
    d["checkpoint"] = [0, 1]
    d["selective"] = value
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        load_plan(tmp_path / "p.json")
    assert "selective" in str(e.value) and needle in str(e.value) and "p.json" in str(e.value)


def test_a_format_3_file_cannot_say_selective(tmp_path):
    d = _good()
    d["version"] = 3
    d["selective"] = [0]
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="selective"):
        load_plan(tmp_path / "p.json")


def test_format_3_fixture_loads_with_full_checkpointing():
    from pathlib import Path
    path = Path(__file__).parent / "data" / "plan-v3" / "llama-tiny-mixed-ckpt.json"
    assert json.loads(path.read_text())["version"] == 3
    plan = load_plan(path)
    assert plan.checkpoint == (True, False, False, False)
    assert plan.selective == (False,) * 4 and plan.checkpoint_policy(0) == "full"
    assert plan.choices["block0.mlp"] == GroupChoice("zero2", 2, 1)


def test_selective_needs_a_checkpointed_block():
    plan = uniform_plan(CFG, "zero3", devices=2, micro_batch=2)
    with pytest.raises(ValueError, match="checkpointed"):
        plan.with_choices(selective=(True, False, False, False))
    assert uniform_plan(CFG, "zero3", devices=2, micro_batch=2, checkpoint="selective").selective == (True,) * 4
