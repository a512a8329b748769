"""The per-rank program of `osdp-sim validate`: build the model, apply the plan, train on
synthetic tokens, and measure step time, memory and losses.

Run by osdp_sim.runtime.launch (one process per rank: `python -m osdp_sim.runtime.worker --spec
RUN_DIR/spec.json --run-id ID`, rank from the RANK/WORLD_SIZE/LOCAL_RANK environment) or
in-process under torchrun. The steps, in order:

  warmup W steps -> one memory step (MemTracker: it slows a step 1.3-2.3x, so it is never timed)
  -> N timed steps (barrier before and after each; torch.cuda.synchronize on GPU).

A step is plan.grad_accum micro-steps of plan.micro_batch sequences, then the optimizer step.

Each rank writes RUN_DIR/rank{r}.json atomically before any teardown (a rare SIGABRT at process
exit must not lose the result). Exit codes: 0 ok, EXIT_OOM out of memory, 1 any other error.

Memory cap (`mem_cap_bytes`, for tests and for imitating a smaller device): on CPU, the run counts
as out of memory when the MemTracker peak of the memory step (live tensor bytes, the quantity the
cost model predicts) exceeds the cap on any rank; every rank then stops after the memory step. On
GPU the cap is enforced for real with torch.cuda.set_per_process_memory_fraction, so an allocation
beyond it raises torch.OutOfMemoryError. Real allocation failures (torch.OutOfMemoryError,
MemoryError, RuntimeError "out of memory"/"can't allocate") are recorded as "oom" in either case.

Test hook: OSDP_SIM_FAULT="kill:RANK:STEP" makes rank RANK SIGKILL itself at the start of training
step STEP (0-based over warmup, memory and timed steps); "hang:RANK:STEP" makes it sleep forever;
"error:RANK:STEP" raises an exception; "slow:RANK:STEP" makes it sleep SLOW_FAULT_S before every step
from STEP on (a run that keeps making progress, only slowly).
"""

import argparse
import contextlib
import faulthandler
import json
import os
import platform
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

EXIT_OOM = 3
PROGRESS = "osdp-sim rank"          # the launcher echoes stderr lines that start with this


