"""How much operator splitting moves the Pareto fronts of the paper's setting (titan8, the two
48-layer minGPTs): for each memory limit, the optimum without splits (an exact search() per limit,
about a minute for all of them on a 2-core machine) against the committed front with splits
(plots/pareto-titan8-*-splits.csv: the best point that fits). Prints a markdown table.

    python bench/split_gain.py [--limits 4,6,7,8,10,12,14,16,20,23]

The front with splits comes from a sweep (docs/search-usage.md, "The OSDP paper's setting") that
searched every multiple of 0.5 GiB from 23 GiB down, so at those limits its best point is the
search's result there: proven optimal except where the sweep's log says otherwise (mingpt-48l-2048
at 8 GiB stopped at its 60 s limit with a gap of 1.07%). The committed no-split fronts are 128 MiB
apart and can miss the optimum at a given limit by up to a step, hence the searches here."""

import argparse
import csv
from pathlib import Path

from osdp_sim.api import load_model
from osdp_sim.hardware.load import load_profile
from osdp_sim.planner.bnb import search
from osdp_sim.planner.space import SearchSpace

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mingpt-48l-1536", "mingpt-48l-2048")
GiB = 2**30


def front(path: Path) -> list[tuple[float, float]]:
    with path.open() as f:
        return [(float(r["peak_memory_bytes"]), float(r["samples_per_s"])) for r in csv.DictReader(f)]


def best_within(points: list[tuple[float, float]], limit_bytes: float) -> float | None:
    fits = [sps for peak, sps in points if peak <= limit_bytes]
    return max(fits) if fits else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", default="4,6,7,8,10,12,14,16,20,23", help="GiB, comma-separated")
    args = ap.parse_args()
    limits = [float(x) for x in args.limits.split(",")]
    hw = load_profile(str(ROOT / "hwprofiles" / "titan8.yaml"))
    print("| model | limit | no splits (exact) | with splits (front) | gain |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for m in MODELS:
        spec, cache = load_model(m), {}
        split = front(ROOT / "plots" / f"pareto-titan8-{m}-splits.csv")
        for lim in limits:
            r = search(spec, hw, lim * GiB, SearchSpace(splits=(1,)), time_limit_s=120, cache=cache)
            a = r.prediction.samples_per_s if r.plan is not None else None
            note = "" if r.status in ("optimal", "infeasible") else f" ({r.status})"
            b = best_within(split, lim * GiB)
            if a is None and b is None:
                print(f"| {m} | {lim:g} GiB | nothing fits{note} | nothing fits | |", flush=True)
                continue
            gain = f"{round(100 * (b / a - 1), 1) + 0.0:+.1f}%" if a and b else ""      # (no "-0.0%")
            print(f"| {m} | {lim:g} GiB | {a or 0:.2f}{note} | {b or 0:.2f} | {gain} |", flush=True)


if __name__ == "__main__":
    main()
