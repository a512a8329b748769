"""planner/beside.py: a function run in a forked process beside the caller, or in the caller
when that cannot pay or the process fails."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from osdp_sim import jitwarm
from osdp_sim.planner.beside import Beside

ROOT = Path(__file__).resolve().parents[1]
TWO_CORES = pytest.mark.skipif(jitwarm.free_cores() < 2, reason="runs beside the caller only with two cores free")


@pytest.fixture
def cached(monkeypatch):
    """As if the compiled loops were in the cache (Beside runs in a process only then)."""
    monkeypatch.delenv("OSDP_SIM_NO_BESIDE", raising=False)
    monkeypatch.setattr(jitwarm, "is_cached", lambda name: True)


def _pid_and(x):
    return os.getpid(), x * 2


def _fails_in_a_child(parent_pid):
    if os.getpid() != parent_pid:
        raise RuntimeError("only in the child")
    return "called in the caller"


def _sleeps():
    time.sleep(60)


@TWO_CORES
def test_runs_in_another_process_and_returns_its_value(cached):
    b = Beside(_pid_and, 21)
    assert b.in_process
    pid, value = b.result()
    assert value == 42 and pid != os.getpid()


@TWO_CORES
def test_a_failure_in_the_process_calls_it_in_the_caller(cached):
    b = Beside(_fails_in_a_child, os.getpid())
    assert b.in_process
    assert b.result() == "called in the caller"
    with pytest.raises(ZeroDivisionError):         # an error of the function itself reaches the caller
        Beside(lambda: 1 / 0).result()


@TWO_CORES
def test_leaving_the_block_ends_the_process(cached):
    with Beside(_sleeps) as b:
        proc = b._proc
    assert not proc.is_alive()


@TWO_CORES
def test_cancel_ends_the_process(cached):
    b = Beside(_sleeps)
    proc = b._proc
    t0 = time.perf_counter()
    b.cancel()
    assert not proc.is_alive() and time.perf_counter() - t0 < 5


def test_in_the_caller_when_asked_or_the_cache_is_cold(monkeypatch):
    monkeypatch.setenv("OSDP_SIM_NO_BESIDE", "1")
    b = Beside(_pid_and, 1)
    assert not b.in_process and b.result() == (os.getpid(), 2)
    monkeypatch.delenv("OSDP_SIM_NO_BESIDE")
    monkeypatch.setattr(jitwarm, "is_cached", lambda name: False)
    assert not Beside(_pid_and, 1).in_process


@TWO_CORES
def test_in_the_caller_when_another_thread_runs(cached):
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not Beside(_pid_and, 1).in_process
    finally:
        stop.set()
        other.join()
    b = Beside(_pid_and, 1)
    assert b.in_process and b.result()[1] == 2


def test_the_search_command_reports_the_same_beside_or_not():
    cmd = [sys.executable, "-m", "osdp_sim.cli.main", "search", "--hw", "hwprofiles/titan8.yaml", "--model",
           "gpt2-350m", "--mem-limit", "6GiB", "--time-limit", "120"]
    # the compiled loops cached first (as a search leaves them), else it runs in the caller
    from numba.core.sigutils import normalize_signature
    for name, sig in jitwarm.ENTRY_POINTS.items():
        jitwarm.dispatcher(name).compile(tuple(normalize_signature(sig)[0]))
    assert all(jitwarm.is_cached(n) for n in jitwarm.ENTRY_POINTS)
    outs = []
    for no_beside in ("", "1"):
        env = {**os.environ, "OSDP_SIM_NO_BESIDE": no_beside}
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        outs.append((out.stdout, out.stderr))
    (beside, beside_err), (alone, _) = outs
    if jitwarm.free_cores() >= 2:
        assert "evaluated beside it" in beside_err
    table = [ln for ln in beside.splitlines() if ln.startswith("  uniform") or "per-block" in ln or "knapsack" in ln]
    assert len(table) == 7
    strip = lambda text: [ln for ln in text.splitlines() if not ln.rstrip().endswith(" s")]   # times differ
    assert strip(beside) == strip(alone)


@TWO_CORES
def test_what_the_caller_had_buffered_is_written_once():
    # (multiprocessing's fork flushes the standard streams first; a bare os.fork would not)
    code = """
from osdp_sim import jitwarm
from osdp_sim.planner.beside import Beside
jitwarm.is_cached = lambda name: True
print("buffered before the fork")          # stdout is a pipe here: block-buffered, not yet written
b = Beside(sum, [1, 2])
assert b.in_process and b.result() == 3
"""
    env = {k: v for k, v in os.environ.items() if k != "OSDP_SIM_NO_BESIDE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("buffered before the fork") == 1, out.stdout
