"""Model descriptions: parameter counts against known totals, FLOPs, YAML loading and its errors."""

import pytest

from osdp_sim.errors import UserError
from osdp_sim.model import BUILTIN, build_spec, load_model, load_model_config

KNOWN_TOTALS = {
    "gpt2-124m": 124_439_808,        # HF gpt2, tied head
    "gpt2-350m": 354_823_168,        # gpt2-medium
    "gpt2-774m": 774_030_080,        # gpt2-large
    "gpt2-1.5b": 1_557_611_200,      # gpt2-xl
    "bert-large": 335_174_458,       # BertForMaskedLM (bert-large-uncased), no pooler
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-8b": 8_030_261_248,       # Llama-3-8B: 8 KV heads, vocab 128256
}


@pytest.mark.parametrize("name,total", KNOWN_TOTALS.items())
def test_parameter_counts_match_known_totals(name, total):
    assert build_spec(BUILTIN[name]).param_count == total


def test_mingpt_paper_configs():
    for name, h in (("mingpt-48l-1536", 1536), ("mingpt-48l-2048", 2048)):
        spec = build_spec(BUILTIN[name])
        assert len(spec.blocks) == 48
        block = 12 * h * h + 13 * h                  # GPT-2 block with biases and two LayerNorms
        assert spec.blocks[0].param_count == block
        assert spec.param_count == 48 * block + 50257 * h + 1024 * h + 2 * h


def test_units_and_plan_keys_in_forward_order():
    spec = load_model("gpt2-tiny")
    assert [u.name for u in spec.units] == ["embed", "block0", "block1", "block2", "block3", "head"]
    assert spec.plan_keys[:3] == ("root", "block0.attn", "block0.mlp")
    assert spec.params_of("root") == 8192 * 256 + 128 * 256 + 2 * 256


def test_forward_flops_of_a_gpt2_block():
    spec = load_model("gpt2-1.5b")
    h, s = 1600, 1024
    attn = 2 * (h * 3 * h + h * h) + 4 * s * h
    mlp = 2 * (2 * h * 4 * h)
    assert spec.blocks[0].fwd_flops_per_token == attn + mlp


def test_llama_gqa_shapes():
    spec = load_model("llama-8b")
    attn = spec.blocks[0].groups[0]
    kv = 8 * 128
    assert attn.param_count == 4096 * 4096 * 2 + 2 * 4096 * kv + 4096     # q, o, k, v + RMSNorm


def test_yaml_model(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("family: llama\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nffn: 172\nvocab: 100\nseq_len: 32\n")
    spec = load_model(str(f))
    assert spec.name == "m" and spec.config.kv_heads == 2 and not spec.config.tied_head
    assert len(spec.blocks) == 2


@pytest.mark.parametrize("text,field", [
    ("family: gpt3\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\n", "family"),
    ("family: gpt2\nlayers: 2\nhidden: 64\nheads: 5\nvocab: 100\nseq_len: 32\n", "heads"),
    ("family: gpt2\nlayers: two\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\n", "layers"),
    ("family: gpt2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\n", "layers"),
    ("family: gpt2\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\nwidth: 3\n", "width"),
    ("family: gpt2\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\nmax_positions: 16\n", "seq_len"),
    ("family: gpt2\nlayers: [\n", None),
])
def test_bad_yaml_models_name_the_field(tmp_path, text, field):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(UserError) as e:
        load_model(str(f))
    assert "bad.yaml" in str(e.value)
    if field:
        assert field in str(e.value)


def test_unknown_model_name_lists_builtins():
    with pytest.raises(UserError, match="gpt2-1.5b"):
        load_model_config("gpt5")


def test_seq_len_override():
    assert load_model("gpt2-124m", seq_len=512).seq_len == 512


_BASE = "family: bert\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\n"


@pytest.mark.parametrize("extra,key", [
    ("type_vocab: -3\n", "type_vocab"),        # negative: was accepted, negative parameter counts
    ("type_vocab: 0\n", "type_vocab"),
    ("kv_heads: -1\n", "kv_heads"),
    ("ffn: 2.0\n", "ffn"),                     # a float is not a whole number
    ("max_positions: .nan\n", "max_positions"),
    ("tied_head: 1\n", "tied_head"),           # an int is not a bool
    ("name: 5\n", "name"),
    ("ffn: 100000000000000000000\n", "ffn"),   # beyond any real model: clean error, not overflow
])
def test_bad_yaml_values_name_the_yaml_key(tmp_path, extra, key):
    f = tmp_path / "bad.yaml"
    f.write_text(_BASE + extra)
    with pytest.raises(UserError) as e:
        load_model(str(f))
    assert str(e.value).startswith(f"{f}: {key}:")


def test_yaml_range_errors_name_the_yaml_key_not_the_field(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(_BASE.replace("layers: 2", "layers: 200000"))
    with pytest.raises(UserError) as e:
        load_model(str(f))
    assert f"{f}: layers:" in str(e.value) and "n_layers" not in str(e.value)


def test_seq_len_override_errors_name_the_flag():
    with pytest.raises(UserError) as e:
        load_model("gpt2-tiny", seq_len=4096)
    assert "--seq-len" in str(e.value)


def test_non_utf8_yaml_is_a_clean_error(tmp_path):
    f = tmp_path / "latin.yaml"
    f.write_bytes(_BASE.encode() + b"name: caf\xe9\n")
    with pytest.raises(UserError) as e:
        load_model(str(f))
    assert str(f) in str(e.value) and "UTF-8" in str(e.value)


def test_folder_named_like_a_yaml_file_is_a_clean_error(tmp_path):
    d = tmp_path / "model.yaml"
    d.mkdir()
    with pytest.raises(UserError) as e:
        load_model(str(d))
    assert str(d) in str(e.value) and "folder" in str(e.value)


def test_extreme_legal_hidden_gives_finite_numbers(tmp_path):
    f = tmp_path / "wide.yaml"
    f.write_text(_BASE.replace("hidden: 64", "hidden: 1000000000"))
    spec = load_model(str(f))
    assert spec.param_count > 1e18 and spec.fwd_flops_per_token < float("inf")


@pytest.mark.parametrize("suffix", ["", ".yaml", ".json"])
def test_a_path_the_os_refuses_is_a_clean_error(suffix):
    with pytest.raises(UserError):
        load_model("m" * 5000 + suffix)
