"""Collective and compute times against hand-computed numbers."""

import pytest

from hwfixtures import simple_hw
from osdp_sim.costmodel.rates import (bus_factor, collective_time_s, gemm_time_s, interp_log,
                                      bandwidth_time_s)
from osdp_sim.hardware.profile import CollectiveTable
from dataclasses import replace


def test_bus_factors():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("all_reduce", 1) == 0.0


def test_alpha_beta_times():
    hw = simple_hw(busbw_gbps=10.0, latency_s=20e-6, launch_s=5e-6)
    s = 1e9
    # ring all-reduce: 2(n-1)/n * S / B = 1.75 * 1e9 / 1e10 = 0.175 s, plus latency and launch
    assert collective_time_s(hw, "all_reduce", s, 8) == pytest.approx(0.175 + 25e-6)
    # all-gather: (n-1)/n * S / B = 0.0875 s
    assert collective_time_s(hw, "all_gather", s, 8) == pytest.approx(0.0875 + 25e-6)
    assert collective_time_s(hw, "all_gather", s, 1) == 0.0


def test_table_interpolates_in_log_size():
    hw = simple_hw(busbw_gbps=1.0)
    table = CollectiveTable("all_reduce", 8, "intra", (2**20, 2**30), (20e9, 200e9))
    hw = replace(hw, collectives=replace(hw.collectives, tables=(table,)))
    # geometric midpoint 2**25 -> halfway in log size -> busbw 110 GB/s
    t = collective_time_s(hw, "all_reduce", 2**25, 8)
    assert t == pytest.approx(1.75 * 2**25 / 110e9)
    # clamped beyond the table
    assert collective_time_s(hw, "all_reduce", 2**32, 8) == pytest.approx(1.75 * 2**32 / 200e9)
    # other group size uses the nearest table; the (n-1)/n factor is the request's
    assert collective_time_s(hw, "all_reduce", 2**30, 4) == pytest.approx(1.5 * 2**30 / 200e9)
    # all-gather has no table -> alpha-beta fallback with 1 GB/s
    assert collective_time_s(hw, "all_gather", 1e9, 8) == pytest.approx(0.875)


def test_gemm_and_bandwidth_time():
    hw = simple_hw(peak_tflops=100.0, eff=0.5, kernel_launch_s=1e-5, bw_gbps=1000.0)
    assert gemm_time_s(hw, 1e12, "bf16") == pytest.approx(1e12 / 50e12 + 1e-5)
    assert bandwidth_time_s(hw, 2e9, kernels=3) == pytest.approx(2e-3 + 3e-5)
    assert interp_log(((1, 0.1), (100, 0.9)), 10) == pytest.approx(0.5)
