"""The bounds are admissible: along random plans, at every decision point, the time bound is at
most the plan's time and the memory bound at most its peak (with and without a memory limit)."""

import random

import numpy as np
import pytest
from searchfixtures import random_hw, random_spec

from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.fast import TIME_Q, Config, total_peak_bytes
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.dp import Engine
import osdp_sim.planner.merged as merged
from osdp_sim.planner.keygraph import GraphCaps, KeyGraph, TooLarge, lambda_grid
from osdp_sim.planner.keystore import CkMlpDone, DeferredMlp
from osdp_sim.planner.merged import MergedView, grid_for
from osdp_sim.planner.problem import build_problem
from osdp_sim.planner.space import SearchSpace, group_choices

CHOICES = group_choices(SearchSpace())


def _instance(rng):
    if rng.random() < 0.3:
        hw = load_profile(rng.choice(["titan8", "a100x8", "a100-2x8", "h100x8"]))
        spec = build_spec(with_overrides(BUILTIN[rng.choice(["gpt2-1.5b", "llama-7b"])], n_layers=rng.randint(2, 4)))
    else:
        hw = random_hw(rng)
        spec = random_spec(rng, rng.randint(1, 4))
    dev = hw.device.count
    ck = rng.choice([(False, True), (False,), (True,)])
    cfg = Config(dev, rng.randint(1, 4), rng.choice([1, 1, 2]), rng.choice([d for d in (1, 2, 4, 8, 16) if dev % d == 0]),
                 rng.choice(["bf16", "fp32"]), rng.choice(["adamw", "sgd"]), rng.choice(["ddp", "zero2", "zero3"]))
    pb = build_problem(spec, hw, cfg, CHOICES, ck)
    nb = len(pb.blocks)
    plan = ([rng.randrange(len(CHOICES)) for _ in range(nb)], [rng.randrange(len(CHOICES)) for _ in range(nb)],
            [rng.choice(ck) for _ in range(nb)])
    return spec, hw, pb, plan


def _random_path(rng):
    """A random instance, its engine, one random plan walked through the tables, and that plan's
    (time, peak) in fixed point."""
    _spec, _hw, pb, (attn, mlp, ck) = _instance(rng)
    eng = Engine(pb)
    path, (t_q, peak_q) = eng.path(attn, mlp, ck)
    return eng, path, t_q, peak_q


@pytest.mark.parametrize("seed", range(3))
def test_bounds_admissible_on_random_plans(seed):
    rng = random.Random(100 + seed)
    for _ in range(25):
        spec, hw, pb, (attn, mlp, ck) = _instance(rng)
        eng = Engine(pb)
        path, (t_q, peak_q) = eng.path(attn, mlp, ck)
        e = estimate(spec, hw, pb.plan(attn, mlp, ck))
        # the tables reproduce the cost model along the plan
        assert t_q * TIME_Q == pytest.approx(e.iteration_time_s, rel=1e-9)
        assert total_peak_bytes(peak_q, hw) == pytest.approx(e.peak_memory_bytes, rel=1e-9)
        for limit in (float("inf"), peak_q):
            for g, L, k in path:
                lb, mem_lb = eng.lower_bounds(g, L, np.array([k]), limit)
                assert lb[0] <= t_q
                assert mem_lb[0] <= peak_q


@pytest.mark.parametrize("seed", range(2))
def test_frontier_bound_admissible_and_at_least_the_first_bound(seed):
    """Engine.frontier_bound (the first decisions expanded exactly): at most the time of every
    plan that fits the limit (here: a random plan, with its own peak as the limit), and never
    looser than the bound at the first decision, which it refines."""
    rng = random.Random(300 + seed)
    tighter = 0
    for _ in range(25):
        eng, path, t_q, peak_q = _random_path(rng)
        g0, L0, k0 = path[0]
        first, _m = eng.lower_bounds(g0, L0, np.array([k0]), peak_q)
        for depth in (1, 2):
            lb, _nodes = eng.frontier_bound(depth, pq_max=peak_q)
            assert lb <= t_q
            # a threshold above the plan's time keeps it: still admissible
            lb_thr, _nodes = eng.frontier_bound(depth, pq_max=peak_q, thr_q=t_q + 1)
            assert lb_thr <= t_q
            tighter += lb > first[0] + 1
    assert tighter > 0                     # the refinement does tighten somewhere


