"""One process acting as rank 0 of an N-rank job (validate --fake-world N): torch's fake process
group (torch.testing._internal.distributed.fake_pg, as torchtitan's COMM_MODE=fake_backend uses
it) gives FSDP2 real shard shapes, gathered buffers and reduction buffers of their real sizes,
while every collective returns at once and moves nothing. So peak memory is the N-rank job's,
compute and host time are real, and communication is not measured at all.

The model is built on the meta device and only this rank's shards are materialised, so a model
too large for one device's memory unsharded (Llama-3-8B as one rank of 8) can be run."""

import torch
from torch import nn

from osdp_sim.errors import UserError


def init_fake_group(world: int) -> None:
    """torch.distributed initialised as rank 0 of `world` on the fake backend. The fake group is
    a private torch API (torch 2.13 has it; a later torch may move it): its absence is a one-line
    error, not a traceback."""
    import torch.distributed as dist
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise UserError(f"this torch ({torch.__version__}) has no fake process group "
                        f"(torch.testing._internal.distributed.fake_pg: {e}); run without --fake-world",
                        field="--fake-world") from None
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def materialise_local(model: nn.Module, device: torch.device, seed: int) -> None:
    """After apply_plan on a meta-device model: allocate this rank's shards on `device` and fill
    them (normal(0, 0.02) matrices, zero biases, unit norm weights; the values only need to be
    finite: the fake group's gathers return uninitialised memory anyway) and recompute buffers."""
    from torch.distributed.tensor import DTensor
    model.to_empty(device=device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            if local.dim() >= 2:
                local.copy_(torch.randn(local.shape, generator=gen) * 0.02)
            elif name.endswith("bias"):
                local.zero_()
            else:
                local.fill_(1.0)
    for m in model.modules():
        init = getattr(m, "init_buffers", None)
        if callable(init):
            init()
