"""The README's main command on a fresh clone (numba's cache empty: every compiled loop compiled),
then once more (loaded from the cache); with --base, the same for another commit in the same run,
and the ratios.

    python bench/cold_start.py --base 8f3a39a     # about 2 min on a 2-core machine

Each commit is cloned from this repository into a temporary directory and run from there
(PYTHONPATH), so the installed package and its cache are not touched."""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["-m", "osdp_sim.cli.main", "search", "--hw", "hwprofiles/titan8.yaml", "--model", "mingpt-48l-1536",
           "--mem-limit", "8GiB", "--time-limit", "300"]


def run_once(tree: Path, limit_s: float) -> tuple[float, float]:
    """(wall seconds, the search's own seconds) of the README command run from tree."""
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}    # the cache beside the tree's code
    out = subprocess.run([sys.executable, *COMMAND], cwd=tree, env={**env, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, timeout=limit_s)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"cold_start: the command failed in {tree}:\n{out.stderr[-2000:]}")
    found = re.search(r"search optimal in ([0-9.]+) s", out.stderr)
    return wall, float(found.group(1)) if found else float("nan")


def measure(commit: str, deadline: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(tree)], check=True)
        subprocess.run(["git", "checkout", "-q", commit], cwd=tree, check=True)
        got = {}
        for run in ("cold", "warm"):
            left = deadline - time.perf_counter()
            if left <= 0:
                raise SystemExit("cold_start: out of time (--time-limit)")
            got[run] = run_once(tree, left)
            print(f"{commit} {run}: {got[run][0]:.1f} s wall, {got[run][1]:.1f} s of search", flush=True)
        return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--base", help="a commit to measure in the same run, for the ratios")
    ap.add_argument("--time-limit", type=float, default=900.0, help="for the whole run, seconds")
    args = ap.parse_args()
    deadline = time.perf_counter() + args.time_limit
    head = measure(args.commit, deadline)
    if args.base:
        base = measure(args.base, deadline)
        for run in ("cold", "warm"):
            print(f"{run}: {args.base} {base[run][0]:.1f} s -> {args.commit} {head[run][0]:.1f} s wall "
                  f"({base[run][0] / head[run][0]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
