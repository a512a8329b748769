"""Apply a searched plan to the user's own model: `apply_plan(model, plan, layout=...)`.

The model is any torch module whose layout (osdp_sim/model/layout.py) says where its blocks,
groups and root are: osdp-sim's own modules and the Hugging Face architectures of HF_LAYOUTS are
recognised from their class, anything else passes a ModelLayout. Every plan feature is applied
or refused with a one-line UserError, never dropped:

  per-group ddp / zero2 / zero3, splits      -> parallelize.shard_group (children first)
  checkpoint[i]                               -> block i's forward runs under torch.utils.checkpoint
  selective[i]                                -> ... with torchtitan's op-level policy (context_fn)
  precision                                   -> MixedPrecisionPolicy on every unit
  shard_group < devices (hybrid sharding)     -> the 2-D shard mesh
  root                                        -> parallelize.shard_root, last
  micro_batch, grad_accum, optimizer          -> returned in AppliedPlan for the caller's loop
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint

from osdp_sim.errors import UserError
from osdp_sim.model.layout import (HF_LAYOUTS, ModelLayout, SplitTarget, builtin_layout,
                                   hf_layout)
from osdp_sim.plan.plan import GroupChoice, Plan
from osdp_sim.runtime import parallelize
from osdp_sim.runtime.split_linear import split_experts, split_linear


@dataclass(frozen=True)
class GroupApplied:
    """What apply_plan did to one operator group."""

    key: str
    """The plan key: 'root', 'block{i}.attn', 'block{i}.mlp'."""

    modules: tuple[str, ...]
    """Model paths of the group's modules (one FSDP2 unit together)."""

    strategy: str
    """ddp, zero2 or zero3 of the group unit (for a split group: of its unsharded slices)."""

    split_modules: tuple[str, ...] = ()
    """Model paths of the modules cut into `slices`, each sharded slice its own ZeRO-3 unit."""

    slices: int = 1
    """Slices per split module (1: not split)."""

    sharded_slices: int = 0
    """Slices per split module that are ZeRO-3 units of their own."""


@dataclass(frozen=True)
class AppliedPlan:
    """A plan applied to a model: the module to train and what the caller's loop must do.

    One optimizer step is `grad_accum` micro-steps of `micro_batch` sequences per rank (a global
    batch of micro_batch * grad_accum * devices); with reduce_every_microbatch False, turn
    gradient sync off for all micro-steps but the last (FSDP2:
    model.set_requires_gradient_sync(False)). Scale each micro-step's loss by 1 / grad_accum.
    """

    model: nn.Module
    """The module to train: the model itself (FSDP2 shards in place) or FairScale's wrapper."""

    layout: ModelLayout
    """The layout used (given, or recognised from the model's class)."""

    micro_batch: int
    """Sequences per rank per micro-step."""

    grad_accum: int
    """Micro-steps per optimizer step."""

    reduce_every_microbatch: bool
    """Reduce gradients after every micro-step (True) or once per step, after the last."""

    precision: str
    """fp32, or bf16: bf16 compute, fp32 gradient reduction and master weights."""

    optimizer: str
    """adamw or sgd, as make_optimizer builds it."""

    groups: dict
    """plan key -> GroupApplied, root included."""

    checkpointed_blocks: tuple[int, ...]
    """Indices of the blocks whose forward is recomputed in backward."""

    notes: tuple[str, ...] = ()
    """Changes made to the model beyond sharding (e.g. Hugging Face's KV cache turned off)."""

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * dist.get_world_size()


def resolve_layout(model: nn.Module, layout: ModelLayout | None = None) -> ModelLayout:
    """The given layout, else the built-in one for the model's class (or the nearest base class
    that has one: a subclass of LlamaForCausalLM is laid out as a Llama)."""
    if layout is not None:
        if not isinstance(layout, ModelLayout):
            raise UserError(f"expected a ModelLayout, got {type(layout).__name__}", field="layout")
        return layout
    from osdp_sim.runtime.modules import TransformerLM
    if isinstance(model, TransformerLM):
        return builtin_layout(model.config.family)
    for cls in type(model).__mro__:
        if cls.__name__ in HF_LAYOUTS:
            return HF_LAYOUTS[cls.__name__]
    return hf_layout(type(model).__name__)              # the error listing the known classes


