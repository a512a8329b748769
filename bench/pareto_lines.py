"""The one-pass Pareto front (search.bnb.pareto_front) with and without the front's line test
(planner/front.py: a label is pruned when one line of its Lagrangian time bound lies above the
front found so far at every peak it can end at), in one run on the same instances. Both must
give the same front; the ratios are of the labels created and of the wall time.
docs/benchmarks.md quotes its lines.

    python bench/pareto_lines.py [--time-limit 300] [--cases NAME:LAYERS:SPLITS,...]
"""

import argparse
import sys
import time

from osdp_sim.cli.common import run_script
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.bnb import pareto_front
from osdp_sim.planner.space import SearchSpace

# (model, blocks kept, operator splits searched): instances both variants finish on a 2-core
# machine within the time limit (gpt2-1.5b at 12 blocks: the lines variant only, 107 s).
DEFAULT_CASES = "mingpt-48l-1536:16:1,mingpt-48l-1536:24:1,gpt2-1.5b:6:1+2+4,gpt2-1.5b:12:1+2+4"


def _cases(text: str):
    """--cases as (model, blocks, splits) triples; a malformed item or an unknown model is a
    usage error (exit 2)."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            if len(parts) != 3:
                raise ValueError(item)
            name, layers, splits = parts[0], int(parts[1]), tuple(int(s) for s in parts[2].split("+"))
        except (IndexError, ValueError):
            raise argparse.ArgumentTypeError(f"{item!r}: expected NAME:LAYERS:SPLITS, e.g. gpt2-1.5b:6:1+2+4")
        if name not in BUILTIN or layers < 1 or min(splits) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: model one of {', '.join(sorted(BUILTIN))}, "
                                             f"layers and splits positive integers")
        out.append((name, layers, splits))
    return out


def _front_key(r):
    return [(round(p, 0), round(s, 9)) for p, s, _plan in r.front]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=300.0, help="per variant and instance (s)")
    ap.add_argument("--cases", type=_cases, default=_cases(DEFAULT_CASES), help="NAME:LAYERS:SPLITS (splits joined by +), comma separated")
    args = ap.parse_args()
    hw = load_profile("titan8")
    for name, layers, splits in args.cases:
        cfg = BUILTIN[name]
        spec = build_spec(cfg if layers == cfg.n_layers else with_overrides(cfg, n_layers=layers))
        space = SearchSpace(splits=splits)
        runs = {}
        for lines in (False, True):
            t = time.perf_counter()
            r = pareto_front(spec, hw, space, time_limit_s=args.time_limit, front_lines=lines)
            dt = time.perf_counter() - t
            runs[lines] = (r, dt)
            print(f"{name} {layers} blocks splits {'+'.join(map(str, splits))} "
                  f"{'threshold + lines' if lines else 'threshold only   '}: "
                  f"{'proven    ' if r.proven else 'time_limit'} {dt:8.2f} s  points {len(r.front):4d}  "
                  f"labels {r.nodes:,}", flush=True)
        (a, ta), (b, tb) = runs[False], runs[True]
        same = "same front" if a.proven and b.proven and _front_key(a) == _front_key(b) else \
            ("fronts differ" if a.proven and b.proven else "not both proven")
        print(f"  ratio (threshold only / with lines): labels {a.nodes / max(b.nodes, 1):.2f}x  "
              f"time {ta / max(tb, 1e-9):.2f}x  {same}", flush=True)


if __name__ == "__main__":
    sys.exit(run_script(main))
