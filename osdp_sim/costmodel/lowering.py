"""Lower a plan onto the FSDP units the runtime creates, with the cost of each.

A plan group becomes one FSDP unit, or, when split into k slices with j sharded, one unit for the
replicated part (biases, norms, the k - j unsharded slices of every Linear) plus one ZeRO-3 unit per
sharded slice of every Linear (each gathered on its own, so only one slice is materialised at a
time). The root unit holds the embedding and the head and is gathered once per step.
Compute is attached to "steps": the work a unit's parameters feed, in forward order.
"""

from dataclasses import dataclass

from osdp_sim.costmodel.rates import bandwidth_time_s, collective_time_s, gemm_time_s, has_table
from osdp_sim.costmodel.states import StateBytes, compute_bytes, reduce_bytes, state_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec, OpGroup
from osdp_sim.plan.plan import Plan

FWD_KERNELS_PER_GROUP = 8      # norm, residual, activation, reshapes: launches besides the GEMMs


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
    sac_recompute_s: float = 0.0  # its recompute when its block is selectively checkpointed
    sac_saved_bytes: float = 0.0  # mm outputs a selectively checkpointed block keeps for it


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


def make_unit(name: str, plan_key: str, strategy: str, params: float, hw: HardwareProfile,
              plan: Plan, is_root: bool = False, largest_tensor: float | None = None) -> CommUnit:
    """`largest_tensor`: elements of the unit's largest parameter tensor (default: all of them)."""
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
                    replica_all_reduce_s=rep_s, is_root=is_root, optimizer_temp_bytes=opt_temp)


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


def _fwd_elementwise_s(hw: HardwareProfile, act_bytes: float) -> float:
    # Elementwise work reads and writes roughly what it saves for backward.
    return bandwidth_time_s(hw, 2.0 * act_bytes, FWD_KERNELS_PER_GROUP)


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
    dtype = plan.precision
    ratio = hw.compute.backward_forward_ratio
    act_grad = 2.0 * tokens * cfg.hidden * cb

    units: list[CommUnit] = []
    steps: list[Step] = []
    root_params = spec.params_of("root")
    units.append(make_unit("root", "root", plan.choices["root"].strategy, root_params, hw, plan, True,
                           root_largest_tensor(spec)))

    for unit in spec.units:
        for g in unit.groups:
            act = g.activations.bytes_for(cb, tokens)
            if g.plan_key == "root":
                fwd = _root_fwd_s(g, hw, dtype, tokens, act)
                logits = tokens * cfg.vocab_size
                # The head's backward peaks in the loss gradient (bwd_temp, 8 B per logit); the
                # gradient of its input comes after that is cast down and counts as the incoming
                # gradient of the next backward step, so the head has no act_grad of its own.
                steps.append(Step(g.name, 0, -1, fwd, ratio * fwd, act,
                                  0.0 if g.kind == "head" else act_grad,
                                  fwd_temp_bytes=logits * (cb + 4) if g.kind == "head" else 0.0,
                                  bwd_temp_bytes=logits * (4 + 4) if g.kind == "head" else 0.0))
                continue
            steps.extend(_lower_group(g, unit.index, hw, plan, units, tokens, act, act_grad, ratio))

    sel = plan.selective
    ckpt_bytes = {u.index: (u.sac_activations if sel[u.index] else u.ckpt_activations).bytes_for(cb, tokens)
                  for u in spec.blocks}
    local_params = sum(u.states.params for u in units) / 4.0          # fp32 elements held locally
    opt_bytes_moved = local_params * {"adamw": 2 * (4 + 4 + 8), "sgd": 2 * (4 + 4 + 4)}[plan.optimizer]
    optimizer_s = bandwidth_time_s(hw, opt_bytes_moved, 12 * len(units))
    # The optimizer's temporaries: every unit's at once under foreach AdamW (CUDA), else the
    # largest unit's (make_unit; on CPU two fp32 tensors the size of its largest local tensor).
    temps = [u.optimizer_temp_bytes for u in units]
    optimizer_temp = sum(temps) if optimizer_temp_sums(hw, plan.optimizer) else max(temps)
    return Lowered(tuple(units), tuple(steps), ckpt_bytes, plan.checkpoint, optimizer_s,
                   optimizer_temp, tokens, sel)


def linear_time_s(hw: HardwareProfile, l, tokens: int, dtype: str, slices: int = 1) -> float:
    """Forward GEMMs of one slice (of `slices`) of a Linear over `tokens`. A stack of MoE experts
    is one GEMM per expert over the tokens routed to it (tokens x active / copies under balanced
    routing); a slice of the stack holds copies / slices experts."""
    if l.copies == 1:
        return gemm_time_s(hw, tokens * l.fwd_flops_per_token / slices, dtype)
    return l.copies / slices * gemm_time_s(hw, tokens * l.fwd_flops_per_token / l.copies, dtype)


