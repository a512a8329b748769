"""A function run in a forked process beside the caller, for work whose result the caller needs
only later: the baselines of a search while the search runs, on the second core.

It runs beside the caller only when that can pay and is safe: at least two cores free, fork
available, the caller's process single-threaded (a fork copies only the calling thread, so a lock
another thread holds would stay held in the child: a notebook kernel runs it in the caller), and
the search's compiled loops already in numba's cache (on a fresh machine the second core
compiles them instead: jitwarm.py). Otherwise, and whenever the process fails (it dies, or its
function raises), `result()` calls the function in the caller, so its errors reach the caller as
they would without this. The process is ended when the caller exits, or with it (Linux)."""

import multiprocessing
import os
import threading
import traceback

from osdp_sim import jitwarm


class Beside:
    """fn(*args, **kwargs), started now and read with result(); as a context manager, the process
    is ended on leaving the block unless result() was read (an error, or no result wanted)."""

    def __init__(self, fn, *args, **kwargs):
        self._call = (fn, args, kwargs)
        self._proc = self._conn = None
        if not _worth_it():
            return
        ctx = multiprocessing.get_context("fork")
        self._conn, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(child_end, os.getpid(), fn, args, kwargs), daemon=True)
        self._proc.start()
        child_end.close()

    def __enter__(self) -> "Beside":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    @property
    def in_process(self) -> bool:
        """Whether it runs in a process of its own."""
        return self._proc is not None

    def result(self):
        """The function's value: the process's, or the function called here (see the module)."""
        if self._proc is not None:
            try:
                ok, value = self._conn.recv()
            except (EOFError, OSError):
                ok, value = False, None
            self.cancel()
            if ok:
                return value
        fn, args, kwargs = self._call
        return fn(*args, **kwargs)

    def cancel(self) -> None:
        """End the process (its result is not wanted)."""
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join()
            self._conn.close()
            self._proc = None


def _worth_it() -> bool:
    if os.environ.get("OSDP_SIM_NO_BESIDE") or jitwarm.free_cores() < 2:
        return False
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return False
    return all(jitwarm.is_cached(n) for n in jitwarm.ENTRY_POINTS)


def _child(conn, parent_pid: int, fn, args, kwargs) -> None:
    if not jitwarm.end_with_parent(parent_pid):
        return
    jitwarm.not_in_this_process()        # the caller starts the warm-up, should it need one
    try:
        out = (True, fn(*args, **kwargs))
    except BaseException:                # the caller calls it again and sees the error itself
        out = (False, traceback.format_exc())
    try:
        conn.send(out)
    except Exception:                    # its value does not pickle: the caller calls it again
        conn.send((False, traceback.format_exc()))
    conn.close()