def blocks_of(model: nn.Module, layout: ModelLayout) -> list[tuple[str, nn.Module]]:
    """(key, block) of the layout's block list, in order."""
    try:
        container = model.get_submodule(layout.blocks)
    except AttributeError:
        raise UserError(f"no module {layout.blocks!r} in {type(model).__name__}",
                        field="layout.blocks") from None
    if not isinstance(container, (nn.ModuleList, nn.ModuleDict)):
        raise UserError(f"{layout.blocks!r} is a {type(container).__name__}; the block list must "
                        "be an nn.ModuleList or nn.ModuleDict", field="layout.blocks")
    return list(container.items()) if isinstance(container, nn.ModuleDict) \
        else [(str(i), b) for i, b in enumerate(container)]


def _check_plan_fits(model: nn.Module, plan: Plan, layout: ModelLayout, n_blocks: int) -> None:
    if n_blocks != plan.model.n_layers:
        raise UserError(f"the plan is for {plan.model.n_layers} blocks, {type(model).__name__} has "
                        f"{n_blocks} at {layout.blocks}; search a plan for this model",
                        field="model.n_layers")
    expected = {"root"} | {f"block{i}.{g}" for i in range(n_blocks) for g in ("attn", "mlp")}
    if set(plan.choices) != expected:
        missing = sorted(expected - set(plan.choices))
        extra = sorted(set(plan.choices) - expected)
        raise UserError(f"plan groups do not match the model (missing {missing}, unknown {extra})",
                        field="groups")
    if len(plan.checkpoint) != n_blocks:
        raise UserError(f"checkpoint lists {len(plan.checkpoint)} blocks, the model has {n_blocks}",
                        field="checkpoint")
    if plan.choices["root"].is_split:
        raise UserError("the root (embedding and head) cannot be split; give it slices 1",
                        field="groups.root")


def _check_coverage(model: nn.Module, layout: ModelLayout,
                    blocks: list[tuple[str, nn.Module]]) -> None:
    """Every parameter under exactly one group or the root: a parameter the layout misses would
    silently fall into the root unit, and the plan would not be what runs."""
    owners = [layout.block_path(k) + "." + m for k, _ in blocks
              for kind in ("attn", "mlp") for m in layout.group(kind).modules]
    block_prefixes = [layout.block_path(k) + "." for k, _ in blocks]
    roots = [r + "." for r in layout.root]
    for name, _ in model.named_parameters():
        if any(name.startswith(p) for p in block_prefixes):
            if not any(name.startswith(o + ".") for o in owners):
                raise UserError(f"parameter {name!r} is in a block but in neither its attn nor its "
                                f"mlp group; add its module to one", field="layout.modules")
        elif not any(name.startswith(r) for r in roots):
            raise UserError(f"parameter {name!r} is outside the blocks and the root; add its module "
                            f"to the layout's root", field="layout.root")


