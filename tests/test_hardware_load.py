"""Hardware profiles: the shipped files load with the documented numbers, every malformed input is a
one-line error naming the file and key path, dict <-> profile round-trips exactly, and the
`profiles` / `models` commands work."""

import copy
import dataclasses
import math
import subprocess
import sys

import pytest
import yaml

from osdp_sim.cli.main import main
from osdp_sim.errors import UserError
from osdp_sim.hardware.dump import profile_to_dict, save_profile
from osdp_sim.hardware.load import load_profile, profile_from_dict, shipped_profiles

GiB = 2**30
SHIPPED = ("a100-2x8", "a100x8", "cpu-2core", "h100x8", "titan8")


def base_dict() -> dict:
    """A small valid profile with every optional key set (so malformed variants can remove any)."""
    return {
        "schema": "osdp-sim/hardware", "version": 1, "name": "t", "description": "test rig",
        "device": {"kind": "cuda", "name": "G", "count": 8, "per_node": 8, "memory_gib": 24,
                   "usable_memory_gib": 23.4},
        "compute": {"peak_tflops": {"fp32": 16.3, "bf16": 65.0},
                    "gemm_efficiency": {"fp32": [[0.001, 0.05], [1, 0.7]],
                                        "bf16": [[0.001, 0.02], [1, 0.45]]},
                    "memory_bandwidth_gbps": 672, "bandwidth_efficiency": 0.75,
                    "backward_forward_ratio": 2.0, "kernel_launch_us": 8, "efficiency_scale": 0.9},
        "collectives": {"launch_us": 20, "intra_node": {"latency_us": 30, "busbw_gbps": 7.5},
                        "inter_node": {"latency_us": 20, "busbw_gbps": 22.5},
                        "efficiency": {"all_gather": 0.9, "reduce_scatter": 1.1, "all_reduce": 1.0},
                        "extra_latency_us": {"all_gather": 5, "reduce_scatter": 0, "all_reduce": 12.5},
                        "tables": [{"op": "all_reduce", "group_size": 8, "scope": "intra",
                                    "sizes_bytes": [1048576, 16777216, 134217728],
                                    "busbw_gbps": [19.8, 126, 202]}]},
        "overlap": {"slowdown": 1.25},
        "memory": {"context_mib": 300, "fragmentation": 0.05},
        "provenance": {"command": "osdp-sim profile-hw", "date": "2025-01-01"},
    }


def two_nodes(d: dict) -> dict:
    d["device"].update(count=16, per_node=8)
    return d


# --- shipped profiles ---------------------------------------------------------------------------

def test_every_shipped_profile_loads_and_round_trips():
    names = sorted(p.stem for p in shipped_profiles())
    assert set(SHIPPED) <= set(names)         # measured and calibrated profiles may join them
    for path in shipped_profiles():
        hw = load_profile(path)
        assert hw.name == path.stem
        again = profile_from_dict(profile_to_dict(hw), str(path))
        assert again == hw


def test_titan8_numbers_in_si_units():
    hw = load_profile("titan8")
    assert hw.device.count == 8 and hw.device.nodes == 1
    assert hw.device.memory_bytes == 24 * GiB
    assert hw.device.usable_memory_bytes == 23 * GiB
    assert hw.compute.peak_flops["fp32"] == pytest.approx(16.3e12)
    assert hw.compute.peak_flops["bf16"] == pytest.approx(130e12)
    assert hw.compute.memory_bandwidth_bytes_per_s == pytest.approx(672e9)
    # Proteus: 4.2 GB/s algbw on 8 GPUs -> 4.2 * 2 * 7 / 8 = 7.35 GB/s busbw.
    assert hw.collectives.intra.busbw_bytes_per_s == pytest.approx(4.2e9 * 2 * 7 / 8)
    assert hw.collectives.intra.latency_s == pytest.approx(79e-6)
    assert hw.collectives.launch_s == pytest.approx(10e-6)
    assert hw.collectives.inter is None and hw.collectives.tables == ()


