"""Print the measured-vs-predicted table of docs/validation.md from the records in a folder.

    python validate/table.py [validate/records] [--predict PROFILE]

On GPU records two more columns: torch.cuda.max_memory_allocated against MemTracker's peak, and
max_memory_reserved against max_memory_allocated.

The predictions are those stored in each record (the cost model when the run was made); with
--predict they are computed again by the current cost model with PROFILE (no run is repeated).
"""

import argparse
import sys
from pathlib import Path

from osdp_sim.calibrate.runs import plan_label
from osdp_sim.cli.common import run_script
from osdp_sim.records import load_records

HERE = Path(__file__).resolve().parent
MiB = 2**20


def predict(record, profile) -> tuple[dict, dict]:
    """(predicted, errors) of one record by the current cost model, like validate stores them."""
    from osdp_sim.costmodel import estimate
    from osdp_sim.model.spec import build_spec
    e = estimate(build_spec(record.model), profile, record.plan)
    m = record.data["measured"]
    t, mem = m["iteration_time_s"]["mean"], m["peak_memory_bytes"]
    return ({"iteration_time_s": e.iteration_time_s, "peak_memory_bytes": e.peak_memory_bytes},
            {"iteration_time_rel": e.iteration_time_s / t - 1 if t else None,
             "peak_memory_rel": e.peak_memory_bytes / mem - 1 if mem else None})


def rows(folder, profile=None) -> list[str]:
    records = load_records([folder])
    cuda = any(_cuda(r) for r in records)
    head = ("| plan | seed | status | step time measured (mean ± std) | predicted | error | "
            "peak memory measured | predicted | error | other work |")
    if cuda:        # GPU records: the allocator's own peaks beside MemTracker's live-tensor peak
        head += " cuda max allocated | cuda max reserved |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    order = {"zero3": 0, "mixed": 1, "ddp": 2}
    records.sort(key=lambda r: (order.get(r.plan.notes.get("name"), 9), r.data["settings"]["seed"]))
    for r in records:
        d = r.data
        t, m = d["measured"]["iteration_time_s"], d["measured"]
        p, e = predict(r, profile) if profile is not None else (d["predicted"] or {}, d["errors"] or {})
        name = r.plan.notes.get("name") or f"{r.model.name} {plan_label(r.plan)}"
        row = (f"| {name} | {d['settings']['seed']} | {d['status']} "
               f"| {_ms(t['mean'])} ± {_ms(t['std'])} | {_ms(p.get('iteration_time_s'))} "
               f"| {_pct(e.get('iteration_time_rel'))} "
               f"| {_mib(m['peak_memory_bytes'])} | {_mib(p.get('peak_memory_bytes'))} "
               f"| {_pct(e.get('peak_memory_rel'))} "
               f"| {_pct0(d['env'].get('other_cpu_fraction'))} |")
        if cuda:
            alloc, reserved = _cuda(r) or (None, None)
            row += f" {_vs(alloc, m['peak_memory_bytes'])} | {_vs(reserved, alloc)} |"
        out.append(row)
    return out


def _cuda(record) -> tuple[float, float] | None:
    """(max allocated, max reserved) bytes, largest over the ranks, when the run was on CUDA."""
    ranks = record.data["measured"]["memory"]["per_rank"]
    alloc = [m["cuda_max_allocated_bytes"] for m in ranks if m.get("cuda_max_allocated_bytes") is not None]
    reserved = [m["cuda_max_reserved_bytes"] for m in ranks if m.get("cuda_max_reserved_bytes") is not None]
    return (max(alloc), max(reserved)) if alloc and reserved else None


def _vs(v, base) -> str:
    """v in MiB and relative to base (the column before it)."""
    return "-" if v is None else f"{_mib(v)} ({_pct(v / base - 1) if base else '-'})"


def _ms(v):
    return "-" if v is None else f"{v * 1e3:.1f} ms"


def _mib(v):
    return "-" if v is None else f"{v / MiB:.1f} MiB"


def _pct0(v):
    return "-" if v is None else f"{v * 100:.0f}%"


def _pct(v):
    return "-" if v is None else f"{v * 100:+.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description="Print the measured-vs-predicted table from records.")
    ap.add_argument("records", nargs="?", default=str(HERE / "records"), help="a records folder or file")
    ap.add_argument("--predict", metavar="PROFILE",
                    help="recompute the predictions with the current cost model and this profile")
    args = ap.parse_args()
    profile = None
    if args.predict:
        from osdp_sim.hardware.load import load_profile
        profile = load_profile(args.predict)
    print("\n".join(rows(args.records, profile)))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
