"""How each plan feature maps onto FSDP2: meshes, mixed precision, one operator group's units,
the root. osdp_sim/runtime/apply.py resolves a model's layout and calls these in the order FSDP2
needs (children before parents, checkpointing before fully_shard); the model knows nothing about
sharding. docs/runtime.md explains what FSDP2 then does at run time.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from osdp_sim.errors import UserError
from osdp_sim.plan.plan import GroupChoice, Plan
from osdp_sim.runtime.split_linear import SplitExperts, SplitLinear, split_linear

BACKENDS = ("fsdp2", "fairscale")
DEFAULT_LR = 1e-3
SGD_MOMENTUM = 0.9


@dataclass(frozen=True)
class Meshes:
    """The device meshes a plan needs.

    shard: ZeRO-2/ZeRO-3 units. 1-D over all ranks, or (replicas, shard_group) for hybrid
      sharding: shard inside a group of `shard_group` ranks, all-reduce across the groups.
    replicate: DDP units. (world, 1): FSDP2 keeps whole parameters on every rank (a shard group
      of one) and all-reduces gradients across the world, on the same per-unit schedule as the
      sharded units. A plain 1-D mesh of size 1 per rank would instead never sync gradients.
    """

    shard: DeviceMesh
    replicate: DeviceMesh


_MESH_CACHE: dict[tuple, DeviceMesh] = {}


def _mesh(device_type: str, shape: tuple[int, ...]) -> DeviceMesh:
    """One mesh per shape per default process group: building a mesh creates process groups,
    which every rank must do in the same order, so meshes are reused rather than rebuilt."""
    key = (device_type, shape, id(dist.group.WORLD))
    if key not in _MESH_CACHE:
        names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
        _MESH_CACHE[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESH_CACHE[key]


def build_meshes(plan: Plan, device: torch.device) -> Meshes:
    world = plan.devices
    s = plan.shard_size
    shard = _mesh(device.type, (world,)) if s == world else _mesh(device.type, (world // s, s))
    return Meshes(shard=shard, replicate=_mesh(device.type, (world, 1)))


def mixed_precision(plan: Plan) -> MixedPrecisionPolicy:
    """bf16: bf16 parameters in compute, fp32 gradient reduction, fp32 sharded master weights."""
    if plan.precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def split_group(group: nn.Module, slices: int) -> list[SplitLinear]:
    """Replace every nn.Linear of `group` by an equivalent SplitLinear; returns them in order
    (the FairScale backend's splitting of the built-in modules)."""
    out = []
    for name, module in list(group.named_modules()):
        if type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            split = split_linear(module, slices)
            setattr(group.get_submodule(parent_name), child, split)
            out.append(split)
    return out


def _unit(modules: list[nn.Module]) -> nn.Module | list[nn.Module]:
    """One FSDP2 unit over a group's modules: the module itself, or a list (one unit gathered
    when the first of them runs, freed after the last)."""
    return modules[0] if len(modules) == 1 else modules


def shard_group(modules: list[nn.Module], splits: list[nn.Module], choice: GroupChoice,
                meshes: Meshes, mp: MixedPrecisionPolicy) -> None:
    """fully_shard one operator group: first the sharded slices of its split modules (`splits`,
    SplitLinear / SplitExperts already in place), then the group's modules as one unit."""
    # Every sharded slice of every split module is its own ZeRO-3 unit (OSDP splits operators): it
    # is gathered just before it runs and freed after, so one slice (plus the prefetched next) is
    # materialised at a time. Grouping slice s of all Linears into one unit instead would keep
    # all j units gathered from the group's first Linear to its last.
    for split in splits:
        for s in range(choice.sharded_slices):
            fully_shard(split.slices[s], mesh=meshes.shard, reshard_after_forward=True, mp_policy=mp)
    strategy = choice.replicated_strategy
    if strategy == "ddp":
        # With a shard group of one FSDP2 still computes from a separate unsharded copy (a local
        # copy, no communication). Freeing it after forward keeps one copy per live unit, as for
        # ZeRO-3; keeping it (False) would hold every ddp parameter twice from forward to
        # backward (gpt2-tiny, 2 ranks, MemTracker peak parameters: 28.3 MiB vs 40.4; DDP 20.2).
        fully_shard(_unit(modules), mesh=meshes.replicate, reshard_after_forward=True, mp_policy=mp)
    else:
        fully_shard(_unit(modules), mesh=meshes.shard, reshard_after_forward=strategy == "zero3",
                    mp_policy=mp)


def checkpoint_options(selective: bool) -> dict:
    """torch.utils.checkpoint keyword arguments of a checkpointed block. Selective: torchtitan's
    op-level policy (runtime/selective.py), a fresh context per call so its mm count restarts in
    every block; full: none (keep only the inputs, recompute everything)."""
    if not selective:
        return {}
    from osdp_sim.runtime.selective import selective_context
    return {"context_fn": selective_context}


def shard_root(model: nn.Module, choice: GroupChoice, meshes: Meshes,
               mp: MixedPrecisionPolicy) -> None:
    # reshard_after_forward=None (not True): FSDP2's default for the root keeps its parameters
    # gathered from forward into backward, since backward starts with the head and would gather
    # them again straight away. So root zero3 and zero2 run the same way; an explicit True would
    # free and re-gather the embedding and head between the two passes.
    mesh = meshes.replicate if choice.strategy == "ddp" else meshes.shard
    reshard = False if choice.strategy == "zero2" else None
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)


def apply_plan(model: nn.Module, plan: Plan, *, backend: str = "fsdp2",
               device: torch.device) -> nn.Module:
    """Shard `model` in place as `plan` says; returns the module to train (FSDP2: `model`
    itself; FairScale: its root wrapper). The built-in modules' entry point, kept for
    compatibility: osdp_sim.runtime.apply_plan does the work (any model with a layout) and
    returns an AppliedPlan. torch.distributed must be initialised with plan.devices processes;
    `device` is this rank's device (torch.device('cpu') on gloo)."""
    from osdp_sim.runtime.apply import apply_plan as apply_with_layout
    return apply_with_layout(model, plan, backend=backend, device=device).model


def describe_sharding(model: nn.Module) -> dict:
    """What apply_plan built, for records and tests: parameter elements per mesh shape
    ('2' = sharded over 2 ranks, '2x1' = replicated over 2, '1x2' = hybrid ...), FSDP2 units
    (a list unit counts once) and SplitLinears."""
    from torch.distributed.tensor import DTensor

    by_mesh: dict[str, int] = {}
    for p in model.parameters():
        key = "x".join(map(str, p.device_mesh.shape)) if isinstance(p, DTensor) else "local"
        by_mesh[key] = by_mesh.get(key, 0) + p.numel()
    states = {id(fully_shard.state(m)) for m in model.modules() if isinstance(m, FSDPModule)}
    splits = sum(isinstance(m, SplitLinear) for m in model.modules())
    experts = sum(isinstance(m, SplitExperts) for m in model.modules())
    return {"param_elems_by_mesh": by_mesh, "fsdp_units": len(states), "split_linears": splits,
            "split_experts": experts}


def make_optimizer(model: nn.Module, plan: Plan, *, lr: float = DEFAULT_LR) -> torch.optim.Optimizer:
    """AdamW (weight decay 0) or SGD with momentum 0.9, on the (sharded) parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if plan.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    if plan.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise UserError(f"unknown optimizer {plan.optimizer!r}; expected adamw or sgd", field="optimizer")
