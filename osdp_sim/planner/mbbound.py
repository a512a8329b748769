"""A proven upper bound on the samples/s of any plan at a given micro-batch, in closed form, so the
search does not have to build every micro-batch's configurations up to what fits in memory.

Compute. Every plan runs, per micro-batch, every step's forward and backward on the compute
stream, and a checkpointed block's forward once more; while overlapped both streams slow down
(overlap slowdown >= 1), so the iteration takes at least m x that compute work. The compute of a
group does not depend on its strategy, only on its split k (operator splitting cuts each GEMM
into k smaller ones, which may run at another efficiency): the least over the space's splits is a
lower bound for every choice. It mirrors lowering.lower_group and root_step_times term by term
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
from osdp_sim.costmodel.lowering import calls_s, copy_in_s, group_times, root_step_times, root_unit
from osdp_sim.costmodel.rates import task_time_s
from osdp_sim.costmodel.states import compute_bytes, state_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec, OpGroup
from osdp_sim.plan.plan import GroupChoice
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


def group_compute_s(spec: ModelSpec, g: OpGroup, hw: HardwareProfile, dtype: str, tokens: float,
                    k: int) -> tuple[float, float]:
    """(forward + backward, recompute) of a (non-root) group split in k slices (k = 1: unsplit),
    no more than lowering.lower_group charges any of its plans: one collective call, no all-gather
    copy-out, the steps' device and host work pooled (max(sum, sum) <= sum of max)."""
    t = group_times(spec, g, hw, dtype, int(tokens), k)
    dev_f = t.fixed_fwd_s + k * sum(t.slice_fwd_s.values())
    dev_b = t.fixed_bwd_s + k * sum(t.slice_bwd_s.values())
    # the fewest collective calls any choice issues: zero2's all-gather and reduce-scatter
    both = (task_time_s(hw, dev_f, t.host_fwd_s + calls_s(hw, 1))
            + task_time_s(hw, dev_b + copy_in_s(hw, g.param_count * compute_bytes(dtype)), t.host_bwd_s + calls_s(hw, 1)))
    return both, task_time_s(hw, dev_f, t.host_fwd_s)


def root_compute_s(spec: ModelSpec, g: OpGroup, hw: HardwareProfile, dtype: str, tokens: float,
                   root) -> float:
    """lowering's embedding or head step, forward + backward."""
    f, b = root_step_times(spec, g, hw, dtype, int(tokens), root)
    return f + b


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
            fixed = min(fixed, (e.forward_gather_s or 0.0) + sum(w for (w, *_r) in e.reduction_items) + pb.root.head.optimizer_s
                        + sum(min(o.opt for o in a) + min(o.opt for o in m) for a, m in shapes))
    return Floors(resident, fixed)


def least_resident_bytes(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, cache: dict | None = None) -> float:
    return floors(spec, hw, space, cache).resident_bytes


def micro_batch_bounds(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, micro_batches,
                       pq_max: float, floor: Floors) -> MicroBatchBounds:
    """The bound at each micro-batch (module docstring); pq_max: the live-byte limit (fixed point).
    Memory first: the time terms are computed only at the micro-batches whose blocks can all be
    checkpointed within the limit (the others have no plan: bound 0)."""
    all_mbs = np.asarray(sorted(micro_batches), dtype=np.int64)
    dtype = space.precision
    cb = compute_bytes(dtype)
    # Per sample: the per-forward bytes (Activations.bytes_per_forward, transformers' rotary tables
    # and position ids) are left out, which only loosens the bound.
    root_act = sum(g.activations.bytes_per_token(cb) for g in spec.groups if g.plan_key == "root") * spec.seq_len
    kept = np.array([u.activations.bytes_per_token(cb) for u in spec.blocks]) * spec.seq_len   # per sample
    ck = np.array([u.ckpt_activations.bytes_per_token(cb) for u in spec.blocks]) * spec.seq_len
    # selective blocks keep more than ck (a lower bound still) and recompute less than the
    # forward: with them allowed the recompute lower bound is 0
    allow_nc, allow_ck = False in space.checkpoint, checkpointing_allowed(space)
    selective = "selective" in space.checkpoint
    margin_bytes = 64.0 * (len(spec.blocks) + 2) * MEM_Q
    lean = np.minimum(kept, ck) if allow_nc and allow_ck else (ck if allow_ck else kept)
    fits = all_mbs * lean.sum() <= pq_max * MEM_Q + margin_bytes - floor.resident_bytes - all_mbs * root_act
    out = np.zeros(len(all_mbs))
    mbs = all_mbs[fits]
    if len(mbs) == 0:
        return MicroBatchBounds(all_mbs, out)
    tokens = mbs.astype(float) * spec.seq_len
    budget = pq_max * MEM_Q + margin_bytes - floor.resident_bytes - mbs * root_act       # for the blocks' activations
    splits = sorted(set(space.splits) | {1})
    shapes: dict = {}

    def times(g: OpGroup) -> tuple[np.ndarray, np.ndarray]:
        key = group_shape(g)
        if key not in shapes:
            per = [[group_compute_s(spec, g, hw, dtype, t, k) for t in tokens] for k in splits]
            shapes[key] = (np.min([[c for c, _ in row] for row in per], axis=0),
                           np.min([[r for _, r in row] for row in per], axis=0))
        return shapes[key]

    # the root as ddp: no all-gather copy-out, the least any root strategy is charged
    cfg0 = Config(devices_of(space, hw), 1, 1, 1, dtype, space.optimizer, "ddp")
    root_u = root_unit(spec, hw, cfg0.plan(spec, {"root": GroupChoice("ddp")}, ()))
    root = np.array([sum(root_compute_s(spec, g, hw, dtype, t, root_u) for g in spec.groups
                         if g.plan_key == "root") for t in tokens])
    block_both = [sum(times(g)[0] for g in u.groups) for u in spec.blocks]
    block_fwd = [sum(times(g)[1] for g in u.groups) for u in spec.blocks]      # the recompute
    compute = root + sum(block_both, np.zeros(len(mbs)))
    recompute = np.zeros(len(mbs))
    ok = mbs * lean.sum() <= budget
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
    out[fits] = ub
    return MicroBatchBounds(all_mbs, out)


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
