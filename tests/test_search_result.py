"""The search's one result object (planner/result.py): every status the search returns is
documented in STATUSES and reached, and every field is filled on an optimal, a time_limit and an
infeasible search (gpt2-tiny on titan8)."""

import ast
import dataclasses
import math
from pathlib import Path

import pytest

import osdp_sim
from osdp_sim.costmodel import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.planner import bnb
from osdp_sim.planner.result import (STATUSES, EvaluatedPlan, MicroBatchOutcome, OpenConfig, SearchResult,
                                     TopPlan)
from osdp_sim.planner.space import SearchSpace

MiB = 2**20
SPEC, HW = load_model("gpt2-tiny"), load_profile("titan8")
SPACE = SearchSpace(splits=(1, 2), micro_batches=(1, 2, 4, 8))
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def optimal():
    return bnb.search(SPEC, HW, 400 * MiB, SPACE, top_k=2)


@pytest.fixture(scope="module")
def stopped():
    """A time limit that passes once the first plan is found (the uniform plans): deterministic,
    unlike a limit in seconds."""
    mp = pytest.MonkeyPatch()
    mp.setattr(bnb._Search, "expired", lambda self: len(self.found) > 0)
    try:
        return bnb.search(SPEC, HW, 400 * MiB, SPACE, time_limit_s=1000.0)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def infeasible():
    """Just below the least peak (30.2 MiB): configurations are listed and plans evaluated, none fits."""
    return bnb.search(SPEC, HW, 28 * MiB, SearchSpace(splits=(1,), checkpoint=(False,)), time_limit_s=20)


def _common(r: SearchResult, limit: float):
    assert r.status in STATUSES
    assert r.model is SPEC and r.hardware is HW and r.mem_limit_bytes == limit
    assert r.nodes >= 0 and r.leaves >= 0 and r.seconds > 0 and r.message
    assert r.configs >= r.configs_searched >= 0 and r.configs > 0
    assert r.baselines == {} and r.headroom_bytes == 0.0
    assert all(isinstance(o, MicroBatchOutcome) for o in r.per_micro_batch)
    mbs = [o.micro_batch for o in r.per_micro_batch]
    assert mbs == sorted(set(mbs)) and mbs
    assert all(isinstance(e, EvaluatedPlan) and e.peak_memory_bytes > 0 and e.samples_per_s > 0 for e in r.evaluated)


def test_an_optimal_result_has_every_field(optimal):
    r = optimal
    _common(r, 400 * MiB)
    assert r.status == "optimal" and r.success and r.proven
    assert r.prediction == estimate(SPEC, HW, r.plan)
    assert r.prediction.peak_memory_bytes <= 400 * MiB
    assert len(r.top) == 2 and all(isinstance(t, TopPlan) for t in r.top)
    assert r.top[0].plan == r.plan and r.top[0].prediction.samples_per_s == r.prediction.samples_per_s
    assert r.top[1].prediction.samples_per_s <= r.prediction.samples_per_s
    assert r.gap == 0.0 and r.best_bound_samples_per_s == pytest.approx(r.prediction.samples_per_s, rel=1e-9)
    assert r.nodes > 0 and r.leaves > 0 and r.evaluated and r.configs_searched > 0
    assert r.open_configs == () and r.message.startswith("optimal")
    assert math.isnan(r.min_peak_memory_bytes) and r.min_peak_plan is None and r.min_peak_proven
    # the micro-batch of the plan holds its samples/s; the others hold less or nothing
    best = {o.micro_batch: o.best_samples_per_s for o in r.per_micro_batch}
    assert best[r.plan.micro_batch] == pytest.approx(r.prediction.samples_per_s, rel=1e-9)
    assert all(v is None or v <= r.prediction.samples_per_s * (1 + 1e-9) for v in best.values())
    assert all(o.best_samples_per_s is None for o in r.per_micro_batch if o.pruned)


