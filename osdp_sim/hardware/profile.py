"""A hardware profile as data: devices, compute rates, collective costs, overlap, memory overheads.

Units are in the names. Bandwidths are bytes/s inside the code; YAML files give GB/s (10^9 B/s,
as nccl-tests reports busbw) under keys ending in `_gbps`.
"""

from dataclasses import dataclass, field, replace

COLLECTIVE_OPS = ("all_gather", "reduce_scatter", "all_reduce")
DTYPES = ("fp32", "bf16", "fp16")
# intra: inside one node; inter: a group spanning nodes; replica: one rank per node, measured with
# every local rank's such group at once (the hybrid-shard replica all-reduce), busbw per group.
SCOPES = ("intra", "inter", "replica")
FREE_BANDWIDTH = 1e30          # bytes/s of a collective that moves nothing (fake process group)


@dataclass(frozen=True)
class DeviceSpec:
    kind: str                     # cuda | cpu
    name: str
    count: int                    # devices in the whole system
    per_node: int
    memory_bytes: int             # capacity of one device
    usable_memory_bytes: int      # after the runtime context (CUDA context, NCCL buffers)

    @property
    def nodes(self) -> int:
        return -(-self.count // self.per_node)


@dataclass(frozen=True)
class ComputeSpec:
    peak_flops: dict[str, float]                                  # dtype -> FLOP/s
    gemm_efficiency: dict[str, tuple[tuple[float, float], ...]]   # dtype -> ((GEMM GFLOP, fraction of peak), ...)
    memory_bandwidth_bytes_per_s: float
    bandwidth_efficiency: float   # achieved fraction of memory bandwidth for elementwise work
    backward_forward_ratio: float # backward compute time / forward compute time
    kernel_launch_s: float        # fixed device cost per kernel
    efficiency_scale: float = 1.0 # calibrated multiplier on the GEMM efficiency curve
    # The fused attention kernel (SDPA flash / memory-efficient): fraction of peak in forward over
    # the keys each query attends; empty: the GEMM curve at the kernel's FLOPs.
    attention_efficiency: dict = field(default_factory=dict)    # dtype -> ((keys, fraction), ...)
    attention_backward_ratio: float = 2.5   # backward time / forward time of the attention kernel
    gemm_tile: tuple[int, int] = (1, 1)     # output tile (M, N) of the GEMM kernels (quantisation)


@dataclass(frozen=True)
class HostSpec:
    """The CPU thread that issues the work. Eager PyTorch dispatches every op from Python; on a GPU
    the kernels then run asynchronously, so a task takes max(device, host) time; on a CPU device
    the same thread does both, so host time adds to the device time."""

    op_s: float = 0.0             # dispatch of one eager aten op (Python, dispatcher, autograd)
    call_s: float = 0.0           # FSDP2's host work per collective of a unit (hook, copies, call)
    dtensor_op_s: float = 0.0     # one op on a DTensor (the optimizer step on sharded parameters)
    async_device: bool = True     # the device runs kernels asynchronously from the host


@dataclass(frozen=True)
class CollectiveTable:
    """Measured bus bandwidth of one collective at one group size over message sizes.
    Message size is the full (unsharded) buffer S, as nccl-tests reports it."""

    op: str
    group_size: int
    scope: str                              # intra | inter (the group spans nodes)
    sizes_bytes: tuple[int, ...]
    busbw_bytes_per_s: tuple[float, ...]


@dataclass(frozen=True)
class LinkSpec:
    """Alpha-beta fallback for a scope: t = latency + factor * S / busbw."""

    latency_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True)
class CollectiveSpec:
    intra: LinkSpec
    inter: LinkSpec | None
    launch_s: float                                   # fixed cost per collective call
    tables: tuple[CollectiveTable, ...] = ()
    efficiency: dict[str, float] = field(default_factory=lambda: {op: 1.0 for op in COLLECTIVE_OPS})
    extra_latency_s: dict[str, float] = field(default_factory=lambda: {op: 0.0 for op in COLLECTIVE_OPS})


@dataclass(frozen=True)
class MemorySpec:
    context_bytes: int            # per-process memory outside the tensors the framework tracks
    fragmentation: float          # allocator margin as a fraction of the live tensor peak


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    device: DeviceSpec
    compute: ComputeSpec
    collectives: CollectiveSpec
    overlap_slowdown: float       # >= 1: both streams run this much slower while they overlap
    memory: MemorySpec
    host: HostSpec = HostSpec()
    source: str = ""              # the file it was loaded from
    provenance: dict = field(default_factory=dict)   # how it was measured / what it was fitted on

    def without_communication(self) -> "HardwareProfile":
        """The same machine with every collective free (no latency, no launch cost, unbounded
        bandwidth) and no overlap slowdown: what a run on torch's fake process group measures
        (validate --fake-world), where collectives move nothing."""
        free = LinkSpec(latency_s=0.0, busbw_bytes_per_s=FREE_BANDWIDTH)
        c = self.collectives
        return replace(self, overlap_slowdown=1.0, collectives=replace(
            c, intra=free, inter=None if c.inter is None else free, launch_s=0.0, tables=(),
            efficiency={op: 1.0 for op in COLLECTIVE_OPS}, extra_latency_s={op: 0.0 for op in COLLECTIVE_OPS}))

    def with_devices(self, count: int) -> "HardwareProfile":
        """The same hardware with fewer (or more) devices of the same node shape."""
        return replace(self, device=replace(self.device, count=count,
                                            per_node=min(self.device.per_node, count)))
