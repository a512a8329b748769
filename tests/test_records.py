"""Validation records: building, naming, atomic saving, and loading with clear errors."""

import copy
import json
import statistics

import pytest

from osdp_sim.errors import UserError
from osdp_sim.model.config import ModelConfig
from osdp_sim.plan import uniform_plan
from osdp_sim.records import (build_record, load_record, load_records, record_name, save_record,
                              save_record_as, time_stats)

CFG = ModelConfig(name="tiny", family="gpt2", n_layers=2, hidden=64, n_heads=2, vocab_size=256,
                  seq_len=32)
PLAN = uniform_plan(CFG, "zero3", devices=2, micro_batch=2, precision="fp32")
ENV = {"torch": "2.13.0", "backend": "fsdp2", "backend_version": "2.13.0", "device_kind": "cpu",
       "device_name": "cpu", "world_size": 2, "threads_per_rank": 1, "cores": 2,
       "oversubscribed": False, "hostname": "h", "python": "3.11"}
SETTINGS = {"warmup": 1, "iters": 3, "seed": 0}


def rank_result(times, peak, losses):
    return {"status": "ok", "step_times_s": times, "losses": losses,
            "loss_phases": ["warmup", "memory", "timed", "timed", "timed"],
            "reached": {"phase": "timed", "step": len(times)},
            "memory": {"tracker_peak_bytes": peak, "tracker_breakdown": {"Total": peak},
                       "rss_hwm_bytes": 10 * peak}}


def make_record(**kw):
    args = dict(status="ok", run_id="r1", plan=PLAN, hardware_profile={"name": "cpu", "path": "cpu.yaml"},
                env=ENV, settings=SETTINGS,
                rank_results=[rank_result([1.0, 2.0, 3.0], 1000, [5.0, 4.0, 3.0, 2.0, 1.0]),
                              rank_result([1.5, 1.0, 3.0], 1200, [6.0, 4.0, 3.0, 2.0, 2.0])],
                predicted={"iteration_time_s": 2.6, "peak_memory_bytes": 900})
    args.update(kw)
    return build_record(**args)


def test_time_stats_takes_the_slowest_rank_per_step():
    s = time_stats([[1.0, 2.0, 3.0], [1.5, 1.0, 3.0]])
    assert s["per_step"] == [1.5, 2.0, 3.0]
    assert s["mean"] == pytest.approx(6.5 / 3)
    assert s["median"] == 2.0
    assert s["min"] == 1.5 and s["max"] == 3.0
    assert s["std"] == pytest.approx(statistics.pstdev([1.5, 2.0, 3.0]))


def test_build_record_measured_predicted_and_errors():
    rec = make_record()
    m = rec["measured"]
    assert m["peak_memory_bytes"] == 1200                       # max over ranks
    assert m["losses"]["mean"] == [5.5, 4.0, 3.0, 2.0, 1.5]
    assert rec["errors"]["iteration_time_rel"] == pytest.approx((2.6 - 6.5 / 3) / (6.5 / 3))
    assert rec["errors"]["peak_memory_rel"] == pytest.approx((900 - 1200) / 1200)
    assert rec["format"] == "osdp-sim/record" and rec["version"] == 4


def test_round_trip(tmp_path):
    rec = make_record()
    path = save_record(rec, tmp_path)
    loaded = load_record(path)
    assert loaded.to_dict() == json.loads(json.dumps(rec))
    assert loaded.plan == PLAN
    assert loaded.ok and loaded.measured_peak_memory_bytes == 1200
    assert [r.source for r in load_records([tmp_path])] == [str(path)]


def test_name_is_deterministic_and_follows_settings():
    a, b = make_record(), make_record(run_id="other")
    assert record_name(a) == record_name(b)
    assert record_name(make_record(settings=dict(SETTINGS, seed=1))) != record_name(a)
    ddp = uniform_plan(CFG, "ddp", devices=2, micro_batch=2, precision="fp32")
    assert record_name(make_record(plan=ddp)) != record_name(a)
    assert record_name(a).startswith("tiny-") and record_name(a).endswith("-n2-t1-w1-i3-s0.json")


@pytest.mark.parametrize("edit, field, words", [
    (lambda d: d.pop("measured"), "measured", "missing required field"),
    (lambda d: d["env"].pop("world_size"), "env.world_size", "missing required field"),
    (lambda d: d.update(format="osdp-sim/plan"), "format", "expected 'osdp-sim/record'"),
    (lambda d: d.update(version=7), "version", "unsupported version 7"),
    (lambda d: d.update(status="great"), "status", "expected one of ok, oom, failed, timeout"),
    (lambda d: d.update(status="failed"), "failure", "must say why"),
    (lambda d: d["measured"].update(peak_memory_bytes="1 GB"), "measured.peak_memory_bytes", "number"),
    (lambda d: d["measured"]["iteration_time_s"].update(mean=None), "measured.iteration_time_s.mean",
     "number"),
    (lambda d: d["model"].update(hidden=128), "model", "does not match plan.model"),
    (lambda d: d["plan"]["groups"].pop("root"), "groups.root", "missing"),
    (lambda d: d.update(created="yesterday"), "created", "ISO 8601"),
])
def test_malformed_records_name_file_and_field(tmp_path, edit, field, words):
    data = copy.deepcopy(make_record())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as e:
        load_record(path)
    assert str(path) in str(e.value)
    assert field in str(e.value)
    assert words in str(e.value)


def test_not_json_and_missing_file(tmp_path):
    path = tmp_path / "half.json"
    path.write_text('{"format": "osdp-sim/record", "vers')
    with pytest.raises(UserError, match="half.json: not valid JSON"):
        load_record(path)
    with pytest.raises(UserError, match="record file not found"):
        load_record(tmp_path / "nope.json")
    with pytest.raises(UserError, match="no such records folder"):
        load_records([tmp_path / "nowhere"])


