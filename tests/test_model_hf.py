"""Hugging Face config.json import: exact parameter counts on published configs (transformers
on the meta device where installed, cached in tests/data/hf/param_counts.json for the core),
the structure each architecture honours, and one-line errors naming the config key."""

import importlib.util
import json

import pytest

from osdp_sim.cli.main import main
from osdp_sim.errors import UserError
from osdp_sim.model import build_spec, load_model, load_model_config
from osdp_sim.model.config import for_implementation
from osdp_sim.model.spec import Activations
from osdp_sim.model.hf import ARCHITECTURES
from hf_counts import COUNTS, HF_DIR, transformers_param_count

CACHED = json.loads(COUNTS.read_text())["counts"]
FOLDERS = sorted(d.name for d in HF_DIR.iterdir() if (d / "config.json").is_file())
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def test_every_architecture_has_a_published_config():
    archs = {json.loads((HF_DIR / d / "config.json").read_text())["architectures"][0] for d in FOLDERS}
    assert archs == set(ARCHITECTURES) and set(CACHED) == set(FOLDERS)


@pytest.mark.parametrize("name", FOLDERS)
def test_param_count_equals_transformers_cached(name):
    assert load_model(str(HF_DIR / name), notes=[]).param_count == CACHED[name]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (extra: hf)")
@pytest.mark.parametrize("name", FOLDERS)
def test_param_count_equals_transformers_built_on_meta(name):
    n = transformers_param_count(HF_DIR / name)
    assert n == CACHED[name], "tests/data/hf/param_counts.json is stale: python tests/hf_counts.py"
    assert load_model(str(HF_DIR / name / "config.json"), notes=[]).param_count == n


def _shape(spec):
    return [(g.name, g.linears, g.other_params, g.fwd_flops_per_token, g.activations)
            for g in spec.groups] + [u.ckpt_activations for u in spec.blocks]


def _structure(spec):
    return [(g.name, g.linears, g.other_params, g.fwd_flops_per_token) for g in spec.groups]


def test_llama_2_config_is_the_builtin_llama_7b():
    notes = []
    hf = load_model(str(HF_DIR / "llama-2-7b"), notes=notes, seq_len=2048)
    builtin = load_model("llama-7b")
    assert notes == []          # --seq-len given: no sequence note, and nothing to warn about
    assert load_model(str(HF_DIR / "llama-2-7b"), notes=[]).seq_len == 4096   # its own default
    # Same parameters and FLOPs; as the runtime's modules keep it, the very same description.
    assert _structure(hf) == _structure(builtin) and hf.param_count == builtin.param_count
    assert _shape(build_spec(for_implementation(hf.config, "osdp"))) == _shape(builtin)
    # transformers keeps more (docs/models.md): per RMSNorm (two per block, the final one) its fp32
    # input, 4h bytes per token; block 0 the rotary cos/sin, 2 x seq x head_dim elements per
    # forward; the head the fp32 scalar loss.
    h, seq, head_dim = 4096, 2048, 128
    for ours, base in zip(hf.groups, builtin.groups):
        extra = Activations()
        if ours.kind != "embed":
            extra += Activations(fixed_bytes_per_token=4.0 * h)
        if ours.name == "block0.attn":
            extra += Activations(elems_per_forward=2.0 * seq * head_dim)
        if ours.kind == "head":
            extra += Activations(fixed_bytes_per_forward=4.0)
        assert ours.activations == base.activations + extra, ours.name
    # Per micro-batch of one sample in bf16: 65 norms x 4h x seq bytes + the tables (2 B each).
    more = sum(g.activations.bytes_for(2, seq) for g in hf.groups) - \
        sum(g.activations.bytes_for(2, seq) for g in builtin.groups)
    assert more == 65 * 4 * h * seq + 2 * seq * head_dim * 2 + 4 == 2_182_086_660


def test_default_sequence_length_is_said(tmp_path):
    notes = []
    cfg = load_model_config(str(HF_DIR / "qwen2-7b"), notes=notes)
    assert cfg.seq_len == 4096
    assert len(notes) == 1 and "sequence length 4096" in notes[0] and "131072" in notes[0]
    assert cfg.source.startswith("hf:") and cfg.source.endswith("(Qwen2ForCausalLM)")


def test_qwen2_qkv_bias_and_no_output_bias():
    spec = load_model(str(HF_DIR / "qwen2-7b"), notes=[])
    attn = spec.blocks[0].groups[0]
    h, kv = 3584, 4 * 128
    assert [(l.name, l.bias) for l in attn.linears] == [
        ("q_proj", True), ("k_proj", True), ("v_proj", True), ("o_proj", False)]
    assert attn.param_count == (h * h + h) + 2 * (h * kv + kv) + h * h + h   # + RMSNorm


