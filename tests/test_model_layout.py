"""The layout type: torch-free, validated on construction, checked against a module tree with
one-line errors naming the missing path."""

import subprocess
import sys

import pytest

from osdp_sim.errors import UserError
from osdp_sim.model.layout import (HF_LAYOUTS, GroupLayout, ModelLayout, SplitTarget,
                                   builtin_layout, hf_layout)

LAYOUT = ModelLayout(name="toy", blocks="layers",
                     attn=GroupLayout(("norm1", "attn"), (SplitTarget("attn.wq"),)),
                     mlp=GroupLayout(("norm2", "ffn"), (SplitTarget("ffn.w1"),)),
                     root=("embed", "out"))
NAMES = ["", "embed", "layers", "layers.0", "layers.0.norm1", "layers.0.attn", "layers.0.attn.wq",
         "layers.0.norm2", "layers.0.ffn", "layers.0.ffn.w1", "out"]


def test_the_layout_module_imports_without_torch():
    code = ("import sys, osdp_sim.model.layout; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_matching_tree_passes():
    LAYOUT.check_paths(NAMES, ["0"], model="Toy")


@pytest.mark.parametrize("drop, field, path", [
    ("layers.0.attn", "layout.attn.modules", "layers.0.attn"),
    ("layers.0.ffn.w1", "layout.mlp.splits", "layers.0.ffn.w1"),
    ("out", "layout.root", "out"),
    ("layers", "layout.blocks", "layers"),
])
def test_a_missing_path_is_named(drop, field, path):
    with pytest.raises(UserError) as err:
        LAYOUT.check_paths([n for n in NAMES if n != drop], ["0"], model="Toy")
    assert str(err.value) == f"{field}: no module {path!r} in Toy"


def test_bad_layouts_are_refused_on_construction():
    with pytest.raises(UserError, match="layout.splits.kind: attn.wq: unknown split kind 'rows'"):
        SplitTarget("attn.wq", "rows")
    with pytest.raises(UserError, match="'ffn.w1' is under none of the group's modules"):
        GroupLayout(("attn",), (SplitTarget("ffn.w1"),))
    with pytest.raises(UserError, match="module 'attn' is in both the attn and the mlp group"):
        ModelLayout(name="x", blocks="layers", attn=GroupLayout(("attn",)),
                    mlp=GroupLayout(("attn.inner",)), root=())
    with pytest.raises(UserError, match="a group needs at least one module"):
        GroupLayout(())


def test_built_in_layouts():
    assert set(HF_LAYOUTS) == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                               "GemmaForCausalLM", "Phi3ForCausalLM", "GPT2LMHeadModel",
                               "BertForMaskedLM", "MixtralForCausalLM"}
    assert {t.kind for t in HF_LAYOUTS["GPT2LMHeadModel"].attn.splits} == {"conv1d"}
    assert [t.kind for t in HF_LAYOUTS["MixtralForCausalLM"].mlp.splits] == ["experts"]
    assert builtin_layout("llama").blocks == "blocks"
    with pytest.raises(UserError, match="no built-in layout for ViT; known: LlamaForCausalLM"):
        hf_layout("ViT")
