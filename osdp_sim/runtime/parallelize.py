"""Apply a sharding plan to a plain model (osdp_sim/runtime/modules.py) with FSDP2.

The model knows nothing about sharding; this module wraps it from outside, group by group, in the
order FSDP2 needs (children before parents, checkpointing before fully_shard). docs/runtime.md
explains how each plan feature maps onto FSDP2 and what FSDP2 then does at run time.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from osdp_sim.errors import UserError
from osdp_sim.plan.plan import GroupChoice, Plan
from osdp_sim.runtime.split_linear import SplitLinear, split_linear

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


def _check(model: nn.Module, plan: Plan, backend: str) -> None:
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}",
                        field="backend")
    if not dist.is_initialized():
        raise RuntimeError("apply_plan needs torch.distributed initialised (one process per rank)")
    if dist.get_world_size() != plan.devices:
        raise UserError(f"the plan is for {plan.devices} devices but {dist.get_world_size()} "
                        f"processes are running; launch {plan.devices}", field="devices")
    n_blocks = len(model.blocks)
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


def mixed_precision(plan: Plan) -> MixedPrecisionPolicy:
    """bf16: bf16 parameters in compute, fp32 gradient reduction, fp32 sharded master weights."""
    if plan.precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def split_group(group: nn.Module, slices: int) -> list[SplitLinear]:
    """Replace every nn.Linear of `group` by an equivalent SplitLinear; returns them in order."""
    out = []
    for name, module in list(group.named_modules()):
        if type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            split = split_linear(module, slices)
            setattr(group.get_submodule(parent_name), child, split)
            out.append(split)
    return out


def _shard_group(group: nn.Module, choice: GroupChoice, meshes: Meshes,
                 mp: MixedPrecisionPolicy) -> None:
    if choice.is_split:
        linears = split_group(group, choice.slices)
        # Every sharded slice of every Linear is its own ZeRO-3 unit (OSDP splits operators): it is
        # gathered just before it runs and freed after, so one slice (plus the prefetched next) is
        # materialised at a time. Grouping slice s of all Linears into one unit instead would keep
        # all j units gathered from the group's first Linear to its last.
        for lin in linears:
            for s in range(choice.sharded_slices):
                fully_shard(lin.slices[s], mesh=meshes.shard, reshard_after_forward=True, mp_policy=mp)
    strategy = choice.replicated_strategy
    if strategy == "ddp":
        # With a shard group of one FSDP2 still computes from a separate unsharded copy (a local
        # copy, no communication). Freeing it after forward keeps one copy per live unit, as for
        # ZeRO-3; keeping it (False) would hold every ddp parameter twice from forward to
        # backward (gpt2-tiny, 2 ranks, MemTracker peak parameters: 28.3 MiB vs 40.4; DDP 20.2).
        fully_shard(group, mesh=meshes.replicate, reshard_after_forward=True, mp_policy=mp)
    else:
        fully_shard(group, mesh=meshes.shard, reshard_after_forward=strategy == "zero3",
                    mp_policy=mp)


def _shard_root(model: nn.Module, choice: GroupChoice, meshes: Meshes,
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
    """Shard `model` in place as `plan` says; returns it. torch.distributed must be initialised
    with plan.devices processes; `device` is this rank's device (torch.device('cpu') on gloo)."""
    _check(model, plan, backend)
    if backend == "fairscale":
        from osdp_sim.runtime.fairscale_backend import apply_plan_fairscale
        return apply_plan_fairscale(model, plan, device=device)
    model.to(device)
    meshes = build_meshes(plan, device)
    mp = mixed_precision(plan)
    for i, block in enumerate(model.blocks):
        # Checkpointing wraps the block's forward; FSDP2's hooks then run again in the recompute.
        block.checkpointed = bool(plan.checkpoint[i])
        for kind in ("attn", "mlp"):
            _shard_group(getattr(block, kind), plan.choices[f"block{i}.{kind}"], meshes, mp)
    # Last, the root: covers the embedding, the head and anything not in a group (parameters
    # outside every fully_shard would silently never synchronise).
    _shard_root(model, plan.choices["root"], meshes, mp)
    return model


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
    return {"param_elems_by_mesh": by_mesh, "fsdp_units": len(states), "split_linears": splits}


def make_optimizer(model: nn.Module, plan: Plan, *, lr: float = DEFAULT_LR) -> torch.optim.Optimizer:
    """AdamW (weight decay 0) or SGD with momentum 0.9, on the (sharded) parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if plan.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    if plan.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise UserError(f"unknown optimizer {plan.optimizer!r}; expected adamw or sgd", field="optimizer")
