"""Lower a plan onto the FSDP units the runtime creates, with the cost of each.

A plan group becomes one FSDP unit, or, when split into k slices with j sharded, one unit for the
replicated part (biases, norms, the k - j unsharded slices of every Linear) plus one ZeRO-3 unit per
sharded slice of every Linear (each gathered on its own, so only one slice is materialised at a
time). The root unit holds the embedding and the head and is gathered once per step.
Compute is attached to "steps": the work a unit's parameters feed, in forward order.
"""

from dataclasses import dataclass, replace

from osdp_sim.costmodel.kernels import GroupWork, group_work, param_tensors
from osdp_sim.costmodel.rates import (attention_time_s, bandwidth_time_s, collective_time_s,
                                      gemm_shape_time_s, has_table, task_time_s)
from osdp_sim.costmodel.states import StateBytes, compute_bytes, reduce_bytes, state_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec, OpGroup
from osdp_sim.plan.plan import Plan

SLICE_OPS = (3, 6)             # eager ops of one more Linear slice: t, mm/addmm, view (backward: 2x)
# torch.optim ops per parameter tensor (single-tensor loop, CPU) and foreach ops per step (CUDA):
# AdamW's 10 per tensor counted with a TorchDispatchMode on torch 2.13 (bench/host_costs.py); SGD
# with momentum and the foreach counts read off torch/optim/sgd.py and adam.py
OPTIMIZER_OPS_PER_TENSOR = {"adamw": 10, "sgd": 3}
OPTIMIZER_FOREACH_OPS = {"adamw": 12, "sgd": 3}
# Bytes each fp32 local parameter costs the optimizer's kernels, as the runtime builds them
# (parallelize.make_optimizer: AdamW with weight decay 0, SGD with momentum 0.9), counted from
# torch.optim's adam.py / sgd.py (foreach and single-tensor alike): AdamW exp_avg.lerp_(grad)
# (r8 w4), exp_avg_sq *= beta2 (r4 w4) and += (1 - beta2) grad^2 (r8 w4), denom = sqrt(exp_avg_sq)
# (r4 w4), / bias correction (r4 w4), + eps (r4 w4), param.addcdiv_(exp_avg, denom) (r12 w4): 72 B;
# SGD buf *= momentum (r4 w4), += grad (r8 w4), param -= lr buf (r8 w4): 32 B.
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 72, "sgd": 32}
OPTIMIZER_KERNELS_PER_UNIT = 12


@dataclass(frozen=True)
class CommUnit:
    """One FSDP unit: the parameters gathered and reduced together."""

    name: str
    plan_key: str
    strategy: str                 # ddp | zero2 | zero3
    params: float                 # parameter elements
    states: StateBytes            # resident fp32 params, grads, optimizer state on one device
    gathered_bytes: float         # unsharded copy in the compute dtype while gathered
    unsharded_grad_bytes: float   # gradient in the compute dtype before reduction
    reduce_buffer_bytes: float    # fp32 copy handed to the collective (0 when grads are fp32 already)
                                  # (+ gloo's own copy of it on CPU)
    all_gather_s: float           # one all-gather (0 for ddp)
    reduce_s: float               # reduce-scatter (zero2/3) or all-reduce (ddp) of the gradients
    reduce_kind: str              # reduce_scatter | all_reduce
    replica_all_reduce_s: float   # HSDP: all-reduce of the sharded gradients across shard groups
    is_root: bool = False
    optimizer_temp_bytes: float = 0.0   # transient of the optimizer step over this unit's tensors
    param_tensors: int = 1        # parameter tensors (the optimizer's per-tensor work)

    @property
    def reshards_after_forward(self) -> bool:
        # ddp units run on a replicate mesh (shard group of one) whose compute copy is freed after
        # forward like ZeRO-3's (docs/runtime.md); FSDP2 never reshards the root after forward.
        return self.strategy in ("zero3", "ddp") and not self.is_root


