"""Operator splitting on real Hugging Face modules keeps the model's function and its state_dict:
a checkpoint saved by save_pretrained (safetensors) from the unsplit model loads into the split
one, and the split model saves a checkpoint the unsplit model loads, with identical keys,
shapes, tensors and outputs. Covers nn.Linear with and without bias (Llama, Qwen2), fused
projections (Phi3 qkv_proj / gate_up_proj), GPT-2's Conv1D ([in, out] weights) and Mixtral's
fused 3-D experts (cut along the experts). Single process, no sharding: the split itself.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from osdp_sim.errors import UserError  # noqa: E402
from osdp_sim.model.config import ModelConfig  # noqa: E402
from osdp_sim.model.layout import HF_LAYOUTS  # noqa: E402
from osdp_sim.plan.plan import GroupChoice, uniform_plan  # noqa: E402
from osdp_sim.runtime.apply import split_groups  # noqa: E402
from osdp_sim.runtime.split_linear import SplitExperts, SplitLinear  # noqa: E402

H, F, V, L = 32, 64, 64, 2
COMMON = dict(hidden_size=H, intermediate_size=F, num_hidden_layers=L, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)


def _configs():
    return {
        "LlamaForCausalLM": transformers.LlamaConfig(**COMMON),
        "Qwen2ForCausalLM": transformers.Qwen2Config(**COMMON),
        "Phi3ForCausalLM": transformers.Phi3Config(**COMMON),
        "MixtralForCausalLM": transformers.MixtralConfig(**COMMON, num_local_experts=4,
                                                         num_experts_per_tok=2),
        "GPT2LMHeadModel": transformers.GPT2Config(n_embd=H, n_layer=L, n_head=4, vocab_size=V,
                                                   n_positions=64, bos_token_id=1, eos_token_id=2,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    }


def _plan(slices_attn: int, slices_mlp: int):
    cfg = ModelConfig(name="plan-for-hf", family="llama", n_layers=L, hidden=H, n_heads=4,
                      vocab_size=V, seq_len=16, ffn_hidden=F, tied_head=False)
    base = uniform_plan(cfg, "zero3", devices=2, micro_batch=1, precision="fp32")
    return base.with_choices(choices={**base.choices,
                                      "block0.attn": GroupChoice("ddp", slices_attn, 1),
                                      "block0.mlp": GroupChoice("zero3", slices_mlp, slices_mlp),
                                      "block1.mlp": GroupChoice("zero2", 2, 1)})


def _build(arch: str, seed: int):
    torch.manual_seed(seed)
    model = getattr(transformers, arch)._from_config(_configs()[arch], attn_implementation="eager")
    return model.eval()


def _shapes(sd) -> dict:
    return {k: tuple(v.shape) for k, v in sd.items()}


@pytest.mark.parametrize("arch", sorted(_configs()))
def test_split_model_loads_and_saves_the_unsplit_checkpoint(arch, tmp_path):
    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(0))
    original = _build(arch, seed=0)
    original.save_pretrained(tmp_path / "unsplit", safe_serialization=True)
    with torch.no_grad():
        want = original(input_ids=ids).logits
    want_sd = original.state_dict()

    split = _build(arch, seed=1)                 # other weights: the load must replace them all
    done = split_groups(split, _plan(4, 2))
    split_modules = [m for ms in done.values() for m in ms]
    assert split_modules and all(isinstance(m, (SplitLinear, SplitExperts)) for m in split_modules)
    assert any(".slices.1." in n for n, _ in split.named_parameters())      # really cut
    assert list(split.state_dict()) == list(want_sd)                       # same keys, same order
    assert _shapes(split.state_dict()) == _shapes(want_sd)

    loaded = safetensors_torch.load_file(str(tmp_path / "unsplit" / "model.safetensors"))
    if arch == "MixtralForCausalLM":
        # transformers 5.x writes Mixtral in the published per-expert format
        # (block_sparse_moe.experts.{e}.w1 ...) and converts on load: read it through
        # from_pretrained, then load that state_dict into the split model.
        assert any("block_sparse_moe.experts.0.w1" in k for k in loaded)
        loaded = getattr(transformers, arch).from_pretrained(tmp_path / "unsplit").state_dict()
    result = split.load_state_dict(loaded, strict=False)
    # Tied weights (GPT-2's lm_head) are saved once; nothing else may be missing.
    assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys
    with torch.no_grad():
        got = split(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    split.save_pretrained(tmp_path / "split", safe_serialization=True)
    saved = safetensors_torch.load_file(str(tmp_path / "split" / "model.safetensors"))
    reference = safetensors_torch.load_file(str(tmp_path / "unsplit" / "model.safetensors"))
    assert _shapes(saved) == _shapes(reference)
    for key in reference:
        torch.testing.assert_close(saved[key], reference[key], rtol=0, atol=0)
    back = getattr(transformers, arch).from_pretrained(tmp_path / "split",
                                                       attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_gradients_of_split_experts_match_the_fused_module():
    model = _build("MixtralForCausalLM", seed=0).train()
    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    split = _build("MixtralForCausalLM", seed=0).train()
    split_groups(split, _plan(2, 4))
    split(input_ids=ids, labels=ids).loss.backward()
    experts = split.model.layers[0].mlp.experts
    got = torch.cat([s.gate_up_proj.grad for s in experts.slices])
    torch.testing.assert_close(got, want["model.layers.0.mlp.experts.gate_up_proj"],
                               rtol=1e-5, atol=1e-6)


def test_split_count_must_divide_what_is_cut():
    model = _build("MixtralForCausalLM", seed=0)
    plan = _plan(2, 2)
    plan = plan.with_choices(choices={**plan.choices, "block0.mlp": GroupChoice("zero3", 8, 8)})
    with pytest.raises(UserError, match=r"groups.block0.mlp.slices: cannot split mlp.experts "
                                        r"\(4 experts\) into 8"):
        split_groups(model, plan)
    with pytest.raises(UserError, match="plan is for 3 blocks"):
        split_groups(_build("LlamaForCausalLM", seed=0),
                     uniform_plan(ModelConfig(name="x", family="llama", n_layers=3, hidden=H,
                                              n_heads=4, vocab_size=V, seq_len=16, tied_head=False),
                                  "zero3", devices=2, micro_batch=1))


@pytest.mark.parametrize("arch", sorted(HF_LAYOUTS))
def test_every_built_in_layout_matches_its_transformers_class(arch):
    """Every path exists and every parameter lies in one group or the root (on the meta device)."""
    from osdp_sim.runtime.apply import _check_coverage, blocks_of

    cfgs = {**_configs(),
            "MistralForCausalLM": transformers.MistralConfig(**COMMON),
            "GemmaForCausalLM": transformers.GemmaConfig(**COMMON, head_dim=16),
            "BertForMaskedLM": transformers.BertConfig(hidden_size=H, num_hidden_layers=L,
                                                       num_attention_heads=4, intermediate_size=F,
                                                       vocab_size=V)}
    with torch.device("meta"):
        model = getattr(transformers, arch)(cfgs[arch])
    layout = HF_LAYOUTS[arch]
    blocks = blocks_of(model, layout)
    assert len(blocks) == L
    layout.check_paths([n for n, _ in model.named_modules()], [k for k, _ in blocks], model=arch)
    _check_coverage(model, layout, blocks)