def test_a100_tables_carry_the_vtrain_busbw():
    hw = load_profile("a100x8")
    by_key = {(t.op, t.group_size, t.scope): t for t in hw.collectives.tables}
    assert set(by_key) == {(op, n, "intra") for op in ("all_reduce", "all_gather", "reduce_scatter")
                           for n in (2, 4, 8)}
    ar8 = by_key[("all_reduce", 8, "intra")]
    assert dict(zip(ar8.sizes_bytes, ar8.busbw_bytes_per_s)) == pytest.approx(
        {2**20: 19.8e9, 2**24: 126e9, 2**25: 164e9, 2**27: 202e9, 2**29: 224e9, 2**30: 229e9})
    assert by_key[("all_reduce", 4, "intra")].busbw_bytes_per_s[-1] == pytest.approx(222e9)
    assert by_key[("all_reduce", 2, "intra")].busbw_bytes_per_s[-1] == pytest.approx(197e9)


def test_a100_two_nodes_has_the_hdr_link():
    hw = load_profile("a100-2x8")
    assert (hw.device.count, hw.device.per_node, hw.device.nodes) == (16, 8, 2)
    assert hw.collectives.inter.busbw_bytes_per_s == pytest.approx(23.5e9)
    assert hw.collectives.inter.latency_s == pytest.approx(20e-6)


def test_h100_peak_and_plateau():
    hw = load_profile("h100x8")
    assert hw.device.memory_bytes == 80 * GiB
    assert hw.compute.peak_flops["bf16"] == pytest.approx(989e12)
    # plateau set by the measured 790 TFLOP/s bf16 matmul: 790 / 989 = 0.80
    assert hw.compute.gemm_efficiency["bf16"][-1][1] == pytest.approx(790 / 989, abs=0.005)
    assert hw.collectives.intra.busbw_bytes_per_s == pytest.approx(370e9)


# --- round trip ---------------------------------------------------------------------------------

def test_dict_profile_dict_is_exact():
    d = base_dict()
    hw = profile_from_dict(d, "x.yaml")
    assert profile_to_dict(hw) == d
    assert profile_from_dict(profile_to_dict(hw), "x.yaml") == hw
    assert hw.collectives.extra_latency_s["all_reduce"] == pytest.approx(12.5e-6)
    assert hw.memory.context_bytes == 300 * 2**20
    assert hw.device.usable_memory_bytes == round(23.4 * GiB)


def test_optional_keys_default_and_are_not_written_back():
    d = base_dict()
    for key in ("efficiency", "extra_latency_us", "tables", "inter_node"):
        del d["collectives"][key]
    del d["compute"]["efficiency_scale"], d["provenance"], d["description"]
    hw = profile_from_dict(d, "x.yaml")
    assert hw.collectives.efficiency == {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 1.0}
    assert hw.compute.efficiency_scale == 1.0 and hw.collectives.inter is None
    assert profile_to_dict(hw) == d


def test_save_profile_writes_yaml_atomically(tmp_path):
    hw = load_profile("a100-2x8")
    path = tmp_path / "sub" / "measured.yaml"
    save_profile(hw, path, header_comment="measured by osdp-sim profile-hw\non host x")
    text = path.read_text()
    assert text.startswith("# measured by osdp-sim profile-hw\n# on host x\n")
    assert "busbw_gbps: [19.8, 126, 164, 202, 224, 229]" in text   # shortest decimals, flow lists
    assert [p.name for p in path.parent.iterdir()] == ["measured.yaml"]   # no temporary left behind
    assert load_profile(path) == dataclasses.replace(hw, source=str(path))


def test_calibrated_values_survive_a_save(tmp_path):
    hw = load_profile("titan8")
    cal = dataclasses.replace(
        hw, compute=dataclasses.replace(hw.compute, efficiency_scale=0.8731),
        collectives=dataclasses.replace(hw.collectives,
                                        efficiency={"all_gather": 0.91, "reduce_scatter": 0.87,
                                                    "all_reduce": 1.0},
                                        extra_latency_s={"all_gather": 3.2e-5, "reduce_scatter": 0.0,
                                                         "all_reduce": 1e-4}))
    save_profile(cal, tmp_path / "cal.yaml")
    assert load_profile(tmp_path / "cal.yaml") == dataclasses.replace(cal, source=str(tmp_path / "cal.yaml"))


