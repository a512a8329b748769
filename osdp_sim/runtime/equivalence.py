"""Loss equivalence: train under many plans in one multi-process run and compare with plain
single-process training on the global batch.

Each rank trains on its slice of one fixed synthetic global batch (the same batch every step, so
a working run's loss falls); the loss of a step is the mean of the ranks' losses, which is the
reference model's loss on the whole batch. `run_cases` is the spawn target (it must be importable
by the child processes); rank 0 writes the losses to a JSON file before the process group is torn
down.

A rank died by SIGABRT once in CI (rank 2 of 4 on 2 cores; its stderr was not kept, and 14 runs
here, some under load, did not repeat it). The likely cause: gloo's TCP transport aborts a
process outright (std::terminate from its I/O thread) when a connection fails. Such a death says
nothing about the plans under test, so `run_spawned` keeps results that rank 0 wrote before a
rank died by a signal, and otherwise starts the whole run once more on a fresh port. A rank that
raises a Python exception is never retried: that is a failure of the code under test.
"""

import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from osdp_sim.model.config import ModelConfig
from osdp_sim.plan.plan import Plan
from osdp_sim.runtime.modules import build_model
from osdp_sim.runtime.parallelize import DEFAULT_LR, apply_plan, describe_sharding, make_optimizer

DATA_SEED = 1234


@dataclass(frozen=True)
class Case:
    """One training run: a plan on a backend. `broken` applies the plan wrongly on purpose
    (negative controls): 'size1_mesh' shards every unit over a size-1 mesh per rank, so no
    gradient is ever synchronised; 'no_root' wraps the groups but not the root, so embedding and
    head never synchronise."""

    name: str
    plan: Plan
    backend: str = "fsdp2"
    lr: float = DEFAULT_LR
    broken: str = ""
    extra: dict = field(default_factory=dict, compare=False)


def global_batch(cfg: ModelConfig, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(DATA_SEED)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen)
    return idx, targets


def reference_losses(plan: Plan, steps: int, lr: float = DEFAULT_LR) -> list[float]:
    """Plain single-process fp32 training of the same model on the whole global batch."""
    model = build_model(plan.model, seed=0)
    opt = make_optimizer(model, plan, lr=lr)
    idx, targets = global_batch(plan.model, plan.micro_batch * plan.devices)
    losses = []
    for _ in range(steps):
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _apply_broken(model, how: str, device: torch.device):
    from torch.distributed.fsdp import fully_shard

    from osdp_sim.runtime.parallelize import _mesh

    world = dist.get_world_size()
    if how == "size1_mesh":
        mesh = _mesh(device.type, (world, 1))["shard"]   # each rank alone in its shard group
        units, root_mesh = [b.attn for b in model.blocks] + [b.mlp for b in model.blocks], mesh
    elif how == "no_root":
        mesh = _mesh(device.type, (world,))
        units, root_mesh = [b.attn for b in model.blocks] + [b.mlp for b in model.blocks], None
    else:
        raise ValueError(f"unknown broken mode {how!r}")
    for unit in units:
        fully_shard(unit, mesh=mesh)
    if root_mesh is not None:
        fully_shard(model, mesh=root_mesh)
    return model


def _train(case: Case, steps: int, rank: int, world: int, device: torch.device) -> dict:
    plan = case.plan
    model = build_model(plan.model, seed=0)
    if case.broken:
        model = _apply_broken(model, case.broken, device)
    else:
        model = apply_plan(model, plan, backend=case.backend, device=device)
    opt = make_optimizer(model, plan, lr=case.lr)
    idx, targets = global_batch(plan.model, plan.micro_batch * world)
    mine = slice(rank * plan.micro_batch, (rank + 1) * plan.micro_batch)
    idx, targets = idx[mine].to(device), targets[mine].to(device)
    losses = []
    for _ in range(steps):
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    layout = describe_sharding(model) if case.backend == "fsdp2" else {}
    return {"losses": losses, **layout}


def run_cases(rank: int, world: int, port: int, cases: list[Case], steps: int, out_path: str,
              fault: str = "") -> None:
    """Spawn target: train every case in turn; rank 0 writes {name: {losses, layout} or {error}}
    to out_path. fault (tests of run_spawned): 'abort_at_start:R' or 'abort_at_exit:R' makes rank
    R abort (SIGABRT) right after joining the group, or after the results are written."""
    os.environ.setdefault("ENABLE_NCCL_BASE_COLLECTIVES", "0")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    _maybe_fault(fault, "abort_at_start", rank)
    device = torch.device("cpu")
    results = {}
    for case in cases:
        start = time.perf_counter()
        try:
            results[case.name] = _train(case, steps, rank, world, device)
        except Exception as exc:   # reported per case; the other cases still run
            results[case.name] = {"error": f"{type(exc).__name__}: {exc}"}
            dist.barrier()
        results[case.name]["seconds"] = time.perf_counter() - start
        if rank == 0:
            print(f"[equivalence] {case.name}: {results[case.name]}", file=sys.stderr, flush=True)
    if rank == 0:
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
    dist.barrier()
    _maybe_fault(fault, "abort_at_exit", rank)
    dist.destroy_process_group()


def _maybe_fault(fault: str, where: str, rank: int) -> None:
    if fault and fault.split(":")[0] == where and int(fault.split(":")[1]) == rank:
        sys.stderr.flush()
        os.abort()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What torch's spawn sends to the other ranks when one fails: not a cause of the failure.
_CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGKILL)


def run_spawned(cases: list, world: int, steps: int, out_path: str, *, attempts: int = 2,
                faults: tuple[str, ...] = (), target=None) -> dict:
    """Run `cases` on `world` gloo processes; returns rank 0's results. A rank killed by a signal
    (see the module docstring) costs one more attempt, up to `attempts`, unless rank 0 had already
    written the results. faults[i]: the fault injected into attempt i (tests only)."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    for attempt in range(1, attempts + 1):
        if os.path.exists(out_path):
            os.remove(out_path)
        fault = faults[attempt - 1] if attempt <= len(faults) else ""
        ctx = mp.start_processes(target or run_cases, args=(world, free_port(), cases, steps, out_path, fault),
                                 nprocs=world, join=False, start_method="spawn")
        try:
            while not ctx.join():
                pass
            break
        except ProcessException:
            killed = _signal_deaths(ctx.processes)       # a failed join has ended every rank
            if not killed:
                raise
            written = os.path.exists(out_path)
            print(f"[equivalence] attempt {attempt}/{attempts}: "
                  + ", ".join(f"rank {r} died by {name}" for r, name in killed)
                  + (" after the results were written; keeping them" if written
                     else " before the results were written"), file=sys.stderr, flush=True)
            if written:
                break
            if attempt == attempts:
                raise
        finally:                                  # e.g. Ctrl-C while joining: no rank outlives us
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
    with open(out_path) as f:
        return json.load(f)


def _signal_deaths(processes) -> list[tuple[int, str]]:
    """(rank, signal name) of the ranks a signal killed, other than spawn's own cleanup."""
    return [(rank, signal.Signals(-p.exitcode).name) for rank, p in enumerate(processes)
            if p.exitcode is not None and p.exitcode < 0 and -p.exitcode not in _CLEANUP_SIGNALS]
