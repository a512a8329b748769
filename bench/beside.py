"""The README's main command with the baselines beside the search (planner/beside.py) and in
turn without (OSDP_SIM_NO_BESIDE=1), alternating, cache warm; the medians and their ratio.

    python bench/beside.py --pairs 3            # about 75 s on a 2-core machine"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "osdp_sim.cli.main", "search", "--hw", "hwprofiles/titan8.yaml", "--model",
           "mingpt-48l-1536", "--mem-limit", "8GiB", "--time-limit", "300"]


def once(no_beside: bool, limit_s: float) -> tuple[float, float]:
    env = {**os.environ, "OSDP_SIM_NO_BESIDE": "1" if no_beside else ""}
    t0 = time.perf_counter()
    out = subprocess.run(COMMAND, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit_s)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"beside: the command failed:\n{out.stderr[-2000:]}")
    return wall, float(re.search(r"search optimal in ([0-9.]+) s", out.stderr).group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=600.0, help="for the whole run, seconds")
    args = ap.parse_args()
    deadline = time.perf_counter() + args.time_limit
    runs = {False: [], True: []}
    once(False, max(1.0, deadline - time.perf_counter()))          # the cache warm, not timed
    for i in range(args.pairs):
        for no_beside in (True, False):
            left = deadline - time.perf_counter()
            if left <= 0:
                raise SystemExit("beside: out of time (--time-limit)")
            wall, search_s = once(no_beside, left)
            runs[no_beside].append((wall, search_s))
            print(f"pair {i + 1}: {'after the search' if no_beside else 'beside it'}: {wall:.2f} s wall, "
                  f"{search_s:.2f} s of search", flush=True)
    after = statistics.median(w for w, _ in runs[True])
    beside = statistics.median(w for w, _ in runs[False])
    print(f"median wall: baselines after the search {after:.2f} s, beside it {beside:.2f} s ({after / beside:.2f}x); "
          f"median search {statistics.median(s for _, s in runs[True]):.2f} s -> "
          f"{statistics.median(s for _, s in runs[False]):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
