"""osdp-sim sweep and osdp_sim.api.sweep: the grid, the per-point answers, the whole-grid time
limit, the inter-node link past one node, and the outputs (tiny models, no splits, fixed
micro-batches: each sweep here takes well under a few seconds)."""

import csv
import itertools
import json
import time

import pytest

from osdp_sim.api import sweep
from osdp_sim.cli.main import main
from osdp_sim.hardware.load import load_profile
from osdp_sim.planner.whatif import NOT_RUN, SweepAxes, check_devices, grid, parse_inter_node, point_hardware

TINY = ["sweep", "--hw", "a100x8", "--model", "gpt2-tiny", "--no-split", "--micro-batch", "2"]


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_grid_is_the_product_of_the_axes():
    r = sweep("gpt2-tiny", "a100x8", devices=[2, 4], mem_limit=["100MiB", "1GiB"], bandwidth_scale=[1, 2],
              micro_batch=2, splits=(1,), time_limit_s=60)
    want = list(itertools.product((2, 4), (100 * 2**20, 2**30), (1, 2)))
    assert [(p.devices, p.mem_limit_bytes, p.bandwidth_scale) for p in r.points] == want
    assert all(p.micro_batch == 2 and p.model == "gpt2-tiny" for p in r.points)
    assert r.complete and all(p.status == "optimal" for p in r.points)
    hw = load_profile("a100x8")
    assert len(grid(SweepAxes(model=("a", "b"), seq_len=(64, 128, 256), compute_scale=(1.0, 2.0)), hw)) == 12


def test_a_scaled_bandwidth_never_lowers_throughput_point_by_point():
    r = sweep("gpt2-tiny", "a100x8", devices=[2, 8, 16], bandwidth_scale=[1, 2, 4], mem_limit="100MiB",
              micro_batch=[2, 4], inter_node="25", splits=(1,), time_limit_s=120)
    assert all(p.status == "optimal" for p in r.points)
    by = {}
    for p in r.points:
        by.setdefault((p.devices, p.micro_batch), []).append((p.bandwidth_scale, p.samples_per_s))
    for series in by.values():
        sps = [s for _, s in sorted(series)]
        assert sps == sorted(sps), series
    # ... and on the 16-device points, which cross nodes, the link between them is scaled too
    hw = point_hardware(load_profile("a100x8"), 16, parse_inter_node("25,5"), bandwidth_scale=2.0)
    assert hw.collectives.inter.busbw_bytes_per_s == 50e9 and hw.collectives.inter.latency_s == pytest.approx(5e-6)
    assert hw.collectives.tables[0].busbw_bytes_per_s[0] == pytest.approx(2 * 19.8e9)


def test_compute_scale_multiplies_peak_flops():
    hw = load_profile("h100x8")
    h = point_hardware(hw, 8, compute_scale=2.0)
    assert h.compute.peak_flops["bf16"] == 2 * hw.compute.peak_flops["bf16"]
    assert h.collectives == hw.collectives


def test_infeasible_points_are_reported_and_more_devices_never_raise_the_least_zero3_peak(capsys):
    r = sweep("gpt2-tiny", "a100x8", devices=[1, 2, 4, 8, 16, 32], mem_limit="1MiB", inter_node="25",
              splits=(1,), time_limit_s=60)
    assert [p.status for p in r.points] == ["infeasible"] * 6
    assert all(p.samples_per_s is None and p.min_peak_memory_bytes > 2**20 and p.min_peak_proven for p in r.points)
    zero3 = [p.baselines["zero3"].peak_memory_bytes for p in r.points]
    assert zero3 == sorted(zero3, reverse=True) and zero3[0] > zero3[-1]
    rc, out, _ = run(TINY + ["--mem-limit", "1MiB,1GiB", "--gpus", "2"], capsys)
    assert rc == 0
    rows = [ln for ln in out.splitlines() if ln.startswith("gpt2-tiny")]
    assert "infeasible" in rows[0] and "needs" in rows[0] and "optimal" in rows[1]


