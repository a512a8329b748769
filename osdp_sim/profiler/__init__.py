"""Measure the machine and produce a hardware profile (`osdp-sim profile-hw`).

One measurement concern per module: gemm, bandwidth, launch (kernel launch overhead), block
(forward/backward of a transformer block), collectives, overlap, device (memory, names);
timing holds the repeat/median/spread helper, measurements the per-run record and the merge
over ranks, assemble the mapping onto HardwareProfile, run the rank launcher. Importing this
package does not import torch.
"""
