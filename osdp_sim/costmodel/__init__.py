"""The analytical cost model: lowering a plan onto FSDP units, the two-stream step simulation,
and peak memory from liveness. docs/cost-model.md documents every term."""

from osdp_sim.costmodel.estimate import Estimate, estimate

__all__ = ["Estimate", "estimate"]