@pytest.mark.parametrize("seed", range(2))
def test_key_graph_bound_admissible_and_tighter(seed):
    """With a key graph (keygraph.py) built for a limit and a threshold that a random plan meets
    (its own peak; its time + 1), the bounds stay admissible along that plan, at every decision,
    and are never looser than the relaxed ones; the same without limit or threshold."""
    rng = random.Random(500 + seed)
    built = 0
    for _ in range(20):
        eng, path, t_q, peak_q = _random_path(rng)
        for limit, thr in ((peak_q, t_q + 1), (float("inf"), float("inf"))):
            eng.graph, eng.too_large_real, eng.too_large_merged = None, [], []
            outcome = eng.build_graph(limit, thr, caps=GraphCaps(max_level_keys=400), merged_ok=False)
            if outcome != "built":
                assert outcome == "too large"       # no deadline was given: the only other reason
                continue
            built += 1
            # a graph serves runs with no larger limit and threshold only
            assert eng.graph_for(limit, thr) is eng.graph
            assert limit == float("inf") or eng.graph_for(float("inf"), thr) is None
            for g, L, k in path:
                lb0, mem0 = eng.lower_bounds(g, L, np.array([k]), limit, graph=None)
                lb, mem_lb = eng.lower_bounds(g, L, np.array([k]), limit, graph=eng.graph)
                assert lb[0] <= t_q
                assert mem_lb[0] <= peak_q
                assert lb[0] >= lb0[0] and mem_lb[0] >= mem0[0]
    assert built >= 10


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("grid_fraction", [0.01, 0.5])
def test_merged_key_graph_bound_admissible(seed, grid_fraction):
    """The graph over merged keys (merged.py: queue replaced by its total work, rounded down to
    grid_fraction of a decision's mean time; memory through S only), read at the merged id each
    label carries along its own decisions, never exceeds the plan's time or peak."""
    rng = random.Random(700 + seed)
    built = 0
    for _ in range(20):
        _spec, _hw, pb, (attn, mlp, ck) = _instance(rng)
        eng = Engine(pb)
        path, (t_q, peak_q) = eng.path(attn, mlp, ck)
        view = MergedView(eng, grid_for(eng, peak_q) * grid_fraction / merged.GRID_FRACTION)
        nch = len(pb.choices)
        for limit, thr in ((peak_q, t_q + 1), (float("inf"), float("inf"))):
            try:
                g = KeyGraph(view, lambda_grid(eng.bounds.j_lam), limit, thr, caps=GraphCaps(400))
            except TooLarge:
                continue
            built += 1
            mid = int(path[0][2])                          # the start key is its own merge
            for gap, L, kid in path:
                lb, mem_lb = eng.lower_bounds(gap, L, np.array([kid]), limit, graph=g, CM=np.array([mid]))
                assert lb[0] <= t_q and mem_lb[0] <= peak_q
                kind, bi = eng.positions[gap]
                code = {"mlp": mlp[bi] + (nch if ck[bi] else 0), "attn": attn[bi], "embed": 0}.get(kind)
                codes, nks, _d = view.table(mid, gap)
                mid = int(nks[list(codes).index(code)])
    assert built >= 10


def _two_block_engine() -> Engine:
    rng = random.Random(11)
    hw = random_hw(rng)
    spec = random_spec(rng, 2)
    cfg = Config(hw.device.count, 2, 1, hw.device.count, "bf16", "adamw", "zero3")
    return Engine(build_problem(spec, hw, cfg, group_choices(SearchSpace(splits=(1, 2))), (False, True)))


def test_key_graph_drops_nodes_no_plan_beating_the_threshold_passes():
    """Built with a threshold below the best time, the graph keeps no path: the bound at the
    start is infinite (the configuration is ruled out)."""
    eng = _two_block_engine()
    assert eng.build_graph(float("inf")) == "built"
    L, K = eng.start()
    best = eng.lower_bounds(0, L, K, float("inf"), graph=eng.graph)[0][0] + eng.bounds.t_margin
    eng.graph = None
    assert eng.build_graph(float("inf"), best - 10) == "built"
    assert np.isinf(eng.lower_bounds(0, L, K, float("inf"), graph=eng.graph)[0][0])