def test_interrupted_write_leaves_the_old_record_and_no_partial_file(tmp_path):
    rec = make_record()
    path = save_record(rec, tmp_path)
    before = path.read_text()
    broken = make_record()
    broken["env"]["hostname"] = object()                 # passes the checks, json.dump fails
    with pytest.raises(TypeError):
        save_record(broken, tmp_path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_load_records_skips_temporaries_and_filters_status(tmp_path):
    save_record(make_record(), tmp_path / "a")
    failed = make_record(status="failed", failure={"rank": 1, "reason": "rank 1: killed by signal SIGKILL",
                                                   "exit_code": -9, "stderr_tail": ""},
                         settings=dict(SETTINGS, seed=3))
    save_record_as(failed, tmp_path / "b" / "failed.json")
    (tmp_path / "a" / ".x.json.123.tmp").write_text("{")
    (tmp_path / "a" / ".hidden.json").write_text("{")
    assert [r.status for r in load_records(tmp_path)] == ["ok", "failed"]
    assert [r.status for r in load_records(tmp_path, status="ok")] == ["ok"]


def test_failed_record_without_measurements_is_valid(tmp_path):
    rec = make_record(status="timeout", rank_results=[None, None], predicted=None,
                      failure={"rank": 1, "reason": "timeout after 20 s", "exit_code": None,
                               "stderr_tail": "..."})
    assert rec["measured"]["iteration_time_s"]["mean"] is None
    assert rec["measured"]["peak_memory_bytes"] is None
    loaded = load_record(save_record(rec, tmp_path))
    assert loaded.status == "timeout" and loaded.data["failure"]["rank"] == 1


@pytest.mark.parametrize("edit, field, words", [
    (lambda d: d["measured"]["iteration_time_s"].update(median=float("nan")),
     "measured.iteration_time_s.median", "finite"),
    (lambda d: d["measured"]["iteration_time_s"].update(mean=float("inf")),
     "measured.iteration_time_s.mean", "finite"),
    (lambda d: d["measured"]["iteration_time_s"].update(median=0), "measured.iteration_time_s.median",
     "> 0 for an ok run"),
    (lambda d: d["measured"]["iteration_time_s"].update(max=1e300), "measured.iteration_time_s.max",
     "0..1e+07"),
    (lambda d: d["measured"]["iteration_time_s"]["per_rank"][1].__setitem__(0, "1.5"),
     "measured.iteration_time_s.per_rank[1][0]", 'got "1.5"'),
    (lambda d: d["measured"]["iteration_time_s"].update(per_step=[1.0, -2.0]),
     "measured.iteration_time_s.per_step[1]", "got -2.0"),
    (lambda d: d["measured"].update(peak_memory_bytes=10**40), "measured.peak_memory_bytes", "0..1.15"),
    (lambda d: d["measured"]["memory"]["per_rank"][0].update(tracker_breakdown={"Total": "x"}),
     "measured.memory.per_rank[0].tracker_breakdown.Total", "finite"),
    (lambda d: d["measured"]["memory"]["per_rank"].__setitem__(1, []), "measured.memory.per_rank[1]",
     "object or null"),
    (lambda d: d["measured"].update(losses=[1.0]), "measured.losses", "object"),
    (lambda d: d["env"].update(world_size=2.0), "env.world_size", "got 2.0"),
    (lambda d: d["env"].update(device_kind=7), "env.device_kind", "expected text"),
    (lambda d: d["env"].update(oversubscribed="no"), "env.oversubscribed", 'got "no"'),
    (lambda d: d["hardware_profile"].update(name=None), "hardware_profile.name", "got null"),
    (lambda d: d["settings"].update(iters=True), "settings.iters", "got true"),
    (lambda d: d["settings"].update(mem_cap_bytes=1.5e9), "settings.mem_cap_bytes", "whole number"),
    (lambda d: d["predicted"].update(peak_memory_bytes=-1), "predicted.peak_memory_bytes", "got -1"),
    (lambda d: d.update(errors={"iteration_time_rel": "big"}), "errors.iteration_time_rel", "finite"),
    (lambda d: d.update(version=True), "version", "unsupported version true"),
    (lambda d: d.update(extra=1), "extra", "unknown field"),
    (lambda d: d.update(run_id=["r"]), "run_id", "expected text"),
])
def test_record_values_are_type_and_range_checked(tmp_path, edit, field, words):
    data = copy.deepcopy(make_record())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as e:
        load_record(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {field}: "), msg
    assert words in msg and "\n" not in msg, msg


def test_failure_fields_of_a_failed_record_are_checked(tmp_path):
    data = make_record(status="failed", failure={"rank": "0", "reason": "x", "exit_code": 1,
                                                 "stderr_tail": ""})
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"f\.json: failure\.rank: expected a whole number or null"):
        load_record(path)


def test_non_utf8_record_is_one_line(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(make_record()).replace('"h"', '"h\u00e9"').encode("latin-1"))
    with pytest.raises(UserError, match=rf"^{path}: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_record(path)


def test_saved_record_has_the_umask_mode(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        path = save_record(make_record(), tmp_path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_every_committed_record_still_loads():
    from pathlib import Path
    records = load_records([Path(__file__).resolve().parents[1] / "validate" / "records"])
    assert len(records) >= 60


def test_a_records_path_too_long_for_the_file_system_is_one_line():
    with pytest.raises(UserError, match=r"x{300}: cannot read this records folder or file \(File name too long\)"):
        load_records(["x" * 300])
