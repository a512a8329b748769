"""validate --impl hf: transformers' own model of a config.json run with a plan on 2 gloo ranks
(a tiny Llama and a tiny Mixtral), the record it writes, campaigns with impl, and the errors."""

import copy
import importlib.util
import json
import math
from pathlib import Path

import pytest

from osdp_sim.calibrate.campaign import campaign_from_dict, plan_jobs, validate_command
from osdp_sim.cli.main import main
from osdp_sim.errors import UserError
from osdp_sim.model.load import load_model_config
from osdp_sim.model.spec import build_spec
from osdp_sim.records import load_record, record_from_dict, record_name

pytest.importorskip("transformers")

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 32,
         "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "use_cache": False, "vocab_size": 256}
MIXTRAL = {**LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "num_local_experts": 4, "num_experts_per_tok": 2, "output_router_logits": False,
           "sliding_window": None}
CPU_PROFILE = Path(__file__).resolve().parent.parent / "hwprofiles" / "cpu-2core.yaml"


def write_config(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("name, data", [("llama-t", LLAMA), ("mixtral-t", MIXTRAL)])
def test_validate_impl_hf_runs_transformers_model_and_records_it(tmp_path, capsys, name, data):
    model = write_config(tmp_path / name, data)
    records = tmp_path / "records"
    rc = main(["validate", "--impl", "hf", "--model", str(model), "--hw", str(CPU_PROFILE),
               "--strategy", "zero3", "--micro-batch", "2", "--precision", "fp32", "--nproc", "2",
               "--threads", "1", "--warmup", "1", "--iters", "2", "--timeout", "240",
               "--records-dir", str(records)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"run        {name} (transformers): 2 ranks" in out
    [path] = list(records.glob("*.json"))
    assert "-hf-fsdp2-cpu-n2-" in path.name
    rec = load_record(path)
    d = rec.data
    assert rec.ok and rec.impl == "hf" and d["impl"] == "hf" and d["env"]["world_size"] == 2

    # ZeRO-3 over 2 ranks, fp32 AdamW: each rank holds two moments of half the parameters (the
    # description counts transformers' parameters, tests/hf_counts.py) plus a step per tensor.
    params = build_spec(load_model_config(str(model), notes=[])).param_count
    for r in d["measured"]["memory"]["per_rank"]:
        assert r["tracker_peak_bytes"] == r["tracker_breakdown"]["Total"] > 0
        assert r["tracker_breakdown"]["Optstate"] == pytest.approx(2 * params * 4 / 2, rel=0.02)
    assert d["measured"]["peak_memory_bytes"] == max(
        r["tracker_peak_bytes"] for r in d["measured"]["memory"]["per_rank"])
    losses = d["measured"]["losses"]["per_rank"]
    # transformers computed the loss from labels: near log(vocab) with its 0.02-std init
    assert all(abs(l[0] - math.log(256)) < 0.3 for l in losses) and losses[0][0] != losses[1][0]
    p = d["predicted"]
    assert p["peak_memory_bytes"] > 0 and p["iteration_time_s"] > 0
    assert d["errors"]["peak_memory_rel"] == pytest.approx(
        p["peak_memory_bytes"] / d["measured"]["peak_memory_bytes"] - 1)


def _one_error(capsys) -> str:
    lines = [l for l in capsys.readouterr().err.splitlines() if "error" in l]
    assert len(lines) == 1, lines
    return lines[0]


def test_impl_hf_without_transformers_names_the_extra(tmp_path, capsys, monkeypatch):
    model = write_config(tmp_path / "llama-t", LLAMA)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    rc = main(["validate", "--impl", "hf", "--model", str(model), "--hw", str(CPU_PROFILE),
               "--strategy", "ddp", "--micro-batch", "1", "-o", str(tmp_path / "r.json")])
    line = _one_error(capsys)
    assert rc == 2 and "--impl" in line and "pip install -e '.[hf]'" in line
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--model", "gpt2-tiny"], "did not come from one"),                   # a built-in: no config.json
    (["--model", "MODEL", "--backend", "fairscale"], "--backend"),
    (["--model", "MODEL", "--fake-world", "2"], "--fake-world builds the runtime's own modules"),
])
def test_impl_hf_refusals_are_one_line(tmp_path, capsys, extra, needle):
    model = write_config(tmp_path / "llama-t", LLAMA)
    extra = [str(model) if a == "MODEL" else a for a in extra]
    rc = main(["validate", "--impl", "hf", "--hw", str(CPU_PROFILE), "--strategy", "ddp",
               "--micro-batch", "1", "-o", str(tmp_path / "r.json"), *extra])
    assert rc == 2 and needle in _one_error(capsys)


def test_impl_osdp_refusal_points_at_impl_hf(tmp_path, capsys):
    model = write_config(tmp_path / "mixtral-t", MIXTRAL)
    rc = main(["validate", "--hw", str(CPU_PROFILE), "--model", str(model), "--strategy", "zero3",
               "--micro-batch", "1", "-o", str(tmp_path / "r.json")])
    line = _one_error(capsys)
    assert rc == 2 and "n_experts" in line and "--impl hf" in line


CAMPAIGN = {"name": "t", "hardware": str(CPU_PROFILE), "device": "cpu", "records_dir": "R",
            "warmup": 1, "iters": 2, "threads": 1, "runs": []}


def _campaign(tmp_path, runs, **top):
    d = copy.deepcopy(CAMPAIGN)
    d.update(records_dir=str(tmp_path / "records"), runs=runs, **top)
    return d


def test_campaign_impl_default_and_per_run(tmp_path):
    model = str(write_config(tmp_path / "llama-t", LLAMA))
    plans = [{"strategy": "zero3", "micro_batch": 2}]
    c = campaign_from_dict(_campaign(tmp_path, [{"model": model, "nproc": 2, "plans": plans},
                                                {"model": model, "nproc": 2, "plans": plans,
                                                 "impl": "osdp"}], impl="hf"), "c.yaml")
    assert [r.impl for r in c.runs] == ["hf", "osdp"]
    hf, osdp = plan_jobs(c)                 # the same plan by two implementations: two records
    assert hf.plan.choices == osdp.plan.choices and hf.plan.micro_batch == osdp.plan.micro_batch
    assert hf.record_path != osdp.record_path
    assert "-hf-" in hf.record_path.name and "-hf-" not in osdp.record_path.name
    cmd = validate_command(c, hf, Path("plan.json"), 1)
    assert cmd[cmd.index("--impl") + 1] == "hf" and "--impl" not in validate_command(c, osdp, Path("p"), 1)
    assert campaign_from_dict(_campaign(tmp_path, [{"model": model, "nproc": 2, "plans": plans}]),
                              "c.yaml").runs[0].impl == "osdp"


@pytest.mark.parametrize("run, top, field, needle", [
    ({"impl": "jax"}, {}, "runs[0].impl", "expected one of osdp, hf"),
    ({}, {"impl": "HF"}, "impl", "expected one of osdp, hf"),
    ({"model": "gpt2-tiny"}, {"impl": "hf"}, "runs[0].model", "did not come from one"),
    ({"model": "MIXTRAL"}, {}, "runs[0].model", "--impl hf"),
])
def test_campaign_impl_errors_name_the_field(tmp_path, run, top, field, needle):
    llama = str(write_config(tmp_path / "llama-t", LLAMA))
    mixtral = str(write_config(tmp_path / "mixtral-t", MIXTRAL))
    r = {"model": llama, "nproc": 2, "plans": [{"strategy": "ddp", "micro_batch": 1}], **run}
    r["model"] = mixtral if r["model"] == "MIXTRAL" else r["model"]
    with pytest.raises(UserError) as e:
        campaign_from_dict(_campaign(tmp_path, [r], **top), "c.yaml")
    assert e.value.field == field and needle in str(e.value)


def test_record_impl_is_checked_and_named(tmp_path):
    rec = _tiny_record(tmp_path)
    assert "impl" not in rec and "-hf-" not in record_name(rec)
    assert "-hf-" in record_name({**rec, "impl": "hf"})
    assert record_from_dict({**rec, "impl": "hf"}).impl == "hf"
    with pytest.raises(UserError) as e:
        record_from_dict({**rec, "impl": "jax"}, source="r.json")
    assert e.value.field == "impl"


def _tiny_record(tmp_path) -> dict:
    from osdp_sim.model.config import ModelConfig
    from osdp_sim.plan import uniform_plan
    from osdp_sim.records import build_record
    cfg = ModelConfig(name="t", family="gpt2", n_layers=1, hidden=32, n_heads=2, vocab_size=64, seq_len=8)
    env = {"torch": "x", "backend": "fsdp2", "backend_version": "x", "device_kind": "cpu",
           "device_name": "cpu", "world_size": 1, "threads_per_rank": 1, "cores": 2,
           "oversubscribed": False, "hostname": "h", "python": "3"}
    ranks = [{"step_times_s": [0.1, 0.1], "losses": [1.0], "memory": {"tracker_peak_bytes": 100}}]
    return build_record(status="ok", run_id="r", plan=uniform_plan(cfg, "ddp", devices=1, micro_batch=1),
                        hardware_profile={"name": "p", "path": "p"}, env=env,
                        settings={"warmup": 0, "iters": 2, "seed": 0}, rank_results=ranks, predicted=None)


def test_gpu_script_parses_and_sourcing_it_runs_nothing():
    import subprocess
    script = Path(__file__).resolve().parent.parent / "validate" / "gpu" / "h200-hf.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    out = subprocess.run(["bash", "-c", f"source {script} && declare -F"], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "RECORDS": "/nonexistent"}, timeout=30)
    assert out.returncode == 0 and "==" not in out.stdout          # no validate run started
    names = {line.split()[-1] for line in out.stdout.splitlines()}
    assert {"hf_setup", "hf_llama", "hf_mixtral", "hf_table", "hf_main"} <= names


def test_report_spearman_by_hand():
    import importlib.util as iu
    path = Path(__file__).resolve().parent.parent / "validate" / "hf_report.py"
    spec = iu.spec_from_file_location("hf_report", path)
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # one swapped pair of 4: 1 - 6 * 2 / (4 * 15)
    assert mod.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    # a tie takes the mean rank: ranks (0.5, 0.5, 2) vs (0, 1, 2) -> 1.5 / sqrt(1.5 * 2)
    assert mod.spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3))
    assert math.isnan(mod.spearman([1, 2], [2, 1]))
