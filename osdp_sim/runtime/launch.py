"""Start the ranks of a validation run, watch them, and make sure none is left behind.

`launch()` starts N `python -m osdp_sim.runtime.worker` processes, each in its own session (so a
whole process group, grandchildren included, can be killed), with an env:// rendezvous on
127.0.0.1 and a free port. It polls them: a rank that exits without an "ok" result, or a run past
its timeout, ends the run; every rank then gets SIGTERM and, after a grace period, SIGKILL to its
process group. Ctrl-C / SIGTERM on the launcher and interpreter exit (atexit) do the same, and
each worker asks the kernel to kill it when the launcher dies (PR_SET_PDEATHSIG).

Under torchrun (RANK and WORLD_SIZE already set) `run_in_process()` runs the worker in this
process instead and gathers the per-rank results on rank 0.
"""

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from osdp_sim.plan import write_json_atomic
from osdp_sim.runtime.worker import EXIT_OOM, PROGRESS

DEFAULT_TIMEOUT_S = 300.0
GRACE_S = 5.0
SETTLE_S = 0.5
# Errors a rank reports when a peer died: the peer, not this rank, is the cause.
_PEER_ERROR = re.compile(r"connection reset|connection closed|broken pipe|gloo|nccl|socket|timed out|"
                         r"peer|remote", re.IGNORECASE)
TAIL_LINES = 40

_LIVE: dict[int, subprocess.Popen] = {}       # pid -> process, for the atexit / signal cleanup


@dataclass
class RunOutcome:
    status: str                                # ok | oom | failed | timeout
    run_id: str
    run_dir: str
    rank_results: list                         # per rank: the worker's result dict, or None
    failure: dict | None
    env: dict
    pids: list[int] = field(default_factory=list)
    wall_s: float = 0.0


def is_peer_error(text: str) -> bool:
    """The error a rank reports because another rank died (the other rank is the cause)."""
    return bool(_PEER_ERROR.search(text or ""))


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_env(rank_env: dict, *, world: int, threads: int, ranks_per_node: int) -> dict:
    """The record's `env` block: what rank 0 saw plus how the run was laid out."""
    env = _env_defaults(rank_env.get("device_kind", "cpu"), rank_env.get("backend", "fsdp2"))
    env.update({k: v for k, v in rank_env.items() if v is not None or k not in env})
    env["load_avg_1m"] = _load_avg()
    env["world_size"] = world
    env["threads_per_rank"] = threads
    env.setdefault("cores", available_cores())
    env["oversubscribed"] = ranks_per_node * threads > env["cores"] if env.get("device_kind") == "cpu" \
        else False
    return env


def _load_avg() -> float | None:
    """Other work on the machine inflates CPU step times: the record keeps the 1-minute load."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def check_gpus(ranks_here: int, what: str, cpu_fix: str = "--device cpu", **where) -> None:
    """NCCL needs one GPU per rank on this machine: a UserError (naming `what` asked for CUDA, and
    `cpu_fix`, how to run on CPUs instead) before any rank starts, not a rank failing in torch."""
    import torch

    from osdp_sim.errors import UserError
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have == 0:
        raise UserError(f"{what}, but this torch sees no GPU; run on a machine with a CUDA build of "
                        f"torch, or on CPUs with gloo ({cpu_fix})", **where)
    if ranks_here > have:
        raise UserError(f"{what}: {ranks_here} ranks on this machine need {ranks_here} GPUs (one per NCCL "
                        f"rank), torch sees {have}; use a plan for {have} devices, or {cpu_fix}", **where)


# Resident memory of one idle rank: `python -c "import torch, torch.distributed"` peaks at 218 MiB
# (torch 2.13 CPU, ru_maxrss), before any model.
RANK_BASE_RSS_BYTES = 218 * 2**20


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_cpu_ranks(nproc: int, **where) -> None:
    """CPU ranks are processes on this machine: a count whose bare torch processes alone exceed
    its memory would exhaust it before the first step; a UserError before any is started."""
    from osdp_sim.errors import UserError
    ram = physical_memory_bytes()
    if ram and nproc * RANK_BASE_RSS_BYTES > ram:
        most = ram // RANK_BASE_RSS_BYTES
        raise UserError(f"{nproc} CPU ranks need at least {nproc * RANK_BASE_RSS_BYTES / 2**30:.1f} GiB "
                        f"(about {RANK_BASE_RSS_BYTES >> 20} MiB each for torch alone), this machine has "
                        f"{ram / 2**30:.1f} GiB; at most {most} ranks", **where)


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, total) core-seconds the CPUs this process may run on (its affinity) have run since
    boot (Linux /proc/stat; iowait counts as idle); None elsewhere."""
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/stat") as f:
            rows = [line.split() for line in f if line.startswith("cpu")]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    per_cpu = [r for r in rows[1:] if mine is None or int(r[0][3:]) in mine]
    busy = total = 0
    for r in per_cpu or rows[:1]:
        vals = [int(x) for x in r[1:9]]
        busy += sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)
        total += sum(vals)
    return busy / hz, total / hz


