"""The per-rank program of `osdp-sim compare`: several plans trained side by side in one process
group, their timed steps interleaved, so that what slows the machine for a while slows every plan
alike and their speed ratio is measured on paired steps.

Why: on a shared 2-core machine one step of a plan varies by 5-8% (a single process, no
communication, varies by 5%), and whole runs of one plan differ by 4-7% from each other. Separate
runs of two plans therefore differ by the run's luck as well as by the plans; steps taken in the
same rounds share it (docs/accuracy.md, "Decisions", the paired round).

The steps, in order (spec["entries"]: one {plan, impl, hf_config} per plan):

  build every plan's model and optimizer -> `warmup` steps of each plan -> `rounds` rounds, each
  one timed step of every plan (barrier before and after; torch.cuda.synchronize on GPU), round r
  in the order rotated by r (plan r mod n first), so no plan always follows the same one.

No memory is measured here (every plan's model is resident at once; `osdp-sim validate` measures a
plan's peak alone). Each rank writes RUN_DIR/rank{r}.json atomically after the warmup and after
every round, so a run stopped by its time limit keeps the rounds it finished.
"""

import os
import time
from pathlib import Path

from osdp_sim.runtime.worker import (apply_fault, build_trainable, init_group, parse_fault, progress, rank_device,
                                     rank_env, record_failure, train_step)


def round_order(n_plans: int, round_index: int) -> list[int]:
    """Plan indices in the order round `round_index` runs them."""
    first = round_index % n_plans
    return list(range(first, n_plans)) + list(range(first))


def compare_rank(spec: dict, rank: int, world: int, local_rank: int) -> dict:
    """Train and time every entry's plan on this rank, interleaved; write RUN_DIR/rank{r}.json;
    return the result ({"step_times_s": per plan, per round}). Leaves the process group
    initialised (the caller gathers results / tears down)."""
    import torch
    import torch.distributed as dist
    from osdp_sim.plan import plan_from_dict, write_json_atomic

    device_kind = spec["device"]
    threads = int(spec["threads_per_rank"])
    run_dir = spec.get("run_dir")
    entries = spec["entries"]
    torch.set_num_threads(threads)
    plans = [plan_from_dict(e["plan"], source=f"<run spec entries[{i}]>") for i, e in enumerate(entries)]
    result = {
        "rank": rank, "world_size": world, "pid": os.getpid(), "status": "running",
        "reached": {"phase": "setup", "step": 0}, "step_times_s": [[] for _ in plans],
        "losses": [[] for _ in plans], "error": None, "env": {},
    }

    def write():
        if run_dir:
            write_json_atomic(Path(run_dir) / f"rank{rank}.json", result)

    try:
        device = rank_device(device_kind, local_rank)
        init_group(spec, rank, world, device)
        result["env"] = rank_env(torch, device, spec["backend"], threads)
        progress(rank, f"started (pid {os.getpid()}, {threads} thread(s), {device}, {len(plans)} plans)")
        trainables = []
        for i, (entry, plan) in enumerate(zip(entries, plans)):
            trainables.append(build_trainable(dict(spec, impl=entry.get("impl", "osdp"),
                                                   hf_config=entry.get("hf_config")), plan, device, rank))
            progress(rank, f"built plan {i + 1}/{len(plans)}")
        fault = parse_fault(rank)
        barrier = (lambda: dist.barrier(device_ids=[local_rank])) if device_kind == "cuda" else dist.barrier
        sync = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
        step = 0

        result["reached"] = {"phase": "warmup", "step": 0}
        for i in range(int(spec["warmup"])):
            for j, (model, opt, tokens, loss_fn) in enumerate(trainables):
                apply_fault(fault, step, rank)
                result["losses"][j].append(float(train_step(model, opt, tokens, plans[j], loss_fn=loss_fn)))
                step += 1
            result["reached"] = {"phase": "warmup", "step": i + 1}
        write()
        progress(rank, f"warmup done ({spec['warmup']} steps of each plan)")

        rounds = int(spec["rounds"])
        result["reached"] = {"phase": "timed", "step": 0}
        for r in range(rounds):
            for j in round_order(len(plans), r):
                model, opt, tokens, loss_fn = trainables[j]
                apply_fault(fault, step, rank)
                barrier()
                sync()
                t0 = time.perf_counter()
                loss = train_step(model, opt, tokens, plans[j], loss_fn=loss_fn)
                sync()
                barrier()
                result["step_times_s"][j].append(time.perf_counter() - t0)
                result["losses"][j].append(float(loss))
                step += 1
            result["reached"] = {"phase": "timed", "step": r + 1}
            write()
            progress(rank, f"round {r + 1}/{rounds}")
        result["status"] = "ok"
    except Exception as e:                                   # noqa: BLE001 - every failure is recorded
        record_failure(result, e, rank)
    write()
    return result
