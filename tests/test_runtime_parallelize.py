"""Every plan feature, applied for real on 2 gloo ranks (and hybrid sharding on 4), must train
exactly like plain single-process training on the global batch: same loss at every step.

One spawn runs all the 2-rank cases in sequence (spawning costs seconds on 2 cores). Losses must
also fall, and two deliberately broken applications (docs/runtime.md's two traps) must fail the same
check, so a run that does nothing, or does not synchronise, cannot pass.
"""

import pytest

from osdp_sim.model.config import ModelConfig
from osdp_sim.plan.plan import GroupChoice, Plan, uniform_plan
from osdp_sim.runtime.equivalence import Case, reference_losses, run_spawned

pytestmark = pytest.mark.slow

STEPS = 4
FP32_RTOL = 1e-4
BF16_RTOL = 5e-3
SGD_LR = 0.5      # plain SGD on the tiny model needs a large step to move the loss visibly

GPT = ModelConfig(name="gpt2-eq", family="gpt2", n_layers=2, hidden=64, n_heads=4,
                  vocab_size=256, seq_len=32)
LLAMA = ModelConfig(name="llama-eq", family="llama", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
                    vocab_size=256, seq_len=32, ffn_hidden=128, tied_head=False)
BERT = ModelConfig(name="bert-eq", family="bert", n_layers=2, hidden=64, n_heads=4,
                   vocab_size=256, seq_len=32)

DDP, ZERO2, ZERO3 = GroupChoice("ddp"), GroupChoice("zero2"), GroupChoice("zero3")


def plan(cfg: ModelConfig, strategy: str = "zero3", groups: dict | None = None, *,
         devices: int = 2, precision: str = "fp32", checkpoint=None, **kw) -> Plan:
    base = uniform_plan(cfg, strategy, devices=devices, micro_batch=2, precision=precision, **kw)
    out = base.with_choices(choices={**base.choices, **(groups or {})})
    if checkpoint is not None:
        out = out.with_choices(checkpoint=tuple(checkpoint))
    return out


MIXED = {"root": ZERO2, "block0.attn": DDP, "block0.mlp": ZERO2, "block1.attn": ZERO3,
         "block1.mlp": DDP}
SPLITS = {"block0.attn": GroupChoice("ddp", 2, 1), "block0.mlp": GroupChoice("zero2", 4, 2),
          "block1.attn": GroupChoice("zero3", 4, 4), "block1.mlp": GroupChoice("ddp", 4, 3)}
ALL_BLOCKS = ("block0.attn", "block0.mlp", "block1.attn", "block1.mlp")


def _every_block(choice: GroupChoice) -> dict:
    return {k: choice for k in ALL_BLOCKS}


