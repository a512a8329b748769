"""Operator splitting: one weight cut into k slices, each slice its own module (so its own FSDP
unit), with the state_dict of the module it replaces.

- `SplitLinear`: an nn.Linear (weight [out, in]) or a Hugging Face GPT-2 Conv1D (weight [in, out])
  cut along its input features. Each slice is an nn.Linear without bias; the bias is one
  parameter of the SplitLinear and follows the group's replicated strategy.
  y = sum_i slice_i(x[..., i*in/k:(i+1)*in/k]) + bias. A fused projection (Phi3's qkv_proj,
  gate_up_proj) is one Linear: a cut along input features never separates its fused outputs.
- `SplitExperts`: a mixture-of-experts module with fused 3-D parameters (transformers 5.x
  Mixtral: gate_up_proj [E, 2f, h], down_proj [E, h, f]) cut along the experts; slice s holds E/k
  consecutive experts and computes their part of the output.

state_dict keys and shapes are those of the unsplit module ("weight", "bias"; "gate_up_proj",
"down_proj"): a save hook concatenates the slices, a load pre-hook cuts an incoming full tensor
into them, so a checkpoint of the unsplit model loads into the split one and back. Under FSDP2
the save hook gathers sharded slices (`full_tensor()`, a collective: every rank calls
state_dict, as torch.distributed.checkpoint does); named_parameters() keeps the slice names.

Splitting keeps nothing extra for backward: each slice keeps a strided view of x (one storage,
counted once), and the partial sums keep nothing.
"""

import torch
import torch.nn.functional as F
from torch import nn

from osdp_sim.errors import UserError

WEIGHT_LAYOUTS = ("out_in", "in_out")


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def _like(piece: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`piece` (a full tensor) laid out as `param` is: a DTensor with param's mesh and placements
    (each rank keeps its own shard, no communication) or a plain tensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    piece = _full(piece).to(dtype=param.dtype)
    if isinstance(param, DTensor):
        return distribute_tensor(piece.to(param.device), param.device_mesh, param.placements,
                                 src_data_rank=None)
    return piece


class SplitLinear(nn.Module):
    """A Linear (weight_layout "out_in") or Conv1D ("in_out") cut into `slices` along its input
    features; its state_dict holds `weight` in the original layout and `bias`."""

    def __init__(self, in_features: int, out_features: int, slices: int, bias: bool = True,
                 weight_layout: str = "out_in"):
        super().__init__()
        if slices < 1 or in_features % slices:
            raise UserError(f"cannot split a Linear with {in_features} input features into "
                            f"{slices} equal slices; use a slice count that divides {in_features}",
                            field="slices")
        if weight_layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"unknown weight layout {weight_layout!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.slice_features = in_features // slices
        self.weight_layout = weight_layout
        self.slices = nn.ModuleList(nn.Linear(self.slice_features, out_features, bias=False)
                                    for _ in range(slices))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._register_state_dict_hook(SplitLinear._save_unsplit)
        self._register_load_state_dict_pre_hook(SplitLinear._load_unsplit, with_module=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.split(self.slice_features, dim=-1)
        y = self.slices[0](parts[0])
        for lin, part in zip(self.slices[1:], parts[1:]):
            y = y + lin(part)
        return y if self.bias is None else y + self.bias

    def full_weight(self, pieces) -> torch.Tensor:
        """The unsplit weight from the slices' weights ([out, in/k] each)."""
        weight = torch.cat([_full(p) for p in pieces], dim=1)
        return weight if self.weight_layout == "out_in" else weight.t().contiguous()

    def weight_pieces(self, weight: torch.Tensor) -> list[torch.Tensor]:
        """The slices' weights ([out, in/k] each) from an unsplit weight."""
        w = weight if self.weight_layout == "out_in" else weight.t()
        return [p.contiguous() for p in w.split(self.slice_features, dim=1)]

    @staticmethod
    def _save_unsplit(module, state_dict, prefix, local_metadata):
        keys = [f"{prefix}slices.{i}.weight" for i in range(len(module.slices))]
        if not all(k in state_dict for k in keys):
            return
        weight = module.full_weight([state_dict.pop(k) for k in keys])
        bias = state_dict.pop(prefix + "bias", None)
        state_dict[prefix + "weight"] = weight           # the unsplit module's key order
        if bias is not None:
            state_dict[prefix + "bias"] = bias

    @staticmethod
    def _load_unsplit(module, state_dict, prefix, local_metadata, strict, missing_keys,
                      unexpected_keys, error_msgs):
        key = prefix + "weight"
        if key not in state_dict:
            return
        weight = _full(state_dict.pop(key))
        shape = ((module.out_features, module.in_features) if module.weight_layout == "out_in"
                 else (module.in_features, module.out_features))
        if tuple(weight.shape) != shape:
            error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                              f"{tuple(weight.shape)}, the split module holds {shape}")
            return
        for i, (lin, piece) in enumerate(zip(module.slices, module.weight_pieces(weight))):
            state_dict[f"{prefix}slices.{i}.weight"] = _like(piece, lin.weight)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"slices={len(self.slices)}, bias={self.bias is not None}, "
                f"weight_layout={self.weight_layout}")