@dataclass(frozen=True)
class Step:
    """Compute fed by one unit's parameters, in forward order."""

    name: str
    unit: int                     # index into Lowered.units
    block: int                    # -1 for embedding and head
    fwd_s: float
    bwd_s: float
    act_bytes: float              # kept for backward (without checkpointing)
    act_grad_bytes: float         # transient gradient of activations while its backward runs
    fwd_temp_bytes: float = 0.0   # transient during its forward only (the logits)
    bwd_temp_bytes: float = 0.0   # transient during its backward only (gradient of the logits)
    recompute_s: float = -1.0     # its forward again inside a checkpointed block's recompute
                                  # (no FSDP2 collective calls); < 0: same as fwd_s
    sac_recompute_s: float = 0.0  # its recompute when its block is selectively checkpointed
    sac_saved_bytes: float = 0.0  # mm outputs a selectively checkpointed block keeps for it

    @property
    def recompute_work_s(self) -> float:
        return self.fwd_s if self.recompute_s < 0 else self.recompute_s


@dataclass(frozen=True)
class Lowered:
    units: tuple[CommUnit, ...]
    steps: tuple[Step, ...]
    ckpt_bytes: dict              # block -> bytes a checkpointed block keeps (its input; if
                                  # selective also SDPA's outputs, its steps' sac_saved_bytes aside)
    checkpoint: tuple[bool, ...]
    optimizer_s: float
    optimizer_temp_bytes: float
    tokens: int                   # per micro-batch per device
    selective: tuple[bool, ...] = ()   # per block, as Plan.selective


def _scope(n: int, hw: HardwareProfile) -> str:
    return "inter" if n > hw.device.per_node else "intra"


def replica_all_reduce_s(hw: HardwareProfile, message_bytes: float, replicas: int, shard: int,
                         devices: int) -> float:
    """Hybrid sharding's all-reduce of the sharded gradients across the `replicas` shard groups:
    one group per position in the shard group, all at once. Across nodes, a measured `replica`
    table (profile-hw on several nodes: one rank per node, every local rank's group at once)
    gives each group's bus bandwidth under that concurrency; else the groups on one node share
    the inter-node link (busbw / the shard-group members per node)."""
    scope = _scope(devices, hw)
    if scope == "inter" and has_table(hw, "all_reduce", "replica"):
        return collective_time_s(hw, "all_reduce", message_bytes, replicas, "replica")
    sharing = min(shard, hw.device.per_node) if scope == "inter" else 1
    return collective_time_s(hw, "all_reduce", message_bytes, replicas, scope, sharing)


def optimizer_temp_sums(hw: HardwareProfile, optimizer: str) -> bool:
    """Whether the optimizer step's temporaries of all units are live at once. On CUDA tensors
    torch.optim.AdamW defaults to its foreach implementation (_multi_tensor_adam), which computes
    sqrt(v) for every local parameter tensor in one call (torch._foreach_sqrt) before using it:
    one fp32 temporary per parameter, all live together. Measured on one H200 (docs/accuracy-h200x1.md):
    gpt2-1.5b and llama-7b peak at the optimizer step 4 B per parameter above the states. On CPU
    AdamW runs its single-tensor loop (one parameter at a time). SGD keeps the one-unit term (not
    measured on CUDA)."""
    return hw.device.kind == "cuda" and optimizer == "adamw"


_UNITS: dict = {}                 # make_unit's arguments (the profile by identity) -> (profile, CommUnit)
_MAX_UNITS = 100_000


def clear_caches() -> None:
    """Forget the cached units and group times (a test that patches a cost rule calls it)."""
    _UNITS.clear()
    _TIMES.clear()


def make_unit(name: str, plan_key: str, strategy: str, params: float, hw: HardwareProfile,
              plan: Plan, is_root: bool = False, largest_tensor: float | None = None,
              tensors: int = 1) -> CommUnit:
    """`largest_tensor`: elements of the unit's largest parameter tensor (default: all of them);
    `tensors`: how many parameter tensors it holds. Cached: a unit does not depend on the
    micro-batch, and the search lowers every group at every micro-batch it considers."""
    key = (name, plan_key, strategy, params, id(hw), plan.shard_size, plan.devices, plan.precision,
           plan.optimizer, plan.replicas, is_root, largest_tensor, tensors)
    hit = _UNITS.get(key)
    if hit is None:
        if len(_UNITS) >= _MAX_UNITS:
            _UNITS.clear()
        hit = _UNITS[key] = (hw, _make_unit(name, plan_key, strategy, params, hw, plan, is_root,
                                            largest_tensor, tensors))
    return hit[1]


