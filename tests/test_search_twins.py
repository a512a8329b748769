"""Configurations that cost the same (a zero2 and a zero3 root): searched once, reported for both.

FSDP2 does not reshard the root after forward (docs/cost-model.md), so a plan costs the same
under both roots; the search runs the first of such twins and copies its plans to the other."""

import random
from dataclasses import replace

from searchfixtures import random_hw, random_plan, random_spec

from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.fast import Config, same_step_cost
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.plan.plan import GroupChoice
from osdp_sim.planner import bnb
from osdp_sim.planner.bnb import search
from osdp_sim.planner.problem import build_problem, same_costs
from osdp_sim.planner.space import SearchSpace, checkpoint_variants

GiB = 2**30


def _problems(spec, hw, mb, m, sg):
    v = checkpoint_variants(SearchSpace(), spec)[0]
    cache: dict = {}
    return {root: build_problem(spec, hw, Config(hw.device.count, mb, m, sg, "bf16", "adamw", root), v.choices,
                                v.options, cache)
            for root in ("ddp", "zero2", "zero3")}


def test_zero2_and_zero3_roots_are_twins_and_ddp_is_not():
    spec, hw = load_model("gpt2-124m"), load_profile("titan8")
    for mb, m, sg in ((1, 1, 8), (4, 2, 8), (2, 1, 4)):
        pb = _problems(spec, hw, mb, m, sg)
        assert same_costs(pb["zero2"], pb["zero3"]) and same_costs(pb["zero3"], pb["zero2"])
        assert not same_costs(pb["zero2"], pb["ddp"])
    other = _problems(spec, hw, 2, 1, 8)
    assert not same_costs(pb["zero2"], other["zero3"])             # another micro-batch


def test_a_root_step_that_differs_in_one_number_is_not_a_twin():
    spec, hw = load_model("gpt2-124m"), load_profile("titan8")
    pb = _problems(spec, hw, 2, 1, 8)
    head2, head3 = pb["zero2"].root.head, pb["zero3"].root.head
    assert same_step_cost(head2, head3)
    slower = replace(head3, unit=replace(head3.unit, all_gather_s=head3.unit.all_gather_s * 1.01))
    assert not same_step_cost(head2, slower)
    assert not same_step_cost(head2, replace(head3, grads_resident=not head3.grads_resident))


def test_estimate_costs_a_plan_the_same_under_a_zero2_and_a_zero3_root():
    """The premise, in the reference simulator: 60 random plans of random models and hardware."""
    rng = random.Random(7)
    for _ in range(60):
        spec, hw = random_spec(rng, rng.choice([2, 3])), random_hw(rng)
        plan = random_plan(rng, spec, hw)
        e2 = estimate(spec, hw, replace(plan, choices={**plan.choices, "root": GroupChoice("zero2")}))
        e3 = estimate(spec, hw, replace(plan, choices={**plan.choices, "root": GroupChoice("zero3")}))
        assert (e2.iteration_time_s, e2.peak_memory_bytes) == (e3.iteration_time_s, e3.peak_memory_bytes)


def test_a_twin_costs_no_search_and_gets_the_same_plans(monkeypatch):
    spec, hw = load_model("gpt2-350m"), load_profile("titan8")
    space = SearchSpace(splits=(1, 2), root_strategies=("zero2", "zero3"))
    both = search(spec, hw, 4 * GiB, space, time_limit_s=None, top_k=2)
    alone = search(spec, hw, 4 * GiB, replace(space, root_strategies=("zero2",)), time_limit_s=None, top_k=1)
    assert both.status == alone.status == "optimal"
    # the best plan under both roots, the zero2 one first (found first)
    assert [t.plan.choices["root"].strategy for t in both.top] == ["zero2", "zero3"]
    assert both.top[0].plan.choices == {**both.top[1].plan.choices, "root": GroupChoice("zero2")}
    assert both.top[0].prediction.samples_per_s == both.top[1].prediction.samples_per_s \
        == alone.prediction.samples_per_s
    assert both.configs == 2 * alone.configs and both.configs_searched == alone.configs_searched
    # without the merge the twins are searched too
    monkeypatch.setattr(bnb, "merge_twins", lambda cfgs: list(cfgs))
    separate = search(spec, hw, 4 * GiB, space, time_limit_s=None, top_k=2)
    assert [t.prediction.samples_per_s for t in separate.top] == [t.prediction.samples_per_s for t in both.top]
    assert separate.configs_searched > both.configs_searched and separate.nodes > both.nodes