def test_gemma_head_dim_differs_from_hidden_over_heads():
    spec = load_model(str(HF_DIR / "gemma-7b"), notes=[], seq_len=1024)
    attn = spec.blocks[0].groups[0]
    q = 16 * 256                                   # 4096, not hidden 3072
    assert [(l.in_features, l.out_features) for l in attn.linears] == [
        (3072, q), (3072, q), (3072, q), (q, 3072)]
    # linears + scores and weighted sum over 1024 keys at 16 x 256
    assert attn.fwd_flops_per_token == 2 * 4 * 3072 * q + 4 * 1024 * q
    assert spec.config.tied_head and spec.config.mlp_kind == "geglu"
    assert spec.units[-1].groups[0].linears == ()   # tied: no head weight


def test_phi3_fused_projections_keep_the_parameter_count():
    spec = load_model(str(HF_DIR / "phi-3-mini-4k"), notes=[])
    attn, mlp = spec.blocks[0].groups
    assert [(l.name, l.out_features) for l in attn.linears] == [("qkv_proj", 3 * 3072), ("o_proj", 3072)]
    assert [(l.name, l.out_features) for l in mlp.linears] == [("gate_up_proj", 2 * 8192), ("down_proj", 3072)]
    assert spec.config.sliding_window == 2047
    # scores over the 2047-token window, not the 4096-token sequence
    assert attn.fwd_flops_per_token == 2 * 4 * 3072 * 3072 + 4 * 2047 * 3072


def test_mixtral_moe_terms_hand_computed():
    spec = load_model(str(HF_DIR / "mixtral-8x7b-v0.1"), notes=[])
    mlp = spec.blocks[0].groups[1]
    h, f, e, k = 4096, 14336, 8, 2
    assert mlp.param_count == e * 3 * h * f + h * e + h               # experts + router + norm
    assert mlp.param_count == 1_409_286_144 + 32_768 + 4096
    assert mlp.fwd_flops_per_token == 2 * h * e + k * 2 * 3 * h * f   # router + k experts
    assert mlp.fwd_flops_per_token == 65_536 + 704_643_072
    # As the runtime's modules would keep it: x, norm out; per token-expert pair: gathered rows,
    # gate_up (2f), act, product, out, weight; fixed: 1/rms, softmax, indices
    osdp = build_spec(for_implementation(spec.config, "osdp")).blocks[0].groups[1]
    assert osdp.activations == Activations(2 * h + k * (h + 4 * f + h + 1), 4 + 4 * e + 8 * k)
    # transformers (grouped_mm): the norm's fp32 input (4h; its normalised tensor takes the
    # input's place among the elements), per pair the fp32 weight (4, no longer an element) and
    # three int64 permutations (24); per token the top-k weights and their sum (fp32); per
    # forward the int32 expert offsets
    assert mlp.activations == Activations(2 * h + k * (h + 4 * f + h),
                                          4 + 4 * h + 4 * e + 8 * k + 28 * k + 4 + 4 * k, 0, 4 * e)
    assert mlp.activations.bytes_per_token(2) == 2 * (2 * h + 2 * (2 * h + 4 * f)) + 4 + 4 * h + 32 + 16 + 56 + 4 + 8
    experts = [l for l in mlp.linears if l.copies == e]
    assert [l.name for l in experts] == ["experts.gate_up_proj", "experts.down_proj"]


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"architectures": ["FalconForCausalLM"], "hidden_size": 64}))
    with pytest.raises(UserError) as e:
        load_model(str(f))
    msg = str(e.value)
    assert msg.startswith(f"{f}: architectures:") and "MixtralForCausalLM" in msg and "\n" not in msg


def test_folder_without_config_json_is_named(tmp_path):
    with pytest.raises(UserError) as e:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(e.value) and "config.json" in str(e.value)


@pytest.mark.parametrize("key,value,needle", [
    ("num_hidden_layers", -2, "num_hidden_layers"),
    ("num_hidden_layers", "32", "num_hidden_layers"),
    ("hidden_size", 4096.0, "hidden_size"),
    ("num_key_value_heads", 5, "num_key_value_heads"),
    ("tie_word_embeddings", "false", "tie_word_embeddings"),
    ("attention_dropout", float("nan"), "attention_dropout"),
    ("num_local_experts", 0, "num_experts_per_tok"),
])
def test_bad_values_name_the_config_key(tmp_path, key, value, needle):
    d = json.loads((HF_DIR / "mixtral-8x7b-v0.1" / "config.json").read_text())
    d[key] = value
    f = tmp_path / "config.json"
    f.write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        load_model(str(f), notes=[])
    assert str(e.value).startswith(f"{f}: {needle}:"), str(e.value)


