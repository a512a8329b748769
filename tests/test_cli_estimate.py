"""`osdp-sim estimate`: the human table, --json keys, plan files, and one-line user errors."""

import json
import subprocess
import sys

import pytest

from osdp_sim.cli.main import main
from osdp_sim.model import load_model_config
from osdp_sim.plan import save_plan, uniform_plan

TITAN = "hwprofiles/titan8.yaml"


def test_issue_command_prints_a_breakdown(capsys):
    assert main(["estimate", "--hw", TITAN, "--model", "gpt2-1.5b", "--strategy", "zero3",
                 "--micro-batch", "4"]) == 0
    out = capsys.readouterr().out
    for needle in ("peak memory per device", "activations", "gathered_params", "iteration time",
                   "all_gather", "reduce_scatter", "samples/s", "MFU"):
        assert needle in out


def test_json_has_the_required_keys(capsys):
    assert main(["estimate", "--hw", TITAN, "--model", "gpt2-1.5b", "--strategy", "zero3",
                 "--micro-batch", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("peak_memory_bytes", "memory_breakdown", "iteration_time_s", "time_breakdown",
                "samples_per_s", "tokens_per_s", "model_states_bytes"):
        assert key in d
    assert set(d["model_states_bytes"]) == {"params", "grads", "optimizer"}
    # model states of uniform ZeRO-3 on 8 devices: 16 bytes per parameter / 8
    assert sum(d["model_states_bytes"].values()) == pytest.approx(1_557_611_200 * 16 / 8)


def test_plan_file_gives_the_same_estimate(tmp_path, capsys):
    plan = uniform_plan(load_model_config("gpt2-1.5b"), "zero3", devices=8, micro_batch=4)
    save_plan(plan, tmp_path / "p.json")
    main(["estimate", "--hw", TITAN, "--plan", str(tmp_path / "p.json"), "--json"])
    a = json.loads(capsys.readouterr().out)
    main(["estimate", "--hw", TITAN, "--model", "gpt2-1.5b", "--strategy", "zero3", "--micro-batch", "4", "--json"])
    b = json.loads(capsys.readouterr().out)
    assert a["iteration_time_s"] == b["iteration_time_s"]
    assert a["peak_memory_bytes"] == b["peak_memory_bytes"]


def test_fewer_gpus_and_units_in_sizes(capsys):
    assert main(["estimate", "--hw", TITAN, "--gpus", "4", "--model", "gpt2-124m", "--strategy", "ddp",
                 "--micro-batch", "2", "--precision", "fp32", "--checkpoint", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == 4


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt9", "--strategy", "zero3", "--micro-batch", "4"], "unknown model"),
    (["--model", "gpt2-1.5b", "--strategy", "zero3"], "--micro-batch"),
    (["--model", "gpt2-1.5b", "--strategy", "zero3", "--micro-batch", "4", "--gpus", "64"], "--gpus"),
    (["--model", "gpt2-1.5b", "--strategy", "zero3", "--micro-batch", "4", "--shard-group", "3"],
     "--shard-group: 3 must divide the device count 8"),
    (["--model", "gpt2-1.5b", "--strategy", "ddp", "--micro-batch", "4", "--shard-group", "4"],
     "--shard-group: has no effect with --strategy ddp"),                 # was ignored
])
def test_user_errors_are_one_line_exit_2(capsys, args, needle):
    assert main(["estimate", "--hw", TITAN] + args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_console_script_bad_profile_no_traceback(tmp_path):
    bad = tmp_path / "hw.yaml"
    bad.write_text("schema: osdp-sim/hardware\nversion: 1\nname: x\n")
    r = subprocess.run([sys.executable, "-m", "osdp_sim.cli.main", "estimate", "--hw", str(bad),
                        "--model", "gpt2-124m", "--strategy", "ddp", "--micro-batch", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and str(bad) in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.fixture
def plan2(tmp_path):
    path = tmp_path / "p2.json"
    save_plan(uniform_plan(load_model_config("gpt2-124m"), "zero3", devices=2, micro_batch=2), path)
    return str(path)


@pytest.mark.parametrize("extra,flag", [
    (["--model", "llama-7b"], "--model"), (["--micro-batch", "8"], "--micro-batch"),
    (["--checkpoint"], "--checkpoint"), (["--precision", "bf16"], "--precision"),
    (["--optimizer", "sgd"], "--optimizer"), (["--grad-accum", "4"], "--grad-accum"),
    (["--seq-len", "64"], "--seq-len"), (["--shard-group", "1"], "--shard-group"),
])
def test_flags_a_plan_file_fixes_are_errors_with_plan(capsys, plan2, extra, flag):
    # these used to be ignored silently: the plan's own settings were estimated
    assert main(["estimate", "--hw", "cpu-2core", "--plan", plan2] + extra) == 2
    err = capsys.readouterr().err.strip()
    assert f"{flag}: conflicts with --plan" in err and "\n" not in err


def test_gpus_against_a_plan_names_the_plan_device_count(capsys, plan2):
    assert main(["estimate", "--hw", "cpu-2core", "--plan", plan2, "--gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "--gpus: the plan was made for 2 devices, not 1" in err     # was: "the profile has 1"
    assert main(["estimate", "--hw", "cpu-2core", "--plan", plan2, "--gpus", "2", "--json"]) == 0


def test_timeline_without_json_is_an_error(capsys, plan2):
    assert main(["estimate", "--hw", "cpu-2core", "--plan", plan2, "--timeline"]) == 2
    assert "--timeline: only adds the task timeline to the --json output" in capsys.readouterr().err


@pytest.mark.parametrize("target,needle", [
    ("/proc/x.png", "cannot write a file in /proc"),
    ("{d}/DIR.png", "is a folder"),
    ("{d}/out.svg", "expected a .png path"),
    ("{d}/AFILE/t.png", "is a file"),
])
def test_unwritable_plot_paths_are_errors_before_the_estimate(capsys, tmp_path, plan2, target, needle):
    (tmp_path / "DIR.png").mkdir()
    (tmp_path / "AFILE").write_text("")
    target = target.format(d=tmp_path)
    assert main(["estimate", "--hw", "cpu-2core", "--plan", plan2, "--plot", target]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "--plot" in err and "\n" not in err


def test_plot_creates_missing_folders_like_every_output_flag(tmp_path, plan2):
    target = tmp_path / "new" / "dir" / "t.png"          # was a FileNotFoundError traceback
    assert main(["estimate", "--hw", "cpu-2core", "--plan", plan2, "--plot", str(target)]) == 0
    assert target.is_file() and target.with_suffix(".svg").is_file()
