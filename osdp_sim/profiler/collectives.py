"""all_gather, reduce_scatter and all_reduce over message sizes for one process group, in
nccl-tests conventions: S is the full (unsharded) buffer, busbw = factor * S / t."""

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from scipy.optimize import nnls

from osdp_sim.profiler.device import Device
from osdp_sim.profiler.timing import Progress, Repeats, time_calls

OPS = ("all_gather", "reduce_scatter", "all_reduce")
ELEMENT_BYTES = 4            # fp32 buffers: what FSDP's reduce dtype is; all_gather does not care
# A size whose bus bandwidth falls below this fraction of the previous size's is measured again
# (a burst of other work on a shared host; the loader refuses a table that collapses below
# hardware/load.py TABLE_MIN_BUSBW_RATIO), at most this many more times.
REMEASURE_BUSBW_RATIO = 0.3
REMEASURES = 2

# The *_single names replace the *_tensor ones in newer torch (the old ones warn there).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def busbw_factor(op: str, group_size: int) -> float:
    n = group_size
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True)
class CollectivePoint:
    op: str
    group_size: int
    scope: str                # intra | inter
    size_bytes: int           # full buffer S
    seconds: float
    spread: float

    @property
    def busbw_bytes_per_s(self) -> float:
        return busbw_factor(self.op, self.group_size) * self.size_bytes / self.seconds


def message_sizes(max_bytes: int, quick: bool, min_bytes: int = 4096) -> list[int]:
    """4 KiB, then x4 (x16 when quick) up to max_bytes; max_bytes itself is always the last size."""
    step = 16 if quick else 4
    sizes, s = [], min_bytes
    while s < max_bytes:
        sizes.append(s)
        s *= step
    sizes.append(max(max_bytes, min_bytes))
    return sizes


def group_sizes(world: int) -> list[int]:
    """2, 4, 8, ... up to the world size, and the world size itself."""
    sizes, g = [], 2
    while g < world:
        sizes.append(g)
        g *= 2
    return sizes + [world] if world >= 2 else []


@dataclass(frozen=True)
class MeasuredGroups:
    """The process groups of one size that profile-hw measures at once, and their scope.
    intra: ranks 0..g-1 inside node 0; inter: ranks 0..g-1 over whole nodes (a shard group
    spanning nodes); replica: one rank per node over the first g nodes, one such group per local
    rank, all measured at once (what hybrid sharding's replica all-reduce runs)."""

    scope: str
    group_size: int
    groups: tuple[tuple[int, ...], ...]


def measured_groups(world: int, per_node: int) -> list[MeasuredGroups]:
    """Every set of groups to measure, in order; each rank is in at most one group of a set."""
    nodes = world // per_node
    out = [MeasuredGroups("intra", g, (tuple(range(g)),)) for g in group_sizes(per_node)]
    if nodes > 1:
        out += [MeasuredGroups("inter", k * per_node, (tuple(range(k * per_node)),))
                for k in group_sizes(nodes)]
        if per_node > 1:     # with one rank per node the replica groups are the inter ones above
            out += [MeasuredGroups("replica", k, tuple(tuple(j * per_node + i for j in range(k))
                                                         for i in range(per_node)))
                    for k in group_sizes(nodes)]
    return out


