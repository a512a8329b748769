"""`osdp-sim search`: the report, the JSON object, the plan file, and one-line failures."""

import contextlib
import io
import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from osdp_sim.cli.main import main
from osdp_sim.costmodel import estimate
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.plan import load_plan, plan_from_dict

TINY = ["search", "--hw", "titan8", "--model", "gpt2-tiny", "--splits", "1,2", "--micro-batch", "1,2,4,8"]


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def json_run(tmp_path_factory):
    """One search shared by the JSON and plan-file tests."""
    path = tmp_path_factory.mktemp("search") / "plan.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(TINY + ["--mem-limit", "400MiB", "--json", "--top-k", "2", "-o", str(path)])
    return rc, json.loads(buf.getvalue()), path


def test_json_has_plan_prediction_baselines_and_certificate(json_run):
    rc, d, _ = json_run
    assert rc == 0
    for key in ("peak_memory_bytes", "iteration_time_s", "samples_per_s"):
        assert isinstance(d["predicted"][key], float)
    assert d["predicted"]["peak_memory_bytes"] <= 400 * 2**20
    for name in ("ddp", "zero2", "zero3", "osdp_knapsack"):
        assert {"feasible", "samples_per_s", "peak_memory_bytes"} <= set(d["baselines"][name])
    assert {"seconds", "nodes", "optimal"} <= set(d["search"])
    assert d["search"]["optimal"] is True
    plan = plan_from_dict(d["plan"])
    est = estimate(load_model("gpt2-tiny"), load_profile("titan8"), plan)
    assert est.samples_per_s == pytest.approx(d["predicted"]["samples_per_s"], rel=1e-12)


def test_plan_file_is_the_reported_plan(json_run, capsys):
    _, d, path = json_run
    plan = load_plan(path)
    assert plan == plan_from_dict(d["plan"])
    assert plan.notes["predicted"]["samples_per_s"] == d["predicted"]["samples_per_s"]
    # ... and `osdp-sim estimate --plan` reads it back to the same prediction.
    rc, out, _ = run(["estimate", "--hw", "titan8", "--plan", str(path), "--json"], capsys)
    assert rc == 0 and json.loads(out)["samples_per_s"] == pytest.approx(d["predicted"]["samples_per_s"])


def test_report_printed(capsys):
    rc, out, err = run(TINY[:-2] + ["--mem-limit", "1GiB", "--no-checkpoint", "--micro-batch", "2"], capsys)
    assert rc == 0
    for needle in ("plan\n", "micro-batch 2 x 1 accumulation", "checkpointing: 0 of 4 blocks",
                   "peak memory", "baselines", "certificate", "why"):
        assert needle in out
    assert "searching gpt2-tiny" in err


def test_nothing_fits_exits_2_with_the_least_memory_and_what_would_fit():
    # The real entry point in a subprocess: no traceback may reach the user.
    p = subprocess.run([sys.executable, "-m", "osdp_sim.cli.main"] + TINY[:-2] + ["--mem-limit", "20MiB",
                        "--no-checkpoint", "--micro-batch", "4"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    # progress lines ("osdp-sim: ...", "search: ...") may precede the one error line
    msg = [line for line in p.stderr.splitlines() if line.startswith("osdp-sim search: ")]
    assert len(msg) == 1
    assert "no plan of gpt2-tiny fits 20.00 MiB per device on 8 devices" in msg[0]
    assert "the least peak memory any plan in the space reaches is" in msg[0]
    assert "allowing checkpointing" in msg[0] and "micro-batch 1" in msg[0] and "16 devices" in msg[0]


@pytest.mark.parametrize("extra, needle", [
    (["--mem-limit", "8 parsecs"], "--mem-limit: unknown size unit"),
    (["--mem-limit", "lots"], "--mem-limit: expected a size such as 8GiB"),
    (["--mem-limit", "1GiB", "--strategies", "ddp,zero4"], "--strategies: unknown value 'zero4'"),
    (["--mem-limit", "1GiB", "--splits", "1,3"], "--splits: unknown value '3'"),
    (["--mem-limit", "1GiB", "--shard-group", "3"], "--shard-group: 3 must divide the device count 8"),
    (["--mem-limit", "1GiB", "--micro-batch", "2,0"], "--micro-batch: '0' is not a positive whole number"),
])
def test_bad_input_is_one_line_exit_2(extra, needle, capsys):
    rc, out, err = run(TINY + extra, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_unknown_model_is_one_line_exit_2(capsys):
    rc, _, err = run(["search", "--hw", "titan8", "--model", "gpt5", "--mem-limit", "8GiB"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "unknown model 'gpt5'" in err


def test_graph_caps_reach_the_search(capsys, monkeypatch):
    # with the probe off every configuration goes to the key graph; a cap of one key per level
    # abandons each graph, and the search still proves the optimum with the relaxed bounds
    import osdp_sim.planner.bnb as bnb
    monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0))
    argv = TINY[:-2] + ["--micro-batch", "2", "--mem-limit", "50MiB", "--json"]   # ZeRO-2 (52 MiB) does not fit
    rc, out, err = run(argv + ["--graph-max-keys", "1"], capsys)
    assert rc == 0 and json.loads(out)["search"]["optimal"] is True
    assert "key graph too large (over 1 keys on a level or 300000 stage simulations)" in err
    # under a time limit the second try, ten times larger, has a share of the time left
    assert re.search(r"key graph again with caps 10 keys per level, 3000000 stage simulations, within [0-9.]+ s", err)
    rc, out2, err = run(argv, capsys)
    assert "key graph too large" not in err and "key graph of" in err
    assert json.loads(out2)["predicted"] == json.loads(out)["predicted"]
    # run to the proof: the second try has no time limit either
    rc, out3, err = run(argv + ["--graph-max-keys", "1", "--time-limit", "0"], capsys)
    assert "key graph again with caps 10 keys per level, 3000000 stage simulations\n" in err
    assert json.loads(out3)["predicted"] == json.loads(out)["predicted"]


def test_the_larger_graph_has_its_share_of_the_time_limit(capsys, monkeypatch):
    # no share of the time left for the second, larger graph: the configuration is searched with
    # what it has, and the optimum is the same
    import osdp_sim.planner.bnb as bnb
    argv = TINY[:-2] + ["--micro-batch", "2", "--mem-limit", "50MiB", "--json", "--graph-max-keys", "1"]
    monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0))
    rc, out, err = run(argv, capsys)
    monkeypatch.setattr(bnb, "TUNING", replace(bnb.TUNING, probe_nodes=0, retry_time_fraction=0.0))
    rc2, out2, err2 = run(argv, capsys)
    assert rc == rc2 == 0 and "within 0.0 s" in err2
    assert "the larger key graph: not built in its share of the time; searched with the relaxed bounds" in err2
    assert json.loads(out2)["search"]["optimal"] is True
    assert json.loads(out2)["predicted"] == json.loads(out)["predicted"]


def test_gap_tolerance_reaches_the_search(capsys):
    argv = TINY + ["--mem-limit", "400MiB", "--json"]
    rc, out, err = run(argv + ["--gap", "20"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["search"]["status"] in ("optimal", "within_gap")
    assert "by more than 20.00%" in err                       # the progress line names the tolerance
    exact = json.loads(run(argv, capsys)[1])
    assert d["predicted"]["samples_per_s"] * 1.2 >= exact["predicted"]["samples_per_s"] * (1 - 1e-9)
    assert d["search"]["gap"] <= 0.2 + 1e-9
    rc, _, err = run(argv + ["--gap", "100"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--gap" in err and "below 100" in err
