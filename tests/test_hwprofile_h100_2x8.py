"""The documented two-node H100 profile: its inter-node link and what a hybrid-shard replica
all-reduce costs on it (hand-computed from the figures in hwprofiles/h100-2x8.yaml)."""

import pytest

from osdp_sim.costmodel.rates import collective_time_s
from osdp_sim.hardware.load import load_profile

GiB = 2**30


def test_two_nodes_of_eight_with_eight_ndr_nics_each():
    hw = load_profile("h100-2x8")
    assert (hw.device.count, hw.device.per_node, hw.device.nodes) == (16, 8, 2)
    assert hw.collectives.inter.busbw_bytes_per_s == pytest.approx(8 * 47e9)     # 8 NICs x 47 GB/s
    assert hw.collectives.inter.latency_s == pytest.approx(20e-6)
    inside = load_profile("h100x8")
    assert hw.compute == inside.compute and hw.collectives.intra == inside.collectives.intra


def test_replica_all_reduce_shares_the_nodes_nics():
    # 8 concurrent replica groups of 2 ranks (one per node), 1 GiB each: t = launch 10 us + latency
    # 20 us + busbw factor 2(2-1)/2 = 1, times 8 sharing, x 1 GiB / 376 GB/s = 22.846 ms + 30 us.
    hw = load_profile("h100-2x8")
    t = collective_time_s(hw, "all_reduce", GiB, 2, "inter", concurrent=8)
    assert t == pytest.approx(30e-6 + 8 * GiB / 376e9, rel=1e-9)
    assert t == pytest.approx(22.876e-3, rel=1e-3)