def test_the_whole_grid_time_limit_is_kept_with_partial_results(capsys):
    t0 = time.perf_counter()
    # open micro-batches and splits on a 124M model: each point's search would take far longer
    r = sweep("gpt2-124m", "a100x8", seq_len=list(range(256, 256 + 40 * 16, 16)), time_limit_s=3)
    took = time.perf_counter() - t0
    assert took < 3 + 2.0, took
    assert len(r.points) == 40 and not r.complete
    ran = [p for p in r.points if p.status != NOT_RUN]
    assert ran and r.points[0].status != NOT_RUN
    left = [p for p in r.points if p.status == NOT_RUN]
    assert left and all(p.message == "not run: time limit" for p in left)
    # not-run points come after the run ones (grid order is kept)
    assert [p.status == NOT_RUN for p in r.points] == sorted(p.status == NOT_RUN for p in r.points)


def test_past_one_node_needs_an_inter_node_link(capsys):
    rc, out, err = run(TINY + ["--gpus", "8,16"], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "--gpus" in err and "no inter-node link" in err and "--inter-node" in err
    hw = load_profile("a100-2x8")
    assert "the profile a100-2x8" in check_devices(hw, (32,), None)
    assert check_devices(hw, (8,), None) is None
    assert check_devices(load_profile("a100x8"), (16,), parse_inter_node("25")).startswith("--inter-node")


@pytest.mark.parametrize("extra, flag", [
    (["--gpus", "0"], "--gpus"), (["--gpus", "4,x"], "--gpus"), (["--gpus", "12", "--inter-node", "25"], "--gpus"),
    (["--gpus", "4,,8"], "--gpus"), (["--seq-len", "1.5"], "--seq-len"), (["--mem-limit", "lots"], "--mem-limit"),
    (["--bandwidth-scale", "-1"], "--bandwidth-scale"), (["--compute-scale", "nan"], "--compute-scale"),
    (["--bandwidth-scale", "inf"], "--bandwidth-scale"), (["--inter-node", "fast"], "--inter-node"),
    (["--inter-node", "25,-3"], "--inter-node"), (["--splits", "3"], "--splits"),
    (["--strategies", "zero4"], "--strategies"), (["--time-limit", "-1"], "--time-limit"),
])
def test_bad_axis_values_are_one_line_errors(extra, flag, capsys):
    rc, out, err = run(TINY + extra, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


def test_a_bad_model_is_a_one_line_error_before_any_point(capsys):
    rc, _, err = run(["sweep", "--hw", "a100x8", "--model", "gpt2-tiny,no-such-model", "--no-split"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "no-such-model" in err


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    argv = TINY + ["--gpus", "2,4", "--bandwidth-scale", "1,2", "--mem-limit", "1MiB,1GiB", "--json",
                   "--csv", str(d / "s.csv"), "--plot", str(d / "s.png")]
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main(argv)
    return rc, json.loads(buf.getvalue()), d, err.getvalue()


def test_json_has_format_version_and_one_object_per_point(outputs):
    rc, doc, _, err = outputs
    assert rc == 0
    assert doc["format"] == "osdp-sim/sweep" and doc["version"] == 1
    assert len(doc["points"]) == 8 and doc["complete"] is True
    assert doc["axes"]["devices"] == [2, 4] and doc["axes"]["bandwidth_scale"] == [1.0, 2.0]
    ok = [p for p in doc["points"] if p["status"] == "optimal"]
    bad = [p for p in doc["points"] if p["status"] == "infeasible"]
    assert len(ok) == 4 and len(bad) == 4
    assert all(p["samples_per_s"] > 0 and p["gap"] == 0 and set(p["baselines"]) == {"ddp", "zero2", "zero3"}
               for p in ok)
    assert all(p["samples_per_s"] is None and p["min_peak_memory_bytes"] > 2**20 for p in bad)
    assert err.count("point ") == 8 and "s left" in err      # progress per point on stderr


def test_csv_has_one_row_per_point_and_the_plot_is_written(outputs):
    _, doc, d, _ = outputs
    with open(d / "s.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(doc["points"]) == 8
    assert [float(r["samples_per_s"]) if r["samples_per_s"] else None for r in rows] == \
        [p["samples_per_s"] for p in doc["points"]]
    assert (d / "s.png").stat().st_size > 10_000 and (d / "s.svg").exists()


def test_output_paths_are_checked_before_the_work(tmp_path, capsys):
    t0 = time.perf_counter()
    rc, _, err = run(["sweep", "--hw", "a100x8", "--model", "gpt2-124m", "--csv", str(tmp_path)], capsys)
    assert rc == 2 and "--csv" in err and time.perf_counter() - t0 < 2
    rc, _, err = run(["sweep", "--hw", "a100x8", "--model", "gpt2-124m", "--plot", str(tmp_path / "p.jpg")], capsys)
    assert rc == 2 and "--plot" in err


def test_a_multi_node_profile_scales_past_its_count_with_its_own_link():
    r = sweep("gpt2-tiny", "a100-2x8", devices=[8, 32], micro_batch=1, splits=(1,), time_limit_s=60)
    assert [p.status for p in r.points] == ["optimal", "optimal"]
    assert r.inter_node.startswith("the profile a100-2x8") and "past its 16 devices" in r.inter_node
    assert r.points[1].samples_per_s > r.points[0].samples_per_s


@pytest.mark.parametrize("kwargs, needle", [
    ({"time_limit_s": float("nan")}, "time_limit_s"), ({"devices": [0]}, "--gpus"),
    ({"mem_limit": "lots"}, "mem_limit"), ({"bandwidth_scale": [1, -2]}, "--bandwidth-scale"),
    ({"seq_len": [128.5]}, "--seq-len"), ({"inter_node": "x"}, "--inter-node"),
    ({"space": object(), "splits": (1,)}, "space"),
])
def test_api_arguments_are_user_errors_naming_the_field(kwargs, needle):
    from osdp_sim.errors import UserError
    with pytest.raises(UserError, match=needle):
        sweep("gpt2-tiny", "a100x8", **kwargs)


def test_headroom_lowers_every_points_search_limit_and_the_margin_is_reported(capsys):
    from osdp_sim.cli.main import main
    args = ["sweep", "--hw", "titan8", "--model", "gpt2-tiny", "--mem-limit", "30MiB,1GiB", "--no-split",
            "--micro-batch", "1", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["points"]
    assert main(args + ["--headroom", "10%"]) == 0
    kept = json.loads(capsys.readouterr().out)["points"]
    usable = 23 * 2**30
    for a, b in zip(plain, kept):
        assert b["mem_limit_bytes"] == a["mem_limit_bytes"]                      # the axis value
        assert b["headroom_bytes"] == pytest.approx(0.1 * a["mem_limit_bytes"])  # 10% of min(limit, usable)
        assert b["peak_memory_bytes"] <= 0.9 * a["mem_limit_bytes"]
        assert b["margin_bytes"] == pytest.approx(usable - b["peak_memory_bytes"])
    assert kept[0]["samples_per_s"] < plain[0]["samples_per_s"]                 # 27 MiB binds at 30 MiB
    assert main(args + ["--headroom", "40MiB"]) == 2                            # nothing left at 30 MiB
    assert "--headroom: 40.00 MiB leaves no memory below the 30.00 MiB limit" in capsys.readouterr().err


def test_the_apis_sweep_result_serialises_to_the_clis_json(capsys):
    import osdp_sim
    from osdp_sim.cli.main import main
    assert main(["sweep", "--hw", "titan8", "--model", "gpt2-tiny", "--mem-limit", "1GiB", "--no-split",
                 "--micro-batch", "1,2", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    api = osdp_sim.sweep("gpt2-tiny", "titan8", mem_limit="1GiB", micro_batch=[1, 2], splits=(1,)).to_json()
    drop = ("seconds",)
    strip = lambda d: {k: v for k, v in d.items() if k not in drop}         # noqa: E731
    top = lambda d: {k: v for k, v in strip(d).items() if k != "points"}   # noqa: E731
    assert top(cli) == top(json.loads(json.dumps(api)))
    assert [strip(p) for p in cli["points"]] == [strip(p) for p in json.loads(json.dumps(api))["points"]]
    assert api["format"] == cli["format"] == "osdp-sim/sweep"