def test_missing_required_key(tmp_path):
    d = json.loads((HF_DIR / "llama-2-7b" / "config.json").read_text())
    del d["hidden_size"]
    f = tmp_path / "config.json"
    f.write_text(json.dumps(d))
    with pytest.raises(UserError, match="hidden_size: missing required key"):
        load_model(str(f))


def test_not_utf8_config_json(tmp_path):
    f = tmp_path / "config.json"
    f.write_bytes(b'{"architectures": ["GPT2LMHeadModel"], "name": "caf\xe9"}')
    with pytest.raises(UserError, match="UTF-8"):
        load_model(str(f))


def test_unmodelled_and_unknown_keys_one_warning_line():
    notes = []
    load_model_config(str(HF_DIR / "gpt2"), notes=notes)
    warnings = [n for n in notes if n.startswith("warning:")]
    assert len(warnings) == 1 and "attn_pdrop=0.1" in warnings[0] and "resid_pdrop" in warnings[0]
    d = json.loads((HF_DIR / "llama-2-7b" / "config.json").read_text())
    d["quantization_config"] = {"bits": 4}
    from osdp_sim.model.hf import from_hf_dict
    _, _, notes = from_hf_dict(d, ARCHITECTURES["LlamaForCausalLM"], source="c.json", name="x")
    assert len(notes) == 2 and "not recognised, ignored: quantization_config" in notes[1]


def test_estimate_and_models_accept_a_config_json(capsys):
    path = str(HF_DIR / "qwen2-7b" / "config.json")
    assert main(["estimate", "--hw", "a100x8", "--model", path, "--strategy", "zero3",
                 "--micro-batch", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["peak_memory_bytes"] > 0 and "sequence length 4096" in err
    assert main(["models", str(HF_DIR / "mixtral-8x7b-v0.1")]) == 0
    out, _ = capsys.readouterr()
    assert "experts.gate_up_proj" in out and "46.70B" in out


def test_models_lists_the_config_json_architectures(capsys):
    assert main(["models"]) == 0
    out, _ = capsys.readouterr()
    assert all(a in out for a in ARCHITECTURES) and "llama-7b" in out


def test_validate_refuses_what_the_runtime_cannot_build(tmp_path, capsys):
    for name, field in (("phi-3-mini-4k", "fused_qkv"), ("mixtral-8x7b-v0.1", "n_experts")):
        code = main(["validate", "--hw", "cpu-2core", "--model", str(HF_DIR / name),
                     "--strategy", "zero3", "--micro-batch", "1", "-o", str(tmp_path / "r.json")])
        _, err = capsys.readouterr()
        lines = [l for l in err.splitlines() if "error" in l]
        assert code == 2 and len(lines) == 1 and field in lines[0] and "--impl hf" in lines[0]


def test_runtime_builds_qwen2_and_gemma_structure():
    from osdp_sim.model.config import runtime_gaps
    assert runtime_gaps(load_model_config(str(HF_DIR / "qwen2-7b"), notes=[])) == []
    assert runtime_gaps(load_model_config(str(HF_DIR / "gemma-7b"), notes=[])) == []
    assert runtime_gaps(load_model_config(str(HF_DIR / "mistral-7b-v0.1"), notes=[], seq_len=8192)) == ["sliding_window"]


# Variants of the published configs, shrunk to 2 layers, that flip the options an architecture
# honours: transformers builds each on the meta device and the counts must agree.
VARIANTS = [
    ("bert-base-uncased", {"tie_word_embeddings": False}),
    ("gpt2", {"tie_word_embeddings": False, "n_inner": 1000}),
    ("llama-2-7b", {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 8,
                    "head_dim": 64, "tie_word_embeddings": True}),
    ("qwen2-7b", {"tie_word_embeddings": True, "num_key_value_heads": 7}),
    ("gemma-7b", {"head_dim": None, "attention_bias": True}),
    ("gemma-7b", {"num_key_value_heads": 1}),
    ("phi-3-mini-4k", {"num_key_value_heads": 8, "tie_word_embeddings": True}),
    ("mistral-7b-v0.1", {"head_dim": 96}),
    ("mixtral-8x7b-v0.1", {"num_local_experts": 4, "num_experts_per_tok": 1, "head_dim": 64}),
]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (extra: hf)")
@pytest.mark.parametrize("name,change", VARIANTS, ids=[f"{n}-{'-'.join(c)}" for n, c in VARIANTS])
def test_param_count_of_variants_equals_transformers(tmp_path, name, change):
    d = json.loads((HF_DIR / name / "config.json").read_text())
    layers = "n_layer" if "n_layer" in d else "num_hidden_layers"
    d[layers] = 2
    for k, v in change.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_model(str(tmp_path), notes=[]).param_count == transformers_param_count(tmp_path)


def test_campaign_with_a_model_the_runtime_cannot_build_fails_before_any_run(tmp_path):
    import yaml
    from osdp_sim.calibrate.campaign import load_campaign
    from test_calibrate import _campaign
    model = str(HF_DIR / "mixtral-8x7b-v0.1")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_campaign(tmp_path, runs=[
        {"model": model, "nproc": 2, "plans": [{"strategy": "zero3", "micro_batch": 1}]}])))
    with pytest.raises(UserError) as e:
        load_campaign(path)
    assert e.value.field == "runs[0].model" and "n_experts" in str(e.value)
    path.write_text(yaml.safe_dump(_campaign(tmp_path, runs=[
        {"model": str(HF_DIR / "qwen2-7b"), "seq_len": 64, "nproc": 2,
         "plans": [{"strategy": "zero3", "micro_batch": 1}]}])))
    assert load_campaign(path).runs[0].model.endswith("qwen2-7b")


