"""describe_module: the model description of any torch module, by measurement (issue 13).

Needs torch (not transformers); the core never imports this module (osdp_sim.model exposes
describe_module lazily). The module runs one forward (and the loss) twice, in fp32 and in bf16,
on fake tensors (torch's FakeTensorMode: shapes and dtypes, no data, no memory), so a 7B model
built on the meta device is described in seconds. Per operator group it measures

  parameters      exact, from the module's parameters (a tied parameter counts once, where first met)
  forward FLOPs   torch.utils.flop_counter's formulas per aten op (matmuls, convolutions, SDPA;
                  the CPU flash-attention kernel gets the SDPA formula, which torch lacks)
  saved bytes     every tensor autograd saves for backward (saved_tensors_hooks), once per storage,
                  parameters and buffers excluded; fp32 and bf16 runs split them into elements per
                  token (the activation dtype) and fixed bytes per token (the rest)

and charges them to the group whose forward is running: 'embed' before the first block, the
block's attn / mlp group (the layout's modules; outside them, within the block, the group that
ran last), 'head' after the last block (the loss included). docs/models.md ("Any torch module").
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from osdp_sim.errors import UserError
from osdp_sim.model.described import DescribedBlock, DescribedGroup, DescribedModel, compress_blocks
from osdp_sim.model.layout import GroupLayout, ModelLayout
from osdp_sim.model.spec import LinearShape, ModelSpec, build_spec

_MLP_NAMES = ("mlp", "ffn", "feed_forward", "feedforward", "intermediate")
_NORM_NAMES = ("norm", "ln")


def describe_module(module: nn.Module, example_input, *, layout: ModelLayout | None = None,
                    blocks: str | None = None, loss: Callable | None = None,
                    seq_len: int | None = None, name: str = "described") -> ModelSpec:
    """The ModelSpec of `module` (family 'described'), measured on fake tensors.

    example_input: a tensor, a tuple of positional arguments or a dict of keyword arguments for
    one forward (real, meta or fake tensors; only shapes and dtypes are used). loss(output) -> the
    scalar to train on; None: the module's output is the loss (or its `.loss`, or its first
    element). layout: where blocks, groups and
    root are (osdp_sim/model/layout.py); else `blocks` (the block list's path) or the largest
    nn.ModuleList, each block split into attn / mlp at its first child named like an MLP
    (mlp, ffn, feed_forward, intermediate; with the norm just before it). seq_len: tokens per
    sample when the block input is not (batch, tokens, hidden)."""
    from osdp_sim.model.load import described_config

    layout = layout or _find_layout(module, blocks)
    block_list = _blocks(module, layout.blocks)
    groups = _group_params(module, layout, block_list)
    runs = {dt: _run(module, example_input, loss, layout, block_list, dt)
            for dt in (torch.float32, torch.bfloat16)}
    r32, r16 = runs[torch.float32], runs[torch.bfloat16]
    shape = r32.block_input_shape
    if shape is None:
        raise UserError(f"no block of {layout.blocks!r} ran in the forward", field="blocks")
    if seq_len is None and len(shape) != 3:
        raise UserError(f"the block input has shape {tuple(shape)}, not (batch, tokens, hidden); "
                        "give seq_len=", field="seq_len")
    tokens_per_sample = seq_len or shape[1]
    tokens = shape[0] * tokens_per_sample
    hidden = shape[-1]

    def described(key: str) -> DescribedGroup:
        linears, other, largest = groups[key]
        b32, b16 = r32.saved.get(key, 0), r16.saved.get(key, 0)
        elems, fixed = (b32 - b16) / 2.0, 2.0 * b16 - b32
        if fixed < 0:          # a dtype-dependent quirk: keep the bf16 total exact
            elems, fixed = b16 / 2.0, 0.0
        t32, t16 = r32.bwd_temp.get(key, 0), r16.bwd_temp.get(key, 0)
        t_elems, t_fixed = (t32 - t16) / 2.0, 2.0 * t16 - t32
        if t_fixed < 0 or t_elems < 0:
            t_elems, t_fixed = t16 / 2.0, 0.0
        return DescribedGroup(linears=linears, other_params=other,
                              flops_per_token=r32.flops.get(key, 0.0) / tokens,
                              act_elems_per_token=elems / tokens,
                              act_fixed_bytes_per_token=fixed / tokens, largest_param=largest,
                              bwd_temp_elems_per_token=t_elems / tokens,
                              bwd_temp_fixed_bytes_per_token=t_fixed / tokens)

    ckpt = r32.block_input_numel / tokens
    blocks_d = [DescribedBlock(described(f"block{i}.attn"), described(f"block{i}.mlp"), ckpt)
                for i in range(len(block_list))]
    logits = max(1, math.ceil(r32.head_matmul_out / tokens)) if r32.head_matmul_out else 1
    # Held inputs: a two-point fit like the saved bytes, exact at fp32 and bf16; its elements
    # are negative when a floating input is saved as itself in fp32 and beside its cast in bf16.
    h32, h16 = r32.held_input, r16.held_input
    d = DescribedModel(name=name, seq_len=int(tokens_per_sample), hidden=int(hidden),
                       logits_per_token=logits, embed=described("embed"),
                       blocks=compress_blocks(blocks_d), head=described("head"),
                       input_elems_per_token=(h32 - h16) / 2.0 / tokens,
                       input_fixed_bytes_per_token=(2.0 * h16 - h32) / tokens)
    return build_spec(described_config(d, source=f"described:{type(module).__name__}"))


# ---------------------------------------------------------------- structure

def _find_layout(model: nn.Module, blocks: str | None) -> ModelLayout:
    if blocks is None:
        lists = [(sum(p.numel() for p in m.parameters()), n) for n, m in model.named_modules()
                 if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m) and n]
        if not lists:
            raise UserError(f"{type(model).__name__} has no nn.ModuleList of blocks; pass blocks= "
                            "or layout=", field="blocks")
        blocks = max(lists)[1]
    first = next(iter(_blocks(model, blocks)))
    children = [n for n, _ in first.named_children()]
    at = next((i for i, n in enumerate(children) if any(k in n.lower() for k in _MLP_NAMES)), None)
    if at is None or at == 0:
        raise UserError(f"cannot tell the attention from the MLP in {type(first).__name__} (children "
                        f"{children}); pass layout=ModelLayout(...)", field="layout")
    if at > 1 and any(k in children[at - 1].lower() for k in _NORM_NAMES):
        at -= 1
    # The root: the siblings of the block list and of each module above it, in order.
    root: list[str] = []
    parts = blocks.split(".")
    for depth in range(len(parts)):
        prefix = ".".join(parts[:depth])
        parent = model.get_submodule(prefix) if prefix else model
        root += [f"{prefix}.{n}" if prefix else n for n, _ in parent.named_children()
                 if n != parts[depth]]
    return ModelLayout(name=type(model).__name__, blocks=blocks,
                       attn=GroupLayout(modules=tuple(children[:at])),
                       mlp=GroupLayout(modules=tuple(children[at:])), root=tuple(root) or (blocks,))


def _blocks(model: nn.Module, path: str) -> list[nn.Module]:
    try:
        container = model.get_submodule(path)
    except AttributeError:
        raise UserError(f"no module {path!r} in {type(model).__name__}", field="layout.blocks") from None
    return list(container.values() if isinstance(container, nn.ModuleDict) else container)


def _group_params(model: nn.Module, layout: ModelLayout, block_list) -> dict:
    """Group -> (linears, other params, largest parameter tensor); root parameters go to 'embed'
    when owned by a layout.embed module (or none is named and the module runs before the blocks:
    decided by _run's order, see below), else to 'head'."""
    seen: set[int] = set()
    out = {}

    def collect(key: str, modules: list[tuple[str, nn.Module]]):
        linears, total, largest = [], 0, 0
        for prefix, mod in modules:
            for sub_name, sub in mod.named_modules(prefix=prefix):
                if isinstance(sub, nn.Linear) and id(sub.weight) not in seen:
                    linears.append(LinearShape(sub_name, sub.in_features, sub.out_features,
                                               sub.bias is not None))
            for p in mod.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
                    largest = max(largest, p.numel())
        other = total - sum(l.params for l in linears)
        out[key] = (tuple(linears), other, largest)

    for i, block in enumerate(block_list):
        for kind in ("attn", "mlp"):
            collect(f"block{i}.{kind}", [(m, block.get_submodule(m)) for m in layout.group(kind).modules])
    # Parameters of a block outside both groups would never be described: refuse them.
    for i, block in enumerate(block_list):
        stray = [n for n, p in block.named_parameters() if id(p) not in seen]
        if stray:
            raise UserError(f"parameter {layout.blocks}.{i}.{stray[0]} is in neither the attn nor "
                            "the mlp group", field="layout")
    embed_paths = layout.embed or _embed_by_order(model, layout)
    collect("embed", [(p, model.get_submodule(p)) for p in embed_paths])
    collect("head", [(p, model.get_submodule(p)) for p in layout.root if p not in embed_paths])
    # Free parameters of the model itself (a class token, learned positions): the embedding's.
    free = [(n, p) for n, p in model.named_parameters() if id(p) not in seen]
    if free:
        lin, other, largest = out["embed"]
        out["embed"] = (lin, other + sum(p.numel() for _, p in free),
                        max([largest] + [p.numel() for _, p in free]))
    return out


def _embed_by_order(model: nn.Module, layout: ModelLayout) -> tuple[str, ...]:
    """Root modules registered before the block list (the layout names no embed modules)."""
    names = [n for n, _ in model.named_modules()]
    first_block = names.index(layout.blocks) if layout.blocks in names else len(names)
    return tuple(p for p in layout.root if p in names and names.index(p) < first_block)


# ---------------------------------------------------------------- one fake forward

class _Measured:
    def __init__(self):
        self.saved: dict[str, int] = {}
        self.flops: dict[str, float] = {}
        self.block_input_shape = None
        self.block_input_numel = 0
        self.head_matmul_out = 0
        self.group_inputs: list = []
        self.held_input = 0
        self.bwd_temp: dict[str, int] = {}


def _cpu_flash_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    # scores Q K^T and A V: 2 x keys x head_dim per query and head each (no causal discount),
    # as torch's sdpa_flop for the CUDA kernels; query heads (GQA keys are not expanded)
    b, h, s_q, d_q = query.shape
    s_k, d_v = key.shape[-2], value.shape[-1]
    return 2 * b * h * s_q * s_k * (d_q + d_v)


class _Counter(TorchDispatchMode):
    """FLOPs per aten op (torch's formulas) and the largest matmul output of the head."""

    def __init__(self, where: Callable[[], str], measured: _Measured):
        super().__init__()
        from torch.utils.flop_counter import flop_registry
        self.registry = dict(flop_registry)
        self.registry[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_flops
        self.where, self.m = where, measured

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.registry:
            key = self.where()
            self.m.flops[key] = self.m.flops.get(key, 0.0) + self.registry[packet](*args, **kwargs, out_val=out)
            if key == "head" and packet in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
                self.m.head_matmul_out = max(self.m.head_matmul_out, out.numel())
        return out


def _run(model: nn.Module, example_input, loss, layout: ModelLayout, block_list, dtype) -> _Measured:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    from torch.multiprocessing.reductions import StorageWeakRef

    m = _Measured()
    names = {id(mod): n for n, mod in model.named_modules()}
    stack: list[str] = ["embed"]
    last_group: dict[int, str] = {}

    def fake(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
        dt = dtype if t.is_floating_point() else t.dtype
        return torch.empty(t.shape, dtype=dt, device="cpu", requires_grad=requires_grad and t.is_floating_point())

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        state = {n: fake(p, p.requires_grad) for n, p in model.named_parameters()}
        state.update({n: fake(b) for n, b in model.named_buffers()})
        # The caller's batch as it holds it (its own dtypes), then the cast a bf16 policy makes
        # of its floating tensors (FSDP2 casts the root's inputs): the cast is what the model
        # saves, the original stays alive with the caller for the whole step.
        held_args, held_kwargs = _inputs(example_input, lambda t: torch.empty(t.shape, dtype=t.dtype))
        held = [t for t in (*held_args, *held_kwargs.values()) if isinstance(t, torch.Tensor)]
        cast = lambda t: t.to(dtype) if t.is_floating_point() else t     # noqa: E731
        args = tuple(cast(a) if isinstance(a, torch.Tensor) else a for a in held_args)
        kwargs = {k: cast(v) if isinstance(v, torch.Tensor) else v for k, v in held_kwargs.items()}
    state_ids = {StorageWeakRef(t.untyped_storage()).cdata for t in state.values()}
    seen: set[int] = set()

    def pack(t: torch.Tensor):
        ref = StorageWeakRef(t.untyped_storage()).cdata
        if ref not in state_ids and ref not in seen:
            seen.add(ref)
            m.saved[stack[-1]] = m.saved.get(stack[-1], 0) + t.untyped_storage().nbytes()
        return t

    handles = []

    def on(module, pre, post, with_kwargs=False):
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=with_kwargs))
        handles.append(module.register_forward_hook(post))

    for i, block in enumerate(block_list):
        def block_pre(mod, args, kwargs, i=i):
            if m.block_input_shape is None:
                first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
                if first is not None:
                    m.block_input_shape = tuple(first.shape)
                    m.block_input_numel = first.numel()
            stack.append(last_group.get(i, f"block{i}.attn"))

        def block_post(mod, args, out, i=i):
            stack.pop()
            if i == len(block_list) - 1:
                stack[:] = ["head"]
        on(block, block_pre, block_post, with_kwargs=True)
        for kind in ("attn", "mlp"):
            key = f"block{i}.{kind}"
            for path in layout.group(kind).modules:
                def pre(mod, args, kwargs, key=key, i=i, path=path):
                    last_group[i] = key
                    stack.append(key)
                    m.group_inputs.append((key, names[id(mod)], mod, args, kwargs))

                def post(mod, args, out):
                    stack.pop()
                on(block.get_submodule(path), pre, post, with_kwargs=True)
    try:
        with mode, _Counter(lambda: stack[-1], m), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = functional_call(model, state, args, kwargs, strict=False)
            value = _default_loss(out) if loss is None else loss(out)
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise UserError("the module's output is not a scalar loss; pass loss=callable "
                                "(output -> scalar)", field="loss")
    finally:
        for h in handles:
            h.remove()
    del out, value
    m.held_input = sum(t.untyped_storage().nbytes() for t in held
                       if StorageWeakRef(t.untyped_storage()).cdata not in seen)
    with mode:
        for key, path, mod, args, kwargs in m.group_inputs:
            temp = _bwd_temp(mod, path, state, args, kwargs)
            m.bwd_temp[key] = max(m.bwd_temp.get(key, 0), temp)
    m.group_inputs.clear()
    return m


def _bwd_temp(mod: nn.Module, path: str, state: dict, args, kwargs) -> int:
    """Bytes one module's backward holds beyond what was live when it began (its saved tensors,
    the incoming gradient) and the gradient of its input it returns: run alone on its recorded
    input, parameters frozen (their gradients are the cost model's own term), live storages
    tracked op by op."""
    from torch.func import functional_call

    # Parameters require gradients as in training (a Linear then keeps its input for the weight
    # gradient); their gradients are the cost model's own term, so they leave the live count as
    # soon as they are made.
    sub = {k[len(path) + 1:]: v.detach().requires_grad_(v.is_floating_point() and v.requires_grad)
           for k, v in state.items() if k.startswith(path + ".")}
    params = [v for v in sub.values() if v.requires_grad]
    leaves = []

    def leaf(a):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            t = a.detach().requires_grad_(True)
            leaves.append(t)
            return t
        return a
    args = tuple(leaf(a) for a in args)
    kwargs = {k: leaf(v) for k, v in kwargs.items()}
    if not leaves:
        return 0
    with _Live() as live:
        out = functional_call(mod, sub, args, kwargs, strict=False)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            return 0
        grads = [torch.empty_like(o) for o in outs]
        for p in params:
            p.register_hook(live.forget)
        live.start()
        got = torch.autograd.grad(outs, leaves + params, grads, allow_unused=True)
    returned = sum(g.untyped_storage().nbytes() for g in got[:len(leaves)] if g is not None)
    return max(0, live.peak - live.baseline - returned)


class _Live(TorchDispatchMode):
    """Live bytes of the storages ops create (by storage, until freed); their peak after start()
    is taken over a snapshot per op."""

    def __init__(self):
        super().__init__()
        from torch.multiprocessing.reductions import StorageWeakRef
        self._ref = StorageWeakRef
        self.tracked: dict[int, tuple] = {}
        self.ignored: set[int] = set()
        self.baseline = 0
        self.snapshots: list[tuple] = []
        self.started = False

    def live(self) -> int:
        for k in [k for k, (ref, _) in self.tracked.items() if ref.expired()]:
            del self.tracked[k]
        return sum(n for _, n in self.tracked.values())

    def forget(self, t: torch.Tensor):
        """A parameter gradient: out of the count from when it was made. It stays alive to the
        end (autograd.grad returns it), so its storage's address is not reused meanwhile."""
        c = self._ref(t.untyped_storage()).cdata
        self.tracked.pop(c, None)
        self.ignored.add(c)
        i = len(self.snapshots) - 1
        while i >= 0 and any(x[0] == c for x in self.snapshots[i]):
            self.snapshots[i] = tuple(x for x in self.snapshots[i] if x[0] != c)
            i -= 1

    def start(self):
        self.started = True
        self.baseline = self.live()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                ref = self._ref(t.untyped_storage())
                if ref.cdata not in self.ignored:
                    self.tracked.setdefault(ref.cdata, (ref, t.untyped_storage().nbytes()))
        if self.started:
            self.live()
            self.snapshots.append(tuple((c, n) for c, (_, n) in self.tracked.items()))
        return out

    @property
    def peak(self) -> int:
        # Parameter gradients are known as such only once made (their hook): left out afterwards.
        return max([self.baseline] + [sum(n for _, n in snap) for snap in self.snapshots])


def _inputs(example_input, fake):
    def conv(x):
        return fake(x) if isinstance(x, torch.Tensor) else x
    if isinstance(example_input, dict):
        return (), {k: conv(v) for k, v in example_input.items()}
    if isinstance(example_input, (tuple, list)):
        return tuple(conv(x) for x in example_input), {}
    return (conv(example_input),), {}


def _default_loss(out):
    """The module's own loss: its output, a `.loss` field (transformers' outputs) or the first
    element of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    return out
