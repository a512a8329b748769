"""Apply a plan with FairScale's FullyShardedDataParallel, the wrapper the OSDP paper used.

Why a shim: FairScale 0.4.13's FSDP assumes CUDA. It creates CUDA streams, enters them, waits on
them and calls `tensor.record_stream(...)` unconditionally, so on a CPU-only torch its first
forward fails. On CPU there is one stream, so all of that can be a no-op: `_cpu_shim()` gives
FairScale's FSDP module a `torch` whose `cuda` namespace hands out one no-op stream, and lets
`record_stream` ignore that stream. It also turns off FairScale's "base" collectives
(ENABLE_NCCL_BASE_COLLECTIVES=0, read at import, and the module flags it sets): with them on, its
bucketed reduce-scatter hands gloo a 2-D tensor, which gloo rejects. On CUDA nothing is patched.

Works on CPU with the shim (tests/test_runtime_parallelize.py): zero2, zero3 and mixes of them,
splits (each sharded slice of each Linear its own unit), checkpointing (FairScale's own
checkpoint_wrapper), bf16 (compute_dtype bf16, fp32 reduce-scatter), AdamW and SGD.
What FairScale cannot do, and raises UserError for (use --backend fsdp2):
- ddp groups, split or not: FairScale cannot replicate a submodule inside a sharded model (in the
  OSDP code such operators stay sharded at rest and are gathered by the root wrapper instead);
- hybrid sharding (shard_group < devices): FairScale FSDP shards over one process group.
"""

import contextlib
import os
import types
import warnings

import torch
from torch import nn

from osdp_sim.errors import UserError
from osdp_sim.plan.plan import GroupChoice, Plan

_SHIMMED = False


class _NoopStream:
    """Stands in for torch.cuda.Stream on CPU: every operation is already ordered."""

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return event

    def wait_event(self, event) -> None:
        pass


_STREAM = _NoopStream()


def _fake_cuda() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        is_available=lambda: True,   # FairScale only builds its stream table when this is True
        Stream=lambda *a, **k: _STREAM,
        current_stream=lambda *a, **k: _STREAM,
        stream=lambda s: contextlib.nullcontext(),
        synchronize=lambda *a, **k: None,
        current_device=lambda: torch.device("cpu"),
        set_device=lambda *a, **k: None,
        memory_allocated=lambda *a, **k: 0,
        max_memory_allocated=lambda *a, **k: 0,
        reserved_memory=lambda *a, **k: 0,
    )


class _TorchWithoutCuda(types.ModuleType):
    """`torch` as FairScale's FSDP module sees it: everything real except `cuda`."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _fake_cuda()

    def __getattr__(self, name):
        return getattr(torch, name)


def _cpu_shim() -> None:
    global _SHIMMED
    if _SHIMMED or torch.cuda.is_available():
        return
    os.environ.setdefault("ENABLE_NCCL_BASE_COLLECTIVES", "0")
    import fairscale.internal.reduce_scatter_bucketer as bucketer
    import fairscale.nn.data_parallel.fully_sharded_data_parallel as fsdp_module

    fsdp_module.enable_nccl_base_collectives = False
    bucketer.enable_nccl_base_collectives = False
    fsdp_module.torch = _TorchWithoutCuda()
    real_record_stream = torch.Tensor.record_stream

    def record_stream(tensor, stream):
        if stream is _STREAM:
            return None
        return real_record_stream(tensor, stream)

    torch.Tensor.record_stream = record_stream
    _SHIMMED = True


def _unsupported(feature: str, why: str) -> UserError:
    return UserError(f"{feature} is not supported by the fairscale backend ({why}); "
                     f"use --backend fsdp2", field="backend")


def _check(plan: Plan) -> None:
    for key, choice in plan.choices.items():
        if choice.replicated_strategy == "ddp":
            raise _unsupported(f"the ddp group {key!r}",
                               "FairScale cannot replicate a submodule inside a sharded model")
    if plan.shard_size < plan.devices:
        raise _unsupported(f"hybrid sharding (shard_group {plan.shard_size} < devices "
                           f"{plan.devices})", "FairScale shards over one process group")


def _fsdp(module: nn.Module, *, reshard: bool, plan: Plan, device: torch.device) -> nn.Module:
    from fairscale.nn.data_parallel import FullyShardedDataParallel

    kwargs = {}
    if plan.precision == "bf16":
        kwargs = dict(mixed_precision=True, compute_dtype=torch.bfloat16,
                      buffer_dtype=torch.float32, fp32_reduce_scatter=True)
    return FullyShardedDataParallel(module, reshard_after_forward=reshard,
                                    compute_device=device, **kwargs)


def _wrap_group(group: nn.Module, choice: GroupChoice, plan: Plan,
                device: torch.device) -> nn.Module:
    if choice.is_split:
        from osdp_sim.runtime.parallelize import split_group

        # Each sharded slice of each Linear is its own unit, as on FSDP2.
        for lin in split_group(group, choice.slices):
            for s in range(choice.sharded_slices):
                lin.slices[s] = _fsdp(lin.slices[s], reshard=True, plan=plan, device=device)
    return _fsdp(group, reshard=choice.strategy == "zero3", plan=plan, device=device)


def apply_plan_fairscale(model: nn.Module, plan: Plan, *, device: torch.device) -> nn.Module:
    """Nested FairScale FSDP: one unit per group, the root last. Returns the root wrapper (the
    model itself cannot be sharded in place by FairScale)."""
    _check(plan)
    _cpu_shim()
    # FairScale calls the deprecated tensor.storage() on every parameter, every step.
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
    model.to(device)
    from fairscale.nn.checkpoint import checkpoint_wrapper

    for i, block in enumerate(model.blocks):
        for kind in ("attn", "mlp"):
            wrapped = _wrap_group(getattr(block, kind), plan.choices[f"block{i}.{kind}"], plan, device)
            setattr(block, kind, wrapped)
        if plan.checkpoint[i]:
            # FairScale's FSDP rejects torch's non-reentrant checkpoint (its recompute re-enters
            # forward hooks in a backward state); its own reentrant wrapper is what it supports.
            block.checkpointed = False
            checkpoint_wrapper(block)
    # FairScale keeps the root's parameters gathered from forward to backward whatever
    # reshard_after_forward says (disable_reshard_on_root), as FSDP2 does.
    root = plan.choices["root"]
    return _fsdp(model, reshard=root.strategy == "zero3", plan=plan, device=device)
