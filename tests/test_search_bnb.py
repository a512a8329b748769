"""search() against brute force: every plan of a small space evaluated with estimate().

Random instances: 2-4 blocks (identical or of different widths), random hardware numbers,
random subsets of the choices, random limits including ones nothing fits. The optimum's
samples/s must be identical, and the plan too when the brute-force optimum is unique."""

import random
from dataclasses import replace

import pytest
from searchfixtures import enumerate_space, random_hw, random_spec

from osdp_sim.costmodel import estimate
from osdp_sim.errors import UserError
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import STRATEGIES
from osdp_sim.planner import bnb
from osdp_sim.planner.bnb import pareto_front, search
from osdp_sim.planner.space import SearchSpace, group_choices

N_INSTANCES = 200


def _instance(rng: random.Random):
    layers = rng.choice([2, 2, 3, 4])
    spec = random_spec(rng, layers)
    hw = random_hw(rng)
    budget = {2: 40, 3: 8, 4: 4}[layers]          # choices^(2L) * ... kept to a few hundred plans
    while True:
        strategies = tuple(s for s in STRATEGIES if rng.random() < 0.6) or ("zero3",)
        space = SearchSpace(strategies=strategies, splits=rng.choice([(1,), (1, 2), (1, 4)]),
                            checkpoint=rng.choice([(False,), (True,), (False, True)]),
                            micro_batches=rng.choice([(1,), (2,), (1, 2)]),
                            root_strategies=tuple(s for s in STRATEGIES if rng.random() < 0.5) or ("zero2",),
                            precision=rng.choice(["bf16", "fp32"]))
        n = len(group_choices(space)) ** (2 * layers) * len(space.checkpoint) ** layers
        if n * len(space.micro_batches) * len(space.roots) <= budget * 8:
            return spec, hw, space


_BRUTE: dict = {}


def _brute(spec, hw, space):
    """(samples/s, peak bytes, plan) of every plan of the space by estimate(). Kept per instance
    (its contents as the key): the probe variants of a test draw the same instances from the same
    seeds, and estimate() does not read the search's settings they patch. The brute force is
    most of these tests' time (about 1.7 ms per plan)."""
    key = (spec, repr(hw), space)
    if key not in _BRUTE:
        out = []
        for plan in enumerate_space(spec, hw, space):
            e = estimate(spec, hw, plan)
            out.append((e.samples_per_s, e.peak_memory_bytes, plan))
        _BRUTE[key] = tuple(out)
    return list(_BRUTE[key])


def _same_plan(a, b):
    return (a.choices == b.choices and a.checkpoint == b.checkpoint and a.micro_batch == b.micro_batch
            and a.shard_group == b.shard_group)


def _merged_graphs_only(monkeypatch, grid_fraction):
    """Every key graph over real keys is 'too large', so the search builds it over merged keys
    (merged.py), here rounding the queued work to grid_fraction of a decision's mean time."""
    import osdp_sim.planner.dp as dp
    import osdp_sim.planner.merged as merged
    real = dp.KeyGraph

    def graph(engine, *a, **k):
        if isinstance(engine, dp.Engine):
            raise dp.TooLarge
        return real(engine, *a, **k)
    monkeypatch.setattr(dp, "KeyGraph", graph)
    monkeypatch.setattr(merged, "GRID_FRACTION", grid_fraction)


