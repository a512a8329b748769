"""Selective (op-level) activation checkpointing: torchtitan's policy at the commit of its
published benchmark (pytorch/torchtitan 820504e2, torchtitan/models/llama3/parallelize_llama.py,
`_save_list` and `_apply_ac_to_transformer_block`; docs/cost-model.md says why this version).

Inside a checkpointed block the outputs of the listed ops are saved (kept from forward to
backward), every other op is recomputed in backward; of the aten.mm calls every second one (the
2nd, 4th, ... of the block's forward) is recomputed too. Only aten.mm counts: a Linear with a
bias runs as aten.addmm, which is not listed (recomputed, and not counted).
"""

from collections import defaultdict
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# torchtitan 820504e2's list, plus the CPU flash kernel: the same SDPA as
# _scaled_dot_product_flash_attention, under the name torch dispatches to on CPU tensors (the
# tests run on CPU; on CUDA the listed names are the ones that run).
SAVE_OPS = frozenset({
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
})


def _policy(meta: dict, ctx, func, *args, **kwargs) -> CheckpointPolicy:
    mode = "recompute" if ctx.is_recompute else "forward"
    key = f"{mode}_mm_count"
    if func == torch.ops.aten.mm.default:
        meta[key] += 1
    to_save = func in SAVE_OPS and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """A fresh (forward, recompute) context pair per checkpointed call: the mm count restarts in
    every block, as torchtitan's `selective_checkpointing_context_fn` does.

    torch's pair looks every op of the recompute up by its call index, which fails here: the
    FSDP2 units are the block's groups (torchtitan's: the whole block), so FSDP2's hooks run
    inside the checkpointed region and issue other ops in the recompute than in the forward
    (record_function, copies). The pair below hands the ops outside SAVE_OPS straight through
    (the policy recomputes them anyway), so only the saved ops are indexed, per op as torch does.
    """
    forward, recompute = create_selective_checkpoint_contexts(partial(_policy, defaultdict(int)))
    return _passing(forward), _passing(recompute)


_PASSING: dict[type, type] = {}


def _passing(mode):
    """`mode` (one of torch's SAC modes) with the ops outside SAVE_OPS passed through."""
    base = type(mode)
    if base not in _PASSING:
        def dispatch(self, func, types, args=(), kwargs=None):
            if func not in SAVE_OPS:
                return func(*args, **(kwargs or {}))
            return base.__torch_dispatch__(self, func, types, args, kwargs)
        _PASSING[base] = type(f"Passing{base.__name__}", (base,), {"__torch_dispatch__": dispatch})
    mode.__class__ = _PASSING[base]
    return mode
