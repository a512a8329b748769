"""How much to trust a number: every report says whether its profile is documented, measured or
calibrated (with its leave-one-plan-out errors), and a documented one warns on stderr only."""

import json

import pytest

from osdp_sim.cli.main import main
from osdp_sim.hardware.load import load_profile
from osdp_sim.hardware.trust import trust_of


def test_the_shipped_profiles_kinds_and_errors():
    cal = trust_of(load_profile("cpu-2core-calibrated"))
    # provenance.calibration of the committed file: 32 runs, leave-one-plan-out time MAPE 0.0802307
    assert (cal.kind, cal.runs) == ("calibrated", 32)
    assert cal.time_error == pytest.approx(0.0802307)
    assert "calibrated on 32 real runs" in cal.line() and "time 8.0%" in cal.line()
    assert trust_of(load_profile("h200x1-calibrated")).runs == 14
    assert trust_of(load_profile("cpu-2core")).kind == "measured"
    assert trust_of(load_profile("cpu-2core-20261201")).kind == "measured"
    for name in ("titan8", "a100x8", "h100x8", "h100-2x8"):
        assert trust_of(load_profile(name)).kind == "documented"
        assert trust_of(load_profile(name)).warning() is not None
    assert cal.warning() is None
    # a documented profile whose efficiency_scale was fitted to published runs says so (its file's
    # provenance.published_fit: 12 runs, 8.8% on the 9 held out)
    h100 = trust_of(load_profile("h100x8"))
    assert h100.published_fit["runs"] == 12 and h100.published_fit["held_out_runs"] == 9
    assert "efficiency_scale fitted to 12 published runs; error 8.8% on 9 published runs" in h100.line()
    assert "off by 9% on average" in h100.warning()
    assert trust_of(load_profile("titan8")).published_fit is None


def test_a_documented_profile_warns_on_stderr_and_json_stays_parseable(capsys):
    args = ["estimate", "--model", "gpt2-tiny", "--strategy", "zero3", "--micro-batch", "1", "--json"]
    assert main(args + ["--hw", "titan8"]) == 0
    got = capsys.readouterr()
    out = json.loads(got.out)
    assert out["provenance"] == {"kind": "documented", "runs": None, "time_error": None, "memory_error": None}
    assert "warning: titan8: the hardware profile is documented" in got.err
    assert main(args + ["--hw", "cpu-2core-calibrated"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["provenance"]["kind"] == "calibrated" and "warning" not in got.err


def test_every_report_prints_the_provenance_next_to_throughput(capsys):
    assert main(["search", "--hw", "cpu-2core", "--model", "gpt2-tiny", "--mem-limit", "1GiB", "--no-split",
                 "--micro-batch", "1", "--time-limit", "20"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("throughput"))
    assert "profile measured on the machine" in lines[i + 1]
