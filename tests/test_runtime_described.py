"""A described module run for real: the plain-torch ViT (tests/vit_module.py), described with
describe_module, trains on 2 gloo ranks under plans applied through apply_plan with its layout
(osdp_sim/runtime/factory.py), cross-entropy on random images and labels; each rank's MemTracker
peak (as the worker measures it) is within 3% of estimate()'s predicted peak."""

import sys
from pathlib import Path

import pytest
import torch

from osdp_sim.costmodel.estimate import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model import describe_module
from osdp_sim.plan.plan import GroupChoice, uniform_plan

sys.path.insert(0, str(Path(__file__).parent))
import vit_module as vm  # noqa: E402

pytestmark = pytest.mark.slow

HW = Path(__file__).resolve().parents[1] / "hwprofiles" / "cpu-2core.yaml"
MICRO_BATCH = 16
TOLERANCE = 0.03


def plans(spec):
    zero3 = uniform_plan(spec.config, "zero3", devices=2, micro_batch=MICRO_BATCH)
    mixed = {**zero3.choices, "root": GroupChoice("ddp"), "block0.attn": GroupChoice("zero2"),
             "block0.mlp": GroupChoice("zero3", 2, 2), "block1.mlp": GroupChoice("ddp")}
    return {"zero3_checkpoint_block1": zero3.with_choices(choices=zero3.choices, checkpoint=(False, True)),
            "mixed_split_checkpoint_block1": zero3.with_choices(choices=mixed, checkpoint=(False, True))}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from osdp_sim.runtime.factory import run_factory_plans
    a = vm.ViTArgs()
    images, labels = vm.batch(a, 2, torch.Generator().manual_seed(0))
    spec = describe_module(vm.ViT(a), (images, labels), layout=vm.LAYOUT, name="vit-tiny")
    ps = plans(spec)
    out = tmp_path_factory.mktemp("described") / "results.json"
    return spec, ps, run_factory_plans("vit_module:runnable", ps, str(out))


@pytest.mark.parametrize("name", ["zero3_checkpoint_block1", "mixed_split_checkpoint_block1"])
def test_measured_peak_within_3_percent_of_the_estimate(measured, name):
    spec, ps, results = measured
    predicted = estimate(spec, load_profile(HW), ps[name]).peak_memory_bytes
    per_rank = results[name]["per_rank"]
    assert len(per_rank) == 2
    for r in per_rank:
        assert "error" not in r, r
        assert r["tracker_error"] is None
        assert all(l == l and 0 < l < 10 for l in r["losses"])          # trained, finite
        peak = r["tracker_peak_bytes"]
        print(f"{name}: predicted {predicted:.0f} measured {peak} ({(predicted - peak) / peak:+.2%})")
        assert abs(predicted - peak) <= TOLERANCE * peak