@dataclass(frozen=True)
class CpuAccount:
    wall_s: float
    busy_s: float          # core-seconds the CPUs we may run on were busy, all processes
    ours_s: float          # CPU seconds of this process and its reaped children (and theirs)
    cores: int             # how many CPUs busy_s covers


def cpu_account() -> CpuAccount | None:
    import resource
    machine = machine_cpu_s()
    if machine is None:
        return None
    ours = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        ours += r.ru_utime + r.ru_stime
    return CpuAccount(time.monotonic(), machine[0], ours, available_cores())


def other_cpu_fraction(before: CpuAccount | None, after: CpuAccount | None) -> float | None:
    """Share of the CPUs we may run on that *other* work kept busy between two accounts (CPU step
    times are only honest near 0): their busy time minus ours (this process, e.g. a campaign's
    priority thread, and our reaped children, e.g. the ranks), over wall time x those CPUs. The
    record's env.other_cpu_fraction and a campaign's foreign_cpu_fraction are both this."""
    if before is None or after is None or after.wall_s <= before.wall_s:
        return None
    other_s = (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)
    return round(max(0.0, other_s) / (after.cores * (after.wall_s - before.wall_s)), 4)


def _env_defaults(device_kind: str, backend: str) -> dict:
    """What the launcher can tell without torch (used when no rank got far enough to say)."""
    import platform
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    torch_version = version("torch")
    return {"torch": torch_version, "backend": backend,
            "backend_version": version("fairscale") if backend == "fairscale" else torch_version,
            "device_kind": device_kind, "device_name": "unknown", "cores": available_cores(),
            "hostname": socket.gethostname(), "python": platform.python_version()}


# ---------------------------------------------------------------- launching

