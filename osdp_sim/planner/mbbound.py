"""A proven upper bound on the samples/s of any plan at a given micro-batch, in closed form, so the
search does not have to build every micro-batch's configurations up to what fits in memory.

Compute. Every plan runs, per micro-batch, every step's forward and backward on the compute
stream, and a checkpointed block's forward once more; while overlapped both streams slow down
(overlap slowdown >= 1), so the iteration takes at least m x that compute work. The compute of a
group does not depend on its strategy, only on its split k (operator splitting cuts each GEMM
into k smaller ones, which may run at another efficiency): the least over the space's splits is a
lower bound for every choice. It mirrors lowering._lower_group and _root_fwd_s term by term
(tests/test_search_limits.py checks it against the search's own step tables).

Memory. At the start of backward everything kept from forward is live: resident states (at
least the least over the choices, which does not depend on the micro-batch), each block's
activations (all of them, or only its checkpoint inputs when it is checkpointed) and the root's
activations, all proportional to the micro-batch. So a micro-batch whose blocks cannot all be
checkpointed within the limit has no plan, and one at which keeping every block's activations
does not fit must checkpoint blocks saving at least the excess: the least recompute that does,
with blocks taken fractionally (a linear relaxation of that knapsack), is added to the compute.

Fixed terms. In every iteration some time passes with compute idle whatever the micro-batch:
the root's all-gather before the first forward, its reduction after the last backward, the
optimizer step after that (bounds.py counts each in full); the least over the choices is added.

The bound at micro-batch b with accumulation m is b m devices / (m (compute + recompute) + fixed).
"""

import math
from dataclasses import dataclass

import numpy as np

from osdp_sim.costmodel.fast import MEM_Q, Config
from osdp_sim.costmodel.lowering import FWD_KERNELS_PER_GROUP
from osdp_sim.costmodel.rates import bandwidth_time_s
from osdp_sim.costmodel.states import compute_bytes, state_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec, OpGroup
from osdp_sim.planner.problem import build_problem, group_shape
from osdp_sim.planner.space import (SearchSpace, checkpoint_variants, checkpointing_allowed, devices_of,
                                   grad_accum_of, shard_groups_of)

SAFETY = 1.0 - 1e-9              # float rounding between this closed form and the cost model's


@dataclass(frozen=True)
class MicroBatchBounds:
    """Per candidate micro-batch (ascending): the bound on samples/s (0 where nothing can fit)."""

    micro_batches: np.ndarray            # int64
    ub_samples_per_s: np.ndarray         # float

    def fits(self) -> np.ndarray:
        return self.ub_samples_per_s > 0.0

    def suffix_max(self) -> np.ndarray:
        """[i]: the largest bound of micro-batches i, i+1, ...: no plan at micro-batch >= mbs[i] is faster."""
        return np.maximum.accumulate(self.ub_samples_per_s[::-1])[::-1]


def _gemm_s(hw: HardwareProfile, flops: np.ndarray, dtype: str) -> np.ndarray:
    """rates.gemm_time_s over an array of FLOP counts."""
    curve = hw.compute.gemm_efficiency[dtype]
    xs = np.log([p[0] for p in curve])
    ys = np.array([p[1] for p in curve], dtype=float)
    eff = np.minimum(1.0, np.interp(np.log(np.maximum(flops, 1.0) / 1e9), xs, ys) * hw.compute.efficiency_scale)
    t = flops / (hw.compute.peak_flops[dtype] * eff) + hw.compute.kernel_launch_s
    return np.where(flops > 0, t, 0.0)


def _elementwise_s(hw: HardwareProfile, act_bytes: np.ndarray) -> np.ndarray:
    return bandwidth_time_s(hw, 2.0 * act_bytes, FWD_KERNELS_PER_GROUP)


