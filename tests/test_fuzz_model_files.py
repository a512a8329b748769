"""Property test: mutated model files (types, signs, NaN/inf, huge values, missing and extra keys,
bytes that are not UTF-8) through load_model and the CLI: a UserError or a finite answer, never
another exception; the CLI exits 0 with finite numbers or 2 with one stderr line naming the file."""

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osdp_sim.cli.main import main
from osdp_sim.errors import UserError
from osdp_sim.model import load_model

YAML_MODEL = {"name": "fuzz", "family": "llama", "layers": 2, "hidden": 64, "heads": 4,
              "kv_heads": 2, "ffn": 172, "vocab": 100, "seq_len": 32, "tied_head": False}

ODD_VALUES = [-1, 0, 1, 3, 2.0, 0.5, True, False, None, "7", "", float("nan"), float("inf"),
              -float("inf"), 10 ** 9, 10 ** 13, 10 ** 30, -10 ** 30, [1], {"a": 1}, "llama", "gpt2"]

SETTINGS = settings(max_examples=250, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _mutations(base: dict):
    keys = sorted(base)
    change = st.tuples(st.sampled_from(keys), st.sampled_from(ODD_VALUES)).map(lambda kv: ("set",) + kv)
    drop = st.sampled_from(keys).map(lambda k: ("drop", k, None))
    extra = st.sampled_from(["colour", "layerz", "n_layers", "architectures"]).map(lambda k: ("set", k, 1))
    return st.lists(st.one_of(change, drop, extra), min_size=1, max_size=3)


def _apply(base: dict, muts) -> dict:
    d = dict(base)
    for op, k, v in muts:
        if op == "drop":
            d.pop(k, None)
        else:
            d[k] = v
    return d


def _write(path, data: dict, fmt: str, garble: bool) -> None:
    text = yaml.safe_dump(data) if fmt == "yaml" else json.dumps(data)
    raw = text.encode()
    if garble:
        raw = raw[: len(raw) // 2] + b"\xff\xfe\xe9" + raw[len(raw) // 2:]
    path.write_bytes(raw)


def _check_load(path) -> None:
    try:
        spec = load_model(str(path))
    except UserError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    assert spec.param_count > 0 and math.isfinite(float(spec.param_count))
    assert math.isfinite(spec.fwd_flops_per_token) and spec.fwd_flops_per_token > 0


def _numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


def _check_cli(path, argv, capsys) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and not out, err
        return ""
    assert code == 0, err
    return out


def run_one(tmp_path, capsys, data: dict, fmt: str, garble: bool) -> None:
    path = tmp_path / f"m.{fmt}"
    _write(path, data, fmt, garble)
    _check_load(path)
    out = _check_cli(path, ["models", str(path)], capsys)
    assert not {"nan", "inf"} & set(out.lower().replace(",", " ").split())
    out = _check_cli(path, ["estimate", "--hw", "cpu-2core", "--model", str(path), "--strategy",
                            "zero3", "--micro-batch", "1", "--json"], capsys)
    if out:
        est = json.loads(out)
        assert all(math.isfinite(v) for v in _numbers(est))
        assert est["peak_memory_bytes"] > 0 and est["iteration_time_s"] > 0


@SETTINGS
@given(muts=_mutations(YAML_MODEL), garble=st.booleans())
def test_mutated_model_yaml(tmp_path, capsys, muts, garble):
    run_one(tmp_path, capsys, _apply(YAML_MODEL, muts), "yaml", garble)


HF_MODEL = {"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 128, "max_position_embeddings": 256, "num_local_experts": 4,
            "num_experts_per_tok": 2, "sliding_window": None, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "head_dim": 16, "hidden_act": "silu"}
ARCH_VALUES = ["LlamaForCausalLM", "Qwen2ForCausalLM", "GemmaForCausalLM", "Phi3ForCausalLM",
               "GPT2LMHeadModel", "BertForMaskedLM", "FalconForCausalLM", 3]


@SETTINGS
@given(muts=_mutations(HF_MODEL), arch=st.sampled_from(ARCH_VALUES + [None]),
       garble=st.booleans(), as_folder=st.booleans())
def test_mutated_config_json(tmp_path, capsys, muts, arch, garble, as_folder):
    data = _apply(HF_MODEL, muts)
    if arch is not None:
        data["architectures"] = [arch]
    if not as_folder:
        run_one(tmp_path, capsys, data, "json", garble)
        return
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    _write(folder / "config.json", data, "json", garble)
    _check_load(folder)
    _check_cli(folder, ["models", str(folder)], capsys)


def test_model_yaml_alias_bombs_and_encodings_are_named_like_every_other_file(tmp_path):
    from osdp_sim.errors import UserError
    from osdp_sim.model.load import load_model
    names = "abcdefghij"
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip(names, names[1:])]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"bomb\.yaml: its YAML aliases expand to more than"):
        load_model(str(bomb))
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(UserError, match=r"latin1\.yaml: not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_model(str(latin))
