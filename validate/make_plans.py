"""Write the plans behind docs/validation.md into validate/plans/.

    python validate/make_plans.py [--model gpt2-tiny] [--micro-batch 4] [--devices 2]

zero3.json  every group ZeRO-3 (FSDP full shard)
ddp.json    every group replicated (DDP)
mixed.json  root (embedding + head) DDP; blocks 0-1 ZeRO-3 with each MLP split into 4 sharded
            slices and checkpointed; blocks 2-3 (and later) DDP with each MLP split into 4 slices
            of which 2 are ZeRO-3. Its memory should lie between the two uniform plans.
"""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from osdp_sim.cli.common import positive_int, run_script
from osdp_sim.fileio import check_writable
from osdp_sim.model.load import load_model_config
from osdp_sim.plan import GroupChoice, save_plan, uniform_plan

HERE = Path(__file__).resolve().parent


def plans(model: str, micro_batch: int, devices: int, precision: str) -> dict:
    cfg = load_model_config(model)
    kw = dict(devices=devices, micro_batch=micro_batch, precision=precision)
    zero3 = uniform_plan(cfg, "zero3", **kw, notes={"made_by": "validate/make_plans.py", "name": "zero3"})
    ddp = uniform_plan(cfg, "ddp", **kw, notes={"made_by": "validate/make_plans.py", "name": "ddp"})
    half = cfg.n_layers // 2
    choices = dict(ddp.choices)
    for i in range(cfg.n_layers):
        if i < half:
            choices[f"block{i}.attn"] = GroupChoice("zero3")
            choices[f"block{i}.mlp"] = GroupChoice("zero3", slices=4, sharded_slices=4)
        else:
            choices[f"block{i}.mlp"] = GroupChoice("ddp", slices=4, sharded_slices=2)
    mixed = replace(ddp, choices=choices, checkpoint=tuple(i < half for i in range(cfg.n_layers)),
                    notes={"made_by": "validate/make_plans.py", "name": "mixed"})
    return {"zero3": zero3, "ddp": ddp, "mixed": mixed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--micro-batch", type=positive_int, default=4)
    p.add_argument("--devices", type=positive_int, default=2)
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("--out", default=str(HERE / "plans"))
    args = p.parse_args()
    check_writable(args.out, "--out", folder=True)
    for name, plan in plans(args.model, args.micro_batch, args.devices, args.precision).items():
        path = Path(args.out) / f"{name}.json"
        save_plan(plan, path)
        print(path)


if __name__ == "__main__":
    sys.exit(run_script(main))
