"""The OSDP knapsack DP: exact on additive instances, its costs reproduce uniform plans, and the
batch loop keeps the highest throughput (the prototype kept the least time per iteration)."""

import itertools

import numpy as np
import pytest

from hwfixtures import GiB, simple_hw
from osdp_sim.costmodel import estimate
from osdp_sim.model.load import load_model
from osdp_sim.plan import GroupChoice
from osdp_sim.planner.knapsack import (MiB, BlockChoice, Setting, full_block_choices, item_costs,
                                      knapsack_dp, knapsack_search, make_plan, paper_block_choices)


def brute_force(weights, times, budget):
    best = None
    for combo in itertools.product(*[range(len(w)) for w in weights]):
        w = sum(weights[i][c] for i, c in enumerate(combo))
        t = sum(times[i][c] for i, c in enumerate(combo))
        if w <= budget and (best is None or t < best[0]):
            best = (t, w, combo)
    return best


def test_dp_hand_computed():
    # Two items; budget 5: (w 2, t 3) + (w 3, t 1) = time 4 beats (w 1, t 5) + (w 3, t 1) = 6.
    sol = knapsack_dp([[2, 1], [3, 0]], [[3.0, 5.0], [1.0, 4.0]], 5)
    assert sol.choices == (0, 0) and sol.time_s == 4.0 and sol.memory_mib == 5
    # Budget 3: item 1 can no longer take its fast choice with item 0's: 3 + 4 = 7 vs 5 + 1 = 6.
    sol = knapsack_dp([[2, 1], [3, 0]], [[3.0, 5.0], [1.0, 4.0]], 4)
    assert sol.choices == (1, 0) and sol.time_s == 6.0
    assert knapsack_dp([[2, 1], [3, 1]], [[1.0, 1.0], [1.0, 1.0]], 1) is None


@pytest.mark.parametrize("seed", range(12))
def test_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    items = int(rng.integers(2, 6))
    weights = [list(rng.integers(0, 40, size=int(rng.integers(1, 5)))) for _ in range(items)]
    times = [list(rng.uniform(0.1, 10.0, size=len(w))) for w in weights]
    budget = int(rng.integers(0, 40 * items))
    sol, ref = knapsack_dp(weights, times, budget), brute_force(weights, times, budget)
    if ref is None:
        assert sol is None
        return
    assert sol.time_s == pytest.approx(ref[0], rel=1e-12)
    assert sol.memory_mib <= budget
    assert sum(weights[i][c] for i, c in enumerate(sol.choices)) == sol.memory_mib
    # The final row is the best time for every smaller budget too.
    for b in range(0, budget + 1, max(1, budget // 7)):
        r = brute_force(weights, times, b)
        assert sol.best_time_by_budget_s[b] == (pytest.approx(r[0]) if r else np.inf)


def test_paper_choices_are_the_four_shard_or_not_combinations():
    labels = {c.label() for c in paper_block_choices()}
    assert labels == {"attn zero2, mlp zero2", "attn zero2, mlp zero3", "attn zero3, mlp zero2",
                      "attn zero3, mlp zero3"}
    full = full_block_choices((GroupChoice("ddp"), GroupChoice("zero3")), (False, True))
    assert len(full) == 8


def test_item_costs_reproduce_uniform_plans():
    spec = load_model("gpt2-tiny")
    hw = simple_hw(count=4, per_node=4, busbw_gbps=5.0, latency_s=20e-6, launch_s=5e-6)
    setting = Setting(4, 2, 1, 4, "bf16", "adamw")
    choices = paper_block_choices() + (BlockChoice(GroupChoice("ddp"), GroupChoice("ddp"), True),)
    costs = item_costs(spec, hw, setting, choices, ("ddp", "zero3"))
    n = spec.config.n_layers
    root = costs.root_choices.index("zero3")
    for i, c in enumerate(choices):
        e = estimate(spec, hw, make_plan(spec, setting, "zero3", c))
        dp_bytes = costs.base_bytes + (costs.weights_mib[0][root] + n * costs.weights_mib[1][i]) * MiB
        dp_s = costs.base_s + costs.times_s[0][root] + n * costs.times_s[1][i]
        assert dp_s == pytest.approx(e.iteration_time_s, rel=1e-9)
        # Rounding each item up to whole MiB over-counts by less than one MiB per item.
        assert 0 <= dp_bytes - e.peak_memory_bytes < (n + 1) * MiB


def test_batch_loop_keeps_the_highest_throughput_not_the_least_step_time():
    spec = load_model("gpt2-tiny")
    hw = simple_hw(count=4, per_node=4, busbw_gbps=5.0, latency_s=20e-6, launch_s=5e-6)
    settings = [Setting(4, mb, 1, 4, "bf16", "adamw") for mb in (1, 2, 4, 8)]
    res = knapsack_search(spec, hw, 4 * GiB, settings, paper_block_choices(), ("zero2", "zero3"))
    assert res.status == "solved" and all(c.fits for c in res.candidates)
    fastest_step = min(res.candidates, key=lambda c: c.estimate.iteration_time_s)
    best = max(res.candidates, key=lambda c: c.samples_per_s)
    assert fastest_step.setting.micro_batch == 1           # what the prototype would have kept
    assert res.plan.micro_batch == best.setting.micro_batch == 8
    assert res.estimate.samples_per_s == estimate(spec, hw, res.plan).samples_per_s
    assert res.estimates == 4 * (2 + 3 + 1 + 1)


def test_nothing_fits_is_infeasible_not_a_crash():
    spec = load_model("gpt2-tiny")
    hw = simple_hw(count=4, per_node=4)
    res = knapsack_search(spec, hw, 1 * MiB, [Setting(4, 1, 1, 4, "bf16", "adamw")],
                          paper_block_choices(), ("zero3",))
    assert res.status == "infeasible" and res.plan is None and not res.feasible
    assert res.candidates[0].estimate is None


def test_separable_costs_compose_block_choices_from_one_group_kind_at_a_time():
    spec = load_model("gpt2-tiny")
    hw = simple_hw(count=4, per_node=4, busbw_gbps=5.0, latency_s=20e-6, launch_s=5e-6)
    setting = Setting(4, 2, 1, 4, "bf16", "adamw")
    groups = (GroupChoice("zero3"), GroupChoice("zero2"), GroupChoice("ddp", 2, 1))
    choices = full_block_choices(groups, (False,))
    assert choices[0] == BlockChoice(groups[0], groups[0], False)          # the reference
    sep = item_costs(spec, hw, setting, choices, ("zero3",), separable=True)
    joint = item_costs(spec, hw, setting, choices, ("zero3",))
    assert (sep.estimates, joint.estimates) == (2 + 4, 2 + 8)
    n = spec.config.n_layers
    for i, c in enumerate(choices):
        e = estimate(spec, hw, make_plan(spec, setting, "zero3", c))
        dp_s = sep.base_s + sep.times_s[0][0] + n * sep.times_s[1][i]
        if c.attn == groups[0] or c.mlp == groups[0]:      # one group kind differs: exact
            assert dp_s == pytest.approx(e.iteration_time_s, rel=1e-9)
            assert sep.times_s[1][i] == pytest.approx(joint.times_s[1][i], rel=1e-9)
        else:                              # both differ: composed, close (0.25% and 0.46% here)
            assert dp_s == pytest.approx(e.iteration_time_s, rel=0.01)
