from osdp_sim.hardware.profile import (COLLECTIVE_OPS, DTYPES, CollectiveSpec, CollectiveTable,
                                       ComputeSpec, DeviceSpec, HardwareProfile, LinkSpec, MemorySpec)

__all__ = ["COLLECTIVE_OPS", "DTYPES", "CollectiveSpec", "CollectiveTable", "ComputeSpec",
           "DeviceSpec", "HardwareProfile", "LinkSpec", "MemorySpec"]
