"""A searched plan applied with osdp_sim.runtime.apply_plan to models osdp-sim did not write
trains exactly like single-process training on the global batch, on 2 gloo ranks.

Models: a tiny Hugging Face LlamaForCausalLM and MixtralForCausalLM (transformers 5.x, fp32,
attn_implementation="sdpa", Mixtral's experts fused 3-D parameters) recognised from their class,
a GPT2LMHeadModel (Conv1D weights stored [in, out], head tied to the embedding), and a
torchtitan-style Llama in plain torch run through its layout (tests/torchtitan_llama.py).
Each plan mixes ddp / zero2 / zero3, splits (Linear slices; Mixtral: expert slices) and
checkpointing on some blocks. Checked per case: the losses of 3 steps, that the checkpointed
blocks' groups ran forward twice in a step (the recompute) and the others once, and that the
sharded model's state_dict has the unsharded model's keys and shapes. Negative controls: every
unit on a size-one mesh per rank (no gradient sync: the losses must diverge), and a plan without
checkpointing (counts of 1). One spawn runs every case.
"""

import pytest

pytest.importorskip("transformers")

import apply_equivalence as eq  # noqa: E402
from osdp_sim.plan.plan import GroupChoice  # noqa: E402
from osdp_sim.runtime.equivalence import run_spawned  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 3
FP32_RTOL = 1e-4
BF16_RTOL = 5e-3
DDP, ZERO2, ZERO3 = GroupChoice("ddp"), GroupChoice("zero2"), GroupChoice("zero3")

LLAMA_PLAN = eq.make_plan({"root": ZERO2, "block0.attn": GroupChoice("ddp", 2, 1),
                           "block0.mlp": GroupChoice("zero3", 4, 4), "block1.attn": ZERO2,
                           "block1.mlp": GroupChoice("ddp", 4, 3)}, checkpoint=(True, False))
# Mixtral (4 experts): block0's experts in 2 slices of 2 (1 sharded), block1's in 4 of 1.
MIXTRAL_PLAN = eq.make_plan({"root": DDP, "block0.attn": ZERO3,
                             "block0.mlp": GroupChoice("zero2", 2, 1), "block1.attn": DDP,
                             "block1.mlp": GroupChoice("zero3", 4, 4)}, checkpoint=(False, True))
TITAN_PLAN = eq.make_plan({"root": ZERO3, "block0.attn": GroupChoice("zero2", 4, 2),
                           "block0.mlp": DDP, "block1.attn": GroupChoice("zero3", 2, 2),
                           "block1.mlp": GroupChoice("ddp", 2, 1)}, checkpoint=(True, True))

GPT2_PLAN = eq.make_plan({"root": DDP, "block0.attn": GroupChoice("zero3", 4, 4),
                          "block0.mlp": GroupChoice("zero2", 2, 1), "block1.mlp": ZERO2},
                         checkpoint=(False, True))

CASES = [
    eq.ModelCase("hf_llama", "llama", LLAMA_PLAN),
    eq.ModelCase("hf_mixtral", "mixtral", MIXTRAL_PLAN),
    eq.ModelCase("torchtitan_llama", "torchtitan", TITAN_PLAN),
    eq.ModelCase("hf_gpt2", "gpt2", GPT2_PLAN),
    eq.ModelCase("hf_llama_bf16_hybrid", "llama",
                 eq.make_plan({"block0.mlp": GroupChoice("zero2", 2, 1)}, checkpoint=(False, True),
                              precision="bf16", shard_group=1)),
    # Negative controls.
    eq.ModelCase("hf_llama_no_checkpoint", "llama", eq.make_plan({})),
    eq.ModelCase("broken_hf_llama_size1_mesh", "llama", LLAMA_PLAN, broken="size1_mesh"),
]
BY_NAME = {c.name: c for c in CASES}
TRAINED = ["hf_llama", "hf_mixtral", "torchtitan_llama", "hf_gpt2", "hf_llama_bf16_hybrid",
           "hf_llama_no_checkpoint"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("apply_hf") / "results.json"
    return run_spawned(CASES, world=2, steps=STEPS, out_path=str(out), target=eq.run)


_REFERENCE: dict = {}


def reference(case: eq.ModelCase) -> list[float]:
    if case.model not in _REFERENCE:
        _REFERENCE[case.model] = eq.reference_losses(case, STEPS)
    return _REFERENCE[case.model]


def _max_rel_diff(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", TRAINED)
def test_plan_trains_like_single_process(results, name):
    case, got = BY_NAME[name], results[name]
    assert "error" not in got, got.get("error")
    rtol = BF16_RTOL if case.plan.precision == "bf16" else FP32_RTOL
    assert got["losses"] == pytest.approx(reference(case), rel=rtol)
    assert all(b < a - 1e-3 for a, b in zip(got["losses"], got["losses"][1:])), got["losses"]
    if case.plan.precision == "bf16":
        assert _max_rel_diff(got["losses"], reference(case)) > 1e-6


@pytest.mark.parametrize("name", TRAINED)
def test_checkpointed_blocks_recompute(results, name):
    case, got = BY_NAME[name], results[name]
    expected = [[2, 2] if on else [1, 1] for on in case.plan.checkpoint]
    assert got["forward_counts"] == expected
    assert got["checkpointed_blocks"] == [i for i, on in enumerate(case.plan.checkpoint) if on]


@pytest.mark.parametrize("name", TRAINED)
def test_sharded_model_keeps_the_unsharded_state_dict(results, name):
    got = results[name]
    assert got["state_dict_shapes"] == eq.unsharded_state_dict_shapes(BY_NAME[name].model)


@pytest.mark.parametrize("name", TRAINED)
def test_state_dict_loads_into_a_fresh_sharded_model(results, name):
    got = results[name]
    assert got["loss_resumed"] == pytest.approx(got["loss_trained"], rel=1e-6)
    assert got["loss_trained"] < got["losses"][0]          # trained weights, not the initial ones


def test_splits_really_built(results):
    # llama: block0.attn 4 Linears (2 slices, 1 sharded), block0.mlp 3 (4 of 4), block1.mlp 3
    # (4, 3 sharded): 10 SplitLinears; units: 4 groups + root + 4*1 + 3*4 + 3*3.
    assert results["hf_llama"]["split_linears"] == 10
    assert results["hf_llama"]["fsdp_units"] == 5 + 4 + 12 + 9
    # mixtral: two SplitExperts, units 5 + 1 + 4.
    assert results["hf_mixtral"]["split_experts"] == 2
    assert results["hf_mixtral"]["fsdp_units"] == 5 + 1 + 4
    assert results["torchtitan_llama"]["split_linears"] == 4 + 4 + 3
    assert results["hf_gpt2"]["split_linears"] == 2 + 2              # Conv1D c_attn, c_proj, c_fc, c_proj
    assert results["hf_llama_bf16_hybrid"]["param_elems_by_mesh"].keys() == {"2x1"}


def test_broken_application_fails_the_check(results):
    got, ref = results["broken_hf_llama_size1_mesh"]["losses"], reference(BY_NAME["hf_llama"])
    assert got[0] == pytest.approx(ref[0], rel=FP32_RTOL)
    assert _max_rel_diff(got, ref) > 10 * FP32_RTOL