class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during launch(): every rank is gone; the message says where the run's
    folder (rank logs, partial results) was left."""


def launch(spec: dict, nproc: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, grace_s: float = GRACE_S,
           run_dir: str | None = None, echo="stderr", extra_env: dict | None = None,
           started_s: float | None = None) -> RunOutcome:
    """Run `spec` (see worker.run_rank) on `nproc` local ranks; always returns an outcome, with
    every rank process (and its children) gone, or raises RunInterrupted on Ctrl-C / SIGTERM.
    `started_s` (time.monotonic()): when the command began, if the timeout covers work before the
    launch too (the default: from here). `echo`: where rank progress goes ("stderr": sys.stderr
    as it is at the call, not at import; None: nowhere)."""
    echo = sys.stderr if echo == "stderr" else echo
    run_id = spec.get("run_id") or new_run_id()
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix=f"osdp-sim-run-{run_id}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, run_id=run_id, run_dir=str(run_dir), timeout_s=timeout_s)
    spec_path = run_dir / "spec.json"
    write_json_atomic(spec_path, spec)
    threads = int(spec["threads_per_rank"])
    base_env = dict(os.environ)
    base_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                     "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                     "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                     "OSDP_SIM_LAUNCHER_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"})
    if Path("/sys/class/net/lo").exists():
        base_env.setdefault("GLOO_SOCKET_IFNAME", "lo")   # single host: keep gloo on loopback
    base_env.update(extra_env or {})
    for key in ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK"):
        base_env.pop(key, None)

    load_before = _load_avg()
    cpu_before = cpu_account()
    procs: list[subprocess.Popen] = []
    logs = []
    t_start = time.monotonic()
    prev_term = _install_term_handler()
    try:
        for r in range(nproc):
            env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r))
            log = open(run_dir / f"rank{r}.log", "wb")
            logs.append(log)
            cmd = [sys.executable, "-m", "osdp_sim.runtime.worker", "--spec", str(spec_path),
                   "--run-id", run_id]
            p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            procs.append(p)
            _LIVE[p.pid] = p
        status, failure = _monitor(procs, run_dir, timeout_s, echo,
                                   t_start if started_s is None else started_s)
    except KeyboardInterrupt as e:
        raise RunInterrupted(f"{str(e) or 'Ctrl-C'}; every rank was stopped; rank logs kept in {run_dir}") from None
    finally:
        _terminate(procs, grace_s)
        for log in logs:
            log.close()
        _restore_term_handler(prev_term)
    results = [_read_result(run_dir, r) for r in range(nproc)]
    if status == "ok" and any(res is None or res.get("status") != "ok" for res in results):
        status, failure = "failed", {"rank": None, "reason": "a rank reported no result",
                                     "exit_code": None, "stderr_tail": ""}
    rank_env = next((res["env"] for res in results if res and res.get("env")), {})
    env = run_env(rank_env or {"device_kind": spec["device"], "backend": spec["backend"]},
                  world=nproc, threads=threads, ranks_per_node=nproc)
    env["load_avg_1m_before"] = load_before
    env["other_cpu_fraction"] = other_cpu_fraction(cpu_before, cpu_account())
    return RunOutcome(status=status, run_id=run_id, run_dir=str(run_dir), rank_results=results,
                      failure=failure, env=env, pids=[p.pid for p in procs],
                      wall_s=time.monotonic() - t_start)


def _monitor(procs, run_dir: Path, timeout_s: float, echo, t_start: float) -> tuple[str, dict | None]:
    offsets = [0] * len(procs)
    done_ok = set()
    all_ok_at = None
    pace = [Pace(time.monotonic()) for _ in procs]
    while True:
        _pump(procs, run_dir, offsets, echo, pace)
        failed = _newly_failed(procs, run_dir, done_ok)
        if failed:
            # When one rank dies its peers fail too ("connection reset"); let them exit, then
            # blame the rank that failed on its own.
            time.sleep(SETTLE_S)
            failed = _newly_failed(procs, run_dir, done_ok)
            _pump(procs, run_dir, offsets, echo, pace)
            return _blame(failed, run_dir, pace)
        if len(done_ok) == len(procs):
            return "ok", None
        now = time.monotonic()
        if all(_result_ok(run_dir, r) for r in range(len(procs))):
            all_ok_at = all_ok_at or now
            if now - all_ok_at > GRACE_S:     # results are in; a rank stuck in teardown is killed
                return "ok", None
        if now - t_start > timeout_s:
            return "timeout", _timeout_failure(procs, run_dir, timeout_s, offsets, echo, pace)
        time.sleep(0.1)


def _newly_failed(procs, run_dir: Path, done_ok: set) -> list[tuple[int, int, dict | None]]:
    """Ranks that exited without an "ok" result: (rank, exit code, result or None)."""
    out = []
    for r, p in enumerate(procs):
        rc = p.poll()
        if rc is None or r in done_ok:
            continue
        _LIVE.pop(p.pid, None)
        res = _read_result(run_dir, r)
        if res and res.get("status") == "ok":
            done_ok.add(r)           # an exit-time crash after the result was written is tolerated
        else:
            out.append((r, rc, res))
    return out


def _blame(failed, run_dir: Path, pace) -> tuple[str, dict]:
    def rank_of_cause(item):
        r, rc, res = item
        err = (res or {}).get("error") or ""
        if res and res.get("status") == "oom":
            return 0
        if not err:                  # killed by a signal or exited without a word
            return 1
        return 3 if is_peer_error(err) else 2
    r, rc, res = min(failed, key=rank_of_cause)
    if res and res.get("status") == "oom":
        return "oom", _failure(r, res.get("error") or "out of memory", rc, run_dir)
    reason = (res or {}).get("error") or _exit_reason(rc)
    if res and res.get("status") == "error" and res.get("reached"):
        reason += f" (in {res['reached']['phase']} after {res['reached']['step']} steps)"
    elif pace[r].message:
        reason += f" (last progress: {pace[r].message})"
    return "failed", _failure(r, f"rank {r}: {reason}", rc, run_dir)


def _timeout_failure(procs, run_dir, timeout_s, offsets, echo, pace) -> dict:
    """Ask every live rank for its Python stacks (faulthandler on SIGUSR1) and name the ranks that
    are not waiting inside torch.distributed: those are the ones the others wait for; unless every
    rank was still making progress at its usual pace, which is a run slower than the timeout."""
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    time.sleep(1.0)
    _pump(procs, run_dir, offsets, echo, pace)
    now = time.monotonic()
    live = [r for r, p in enumerate(procs) if p.poll() is None]
    stalled = [r for r in live if stalled_for(now - pace[r].last_s, pace[r].largest_gap_s)]
    suspects = []
    for r, p in enumerate(procs):
        stack = _main_stack(_log_text(run_dir, r))
        if p.poll() is None and stack is not None and "torch/distributed" not in stack:
            suspects.append(r)
    rank = suspects[0] if len(suspects) == 1 else None
    where = "; ".join(f"rank {r}: " + (f"{pace[r].message} ({now - pace[r].last_s:.0f} s ago)" if pace[r].seen
                                        else "no progress") for r in range(len(procs)))
    if live and not stalled:
        who = ("every rank was still making progress at its usual pace: the run is slower than the "
               "timeout allows (raise --timeout)")
        rank = None                               # nobody to blame
    else:
        who = (f"rank {rank} is stuck outside any collective" if rank is not None else
               f"ranks {suspects} are outside collectives" if suspects else
               "every rank is waiting in a collective")
    return _failure(rank, f"timeout after {timeout_s:g} s: {who} ({where})", None, run_dir,
                    tail_rank=rank if rank is not None else 0)


STALL_MIN_S = 5.0


@dataclass
class Pace:
    """A rank's progress lines so far: the last one and when it came, the largest gap between two
    of them (the start-up before the first is not a gap)."""

    last_s: float
    largest_gap_s: float = 0.0
    message: str | None = None

    @property
    def seen(self) -> bool:
        return self.message is not None

    def line(self, now: float, message: str) -> None:
        if self.seen:
            self.largest_gap_s = max(self.largest_gap_s, now - self.last_s)
        self.last_s, self.message = now, message


def stalled_for(since_last_s: float, largest_gap_s: float) -> bool:
    """A rank is stalled when its last progress line is older than three times the largest gap
    between its progress lines so far (and at least STALL_MIN_S): a step that takes long every
    time is slow, one that never ends is stuck."""
    return since_last_s > max(STALL_MIN_S, 3.0 * largest_gap_s)


def _main_stack(text: str) -> str | None:
    """The last faulthandler dump's 'Current thread' block (the main thread at the signal)."""
    i = text.rfind("Current thread")
    if i < 0:
        return None
    block = text[i:].split("\n\n", 1)[0]
    return block


