"""The search report: the plan compressed into runs of blocks, the JSON object, the explanation."""

import json

import pytest

from osdp_sim.costmodel import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.plan import GroupChoice, plan_from_dict, uniform_plan
from osdp_sim.planner.baselines import knapsack_baseline, uniform_baselines
from osdp_sim.planner.bnb import search
from osdp_sim.planner.knapsack import osdp_knapsack
from osdp_sim.planner.report import (composition, describe_choice, explain, format_report, result_to_json,
                                    summarize_plan, uniform_zero3_like)
from osdp_sim.planner.space import SearchSpace

SPEC = load_model("gpt2-tiny")
HW = load_profile("titan8")
MiB = 2**20


def mixed_plan():
    p = uniform_plan(SPEC.config, "zero3", devices=8, micro_batch=2)
    ch = dict(p.choices)
    for i in (0, 1):
        ch[f"block{i}.attn"] = GroupChoice("ddp")
        ch[f"block{i}.mlp"] = GroupChoice("zero2", 4, 2)
    ch["block3.attn"] = GroupChoice("zero3", 4, 4)
    ch["root"] = GroupChoice("zero2")
    return p.with_choices(choices=ch, checkpoint=(False, False, True, True))


def test_choices_in_words():
    assert describe_choice(GroupChoice("ddp")) == "ddp"
    assert describe_choice(GroupChoice("zero3", 4, 4)) == "zero3 in 4 slices"
    assert describe_choice(GroupChoice("zero2", 4, 1)) == "zero2, 1/4 slices zero3"


def test_plan_compressed_into_runs_of_identical_blocks():
    assert summarize_plan(mixed_plan()) == [
        "blocks 0-1: attention ddp, mlp zero2, 2/4 slices zero3",
        "block 2: attention zero3, mlp zero3, checkpointed",
        "block 3: attention zero3 in 4 slices, mlp zero3, checkpointed",
        "root (embedding + head): zero2",
    ]
    assert summarize_plan(uniform_plan(SPEC.config, "zero3", devices=8, micro_batch=1)) == [
        "blocks 0-3: attention zero3, mlp zero3", "root (embedding + head): zero3"]
    assert composition(mixed_plan()) == ("attention: 2 ddp, 1 zero3, 1 zero3 in 4 slices; "
                                         "MLP: 2 zero2, 2/4 slices zero3, 2 zero3")


def test_explanation_compares_with_uniform_zero3_at_the_same_batch():
    plan = mixed_plan()
    est = estimate(SPEC, HW, plan)
    z3 = estimate(SPEC, HW, uniform_zero3_like(plan))
    assert uniform_zero3_like(plan).checkpoint == plan.checkpoint
    text = explain(SPEC, HW, plan, est, {})
    assert text.startswith("The plan keeps the parameters of 4 of 8 block groups from forward to backward "
                           "with ZeRO-2 or DDP instead of re-sharding them (2 of them with some slices on "
                           "ZeRO-3) and re-shards the other 4 with ZeRO-3 (1 of them split into slices "
                           "gathered one at a time) (attention: 2 ddp")
    # On this tiny model the extra slices cost more latency than the unsharded groups save.
    assert est.iteration_time_s > z3.iteration_time_s
    assert f"raises the step from {z3.iteration_time_s * 1e3:.2f} ms to {est.iteration_time_s * 1e3:.2f} ms" in text
    uniform = uniform_plan(SPEC.config, "zero3", devices=8, micro_batch=2)
    text = explain(SPEC, HW, uniform, estimate(SPEC, HW, uniform), {})
    assert text.startswith("The plan re-shards all 8 block groups with ZeRO-3 (attention: 4 zero3; MLP: 4 zero3; root zero3). "
                           "Against uniform ZeRO-3 at the same batch (micro-batch 2 x 1, 0 of 4 blocks "
                           "checkpointed) it leaves all-gather time per step at")


SPACE = SearchSpace(strategies=("ddp", "zero2", "zero3"), splits=(1, 2), checkpoint=(False, True),
                    micro_batches=(1, 2, 4), global_batch=None, shard_groups=(8,), precision="bf16",
                    optimizer="adamw", devices=8, root_strategies=("ddp", "zero2", "zero3"))


