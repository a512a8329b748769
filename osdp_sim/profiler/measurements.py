"""Everything one profiling run measured, its JSON form (rank 0 hands it to the launcher) and
the merge of the ranks' results (median of times, largest spread)."""

import dataclasses
import statistics
from dataclasses import dataclass

from osdp_sim.profiler.bandwidth import BandwidthResult
from osdp_sim.profiler.block import BlockResult
from osdp_sim.profiler.collectives import CollectivePoint
from osdp_sim.profiler.device import MemoryFacts
from osdp_sim.profiler.gemm import GemmPoint
from osdp_sim.profiler.launch import LaunchResult
from osdp_sim.profiler.overlap import OverlapResult


@dataclass(frozen=True)
class Measurements:
    kind: str                         # cpu | cuda
    device_name: str
    world: int
    per_node: int
    threads_per_rank: int
    gemm: tuple[GemmPoint, ...]
    bandwidth: BandwidthResult
    kernel_launch: LaunchResult
    block: BlockResult
    collectives: tuple[CollectivePoint, ...]
    collective_launch_s: dict         # op -> seconds for a one-element call
    overlap: OverlapResult
    memory: MemoryFacts
    wall_s: float                     # measuring time on rank 0


def to_dict(m: Measurements) -> dict:
    return dataclasses.asdict(m)


def from_dict(d: dict) -> Measurements:
    return Measurements(
        kind=d["kind"], device_name=d["device_name"], world=d["world"], per_node=d["per_node"],
        threads_per_rank=d["threads_per_rank"],
        gemm=tuple(GemmPoint(**p) for p in d["gemm"]),
        bandwidth=BandwidthResult(**d["bandwidth"]),
        kernel_launch=LaunchResult(**d["kernel_launch"]),
        block=BlockResult(**d["block"]),
        collectives=tuple(CollectivePoint(**p) for p in d["collectives"]),
        collective_launch_s=dict(d["collective_launch_s"]),
        overlap=OverlapResult(**d["overlap"]),
        memory=MemoryFacts(**d["memory"]),
        wall_s=d["wall_s"])


def _merge_values(name: str, values: list):
    first = values[0]
    if isinstance(first, dict):
        return {k: _merge_values(k, [v[k] for v in values]) for k in first}
    if isinstance(first, (list, tuple)):
        return [_merge_values(name, list(items)) for items in zip(*values)]
    if isinstance(first, float):
        return max(values) if "spread" in name else statistics.median(values)
    return first                      # ints, strings: the same on every rank (rank 0's)


def merge_ranks(per_rank: list[dict]) -> dict:
    """Merge the ranks' measurement dicts: times and rates by their median over ranks, spreads by
    their maximum; collective points over the ranks in that group; the memory baseline is the
    largest rank's."""
    merged = _merge_values("", [{k: v for k, v in r.items() if k != "collectives"} for r in per_rank])
    by_key: dict[tuple, list[dict]] = {}
    for r in per_rank:
        for p in r["collectives"]:
            by_key.setdefault((p["op"], p["group_size"], p["scope"], p["size_bytes"]), []).append(p)
    merged["collectives"] = [_merge_values("", ps) for ps in by_key.values()]
    merged["memory"]["baseline_bytes"] = max(r["memory"]["baseline_bytes"] for r in per_rank)
    merged["wall_s"] = per_rank[0]["wall_s"]
    return merged
