"""describe_module (osdp_sim/model/describe.py): any torch module described by measurement.

Checked: the runtime's own modules (gpt2-tiny, llama-tiny) reproduce build_spec's description;
a transformers LlamaForCausalLM matches its config.json description (parameters, FLOPs) and what
hf_measure measures on the real model (saved bytes); a 7B-sized module built on the meta device
is described in seconds; a small hand-computed module; the described model round-trips through
a model YAML and a plan file, and estimate and search take it.
"""

import json
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osdp_sim.errors import UserError
from osdp_sim.model import build_spec, describe_module, load_model, load_model_config
from osdp_sim.model.described import described_yaml
from osdp_sim.model.layout import builtin_layout

sys.path.insert(0, str(Path(__file__).parent))
import torchtitan_llama as tt  # noqa: E402
import vit_module as vm  # noqa: E402

HW = str(Path(__file__).resolve().parents[1] / "hwprofiles" / "cpu-2core.yaml")


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-12)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_builtin_modules_reproduce_build_spec(name):
    from osdp_sim.runtime.modules import build_model
    cfg = load_model_config(name)
    idx = torch.zeros(2, cfg.seq_len, dtype=torch.long)
    spec = describe_module(build_model(cfg), (idx, idx), layout=builtin_layout(cfg.family), name=name)
    ref = build_spec(cfg)
    assert [g.name for g in spec.groups] == [g.name for g in ref.groups]
    assert spec.seq_len == cfg.seq_len and spec.config.hidden == cfg.hidden
    assert spec.config.vocab_size == cfg.vocab_size            # logits per token
    for g, r in zip(spec.groups, ref.groups):
        assert g.param_count == r.param_count, g.name
        assert [(l.in_features, l.out_features, l.bias) for l in g.linears] == \
            [(l.in_features, l.out_features, l.bias) for l in r.linears], g.name
        assert _close(g.fwd_flops_per_token, r.fwd_flops_per_token, 0.01), g.name
        for dtype_bytes in (2, 4):
            assert _close(g.activations.bytes_per_token(dtype_bytes),
                          r.activations.bytes_per_token(dtype_bytes), 0.01), (g.name, dtype_bytes)
    for u, r in zip(spec.blocks, ref.blocks):
        assert u.ckpt_activations == r.ckpt_activations
    assert spec.param_count == ref.param_count