@pytest.fixture(scope="module")
def found():
    limit = 400 * MiB
    res = search(SPEC, HW, limit, SPACE, top_k=3)
    base = uniform_baselines(SPEC, HW, limit, SPACE)
    base["osdp_knapsack"] = knapsack_baseline(osdp_knapsack(SPEC, HW, limit, SPACE))
    return limit, res, base


def test_json_object(found):
    limit, res, base = found
    d = json.loads(json.dumps(result_to_json(SPEC, HW, limit, res, base, explanation="because")))
    assert plan_from_dict(d["plan"]) == res.plan
    assert d["predicted"]["samples_per_s"] == res.prediction.samples_per_s
    assert d["predicted"]["peak_memory_bytes"] == res.prediction.peak_memory_bytes <= limit
    assert set(d["baselines"]) == {"ddp", "zero2", "zero3", "osdp_knapsack"}
    for name, b in d["baselines"].items():
        assert b["feasible"] == base[name].feasible
        if b["feasible"]:
            assert b["speedup"] == pytest.approx(res.prediction.samples_per_s / b["samples_per_s"])
            assert b["speedup"] >= 1 - 1e-12          # the exact search never loses to a baseline
    assert d["search"]["optimal"] == (res.status == "optimal")
    assert d["search"]["nodes"] == res.nodes and d["why"] == "because"
    assert len(d["top"]) == len(res.top) and d["top"][0]["samples_per_s"] == res.prediction.samples_per_s


def test_text_report(found):
    limit, res, base = found
    text = format_report(SPEC, HW, limit, res, base, explanation="because", top_k=3)
    for needle in ("plan\n  block", "root (embedding + head):", "peak memory", "of 400.00 MiB limit",
                   "iteration time", "exposed", "samples/s", "tokens/s", "MFU", "uniform ZeRO-3 (FSDP)",
                   "OSDP knapsack DP", f"status {res.status}", "why\n  because"):
        assert needle in text
    zero3 = base["zero3"]
    assert f"{res.prediction.samples_per_s / zero3.samples_per_s:.2f}x" in text


def test_gain_over_the_strongest_baseline_is_called_small_below_five_percent():
    # The CPU case of issue 15 (gpt2-small-cpu, calibrated 2-core profile, 260 MiB, micro-batches
    # 1,2,3,4,6,8): the search predicts 6.08 samples/s, 1.11x uniform ZeRO-3 all-checkpointed,
    # but ZeRO-3 with 5 of 8 blocks checkpointed reaches 6.02: the gain over it is about 1%.
    from osdp_sim.planner.baselines import per_block_baselines
    spec, hw = load_model("gpt2-small-cpu"), load_profile("hwprofiles/cpu-2core-calibrated.yaml")
    space = SearchSpace(micro_batches=(1, 2, 3, 4, 6, 8))
    limit = 260 * MiB
    res = search(spec, hw, limit, space)
    base = uniform_baselines(spec, hw, limit, space)
    base.update(per_block_baselines(spec, hw, limit, space))
    z3, pb = base["zero3"], base["zero3_per_block"]
    assert pb.samples_per_s > z3.samples_per_s and 0 < sum(pb.plan.checkpoint) < 8
    gain = res.prediction.samples_per_s / pb.samples_per_s - 1
    assert 0 <= gain < 0.05
    why = explain(spec, hw, res.plan, res.prediction, base)
    assert f"the gain is small, {gain:.1%}" in why and "ZeRO-3, per-block ckpt" in why
    text = format_report(spec, hw, limit, res, base)
    row = next(line for line in text.splitlines() if "ZeRO-3, per-block ckpt" in line)
    assert f"{pb.samples_per_s:.2f}" in row and " 2 " in row          # shards over both ranks


def test_a_large_gain_is_stated_plainly(found):
    limit, res, base = found
    from osdp_sim.planner.report import SMALL_GAIN, strongest_baseline
    b = strongest_baseline(base)
    why = explain(SPEC, HW, res.plan, res.prediction, base)
    gain = res.prediction.samples_per_s / b.samples_per_s - 1
    assert ("gain is small" in why) == (gain < SMALL_GAIN)
    assert f"{gain:.1%}" in why
