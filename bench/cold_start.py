"""The README's main command on a fresh clone (numba's cache empty: every compiled loop compiled),
then once more (loaded from the cache); with --base, the same for another commit in the same run,
and the ratios.

    python bench/cold_start.py --base 8f3a39a     # about 2 min on a 2-core machine

Each commit is cloned from this repository into a temporary directory and run from there
(PYTHONPATH), so the installed package and its cache are not touched."""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from readme_command import fresh_clone, run

from osdp_sim.cli.common import run_script


def measure(commit: str, deadline: float, field: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tree = fresh_clone(commit, Path(tmp), field)
        got = {}
        for kind in ("cold", "warm"):
            left = deadline - time.perf_counter()
            if left <= 0:
                raise SystemExit("cold_start: out of time (--time-limit)")
            wall, search_s, _err = run(tree, limit_s=left)
            got[kind] = (wall, search_s)
            print(f"{commit} {kind}: {wall:.1f} s wall, {search_s:.1f} s of search", flush=True)
        return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--base", help="a commit to measure in the same run, for the ratios")
    ap.add_argument("--time-limit", type=float, default=900.0, help="for the whole run, seconds")
    args = ap.parse_args()
    deadline = time.perf_counter() + args.time_limit
    head = measure(args.commit, deadline, "--commit")
    if args.base:
        base = measure(args.base, deadline, "--base")
        for run in ("cold", "warm"):
            print(f"{run}: {args.base} {base[run][0]:.1f} s -> {args.commit} {head[run][0]:.1f} s wall "
                  f"({base[run][0] / head[run][0]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