def _make_unit(name: str, plan_key: str, strategy: str, params: float, hw: HardwareProfile,
               plan: Plan, is_root: bool, largest_tensor: float | None, tensors: int) -> CommUnit:
    n, d = plan.shard_size, plan.devices
    cb, rb = compute_bytes(plan.precision), reduce_bytes(plan.precision)
    states = state_bytes(params, strategy, n, plan.optimizer)
    reduce_buffer = params * rb if rb != cb else 0.0
    if strategy != "ddp" and hw.device.kind == "cpu":
        # gloo's reduce-scatter works on its own copy of the input (MemTracker: 10 B per root
        # parameter live during the root's reduction, bf16 on 2 ranks; docs/cost-model.md).
        reduce_buffer += params * rb
    if hw.device.kind == "cpu" and plan.optimizer == "adamw":
        # On CPU tensors torch's AdamW runs its single-tensor loop, whose denominator
        # sqrt(v) / c + eps holds two fp32 temporaries the size of one local parameter tensor.
        largest = params if largest_tensor is None else largest_tensor
        opt_temp = 2.0 * 4 * (largest if strategy == "ddp" else largest / n)
    else:
        # On CUDA (foreach AdamW) sqrt(v) of this unit's local parameters, one fp32 tensor each;
        # optimizer_temp_sums() says whether the units' temporaries are live at once.
        opt_temp = states.params
    if strategy == "ddp":
        # No communication: the "all-gather" over a shard group of one is a local copy (cast) of
        # the fp32 parameters into the compute copy, on the all-gather stream.
        ag_s = bandwidth_time_s(hw, params * (4 + cb), 1)
        reduce_s = collective_time_s(hw, "all_reduce", params * rb, d, _scope(d, hw))
        kind, rep_s = "all_reduce", 0.0
    else:
        ag_s = collective_time_s(hw, "all_gather", params * cb, n, _scope(n, hw))
        reduce_s = collective_time_s(hw, "reduce_scatter", params * rb, n, _scope(n, hw))
        kind = "reduce_scatter"
        r = plan.replicas
        rep_s = replica_all_reduce_s(hw, params * rb / n, r, n, d) if r > 1 else 0.0
    return CommUnit(name=name, plan_key=plan_key, strategy=strategy, params=params, states=states,
                    gathered_bytes=params * cb, unsharded_grad_bytes=params * cb,
                    reduce_buffer_bytes=reduce_buffer,
                    all_gather_s=ag_s, reduce_s=reduce_s, reduce_kind=kind,
                    replica_all_reduce_s=rep_s, is_root=is_root, optimizer_temp_bytes=opt_temp,
                    param_tensors=tensors)


def largest_tensor(g: OpGroup, cfg=None) -> float:
    """Elements of the largest parameter tensor of one group: the token table of the embedding
    (cfg: the model's config), else the largest Linear weight (norms and biases are smaller)."""
    if g.largest_param:
        return float(g.largest_param)
    if g.kind == "embed":
        return float(cfg.vocab_size * cfg.hidden)
    if g.linears:
        return float(max(l.weight_params for l in g.linears))
    return float(g.other_params)


def root_largest_tensor(spec: ModelSpec) -> float:
    return max(largest_tensor(g, spec.config) for g in spec.groups if g.plan_key == "root")


@dataclass(frozen=True)
class GroupTimes:
    """Device and host time of one group's kernels for one micro-batch (seconds): the parts that
    every plan of the group runs once, and one slice of each Linear (of `slices`)."""

    fixed_fwd_s: float            # attention kernel and memory-bound kernels, forward
    fixed_bwd_s: float
    attention_fwd_s: float        # the attention kernel alone (part of fixed_fwd_s)
    slice_fwd_s: dict             # Linear name -> forward GEMM of one slice (all experts)
    slice_bwd_s: dict             # Linear name -> both backward GEMMs of one slice
    host_fwd_s: float             # the group's eager ops, forward (no FSDP2 hooks)
    host_bwd_s: float


_TIMES: dict = {}                 # (ids of config, group, profile), dtype, tokens, slices -> (them, GroupTimes)
_MAX_TIMES = 100_000


def group_times(spec: ModelSpec, g: OpGroup, hw: HardwareProfile, dtype: str, tokens: int,
                slices: int = 1) -> GroupTimes:
    """The kernels of kernels.group_work costed on the profile (rates.py). Backward GEMMs: the
    input gradient (M tokens, N in, K out) and the weight gradient (M out, N in, K tokens).
    Cached by the identity of the (frozen) config, group and profile: every strategy of a group
    at one micro-batch and split runs the same kernels, and the search costs them all."""
    key = (id(spec.config), id(g), id(hw), dtype, tokens, slices)
    hit = _TIMES.get(key)
    if hit is None:
        if len(_TIMES) >= _MAX_TIMES:
            _TIMES.clear()
        hit = _TIMES[key] = (spec.config, g, hw, _group_times(spec, g, hw, dtype, tokens, slices))
    return hit[3]


