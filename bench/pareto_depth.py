"""How the one-pass Pareto front (search.bnb.pareto_front, `osdp-sim pareto --method front`) grows
with depth: one configuration of mingpt-48l-1536 (titan8, no splits, micro-batch 4, root zero3)
cut to a few depths. docs/search-usage.md quotes these times.

    python bench/pareto_depth.py [--layers 8,16,24,32]      # about 70 s
"""

import argparse
import sys
import time

from osdp_sim.cli.common import int_list, run_script
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.bnb import pareto_front
from osdp_sim.planner.space import SearchSpace


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int_list, default=(8, 16, 24, 32))
    args = ap.parse_args()
    hw = load_profile("titan8")
    space = SearchSpace(splits=(1,), micro_batches=(4,), root_strategies=("zero3",))
    for n in args.layers:
        spec = build_spec(with_overrides(BUILTIN["mingpt-48l-1536"], n_layers=n))
        t = time.perf_counter()
        r = pareto_front(spec, hw, space)
        print(f"mingpt-48l-1536 cut to {n} blocks, one configuration: {time.perf_counter() - t:.1f} s, "
              f"{len(r.front)} front points, {r.nodes} labels", flush=True)


if __name__ == "__main__":
    sys.exit(run_script(main))
