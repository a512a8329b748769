"""The search's compiled loops compiled in a second process while the first search on a fresh
machine runs (jit.py says where the code is cached).

numba compiles a loop when it is first called, so on a fresh machine the first search stops at
each new loop for its compile (15-18 s in all on the README command: `python bench/compile_time.py --no-warmup`). With
a second core free, `warm_in_background` starts `python -m osdp_sim.jitwarm`, which compiles the
loops from the last one a search needs to the first and writes each to the cache as it is done;
the search compiles from the first one on, and loads from the cache each loop the other process
has written by the time it needs it. numba writes a cache file under a temporary name and renames
it, so either process reads whole files only; a loop both compile is compiled twice, never wrong.

ENTRY_POINTS lists each loop that Python calls, with the one signature a search compiles it for
(the loops they call are compiled and cached with them); FRONT_ONLY adds those of pareto_front,
and FRONT_ENTRY_POINTS is what pareto_front warms. tests/test_jitwarm.py checks both against what
a search and a front compile."""

import atexit
import os
import subprocess
import sys

ENTRY_POINTS = {
    # in the order the warm-up compiles them: the reverse of the order a search first calls them
    "osdp_sim.planner.labelfold.graph_back":
        "(int64[::1], int64[:, :, ::1], int64[:, ::1], int64, float64[::1], float64[:, ::1], float64[::1], "
        "int64[::1])",
    "osdp_sim.planner.labelfold.graph_forward":
        "(int64[:, ::1], int64[::1], int64[:, :, ::1], int64[:, ::1], int64, boolean, int64[::1])",
    "osdp_sim.planner.labelsettle.settle":
        "(int64[:, ::1], int64[::1], int64[::1], float64[:, ::1], float64[::1], float64[::1], float64, boolean, "
        "float64, float64, float64[:, ::1], float64[::1], float64[::1], boolean, float64, boolean, int64)",
    "osdp_sim.planner.labelfold.expand":
        "(int64[:, ::1], int64[::1], int64[::1], int64[:, :, ::1], int64[:, ::1], int64[:, ::1], int64, boolean)",
    "osdp_sim.planner.keystore._same_as_first": "(int64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1])",
    "osdp_sim.planner.keystore._queue_hashes": "(int64[:, ::1], int64[::1], int64[::1], int64[::1])",
    "osdp_sim.costmodel.fold.run_stages":
        "(float64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], float64[:, ::1], "
        "int64[:, ::1], float64[:, ::1], float64[:, ::1], int64[:, ::1], float64[:, ::1], int64[:, ::1], "
        "int64[:, ::1])",
    "osdp_sim.planner.labelfold.update_chain": "(int64[:, ::1], int64[:, :, ::1], int64, boolean)",
    "osdp_sim.planner.labelbounds.label_bounds":
        "(int64[:, ::1], int64[::1], float64[:, ::1], float64[::1], float64[::1], float64, boolean, float64, "
        "float64, float64[:, ::1], int64[::1], float64[::1], float64[::1], boolean, float64)",
    "osdp_sim.planner.bounds._key_terms_loop":
        "(float64[:, ::1], float64, int64[::1], float64[::1], float64[::1], float64[::1], float64[::1], "
        "float64[:, ::1], int64, float64, float64, float64[:, ::1], float64[:, ::1], float64[:, ::1], float64[::1], "
        "boolean[::1])",
    "osdp_sim.planner.bounds._hull_slopes_sorted": "(float64[::1], float64[::1], int64[::1])",
}

FRONT_ONLY = {
    # the loops pareto_front calls and search() does not
    "osdp_sim.planner.dominance.pareto_segments": "(int64[:, ::1], int64[::1], int64[::1], int64, boolean[::1])",
    "osdp_sim.planner.front.lambda_pruned":
        "(int64[:, ::1], int64[::1], int64[::1], float64[:, ::1], float64[::1], float64[:, ::1], int64[::1], "
        "float64[:, ::1], float64[::1], float64[:, ::1], boolean, float64, float64)",
}

FRONT_ENTRY_POINTS = (*FRONT_ONLY, *list(ENTRY_POINTS)[list(ENTRY_POINTS).index("osdp_sim.planner.labelfold.expand"):])
"""The loops pareto_front calls, in the order the warm-up compiles them (it builds no key graph
and settles its labels in numpy: graph_back, graph_forward and settle are not among them)."""

SIGNATURES = {**ENTRY_POINTS, **FRONT_ONLY}

_started = False


def dispatcher(name: str):
    import importlib
    module, attr = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def is_cached(name: str) -> bool:
    """Whether numba's cache holds code of the loop for its current source (numba's own index:
    a missing or stale one holds nothing). True when the cache cannot be read: then nothing is
    warmed."""
    try:
        return bool(dispatcher(name)._cache._cache_file._load_index())
    except Exception:             # numba's cache internals moved, or no cache: leave it to the call
        return True


def free_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def warm_in_background(names=None) -> subprocess.Popen | None:
    """Start the warm-up process for the loops of `names` (default: all) that the cache lacks, once
    per process, when at least two cores are free and OSDP_SIM_NO_WARMUP is unset; it is ended
    when this process exits, should it still run. Returns it (None: not started)."""
    global _started
    if _started or os.environ.get("OSDP_SIM_NO_WARMUP") or free_cores() < 2:
        return None
    _started = True
    cold = [n for n in (ENTRY_POINTS if names is None else names) if not is_cached(n)]
    if not cold:
        return None
    proc = subprocess.Popen([sys.executable, "-m", "osdp_sim.jitwarm", str(os.getpid()), *cold],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(_end, proc)
    return proc


def not_in_this_process() -> None:
    """No warm-up from this process (a child of a process that starts its own)."""
    global _started
    _started = True


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def end_with_parent(parent_pid: int) -> bool:
    """Have the kernel end this process when its parent ends (Linux); False if it already has."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                      # elsewhere: the parent's atexit ends it
    return os.getppid() == parent_pid


def main(argv: list[str]) -> int:
    if not argv or not end_with_parent(int(argv[0])):
        return 0
    from numba.core.sigutils import normalize_signature
    for name in argv[1:]:
        try:
            # as a tuple of types, as a call compiles it: numba's cache index is keyed by what
            # compile() is given, and a signature string would be a key no call looks up
            args, _return = normalize_signature(SIGNATURES[name])
            dispatcher(name).compile(tuple(args))
        except Exception:         # a stale signature: the search compiles that loop itself
            continue
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
