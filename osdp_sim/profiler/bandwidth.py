"""Memory-bandwidth-bound throughput: a large elementwise add (2 reads + 1 write) and a copy
(1 read + 1 write) on preallocated tensors, counted in bytes moved per second."""

from dataclasses import dataclass

import torch

from osdp_sim.profiler.device import Device
from osdp_sim.profiler.timing import Progress, Repeats, time_calls


@dataclass(frozen=True)
class BandwidthResult:
    tensor_bytes: int          # size of one operand
    add_bytes_per_s: float
    add_spread: float
    copy_bytes_per_s: float
    copy_spread: float


def bandwidth_tensor_bytes(kind: str, quick: bool, tiny: bool = False) -> int:
    """Operands well past the last-level cache (CPU L3 can reach hundreds of MiB)."""
    if tiny:
        return 4 << 20
    if kind == "cuda":
        return (256 << 20) if quick else (1 << 30)
    return (64 << 20) if quick else (256 << 20)


def measure_bandwidth(device: Device, tensor_bytes: int, repeats: Repeats,
                      progress: Progress) -> BandwidthResult:
    n = tensor_bytes // 4
    # Filled (so touched: no page faults are timed); the values do not matter.
    a = torch.full((n,), 1.0, device=device.torch_device)
    b = torch.full((n,), 2.0, device=device.torch_device)
    c = torch.zeros(n, device=device.torch_device)
    add = time_calls(lambda: torch.add(a, b, out=c), device.sync, repeats)
    progress("bandwidth", 1, 2, f"add {3 * n * 4 / add.median_s / 1e9:.2f} GB/s (spread {add.spread:.1%})")
    copy = time_calls(lambda: c.copy_(a), device.sync, repeats)
    progress("bandwidth", 2, 2, f"copy {2 * n * 4 / copy.median_s / 1e9:.2f} GB/s (spread {copy.spread:.1%})")
    return BandwidthResult(tensor_bytes=n * 4, add_bytes_per_s=3 * n * 4 / add.median_s, add_spread=add.spread,
                           copy_bytes_per_s=2 * n * 4 / copy.median_s, copy_spread=copy.spread)