# --- name resolution ----------------------------------------------------------------------------

def test_bare_name_prefers_local_hwprofiles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hwprofiles").mkdir()
    d = base_dict()
    d["name"] = "local-titan"
    (tmp_path / "hwprofiles" / "titan8.yaml").write_text(yaml.safe_dump(d))
    assert load_profile("titan8").name == "local-titan"
    assert load_profile("a100x8").name == "a100x8"   # falls through to the shipped folder


def test_unknown_name_lists_shipped_profiles():
    with pytest.raises(UserError) as e:
        load_profile("titan9")
    msg = str(e.value)
    assert msg.startswith("titan9: no hardware profile of that name")
    assert all(name in msg for name in SHIPPED)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(UserError, match="file not found"):
        load_profile(tmp_path / "nope.yaml")


# --- malformed profiles -------------------------------------------------------------------------

def _set(path, value):
    def mutate(d):
        *parents, last = path
        node = d
        for key in parents:
            node = node[key]
        node[last] = value
        return d
    return mutate


def _del(path):
    def mutate(d):
        *parents, last = path
        node = d
        for key in parents:
            node = node[key]
        del node[last]
        return d
    return mutate


def _table(**changes):
    def mutate(d):
        d["collectives"]["tables"][0].update(changes)
        return d
    return mutate


