"""Run a plan on a torch module osdp-sim did not write, given by a Python factory, on several
gloo ranks, and measure its peak memory the way the worker does (worker.measure_memory_step,
MemTracker's live tensor bytes): the runtime side of a described model (docs/runtime.md,
"Running a described module").

A factory is "package.module:function" returning a Runnable: the model (the same on every rank:
torch is seeded before the call), its layout and batch(micro_batch, generator) -> the forward's
arguments, model(*batch) being the loss. run_factory_plans spawns the ranks (equivalence.run_spawned).
"""

import importlib
import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from osdp_sim.errors import UserError
from osdp_sim.model.layout import ModelLayout
from osdp_sim.plan import Plan, plan_from_dict, plan_to_dict


@dataclass
class Runnable:
    model: nn.Module
    layout: ModelLayout
    batch: Callable[[int, torch.Generator], tuple]
    """(micro_batch, generator) -> the forward's positional arguments; model(*args) is the loss."""


def load_factory(spec: str) -> Callable[[], Runnable]:
    module, sep, func = spec.partition(":")
    if not sep or not module or not func:
        raise UserError(f"expected package.module:function, got {spec!r}", field="factory")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise UserError(f"cannot load {spec!r} ({e})", field="factory") from None


class _Batches:
    """worker.train_step's input source: next() -> the forward's arguments."""

    def __init__(self, runnable: Runnable, micro_batch: int, seed: int, rank: int):
        self.g = torch.Generator().manual_seed(seed * 100_003 + rank)
        self.runnable, self.micro_batch = runnable, micro_batch

    def next(self):
        return self.runnable.batch(self.micro_batch, self.g)


def _measure(factory: str, plan: Plan, warmup: int, seed: int, rank: int) -> dict:
    from osdp_sim.runtime.apply import apply_plan
    from osdp_sim.runtime.parallelize import make_optimizer
    from osdp_sim.runtime.worker import measure_memory_step, train_step

    torch.manual_seed(seed)
    run = load_factory(factory)()
    device = torch.device("cpu")
    model = apply_plan(run.model, plan, device=device, layout=run.layout).model
    opt = make_optimizer(model, plan)
    batches = _Batches(run, plan.micro_batch, seed, rank)
    losses = [float(train_step(model, opt, batches, plan)) for _ in range(warmup)]
    loss, mem = measure_memory_step(model, opt, batches, plan, device)
    return {"losses": losses + [loss], **mem}


def run_factory(rank: int, world: int, port: int, cases: list, steps: int, out_path: str,
                fault: str = "") -> None:
    """Spawn target (equivalence.run_spawned): cases are {"name", "factory", "plan" (a plan
    dict)}; `steps` warmup steps, then one memory step. Rank 0 writes {name: {"per_rank": [each
    rank's losses and MemTracker fields]} or {"error"}} to out_path."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    results = {}
    for case in cases:
        start = time.perf_counter()
        try:
            mine = _measure(case["factory"], plan_from_dict(case["plan"], source=case["name"]),
                            steps, int(case.get("seed", 0)), rank)
        except Exception as exc:   # reported per case; the other cases still run
            mine = {"error": f"{type(exc).__name__}: {exc}"}
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        results[case["name"]] = {"per_rank": everyone, "seconds": time.perf_counter() - start}
    if rank == 0:
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
    dist.barrier()
    dist.destroy_process_group()


def run_factory_plans(factory: str, plans: dict[str, Plan], out_path: str, *, warmup: int = 1,
                      world: int = 2, seed: int = 0) -> dict:
    """Every plan of `plans` (name -> Plan, each for `world` devices) run on `world` gloo ranks;
    {name: {"per_rank": [...]}} as run_factory writes it."""
    from osdp_sim.runtime.equivalence import run_spawned
    cases = [{"name": n, "factory": factory, "plan": plan_to_dict(p), "seed": seed} for n, p in plans.items()]
    return run_spawned(cases, world=world, steps=warmup, out_path=out_path, target=run_factory)
