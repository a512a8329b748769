"""The README's main command with the baselines beside the search (planner/beside.py) and in
turn without (OSDP_SIM_NO_BESIDE=1), alternating, cache warm; the medians and their ratio.

    python bench/beside.py --pairs 3            # about 75 s on a 2-core machine"""

import argparse
import statistics
import sys
import time

from readme_command import run


def once(no_beside: bool, limit_s: float) -> tuple[float, float]:
    wall, search_s, _err = run(env={"OSDP_SIM_NO_BESIDE": "1" if no_beside else ""}, limit_s=limit_s)
    return wall, search_s


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
