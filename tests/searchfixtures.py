"""Small random instances for the search tests: tiny models (heterogeneous blocks too), random
hand-built hardware, random plans, and a brute-force enumerator of a SearchSpace."""

import itertools
import random
from dataclasses import replace

from hwfixtures import simple_hw

from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import ModelSpec, build_spec
from osdp_sim.plan.plan import GroupChoice, Plan
from osdp_sim.planner.space import SearchSpace, devices_of, grad_accum_of, group_choices, shard_groups_of


def tiny_config(rng: random.Random, layers: int):
    return with_overrides(BUILTIN["gpt2-tiny"], n_layers=layers, hidden=rng.choice([64, 128, 256]),
                          n_heads=4, seq_len=rng.choice([16, 64, 128]), vocab_size=rng.choice([256, 2048, 8192]))


def hetero_spec(rng: random.Random, layers: int) -> ModelSpec:
    """Blocks of different MLP widths and head counts: OpGroups taken from other configs."""
    base = tiny_config(rng, layers)
    spec = build_spec(base)
    units = [spec.units[0]]
    for i in range(layers):
        cfg = with_overrides(base, n_layers=1, ffn_hidden=rng.choice([base.hidden, 2 * base.hidden, 4 * base.hidden]),
                             n_heads=rng.choice([2, 4, 8]))
        blk = build_spec(cfg).blocks[0]
        groups = tuple(replace(g, name=f"block{i}.{g.kind}", plan_key=f"block{i}.{g.kind}") for g in blk.groups)
        units.append(replace(blk, name=f"block{i}", index=i, groups=groups))
    units.append(spec.units[-1])
    return ModelSpec(base, tuple(units))


def random_spec(rng: random.Random, layers: int) -> ModelSpec:
    """Half the time blocks of different widths (hetero_spec), else identical blocks."""
    return hetero_spec(rng, layers) if rng.random() < 0.5 else build_spec(tiny_config(rng, layers))


def random_hw(rng: random.Random):
    dev = rng.choice([2, 4, 8])
    return simple_hw(count=dev, per_node=rng.choice([dev, max(1, dev // 2)]),
                     busbw_gbps=rng.choice([0.5, 2.0, 10.0, 100.0]), latency_s=rng.choice([0.0, 1e-5, 1e-4]),
                     launch_s=rng.choice([0.0, 1e-5]), peak_tflops=rng.choice([1.0, 10.0, 100.0]),
                     eff=rng.choice([0.3, 0.7]), slowdown=rng.choice([1.0, 1.2, 1.5, 2.0, 2.5]),
                     kernel_launch_s=rng.choice([0.0, 5e-6]), fragmentation=rng.choice([0.0, 0.05]),
                     context_bytes=rng.choice([0, 2**20]), inter_gbps=rng.choice([None, 1.0]))


ALL_CHOICES = group_choices(SearchSpace())


def random_plan(rng: random.Random, spec: ModelSpec, hw) -> Plan:
    dev = hw.device.count
    choices = {k: rng.choice(ALL_CHOICES) for k in spec.plan_keys}
    choices["root"] = GroupChoice(rng.choice(["ddp", "zero2", "zero3"]))
    return Plan(model=spec.config, devices=dev, micro_batch=rng.randint(1, 4), choices=choices,
                checkpoint=tuple(rng.random() < 0.5 for _ in spec.blocks),
                grad_accum=rng.choice([1, 1, 2, 3]), precision=rng.choice(["bf16", "fp32"]),
                optimizer=rng.choice(["adamw", "sgd"]),
                shard_group=rng.choice([d for d in (1, 2, 4, 8) if dev % d == 0]))


def enumerate_space(spec: ModelSpec, hw, space: SearchSpace):
    """Every plan of the space (micro_batches must be given)."""
    devices = devices_of(space, hw)
    choices = group_choices(space)
    keys = [k for k in spec.plan_keys if k != "root"]
    nb = len(spec.blocks)
    for mb in space.micro_batches:
        m = grad_accum_of(space, mb, devices)
        if m is None:
            continue
        for sg in shard_groups_of(space, hw, devices):
            for root in space.roots:
                for combo in itertools.product(choices, repeat=len(keys)):
                    for policy, ck in _checkpoints(space, nb):
                        ch = dict(zip(keys, combo))
                        ch["root"] = GroupChoice(root)
                        yield Plan(model=spec.config, devices=devices, micro_batch=mb, choices=ch,
                                   checkpoint=ck, grad_accum=m, precision=space.precision,
                                   optimizer=space.optimizer, shard_group=sg,
                                   selective=ck if policy == "selective" else ())


def _checkpoints(space: SearchSpace, nb: int):
    """(policy, per-block flags) as docs/search.md defines the space: the checkpointed blocks of a
    plan are all full (True) or all selective ("selective"); each block independently takes any
    allowed value of its plan's policy (False among them when allowed)."""
    allowed = set(space.checkpoint)
    seen = set()
    for policy in ("full", "selective"):
        mark = True if policy == "full" else "selective"
        values = sorted({False} & allowed) + ([True] if mark in allowed else [])
        if mark not in allowed:
            continue
        for ck in itertools.product(values, repeat=nb):
            if (policy if any(ck) else "none", ck) not in seen:
                seen.add((policy if any(ck) else "none", ck))
                yield policy if any(ck) else "full", ck
    if allowed == {False}:
        yield "full", (False,) * nb
