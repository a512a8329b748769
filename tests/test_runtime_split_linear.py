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


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_is_the_unsplit_linears(bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24, bias=bias)
    split = split_linear(lin, 4)
    sd = split.state_dict()
    assert list(sd) == list(lin.state_dict())
    for key, value in lin.state_dict().items():
        assert torch.equal(sd[key], value)
    other = split_linear(torch.nn.Linear(64, 24, bias=bias), 4)
    other.load_state_dict(lin.state_dict())
    x = torch.randn(5, 64)
    torch.testing.assert_close(other(x), lin(x))
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        other.load_state_dict({"weight": torch.zeros(24, 60), **({"bias": lin.bias} if bias else {})})


def test_in_out_weights_as_gpt2_conv1d_stores_them():
    torch.manual_seed(0)
    conv = torch.nn.Module()
    conv.weight = torch.nn.Parameter(torch.randn(64, 24))      # [in, out]: y = x @ W + b
    conv.bias = torch.nn.Parameter(torch.randn(24))
    split = split_linear(conv, 4, weight_layout="in_out")
    x = torch.randn(3, 64)
    torch.testing.assert_close(split(x), x @ conv.weight + conv.bias, rtol=1e-5, atol=1e-5)
    assert split.state_dict()["weight"].shape == (64, 24)
    assert torch.equal(split.state_dict()["weight"], conv.weight)