def _root_fwd_s(g: OpGroup, hw: HardwareProfile, dtype: str, tokens: int, act: float) -> float:
    gemms = sum(gemm_time_s(hw, 2.0 * tokens * l.weight_params, dtype) for l in g.linears)
    if g.kind == "head":
        # Tied heads have no Linear of their own; the logits GEMM is in fwd_flops_per_token.
        gemms = gemm_time_s(hw, tokens * g.fwd_flops_per_token, dtype)
    return gemms + _fwd_elementwise_s(hw, act)


def _lower_group(g: OpGroup, block: int, hw: HardwareProfile, plan: Plan, units: list,
                 tokens: int, act: float, act_grad: float, ratio: float) -> list[Step]:
    c = plan.choices[g.plan_key]
    dtype = plan.precision
    k, j = c.slices, c.sharded_slices
    linear_flops = sum(l.fwd_flops_per_token for l in g.linears)
    attn_core = tokens * (g.fwd_flops_per_token - linear_flops)     # scores and weighted sum
    core_s = 2 * gemm_time_s(hw, attn_core / 2, dtype) if attn_core > 0 else 0.0
    elem_s = _fwd_elementwise_s(hw, act)
    slice_s = {l.name: linear_time_s(hw, l, tokens, dtype, k) for l in g.linears}
    # measured for described groups (model/describe.py), 0 for the built-in families
    bwd_temp = g.bwd_temp.bytes_per_token(compute_bytes(dtype)) * tokens

    if not c.is_split:
        units.append(make_unit(g.name, g.plan_key, c.strategy, g.param_count, hw, plan,
                               largest_tensor=largest_tensor(g)))
        fwd = core_s + elem_s + sum(slice_s.values())
        return selective_recompute(g, c, [Step(g.name, len(units) - 1, block, fwd, ratio * fwd, act,
                                               act_grad, bwd_temp_bytes=bwd_temp)],
                                   elem_s, slice_s, tokens * compute_bytes(dtype))

    # Replicated part: norms, biases, the k - j unsharded slices of every Linear.
    rep_params = g.param_count - g.splittable_params * j / k
    # the k - j unsharded slices of a Linear are separate tensors of weight / k elements
    rep_largest = max(l.weight_params for l in g.linears) / k if k > j else float(g.other_params)
    units.append(make_unit(g.name, g.plan_key, c.strategy, rep_params, hw, plan,
                           largest_tensor=rep_largest))
    rep_fwd = core_s + elem_s + (k - j) * sum(slice_s.values())
    steps = [Step(g.name, len(units) - 1, block, rep_fwd, ratio * rep_fwd, act, act_grad,
                  bwd_temp_bytes=bwd_temp)]
    zero3 = "zero3"
    for lin in g.linears:
        for s in range(j):
            name = f"{g.name}/{lin.name}.s{s}"
            units.append(make_unit(name, g.plan_key, zero3, lin.weight_params / k, hw, plan,
                                   largest_tensor=lin.weight_params / k))
            steps.append(Step(name, len(units) - 1, block, slice_s[lin.name], ratio * slice_s[lin.name],
                              0.0, 0.0))
    return selective_recompute(g, c, steps, elem_s, slice_s, tokens * compute_bytes(dtype))


def selective_recompute(g: OpGroup, c, steps: list[Step], elem_s: float, slice_s: dict,
                        out_bytes_per_feature: float) -> list[Step]:
    """`steps` (one group, _lower_group's order: the group's step, then each Linear's sharded
    slices) with what selective checkpointing (torchtitan 820504e2's op policy,
    runtime/selective.py) recomputes and keeps: it recomputes the elementwise work and every mm
    it does not save, never the attention core (SDPA's outputs are saved); it keeps the outputs of
    the 1st, 3rd, ... aten.mm of the block (a biased unsplit Linear is an addmm: recomputed,
    kept nothing, not counted). `out_bytes_per_feature`: tokens x compute-dtype bytes."""
    from dataclasses import replace

    from osdp_sim.model.spec import mm_calls, mm_saved
    k, j = c.slices, c.sharded_slices
    before = g.mm_before
    rc = [0.0] * len(steps)
    kept = [0.0] * len(steps)
    rc[0] = elem_s
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
    return [replace(st, sac_recompute_s=r, sac_saved_bytes=b) for st, r, b in zip(steps, rc, kept)]
