"""Hand-built hardware profiles for tests: round numbers so expectations can be computed by hand."""

from osdp_sim.hardware.profile import (CollectiveSpec, ComputeSpec, DeviceSpec, HardwareProfile,
                                       LinkSpec, MemorySpec)

GiB = 2**30

ROUND_CPU_PROFILE_YAML = """\
schema: osdp-sim/hardware
version: 1
name: test-cpu
description: a round-number 2-core CPU profile for tests
device: {kind: cpu, name: test cpu, count: 2, per_node: 2, memory_gib: 8, usable_memory_gib: 8}
compute:
  peak_tflops: {fp32: 0.05, bf16: 0.05}
  gemm_efficiency: {fp32: [[0.001, 0.5], [1, 0.5]], bf16: [[0.001, 0.5], [1, 0.5]]}
  memory_bandwidth_gbps: 10
  bandwidth_efficiency: 0.5
  backward_forward_ratio: 2.0
  kernel_launch_us: 10
collectives:
  launch_us: 50
  intra_node: {latency_us: 200, busbw_gbps: 1.0}
overlap: {slowdown: 1.0}
memory: {context_mib: 0, fragmentation: 0.0}
"""
"""A round-number 2-core CPU profile file for tests that run ranks (validate, compare)."""


def simple_hw(count: int = 8, per_node: int = 8, busbw_gbps: float = 10.0, latency_s: float = 0.0,
              launch_s: float = 0.0, peak_tflops: float = 100.0, eff: float = 0.5,
              slowdown: float = 1.0, memory_gib: float = 24.0, inter_gbps: float | None = None,
              kernel_launch_s: float = 0.0, fragmentation: float = 0.0, context_bytes: int = 0,
              bw_gbps: float = 1000.0) -> HardwareProfile:
    """Flat GEMM efficiency `eff`, alpha-beta collectives, no launch costs unless asked."""
    inter = LinkSpec(latency_s, inter_gbps * 1e9) if inter_gbps else (
        LinkSpec(latency_s, busbw_gbps * 1e9) if count > per_node else None)
    return HardwareProfile(
        name="test", description="hand-built test profile",
        device=DeviceSpec("cuda", "test-gpu", count, per_node, int(memory_gib * GiB), int(memory_gib * GiB)),
        compute=ComputeSpec(
            peak_flops={"fp32": peak_tflops * 1e12, "bf16": peak_tflops * 1e12},
            gemm_efficiency={"fp32": ((1e-3, eff), (1e3, eff)), "bf16": ((1e-3, eff), (1e3, eff))},
            memory_bandwidth_bytes_per_s=bw_gbps * 1e9, bandwidth_efficiency=1.0,
            backward_forward_ratio=2.0, kernel_launch_s=kernel_launch_s),
        collectives=CollectiveSpec(intra=LinkSpec(latency_s, busbw_gbps * 1e9), inter=inter,
                                   launch_s=launch_s),
        overlap_slowdown=slowdown,
        memory=MemorySpec(context_bytes=context_bytes, fragmentation=fragmentation))
