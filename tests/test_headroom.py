"""--headroom: a safety margin below the limit (search, pareto, the API), and the margin each
report states between the plan's peak and the device's usable memory."""

import contextlib
import io
import json
import math

import pytest

import osdp_sim
from osdp_sim.cli.main import main
from osdp_sim.errors import UserError
from osdp_sim.hardware.load import load_profile
from osdp_sim.planner.headroom import Headroom, margin_line, parse_headroom, planning_limit
from osdp_sim.units import format_bytes

MiB, GiB = 2**20, 2**30
TINY = ["search", "--hw", "titan8", "--model", "gpt2-tiny", "--splits", "1,2", "--micro-batch", "1,2,4,8"]
USABLE = load_profile("titan8").device.usable_memory_bytes        # 23 GiB


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def search_json(*extra):
    rc, out, err = run_cli(TINY + ["--json", *extra])
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("text,expected", [
    ("2GiB", Headroom(size_bytes=2 * GiB)), ("512MiB", Headroom(size_bytes=512 * MiB)),
    (1000, Headroom(size_bytes=1000)), ("10%", Headroom(fraction_of_limit=0.10)),
    ("2.5 %", Headroom(fraction_of_limit=0.025)), ("0", Headroom()), (0, Headroom()), (None, Headroom()),
    ("0%", Headroom()),
])
def test_sizes_and_percentages_parse(text, expected):
    assert parse_headroom(text) == expected


def test_the_planning_limit_is_the_capped_limit_less_the_headroom():
    assert planning_limit(8 * GiB, 23 * GiB, Headroom(size_bytes=GiB)) == (7 * GiB, GiB)
    # a percentage is of min(limit, usable): 10% of 8 GiB, and of 23 GiB when the limit is above it
    assert planning_limit(8 * GiB, 23 * GiB, Headroom(fraction_of_limit=0.1)) == pytest.approx((7.2 * GiB, 0.8 * GiB))
    assert planning_limit(40 * GiB, 23 * GiB, Headroom(fraction_of_limit=0.1)) == pytest.approx((20.7 * GiB, 2.3 * GiB))


@pytest.mark.parametrize("value,needle", [
    ("-1GiB", "must not be negative"), ("-5%", "percentage in 0..100"), ("nan%", "percentage in 0..100"),
    ("nan", "expected a size"), ("150%", "percentage in 0..100"), ("100%", "percentage in 0..100"),
    ("400MiB", "leaves no memory below the 400.00 MiB limit"), ("1TiB", "leaves no memory"),
    ("lots", "expected a size"),
])
def test_bad_values_are_one_line_errors_naming_headroom(value, needle):
    rc, out, err = run_cli(TINY + ["--mem-limit", "400MiB", f"--headroom={value}"])   # = for "-1GiB"
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--headroom" in lines[0] and needle in lines[0], err
    assert "Traceback" not in err


def test_the_api_refuses_the_same_values_naming_headroom():
    for value in (-1, float("nan"), "150%", "400MiB"):
        with pytest.raises(UserError, match="headroom"):
            osdp_sim.search("gpt2-tiny", "titan8", "400MiB", headroom=value)


def test_headroom_lowers_the_limit_so_a_plan_that_fit_no_longer_does():
    free = search_json("--mem-limit", "160MiB")
    peak = free["predicted"]["peak_memory_bytes"]
    assert free["headroom_bytes"] == 0 and free["mem_limit_bytes"] == 160 * MiB
    room = 160 * MiB - peak + MiB                   # leaves 1 MiB less than the plan needed
    tight = search_json("--mem-limit", "160MiB", "--headroom", str(int(room)))
    assert tight["mem_limit_bytes"] == 160 * MiB - int(room)
    assert tight["predicted"]["peak_memory_bytes"] <= tight["mem_limit_bytes"] < peak
    assert tight["plan"] != free["plan"]


def test_the_default_is_no_headroom():
    a, b = search_json("--mem-limit", "160MiB"), search_json("--mem-limit", "160MiB", "--headroom", "0")
    a["search"].pop("seconds"), b["search"].pop("seconds")          # differ run to run
    assert a == b


def test_a_percentage_takes_that_share_of_the_limit_and_the_margin_is_usable_less_peak():
    d = search_json("--mem-limit", "400MiB", "--headroom", "10%")
    assert d["mem_limit_bytes"] == 360 * MiB and d["headroom_bytes"] == 40 * MiB
    assert d["usable_memory_bytes"] == 23 * GiB
    assert d["predicted"]["margin_bytes"] == 23 * GiB - d["predicted"]["peak_memory_bytes"]


