"""Host-side costs of eager PyTorch on this machine (docs/cost-model.md, "Host"): one plain op, and
one torch.optim.AdamW op on FSDP2-sharded parameters (DTensors), on a 1-rank gloo group, 1 thread.

    python bench/host_costs.py            # ~10 s; prints us per op

The optimizer's ops are counted with a TorchDispatchMode (ops per parameter tensor, the
OPTIMIZER_OPS_PER_TENSOR of costmodel/lowering.py) and the step timed (best of 5).
"""

import os
import sys
import time


def main() -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from osdp_sim.runtime.op_count import OpCounter

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        x = torch.zeros(16)
        t = time.perf_counter()
        for _ in range(20000):
            x.add_(1.0)
        print(f"plain op (add_ on 16 elements): {(time.perf_counter() - t) / 20000 * 1e6:.2f} us", flush=True)
        for sharded in (False, True):
            m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(50)])
            if sharded:
                for layer in m:
                    fully_shard(layer)
                fully_shard(m)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
            for p in m.parameters():
                p.grad = torch.zeros_like(p)
            opt.step()
            with OpCounter() as c:
                opt.step()
            best = min(_timed(opt.step) for _ in range(5))
            n = len(list(m.parameters()))
            kind = "DTensor (FSDP2)" if sharded else "plain"
            print(f"AdamW on {n} {kind} tensors: {c.ops / n:.1f} ops per tensor, step {best * 1e3:.2f} ms, "
                  f"{best / c.ops * 1e6:.2f} us per op", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
