"""The compile warm-up (osdp_sim/jitwarm.py): its table is what a search compiles, the process it
starts fills an empty numba cache that a later process loads from, and it ends with its parent."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from osdp_sim import jitwarm

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["osdp_sim.planner.labelfold.update_chain", "osdp_sim.planner.bounds._hull_slopes_sorted"]


def _python(code: str, env_extra: dict | None = None, timeout: float = 300) -> str:
    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_table_is_what_a_search_compiles_one_signature_each():
    # a search that calls every entry point (key graphs included), in its own process so that no
    # other test's calls add signatures
    code = """
import json
from numba.core.sigutils import normalize_signature
from osdp_sim import jit, jitwarm
from osdp_sim.api import load_model, load_profile
from osdp_sim.planner.bnb import search
from osdp_sim.planner.space import SearchSpace
r = search(load_model("mingpt-48l-1536"), load_profile("hwprofiles/titan8.yaml"), 8 * 2**30,
           SearchSpace(devices=8, splits=(1, 2)))
assert r.status == "optimal", r.status
print(json.dumps({"compiled": {n: [str(s) for s in d.signatures] for n, d in jit.REGISTRY.items()},
                  "table": {n: str(tuple(normalize_signature(s)[0])) for n, s in jitwarm.ENTRY_POINTS.items()}}))
"""
    got = json.loads(_python(code, {"OSDP_SIM_NO_WARMUP": "1"}).splitlines()[-1])
    compiled, table = got["compiled"], got["table"]
    more = {n: s for n, s in compiled.items() if len(s) > 1}
    assert not more, f"compiled for more than one signature (each costs a whole compile): {more}"
    for name, sig in table.items():
        assert compiled[name] == [sig], f"{name}: the search compiled {compiled[name]}, the table says {sig}"


def test_the_front_table_is_what_a_front_compiles():
    # a front in its own process: the loops it compiles are FRONT_ENTRY_POINTS, each at its signature
    code = """
import json
from numba.core.sigutils import normalize_signature
from osdp_sim import jit, jitwarm
from osdp_sim.api import load_model, load_profile
from osdp_sim.planner.bnb import pareto_front
from osdp_sim.planner.space import SearchSpace
r = pareto_front(load_model("gpt2-124m"), load_profile("hwprofiles/titan8.yaml"),
                 SearchSpace(devices=8, splits=(1, 2), micro_batches=(1, 2)))
assert r.proven and r.front
print(json.dumps({"compiled": {n: [str(s) for s in d.signatures] for n, d in jit.REGISTRY.items() if d.signatures},
                  "table": {n: str(tuple(normalize_signature(jitwarm.SIGNATURES[n])[0]))
                            for n in jitwarm.FRONT_ENTRY_POINTS}}))
"""
    got = json.loads(_python(code, {"OSDP_SIM_NO_WARMUP": "1"}).splitlines()[-1])
    compiled, table = got["compiled"], got["table"]
    assert set(compiled) == set(table), f"a front compiles {sorted(compiled)}, the table warms {sorted(table)}"
    for name, sig in table.items():
        assert compiled[name] == [sig], f"{name}: the front compiled {compiled[name]}, the table says {sig}"


TWO_CORES = pytest.mark.skipif(jitwarm.free_cores() < 2, reason="the warm-up starts only with two cores free")


@TWO_CORES
def test_the_warm_up_fills_an_empty_cache_that_the_next_process_loads(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}           # an empty cache, this test's own
    code = f"""
import os
from osdp_sim import jitwarm
names = {SMALL!r}
before = [jitwarm.is_cached(n) for n in names]
proc = jitwarm.warm_in_background(names)
proc.wait(timeout=240)
print(before, [jitwarm.is_cached(n) for n in names], proc.returncode)
"""
    assert _python(code, env).split("\n")[-2] == "[False, False] [True, True] 0"
    load = """
import numpy as np
from osdp_sim.planner import bounds, labelfold
from osdp_sim.planner.labels import NCOL, NDELTA
labelfold.update_chain(np.zeros((1, NCOL), dtype=np.int64), np.zeros((2, 1, NDELTA), dtype=np.int64), 1, False)
bounds._hull_slopes_sorted(np.arange(3.0), np.arange(3.0), np.arange(3))
print(sum(labelfold.update_chain.stats.cache_hits.values()), sum(labelfold.update_chain.stats.cache_misses.values()),
      sum(bounds._hull_slopes_sorted.stats.cache_hits.values()))
"""
    assert _python(load, env).split() == ["1", "0", "1"]


@TWO_CORES
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table in /proc")
def test_the_warm_up_ends_with_its_parent(tmp_path):
    # the parent leaves without its exit handlers (as if killed): the kernel ends the child
    code = f"""
import os, time
from osdp_sim import jitwarm
proc = jitwarm.warm_in_background({list(jitwarm.ENTRY_POINTS)!r})
print(proc.pid, flush=True)
time.sleep(3)                  # the child is compiling by now (past its check of its parent)
os._exit(0)
"""
    pid = int(_python(code, {"NUMBA_CACHE_DIR": str(tmp_path)}).split()[0])
    deadline = time.monotonic() + 5            # the whole table compiles in well over 5 s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return                                     # ended and reaped
        if state == "Z":                               # ended, awaiting its (new) parent's wait
            return
        time.sleep(0.1)
    pytest.fail(f"the warm-up process {pid} still runs after its parent ended")


def test_no_warm_up_when_asked_or_already_started(monkeypatch):
    monkeypatch.setenv("OSDP_SIM_NO_WARMUP", "1")
    monkeypatch.setattr(jitwarm, "_started", False)
    assert jitwarm.warm_in_background() is None
    monkeypatch.delenv("OSDP_SIM_NO_WARMUP")
    monkeypatch.setattr(jitwarm, "_started", True)
    assert jitwarm.warm_in_background() is None
