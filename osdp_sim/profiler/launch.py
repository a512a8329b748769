"""Kernel launch overhead: the time of a tiny op that does no real work (a 1-element in-place add),
issued back to back, so only the framework dispatch and the device launch remain."""

from dataclasses import dataclass

import torch

from osdp_sim.profiler.device import Device
from osdp_sim.profiler.timing import Progress, Repeats, time_calls


@dataclass(frozen=True)
class LaunchResult:
    seconds: float
    spread: float


def measure_kernel_launch(device: Device, repeats: Repeats, progress: Progress) -> LaunchResult:
    x = torch.zeros(1, device=device.torch_device)
    # A sample of many launches: on a GPU the host issue rate, on a CPU the dispatch cost.
    t = time_calls(lambda: x.add_(1.0), device.sync, Repeats(repeats.warmup, repeats.samples,
                                                            max(repeats.min_sample_s, 5e-3)))
    progress("kernel launch", 1, 1, f"{t.median_s * 1e6:.2f} us (spread {t.spread:.1%})")
    return LaunchResult(t.median_s, t.spread)
