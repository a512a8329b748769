"""How estimate() scales with the number of layers: seconds per estimate of a uniform ZeRO-3 plan
of a small Llama-style model at N and 10 N layers, and their ratio (10 means linear).

    python bench/estimate_scaling.py [--layers 1000] [--factor 10] [--hw cpu-2core]

The model is the 2-layer Llama-style YAML of tests/test_model_spec.py (hidden 64) with more layers;
spec building and the estimate are timed, loading the profile is not.
"""

import argparse
import time

from osdp_sim.cli.common import positive_int, run_script
from osdp_sim.costmodel import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import ModelConfig
from osdp_sim.model.spec import build_spec
from osdp_sim.plan import uniform_plan


def small_llama(layers: int) -> ModelConfig:
    return ModelConfig(name=f"llama-{layers}l-h64", family="llama", n_layers=layers, hidden=64, n_heads=4,
                       n_kv_heads=2, ffn_hidden=172, vocab_size=100, seq_len=32,
                       tied_head=False)


def estimate_s(layers: int, hw) -> float:
    t0 = time.perf_counter()
    cfg = small_llama(layers)
    plan = uniform_plan(cfg, "zero3", devices=hw.device.count, micro_batch=1)
    estimate(build_spec(cfg), hw, plan)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=positive_int, default=1000)
    ap.add_argument("--factor", type=positive_int, default=10)
    ap.add_argument("--hw", default="cpu-2core")
    args = ap.parse_args()
    hw = load_profile(args.hw)
    small, large = args.layers, args.layers * args.factor
    t_small, t_large = estimate_s(small, hw), estimate_s(large, hw)
    print(f"estimate, {small:,} layers: {t_small:.3f} s")
    print(f"estimate, {large:,} layers: {t_large:.3f} s")
    print(f"ratio {t_large / t_small:.1f} for {args.factor}x the layers "
          f"({args.factor} is linear, {args.factor ** 2} quadratic)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
