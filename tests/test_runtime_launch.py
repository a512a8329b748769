"""Real multi-process validation runs (gloo, 2 ranks, a 2-layer hidden-64 GPT): an ok record with
measurements and predictions, OOM by the memory cap, a killed rank, a hung rank, an interrupted
launcher, and never a process left behind."""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from osdp_sim.cli.main import main
from osdp_sim.model.config import ModelConfig
from osdp_sim.model.spec import build_spec
from osdp_sim.plan import plan_to_dict, save_plan, uniform_plan
from osdp_sim.records import build_record, load_record, save_record
from osdp_sim.runtime.launch import available_cores, launch

from hwfixtures import ROUND_CPU_PROFILE_YAML as CPU_PROFILE

CFG = ModelConfig(name="tiny", family="gpt2", n_layers=2, hidden=64, n_heads=2, vocab_size=256,
                  seq_len=32)
PLAN = uniform_plan(CFG, "zero3", devices=2, micro_batch=2, precision="fp32")



@pytest.fixture
def files(tmp_path):
    hw = tmp_path / "cpu.yaml"
    hw.write_text(CPU_PROFILE)
    plan = tmp_path / "plan.json"
    save_plan(PLAN, plan)
    return hw, plan


def processes_with(text: str) -> list[int]:
    """Live processes whose command line contains `text` (no psutil: /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if text.encode() in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    """Exists and is not a zombie (an orphan waiting for init to reap it is already dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def assert_all_gone(pids, run_id):
    assert [p for p in pids if alive(p)] == []
    assert processes_with(run_id) == []


def spec(**kw):
    s = dict(plan=plan_to_dict(PLAN), backend="fsdp2", device="cpu", warmup=1, iters=3, seed=0,
             threads_per_rank=1, mem_cap_bytes=None)
    s.update(kw)
    return s


def test_nproc_must_match_the_plan(files, capsys):
    hw, plan = files
    rc = main(["validate", "--plan", str(plan), "--hw", str(hw), "--nproc", "4"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{plan}: devices: --nproc 4 but the plan is for 2 devices" in err
    assert "make a plan for 4 devices" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_cuda_without_a_gpu_is_a_one_line_error_before_any_rank_starts(files, tmp_path, capsys):
    hw, plan = files
    out = tmp_path / "r.json"
    rc = main(["validate", "--plan", str(plan), "--hw", str(hw), "--device", "cuda", "-o", str(out)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("osdp-sim validate: error: --device: --device cuda, but this torch sees no GPU")
    assert "(--device cpu)" in err[-1]
    assert not out.exists()


@pytest.mark.slow
def test_validate_writes_an_ok_record_with_measured_and_predicted(files, tmp_path, capsys):
    hw, plan = files
    out = tmp_path / "rec.json"
    rc = main(["validate", "--plan", str(plan), "--hw", str(hw), "--warmup", "1", "--iters", "3",
               "--timeout", "180", "-o", str(out)])
    assert rc == 0
    assert "iteration time" in capsys.readouterr().out
    rec = load_record(out)
    d = rec.data
    assert rec.status == "ok" and d["failure"] is None
    assert d["env"]["world_size"] == 2
    assert d["env"]["threads_per_rank"] == max(1, available_cores() // 2)
    assert d["env"]["oversubscribed"] is False
    t = d["measured"]["iteration_time_s"]
    assert [len(x) for x in t["per_rank"]] == [3, 3]
    assert 0 < t["min"] <= t["median"] <= t["max"] and t["min"] <= t["mean"] <= t["max"]

    # ZeRO-3 of 118,528 fp32 parameters over 2 ranks: each rank's AdamW holds two moments of
    # its half (474,112 bytes) plus a 4-byte step per parameter tensor.
    params = build_spec(CFG).param_count
    assert params == 16384 + 2048 + 2 * 49984 + 128
    for r in d["measured"]["memory"]["per_rank"]:
        opt = r["tracker_breakdown"]["Optstate"]
        assert 2 * params * 4 / 2 <= opt <= 2 * params * 4 / 2 + 4 * 64
        assert r["tracker_peak_bytes"] == r["tracker_breakdown"]["Total"]
        assert r["rss_hwm_bytes"] > r["tracker_peak_bytes"]
    assert d["measured"]["peak_memory_bytes"] == max(r["tracker_peak_bytes"]
                                                     for r in d["measured"]["memory"]["per_rank"])

    losses = d["measured"]["losses"]
    assert losses["phases"] == ["warmup", "memory", "timed", "timed", "timed"]
    assert all(len(x) == 5 and all(math.isfinite(v) for v in x) for x in losses["per_rank"])
    assert abs(losses["per_rank"][0][0] - math.log(256)) < 0.3     # small init: near-uniform logits
    assert losses["per_rank"][0][0] != losses["per_rank"][1][0]      # each rank its own tokens

    p = d["predicted"]
    assert p["iteration_time_s"] > 0 and p["peak_memory_bytes"] > 0
    assert d["errors"]["iteration_time_rel"] == pytest.approx(
        (p["iteration_time_s"] - t["mean"]) / t["mean"])
    assert d["errors"]["peak_memory_rel"] == pytest.approx(
        (p["peak_memory_bytes"] - d["measured"]["peak_memory_bytes"]) / d["measured"]["peak_memory_bytes"])
    assert_all_gone([], d["run_id"])


@pytest.mark.slow
def test_memory_cap_gives_an_oom_record(files, tmp_path, capsys):
    hw, _ = files
    plan = tmp_path / "accum.json"     # accumulation: MemTracker must see two forwards in one step
    save_plan(uniform_plan(CFG, "zero3", devices=2, micro_batch=2, precision="fp32", grad_accum=2,
                           reduce_every_microbatch=False), plan)
    out = tmp_path / "oom.json"
    rc = main(["validate", "--plan", str(plan), "--hw", str(hw), "--warmup", "1", "--iters", "3",
               "--mem-cap", "100KiB", "--timeout", "180", "-o", str(out), "--run-dir", str(tmp_path / "run")])
    assert rc == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("osdp-sim validate: oom:") and "exceeds the cap of 102400 bytes" in err
    d = load_record(out).data
    assert d["status"] == "oom" and d["settings"]["mem_cap_bytes"] == 102400
    assert d["measured"]["peak_memory_bytes"] > 102400             # what the memory step reached
    assert [r["tracker_error"] for r in d["measured"]["memory"]["per_rank"]] == [None, None]
    assert d["measured"]["iteration_time_s"]["mean"] is None        # no timed step ran
    assert_all_gone([], d["run_id"])


@pytest.mark.slow
def test_killed_rank_fails_the_run_and_names_it(tmp_path):
    t0 = time.monotonic()
    out = launch(spec(), 2, timeout_s=120, run_dir=str(tmp_path / "run"), echo=None,
                 extra_env={"OSDP_SIM_FAULT": "kill:1:2"})
    assert time.monotonic() - t0 < 60
    assert out.status == "failed"
    assert out.failure["rank"] == 1 and out.failure["exit_code"] == -signal.SIGKILL
    assert "killed by signal SIGKILL" in out.failure["reason"]
    assert "test fault 'kill' at step 2" in out.failure["stderr_tail"]
    assert_all_gone(out.pids, out.run_id)
    rec = build_record(status=out.status, run_id=out.run_id, plan=PLAN,
                       hardware_profile={"name": "test-cpu", "path": "cpu.yaml"}, env=out.env,
                       settings={"warmup": 1, "iters": 3, "seed": 0}, rank_results=out.rank_results,
                       predicted=None, failure=out.failure)
    assert load_record(save_record(rec, tmp_path)).data["failure"]["rank"] == 1


@pytest.mark.slow
def test_hung_rank_times_out_and_every_rank_is_stopped(tmp_path):
    timeout_s = 20
    t0 = time.monotonic()
    out = launch(spec(), 2, timeout_s=timeout_s, grace_s=2, run_dir=str(tmp_path / "run"), echo=None,
                 extra_env={"OSDP_SIM_FAULT": "hang:1:2"})
    assert time.monotonic() - t0 < timeout_s + 15
    assert out.status == "timeout"
    assert out.failure["rank"] == 1, out.failure["reason"]
    assert "rank 1 is stuck outside any collective" in out.failure["reason"]
    assert "apply_fault" in out.failure["stderr_tail"]           # its stack, dumped on SIGUSR1
    assert_all_gone(out.pids, out.run_id)


@pytest.mark.slow
def test_slow_run_times_out_as_slow_not_as_hung(tmp_path):
    # rank 1 sleeps 4 s before every step from step 1 on: the run keeps progressing, too slowly
    out = launch(spec(), 2, timeout_s=14, grace_s=2, run_dir=str(tmp_path / "run"), echo=None,
                 extra_env={"OSDP_SIM_FAULT": "slow:1:1"})
    assert out.status == "timeout"
    assert "still making progress at its usual pace" in out.failure["reason"], out.failure["reason"]
    assert out.failure["rank"] is None
    assert_all_gone(out.pids, out.run_id)


def test_the_timeout_counts_from_the_command_start(tmp_path):
    # validate passes started_s (when the command began): loading and predicting count against
    # --timeout too. Sleeping processes stand in for ranks (no torch, no rendezvous).
    from osdp_sim.runtime.launch import _monitor, _terminate
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        t0 = time.monotonic()
        status, failure = _monitor(procs, tmp_path, 10.0, None, t0 - 9.5)
        assert status == "timeout" and "timeout after 10 s" in failure["reason"]
        assert time.monotonic() - t0 < 6.0            # 0.5 s left, 1 s for the stacks; not 10 more
    finally:
        _terminate(procs, 1.0)


@pytest.mark.parametrize("extra,needle", [
    (["--timeout", "0"], "--timeout: expected a positive, finite number of seconds, got 0"),
    (["--timeout", "-5"], "--timeout: expected a positive, finite number of seconds, got -5"),
    (["--timeout", "nan"], "--timeout: expected a positive, finite number of seconds, got nan"),
    (["--seed", str(2**64)], "--seed: expected at most 4294967295"),
    (["--threads", "100000"], "--threads: expected at most"),     # was a failed run from torch's setup
    (["-o", "/proc/x.json"], "/proc/x.json: -o: cannot write a file in /proc"),
    (["-o", "{d}"], "{d}: -o: is a folder"),
    (["--records-dir", "{d}/plan.json"], "{d}/plan.json: --records-dir: exists and is not a folder"),
    (["--run-dir", "/proc/run"], "/proc/run: --run-dir: cannot"),
    (["--model", "gpt2-1.5b"], "--model: conflicts with --plan"),      # were ignored: the plan ran
    (["--micro-batch", "64"], "--micro-batch: conflicts with --plan"),
    (["--precision", "bf16"], "--precision: conflicts with --plan"),
    (["--checkpoint"], "--checkpoint: conflicts with --plan"),
])
def test_bad_flags_are_errors_before_any_rank_starts(files, tmp_path, capsys, extra, needle):
    # each used to start the ranks first (a "timeout" blaming a collective, a traceback at the end)
    hw, plan = files
    extra = [a.format(d=tmp_path) for a in extra]
    t0 = time.monotonic()
    assert main(["validate", "--plan", str(plan), "--hw", str(hw)] + extra) == 2
    assert time.monotonic() - t0 < 5.0                 # no rank was started
    err = capsys.readouterr().err.strip()
    assert needle.format(d=tmp_path) in err and "\n" not in err


def test_more_cpu_ranks_than_memory_holds_is_an_error_before_any_starts(files, capsys):
    hw, _ = files
    assert main(["validate", "--hw", str(hw), "--strategy", "zero3", "--model", "gpt2-tiny",
                 "--micro-batch", "1", "--nproc", "100000"]) == 2      # was: 100000 processes started
    err = capsys.readouterr().err.strip()
    assert "--nproc: 100000 CPU ranks need at least" in err and "\n" not in err


def test_stalled_means_far_past_the_usual_gap():
    from osdp_sim.runtime.launch import STALL_MIN_S, stalled_for
    assert not stalled_for(STALL_MIN_S - 1, 0.1)       # short steps: a few seconds of quiet is fine
    assert stalled_for(STALL_MIN_S + 1, 0.1)
    assert not stalled_for(20.0, 8.0)                  # 8 s steps: 20 s is within three of them
    assert stalled_for(25.0, 8.0)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_stopping_the_launcher_stops_every_rank(tmp_path, sig):
    run_id = f"interrupt-test-{sig.name}-{os.getpid()}"
    run_dir = tmp_path / "run"
    code = textwrap.dedent(f"""
        import json, sys
        from osdp_sim.cli.common import run_reporting
        from osdp_sim.runtime.launch import launch
        spec = json.loads(sys.argv[1])
        sys.exit(run_reporting(lambda: launch(spec, 2, timeout_s=300, run_dir={str(run_dir)!r}, echo=None),
                               "launcher"))
    """)
    launcher = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec(run_id=run_id))],
                                stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, OSDP_SIM_FAULT="hang:1:0"))
    try:
        deadline = time.monotonic() + 120
        while not all("started" in _read(run_dir / f"rank{r}.log") for r in range(2)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.2)
        ranks = [p for p in processes_with(run_id) if p != launcher.pid]   # its argv holds the id too
        assert len(ranks) == 2
        launcher.send_signal(sig)
        err = launcher.communicate(timeout=30)[1]
        if sig == signal.SIGINT:      # says where the run's folder was left (was: nothing)
            assert launcher.returncode == 130
            assert f"launcher: interrupted (Ctrl-C; every rank was stopped; rank logs kept in {run_dir})" in err
        deadline = time.monotonic() + 15
        while (processes_with(run_id) or any(alive(p) for p in ranks)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert_all_gone(ranks, run_id)
    finally:                           # a failing test must not leave its launcher running
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in processes_with(run_id):
            os.kill(pid, signal.SIGKILL)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def test_other_cpu_fraction_counts_our_own_process_as_ours():
    from osdp_sim.runtime.launch import CpuAccount, cpu_account, other_cpu_fraction
    # 10 s on 2 CPUs: 10 busy core-seconds, 5 of them ours -> others kept 5 / 20 of the CPUs busy
    assert other_cpu_fraction(CpuAccount(0.0, 10.0, 1.0, 2), CpuAccount(10.0, 20.0, 6.0, 2)) == 0.25
    assert other_cpu_fraction(CpuAccount(0.0, 10.0, 1.0, 2), CpuAccount(10.0, 12.0, 6.0, 2)) == 0.0
    a = cpu_account()
    if a is None:
        pytest.skip("no /proc/stat")
    t = time.process_time()
    while time.process_time() - t < 0.3:        # this process's own CPU (a campaign's priority thread)
        pass
    b = cpu_account()
    assert b.ours_s - a.ours_s >= 0.25
