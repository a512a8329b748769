"""Overlap slowdown: a GEMM loop alone, a large all_reduce alone, then both at once (the
collective issued with async_op=True while the GEMMs run). Each side's concurrent time over
its alone time is its slowdown; the profile keeps their mean, at least 1."""

import statistics
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from osdp_sim.profiler.collectives import agree_on_max, collective_repeats
from osdp_sim.profiler.device import DTYPES, Device
from osdp_sim.profiler.timing import Progress, Repeats, relative_spread, time_calls


@dataclass(frozen=True)
class OverlapResult:
    gemm_dim: int
    gemm_dtype: str
    gemm_calls: int
    message_bytes: int
    group_size: int
    compute_alone_s: float
    compute_overlapped_s: float
    comm_alone_s: float
    comm_overlapped_s: float
    compute_spread: float     # of the overlapped samples
    comm_spread: float

    @property
    def compute_slowdown(self) -> float:
        return self.compute_overlapped_s / self.compute_alone_s

    @property
    def comm_slowdown(self) -> float:
        return self.comm_overlapped_s / self.comm_alone_s

    @property
    def slowdown(self) -> float:
        return max(1.0, (self.compute_slowdown + self.comm_slowdown) / 2)


def overlap_setup(kind: str, quick: bool, max_message_bytes: int, tiny: bool = False) -> tuple[int, str, int]:
    """(GEMM dimension, GEMM dtype, all_reduce message bytes)."""
    if tiny:
        return 128, "fp32", min(max_message_bytes, 1 << 20)
    if kind == "cuda":
        return 8192, "bf16", min(max_message_bytes, 256 << 20)
    return 512, "fp32", min(max_message_bytes, (16 << 20) if quick else (32 << 20))


def _completion_time(work, kind: str, out: list) -> threading.Thread:
    """A thread that records when `work` finishes. On CPU wait() blocks (GIL released); on a GPU
    wait() only orders streams, so poll instead."""
    def watch():
        if kind == "cuda":
            while not work.is_completed():
                time.sleep(20e-6)
        else:
            work.wait()
        out.append(time.perf_counter())
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


def _sync_compute(device: Device) -> None:
    if device.kind == "cuda":
        torch.cuda.current_stream(device.torch_device).synchronize()   # not the NCCL stream


def measure_overlap(device: Device, group, group_size: int, gemm_dim: int, gemm_dtype: str,
                    message_bytes: int, repeats: Repeats, progress: Progress) -> OverlapResult:
    dev = device.torch_device
    a = torch.randn(gemm_dim, gemm_dim, device=dev).to(DTYPES[gemm_dtype])
    b = torch.randn(gemm_dim, gemm_dim, device=dev).to(DTYPES[gemm_dtype])
    c = torch.empty_like(a)
    buf = torch.zeros(max(1, message_bytes // 4), device=dev)

    one_gemm = time_calls(lambda: torch.matmul(a, b, out=c), device.sync, repeats).median_s
    comm_alone = time_calls(lambda: dist.all_reduce(buf, group=group), device.sync,
                            collective_repeats(repeats, buf.numel() * 4), agree_on_max(group, device))
    progress("overlap", 1, 3, f"all_reduce {buf.numel() * 4} B alone {comm_alone.median_s * 1e3:.2f} ms")
    # Same number of GEMMs on every rank, sized so both sides take about as long.
    calls = agree_on_max(group, device)([max(1, round(comm_alone.median_s / one_gemm))])[0]

    def gemm_loop():
        for _ in range(calls):
            torch.matmul(a, b, out=c)

    compute_alone = time_calls(gemm_loop, device.sync, Repeats(repeats.warmup, repeats.samples, 0.0))
    progress("overlap", 2, 3, f"{calls} x GEMM {gemm_dim}^3 {gemm_dtype} alone {compute_alone.median_s * 1e3:.2f} ms")

    compute_s, comm_s = [], []
    for i in range(max(1, repeats.warmup) + max(1, repeats.samples)):
        dist.barrier(group=group)
        device.sync()
        done: list = []
        t0 = time.perf_counter()
        work = dist.all_reduce(buf, group=group, async_op=True)
        watcher = _completion_time(work, device.kind, done)
        gemm_loop()
        _sync_compute(device)
        t_compute = time.perf_counter() - t0
        watcher.join()
        work.wait()
        device.sync()
        if i >= max(1, repeats.warmup):
            compute_s.append(t_compute)
            comm_s.append(done[0] - t0)
    result = OverlapResult(gemm_dim, gemm_dtype, calls, buf.numel() * 4, group_size,
                           compute_alone.median_s, statistics.median(compute_s),
                           comm_alone.median_s, statistics.median(comm_s),
                           relative_spread(compute_s), relative_spread(comm_s))
    # this rank's numbers; the profile's slowdown is from the median over ranks (printed at the end)
    progress("overlap", 3, 3, f"overlapped on rank {dist.get_rank()}: compute x{result.compute_slowdown:.2f}, "
             f"communication x{result.comm_slowdown:.2f}")
    return result