@pytest.mark.parametrize("chunk", range(4))
@pytest.mark.parametrize("probe", ["default", "graph", "merged", "merged-coarse"])
def test_search_equals_brute_force(chunk, probe, monkeypatch):
    """probe="graph": no probe with the relaxed bounds, so every configuration that is not ruled
    out goes through the key graph (keygraph.py) and the exact search on it; "merged": the same
    over merged keys (merged.py), "merged-coarse" with the queued work rounded to 30% of a
    decision's mean time."""
    if probe != "default":
        monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0))
    if probe.startswith("merged"):
        _merged_graphs_only(monkeypatch, 0.3 if probe == "merged-coarse" else 0.01)
    rng = random.Random(1000 + chunk)
    checked = unique = infeasible = graphs = 0
    for _ in range(N_INSTANCES // 4):
        spec, hw, space = _instance(rng)
        plans = _brute(spec, hw, space)
        peaks = sorted(p[1] for p in plans)
        r = rng.random()
        limit = peaks[0] * 0.98 if r < 0.1 else peaks[rng.randrange(len(peaks))] * rng.choice([1.0, 1.0 + 1e-7])
        feas = sorted((p for p in plans if p[1] <= limit), key=lambda p: -p[0])
        cache: dict = {}
        res = search(spec, hw, limit, space, cache=cache)
        graphs += sum(e.graph is not None and (e.graph.view is not None) == probe.startswith("merged")
                      for e in cache["engines"].values())
        if not feas:
            infeasible += 1
            assert res.status == "infeasible"
            assert res.min_peak_memory_bytes == pytest.approx(peaks[0], rel=1e-9)
            assert estimate(spec, hw, res.min_peak_plan).peak_memory_bytes == pytest.approx(peaks[0], rel=1e-9)
            continue
        checked += 1
        assert res.status == "optimal"
        assert res.prediction.samples_per_s == pytest.approx(feas[0][0], rel=1e-9)
        assert res.prediction.peak_memory_bytes <= limit
        if len(feas) == 1 or feas[1][0] < feas[0][0] * (1 - 1e-9):
            unique += 1
            assert _same_plan(res.plan, feas[0][2])
    assert checked + infeasible == N_INSTANCES // 4
    assert unique > 0 and infeasible > 0
    assert (graphs > 0) == (probe != "default")


@pytest.mark.parametrize("probe", ["default", "graph", "merged-coarse"])
def test_top_k_sorted_and_equal_to_brute_force(probe, monkeypatch):
    if probe != "default":
        monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0))
    if probe == "merged-coarse":
        _merged_graphs_only(monkeypatch, 0.3)
    rng = random.Random(77)
    for _ in range(6):
        spec, hw, space = _instance(rng)
        plans = _brute(spec, hw, space)
        limit = sorted(p[1] for p in plans)[len(plans) // 2]
        feas = sorted((p[0] for p in plans if p[1] <= limit), reverse=True)
        res = search(spec, hw, limit, space, top_k=3)
        got = [t.prediction.samples_per_s for t in res.top]
        assert all(a >= b * (1 - 1e-9) for a, b in zip(got, got[1:]))   # ties may differ in the last bit
        assert got == pytest.approx(feas[:3], rel=1e-9)


def test_deterministic():
    hw = load_profile("titan8")
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=6))
    space = SearchSpace(splits=(1, 2), micro_batches=(2, 4))
    a = search(spec, hw, 3 * 2**30, space)
    b = search(spec, hw, 3 * 2**30, space)
    assert a.status == b.status == "optimal"
    assert _same_plan(a.plan, b.plan)
    assert (a.nodes, a.leaves) == (b.nodes, b.leaves)


def test_time_limit_reports_best_and_gap():
    hw = load_profile("titan8")
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=12))
    space = SearchSpace(micro_batches=(2, 4))
    full = search(spec, hw, 4 * 2**30, space)
    assert full.status == "optimal" and full.gap == 0.0 and full.open_configs == ()
    # a deadline already passed: nothing searched, and the bound still covers the optimum
    none = search(spec, hw, 4 * 2**30, space, time_limit_s=0.0)
    assert none.status == "time_limit" and none.plan is None
    assert none.best_bound_samples_per_s >= full.prediction.samples_per_s * (1 - 1e-9)
    # a deadline part of the way: either stopped with a plan and a gap, or finished (a fast machine)
    res = search(spec, hw, 4 * 2**30, space, time_limit_s=0.2)      # here: a plan, gap about 14%
    if res.status == "time_limit":
        assert res.best_bound_samples_per_s >= full.prediction.samples_per_s * (1 - 1e-9)
        if res.plan is not None:
            got = res.prediction.samples_per_s
            assert res.gap == pytest.approx((res.best_bound_samples_per_s - got) / got)
            assert res.prediction.samples_per_s <= full.prediction.samples_per_s * (1 + 1e-9)
            # what is left open, and why, is named: configurations whose bound beats the plan found
            assert res.open_configs and "open: micro-batch" in res.message
            for o in res.open_configs:
                assert o.bound_samples_per_s > res.prediction.samples_per_s
                assert o.micro_batch in (2, 4)
                assert o.reason in ("key graph over the caps", "not finished within the time limit")
    else:
        assert res.status == "optimal"
        assert res.prediction.samples_per_s == pytest.approx(full.prediction.samples_per_s, rel=1e-9)


