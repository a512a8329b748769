#!/bin/sh
# Reproduce the table of docs/validation.md: three plans on gpt2-tiny, 2 ranks x 1 thread on CPU,
# two runs each (seeds 0 and 1), predictions from hwprofiles/cpu-2core.yaml (not calibrated).
# Run it on an otherwise idle machine: other work inflates CPU step times.
cd "$(dirname "$0")/.." || exit 1
python validate/make_plans.py
for plan in zero3 mixed ddp; do
  for seed in 0 1; do
    osdp-sim validate --plan "validate/plans/$plan.json" --hw hwprofiles/cpu-2core.yaml \
      --warmup 3 --iters 10 --seed "$seed" --records-dir validate/records/table
  done
done
python validate/table.py validate/records/table