def _group_times(spec: ModelSpec, g: OpGroup, hw: HardwareProfile, dtype: str, tokens: int,
                 slices: int) -> GroupTimes:
    cb = compute_bytes(dtype)
    w: GroupWork = group_work(spec.config, g, tokens, cb, hw.device.kind == "cpu")
    fwd = {l.name: 0.0 for l in g.linears}
    bwd = dict(fwd)
    for gm in w.gemms:
        # a slice of a Linear holds out / slices rows of its weight; of a stack of experts,
        # copies / slices whole experts
        n, count = (gm.n / slices, 1.0) if gm.count == 1 else (gm.n, gm.count / slices)
        fwd[gm.name] = count * gemm_shape_time_s(hw, gm.m, n, gm.k, dtype, cb)
        bwd[gm.name] = count * (gemm_shape_time_s(hw, gm.m, gm.k, n, dtype, cb)
                                + gemm_shape_time_s(hw, n, gm.k, gm.m, dtype, cb))
    attn_f = attn_b = 0.0
    if w.attention is not None:
        a = w.attention
        attn_f = attention_time_s(hw, a.flops, a.keys, a.bytes_moved, dtype)
        attn_b = hw.compute.attention_backward_ratio * attn_f
    mem = w.memory
    mem_f = bandwidth_time_s(hw, mem.fwd_bytes, mem.fwd_kernels)
    mem_b = bandwidth_time_s(hw, mem.bwd_bytes, mem.bwd_kernels)
    extra_f, extra_b = (slices - 1) * len(g.linears) * SLICE_OPS[0], (slices - 1) * len(g.linears) * SLICE_OPS[1]
    op = hw.host.op_s
    return GroupTimes(attn_f + mem_f, attn_b + mem_b, attn_f, fwd, bwd,
                      (w.fwd_ops + extra_f) * op, (w.bwd_ops + extra_b) * op)


def copy_out_s(hw: HardwareProfile, gathered_bytes: float) -> float:
    """FSDP2's copy of an all-gather's output into the unit's parameters (split_with_sizes_copy
    in the unit's pre-forward / pre-backward), on the compute stream: read and write once."""
    return bandwidth_time_s(hw, 2.0 * gathered_bytes, 1)


def copy_in_s(hw: HardwareProfile, unsharded_grad_bytes: float) -> float:
    """FSDP2 copies a unit's gradients into the reduce-scatter input (foreach_reduce). On a GPU that
    runs on the reduction's own stream; on a CPU device on the thread that computes."""
    if hw.host.async_device:
        return 0.0
    return bandwidth_time_s(hw, 2.0 * unsharded_grad_bytes, 1)


def calls_s(hw: HardwareProfile, calls: int) -> float:
    """Host time of FSDP2's work around `calls` collectives of one unit (its hook, the copy-in and
    copy-out bookkeeping, the process group's call and wait), host.call_s each."""
    return calls * hw.host.call_s


def collective_calls(u: CommUnit) -> tuple[int, int]:
    """Collectives one unit issues in forward and in backward, as FSDP2 runs them: an all-gather
    before forward (a ddp unit's over its shard group of one, docs/runtime.md), again before
    backward when resharded after forward (zero3, ddp; never the root), then the reduce-scatter
    (over one rank for ddp) and an all-reduce across replicas (ddp's (world, 1) mesh, HSDP)."""
    regather = u.reshards_after_forward
    all_reduce = u.strategy == "ddp" or u.replica_all_reduce_s > 0
    return 1, int(regather) + 1 + int(all_reduce)


