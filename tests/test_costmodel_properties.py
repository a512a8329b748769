"""Invariants of the cost model over random models, hardware and plans (hypothesis)."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwfixtures import simple_hw
from osdp_sim.costmodel import estimate
from osdp_sim.costmodel.states import state_bytes
from osdp_sim.model import ModelConfig, build_spec
from osdp_sim.plan import GroupChoice, Plan

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STRATS = ("ddp", "zero2", "zero3")
ORDER = {"ddp": 0, "zero2": 1, "zero3": 2}


@st.composite
def configs(draw):
    heads = draw(st.sampled_from([2, 4]))
    return ModelConfig(name="p", family=draw(st.sampled_from(["gpt2", "llama", "bert"])),
                       n_layers=draw(st.integers(1, 3)), hidden=heads * draw(st.sampled_from([16, 32])),
                       n_heads=heads, vocab_size=draw(st.integers(50, 500)), seq_len=draw(st.sampled_from([16, 32])),
                       tied_head=draw(st.booleans()))


@st.composite
def choices(draw):
    strategy = draw(st.sampled_from(STRATS))
    k = draw(st.sampled_from([1, 2, 4]))
    if strategy == "zero3" or k == 1:
        return GroupChoice(strategy, k, k if strategy == "zero3" else 0)
    return GroupChoice(strategy, k, draw(st.integers(1, k - 1)))


@st.composite
def plans(draw):
    cfg = draw(configs())
    spec = build_spec(cfg)
    devices = draw(st.sampled_from([2, 4, 8]))
    ch = {key: (GroupChoice(draw(st.sampled_from(STRATS))) if key == "root" else draw(choices()))
          for key in spec.plan_keys}
    plan = Plan(model=cfg, devices=devices, micro_batch=draw(st.integers(1, 4)), choices=ch,
                checkpoint=tuple(draw(st.booleans()) for _ in range(cfg.n_layers)),
                precision=draw(st.sampled_from(["fp32", "bf16"])), optimizer=draw(st.sampled_from(["adamw", "sgd"])),
                grad_accum=draw(st.integers(1, 2)))
    hw = simple_hw(busbw_gbps=draw(st.floats(1, 100)), latency_s=draw(st.floats(0, 1e-4)),
                   slowdown=draw(st.floats(1.0, 1.5)), peak_tflops=draw(st.floats(1, 100)))
    return spec, hw, plan


def _more_sharded(c: GroupChoice) -> GroupChoice:
    if c.strategy == "ddp":
        return GroupChoice("zero2", c.slices, c.sharded_slices)
    return GroupChoice("zero3", c.slices, c.slices)


@SETTINGS
@given(plans(), st.data())
def test_more_sharding_never_raises_model_state_memory(case, data):
    spec, hw, plan = case
    key = data.draw(st.sampled_from(spec.plan_keys))
    more = plan.with_choices(choices={**plan.choices, key: _more_sharded(plan.choices[key])})
    a = estimate(spec, hw, plan).model_states_bytes
    b = estimate(spec, hw, more).model_states_bytes
    assert sum(b.values()) <= sum(a.values()) + 1e-6


@SETTINGS
@given(plans(), st.floats(1.01, 10))
def test_more_bandwidth_never_raises_time(case, factor):
    spec, hw, plan = case
    fast = replace(hw, collectives=replace(hw.collectives, intra=replace(
        hw.collectives.intra, busbw_bytes_per_s=hw.collectives.intra.busbw_bytes_per_s * factor)))
    assert estimate(spec, fast, plan).iteration_time_s <= estimate(spec, hw, plan).iteration_time_s * (1 + 1e-9)


@SETTINGS
@given(plans())
def test_more_devices_never_raise_per_device_model_state_memory(case):
    spec, hw, plan = case
    more = replace(plan, devices=plan.devices * 2, shard_group=plan.devices * 2)
    hw16 = simple_hw(count=16, per_node=16)
    a = sum(estimate(spec, hw16, plan).model_states_bytes.values())
    b = sum(estimate(spec, hw16, more).model_states_bytes.values())
    assert b <= a + 1e-6


@SETTINGS
@given(plans(), st.data())
def test_checkpointing_never_raises_activation_memory(case, data):
    spec, hw, plan = case
    i = data.draw(st.integers(0, spec.config.n_layers - 1))
    on = replace(plan, checkpoint=tuple(True if j == i else c for j, c in enumerate(plan.checkpoint)))
    off = replace(plan, checkpoint=tuple(False if j == i else c for j, c in enumerate(plan.checkpoint)))
    assert _activation_peak(spec, hw, on) <= _activation_peak(spec, hw, off) + 1e-6


def _activation_peak(spec, hw, plan):
    from osdp_sim.costmodel.lowering import lower
    from osdp_sim.costmodel.memory import category_peak
    from osdp_sim.costmodel.schedule import build_step
    from osdp_sim.costmodel.simulate import simulate
    sched = build_step(lower(spec, hw, plan), reduce=True, grads_resident=False,
                       unsharded_grads_resident=False, optimizer=True)
    simulate(sched.tasks, hw.overlap_slowdown)
    return category_peak(sched.tasks, sched.events, "activations")


@SETTINGS
@given(plans(), st.data())
def test_split_with_no_or_all_slices_sharded_equals_unsplit(case, data):
    spec, hw, plan = case
    key = data.draw(st.sampled_from([k for k in spec.plan_keys if k != "root"]))
    strategy = data.draw(st.sampled_from(["ddp", "zero2"]))
    k = data.draw(st.sampled_from([2, 4, 8]))
    # j = 0 is the unsplit replicated strategy: the same plan, the same estimate
    j0 = plan.with_choices(choices={**plan.choices, key: GroupChoice(strategy, k, 0)})
    un = plan.with_choices(choices={**plan.choices, key: GroupChoice(strategy)})
    assert estimate(spec, hw, j0) == estimate(spec, hw, un) or \
        estimate(spec, hw, j0).to_dict() == estimate(spec, hw, un).to_dict()
    # j = k keeps ZeRO-3's model states and communication volume; only the transient changes
    jk = plan.with_choices(choices={**plan.choices, key: GroupChoice("zero3", k, k)})
    z3 = plan.with_choices(choices={**plan.choices, key: GroupChoice("zero3")})
    assert sum(estimate(spec, hw, jk).model_states_bytes.values()) == \
        __import__("pytest").approx(sum(estimate(spec, hw, z3).model_states_bytes.values()))


def test_state_bytes_monotone_in_shard_size():
    for n in (1, 2, 4, 8, 16):
        assert state_bytes(1e6, "zero3", 2 * n, "adamw").total <= state_bytes(1e6, "zero3", n, "adamw").total