def split_linear(linear: nn.Module, k: int, *, weight_layout: str = "out_in") -> SplitLinear:
    """A SplitLinear computing the same function as `linear` (weights copied, same device and
    dtype). weight_layout "in_out" reads a Conv1D (weight [in, out], y = x @ W + b)."""
    weight = linear.weight
    in_f, out_f = weight.shape[::-1] if weight_layout == "out_in" else weight.shape
    bias = getattr(linear, "bias", None)
    out = SplitLinear(in_f, out_f, k, bias is not None, weight_layout)
    out.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for lin, piece in zip(out.slices, out.weight_pieces(weight)):
            lin.weight.copy_(piece)
        if bias is not None:
            out.bias.copy_(bias)
    return out


class ExpertSlice(nn.Module):
    """Experts first .. first+n-1 of a fused experts module: their part of the MoE output."""

    def __init__(self, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, first: int, act_fn):
        super().__init__()
        self.gate_up_proj = nn.Parameter(gate_up_proj)     # [n, 2f, h]
        self.down_proj = nn.Parameter(down_proj)           # [n, h, f]
        self.first = first
        self.num_experts = gate_up_proj.shape[0]
        self.act_fn = act_fn

    def forward(self, hidden_states, top_k_index, top_k_weights):
        # The computation of transformers' eager MixtralExperts, restricted to this slice's experts.
        out = torch.zeros_like(hidden_states)
        hit = False
        routed = top_k_index.t()                            # [top_k, tokens]
        for e in range(self.num_experts):
            top_k_pos, token_idx = torch.where(routed == self.first + e)
            if token_idx.numel() == 0:
                continue
            hit = True
            gate, up = F.linear(hidden_states[token_idx], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(self.act_fn(gate) * up, self.down_proj[e])
            y = y * top_k_weights[token_idx, top_k_pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        if not hit:
            # Every rank must produce a gradient for every FSDP unit, or the ranks disagree on
            # which reduce-scatters to run: a slice no token reached gets a zero gradient.
            out = out + 0.0 * (self.gate_up_proj.sum() + self.down_proj.sum()).to(out.dtype)
        return out


class SplitExperts(nn.Module):
    """A fused experts module cut into `slices` along the experts; its state_dict holds
    `gate_up_proj` and `down_proj` as the unsplit module does."""

    PARAMS = ("gate_up_proj", "down_proj")

    def __init__(self, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, slices: int, act_fn):
        super().__init__()
        n = gate_up_proj.shape[0]
        if slices < 1 or n % slices:
            raise UserError(f"cannot split {n} experts into {slices} equal slices; use a slice "
                            f"count that divides {n}", field="slices")
        self.num_experts = n
        self.experts_per_slice = n // slices
        e = self.experts_per_slice
        self.slices = nn.ModuleList(
            ExpertSlice(gate_up_proj[s * e:(s + 1) * e].clone(), down_proj[s * e:(s + 1) * e].clone(),
                        s * e, act_fn) for s in range(slices))
        self._register_state_dict_hook(SplitExperts._save_unsplit)
        self._register_load_state_dict_pre_hook(SplitExperts._load_unsplit, with_module=True)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = self.slices[0](hidden_states, top_k_index, top_k_weights)
        for s in self.slices[1:]:
            out = out + s(hidden_states, top_k_index, top_k_weights)
        return out

    @staticmethod
    def _save_unsplit(module, state_dict, prefix, local_metadata):
        for name in SplitExperts.PARAMS:
            keys = [f"{prefix}slices.{i}.{name}" for i in range(len(module.slices))]
            if all(k in state_dict for k in keys):
                state_dict[prefix + name] = torch.cat([_full(state_dict.pop(k)) for k in keys])

    @staticmethod
    def _load_unsplit(module, state_dict, prefix, local_metadata, strict, missing_keys,
                      unexpected_keys, error_msgs):
        for name in SplitExperts.PARAMS:
            key = prefix + name
            if key not in state_dict:
                continue
            full = _full(state_dict.pop(key))
            if full.shape[0] != module.num_experts:
                error_msgs.append(f"size mismatch for {key}: {full.shape[0]} experts, the split "
                                  f"module holds {module.num_experts}")
                continue
            for i, (s, piece) in enumerate(zip(module.slices, full.split(module.experts_per_slice))):
                state_dict[f"{prefix}slices.{i}.{name}"] = _like(piece, getattr(s, name))

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, slices={len(self.slices)}"


def split_experts(experts: nn.Module, k: int) -> SplitExperts:
    """A SplitExperts computing what a transformers 5.x fused experts module computes (Mixtral's
    MixtralExperts: gate_up_proj [E, 2f, h] concatenated gate;up, down_proj [E, h, f], no bias)."""
    for name in SplitExperts.PARAMS:
        p = getattr(experts, name, None)
        if not isinstance(p, torch.Tensor) or p.dim() != 3:
            raise UserError(f"{type(experts).__name__} has no 3-D parameter {name!r}; only fused "
                            "experts (transformers 5.x) can be split along the experts",
                            field="layout.splits")
    if getattr(experts, "has_bias", False) or getattr(experts, "is_transposed", False) \
            or not getattr(experts, "is_concatenated", True) or not getattr(experts, "has_gate", True):
        raise UserError(f"{type(experts).__name__}: only experts without bias, with concatenated "
                        "gate;up weights stored [E, out, in], can be split", field="layout.splits")
    with torch.no_grad():
        return SplitExperts(experts.gate_up_proj.detach(), experts.down_proj.detach(), k,
                            experts.act_fn)