def progress(rank: int, msg: str) -> None:
    print(f"{PROGRESS} {rank}: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- process setup

def die_with_parent() -> None:
    """Launched by our launcher: die when it dies, even by SIGKILL (Linux prctl PDEATHSIG)."""
    parent = os.environ.get("OSDP_SIM_LAUNCHER_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):            # the launcher died before prctl took effect
        os._exit(1)


def clear_rss_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_hwm_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def is_oom(exc: BaseException) -> bool:
    import torch
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate" in text
                                              or "cannot allocate" in text)


def parse_fault(rank: int):
    """OSDP_SIM_FAULT=action:rank:step -> (action, step) for this rank, else None."""
    raw = os.environ.get("OSDP_SIM_FAULT", "")
    if not raw:
        return None
    action, r, step = raw.split(":")
    return (action, int(step)) if int(r) == rank else None


SLOW_FAULT_S = 4.0


def apply_fault(fault, step: int, rank: int) -> None:
    if fault and fault[0] == "slow" and step >= fault[1]:
        progress(rank, f"test fault 'slow' at step {step}")
        time.sleep(SLOW_FAULT_S)
        return
    if not fault or fault[1] != step:
        return
    progress(rank, f"test fault {fault[0]!r} at step {step}")
    if fault[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault[0] == "hang":
        while True:
            time.sleep(3600)
    elif fault[0] == "error":
        raise RuntimeError(f"test fault: rank {rank} fails at step {step}")


# ---------------------------------------------------------------- training pieces

class Tokens:
    """Seeded synthetic tokens, different on every rank, the same sequence on every run."""

    def __init__(self, cfg, micro_batch: int, seed: int, rank: int, device):
        import torch
        self.g = torch.Generator().manual_seed(seed * 100_003 + rank)
        self.shape = (micro_batch, cfg.seq_len + 1)
        self.vocab = cfg.vocab_size
        self.device = device

    def next(self):
        import torch
        t = torch.randint(0, self.vocab, self.shape, generator=self.g).to(self.device)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


@contextlib.contextmanager
def gradient_sync(model, enabled: bool):
    """Skip gradient reduction for the micro-steps before the last one when the plan says
    reduce once per step (plan.reduce_every_microbatch False)."""
    if enabled:
        yield
        return
    from osdp_sim.runtime import parallelize
    setter = getattr(parallelize, "set_gradient_sync", None)
    if setter is not None:
        setter(model, False)
        try:
            yield
        finally:
            setter(model, True)
    elif hasattr(model, "set_requires_gradient_sync"):      # FSDP2 root
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync"):                          # FairScale / FSDP1 / DDP
        with model.no_sync():
            yield
    else:
        yield


def builtin_loss(model, idx, tgt):
    return model(idx, tgt)


def hf_loss(model, idx, tgt):
    """transformers computes the loss itself from labels (shifted inside for a causal LM), as
    osdp_sim/runtime/hf_measure.py measures it."""
    return model(input_ids=idx, labels=idx).loss


def train_step(model, opt, tokens: Tokens, plan, before_micro_step=None, loss_fn=builtin_loss):
    """One optimizer step of plan.grad_accum micro-steps; returns the mean loss (a tensor)."""
    total = None
    for m in range(plan.grad_accum):
        if before_micro_step is not None:
            before_micro_step()
        last = m == plan.grad_accum - 1
        with gradient_sync(model, plan.reduce_every_microbatch or last):
            idx, tgt = tokens.next()
            loss = loss_fn(model, idx, tgt)
            (loss / plan.grad_accum).backward()
        d = loss.detach().float()
        total = d if total is None else total + d
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total / plan.grad_accum


def measure_memory_step(model, opt, tokens, plan, device, loss_fn=builtin_loss) -> tuple[float, dict]:
    """One step under MemTracker; (loss, memory fields). Tracker failures are reported, not fatal."""
    from torch.distributed._tools.mem_tracker import MemTracker
    mem = {"tracker_peak_bytes": None, "tracker_breakdown": None, "tracker_error": None}
    try:
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            # MemTracker refuses a second forward of a module in one context unless its
            # per-module stats are cleared; the global peak survives the reset.
            loss = train_step(model, opt, tokens, plan, before_micro_step=tracker.reset_mod_stats,
                              loss_fn=loss_fn)
        snap = tracker.get_tracker_snapshot("peak")
        dev_snap = snap.get(device) or next((v for k, v in snap.items() if k.type == device.type), None)
        if dev_snap:
            mem["tracker_breakdown"] = {getattr(k, "value", str(k)): int(v) for k, v in dev_snap.items()}
            mem["tracker_peak_bytes"] = int(dev_snap.get("Total", 0))
        tracker.reset_mod_stats()
    except Exception as e:                                   # noqa: BLE001 - report and go on
        if is_oom(e):
            raise
        mem["tracker_error"] = f"{type(e).__name__}: {e}"
        opt.zero_grad(set_to_none=True)      # drop what the failed step accumulated
        loss = train_step(model, opt, tokens, plan, loss_fn=loss_fn)
    return float(loss), mem


# ---------------------------------------------------------------- one rank

def run_rank(spec: dict, rank: int, world: int, local_rank: int) -> dict:
    """Train and measure on this rank; write RUN_DIR/rank{r}.json; return the result.
    Leaves the process group initialised (the caller gathers results / tears down)."""
    import torch
    import torch.distributed as dist
    from osdp_sim.plan import plan_from_dict, write_json_atomic

    device_kind = spec["device"]
    backend = spec["backend"]
    threads = int(spec["threads_per_rank"])
    run_dir = spec.get("run_dir")
    torch.set_num_threads(threads)
    plan = plan_from_dict(spec["plan"], source="<run spec>")
    result = {
        "rank": rank, "world_size": world, "pid": os.getpid(), "status": "running",
        "reached": {"phase": "setup", "step": 0}, "step_times_s": [], "losses": [], "loss_phases": [],
        "memory": {}, "error": None, "env": {},
    }

    def write():
        if run_dir:
            write_json_atomic(Path(run_dir) / f"rank{rank}.json", result)

    try:
        device = rank_device(device_kind, local_rank)
        if device_kind == "cuda" and spec.get("mem_cap_bytes"):
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec["mem_cap_bytes"] / total), device)
        fake_world = int(spec.get("fake_world") or 0)
        if fake_world:
            from osdp_sim.runtime.fake_world import init_fake_group
            init_fake_group(fake_world)
            world = result["world_size"] = fake_world
        init_group(spec, rank, world, device)
        result["env"] = rank_env(torch, device, backend, threads)
        progress(rank, f"started (pid {os.getpid()}, {threads} thread(s), {device})")

        model, opt, tokens, loss_fn = build_trainable(spec, plan, device, rank)
        fault = parse_fault(rank)
        barrier = (lambda: dist.barrier(device_ids=[local_rank])) if device_kind == "cuda" else dist.barrier
        sync = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
        step = 0

        warmup, iters = int(spec["warmup"]), int(spec["iters"])
        result["reached"] = {"phase": "warmup", "step": 0}
        for i in range(warmup):
            apply_fault(fault, step, rank)
            result["losses"].append(float(train_step(model, opt, tokens, plan, loss_fn=loss_fn)))
            result["loss_phases"].append("warmup")
            step += 1
            result["reached"] = {"phase": "warmup", "step": i + 1}
        write()                       # partial results survive a rank that is killed later
        progress(rank, f"warmup done ({warmup} steps)")

        apply_fault(fault, step, rank)
        result["reached"] = {"phase": "memory", "step": 0}
        loss, mem = measure_memory_step(model, opt, tokens, plan, device, loss_fn=loss_fn)
        result["memory"].update(mem)
        result["losses"].append(loss)
        result["loss_phases"].append("memory")
        step += 1
        result["reached"] = {"phase": "memory", "step": 1}
        write()
        progress(rank, f"memory step done (tracked peak {mem['tracker_peak_bytes']} bytes)")

        if device_kind == "cpu" and spec.get("mem_cap_bytes"):
            mine = float(mem["tracker_peak_bytes"] or 0)
            if fake_world:             # one rank ran: a fake group's gather would return garbage
                everyone = [mine]
            else:
                gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
                dist.all_gather(gathered, torch.tensor([mine], dtype=torch.float64))
                everyone = [t.item() for t in gathered]
            over = [r for r, peak in enumerate(everyone) if peak > spec["mem_cap_bytes"]]
            if over:
                result["status"] = "oom"
                result["error"] = (f"tracked peak memory {int(everyone[over[0]])} bytes on rank "
                                   f"{over[0]} exceeds the cap of {spec['mem_cap_bytes']} bytes "
                                   f"(ranks over the cap: {over})")
                result["oom_ranks"] = over
                write()
                return result

        clear_rss_hwm()
        if device_kind == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        result["reached"] = {"phase": "timed", "step": 0}
        for i in range(iters):
            apply_fault(fault, step, rank)
            barrier()
            sync()
            t0 = time.perf_counter()
            loss = train_step(model, opt, tokens, plan, loss_fn=loss_fn)
            sync()
            barrier()
            t1 = time.perf_counter()
            result["step_times_s"].append(t1 - t0)
            result["losses"].append(float(loss))
            result["loss_phases"].append("timed")
            step += 1
            result["reached"] = {"phase": "timed", "step": i + 1}
            progress(rank, f"step {i + 1}/{iters} {t1 - t0:.4f} s")
        result["memory"]["rss_hwm_bytes"] = rss_hwm_bytes()
        if device_kind == "cuda":
            result["memory"]["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
            result["memory"]["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
        result["status"] = "ok"
    except Exception as e:                                   # noqa: BLE001 - every failure is recorded
        record_failure(result, e, rank)
    write()
    return result


def record_failure(result: dict, exc: BaseException, rank: int) -> None:
    """Put the exception a rank's run ended with into its result: status oom or error, the
    message, the traceback's tail (called inside the except block)."""
    result["status"] = "oom" if is_oom(exc) else "error"
    result["error"] = f"{type(exc).__name__}: {exc}"
    result["traceback"] = traceback.format_exc()[-4000:]
    if result["status"] == "oom":
        progress(rank, f"out of memory in {result['reached']['phase']} step: {exc}")
    else:
        traceback.print_exc()


def rank_device(device_kind: str, local_rank: int):
    """This rank's device (on CUDA, made the current one)."""
    import torch
    if device_kind != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def init_group(spec: dict, rank: int, world: int, device) -> None:
    """The default process group (NCCL on CUDA, gloo on CPU), unless one is up already (torchrun's
    caller, a fake group), with the run's time limit as its timeout."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(spec.get("timeout_s", 600))),
                            **({"device_id": device} if cuda else {}))


def run_spec(spec: dict, rank: int, world: int, local_rank: int) -> dict:
    """This rank's part of the spec: one plan's run (validate), or several plans interleaved
    (spec["mode"] "compare": runtime/compare.py)."""
    if spec.get("mode") == "compare":
        from osdp_sim.runtime.compare import compare_rank
        return compare_rank(spec, rank, world, local_rank)
    return run_rank(spec, rank, world, local_rank)


def build_trainable(spec: dict, plan, device, rank: int):
    """(model, optimizer, tokens, loss_fn) of `plan` as `spec` says to build it: transformers'
    model of spec["hf_config"] (impl "hf"), the runtime's own modules on the meta device with only
    this rank's shards materialised (fake_world), or the runtime's own modules."""
    import torch
    from osdp_sim.runtime.parallelize import make_optimizer
    seed = int(spec["seed"])
    loss_fn = builtin_loss
    if spec.get("impl", "osdp") == "hf":
        from osdp_sim.runtime.apply import apply_plan as apply_to_hf
        model = build_hf_model(spec["hf_config"], plan, seed=seed)
        model = apply_to_hf(model, plan, device=device, backend=spec["backend"]).model
        loss_fn = hf_loss
    elif spec.get("fake_world"):
        # only this rank's shards are ever allocated (runtime/fake_world.py)
        from osdp_sim.runtime.fake_world import materialise_local
        from osdp_sim.runtime.modules import build_model
        from osdp_sim.runtime.parallelize import apply_plan
        with torch.device("meta"):
            model = build_model(plan.model, seed=seed)
        model = apply_plan(model, plan, backend=spec["backend"], device=device)
        materialise_local(model, device, seed)
    else:
        from osdp_sim.runtime.modules import build_model
        from osdp_sim.runtime.parallelize import apply_plan
        model = build_model(plan.model, seed=seed)
        model = apply_plan(model, plan, backend=spec["backend"], device=device)
    return model, make_optimizer(model, plan), Tokens(plan.model, plan.micro_batch, seed, rank, device), loss_fn


def build_hf_model(config_path: str, plan, *, seed: int):
    """transformers' model of a config.json, random weights from `seed` (the same on every rank),
    fp32 master weights (the plan's precision is applied by apply_plan), sdpa attention, the
    default experts implementation."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    config = AutoConfig.from_pretrained(config_path)
    arch = (getattr(config, "architectures", None) or [""])[0]
    auto = AutoModelForMaskedLM if arch.endswith("ForMaskedLM") else AutoModelForCausalLM
    torch.manual_seed(seed)
    return auto.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def rank_env(torch, device, backend: str, threads: int) -> dict:
    if backend == "fairscale":
        try:
            import fairscale
            backend_version = fairscale.__version__
        except ImportError:
            backend_version = None
    else:
        backend_version = torch.__version__
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"torch": torch.__version__, "backend": backend, "backend_version": backend_version,
            "device_kind": device.type, "device_name": name, "threads_per_rank": threads,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "hostname": socket.gethostname(), "python": platform.python_version()}


def teardown() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="One rank of `osdp-sim validate` (started by the launcher).")
    p.add_argument("--spec", required=True, help="run spec JSON written by the launcher")
    p.add_argument("--run-id", required=True, help="names the run (and lets a test find its processes)")
    args = p.parse_args(argv)
    die_with_parent()
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # the launcher asks for stacks on timeout
    spec = json.loads(Path(args.spec).read_text())
    if spec.get("backend") == "fairscale" and spec.get("device") == "cpu":
        os.environ.setdefault("ENABLE_NCCL_BASE_COLLECTIVES", "0")   # before fairscale is imported
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = run_spec(spec, rank, world, int(os.environ.get("LOCAL_RANK", rank)))
    sys.stderr.flush()
    if result["status"] != "ok":
        # Other ranks may be blocked in a collective: leave without the process-group teardown.
        os._exit(EXIT_OOM if result["status"] == "oom" else 1)
    teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