def test_abandoned_key_graph_is_tried_again_only_with_more_room():
    """A graph abandoned under its caps is not rebuilt for the same (or a larger) limit and
    threshold with the same caps; it is with larger caps, or with a threshold that prunes more."""
    eng = _two_block_engine()
    tiny = GraphCaps(max_level_keys=1)
    assert eng.build_graph(float("inf"), caps=tiny) == "too large"
    assert eng.build_graph(float("inf"), caps=tiny) == "too large"
    assert len(eng.too_large_real) == len(eng.too_large_merged) == 1      # neither tried again
    # a threshold below every plan's time drops every node: nothing is left to exceed the caps
    assert eng.build_graph(float("inf"), 1, caps=tiny) == "built"
    eng.graph = None
    assert eng.build_graph(float("inf")) == "built" and eng.graph.covers(float("inf"), float("inf"))


def test_key_graph_time_to_go_is_the_least_time_over_all_plans():
    """Without a memory limit the graph's bound at the start is exactly the least iteration time
    over every plan (brute force over a 6-choice space, 1-2 blocks), and its memory part the
    least sum of resident + kept bytes: the graph carries no relaxation."""
    import itertools
    choices = group_choices(SearchSpace(splits=(1, 2)))
    rng = random.Random(7)
    for nb in (1, 2, 2):
        hw = random_hw(rng)
        spec = random_spec(rng, nb)
        cfg = Config(hw.device.count, rng.randint(1, 3), 1, hw.device.count, "bf16", "adamw", rng.choice(["zero2", "zero3"]))
        pb = build_problem(spec, hw, cfg, choices, (False, True))
        eng = Engine(pb)
        assert eng.build_graph(float("inf")) == "built"
        L, K = eng.start()
        bnd = eng.bounds
        lb, _m = eng.lower_bounds(0, L, K, float("inf"), graph=eng.graph)
        per_block = list(itertools.product(range(len(choices)), range(len(choices)), (False, True)))
        best = min(eng.path([a for a, _m, _c in p], [m for _a, m, _c in p], [c for _a, _m, c in p])[1][0]
                   for p in itertools.product(per_block, repeat=len(pb.blocks)))
        assert lb[0] + bnd.t_margin == pytest.approx(best, abs=2)


def _hull_slopes_by_definition(S, T):
    """The Lagrangian grid's slopes from their definition: the undominated points (no other at
    <= S and <= T, one per distinct S), of which those not on or above a segment between two
    others (integer points: exact) are the lower hull's vertices; -dT/dS along its falling edges."""
    pts = sorted({(s, t) for s, t in zip(S, T)
                  if not any((s2 <= s and t2 < t) or (s2 < s and t2 <= t) for s2, t2 in zip(S, T))})
    def above(j, i, k):
        (x1, y1), (x, y), (x2, y2) = pts[j], pts[i], pts[k]
        return (y - y1) * (x2 - x1) >= (y2 - y1) * (x - x1)
    vs = [p for i, p in enumerate(pts)
          if not any(above(j, i, k) for j in range(i) for k in range(i + 1, len(pts)))]
    return [(y1 - y2) / (x2 - x1) for (x1, y1), (x2, y2) in zip(vs, vs[1:])]


@pytest.mark.parametrize("seed", range(40))
def test_lagrangian_grid_slopes_are_the_lower_hulls(seed):
    """bounds._hull_slopes (compiled) on random integer points with ties in S, in T and whole
    duplicates, against the definition."""
    from osdp_sim.planner.bounds import _hull_slopes
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    span = int(rng.integers(2, 30))
    S, T = rng.integers(0, span, n), rng.integers(0, span, n)
    if seed % 2:                  # points on a falling line under the rest: collinear hull vertices
        k = int(rng.integers(2, 6))
        S = np.concatenate([S, np.arange(k) * 3])
        T = np.concatenate([T, -np.arange(k) * 2])
    got = _hull_slopes(S.astype(float), T.astype(float))
    want = _hull_slopes_by_definition(S.tolist(), T.tolist())
    assert got == pytest.approx(want, rel=1e-12)