CASES = [
    Case("ddp", plan(GPT, "ddp")),
    Case("zero2", plan(GPT, "zero2")),
    Case("zero3", plan(GPT, "zero3")),
    Case("root_zero3_blocks_ddp", plan(GPT, "ddp", {"root": ZERO3})),
    Case("root_ddp_blocks_zero3", plan(GPT, "zero3", {"root": DDP})),
    Case("mixed", plan(GPT, "zero3", MIXED)),
    Case("ddp_split_2_1", plan(GPT, "ddp", _every_block(GroupChoice("ddp", 2, 1)))),
    Case("zero2_split_4_2", plan(GPT, "zero2", _every_block(GroupChoice("zero2", 4, 2)))),
    Case("zero3_split_4", plan(GPT, "zero3", slices=4)),
    Case("ddp_split_4_3", plan(GPT, "ddp", _every_block(GroupChoice("ddp", 4, 3)))),
    Case("mixed_splits", plan(GPT, "zero3", {**SPLITS, "root": DDP})),
    Case("checkpoint_block0_mixed", plan(GPT, "zero3", MIXED, checkpoint=(True, False))),
    Case("checkpoint_all_splits", plan(GPT, "zero3", SPLITS, checkpoint=(True, True))),
    Case("hybrid_group1_zero3", plan(GPT, "zero3", shard_group=1)),
    Case("hybrid_group1_mixed", plan(GPT, "zero3", MIXED, shard_group=1)),
    Case("hybrid_group2", plan(GPT, "zero3", shard_group=2)),
    Case("bf16_zero3", plan(GPT, "zero3", precision="bf16")),
    Case("bf16_mixed_splits", plan(GPT, "zero3", SPLITS, precision="bf16", checkpoint=(True, False))),
    Case("sgd_ddp", plan(GPT, "ddp", optimizer="sgd"), lr=SGD_LR),
    Case("sgd_zero3", plan(GPT, "zero3", optimizer="sgd"), lr=SGD_LR),
    Case("sgd_mixed_splits", plan(GPT, "zero3", {**SPLITS, **{"root": ZERO2}}, optimizer="sgd"),
         lr=SGD_LR),
    Case("llama_zero3_split_4_checkpoint", plan(LLAMA, "zero3", slices=4, checkpoint=(True, False))),
    Case("llama_mixed_splits", plan(LLAMA, "zero3", {**SPLITS, "root": DDP})),
    Case("bert_mixed", plan(BERT, "zero3", MIXED)),
    Case("bert_splits_checkpoint", plan(BERT, "zero2", SPLITS, checkpoint=(False, True))),
    Case("fairscale_zero3", plan(GPT, "zero3"), backend="fairscale"),
    Case("fairscale_zero2", plan(GPT, "zero2"), backend="fairscale"),
    Case("fairscale_mixed", plan(GPT, "zero3", {"root": ZERO2, "block0.mlp": ZERO2}),
         backend="fairscale"),
    Case("fairscale_zero3_split_4", plan(GPT, "zero3", slices=4), backend="fairscale"),
    Case("fairscale_zero2_split_4_2", plan(GPT, "zero2", _every_block(GroupChoice("zero2", 4, 2))),
         backend="fairscale"),
    Case("fairscale_checkpoint", plan(GPT, "zero3", checkpoint=(True, False)), backend="fairscale"),
    Case("fairscale_bf16", plan(GPT, "zero3", precision="bf16"), backend="fairscale"),
    Case("fairscale_sgd", plan(GPT, "zero3", optimizer="sgd"), backend="fairscale", lr=SGD_LR),
    Case("fairscale_llama", plan(LLAMA, "zero3", {"block0.attn": GroupChoice("zero2", 4, 2)}),
         backend="fairscale"),
    # Negative controls: the two traps of docs/runtime.md (a size-1 mesh per rank; an unwrapped root).
    Case("broken_size1_mesh", plan(GPT, "zero3"), broken="size1_mesh"),
    Case("broken_no_root", plan(GPT, "zero3"), broken="no_root"),
    # User errors, raised on every rank before anything is sharded.
    Case("error_fairscale_ddp", plan(GPT, "zero3", {"block0.mlp": DDP}), backend="fairscale"),
    Case("error_fairscale_ddp_split", plan(GPT, "zero3", {"block0.mlp": GroupChoice("ddp", 2, 1)}),
         backend="fairscale"),
    Case("error_fairscale_hybrid", plan(GPT, "zero3", shard_group=1), backend="fairscale"),
    Case("error_world_size", plan(GPT, "zero3", devices=4)),
]
BY_NAME = {c.name: c for c in CASES}
OK_CASES = [c.name for c in CASES if not c.broken and not c.name.startswith("error_")]

EXPECTED_ERRORS = {
    "error_fairscale_ddp": ("UserError", "'block0.mlp'", "--backend fsdp2"),
    "error_fairscale_ddp_split": ("UserError", "'block0.mlp'", "--backend fsdp2"),
    "error_fairscale_hybrid": ("UserError", "hybrid sharding", "--backend fsdp2"),
    "error_world_size": ("UserError", "plan is for 4 devices", "launch 4"),
}

