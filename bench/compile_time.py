"""What numba compiles in the README's main command on a fresh clone (empty cache): the number of
compiles and their time, each function timed without the compiles of its callees (numba's
"numba:compile" events), in the search's own process; with --base, the same for another commit.

    python bench/compile_time.py --base 8f3a39a --no-warmup    # about 1.5 min on a 2-core machine

--no-warmup compiles everything in the search's process (OSDP_SIM_NO_WARMUP=1); without it, a
fresh machine's second process (osdp_sim/jitwarm.py) compiles part of it meanwhile, and what is
left here is printed. NUMBA_OPT and the like pass through from the environment."""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from readme_command import fresh_clone, run

from osdp_sim.cli.common import run_script

LISTENER = r'''
import atexit, collections, json, sys, time
from numba.core import event
own = collections.defaultdict(float)
stack = []
class Timer(event.Listener):
    def on_start(self, e):
        stack.append([time.perf_counter(), 0.0])
    def on_end(self, e):
        t0, inner = stack.pop()
        d = time.perf_counter() - t0
        if stack:
            stack[-1][1] += d
        f = e.data["dispatcher"].py_func
        own[f"{f.__module__}.{f.__qualname__} {e.data['args']}"[:140]] += d - inner
event.register("numba:compile", Timer())
atexit.register(lambda: print("COMPILES " + json.dumps(own), file=sys.stderr))
from osdp_sim.cli.main import main
sys.exit(main(sys.argv[1:]))
'''


def measure(commit: str, no_warmup: bool, field: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tree = fresh_clone(commit, Path(tmp), field)
        wall, search_s, err = run(tree, env={"OSDP_SIM_NO_WARMUP": "1" if no_warmup else ""},
                                  prefix=("-c", LISTENER))
    own = json.loads(err.split("COMPILES ", 1)[1].splitlines()[0])
    total = sum(own.values())
    print(f"{commit}: {len(own)} compiles, {total:.1f} s of compiling in the search's process; "
          f"{wall:.1f} s wall, {search_s:.1f} s of search")
    for name, s in sorted(own.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {s:6.2f} s  {name}")
    return {"compiles": len(own), "seconds": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--base", help="a commit to measure in the same run")
    ap.add_argument("--no-warmup", action="store_true", help="no second compiling process")
    args = ap.parse_args()
    head = measure(args.commit, args.no_warmup, "--commit")
    if args.base:
        base = measure(args.base, args.no_warmup, "--base")
        print(f"compiles {base['compiles']} -> {head['compiles']}; compiling {base['seconds']:.1f} s -> "
              f"{head['seconds']:.1f} s ({base['seconds'] / head['seconds']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