def collective_call(op: str, size_bytes: int, group_size: int, group, device: Device):
    """A no-argument function that runs one collective on zero-filled fp32 buffers (zeros stay
    zeros under repeated sums), and the buffer size S it actually moves."""
    elems = max(group_size, size_bytes // ELEMENT_BYTES // group_size * group_size)
    shard = elems // group_size
    dev = device.torch_device
    if op == "all_reduce":
        buf = torch.zeros(elems, device=dev)
        fn = lambda: dist.all_reduce(buf, group=group)            # noqa: E731
    elif op == "all_gather":
        out, inp = torch.zeros(elems, device=dev), torch.zeros(shard, device=dev)
        fn = lambda: _all_gather(out, inp, group=group)            # noqa: E731
    elif op == "reduce_scatter":
        # gloo wants a 1-D input whose length is world * output length.
        out, inp = torch.zeros(shard, device=dev), torch.zeros(elems, device=dev)
        fn = lambda: _reduce_scatter(out, inp, group=group)        # noqa: E731
    else:
        raise ValueError(f"unknown collective {op!r}")
    return fn, elems * ELEMENT_BYTES


def agree_on_max(group, device: Device):
    """A time_calls `agree` hook: the largest of each count over the group's members."""
    def agree(counts: list[int]) -> list[int]:
        t = torch.tensor(counts, dtype=torch.int64, device=device.torch_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return [int(v) for v in t.tolist()]
    return agree


def collective_repeats(repeats: Repeats, size_bytes: int) -> Repeats:
    """One call per sample (scheduler hiccups on a shared CPU hit single calls, and the median
    of single calls ignores them), many samples for fast calls, fewer warm-ups for huge ones."""
    big = size_bytes >= (64 << 20)
    return Repeats(warmup=min(repeats.warmup, 1) if big else repeats.warmup,
                   samples=max(3, repeats.samples - 2) if big else repeats.samples,
                   min_sample_s=0.0, budget_s=repeats.budget_s, max_samples=max(repeats.samples, 100))


def collapsed(point: CollectivePoint, previous: CollectivePoint | None) -> bool:
    """Whether this size's bus bandwidth fell below REMEASURE_BUSBW_RATIO of the previous size's."""
    return previous is not None and \
        point.busbw_bytes_per_s < REMEASURE_BUSBW_RATIO * previous.busbw_bytes_per_s


def sweep(device: Device, group, group_size: int, scope: str, sizes: list[int], repeats: Repeats,
          progress: Progress) -> list[CollectivePoint]:
    """Every op at every size on this group. Every member must call it with the same arguments.
    A size whose bus bandwidth collapses against the previous size's is measured again, up to
    REMEASURES times, and its fastest median kept; the group's members agree on each retry."""
    points, total, i = [], len(OPS) * len(sizes), 0
    agree = agree_on_max(group, device)
    for op in OPS:
        previous = None
        for size in sizes:
            i += 1
            fn, actual = collective_call(op, size, group_size, group, device)
            reps = collective_repeats(repeats, actual)
            t = time_calls(fn, device.sync, reps, agree)
            p = CollectivePoint(op, group_size, scope, actual, t.median_s, t.spread)
            for retry in range(REMEASURES):
                if not agree([int(collapsed(p, previous))])[0]:
                    break
                progress(f"collectives {scope} n={group_size}", i, total,
                         f"{op} {actual} B: busbw collapsed, measuring again ({retry + 1}/{REMEASURES})")
                t = time_calls(fn, device.sync, reps, agree)
                if t.median_s < p.seconds:
                    p = CollectivePoint(op, group_size, scope, actual, t.median_s, t.spread)
            progress(f"collectives {scope} n={group_size}", i, total, f"{op} {actual} B: {p.seconds * 1e3:.3f} ms, "
                     f"busbw {p.busbw_bytes_per_s / 1e9:.3f} GB/s (spread {p.spread:.1%})")
            points.append(p)
            previous = p
            del fn
    return points


def measure_collective_launch(device: Device, group, group_size: int, repeats: Repeats) -> dict[str, float]:
    """Seconds per call of each op on one element per rank: the fixed cost of a collective."""
    out = {}
    for op in OPS:
        fn, _ = collective_call(op, group_size * ELEMENT_BYTES, group_size, group, device)
        out[op] = time_calls(fn, device.sync, collective_repeats(repeats, 0), agree_on_max(group, device)).median_s
    return out


@dataclass(frozen=True)
class AlphaBeta:
    latency_s: float
    busbw_bytes_per_s: float
    max_relative_error: float     # worst |fit - measured| / measured over the points fitted


def fit_alpha_beta(points: list[CollectivePoint]) -> AlphaBeta:
    """t = latency + factor * S / busbw, least squares in relative error, both terms >= 0."""
    if not points:
        raise ValueError("no collective points to fit")
    t = np.array([p.seconds for p in points])
    volume = np.array([busbw_factor(p.op, p.group_size) * p.size_bytes for p in points])
    a = np.column_stack([1.0 / t, volume / t])
    (alpha, inv_beta), _ = nnls(a, np.ones_like(t))
    if inv_beta <= 0:
        inv_beta = 1.0 / max(p.busbw_bytes_per_s for p in points)
    fitted = alpha + volume * inv_beta
    return AlphaBeta(float(alpha), float(1.0 / inv_beta), float(np.max(np.abs(fitted - t) / t)))