def group_forward_s(g: OpGroup, hw: HardwareProfile, dtype: str, tokens: np.ndarray, k: int) -> np.ndarray:
    """The forward compute of a (non-root) group split in k slices (k = 1: unsplit), as
    lowering._lower_group adds it up over the group's steps."""
    cb = compute_bytes(dtype)
    linear_flops = sum(2.0 * l.weight_params for l in g.linears)
    core = tokens * (g.fwd_flops_per_token - linear_flops)
    core_s = np.where(core > 0, 2 * _gemm_s(hw, core / 2, dtype), 0.0)
    slices = sum(k * _gemm_s(hw, 2.0 * tokens * l.weight_params / k, dtype) for l in g.linears)
    return core_s + _elementwise_s(hw, g.activations.bytes_for(cb, tokens)) + slices


def root_forward_s(g: OpGroup, hw: HardwareProfile, dtype: str, tokens: np.ndarray) -> np.ndarray:
    """lowering._root_fwd_s over an array of token counts."""
    cb = compute_bytes(dtype)
    if g.kind == "head":
        gemms = _gemm_s(hw, tokens * g.fwd_flops_per_token, dtype)
    else:
        gemms = sum((_gemm_s(hw, 2.0 * tokens * l.weight_params, dtype) for l in g.linears), np.zeros(len(tokens)))
    return gemms + _elementwise_s(hw, g.activations.bytes_for(cb, tokens))


@dataclass(frozen=True)
class Floors:
    """What no plan of the space goes below, whatever the micro-batch."""

    resident_bytes: float                # the blocks' least resident bytes (no accumulation)
    fixed_s: float                       # per iteration: the root's first gather and last reduction, the optimizer


def floors(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, cache: dict | None = None) -> Floors:
    """The least over every choice, shard group and root strategy of the blocks' resident
    bytes, and of the time in every iteration with compute idle: the root's all-gather before
    the first forward, its reduction after the last backward (bounds.py counts both in full)
    and the optimizer step after it. None depends on the micro-batch; resident gradients under
    accumulation only add."""
    devices = devices_of(space, hw)
    resident, fixed = math.inf, math.inf
    for sg in shard_groups_of(space, hw, devices):
        for root, v in ((r, v) for r in space.roots for v in checkpoint_variants(space, spec)):
            cfg = Config(devices, 1, 1, sg, space.precision, space.optimizer, root, v.selective)
            pb = build_problem(spec, hw, cfg, v.choices, v.options, cache)
            shapes = [(pb.shapes[b.attn_shape], pb.shapes[b.mlp_shape]) for b in pb.blocks]
            resident = min(resident, sum(min(o.res for o in a) + min(o.res for o in m) for a, m in shapes))
            e = pb.root.embed
            fixed = min(fixed, (e.agf or 0.0) + sum(w for (w, *_r) in e.rs) + pb.root.head.opt
                        + sum(min(o.opt for o in a) + min(o.opt for o in m) for a, m in shapes))
    return Floors(resident, fixed)


def least_resident_bytes(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, cache: dict | None = None) -> float:
    return floors(spec, hw, space, cache).resident_bytes


