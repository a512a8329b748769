"""Model-state bytes per parameter, per strategy, optimizer and precision (hand-computed)."""

import pytest

from osdp_sim.costmodel.states import compute_bytes, reduce_bytes, state_bytes


@pytest.mark.parametrize("strategy,optimizer,n,per_param", [
    ("ddp", "adamw", 8, 4 + 4 + 8),          # replicated: fp32 param + fp32 grad + Adam m, v
    ("zero2", "adamw", 8, (4 + 4 + 8) / 8),  # FSDP2 SHARD_GRAD_OP keeps params sharded between steps
    ("zero3", "adamw", 8, (4 + 4 + 8) / 8),
    ("zero3", "adamw", 64, 16 / 64),
    ("ddp", "sgd", 4, 4 + 4 + 4),            # SGD momentum: one fp32 buffer
    ("zero3", "sgd", 4, 12 / 4),
])
def test_bytes_per_param(strategy, optimizer, n, per_param):
    s = state_bytes(1000.0, strategy, n, optimizer)
    assert s.total == pytest.approx(1000.0 * per_param)


def test_zero_paper_worked_example():
    # ZeRO (Rajbhandari et al. 2020): 7.5B params, 64 GPUs, 16 B/param: DP 120 GB, ZeRO-3 1.9 GB.
    p = 7.5e9
    assert state_bytes(p, "ddp", 64, "adamw").total == pytest.approx(120e9)
    assert state_bytes(p, "zero3", 64, "adamw").total == pytest.approx(1.875e9)


def test_precision_changes_transient_not_resident_bytes():
    assert compute_bytes("bf16") == 2 and compute_bytes("fp32") == 4
    assert reduce_bytes("bf16") == 4 == reduce_bytes("fp32")    # FSDP2 reduce_dtype=fp32
