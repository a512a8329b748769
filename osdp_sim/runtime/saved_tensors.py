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



def kept_bytes_after_forward(fn, *args) -> tuple[object, int]:
    """(fn(*args), bytes of the storages allocated during fn that live tensors still hold when
    it has returned, its output's excluded): what a checkpointed block keeps from forward to
    backward beyond its inputs (selective checkpointing's saved op outputs; nothing for full).
    Live tensors are found by the garbage collector (the cache holds detached tensors, new
    Python objects sharing the outputs' storages). A tensor only autograd's C++ side holds is
    seen while its Python object happens to live: measure a block on its own, not a whole model."""
    import gc

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def live_storages() -> dict[int, object]:
        import warnings
        out = {}
        with warnings.catch_warnings():      # isinstance on torch's deprecated module objects
            warnings.simplefilter("ignore")
            objs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
        for obj in objs:
            if obj.device.type != "meta":
                st = obj.untyped_storage()
                out[st.data_ptr()] = st
        return out

    gc.collect()
    # parameters, buffers, inputs: not made by fn. Held here, so that none of their addresses is
    # freed during fn and reused by a new storage (which would then be taken for an old one).
    before = live_storages()
    created: set[int] = set()

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    created.add(t.untyped_storage().data_ptr())
            return out

    with Track():
        out = fn(*args)
    gc.collect()
    skip = {t.untyped_storage().data_ptr() for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
    kept = sum(st.nbytes() for ptr, st in live_storages().items()
               if ptr in created and ptr not in skip and ptr not in before)
    del before
    return out, kept
