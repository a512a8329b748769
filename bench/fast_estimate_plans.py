"""fast_estimate (the knapsack baseline's probes, costmodel/fast.py) on 27 plans of mingpt-48l-1536
(titan8, micro-batch 4, every block checkpointed; uniform ZeRO-3, ZeRO-2 and DDP with splits 1, 2
and 4, three times): the seconds of all 27 in one process, after one untimed pass. With --base,
the same from a fresh clone of that commit, in alternating rounds, and the ratio.

    python bench/fast_estimate_plans.py --base d23ccd3      # about 1 min on a 2-core machine
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from readme_command import ROOT, fresh_clone, tree_env

from osdp_sim.cli.common import positive_int, run_script

ONE_PASS = """
import time
from osdp_sim.costmodel.fast import fast_estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.plan.plan import GroupChoice, Plan
spec = build_spec(BUILTIN["mingpt-48l-1536"])
hw = load_profile("hwprofiles/titan8.yaml")
keys = [g.plan_key for g in spec.groups]
plans = [Plan(model=spec.config, devices=8, micro_batch=4, checkpoint=(True,) * 48,
              choices={k: GroupChoice(st, 1 if k == "root" else split) for k in keys})
         for st in ("zero3", "zero2", "ddp") * 3 for split in (1, 2, 4)]
fast_estimate(spec, hw, plans[0])
t = time.perf_counter()
sps = [fast_estimate(spec, hw, p).samples_per_s for p in plans]
print(time.perf_counter() - t, sps[-1])
"""


def one_run(tree: Path) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", ONE_PASS], cwd=tree, env=tree_env(tree), capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"fast_estimate_plans: the pass failed in {tree}:\n{out.stderr[-2000:]}")
    seconds, last = out.stdout.split()
    return float(seconds), last


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a commit to time in the same run (fresh clone)")
    ap.add_argument("--rounds", type=positive_int, default=3)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT}
        if a.base:
            trees[a.base] = fresh_clone(a.base, Path(tmp))
            one_run(trees[a.base])                       # its numba cache filled, untimed
        times: dict = {name: [] for name in trees}
        for r in range(a.rounds):
            for name, tree in trees.items():
                s, last = one_run(tree)
                times[name].append(s)
                print(f"round {r + 1} {name}: {s:.3f} s for 27 plans (last plan {last} samples/s)", flush=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    if a.base:
        print(f"median {a.base} {med[a.base]:.3f} s -> this tree {med['this tree']:.3f} s "
              f"({med[a.base] / med['this tree']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
