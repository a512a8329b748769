"""Measure what a model keeps for backward, per operator group, from autograd's saved tensors.

Every tensor autograd saves during one forward passes through a saved_tensors_hooks pack hook; it
is charged, once per storage (views of one buffer count once), to the group whose forward was
running. Parameters and buffers are model state, not activations, and are left out. Inside a
checkpointed block torch's own hook replaces ours, so only what the checkpoint itself saves (the
block input) is seen, charged to the block ('block{i}').

Measure a plain model (build_model, optionally .to(bf16) for what FSDP2's bf16 policy computes
with): under FSDP2 the gathered parameters are new tensors that this would count as activations.
"""

import torch
from torch import nn


def group_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Spec group name -> module: 'embed', 'block{i}.attn', 'block{i}.mlp', 'head'."""
    groups = {"embed": model.embed}
    for i, block in enumerate(model.blocks):
        groups[f"block{i}.attn"] = block.attn
        groups[f"block{i}.mlp"] = block.mlp
    groups["head"] = model.head
    return groups


def saved_bytes_per_group(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> dict[str, int]:
    """Bytes of distinct storages saved for backward during `model(idx, targets)`, by group.

    Keys are the spec's group names, plus 'block{i}' for what a checkpointed block keeps and
    'other' for anything saved outside every group.
    """
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    totals: dict[str, int] = {}
    stack: list[str] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in state and ptr not in seen:
            seen.add(ptr)
            name = stack[-1] if stack else "other"
            totals[name] = totals.get(name, 0) + storage.nbytes()
        return t

    scopes = dict(group_modules(model))
    scopes.update({f"block{i}": b for i, b in enumerate(model.blocks)})
    def enter(name):
        def hook(module, args):
            stack.append(name)
        return hook

    def leave(module, args, output):
        stack.pop()

    handles = []
    for name, module in scopes.items():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(idx, targets)
    finally:
        for h in handles:
            h.remove()
    del loss
    return totals