def test_a_hand_computed_mlp_without_a_layout():
    """Blocks found as the ModuleList, split at the child named mlp; Linear(4, 8) -> GELU ->
    Linear(8, 4) on 3 tokens keeps fc1's input (4), GELU's input (8) and fc2's input (8): 20
    elements per token; forward 2*4*8 + 2*8*4 = 128 FLOP per token."""
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Linear(4, 4, bias=False)
            self.mlp = Mlp()

        def forward(self, x):
            return self.mlp(self.scale(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x.sum()

    spec = describe_module(Net(), torch.zeros(1, 3, 4))
    mlp = spec.groups[2]
    assert mlp.name == "block0.mlp" and mlp.param_count == 4 * 8 + 8 + 8 * 4 + 4
    assert mlp.fwd_flops_per_token == 128.0
    assert mlp.activations.elems_per_token == 20.0 and mlp.activations.fixed_bytes_per_token == 0.0
    # Backward transient: at GELU's backward its gradient (8) and that of fc2's input (8) are
    # live and fc2's saved input (8) is freed; less the input gradient it returns (4, the cost
    # model's act_grad): 4 elements per token.
    assert mlp.bwd_temp.elems_per_token == 4.0 and mlp.bwd_temp.fixed_bytes_per_token == 0.0
    attn = spec.groups[1]               # the block's `scale` Linear: keeps its input (4 elements)
    assert attn.param_count == 16 and attn.activations.elems_per_token == 4.0
    assert spec.seq_len == 3 and spec.config.hidden == 4 and spec.config.n_layers == 2


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    hc = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=64, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    return hc, transformers.LlamaForCausalLM(hc).float()


def test_transformers_llama_matches_config_json_and_hf_measure(tmp_path):
    from osdp_sim.model.layout import hf_layout
    from osdp_sim.runtime.hf_measure import measure_hf
    hc, model = _tiny_llama()
    ids = torch.randint(0, 512, (2, 32))
    spec = describe_module(model, {"input_ids": ids, "labels": ids}, layout=hf_layout("LlamaForCausalLM"))
    hc.save_pretrained(tmp_path)
    ref = load_model(str(tmp_path / "config.json"), seq_len=32, notes=[])
    measured = measure_hf(model, ids)
    tokens = ids.numel()
    d = spec.config.described                   # the saved bytes as measured, group by group
    saved = [d.embed] + [g for b in d.block_list(2) for g in (b.attn, b.mlp)] + [d.head]
    for g, r, s in zip(spec.groups, ref.groups, saved, strict=True):
        assert g.param_count == r.param_count, g.name
        assert g.fwd_flops_per_token == r.fwd_flops_per_token, g.name
        assert _close(s.activations.bytes_per_token(4) * tokens, measured["saved_bytes"][g.name], 0.01), g.name
        # and the config.json description (implementation 'hf') predicts the same bytes
        assert _close(s.activations.bytes_per_token(4) * tokens, r.activations.bytes_for(4, tokens), 0.01), g.name
    # transformers saves a shifted copy of the labels: the caller's labels are held beside it
    assert d.input_fixed_bytes_per_token == 8.0 and d.input_elems_per_token == 0.0


def test_a_7b_module_on_meta_is_described_in_seconds():
    args = tt.ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000,
                        ffn_dim=11008, max_seq_len=2048)
    with torch.device("meta"):
        model = tt.Transformer(args)
    assert all(p.is_meta for p in model.parameters())       # no real memory behind it
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    start = time.perf_counter()
    spec = describe_module(model, ids, layout=tt.LAYOUT,
                           loss=lambda logits: logits.logsumexp(-1).mean())
    assert time.perf_counter() - start < 60
    ref = load_model("llama-7b")
    assert spec.param_count == ref.param_count == 6_738_415_616
    assert spec.fwd_flops_per_token == ref.fwd_flops_per_token
    assert all(p.is_meta for p in model.parameters())


@pytest.fixture(scope="module")
def vit_spec():
    a = vm.ViTArgs()
    images, labels = vm.batch(a, 2, torch.Generator().manual_seed(0))
    return describe_module(vm.ViT(a), (images, labels), layout=vm.LAYOUT, name="vit-tiny")


def test_loss_given_as_a_callable_is_the_same_description(vit_spec):
    a = vm.ViTArgs()
    images, labels = vm.batch(a, 2, torch.Generator().manual_seed(0))
    spec = describe_module(vm.ViT(a), images, layout=vm.LAYOUT, name="vit-tiny",
                           loss=lambda logits: F.cross_entropy(logits.float(), labels))
    assert spec.units == vit_spec.units
    assert vit_spec.seq_len == 65 and vit_spec.config.hidden == 128
    assert vit_spec.config.vocab_size == 1                  # 10 classes over 65 tokens: 1
    # The caller's fp32 images (3 x 32 x 32 x 4 B per 65 tokens): saved as themselves in fp32,
    # held beside their bf16 cast in bf16 (4x bytes): -2x elements and 8x fixed bytes, x = 3072 / 65.
    x = 3 * 32 * 32 / 65
    d = vit_spec.config.described
    assert d.input_elems_per_token == pytest.approx(-2 * x) and d.input_fixed_bytes_per_token == pytest.approx(8 * x)


def test_described_yaml_round_trips_and_errors_name_the_key(vit_spec, tmp_path):
    path = tmp_path / "vit.yaml"
    path.write_text(described_yaml(vit_spec.config))
    back = load_model(str(path))
    assert back.units == vit_spec.units and back.config.family == "described"
    text = path.read_text().replace("act_elems_per_token", "act_elemz_per_token", 1)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(UserError, match=r"described\.embed\.act_elemz_per_token"):
        load_model(str(tmp_path / "bad.yaml"))
    from osdp_sim.cli.main import main
    assert main(["models", str(path)]) == 0


def test_a_plan_of_a_described_model_is_self_contained(vit_spec, tmp_path):
    from osdp_sim.plan import load_plan, save_plan
    from osdp_sim.plan.plan import uniform_plan
    plan = uniform_plan(vit_spec.config, "zero3", devices=2, micro_batch=4)
    save_plan(plan, tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["version"] == 4 and data["model"]["described"]["blocks"]
    from json_schema import validate
    assert validate(data) == []                # the documented plan format (docs/json.md)
    loaded = load_plan(tmp_path / "p.json")
    assert loaded == plan and build_spec(loaded.model).units == vit_spec.units
    data["version"] = 2                        # format 2 has no described models
    (tmp_path / "v2.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="model.described"):
        load_plan(tmp_path / "v2.json")
    data["version"] = 3
    data["model"]["n_layers"] = 3
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(UserError):
        load_plan(tmp_path / "bad.json")


def test_estimate_and_search_take_a_described_model(vit_spec):
    from osdp_sim import api
    from osdp_sim.plan.plan import uniform_plan
    plan = uniform_plan(vit_spec.config, "zero3", devices=2, micro_batch=4)
    est = api.estimate(vit_spec, HW, plan)
    assert est.peak_memory_bytes > 0 and est.iteration_time_s > 0
    found = api.search(vit_spec, HW, "64MiB", time_limit_s=30, micro_batches=(1, 2))
    assert found.plan is not None and found.plan.model == vit_spec.config


def test_the_cost_model_holds_a_groups_backward_transient_during_its_backward(vit_spec):
    """Lowering charges bwd_temp x tokens (activation dtype) as temporaries for the group's
    backward step: with the peak in block1.mlp's backward, taking block1.mlp's transient away
    lowers the peak by exactly that many bytes."""
    from dataclasses import replace

    from osdp_sim.costmodel.estimate import estimate
    from osdp_sim.hardware.load import load_profile
    from osdp_sim.model.spec import Activations, ModelSpec
    from osdp_sim.plan.plan import uniform_plan
    hw = load_profile(HW)
    plan = uniform_plan(vit_spec.config, "ddp", devices=2, micro_batch=16)
    unit = vit_spec.units[2]
    mlp = unit.groups[1]
    assert mlp.name == "block1.mlp" and mlp.bwd_temp.elems_per_token > 0
    without = ModelSpec(vit_spec.config, vit_spec.units[:2] + (replace(unit, groups=(
        unit.groups[0], replace(mlp, bwd_temp=Activations())),),) + vit_spec.units[3:])
    full, less = estimate(vit_spec, hw, plan), estimate(without, hw, plan)
    assert full.peak_during == less.peak_during == "bwd block1.mlp"
    tokens = 16 * vit_spec.seq_len
    assert full.peak_memory_bytes - less.peak_memory_bytes == pytest.approx(
        mlp.bwd_temp.bytes_per_token(2) * tokens)


def test_the_built_in_runner_refuses_a_described_model(vit_spec):
    from osdp_sim.model.config import check_runtime_buildable
    with pytest.raises(UserError, match="apply_plan"):
        check_runtime_buildable(vit_spec.config)


def test_a_described_model_at_another_sequence_length_is_refused(vit_spec):
    from osdp_sim import api
    with pytest.raises(UserError, match="measured at seq_len 65"):
        api.load_model(vit_spec, seq_len=128)