def _key_value(store, kid: int):
    """A key as a value: plain keys as their (pending, queue) tuple, markers around their inner key's."""
    key = store.keys[kid]
    if isinstance(key, DeferredMlp):
        return ("deferred", _key_value(store, key.key_id), key.choice)
    if isinstance(key, CkMlpDone):
        return ("ckmlp done", _key_value(store, key.key_id))
    return key


def _intern_value(store, value) -> int:
    if value[0] == "deferred":
        return store.intern(DeferredMlp(_intern_value(store, value[1]), value[2]))
    if value[0] == "ckmlp done":
        return store.intern(CkMlpDone(_intern_value(store, value[1])))
    return store.intern(value)


@pytest.mark.parametrize("seed", range(6))
def test_table_rows_from_one_compiled_call_are_each_entrys_own_stage(seed):
    """Engine.tables builds the rows of many keys in one fold.run_stages call (the fixed point and
    the new keys' interning by queue bytes there); each entry must equal the same decision run
    alone by a second engine with its own store (Engine._stage: fold.run_tasks and fast.qt / qm),
    new keys compared as values. The keys: those random plans meet at each slot."""
    rng = random.Random(500 + seed)
    _spec, _hw, pb, _plan = _instance(rng)
    eng, alone = Engine(pb), Engine(pb)
    nch, nb = len(pb.choices), len(pb.blocks)
    at: dict[int, set] = {}
    for _ in range(8):
        ck = [rng.choice(pb.ckpt_options) for _ in range(nb)]
        path, _ = eng.path([rng.randrange(nch) for _ in range(nb)], [rng.randrange(nch) for _ in range(nb)], ck)
        for g, _L, k in path:
            at.setdefault(g, set()).add(k)
    entries = 0
    for g, keys in sorted(at.items()):
        keys = np.array(sorted(keys), dtype=np.int64)
        D, NK, CODES = eng.tables(keys, g)
        for r, kid in enumerate(keys.tolist()):
            other = _intern_value(alone.store, _key_value(eng.store, kid))
            for e, code in enumerate(CODES[r].tolist()):
                nk, d = alone._stage(other, g, code)
                assert tuple(D[r, e].tolist()) == d
                assert _key_value(eng.store, int(NK[r, e])) == _key_value(alone.store, nk)
                entries += 1
    assert entries > 20


@pytest.mark.parametrize("seed", range(3))
def test_path_stages_cached_by_slot_class_are_those_of_a_fresh_engine(seed):
    """Engine.path caches a stage by (key, slot class, code): walking plans one after another on one
    engine (later walks read stages cached at other slots of the same class) gives, label by
    label, what each plan gives on an engine of its own."""
    rng = random.Random(700 + seed)
    spec = build_spec(with_overrides(BUILTIN["gpt2-1.5b"], n_layers=6))
    hw = load_profile("titan8")
    pb = build_problem(spec, hw, Config(8, 2, 1, 8, "bf16", "adamw", "zero3"), CHOICES, (False, True))
    nb, nch = len(pb.blocks), len(CHOICES)
    shared = Engine(pb)
    plans = [([i] * nb, [i] * nb, [ck] * nb) for i in range(nch) for ck in (False, True)]
    plans += [([rng.randrange(nch) for _ in range(nb)], [rng.randrange(nch) for _ in range(nb)],
               [rng.random() < 0.5 for _ in range(nb)]) for _ in range(6)]
    by_slot = set()                                      # the stages a cache keyed by slot would hold
    for attn, mlp, ck in plans:
        got, got_end = shared.path(attn, mlp, ck)
        want, want_end = Engine(pb).path(attn, mlp, ck)
        assert got_end == want_end
        assert all(g == w_g and np.array_equal(lab, w_lab) for (g, lab, _k), (w_g, w_lab, _wk) in zip(got, want))
        for g, _lab, kid in got:
            kind, bi = shared.positions[g]
            code = (mlp[bi] + (nch if ck[bi] else 0)) if kind == "mlp" else (attn[bi] if kind == "attn" else 0)
            by_slot.add((kid, g, code))
    assert len(shared.single) < len(by_slot)            # stages were shared across slots of one class
