"""Operator splitting: one Linear cut into k slices along its input features.

Each slice is its own nn.Linear (without bias), so a plan can shard some slices (ZeRO-3, one FSDP
unit per slice index) and replicate the others; the bias is one parameter of the SplitLinear and
follows the group's replicated strategy. y = sum_i slice_i(x[..., i*in/k:(i+1)*in/k]) + bias.

Splitting keeps nothing extra for backward: each slice keeps a strided view of x (one storage,
counted once), and the partial sums keep nothing.
"""

import torch
from torch import nn

from osdp_sim.errors import UserError


class SplitLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, slices: int, bias: bool = True):
        super().__init__()
        if slices < 1 or in_features % slices:
            raise UserError(f"cannot split a Linear with {in_features} input features into "
                            f"{slices} equal slices; use a slice count that divides {in_features}",
                            field="slices")
        self.in_features = in_features
        self.out_features = out_features
        self.slice_features = in_features // slices
        self.slices = nn.ModuleList(nn.Linear(self.slice_features, out_features, bias=False)
                                    for _ in range(slices))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.split(self.slice_features, dim=-1)
        y = self.slices[0](parts[0])
        for lin, part in zip(self.slices[1:], parts[1:]):
            y = y + lin(part)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"slices={len(self.slices)}, bias={self.bias is not None}")


def split_linear(linear: nn.Linear, k: int) -> SplitLinear:
    """A SplitLinear computing the same function as `linear` (weights copied, same device/dtype)."""
    out = SplitLinear(linear.in_features, linear.out_features, k, linear.bias is not None)
    out.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        for lin, w in zip(out.slices, linear.weight.split(out.slice_features, dim=1)):
            lin.weight.copy_(w)
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out