def _failure(rank, reason, rc, run_dir: Path, tail_rank=None) -> dict:
    r = rank if tail_rank is None else tail_rank
    tail = "\n".join(_log_text(run_dir, r).splitlines()[-TAIL_LINES:]) if r is not None else ""
    return {"rank": rank, "reason": reason, "exit_code": rc, "stderr_tail": tail}


def _exit_reason(rc) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc == EXIT_OOM:
        return "out of memory"
    return f"exited with code {rc} without a result"


def _pump(procs, run_dir: Path, offsets, echo, pace) -> None:
    """Echo new progress lines (all of rank 0's, the start and failure lines of the others) and
    note them in pace[r] (Pace)."""
    for r in range(len(procs)):
        path = run_dir / f"rank{r}.log"
        try:
            with open(path, "rb") as f:
                f.seek(offsets[r])
                chunk = f.read()
        except OSError:
            continue
        end = chunk.rfind(b"\n")
        if end < 0:
            continue
        offsets[r] += end + 1
        for line in chunk[:end].decode(errors="replace").splitlines():
            if not line.startswith(PROGRESS):
                continue
            msg = line.split(":", 1)[1].strip() if ":" in line else line
            pace[r].line(time.monotonic(), msg)
            if echo and (r == 0 or not re.match(r"(step |warmup done|memory step done)", msg)):
                print(line, file=echo, flush=True)


