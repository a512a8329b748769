"""GEMM throughput over sizes and dtypes, and the efficiency curve (GFLOP -> fraction of peak)."""

from dataclasses import dataclass

import torch

from osdp_sim.profiler.device import DTYPES, Device
from osdp_sim.profiler.timing import Progress, Repeats, time_interleaved


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int

    @property
    def gflop(self) -> float:
        return 2.0 * self.m * self.n * self.k / 1e9


@dataclass(frozen=True)
class GemmPoint:
    dtype: str
    m: int
    n: int
    k: int
    seconds: float
    spread: float

    @property
    def gflop(self) -> float:
        return 2.0 * self.m * self.n * self.k / 1e9

    @property
    def flops_per_s(self) -> float:
        return self.gflop * 1e9 / self.seconds


def gemm_shapes(kind: str, quick: bool, tiny: bool = False) -> list[GemmShape]:
    """Square GEMMs plus transformer-shaped ones: (tokens x h) @ (h x 4h)."""
    if tiny:
        square, transformer = [32, 64, 128], [(64, 64)]
    elif kind == "cuda":
        square = [256, 1024, 4096, 8192] if quick else [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
        transformer = ([(2048, 1024), (8192, 4096)] if quick else
                       [(512, 512), (2048, 1024), (4096, 2048), (8192, 4096), (16384, 8192)])
    else:
        square = [64, 256, 1024] if quick else [64, 128, 256, 512, 1024, 2048]
        transformer = [(512, 512)] if quick else [(128, 256), (512, 512), (1024, 768), (2048, 1024)]
    shapes = [GemmShape(s, s, s) for s in square] + [GemmShape(t, 4 * h, h) for t, h in transformer]
    return sorted(set(shapes), key=lambda s: (s.gflop, s.m))


def measure_gemm(device: Device, dtype: str, shapes: list[GemmShape], repeats: Repeats,
                 progress: Progress) -> list[GemmPoint]:
    """All shapes stay allocated and are sampled round-robin (see time_interleaved)."""
    torch_dtype = DTYPES[dtype]
    calls = []
    for s in shapes:
        a = torch.randn(s.m, s.k, device=device.torch_device).to(torch_dtype)
        b = torch.randn(s.k, s.n, device=device.torch_device).to(torch_dtype)
        out = torch.empty(s.m, s.n, device=device.torch_device, dtype=torch_dtype)
        calls.append(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out))
    total = len(shapes) + 1
    timings = time_interleaved(calls, device.sync, repeats,
                               on_sized=lambda i: progress(f"gemm {dtype}", i + 1, total,
                                                           f"warmed up {_name(shapes[i])}"))
    points = [GemmPoint(dtype, s.m, s.n, s.k, t.median_s, t.spread) for s, t in zip(shapes, timings)]
    progress(f"gemm {dtype}", total, total, "; ".join(
        f"{_name(s)} {p.flops_per_s / 1e9:.1f} GFLOP/s ({p.spread:.0%})" for s, p in zip(shapes, points)))
    return points


def _name(s: GemmShape) -> str:
    return f"{s.m}x{s.k}@{s.k}x{s.n}"


def best_rate(points: list[GemmPoint]) -> float:
    return max(p.flops_per_s for p in points)


def efficiency_curve(points: list[GemmPoint], peak_flops_per_s: float) -> tuple[tuple[float, float], ...]:
    """(GFLOP, achieved / peak) pairs with GFLOP strictly increasing (shapes of equal work are
    averaged) and fractions clamped into (0, 1]."""
    by_gflop: dict[float, list[float]] = {}
    for p in points:
        key = float(f"{p.gflop:.4g}")
        by_gflop.setdefault(key, []).append(p.flops_per_s / peak_flops_per_s)
    return tuple((g, min(1.0, max(1e-6, sum(fs) / len(fs)))) for g, fs in sorted(by_gflop.items()))
