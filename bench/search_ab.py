"""The issue-17 48-layer instances (`bench/search_bench.py --targets --quick --only 48`) timed on two
commits in alternating rounds in one run, each from a fresh clone (its numba cache filled by one
untimed run first): the median search time per model and the ratio. This machine's speed drifts
by 20-40% within minutes, so only runs interleaved like this compare.

    python bench/search_ab.py --base 6675aaa               # 3 rounds, about 5 min on a 2-core machine
    python bench/search_ab.py --base 6675aaa --rounds 5
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from readme_command import fresh_clone, tree_env

from osdp_sim.cli.common import positive_float, positive_int, run_script
from osdp_sim.errors import UserError

LINE = re.compile(r"^(\S+) on titan8.*\n\s+ours\s+(\S+)\s+([0-9.]+) s\s+nodes\s+(\d+)", re.M)


def one_run(tree: Path, commit: str, limit_s: float) -> dict:
    """model -> (status, seconds, nodes) of one search_bench run from tree's code (commit's)."""
    out = subprocess.run([sys.executable, "bench/search_bench.py", "--targets", "--quick", "--only", "48",
                          "--time-limit", "60"], cwd=tree, env=tree_env(tree),
                         capture_output=True, text=True, timeout=limit_s)
    if out.returncode != 0:
        raise SystemExit(f"search_bench failed at {commit}:\n{out.stderr[-2000:]}")
    got = {m: (st, float(s), int(n)) for m, st, s, n in LINE.findall(out.stdout)}
    if not got:
        raise UserError(f"no search line in bench/search_bench.py's output at {commit} "
                        f"(its format changed?):\n{out.stdout[-500:]}")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--time-limit", type=positive_float, default=1800.0, help="for the whole run, seconds")
    args = ap.parse_args()
    deadline = time.perf_counter() + args.time_limit

    def left() -> float:
        s = deadline - time.perf_counter()
        if s <= 0:
            raise UserError("out of time", field="--time-limit")
        return s

    with tempfile.TemporaryDirectory() as tmp:
        trees = {c: fresh_clone(c, Path(tmp) / str(i), field)
                 for i, (c, field) in enumerate(((args.base, "--base"), (args.commit, "--commit")))}
        for c, tree in trees.items():
            one_run(tree, c, left())                      # compiles its loops into its own cache
            print(f"{c}: compiled", flush=True)
        times = {c: {} for c in trees}
        for r in range(args.rounds):
            for c, tree in trees.items():
                got = one_run(tree, c, left())
                for m, (st, s, n) in got.items():
                    times[c].setdefault(m, []).append(s)
                print(f"round {r + 1} {c}: " + ", ".join(f"{m} {s:.2f} s ({st}, {n} nodes)"
                                                        for m, (st, s, n) in got.items()), flush=True)
        for m in times[args.base]:
            b, h = statistics.median(times[args.base][m]), statistics.median(times[args.commit][m])
            print(f"{m}: median {args.base} {b:.2f} s -> {args.commit} {h:.2f} s ({b / h:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