def test_infeasible_reports_least_peak():
    hw = load_profile("titan8")
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=4))
    res = search(spec, hw, 2**28, SearchSpace(splits=(1,), micro_batches=(1, 2)))
    assert res.status == "infeasible" and res.plan is None
    assert res.min_peak_memory_bytes > 2**28
    assert estimate(spec, hw, res.min_peak_plan).peak_memory_bytes == pytest.approx(res.min_peak_memory_bytes)
    assert "least peak memory" in res.message


def test_pareto_front_points_equal_search_at_their_limit():
    rng = random.Random(5)
    for _ in range(3):
        spec, hw, space = _instance(rng)
        pr = pareto_front(spec, hw, space, mem_range=(0.0, 1e15))
        plans = _brute(spec, hw, space)
        assert pr.front
        peaks = [p[0] for p in pr.front]
        assert peaks == sorted(peaks)
        for peak, sps, plan in pr.front:
            res = search(spec, hw, peak, space)
            assert res.prediction.samples_per_s == pytest.approx(sps, rel=1e-9)
            best = max(p[0] for p in plans if p[1] <= peak)
            assert sps == pytest.approx(best, rel=1e-9)


def _front_of(points, rel=1e-9):
    """(peak, samples/s) of the points no other beats at no more memory, by peak: each more than
    rel faster than every point of less peak."""
    out, best = [], -1.0
    for peak, sps in sorted(points, key=lambda p: (p[0], -p[1])):
        if sps > best * (1 + rel):
            out.append((peak, sps))
            best = sps
    return out


def test_pareto_front_is_the_brute_force_front():
    """Every point of the exact front, none missing, none extra: the front's passes are seeded
    with the uniform plans, so a point only they reach, or one they shadow, would show here."""
    rng = random.Random(11)
    for _ in range(12):
        spec, hw, space = _instance(rng)
        pr = pareto_front(spec, hw, space, mem_range=(0.0, 1e15))
        want = _front_of([(peak, sps) for sps, peak, _plan in _brute(spec, hw, space)])
        got = _front_of([(peak, sps) for peak, sps, _plan in pr.front])
        assert len(got) == len(want)
        for (gp, gs), (wp, ws) in zip(got, want):
            assert gp == pytest.approx(wp, rel=1e-9) and gs == pytest.approx(ws, rel=1e-9)


def test_shared_cache_gives_the_same_optimum_at_every_limit():
    """A sweep shares cost and stage tables between search() calls (cache=...): each call must
    return what a fresh search returns, at limits that fit, bind and fit nothing."""
    rng = random.Random(77)
    for _ in range(6):
        spec, hw, space = _instance(rng)
        cache: dict = {}
        for frac in (1.0, 0.6, 0.3, 0.05):
            limit = frac * 2**30 * rng.choice([0.05, 0.5, 4.0])
            fresh = search(spec, hw, limit, space)
            shared = search(spec, hw, limit, space, cache=cache)
            assert shared.status == fresh.status
            if fresh.plan is not None:
                assert shared.prediction.samples_per_s == pytest.approx(fresh.prediction.samples_per_s, rel=1e-12)
        assert cache["engines"]                 # the tables were kept


@pytest.mark.parametrize("probe", ["default", "graph"])
def test_gap_tolerance_is_certified_against_brute_force(probe, monkeypatch):
    """rel_gap: the plan returned is within the tolerance of the optimum, the bound still covers
    the optimum and the gap reported is at most the tolerance; on some instances the tolerance
    really cuts the search short (a plan below the optimum is returned)."""
    if probe == "graph":
        monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0))
    rng = random.Random(77)
    checked = short = 0
    for _ in range(40):
        spec, hw, space = _instance(rng)
        plans = _brute(spec, hw, space)
        peaks = sorted(p[1] for p in plans)
        limit = peaks[rng.randrange(len(peaks))]
        best = max(p[0] for p in plans if p[1] <= limit)
        rel_gap = rng.choice([0.02, 0.1, 0.3])
        res = search(spec, hw, limit, space, rel_gap=rel_gap)
        assert res.status in ("optimal", "within_gap")
        got = res.prediction.samples_per_s
        assert res.prediction.peak_memory_bytes <= limit
        assert got * (1 + rel_gap) >= best * (1 - 1e-9)
        assert res.best_bound_samples_per_s >= best * (1 - 1e-9)
        assert res.gap <= rel_gap + 1e-9          # the fast model and estimate() agree to ~1e-10
        assert res.gap == pytest.approx((res.best_bound_samples_per_s - got) / got)
        checked += 1
        short += got < best * (1 - 1e-9)
    assert checked == 40 and short > 0