def _split_size(module: nn.Module, target: SplitTarget) -> tuple[int, str]:
    """(the size a split divides, what it counts) for one split target; refuses a module whose
    type does not match the target's kind."""
    if target.kind == "linear":
        if not isinstance(module, nn.Linear):
            raise UserError(f"{target.path} is a {type(module).__name__}, not an nn.Linear",
                            field="layout.splits.kind")
        return module.in_features, "input features"
    if target.kind == "conv1d":
        w = getattr(module, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise UserError(f"{target.path} ({type(module).__name__}) has no 2-D weight [in, out]",
                            field="layout.splits.kind")
        return w.shape[0], "input features"
    w = getattr(module, "gate_up_proj", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise UserError(f"{target.path} ({type(module).__name__}) has no fused 3-D gate_up_proj",
                        field="layout.splits.kind")
    return w.shape[0], "experts"


def _check_splits(plan: Plan, layout: ModelLayout, blocks: list[tuple[str, nn.Module]]) -> None:
    for i, (_, block) in enumerate(blocks):
        for kind in ("attn", "mlp"):
            key = f"block{i}.{kind}"
            choice = plan.choices[key]
            if not choice.is_split:
                continue
            targets = layout.group(kind).splits
            if not targets:
                raise UserError(f"the plan splits this group but layout {layout.name} names no "
                                f"splittable module in {kind}", field=f"groups.{key}")
            for target in targets:
                size, what = _split_size(block.get_submodule(target.path), target)
                if size % choice.slices:
                    raise UserError(f"cannot split {target.path} ({size} {what}) into "
                                    f"{choice.slices} equal slices", field=f"groups.{key}.slices")


def _check_runtime(model: nn.Module, plan: Plan, backend: str) -> None:
    if backend not in parallelize.BACKENDS:
        raise UserError(f"unknown backend {backend!r}; expected one of "
                        f"{', '.join(parallelize.BACKENDS)}", field="backend")
    if not dist.is_initialized():
        raise RuntimeError("apply_plan needs torch.distributed initialised (one process per rank)")
    if dist.get_world_size() != plan.devices:
        raise UserError(f"the plan is for {plan.devices} devices but {dist.get_world_size()} "
                        f"processes are running; launch {plan.devices}", field="devices")
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise UserError("the model is already sharded (apply_plan was applied to it); build a "
                        "fresh model", field="model")
    # transformers 5.x renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing.
    flag = next((f for f in ("is_activation_checkpointing", "is_gradient_checkpointing")
                 if hasattr(type(model), f)), None)
    if flag and getattr(model, flag):
        raise UserError("Hugging Face activation checkpointing is on for every layer; turn it off "
                        "(model.gradient_checkpointing_disable()): the plan checkpoints per block",
                        field="checkpoint")


def checkpoint_block(block: nn.Module, selective: bool = False) -> None:
    """Recompute `block`'s forward in backward (non-reentrant torch.utils.checkpoint), keeping
    only its inputs (selective: and the outputs of the ops torchtitan's policy saves,
    parallelize.checkpoint_options). The block's own forward is wrapped in place, so the module
    tree, parameter names and state_dict keys stay as they are; the FSDP2 units inside it gather
    again for the recompute."""
    forward = block.forward
    options = parallelize.checkpoint_options(selective)

    def checkpointed_forward(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)
        return forward(*args, **kwargs)

    block.forward = checkpointed_forward


def _split(block: nn.Module, target: SplitTarget, slices: int) -> nn.Module:
    """Replace the module at `target.path` by its split version; returns the split module."""
    parent_path, _, child = target.path.rpartition(".")
    parent = block.get_submodule(parent_path)
    module = getattr(parent, child)
    if target.kind == "experts":
        split = split_experts(module, slices)
    else:
        split = split_linear(module, slices,
                             weight_layout="out_in" if target.kind == "linear" else "in_out")
    setattr(parent, child, split)
    return split


def _checked_layout(model: nn.Module, plan: Plan, layout: ModelLayout | None):
    """The model's layout and its blocks, every path of it present and the plan's block count the
    model's: (layout, [(key, block)])."""
    layout = resolve_layout(model, layout)
    blocks = blocks_of(model, layout)
    layout.check_paths([n for n, _ in model.named_modules()], [k for k, _ in blocks],
                       model=type(model).__name__)
    _check_plan_fits(model, plan, layout, len(blocks))
    return layout, blocks


def split_groups(model: nn.Module, plan: Plan, layout: ModelLayout | None = None) -> dict:
    """Apply only the plan's operator splitting (no sharding): every split target of every split
    group replaced by its SplitLinear / SplitExperts. Returns plan key -> the split modules.
    state_dict keys and shapes stay those of the unsplit model, so a checkpoint of it loads."""
    layout, blocks = _checked_layout(model, plan, layout)
    _check_splits(plan, layout, blocks)
    out = {}
    for i, (_, block) in enumerate(blocks):
        for kind in ("attn", "mlp"):
            choice = plan.choices[f"block{i}.{kind}"]
            if choice.is_split:
                out[f"block{i}.{kind}"] = [_split(block, t, choice.slices)
                                           for t in layout.group(kind).splits]
    return out


def apply_plan(model: nn.Module, plan: Plan, *, device: torch.device | None = None,
               layout: ModelLayout | None = None, backend: str = "fsdp2") -> AppliedPlan:
    """Shard `model` in place as `plan` says and return what was applied.

    torch.distributed must be initialised with plan.devices processes; `device` is this rank's
    device (default: the model's). `layout` says where the model's blocks, groups and root are
    (default: recognised from the model's class). Nothing is changed before every check passed.
    """
    _check_runtime(model, plan, backend)
    layout, blocks = _checked_layout(model, plan, layout)
    _check_coverage(model, layout, blocks)
    _check_splits(plan, layout, blocks)
    if backend == "fairscale":
        from osdp_sim.runtime.modules import TransformerLM
        if not isinstance(model, TransformerLM):
            raise UserError("the fairscale backend runs only osdp-sim's built-in modules; use "
                            "--backend fsdp2", field="backend")
        if any(plan.selective):
            raise UserError("the fairscale backend has no selective activation checkpointing; use "
                            "--backend fsdp2", field="selective")
    if device is None:
        device = next(model.parameters()).device
    checkpointed = tuple(i for i, on in enumerate(plan.checkpoint) if on)
    notes = []
    if layout.disable_cache and getattr(getattr(model, "config", None), "use_cache", False):
        model.config.use_cache = False
        notes.append("config.use_cache set to False (no key/value cache in training)")

    if backend == "fairscale":
        from osdp_sim.runtime.fairscale_backend import apply_plan_fairscale
        wrapped = apply_plan_fairscale(model, plan, device=device)
        return _applied(wrapped, plan, layout, {}, checkpointed, notes)

    if not any(p.is_meta for p in model.parameters()):
        model.to(device)        # a meta-device model stays there: the caller allocates its shards (to_empty)
    splits = split_groups(model, plan, layout)
    meshes = parallelize.build_meshes(plan, device)
    mp = parallelize.mixed_precision(plan)
    groups = {}
    for i, (key, block) in enumerate(blocks):
        # Checkpointing first: it wraps the block's forward, and FSDP2's hooks on the groups
        # inside run again in the recompute.
        if plan.checkpoint[i]:
            checkpoint_block(block, plan.selective[i])
        path = layout.block_path(key)
        for kind in ("attn", "mlp"):
            plan_key = f"block{i}.{kind}"
            choice = plan.choices[plan_key]
            group = layout.group(kind)
            parallelize.shard_group([block.get_submodule(m) for m in group.modules],
                                    splits.get(plan_key, []), choice, meshes, mp)
            groups[plan_key] = _group_applied(plan_key, [f"{path}.{m}" for m in group.modules],
                                              choice, [f"{path}.{t.path}" for t in group.splits]
                                              if choice.is_split else [])
    # Last, the root: covers the embedding, the head and anything not in a group (parameters
    # outside every fully_shard would silently never synchronise).
    parallelize.shard_root(model, plan.choices["root"], meshes, mp)
    groups["root"] = _group_applied("root", list(layout.root), plan.choices["root"], [])
    return _applied(model, plan, layout, groups, checkpointed, notes)


def _group_applied(key: str, modules: list[str], choice: GroupChoice,
                   split_modules: list[str]) -> GroupApplied:
    return GroupApplied(key=key, modules=tuple(modules), strategy=choice.replicated_strategy,
                        split_modules=tuple(split_modules), slices=choice.slices,
                        sharded_slices=choice.sharded_slices if choice.is_split else 0)


def _applied(model, plan: Plan, layout: ModelLayout, groups: dict, checkpointed, notes) -> AppliedPlan:
    return AppliedPlan(model=model, layout=layout, micro_batch=plan.micro_batch,
                       grad_accum=plan.grad_accum,
                       reduce_every_microbatch=plan.reduce_every_microbatch,
                       precision=plan.precision, optimizer=plan.optimizer, groups=groups,
                       checkpointed_blocks=checkpointed, notes=tuple(notes))
