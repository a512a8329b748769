"""Reproduce the table of docs/validation.md: three plans on gpt2-tiny, 2 ranks x 1 thread on CPU,
two runs each (seeds 0 and 1), predictions from hwprofiles/cpu-2core.yaml (not calibrated).

    python validate/run_table.py [--hw hwprofiles/cpu-2core.yaml] [--out validate/records/table]

CPU step times are only honest when nothing else runs: the six runs go through the campaign
runner (osdp_sim.calibrate.campaign.run_campaign), which waits before each run until the CPUs are
idle and repeats a run (up to --tries times) during which other work took more than --max-other
of the cores (the measure of the record's env.other_cpu_fraction); every attempt is logged to
<out>/campaign-log.jsonl.
"""

import argparse
import subprocess
import sys
from pathlib import Path

from osdp_sim.calibrate.campaign import Campaign, Job, run_campaign
from osdp_sim.cli.common import positive_int, run_script
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable
from osdp_sim.plan import load_plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


MADE_PLANS = ("zero3", "mixed", "ddp")      # what validate/make_plans.py writes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hw", default="hwprofiles/cpu-2core.yaml")
    p.add_argument("--out", default="validate/records/table")
    p.add_argument("--plans", default="zero3,mixed,ddp")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--max-other", type=float, default=0.03)
    p.add_argument("--tries", type=positive_int, default=4)
    args = p.parse_args()
    out = ROOT / args.out
    check_writable(out, "--out", folder=True)          # before the plans and six runs, not after
    if not 0.0 <= args.max_other <= 1.0:
        raise UserError(f"expected a fraction 0-1, got {args.max_other:g}", field="--max-other")
    seeds = [s.strip() for s in args.seeds.split(",")]
    if not all(s.isdigit() for s in seeds):
        raise UserError(f"expected comma-separated whole numbers >= 0, got {args.seeds!r}", field="--seeds")
    unknown = [n for n in args.plans.split(",") if n not in MADE_PLANS]
    if unknown:          # before make_plans.py rewrites validate/plans/, not after
        raise UserError(f"plan file not found: {unknown[0]!r} is none of {', '.join(MADE_PLANS)} "
                        "(validate/make_plans.py)", field="--plans")
    subprocess.run([sys.executable, str(HERE / "make_plans.py")], check=True, cwd=ROOT)
    c = Campaign(name="table", source=__file__, hardware=args.hw, device="cpu", records_dir=out,
                 backend="fsdp2", warmup=3, iters=10, threads=1, seed=0, timeout_s=300, runs=())
    jobs = []
    for name in args.plans.split(","):
        plan = load_plan(HERE / "plans" / f"{name}.json")
        for seed in seeds:
            path = out / f"{name}-s{seed}.json"
            path.unlink(missing_ok=True)              # a fresh table: never an older record
            jobs.append(Job(model=plan.model.name, nproc=plan.devices, plan=plan, seed=int(seed),
                            repeat=0, record_path=path, label=name, field=name))
    s = run_campaign(c, jobs=jobs, max_busy=0.10, max_foreign=args.max_other, attempts=args.tries)
    if s.failed:
        print(f"{len(s.failed)} of {s.total} runs failed: {s.failed}", file=sys.stderr)
        return 1
    subprocess.run([sys.executable, str(HERE / "table.py"), str(out)], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