def _log_text(run_dir: Path, r: int) -> str:
    try:
        return (run_dir / f"rank{r}.log").read_text(errors="replace")
    except OSError:
        return ""


def _read_result(run_dir: Path, r: int) -> dict | None:
    try:
        return json.loads((run_dir / f"rank{r}.json").read_text())
    except (OSError, ValueError):
        return None


def _result_ok(run_dir: Path, r: int) -> bool:
    res = _read_result(run_dir, r)
    return bool(res and res.get("status") == "ok")


# ---------------------------------------------------------------- teardown

def _terminate(procs, grace_s: float) -> None:
    """SIGTERM every rank's process group, SIGKILL what is left after `grace_s`, reap."""
    for p in procs:
        if p.poll() is None:
            _killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        _killpg(p.pid, signal.SIGKILL)      # also grandchildren whose leader already exited
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _LIVE.pop(p.pid, None)


def _killpg(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_leftovers() -> None:
    procs = list(_LIVE.values())
    if procs:
        _terminate(procs, 1.0)


def _install_term_handler():
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    return signal.signal(signal.SIGTERM, on_term)


def _restore_term_handler(prev) -> None:
    if prev is not None:
        signal.signal(signal.SIGTERM, prev)


# ---------------------------------------------------------------- under torchrun

def run_in_process(spec: dict) -> RunOutcome | None:
    """This process is one rank of a torchrun job: run it here. Rank 0 returns the outcome of the
    whole run (results gathered over the process group); other ranks return None. A rank that
    fails returns its own outcome (so it can write the record it alone knows about) and the
    caller exits non-zero, which makes torchrun stop the others."""
    from osdp_sim.runtime import worker
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    run_id = spec.get("run_id") or os.environ.get("TORCHELASTIC_RUN_ID") or new_run_id()
    spec = dict(spec, run_id=run_id)
    faulthandler_on()
    t0 = time.monotonic()
    result = worker.run_spec(spec, rank, world, local_rank)
    threads = int(spec["threads_per_rank"])
    if result["status"] != "ok":
        results = [None] * world
        results[rank] = result
        status = "oom" if result["status"] == "oom" else "failed"
        failure = {"rank": rank, "reason": f"rank {rank}: {result.get('error')}", "exit_code": None,
                   "stderr_tail": result.get("traceback", "")}
        return RunOutcome(status, run_id, spec.get("run_dir") or "", results, failure,
                          run_env(result["env"], world=world, threads=threads,
                                  ranks_per_node=ranks_per_node),
                          [os.getpid()], time.monotonic() - t0)
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    worker.teardown()
    if rank != 0:
        return None
    return RunOutcome("ok", run_id, spec.get("run_dir") or "", gathered, None,
                      run_env(result["env"], world=world, threads=threads, ranks_per_node=ranks_per_node),
                      [r["pid"] for r in gathered], time.monotonic() - t0)


def faulthandler_on() -> None:
    import faulthandler
    faulthandler.enable()