def micro_batch_bounds(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, micro_batches,
                       pq_max: float, floor: Floors) -> MicroBatchBounds:
    """The bound at each micro-batch (module docstring); pq_max: the live-byte limit (fixed point)."""
    resident_bytes = floor.resident_bytes
    mbs = np.asarray(sorted(micro_batches), dtype=np.int64)
    tokens = mbs.astype(float) * spec.seq_len
    dtype = space.precision
    cb = compute_bytes(dtype)
    ratio = hw.compute.backward_forward_ratio
    splits = sorted(set(space.splits) | {1})
    shapes: dict = {}

    def fwd(g: OpGroup) -> np.ndarray:
        key = group_shape(g)
        if key not in shapes:
            shapes[key] = np.minimum.reduce([group_forward_s(g, hw, dtype, tokens, k) for k in splits])
        return shapes[key]

    root = sum((root_forward_s(g, hw, dtype, tokens) for g in spec.groups if g.plan_key == "root"), np.zeros(len(mbs)))
    # Per sample: the per-forward bytes (Activations.bytes_per_forward, transformers' rotary tables
    # and position ids) are left out, which only loosens the bound.
    root_act = sum(g.activations.bytes_per_token(cb) for g in spec.groups if g.plan_key == "root") * spec.seq_len
    block_fwd = [sum(fwd(g) for g in u.groups) for u in spec.blocks]
    compute = (1.0 + ratio) * (root + sum(block_fwd, np.zeros(len(mbs))))
    kept = np.array([u.activations.bytes_per_token(cb) for u in spec.blocks]) * spec.seq_len   # per sample
    ck = np.array([u.ckpt_activations.bytes_per_token(cb) for u in spec.blocks]) * spec.seq_len
    # selective blocks keep more than ck (a lower bound still) and recompute less than the
    # forward: with them allowed the recompute lower bound is 0
    allow_nc, allow_ck = False in space.checkpoint, checkpointing_allowed(space)
    selective = "selective" in space.checkpoint
    margin_bytes = 64.0 * (len(spec.blocks) + 2) * MEM_Q
    budget = pq_max * MEM_Q + margin_bytes - resident_bytes - mbs * root_act       # for the blocks' activations
    recompute = np.zeros(len(mbs))
    ok = np.ones(len(mbs), dtype=bool)
    lean = np.minimum(kept, ck) if allow_nc and allow_ck else (ck if allow_ck else kept)
    ok &= mbs * lean.sum() <= budget
    if selective:
        pass
    elif allow_ck and not allow_nc:
        recompute = sum(block_fwd, np.zeros(len(mbs)))
    elif allow_ck:
        saving = kept - ck                                    # per sample, per block checkpointed
        for i in np.flatnonzero(ok & (mbs * kept.sum() > budget)):
            excess = mbs[i] * kept.sum() - budget[i]
            cost = np.array([f[i] for f in block_fwd])
            useful = saving > 0
            order = np.argsort(cost[useful] / saving[useful])
            sv, cs = (saving[useful] * mbs[i])[order], cost[useful][order]
            done = np.cumsum(sv)
            j = int(np.searchsorted(done, excess))           # blocks 0..j-1 fully, block j in part
            if j >= len(sv):
                ok[i] = False
                continue
            recompute[i] = cs[:j].sum() + cs[j] * (excess - (done[j - 1] if j else 0.0)) / sv[j]
    devices = devices_of(space, hw)
    accum = np.array([grad_accum_of(space, int(mb), devices) or 1 for mb in mbs], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ub = mbs * accum * devices / ((accum * (compute + recompute) + floor.fixed_s) * SAFETY)
    ub = np.where(ok & np.isfinite(ub), ub, 0.0)
    ub = np.where(compute > 0, ub, np.where(ok, np.inf, 0.0))
    return MicroBatchBounds(mbs, ub)


def states_floor_bytes(spec: ModelSpec, hw: HardwareProfile, optimizer: str, devices: int) -> float:
    """A proven lower bound on any plan's peak on `devices`: every parameter's fully sharded model
    states (costmodel.states), with the profile's allocator margin and context."""
    states = state_bytes(float(spec.param_count), "zero3", devices, optimizer).total
    return states * (1.0 + hw.memory.fragmentation) + hw.memory.context_bytes


def fewest_devices_for_states(spec: ModelSpec, hw: HardwareProfile, optimizer: str,
                              limit_bytes: float) -> int | None:
    """A proven lower bound on the devices any plan needs: the fewest N whose fully sharded model
    states (param + grad + optimizer bytes of every parameter over N) plus the profile's allocator
    margin and context fit the limit. None: not even infinitely many would."""
    live = (limit_bytes - hw.memory.context_bytes) / (1.0 + hw.memory.fragmentation)
    if live <= 0:
        return None
    per_param = state_bytes(1.0, "zero3", 1, optimizer).total
    return max(1, math.ceil(spec.param_count * per_param / live))
