"""A split Linear computes the same function and gradients as the Linear it replaces."""

import pytest
import torch

from osdp_sim.errors import UserError
from osdp_sim.runtime.split_linear import SplitLinear, split_linear


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_same_function_and_gradients(k, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24, bias=bias)
    split = split_linear(lin, k)
    x = torch.randn(3, 5, 64, requires_grad=True)
    g = torch.randn(3, 5, 24)
    y1, y2 = lin(x), split(x)
    torch.testing.assert_close(y2, y1, rtol=1e-6, atol=1e-6)
    (y1 * g).sum().backward()
    gx1, x.grad = x.grad, None
    (y2 * g).sum().backward()
    torch.testing.assert_close(x.grad, gx1, rtol=1e-6, atol=1e-6)
    got = torch.cat([s.weight.grad for s in split.slices], dim=1)
    torch.testing.assert_close(got, lin.weight.grad, rtol=1e-6, atol=1e-5)
    if bias:
        torch.testing.assert_close(split.bias.grad, lin.bias.grad, rtol=1e-6, atol=1e-6)


def test_structure_slices_without_bias_and_one_bias():
    split = split_linear(torch.nn.Linear(64, 24), 4)
    assert len(split.slices) == 4
    assert all(s.in_features == 16 and s.out_features == 24 and s.bias is None for s in split.slices)
    assert split.bias.shape == (24,)
    assert [n for n, _ in split.named_parameters()] == [
        "bias", "slices.0.weight", "slices.1.weight", "slices.2.weight", "slices.3.weight"]
    assert sum(p.numel() for p in split.parameters()) == 64 * 24 + 24


def test_slice_count_must_divide_input_features():
    with pytest.raises(UserError, match="cannot split a Linear with 60 input features into 8"):
        SplitLinear(60, 10, 8)
    with pytest.raises(UserError, match="divides 60"):
        split_linear(torch.nn.Linear(60, 10), 8)
