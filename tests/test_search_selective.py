"""The search picks selective activation checkpointing where it pays, and the commands take it."""

import json

import pytest

from osdp_sim.cli.main import main
from osdp_sim.costmodel import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.baselines import uniform_baselines
from osdp_sim.planner.bnb import search
from osdp_sim.planner.report import plan_oneline
from osdp_sim.planner.space import SearchSpace

GiB = 2**30
LLAMA = with_overrides(BUILTIN["llama-7b"], n_layers=4, seq_len=2048)


def _space(checkpoint):
    return SearchSpace(strategies=("zero2", "zero3"), splits=(1,), checkpoint=checkpoint,
                       micro_batches=(1, 2, 4))


def test_selective_wins_under_a_limit_where_full_costs_recompute():
    # titan8, llama-7b shapes, 4 blocks, seq 2048: at 9 GiB micro-batch 4 fits with every block
    # selective but not unchecked; full checkpointing recomputes attention and every mm.
    spec, hw = build_spec(LLAMA), load_profile("titan8")
    limit = 9 * GiB
    full = search(spec, hw, limit, _space((False, True)), cache={})
    both = search(spec, hw, limit, _space((False, True, "selective")), cache={})
    assert full.status == both.status == "optimal"
    assert any(both.plan.selective) and not any(full.plan.selective)
    assert both.prediction.samples_per_s > full.prediction.samples_per_s * 1.02
    e = estimate(spec, hw, both.plan)                  # the reported numbers are estimate()'s
    assert e.samples_per_s == pytest.approx(both.prediction.samples_per_s, rel=1e-9)
    assert e.peak_memory_bytes <= limit
    assert "(selective)" in plan_oneline(both.plan)
    # without any limit to speak of, nothing is checkpointed either way
    loose = search(spec, hw, 80 * GiB, _space((False, True, "selective")), cache={})
    assert not any(loose.plan.checkpoint)


def test_uniform_baselines_try_selective_everywhere():
    spec, hw = build_spec(LLAMA), load_profile("titan8")
    b = uniform_baselines(spec, hw, 9 * GiB, _space((False, True, "selective")), strategies=("zero2",))
    assert b["zero2"].feasible and b["zero2"].checkpoint_label == "all selective"
    assert all(b["zero2"].plan.selective)


LLAMA_YAML = """family: llama
layers: 4
hidden: 4096
heads: 32
ffn: 11008
vocab: 32000
seq_len: 2048
tied_head: false
"""


def test_cli_search_and_estimate_take_selective(capsys, tmp_path):
    out = tmp_path / "plan.json"
    model = tmp_path / "llama4.yaml"
    model.write_text(LLAMA_YAML)
    assert main(["search", "--hw", "hwprofiles/titan8.yaml", "--model", str(model), "--mem-limit", "9GiB", "--strategies", "zero2,zero3",
                 "--no-split", "--micro-batch", "1,2,4", "--checkpoint-policy", "both",
                 "--json", "-o", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    plan = json.loads(out.read_text())
    assert plan["version"] == 4 and plan["selective"] == [0, 1, 2, 3]
    assert d["plan"]["selective"] == [0, 1, 2, 3]
    assert main(["estimate", "--hw", "hwprofiles/titan8.yaml", "--model", "llama-tiny",
                 "--strategy", "zero3", "--micro-batch", "2", "--checkpoint", "selective"]) == 0
    assert "(4 selective)" in capsys.readouterr().out


def test_selective_for_a_moe_model_is_one_line(capsys, tmp_path):
    moe = tmp_path / "moe.yaml"
    moe.write_text("family: llama\nlayers: 2\nhidden: 64\nheads: 4\nffn: 128\nvocab: 256\n"
                   "seq_len: 32\nexperts: 4\ntop_k: 2\n")
    rc = main(["estimate", "--hw", "hwprofiles/titan8.yaml", "--model", str(moe),
               "--strategy", "zero3", "--micro-batch", "2", "--checkpoint", "selective"])
    err = capsys.readouterr().err
    assert rc == 2 and "mixture-of-experts" in err and err.count("\n") == 1