def test_a_time_limit_result_has_every_field(stopped, optimal):
    r = stopped
    _common(r, 400 * MiB)
    assert r.status == "time_limit" and r.success and not r.proven
    assert r.prediction == estimate(SPEC, HW, r.plan) and r.top[0].plan == r.plan
    assert r.best_bound_samples_per_s >= optimal.prediction.samples_per_s * (1 - 1e-9)
    got = r.prediction.samples_per_s
    assert r.gap == pytest.approx((r.best_bound_samples_per_s - got) / got) and r.gap >= 0
    assert r.open_configs and all(isinstance(o, OpenConfig) for o in r.open_configs)
    for o in r.open_configs:
        assert o.micro_batch in SPACE.micro_batches and o.shard_group == 8 and o.root in SPACE.roots
        assert o.bound_samples_per_s > got * (1 - 1e-9) and type(o.bound_samples_per_s) is float
        assert o.reason == "not finished within the time limit"
    assert "open: micro-batch" in r.message
    assert math.isnan(r.min_peak_memory_bytes)


def test_a_time_limit_before_any_plan():
    r = bnb.search(SPEC, HW, 400 * MiB, SPACE, time_limit_s=0.0)
    assert r.status == "time_limit" and not r.success and r.plan is None and r.prediction is None
    assert r.top == () and r.gap == math.inf and r.best_bound_samples_per_s > 0
    assert "time limit" in r.message


def test_an_infeasible_result_has_every_field(infeasible):
    r = infeasible
    _common(r, 28 * MiB)
    assert r.status == "infeasible" and not r.success and r.proven
    assert r.plan is None and r.prediction is None and r.top == () and r.open_configs == ()
    assert r.best_bound_samples_per_s == 0.0 and r.gap == math.inf
    assert r.min_peak_proven and r.min_peak_memory_bytes > 28 * MiB and r.leaves > 0 and r.evaluated
    assert all(e.peak_memory_bytes > 28 * MiB for e in r.evaluated)
    assert estimate(SPEC, HW, r.min_peak_plan).peak_memory_bytes == pytest.approx(r.min_peak_memory_bytes)
    assert all(o.best_samples_per_s is None for o in r.per_micro_batch)
    assert "least peak memory" in r.message


def test_every_status_is_documented_and_reached(optimal, stopped, infeasible):
    gap = bnb.search(SPEC, HW, 400 * MiB, SPACE, rel_gap=0.2)
    assert gap.status == "within_gap" and gap.gap <= 0.2
    assert {optimal.status, stopped.status, infeasible.status, gap.status} == set(STATUSES)
    # bnb.py builds results in one place, which refuses a status not in STATUSES
    src = (ROOT / "osdp_sim/planner/bnb.py").read_text()
    assert src.count("SearchResult(") == 1 and "assert status in STATUSES" in src


def test_the_api_returns_the_same_object_with_the_baselines():
    r = osdp_sim.search("gpt2-tiny", "titan8", "400MiB", splits=(1, 2), micro_batches=(1, 2, 4, 8))
    assert isinstance(r, SearchResult) and r.status == "optimal"
    assert {"ddp", "zero2", "zero3", "osdp_knapsack"} <= set(r.baselines)
    assert r.prediction.samples_per_s >= r.baselines["zero3"].samples_per_s
    assert r.to_json()["search"]["best_bound"] == r.best_bound_samples_per_s
    with pytest.raises(TypeError):
        osdp_sim.search("gpt2-tiny", "titan8", "400MiB", objective="additive")


def test_every_field_has_a_docstring():
    tree = ast.parse((ROOT / "osdp_sim/planner/result.py").read_text())
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        body = cls.body
        fields = [i for i, n in enumerate(body) if isinstance(n, ast.AnnAssign)]
        assert fields, cls.name
        for i in fields:
            nxt = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (cls.name, body[i].target.id)
    assert {f.name for f in dataclasses.fields(SearchResult)} >= {
        "status", "plan", "prediction", "top", "best_bound_samples_per_s", "gap", "nodes", "leaves", "seconds",
        "message", "min_peak_memory_bytes", "min_peak_plan", "min_peak_proven", "per_micro_batch", "evaluated",
        "configs", "configs_searched", "open_configs", "baselines"}
