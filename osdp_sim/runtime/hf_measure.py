"""Measure a transformers model (found through its ModelLayout, osdp_sim/model/layout.py) per operator
group of the description: the bytes saved for backward (saved-tensor hooks, once per storage, as
saved_tensors.py does for the built-in modules) and the forward FLOPs (torch.utils.flop_counter).

Needs torch and transformers (extra `hf`); the core never imports this. For comparing the
config.json description with what transformers' own implementation keeps (docs/models.md).
"""

import torch
from torch import nn

from osdp_sim.model.layout import HF_LAYOUTS, ModelLayout


def group_scopes(model: nn.Module, layout: ModelLayout | None = None) -> dict[nn.Module, str]:
    """Module -> description group name ('embed', 'block{i}.attn', 'block{i}.mlp', 'head'),
    found through `layout` (default: the transformers layout of the model's class)."""
    if layout is None:
        name = type(model).__name__
        if name not in HF_LAYOUTS:
            raise ValueError(f"no layout for {name}; give one (osdp_sim.model.layout.ModelLayout)")
        layout = HF_LAYOUTS[name]
    scopes: dict[nn.Module, str] = {}
    for path in layout.root:
        scopes[model.get_submodule(path)] = "embed" if path in layout.embed else "head"
    for i, block in enumerate(model.get_submodule(layout.blocks)):
        for kind in ("attn", "mlp"):
            for path in layout.group(kind).modules:
                scopes[block.get_submodule(path)] = f"block{i}.{kind}"
    return scopes


def measure_hf(model: nn.Module, idx: torch.Tensor, layout: ModelLayout | None = None) -> dict[str, dict[str, float]]:
    """{'saved_bytes': {group: bytes}, 'flops': {group: forward FLOPs}} of one forward with
    labels = idx (the loss included, charged to 'head', with everything outside the groups).

    torch's FLOP counter has no formula for the CPU flash-attention kernel nor for grouped_mm
    (transformers 5.x's default experts implementation), so FLOPs are counted on a second
    forward in plain matmuls (attention and experts 'eager': the same products); the saved
    bytes come from the model as configured."""
    from torch.utils.flop_counter import FlopCounterMode

    scopes = group_scopes(model, layout)
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    saved: dict[str, float] = {}
    stack: list[str] = ["head"]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in state and ptr not in seen:
            seen.add(ptr)
            saved[stack[-1]] = saved.get(stack[-1], 0) + storage.nbytes()
        return t

    def leave(mod, args, out):
        stack.pop()             # returns None: a forward hook's value would replace the output

    handles = []
    for module, name in scopes.items():
        handles.append(module.register_forward_pre_hook(lambda mod, args, name=name: stack.append(name) and None))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(input_ids=idx, labels=idx)
    finally:
        for h in handles:
            h.remove()
    del out

    cfg = model.config
    impl = cfg._attn_implementation, getattr(cfg, "_experts_implementation", None)
    cfg._attn_implementation = "eager"
    if impl[1] is not None:
        cfg._experts_implementation = "eager"   # grouped_mm has no FLOP formula either
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(input_ids=idx, labels=idx)
    finally:
        cfg._attn_implementation = impl[0]
        if impl[1] is not None:
            cfg._experts_implementation = impl[1]
    names = {mod: name for name, mod in model.named_modules()}
    prefix = type(model).__name__
    counts = counter.get_flop_counts()
    flops: dict[str, float] = {}
    for module, group in scopes.items():
        fqn = f"{prefix}.{names[module]}"
        flops[group] = flops.get(group, 0.0) + sum(counts.get(fqn, {}).values())
    total = sum(counts["Global"].values())
    flops["head"] = flops.get("head", 0.0) + total - sum(flops.values())
    return {"saved_bytes": saved, "flops": flops}