# What apply_plan must build (parameter elements per mesh shape, units, SplitLinears).
GPT_PARAMS = 118_528
EXPECTED_LAYOUT = {
    "ddp": ({"2x1": GPT_PARAMS}, 5, 0),
    "zero3": ({"2": GPT_PARAMS}, 5, 0),
    "hybrid_group1_zero3": ({"2x1": GPT_PARAMS}, 5, 0),
    "hybrid_group2": ({"2": GPT_PARAMS}, 5, 0),
    # 4 groups + root, plus one unit per sharded slice of each of the 8 Linears
    "zero3_split_4": ({"2": GPT_PARAMS}, 5 + 8 * 4, 8),
    # 5 + 2 Linears per group * j = 5 + 2 * (1 + 2 + 4 + 3); every Linear of the blocks split
    "mixed_splits": (None, 5 + 2 * 10, 8),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("equivalence") / "losses.json"
    return run_spawned(CASES, world=2, steps=STEPS, out_path=str(out))


_REFERENCE: dict = {}


def reference(case: Case) -> list[float]:
    key = (case.plan.model, case.plan.optimizer, case.lr, case.plan.global_batch)
    if key not in _REFERENCE:
        _REFERENCE[key] = reference_losses(case.plan, STEPS, lr=case.lr)
    return _REFERENCE[key]


def _max_rel_diff(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", OK_CASES)
def test_plan_trains_like_single_process(results, name):
    case = BY_NAME[name]
    got = results[name]
    assert "error" not in got, got.get("error")
    losses, ref = got["losses"], reference(case)
    assert len(losses) == STEPS
    rtol = BF16_RTOL if case.plan.precision == "bf16" else FP32_RTOL
    assert losses == pytest.approx(ref, rel=rtol)
    # Training really happened: the loss on the fixed batch falls at every step.
    assert all(b < a - 1e-3 for a, b in zip(losses, losses[1:])), losses


@pytest.mark.parametrize("name", [n for n in OK_CASES if BY_NAME[n].plan.precision == "bf16"])
def test_bf16_really_computes_in_bf16(results, name):
    # Close to the fp32 reference, but not bit-equal to it: the policy was applied.
    assert _max_rel_diff(results[name]["losses"], reference(BY_NAME[name])) > 1e-6


def test_sgd_exposes_gradient_scale(results):
    # AdamW is invariant to a constant gradient scale (a sum instead of a mean over ranks would
    # pass); SGD is not, and its losses must match too.
    assert reference(BY_NAME["sgd_zero3"]) != reference(BY_NAME["zero3"])
    for name in ("sgd_ddp", "sgd_zero3", "sgd_mixed_splits", "fairscale_sgd"):
        assert results[name]["losses"] == pytest.approx(reference(BY_NAME[name]), rel=FP32_RTOL)


@pytest.mark.parametrize("name", ["broken_size1_mesh", "broken_no_root"])
def test_broken_application_fails_the_check(results, name):
    losses, ref = results[name]["losses"], reference(BY_NAME[name])
    assert losses[0] == pytest.approx(ref[0], rel=FP32_RTOL)     # same start...
    assert _max_rel_diff(losses, ref) > 10 * FP32_RTOL           # ...then diverges


@pytest.mark.parametrize("name", sorted(EXPECTED_ERRORS))
def test_unsupported_plans_raise_user_errors(results, name):
    error = results[name].get("error", "")
    for part in EXPECTED_ERRORS[name]:
        assert part in error, error


@pytest.mark.parametrize("name", sorted(EXPECTED_LAYOUT))
def test_plan_builds_the_expected_units(results, name):
    by_mesh, units, splits = EXPECTED_LAYOUT[name]
    got = results[name]
    if by_mesh is not None:
        assert got["param_elems_by_mesh"] == by_mesh
    assert got["fsdp_units"] == units
    assert got["split_linears"] == splits


def test_mixed_plan_puts_ddp_groups_on_the_replicate_mesh(results):
    # ddp groups block0.attn and block1.mlp: 4*64*64+4*64+2*64 = 16768 and 2*64*256+256+64+128
    # = 33216 parameters; everything else is sharded.
    replicated = (4 * 64 * 64 + 4 * 64 + 2 * 64) + (2 * 64 * 256 + 256 + 64 + 2 * 64)
    assert results["mixed"]["param_elems_by_mesh"] == {"2x1": replicated,
                                                       "2": GPT_PARAMS - replicated}


# Hybrid sharding proper needs more ranks than groups of one: 4 processes, shard groups of 2.
HYBRID_CASES = [
    Case("hybrid4_group2_zero3", plan(GPT, "zero3", devices=4, shard_group=2)),
    Case("hybrid4_group2_mixed_splits", plan(GPT, "zero3", {**SPLITS, "root": ZERO2}, devices=4,
                                             shard_group=2, checkpoint=(True, False))),
    Case("hybrid4_group2_sgd", plan(GPT, "zero2", devices=4, shard_group=2, optimizer="sgd"),
         lr=SGD_LR),
]


@pytest.fixture(scope="module")
def hybrid_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("equivalence4") / "losses.json"
    return run_spawned(HYBRID_CASES, world=4, steps=STEPS, out_path=str(out))


@pytest.mark.parametrize("case", HYBRID_CASES, ids=lambda c: c.name)
def test_hybrid_sharding_on_four_ranks(hybrid_results, case):
    got = hybrid_results[case.name]
    assert "error" not in got, got.get("error")
    assert got["losses"] == pytest.approx(reference(case), rel=FP32_RTOL)
    assert all(b < a - 1e-3 for a, b in zip(got["losses"], got["losses"][1:]))
    assert got["param_elems_by_mesh"].get("2x2", 0) > 0      # (replicas, shard) mesh in use


# A rank killed by a signal (gloo's transport aborts the process on a failed connection) says
# nothing about the plan: run_spawned keeps results written before it, else runs once more.
SIGNAL_CASE = Case("zero3_signal", plan(GPT, "zero3"))


def test_a_rank_killed_by_a_signal_costs_one_more_attempt(tmp_path, capfd):
    got = run_spawned([SIGNAL_CASE], world=2, steps=STEPS, out_path=str(tmp_path / "l.json"),
                      faults=("abort_at_start:1", "abort_at_exit:0"))
    assert got[SIGNAL_CASE.name]["losses"] == pytest.approx(reference(SIGNAL_CASE), rel=FP32_RTOL)
    err = capfd.readouterr().err
    assert "attempt 1/2: rank 1 died by SIGABRT before the results were written" in err
    assert "attempt 2/2: rank 0 died by SIGABRT after the results were written; keeping them" in err


def test_a_signal_on_every_attempt_is_raised(tmp_path):
    from torch.multiprocessing.spawn import ProcessException

    with pytest.raises(ProcessException):
        run_spawned([SIGNAL_CASE], world=2, steps=STEPS, out_path=str(tmp_path / "l.json"),
                    faults=("abort_at_start:0", "abort_at_start:1"))