BAD = [
    ("unknown key", _set(("device", "colour"), "green"), "device.colour", "unknown key"),
    ("missing key", _del(("compute", "peak_tflops", "bf16")), "compute.peak_tflops.bf16", "missing"),
    ("NaN", _set(("compute", "memory_bandwidth_gbps"), math.nan), "compute.memory_bandwidth_gbps", "finite"),
    ("inf", _set(("collectives", "intra_node", "busbw_gbps"), math.inf),
     "collectives.intra_node.busbw_gbps", "finite"),
    ("negative", _set(("collectives", "launch_us"), -1), "collectives.launch_us", ">= 0"),
    ("zero bandwidth", _set(("collectives", "inter_node", "busbw_gbps"), 0),
     "collectives.inter_node.busbw_gbps", "> 0"),
    ("string where number", _set(("device", "memory_gib"), "24GiB"), "device.memory_gib",
     "unit is in the key"),
    ("bool where integer", _set(("device", "count"), True), "device.count", "whole number"),
    ("float where integer", _set(("device", "per_node"), 8.0), "device.per_node", "whole number"),
    ("usable > capacity", _set(("device", "usable_memory_gib"), 25), "device.usable_memory_gib", "exceeds"),
    ("count not a multiple of per_node", _set(("device", "count"), 12), "device.per_node", "multiple"),
    ("bad device kind", _set(("device", "kind"), "tpu"), "device.kind", "cuda, cpu"),
    ("group_size > count", _table(group_size=16), "collectives.tables[0].group_size", "larger than"),
    ("group_size 1", _table(group_size=1), "collectives.tables[0].group_size", ">= 2"),
    ("unsorted sizes", _table(sizes_bytes=[1048576, 134217728, 16777216]),
     "collectives.tables[0].sizes_bytes[2]", "increasing"),
    ("length mismatch", _table(busbw_gbps=[19.8, 126]), "collectives.tables[0].busbw_gbps",
     "one bus bandwidth"),
    ("size as text", _table(sizes_bytes=["1e6", 16777216, 134217728]),
     "collectives.tables[0].sizes_bytes[0]", "whole number of bytes"),
    ("negative busbw", _table(busbw_gbps=[19.8, -126, 202]), "collectives.tables[0].busbw_gbps[1]", "> 0"),
    ("bad op", _table(op="broadcast"), "collectives.tables[0].op", "all_gather"),
    ("bad scope", _table(scope="global"), "collectives.tables[0].scope", "intra, inter"),
    ("inter table in a single node", _table(scope="inter"), "collectives.tables[0].scope", "one node"),
    ("intra table wider than a node", lambda d: _table(group_size=16)(two_nodes(d)),
     "collectives.tables[0].scope", "use scope inter"),
    ("duplicate table", lambda d: _table()(d) and d["collectives"]["tables"].extend(
        copy.deepcopy(d["collectives"]["tables"])) or d,
     "collectives.tables[1]", "duplicate"),
    ("missing inter_node on multi-node", lambda d: _del(("collectives", "inter_node"))(two_nodes(d)),
     "collectives.inter_node", "required"),
    ("bad schema", _set(("schema",), "osdp-sim/plan"), "schema", "osdp-sim/hardware"),
    ("bad version", _set(("version",), 2), "version", "unsupported version"),
    ("efficiency > 1", _set(("compute", "bandwidth_efficiency"), 1.5), "compute.bandwidth_efficiency",
     "(0, 1]"),
    ("GEMM fraction > 1", _set(("compute", "gemm_efficiency", "bf16"), [[0.001, 0.02], [1, 1.2]]),
     "compute.gemm_efficiency.bf16[1][1]", "(0, 1]"),
    ("GEMM sizes not increasing", _set(("compute", "gemm_efficiency", "fp32"), [[1, 0.5], [1, 0.7]]),
     "compute.gemm_efficiency.fp32[1][0]", "increasing"),
    ("GEMM pair malformed", _set(("compute", "gemm_efficiency", "fp32"), [[1, 0.5, 3]]),
     "compute.gemm_efficiency.fp32[0]", "pair"),
    ("curve without peak", _set(("compute", "gemm_efficiency", "fp16"), [[1, 0.5]]),
     "compute.gemm_efficiency.fp16", "peak_tflops.fp16"),
    ("unit slip: bytes/s under _gbps", _set(("collectives", "intra_node", "busbw_gbps"), 2.29e11),
     "collectives.intra_node.busbw_gbps", "check the unit"),
    ("overlap slowdown < 1", _set(("overlap", "slowdown"), 0.9), "overlap.slowdown", "[1, 10]"),
    ("fragmentation 1", _set(("memory", "fragmentation"), 1.0), "memory.fragmentation", "[0, 1)"),
    ("unknown efficiency op", _set(("collectives", "efficiency", "broadcast"), 1.0),
     "collectives.efficiency.broadcast", "unknown key"),
    ("zero efficiency", _set(("collectives", "efficiency", "all_gather"), 0),
     "collectives.efficiency.all_gather", "[0.01, 100]"),
    ("context above the device memory", _set(("memory", "context_mib"), 30 * 1024), "memory.context_mib",
     "leaves no room for tensors"),
    ("context above half the memory", _set(("memory", "context_mib"), 13 * 1024), "memory.context_mib",
     "at most half"),
    ("table busbw collapses (229 -> 5)", _table(sizes_bytes=[1048576, 16777216, 134217728, 1073741824],
                                                busbw_gbps=[229, 5, 300, 0.001]),
     "collectives.tables[0].busbw_gbps[1]", "collapses from 229 GB/s"),
    ("table time decreases with size", _table(busbw_gbps=[1, 126, 202]),
     "collectives.tables[0].busbw_gbps[1]", "cannot decrease with its size"),
    ("tiny bandwidth", _set(("compute", "memory_bandwidth_gbps"), 1e-300), "compute.memory_bandwidth_gbps",
     "implausibly small"),
    ("tiny memory", _set(("device", "usable_memory_gib"), 1e-9), "device.usable_memory_gib",
     "implausibly small"),
    ("tiny GEMM fraction", _set(("compute", "gemm_efficiency", "bf16"), [[0.001, 1e-300], [1, 0.45]]),
     "compute.gemm_efficiency.bf16[0][1]", "implausibly small"),
    ("huge calibration multiplier", _set(("compute", "efficiency_scale"), 1e300), "compute.efficiency_scale",
     "[0.01, 100]"),
    ("huge backward/forward ratio", _set(("compute", "backward_forward_ratio"), 1e6),
     "compute.backward_forward_ratio", "[0.1, 10]"),
    ("a quintillion devices", _set(("device", "count"), 10**30), "device.count", "implausibly large"),
    ("a table size of 1e30 bytes", _table(sizes_bytes=[1048576, 16777216, 10**30]),
     "collectives.tables[0].sizes_bytes[2]", "implausibly large"),
    ("provenance not a mapping", _set(("provenance",), "by hand"), "provenance", "mapping"),
    ("tables not a list", _set(("collectives", "tables"), {"op": "all_reduce"}), "collectives.tables",
     "a list"),
    ("attention keys decrease", _set(("compute", "attention_efficiency"), {"bf16": [[8192, 0.3], [512, 0.2]]}),
     "compute.attention_efficiency.bf16[1][0]", "strictly increasing"),
    ("attention curve for a dtype without a peak", _set(("compute", "attention_efficiency"),
                                                        {"fp16": [[512, 0.2]]}),
     "compute.attention_efficiency.fp16", "peak_tflops.fp16"),
    ("gemm tile of three", _set(("compute", "gemm_tile"), [128, 128, 1]), "compute.gemm_tile", "[tile rows"),
    ("negative host op cost", _set(("host",), {"op_us": -1}), "host.op_us", ">= 0"),
    ("host async not a bool", _set(("host",), {"async_device": "yes"}), "host.async_device", "true or false"),
    ("unknown host key", _set(("host",), {"hook_us": 3}), "host.hook_us", "unknown key"),
]


