"""Forward and backward time of one GPT block (pre-LN attention + 4h GELU MLP, plain torch),
so the profile's backward/forward ratio comes from the work a training step actually does."""

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osdp_sim.profiler.device import DTYPES, Device
from osdp_sim.profiler.timing import Progress, Repeats, relative_spread


@dataclass(frozen=True)
class BlockShape:
    hidden: int
    heads: int
    seq: int
    batch: int


@dataclass(frozen=True)
class BlockResult:
    dtype: str
    hidden: int
    heads: int
    seq: int
    batch: int
    forward_s: float
    forward_spread: float
    backward_s: float
    backward_spread: float

    @property
    def ratio(self) -> float:
        return self.backward_s / self.forward_s


class GPTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def block_shape(kind: str, quick: bool, tiny: bool = False) -> BlockShape:
    if tiny:
        return BlockShape(hidden=64, heads=4, seq=32, batch=2)
    if kind == "cuda":
        return BlockShape(hidden=4096, heads=32, seq=2048, batch=1 if quick else 2)
    return BlockShape(hidden=256, heads=4, seq=128, batch=2) if quick else BlockShape(512, 8, 256, 4)


def measure_block(device: Device, dtype: str, shape: BlockShape, repeats: Repeats,
                  progress: Progress) -> BlockResult:
    torch.manual_seed(0)
    block = GPTBlock(shape.hidden, shape.heads).to(device=device.torch_device, dtype=DTYPES[dtype])
    x = torch.randn(shape.batch, shape.seq, shape.hidden, device=device.torch_device,
                    dtype=DTYPES[dtype], requires_grad=True)    # a middle block: input grads too
    grad = torch.randn_like(x)
    fwd, bwd = [], []
    for i in range(max(1, repeats.warmup) + max(1, repeats.samples)):
        device.sync()
        t0 = time.perf_counter()
        out = block(x)
        device.sync()
        t1 = time.perf_counter()
        out.backward(grad)
        device.sync()
        t2 = time.perf_counter()
        block.zero_grad(set_to_none=False)
        x.grad = None
        if i >= max(1, repeats.warmup):
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    result = BlockResult(dtype, shape.hidden, shape.heads, shape.seq, shape.batch,
                         statistics.median(fwd), relative_spread(fwd), statistics.median(bwd), relative_spread(bwd))
    progress("transformer block", 1, 1, f"forward {result.forward_s * 1e3:.2f} ms, backward "
             f"{result.backward_s * 1e3:.2f} ms, ratio {result.ratio:.2f}")
    return result
