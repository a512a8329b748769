"""apply_plan refuses what it cannot apply with a one-line UserError, before changing anything;
and reports what it applied. One process (a gloo group of one) and plans for one device."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

transformers = pytest.importorskip("transformers")

import torchtitan_llama  # noqa: E402
from osdp_sim.errors import UserError  # noqa: E402
from osdp_sim.model.config import ModelConfig  # noqa: E402
from osdp_sim.model.layout import GroupLayout, ModelLayout  # noqa: E402
from osdp_sim.plan.plan import GroupChoice, uniform_plan  # noqa: E402
from osdp_sim.runtime import apply_plan  # noqa: E402
from osdp_sim.runtime.equivalence import free_port  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _plan(n_layers=2, devices=1, **choices):
    cfg = ModelConfig(name="p", family="llama", n_layers=n_layers, hidden=64, n_heads=4,
                      vocab_size=256, seq_len=16, ffn_hidden=128, tied_head=False)
    base = uniform_plan(cfg, "zero3", devices=devices, micro_batch=3, grad_accum=2)
    return base.with_choices(choices={**base.choices, **{k.replace("_", "."): v
                                                         for k, v in choices.items()}})


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=16, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def _refused(model, plan, match, **kw):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(UserError) as err:
        apply_plan(model, plan, device=CPU, **kw)
    assert "\n" not in str(err.value)
    assert match in str(err.value), str(err.value)
    assert [n for n, _ in model.named_parameters()] == names           # nothing was changed
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_model_without_a_layout():
    _refused(nn.Sequential(nn.Linear(4, 4)), _plan(), "layout: no built-in layout for Sequential")


def test_a_subclass_of_a_known_class_uses_its_layout():
    from osdp_sim.runtime.apply import resolve_layout

    class MyLlama(transformers.LlamaForCausalLM):
        pass

    assert resolve_layout(MyLlama(_llama().config)).name == "LlamaForCausalLM"


def test_block_count_mismatch():
    _refused(_llama(), _plan(n_layers=3), "model.n_layers: the plan is for 3 blocks, "
             "LlamaForCausalLM has 2 at model.layers")


def test_world_size_mismatch():
    _refused(_llama(), _plan(devices=2), "the plan is for 2 devices but 1 processes are running")


def test_split_that_does_not_divide():
    model = torchtitan_llama.build(dim=52, n_heads=2, n_kv_heads=1, ffn_dim=104)
    _refused(model, _plan(block0_attn=GroupChoice("zero3", 8, 8)),
             "groups.block0.attn.slices: cannot split attention.wq (52 input features) into 8",
             layout=torchtitan_llama.LAYOUT)


def test_a_layout_path_that_is_missing():
    bad = ModelLayout(name="bad", blocks="layers",
                      attn=GroupLayout(("attention_norm", "attn")),
                      mlp=torchtitan_llama.LAYOUT.mlp, root=torchtitan_llama.LAYOUT.root)
    _refused(torchtitan_llama.build(), _plan(), "layout.attn.modules: no module 'layers.0.attn' "
             "in Transformer", layout=bad)


def test_a_parameter_in_no_group():
    no_norm = ModelLayout(name="no-norm", blocks="layers",
                          attn=GroupLayout(("attention",)), mlp=torchtitan_llama.LAYOUT.mlp,
                          root=torchtitan_llama.LAYOUT.root)
    _refused(torchtitan_llama.build(), _plan(), "parameter 'layers.0.attention_norm.weight' is in "
             "a block but in neither its attn nor its mlp group", layout=no_norm)


def test_a_split_of_a_group_with_nothing_to_split():
    no_splits = ModelLayout(name="no-splits", blocks="layers",
                            attn=GroupLayout(("attention_norm", "attention")),
                            mlp=torchtitan_llama.LAYOUT.mlp, root=torchtitan_llama.LAYOUT.root)
    _refused(torchtitan_llama.build(), _plan(block1_attn=GroupChoice("zero3", 2, 2)),
             "groups.block1.attn: the plan splits this group but layout no-splits names no "
             "splittable module in attn", layout=no_splits)


def test_hf_gradient_checkpointing_left_on():
    model = _llama()
    model.gradient_checkpointing_enable()
    _refused(model, _plan(), "checkpointing is on for every layer")


def test_fairscale_on_a_user_model():
    _refused(_llama(), _plan(), "the fairscale backend runs only osdp-sim's built-in modules",
             backend="fairscale")


def test_what_was_applied_is_reported():
    model = _llama()
    plan = _plan(block0_mlp=GroupChoice("ddp", 4, 1)).with_choices(checkpoint=(False, True))
    applied = apply_plan(model, plan, device=CPU)
    assert applied.model is model
    assert (applied.micro_batch, applied.grad_accum, applied.global_batch) == (3, 2, 6)
    assert applied.checkpointed_blocks == (1,)
    assert applied.notes == ("config.use_cache set to False (no key/value cache in training)",)
    assert model.config.use_cache is False
    mlp = applied.groups["block0.mlp"]
    assert mlp.modules == ("model.layers.0.post_attention_layernorm", "model.layers.0.mlp")
    assert (mlp.strategy, mlp.slices, mlp.sharded_slices) == ("ddp", 4, 1)
    assert mlp.split_modules == tuple(f"model.layers.0.mlp.{p}" for p in
                                      ("gate_proj", "up_proj", "down_proj"))
    _refused(model, plan, "the model is already sharded")