def test_gap_tolerance_must_be_below_one():
    hw = load_profile("titan8")
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=2))
    with pytest.raises(UserError, match="gap tolerance"):
        search(spec, hw, 4 * 2**30, SearchSpace(micro_batches=(1,)), rel_gap=1.0)


def _selective_instance(rng: random.Random):
    """Small spaces with selective checkpointing: llama (bias-free: SAC saves mms, and split
    slices change what it saves) or gpt2 (all addmm), 2 blocks."""
    if rng.random() < 0.6:
        cfg = with_overrides(BUILTIN["llama-tiny"], n_layers=2, hidden=rng.choice([64, 128]),
                             seq_len=rng.choice([16, 64, 128]), vocab_size=rng.choice([256, 2048]))
        spec = build_spec(cfg)
    else:
        spec = random_spec(rng, 2)
    hw = random_hw(rng)
    while True:
        strategies = tuple(s for s in STRATEGIES if rng.random() < 0.5) or ("zero3",)
        space = SearchSpace(strategies=strategies, splits=rng.choice([(1,), (1, 2)]),
                            checkpoint=rng.choice([(False, "selective"), (False, True, "selective"),
                                                   ("selective",), (True, "selective")]),
                            micro_batches=rng.choice([(1,), (2,), (1, 4)]),
                            root_strategies=(rng.choice(STRATEGIES),),
                            precision=rng.choice(["bf16", "fp32"]))
        if len(group_choices(space)) ** 4 * len(space.micro_batches) <= 600:
            return spec, hw, space


@pytest.mark.parametrize("chunk", range(2))
@pytest.mark.parametrize("probe", ["default", "graph", "merged"])
def test_search_with_selective_checkpointing_equals_brute_force(chunk, probe, monkeypatch):
    if probe != "default":
        monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0))
    if probe == "merged":
        _merged_graphs_only(monkeypatch, 0.01)
    rng = random.Random(5000 + chunk)
    checked = with_selective = infeasible = 0
    for _ in range(20):
        spec, hw, space = _selective_instance(rng)
        plans = _brute(spec, hw, space)
        peaks = sorted(p[1] for p in plans)
        limit = peaks[0] * 0.98 if rng.random() < 0.1 else peaks[rng.randrange(len(peaks))]
        feas = sorted((p for p in plans if p[1] <= limit), key=lambda p: -p[0])
        res = search(spec, hw, limit, space, cache={})
        if not feas:
            infeasible += 1
            assert res.status == "infeasible"
            assert res.min_peak_memory_bytes == pytest.approx(peaks[0], rel=1e-9)
            continue
        checked += 1
        assert res.status == "optimal"
        assert res.prediction.samples_per_s == pytest.approx(feas[0][0], rel=1e-9)
        assert res.prediction.peak_memory_bytes <= limit
        assert not (any(res.plan.selective) and not all(
            s for s, c in zip(res.plan.selective, res.plan.checkpoint) if c))   # one policy per plan
        with_selective += any(res.plan.selective)
    assert checked > 0 and with_selective > 0


def test_tuning_reaches_the_phases_and_changes_no_result():
    """search(tuning=): with no probe every configuration left goes through its key graph (the
    default probe finishes these small ones without one), and the plan and bound are the same."""
    from osdp_sim.planner.tuning import SearchTuning
    rng = random.Random(31)
    graphs = 0
    for _ in range(8):
        spec, hw, space = _instance(rng)
        limit = sorted(p[1] for p in _brute(spec, hw, space))[-1]
        plain_cache: dict = {}
        tuned_cache: dict = {}
        plain = search(spec, hw, limit, space, cache=plain_cache)
        tuned = search(spec, hw, limit, space, cache=tuned_cache, tuning=SearchTuning(probe_nodes=0))
        assert not any(e.graph is not None for e in plain_cache["engines"].values())
        graphs += sum(e.graph is not None for e in tuned_cache["engines"].values())
        assert tuned.status == plain.status == "optimal"
        assert tuned.prediction.samples_per_s == plain.prediction.samples_per_s
    assert graphs > 0