@pytest.mark.parametrize("mutate, field, fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_profile_names_file_and_key(tmp_path, mutate, field, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(mutate(base_dict()), sort_keys=False))
    with pytest.raises(UserError) as e:
        load_profile(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {field}: "), msg
    assert fragment in msg, msg
    assert "\n" not in msg


def test_inter_table_may_hold_a_replica_group_of_one_rank_per_node():
    # HSDP's replica all-reduce runs over 2 ranks, one per node: small, but it spans nodes.
    d = two_nodes(base_dict())
    d["collectives"]["tables"].append({"op": "all_reduce", "group_size": 2, "scope": "inter",
                                       "sizes_bytes": [1048576], "busbw_gbps": [20.0]})
    hw = profile_from_dict(d, "x.yaml")
    assert hw.collectives.tables[1].scope == "inter" and hw.collectives.tables[1].group_size == 2


def test_the_base_profile_itself_is_valid(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump(base_dict()))
    assert load_profile(path).name == "t"


def test_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(UserError, match=r"list\.yaml: expected a mapping \(an osdp-sim hardware "
                                        r"profile\), got a list"):
        load_profile(path)


def test_bad_yaml_syntax_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("schema: osdp-sim/hardware\ndevice: {kind: cuda, count: [8\nname: x\n")
    with pytest.raises(UserError) as e:
        load_profile(path)
    assert str(e.value).startswith(f"{path}: not valid YAML at line ")


def test_nan_written_as_yaml_text(tmp_path):
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(base_dict()).replace("slowdown: 1.25", "slowdown: .nan"))
    with pytest.raises(UserError, match=r"nan\.yaml: overlap\.slowdown: expected a finite number"):
        load_profile(path)


# --- CLI ----------------------------------------------------------------------------------------

def test_cli_profiles_lists_the_shipped_table(capsys):
    assert main(["profiles"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["name", "devices"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(SHIPPED) <= set(rows)
    assert rows["titan8"].split() == ["titan8", "8", "(1", "node)", "24.00", "GiB", "130", "7.35", "-"]
    assert rows["a100-2x8"].split() == ["a100-2x8", "16", "(2x8)", "40.00", "GiB", "312", "229", "23.5"]


def test_cli_profiles_summarises_one(capsys):
    assert main(["profiles", "a100-2x8"]) == 0
    out = capsys.readouterr().out
    assert "16 (2x8) x NVIDIA A100-SXM4-40GB" in out
    assert "inter-node 23.5 GB/s busbw + 20.0 us" in out
    assert "all_reduce x8 intra: 1.00 MiB 19.8 GB/s .. 1.00 GiB 229 GB/s (6 sizes)" in out


def test_cli_models_lists_builtins(capsys):
    assert main(["models"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0]          # the built-ins, before the config.json list
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    # name family layers hidden heads kv ffn vocab seq params; GPT-2 small is 124,439,808 parameters.
    assert rows["gpt2-124m"] == ["gpt2-124m", "gpt2", "12", "768", "12", "12", "3072", "50257", "1024",
                                 "124.4M"]
    assert rows["llama-8b"][5] == "8" and rows["llama-8b"][9] == "8.03B"


def test_cli_malformed_profile_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_table(group_size=16)(base_dict())))
    proc = subprocess.run([sys.executable, "-m", "osdp_sim.cli.main", "profiles", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    err_lines = proc.stderr.strip().splitlines()
    assert err_lines == [f"osdp-sim profiles: error: {path}: collectives.tables[0].group_size: "
                         "group of 16 is larger than device.count (8)"]


def test_cli_profiles_of_a_directory_lists_its_profiles(tmp_path, capsys):
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(base_dict()))
    assert main(["profiles", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["name", "devices"] and out[1].split()[0] == "good"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["profiles", str(empty)]) == 2
    assert capsys.readouterr().err.strip() == (f"osdp-sim profiles: error: {empty}: is a directory with "
                                               "no profile files (*.yaml, *.yml) in it")


def test_a_directory_as_hw_says_it_is_a_directory(tmp_path):
    with pytest.raises(UserError, match=rf"^{tmp_path}: is a directory, not a profile file"):
        load_profile(tmp_path)


def test_non_utf8_profile_is_one_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(yaml.safe_dump(base_dict()).replace("test rig", "caf\xe9").encode("latin-1"))
    with pytest.raises(UserError, match=rf"^{path}: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_profile(path)


def test_alias_bomb_profile_is_refused_not_printed(tmp_path, capsys):
    names = "abcdefghij"
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  {n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip(names, names[1:])]
    text = yaml.safe_dump(base_dict()).replace("provenance:\n", "provenance:\n" + lines[0].replace("a:", "  a:") + "\n"
                                                + "\n".join(lines[1:]) + "\n")
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    assert path.stat().st_size < 5000
    assert main(["profiles", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "its YAML aliases expand to more than" in out.err and out.err.count("\n") == 1


def test_saved_profile_has_the_umask_mode(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        save_profile(load_profile("titan8"), tmp_path / "t.yaml")
    finally:
        os.umask(old)
    assert (tmp_path / "t.yaml").stat().st_mode & 0o777 == 0o644


def test_a_name_too_long_for_the_file_system_is_one_line(capsys):
    name = "x" * 300
    assert main(["profiles", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}: cannot use this as a profile path or name (File name too long)" in err


def test_a_device_file_as_profile_is_refused_by_size_not_called_missing(capsys):
    assert main(["profiles", "/dev/zero"]) == 2
    assert capsys.readouterr().err == "osdp-sim profiles: error: /dev/zero: larger than 64 MiB; not a profile file\n"


def test_table_time_may_dip_within_measurement_noise_but_not_beyond():
    d = base_dict()
    # 16 MiB after 1 MiB at 14x the busbw: 16/14 = 1.14x the time; at 21x: 0.76x, a decrease
    d["collectives"]["tables"][0].update(busbw_gbps=[10.0, 140.0, 202])
    profile_from_dict(copy.deepcopy(d), "x.yaml")
    d["collectives"]["tables"][0].update(busbw_gbps=[10.0, 210.0, 1000])
    with pytest.raises(UserError, match=r"tables\[0\]\.busbw_gbps\[1\]: .* less than 0\.8x the time"):
        profile_from_dict(d, "x.yaml")