def test_the_text_report_states_the_margin_in_one_line():
    rc, out, _ = run_cli(TINY + ["--mem-limit", "400MiB", "--headroom", "40MiB"])
    assert rc == 0
    peak = search_json("--mem-limit", "400MiB", "--headroom", "40MiB")["predicted"]["peak_memory_bytes"]
    margin = [line for line in out.splitlines() if line.startswith("margin")]
    assert len(margin) == 1
    m = USABLE - peak
    assert margin[0] == (f"margin          {format_bytes(m)} below the 23.00 GiB usable per device "
                         f"({m / USABLE:.1%}); headroom asked 40.00 MiB")


def test_margin_line_by_hand():
    assert margin_line(20 * GiB, 23 * GiB, 2 * GiB) == \
        "3.00 GiB below the 23.00 GiB usable per device (13.0%); headroom asked 2.00 GiB"


def test_pareto_states_the_margin_of_each_chosen_plan(tmp_path):
    rc, out, err = run_cli(["pareto", "--hw", "titan8", "--model", "gpt2-tiny", "--splits", "1", "--micro-batch",
                            "1,2", "--mem-limit", "300MiB", "--headroom", "10%", "-o", str(tmp_path / "p.png")])
    assert rc == 0, err
    chosen = [line for line in out.splitlines() if line.strip().startswith("within")]
    assert len(chosen) == 1 and chosen[0].startswith("  within 270.00 MiB: ")
    assert "usable per device" in chosen[0] and "headroom asked 30.00 MiB" in chosen[0]


def test_the_api_takes_headroom_and_serialises_it_as_the_cli_does():
    r = osdp_sim.search("gpt2-tiny", "titan8", "400MiB", headroom="10%", splits=(1, 2), micro_batches=(1, 2, 4, 8))
    assert r.mem_limit_bytes == 360 * MiB and r.headroom_bytes == 40 * MiB
    api = r.to_json()
    cli = search_json("--mem-limit", "400MiB", "--headroom", "10%")
    for d in (api, cli):
        d["search"].pop("seconds")
    assert api == cli
    front = osdp_sim.pareto("gpt2-tiny", "titan8", mem_max="300MiB", headroom="30MiB", splits=(1,),
                            micro_batches=(1, 2))
    assert front.mem_max_bytes == 270 * MiB
    assert all(p <= 270 * MiB for p, _, _ in front.points)
    assert front.margin_bytes(front.points[-1][0]) == USABLE - front.points[-1][0]
    assert math.isfinite(front.usable_memory_bytes)


def test_zero_in_any_unit_is_no_headroom():
    assert parse_headroom("0GiB") == parse_headroom("0 MiB") == Headroom()


def test_the_report_and_the_infeasible_message_say_the_limit_is_after_the_headroom():
    rc, out, _ = run_cli(TINY + ["--mem-limit", "400MiB", "--headroom", "10%"])
    assert rc == 0
    assert out.splitlines()[1].endswith("limit 360.00 MiB per device (40.00 MiB of headroom kept free below "
                                        "400.00 MiB)")
    rc, _, err = run_cli(["search", "--hw", "titan8", "--model", "gpt2-tiny", "--mem-limit", "40MiB",
                          "--headroom", "10%", "--no-checkpoint", "--micro-batch", "4", "--time-limit", "20"])
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert "fits 36.00 MiB per device" in line and "(36.00 MiB is the limit less --headroom 4.00 MiB" in line


def test_estimate_states_the_margin_too():
    rc, out, _ = run_cli(["estimate", "--hw", "titan8", "--model", "gpt2-tiny", "--strategy", "zero3",
                          "--micro-batch", "2", "--json"])
    d = json.loads(out)
    assert rc == 0 and d["margin_bytes"] == USABLE - d["peak_memory_bytes"] and d["usable_memory_bytes"] == USABLE
    rc, out, _ = run_cli(["estimate", "--hw", "titan8", "--model", "gpt2-tiny", "--strategy", "zero3",
                          "--micro-batch", "2"])
    m = USABLE - d["peak_memory_bytes"]
    assert out.splitlines()[-1] == f"margin                   {format_bytes(m)} below the 23.00 GiB usable per device ({m / USABLE:.1%})"
