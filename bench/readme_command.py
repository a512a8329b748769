"""The README's main command, run in a subprocess from a source tree, for the benchmarks that
time it (cold_start.py, beside.py, compile_time.py)."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["search", "--hw", "hwprofiles/titan8.yaml", "--model", "mingpt-48l-1536", "--mem-limit", "8GiB",
        "--time-limit", "300"]


def tree_env(tree: Path, extra: dict | None = None) -> dict:
    """This environment for a process that runs tree's code, with its numba cache beside it
    (NUMBA_CACHE_DIR dropped), and extra."""
    base = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    return {**base, **(extra or {}), "PYTHONPATH": str(tree)}


def run(tree: Path = ROOT, env: dict | None = None, limit_s: float = 600.0, prefix=("-m", "osdp_sim.cli.main")):
    """(wall seconds, the search's own seconds, stderr) of the command run from tree's code
    (tree_env)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *prefix, *ARGS], cwd=tree, env=tree_env(tree, env),
                         capture_output=True, text=True, timeout=limit_s)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"the README command failed in {tree}:\n{out.stderr[-2000:]}")
    found = re.search(r"search optimal in ([0-9.]+) s", out.stderr)
    return wall, float(found.group(1)) if found else float("nan"), out.stderr


def fresh_clone(commit: str, into: Path, field: str = "--base") -> Path:
    """This repository's `commit` cloned into `into`/tree: no numba cache. A commit the repository
    lacks is a UserError naming `field`."""
    from osdp_sim.errors import UserError
    tree = into / "tree"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tree)], check=True)
    out = subprocess.run(["git", "checkout", "-q", commit], cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"{commit!r} is not a commit of this repository", field=field)
    return tree
