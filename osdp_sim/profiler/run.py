"""One profiling run: launch the ranks (or join a torchrun launch), measure on every rank,
merge on rank 0.

`profile_ranks(config)` starts `nproc` local processes with an env:// rendezvous on 127.0.0.1
and returns the merged measurements; every child is killed if one fails or the run times out.
`measure_rank(config)` is what each rank runs; it is also usable directly under torchrun."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

WORKER_ENV = "OSDP_SIM_PROFILE_WORKER"


class ProfilingFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class ProfileConfig:
    device: str = "cpu"                        # cpu | cuda
    nproc: int = 2
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    quick: bool = False
    tiny: bool = False                         # smoke-test sizes; the numbers mean little
    max_message_bytes: int = 64 << 20
    timeout_s: float = 1800.0
    peak_tflops: dict = field(default_factory=dict)    # nominal peaks (dtype -> TFLOP/s), optional
    nominal_bandwidth_gbps: float | None = None


def config_to_json(cfg: ProfileConfig) -> str:
    return json.dumps(asdict(cfg))


def config_from_json(text: str) -> ProfileConfig:
    d = json.loads(text)
    d["dtypes"] = tuple(d["dtypes"])
    return ProfileConfig(**d)


def _repeats(cfg: ProfileConfig):
    from osdp_sim.profiler.timing import Repeats
    if cfg.tiny:
        return Repeats(warmup=1, samples=3, min_sample_s=5e-4, budget_s=0.03, max_samples=3)
    if cfg.quick:
        return Repeats(warmup=1, samples=5, min_sample_s=1e-3, budget_s=0.1, max_samples=5)
    return Repeats(warmup=2, samples=7, min_sample_s=2e-3, budget_s=0.3, max_samples=7)


def threads_per_rank(ranks_per_node: int) -> int:
    return max(1, (os.cpu_count() or 1) // ranks_per_node)


def measure_rank(cfg: ProfileConfig) -> dict | None:
    """Run every measurement on this rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment).
    Returns the merged measurements as a dict on rank 0, None elsewhere."""
    import torch
    import torch.distributed as dist

    from osdp_sim.profiler import bandwidth, block, collectives, device, gemm, launch, overlap
    from osdp_sim.profiler.measurements import merge_ranks
    from osdp_sim.profiler.timing import Progress

    start_s = time.perf_counter()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    threads = threads_per_rank(per_node)
    torch.set_num_threads(threads)
    dev = device.open_device(cfg.device, local_rank)
    init_kwargs = {"device_id": dev.torch_device} if dev.kind == "cuda" else {}
    dist.init_process_group(dev.backend, init_method="env://", rank=rank, world_size=world, **init_kwargs)
    progress = Progress(rank == 0)
    reps = _repeats(cfg)
    progress("start", 0, 1, f"{world} ranks x {threads} thread(s), {dev.backend}, device {dev.kind}")

    warm = torch.zeros(1, device=dev.torch_device)
    dist.all_reduce(warm)                     # the communicator exists before the baseline is read
    dev.sync()
    memory = device.memory_facts(dev, per_node)

    dist.barrier()
    kernel_launch = launch.measure_kernel_launch(dev, reps, progress)
    dist.barrier()
    bw = bandwidth.measure_bandwidth(dev, bandwidth.bandwidth_tensor_bytes(dev.kind, cfg.quick, cfg.tiny),
                                     reps, progress)
    gemm_points = []
    for dtype in cfg.dtypes:
        dist.barrier()
        gemm_points += gemm.measure_gemm(dev, dtype, gemm.gemm_shapes(dev.kind, cfg.quick, cfg.tiny),
                                         reps, progress)
    dist.barrier()
    block_dtype = "bf16" if dev.kind == "cuda" else "fp32"
    block_result = block.measure_block(dev, block_dtype, block.block_shape(dev.kind, cfg.quick, cfg.tiny),
                                       reps, progress)

    sizes = collectives.message_sizes(cfg.max_message_bytes, cfg.quick or cfg.tiny)
    coll_points = []
    for measured in collectives.measured_groups(world, per_node):
        dist.barrier()
        mine = None
        for ranks in measured.groups:         # every rank must call new_group for every group
            group = None if len(ranks) == world else dist.new_group(list(ranks))
            if rank in ranks:
                mine = group
        if any(rank in ranks for ranks in measured.groups):
            coll_points += collectives.sweep(dev, mine, measured.group_size, measured.scope, sizes, reps,
                                             progress)
    dist.barrier()
    coll_launch = collectives.measure_collective_launch(dev, None, world, reps)
    progress("collective launch", 1, 1, ", ".join(f"{op} {s * 1e6:.1f} us" for op, s in coll_launch.items()))

    dist.barrier()
    gemm_dim, gemm_dtype, message = overlap.overlap_setup(dev.kind, cfg.quick, cfg.max_message_bytes, cfg.tiny)
    overlap_result = overlap.measure_overlap(dev, None, world, gemm_dim, gemm_dtype, message, reps, progress)

    from osdp_sim.profiler.measurements import Measurements, to_dict
    mine = to_dict(Measurements(
        kind=dev.kind, device_name=device.device_name(dev.kind), world=world, per_node=per_node,
        threads_per_rank=threads, gemm=tuple(gemm_points), bandwidth=bw, kernel_launch=kernel_launch,
        block=block_result, collectives=tuple(coll_points), collective_launch_s=coll_launch,
        overlap=overlap_result, memory=memory, wall_s=time.perf_counter() - start_s))
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    return merge_ranks(gathered) if rank == 0 else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def profile_ranks(cfg: ProfileConfig, started_s: float | None = None) -> dict:
    """Start cfg.nproc local ranks, wait for rank 0's merged measurements, leave no process behind.
    Rank 0's progress goes to this process's stderr; the other ranks' stderr is shown on failure.
    SIGTERM is turned into KeyboardInterrupt meanwhile, so that the ranks are stopped and the
    temporary folder removed on it too (the default action would leave both behind).
    `started_s` (time.monotonic()): when the command began, so that cfg.timeout_s bounds it as a
    whole (default: from here)."""
    from osdp_sim.runtime.launch import _install_term_handler, _restore_term_handler
    prev_term = _install_term_handler()
    try:
        return _profile_ranks(cfg, time.monotonic() if started_s is None else started_s)
    finally:
        _restore_term_handler(prev_term)


def _profile_ranks(cfg: ProfileConfig, started_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="osdp-profile-") as tmp:
        tmp_path = Path(tmp)
        cfg_path, out_path = tmp_path / "config.json", tmp_path / "measurements.json"
        cfg_path.write_text(config_to_json(cfg))
        port, threads = _free_port(), threads_per_rank(cfg.nproc)
        procs, logs = [], []
        try:
            for r in range(cfg.nproc):
                env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(cfg.nproc), "LOCAL_RANK": str(r),
                       "LOCAL_WORLD_SIZE": str(cfg.nproc), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads), WORKER_ENV: "1"}
                log = tmp_path / f"rank{r}.err"
                logs.append(log)
                err = None if r == 0 else open(log, "w")
                procs.append(subprocess.Popen([sys.executable, "-m", "osdp_sim.profiler.run",
                                               str(cfg_path), str(out_path)],
                                              env=env, stdout=subprocess.DEVNULL, stderr=err))
                if err is not None:
                    err.close()
            _wait(procs, logs, out_path, cfg.timeout_s, started_s)
            return json.loads(out_path.read_text())
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()


def _wait(procs, logs, out_path: Path, timeout_s: float, started_s: float) -> None:
    deadline = started_s + timeout_s
    grace_end = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        if out_path.exists():
            # Results are written before teardown; a rank that hangs or aborts at exit after that
            # (a rare gloo teardown crash) costs nothing.
            grace_end = grace_end or min(time.monotonic() + 10, max(deadline, time.monotonic()))
            if time.monotonic() > grace_end or all(c is not None for c in codes):
                return
        else:
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r, c = failed[0]
                detail = _tail(logs[r]).strip() if r else "see the messages above"
                raise ProfilingFailed(f"rank {r} exited with code {c}: {detail}")
            if time.monotonic() > deadline:
                raise ProfilingFailed(f"timed out after {timeout_s:.0f} s; all ranks were stopped")
        time.sleep(0.1)


def finish_rank() -> None:
    """Wait for every rank (rank 0 writes its results first), then tear the group down."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()


def _worker_main(cfg_path: str, out_path: str) -> int:
    cfg = config_from_json(Path(cfg_path).read_text())
    result = measure_rank(cfg)
    if result is not None:
        tmp = Path(out_path + ".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out_path)
    finish_rank()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1], sys.argv[2]))