@pytest.mark.parametrize("seq_len", [None, 64])
def test_a_learned_position_table_must_have_rows(tmp_path, seq_len):
    d = json.loads((HF_DIR / "gpt2" / "config.json").read_text())
    d["n_positions"] = 0
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="n_positions: expected a positive whole number"):
        load_model(str(tmp_path), notes=[], seq_len=seq_len)


def _extra(name: str, seq_len: int) -> dict:
    """Per group, what the description with implementation 'hf' holds beyond 'osdp'."""
    hf = load_model(str(HF_DIR / name), notes=[], seq_len=seq_len)
    osdp = build_spec(for_implementation(hf.config, "osdp"))
    return {g.name: (g.activations, o.activations) for g, o in zip(hf.groups, osdp.groups)}


def test_gemma_norm_terms_hand_computed():
    # GemmaRMSNorm: x.float() and the fp32 normalised tensor (8h bytes) in place of the input (h
    # elements), and per forward the fp32 1 + weight (4h); block 0 also the rotary cos/sin.
    h, d, s = 3072, 256, 1024
    ex = _extra("gemma-7b", s)
    hf, osdp = ex["block1.mlp"]
    assert hf == osdp + Activations(-h, 8 * h, 0, 4 * h)
    hf, osdp = ex["block0.attn"]
    assert hf == osdp + Activations(-h, 8 * h, 2 * s * d, 4 * h)
    # bf16, one sample of 1024 tokens: 8h x s - 2h x s + 4h, and 2 x 2 s d for the tables
    assert hf.bytes_for(2, s) - osdp.bytes_for(2, s) == 18_874_368 + 12_288 + 1_048_576


def test_gpt2_terms_hand_computed():
    # q and v copies for SDPA (2h), gelu_new's three more ffn-wide tensors (3 x 4h), int64
    # position ids per forward, the fp32 scalar loss; LayerNorm keeps what 'osdp' says.
    h, s = 768, 1024
    ex = _extra("gpt2", s)
    assert ex["block0.attn"][0] == ex["block0.attn"][1] + Activations(2 * h)
    assert ex["block0.mlp"][0] == ex["block0.mlp"][1] + Activations(3 * 4 * h)
    assert ex["embed"][0] == ex["embed"][1] + Activations(fixed_bytes_per_forward=8 * s)
    assert ex["head"][0] == ex["head"][1] + Activations(fixed_bytes_per_forward=4)
    assert ex["block0.mlp"][0].bytes_for(2, s) - ex["block0.mlp"][1].bytes_for(2, s) == 18_874_368


def test_bert_loss_in_the_activation_dtype_hand_computed():
    # BertForMaskedLM: log-softmax of the logits in the activation dtype (V elements, not 4V
    # bytes), its scalar loss one element per forward; position ids per forward.
    v, s = 30522, 512
    ex = _extra("bert-base-uncased", s)
    hf, osdp = ex["head"]
    assert hf == osdp + Activations(v, -4 * v, 1)
    assert osdp.bytes_for(2, s) - hf.bytes_for(2, s) == 2 * v * s - 2 == 31_254_526
    assert ex["embed"][0] == ex["embed"][1] + Activations(fixed_bytes_per_forward=8 * s)
    assert ex["block0.attn"][0] == ex["block0.attn"][1]