def unit_optimizer_s(hw: HardwareProfile, u: CommUnit, optimizer: str) -> float:
    """The optimizer step over one unit's local shards: the device streams the fp32 parameters,
    gradients and states (OPTIMIZER_BYTES_PER_PARAM) in its kernels; the host dispatches
    torch.optim's ops. CUDA's default foreach implementation issues each op once for a list of
    tensors (per-tensor cost at the plain op rate); CPU's single-tensor loop issues each op per
    parameter tensor, on DTensors (FSDP2's sharded parameters): dtensor_op_s each."""
    device = bandwidth_time_s(hw, u.states.params / 4.0 * OPTIMIZER_BYTES_PER_PARAM[optimizer],
                              OPTIMIZER_KERNELS_PER_UNIT)
    if hw.host.async_device:
        host = OPTIMIZER_FOREACH_OPS[optimizer] * u.param_tensors * hw.host.op_s
    else:
        host = OPTIMIZER_OPS_PER_TENSOR[optimizer] * u.param_tensors * hw.host.dtensor_op_s
    return task_time_s(hw, device, host)


def root_unit(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> CommUnit:
    """The root unit: the embedding and the head, gathered once per step."""
    tensors = sum(param_tensors(spec.config, g) for g in spec.groups if g.plan_key == "root")
    return make_unit("root", "root", plan.choices["root"].strategy, spec.params_of("root"), hw, plan,
                     True, root_largest_tensor(spec), tensors)


def root_step(spec: ModelSpec, g: OpGroup, hw: HardwareProfile, plan: Plan, root: CommUnit) -> Step:
    """The embedding's or the head's step (unit 0)."""
    cfg = spec.config
    tokens = plan.micro_batch * cfg.seq_len
    cb = compute_bytes(plan.precision)
    fwd, bwd = root_step_times(spec, g, hw, plan.precision, tokens, root)
    head = g.kind == "head"
    logits = tokens * cfg.vocab_size
    # The head's backward peaks in the loss gradient (bwd_temp, 8 B per logit); the gradient of
    # its input comes after that is cast down and counts as the incoming gradient of the next
    # backward step, so the head has no act_grad of its own.
    return Step(g.name, 0, -1, fwd, bwd, g.activations.bytes_for(cb, tokens),
                0.0 if head else act_grad_bytes(spec, plan),
                fwd_temp_bytes=logits * (cb + 4) if head else 0.0,
                bwd_temp_bytes=logits * (4 + 4) if head else 0.0)


def act_grad_bytes(spec: ModelSpec, plan: Plan) -> float:
    """The gradient of a step's input activations while its backward runs: one hidden-sized
    tensor per token in the compute dtype, and the one it computes from (2x)."""
    return 2.0 * plan.micro_batch * spec.seq_len * spec.config.hidden * compute_bytes(plan.precision)


def check_selective(spec: ModelSpec, plan: Plan) -> None:
    """One-line UserError for selective blocks the model does not cover."""
    if not any(plan.selective):
        return
    from osdp_sim.errors import UserError
    from osdp_sim.model.spec import selective_supported
    why = selective_supported(spec.config)
    if why:
        raise UserError(why, source=spec.config.source or spec.name, field="selective")
    for u in spec.blocks:
        attn, mlp = u.groups
        if plan.selective[u.index] and mlp.mm_before % 2 and plan.choices[attn.plan_key].is_split:
            # a split attention makes the MLP's mm count even: another saved set than modelled
            raise UserError(f"block {u.index}: selective checkpointing with a split attention is not "
                            f"modelled for {spec.name!r} (an odd number of bias-free attention "
                            "Linears); leave the attention unsplit or checkpoint fully",
                            source=spec.config.source or spec.name, field="selective")


def lower(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> Lowered:
    check_selective(spec, plan)
    cfg = spec.config
    tokens = plan.micro_batch * cfg.seq_len
    cb = compute_bytes(plan.precision)

    units: list[CommUnit] = [root_unit(spec, hw, plan)]
    steps: list[Step] = []
    for unit in spec.units:
        for g in unit.groups:
            if g.plan_key == "root":
                steps.append(root_step(spec, g, hw, plan, units[0]))
                continue
            steps.extend(lower_group(spec, g, unit.index, hw, plan, units))

    sel = plan.selective
    ckpt_bytes = {u.index: (u.sac_activations if sel[u.index] else u.ckpt_activations).bytes_for(cb, tokens)
                  for u in spec.blocks}
    optimizer_s = sum(unit_optimizer_s(hw, u, plan.optimizer) for u in units)
    # The optimizer's temporaries: every unit's at once under foreach AdamW (CUDA), else the
    # largest unit's (make_unit; on CPU two fp32 tensors the size of its largest local tensor).
    temps = [u.optimizer_temp_bytes for u in units]
    optimizer_temp = sum(temps) if optimizer_temp_sums(hw, plan.optimizer) else max(temps)
    return Lowered(tuple(units), tuple(steps), ckpt_bytes, plan.checkpoint, optimizer_s,
                   optimizer_temp, tokens, sel)


def root_step_times(spec: ModelSpec, g: OpGroup, hw: HardwareProfile, dtype: str, tokens: int,
                     root: CommUnit) -> tuple[float, float]:
    """Forward and backward of the embedding or the head. The root unit's hooks, its all-gather's
    copy-out and its gradients' copy-in are charged to the embedding (its first forward step and
    its last backward step)."""
    t = group_times(spec, g, hw, dtype, tokens)
    if g.kind == "head" and not g.linears:
        # a tied head has no Linear of its own: the logits GEMM (M tokens, N vocab, K hidden)
        cfg = spec.config
        cb = compute_bytes(dtype)
        v, h = cfg.vocab_size, cfg.hidden
        t = replace(t, slice_fwd_s={"logits": gemm_shape_time_s(hw, tokens, v, h, dtype, cb)},
                    slice_bwd_s={"logits": gemm_shape_time_s(hw, tokens, h, v, dtype, cb)
                                 + gemm_shape_time_s(hw, v, h, tokens, dtype, cb)})
    dev_f = t.fixed_fwd_s + sum(t.slice_fwd_s.values())
    dev_b = t.fixed_bwd_s + sum(t.slice_bwd_s.values())
    host_f, host_b = t.host_fwd_s, t.host_bwd_s
    if g.kind == "embed":
        if root.strategy != "ddp":
            dev_f += copy_out_s(hw, root.gathered_bytes)
        dev_b += copy_in_s(hw, root.unsharded_grad_bytes)
        calls_f, calls_b = collective_calls(root)
        host_f += calls_s(hw, calls_f)
        host_b += calls_s(hw, calls_b)
    return task_time_s(hw, dev_f, host_f), task_time_s(hw, dev_b, host_b)


def _step(hw: HardwareProfile, name: str, unit_index: int, u: CommUnit, block: int, dev_f: float,
          dev_b: float, host_f: float, host_b: float, act: float, act_grad: float,
          bwd_temp: float = 0.0, sac: tuple[float, float] = (0.0, 0.0)) -> Step:
    """One non-root step: its unit's collective calls, copy-out (each all-gather) and copy-in added.
    sac: (recompute, kept bytes) under selective checkpointing (selective_recompute)."""
    calls_f, calls_b = collective_calls(u)
    gathers_f = u.strategy != "ddp"           # ddp's "all-gather" is the local copy of make_unit
    gathers_b = u.reshards_after_forward and gathers_f
    cf = copy_out_s(hw, u.gathered_bytes) if gathers_f else 0.0
    cb_ = copy_out_s(hw, u.gathered_bytes) if gathers_b else 0.0
    return Step(name, unit_index, block,
                task_time_s(hw, dev_f + cf, host_f + calls_s(hw, calls_f)),
                task_time_s(hw, dev_b + cb_ + copy_in_s(hw, u.unsharded_grad_bytes), host_b + calls_s(hw, calls_b)),
                act, act_grad, bwd_temp_bytes=bwd_temp, recompute_s=task_time_s(hw, dev_f, host_f),
                sac_recompute_s=sac[0], sac_saved_bytes=sac[1])


def lower_group(spec: ModelSpec, g: OpGroup, block: int, hw: HardwareProfile, plan: Plan,
                units: list) -> list[Step]:
    """The steps of one (non-root) group under the plan's choice for it, in forward order; its
    units are appended to `units` (the steps' `unit` index into it)."""
    c = plan.choices[g.plan_key]
    dtype = plan.precision
    tokens = plan.micro_batch * spec.seq_len
    act = g.activations.bytes_for(compute_bytes(dtype), tokens)
    act_grad = act_grad_bytes(spec, plan)
    k, j = c.slices, c.sharded_slices
    t = group_times(spec, g, hw, dtype, tokens, k)
    # measured for described groups (model/describe.py), 0 for the built-in families
    bwd_temp = g.bwd_temp.bytes_per_token(compute_bytes(dtype)) * tokens
    tensors = param_tensors(spec.config, g)

    out_bytes = tokens * compute_bytes(dtype)
    if not c.is_split:
        units.append(make_unit(g.name, g.plan_key, c.strategy, g.param_count, hw, plan,
                               largest_tensor=largest_tensor(g), tensors=tensors))
        u = units[-1]
        (sac,) = selective_recompute(hw, g, c, t, [t.host_fwd_s], out_bytes)
        return [_step(hw, g.name, len(units) - 1, u, block,
                      t.fixed_fwd_s + sum(t.slice_fwd_s.values()), t.fixed_bwd_s + sum(t.slice_bwd_s.values()),
                      t.host_fwd_s, t.host_bwd_s, act, act_grad, bwd_temp, sac)]

    # Replicated part: norms, biases, the k - j unsharded slices of every Linear.
    rep_params = g.param_count - g.splittable_params * j / k
    # the k - j unsharded slices of a Linear are separate tensors of weight / k elements
    rep_largest = max(l.weight_params for l in g.linears) / k if k > j else float(g.other_params)
    units.append(make_unit(g.name, g.plan_key, c.strategy, rep_params, hw, plan,
                           largest_tensor=rep_largest,
                           tensors=max(1, tensors + len(g.linears) * (k - j - 1))))
    slice_host_f, slice_host_b = SLICE_OPS[0] * hw.host.op_s, SLICE_OPS[1] * hw.host.op_s
    shared_f = j * len(g.linears) * slice_host_f          # the sharded slices' ops run in their own steps
    shared_b = j * len(g.linears) * slice_host_b
    hosts = [max(0.0, t.host_fwd_s - shared_f)] + [slice_host_f] * (j * len(g.linears))
    sac = selective_recompute(hw, g, c, t, hosts, out_bytes)
    steps = [_step(hw, g.name, len(units) - 1, units[-1], block,
                   t.fixed_fwd_s + (k - j) * sum(t.slice_fwd_s.values()),
                   t.fixed_bwd_s + (k - j) * sum(t.slice_bwd_s.values()),
                   hosts[0], max(0.0, t.host_bwd_s - shared_b), act, act_grad, bwd_temp, sac[0])]
    zero3 = "zero3"
    for lin in g.linears:
        for s in range(j):
            name = f"{g.name}/{lin.name}.s{s}"
            units.append(make_unit(name, g.plan_key, zero3, lin.weight_params / k, hw, plan,
                                   largest_tensor=lin.weight_params / k))
            steps.append(_step(hw, name, len(units) - 1, units[-1], block, t.slice_fwd_s[lin.name],
                               t.slice_bwd_s[lin.name], slice_host_f, slice_host_b, 0.0, 0.0,
                               sac=sac[len(steps)]))
    return steps


def selective_recompute(hw: HardwareProfile, g: OpGroup, c, t: GroupTimes, hosts: list[float],
                        out_bytes_per_feature: float) -> list[tuple[float, float]]:
    """Per step of one group (lower_group's order: the group's step, then each Linear's sharded
    slices; `hosts` has one entry per step), (recompute, kept bytes) under selective
    checkpointing (torchtitan 820504e2's op policy, runtime/selective.py): it recomputes the
    memory-bound work and every mm it does not save, never the attention kernel (SDPA's outputs
    are saved); it keeps the outputs of the 1st, 3rd, ... aten.mm of the block (a biased unsplit
    Linear is an addmm: recomputed, kept nothing, not counted). The host dispatches every forward
    op again (`hosts`, per step; a saved op's output comes from the cache), no collective call.
    `out_bytes_per_feature`: tokens x compute-dtype bytes."""
    from osdp_sim.model.spec import mm_calls, mm_saved
    k, j = c.slices, c.sharded_slices
    slice_s = t.slice_fwd_s
    before = g.mm_before
    rc = [0.0] * len(hosts)
    kept = [0.0] * len(hosts)
    rc[0] = t.fixed_fwd_s - t.attention_fwd_s
    for li, lin in enumerate(g.linears):
        calls = mm_calls(lin, k)
        for s in range(max(calls, 1)):
            # slice s of a split Linear runs in step 1 + li * j + s if sharded, else in step 0
            at = 1 + li * j + s if c.is_split and s < j else 0
            if calls and mm_saved(before + s):
                kept[at] += lin.out_features * out_bytes_per_feature
            else:
                rc[at] += slice_s[lin.name]
        before += calls
    return [(task_time_s(hw, r, h), b) for r, h, b in zip(rc, hosts, kept)]
