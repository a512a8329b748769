"""fileio: atomic writes leave no temporary behind; unreadable or unwritable paths are UserErrors."""

import re

import pytest

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_json, write_text_atomic


def test_write_then_read_leaves_only_the_file(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_text_atomic(path, '{"x": 1}\n')
    write_text_atomic(path, '{"x": 2}\n')                 # replaces, never appends
    assert read_json(path, "plan") == {"x": 2}
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_unwritable_folder_names_the_path(tmp_path):
    (tmp_path / "afile").write_text("")
    target = tmp_path / "afile" / "a.json"                 # a folder that is a file: fails even as root
    with pytest.raises(UserError, match=r"afile/a\.json: cannot write here"):
        write_text_atomic(target, "x")


def test_read_errors_name_the_file_and_kind(tmp_path):
    with pytest.raises(UserError, match=r"nope\.json: plan file not found"):
        read_json(tmp_path / "nope.json", "plan")
    bad = tmp_path / "bad.json"
    bad.write_text('{"x":')
    with pytest.raises(UserError, match=r"bad\.json: not valid JSON \(line 1: .*\); a partly written record\?"):
        read_json(bad, "record", "; a partly written record?")


def test_check_writable_makes_the_folder_or_names_the_problem(tmp_path):
    from osdp_sim.fileio import check_writable
    check_writable(tmp_path / "new" / "out.yaml", "-o")
    assert (tmp_path / "new").is_dir()
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserError, match=r"afile/out\.yaml: -o: cannot create its folder \(.*afile is a file\)"):
        check_writable(tmp_path / "afile" / "out.yaml", "-o")


@pytest.mark.parametrize("path,folder,needle", [
    ("/proc/x.png", False, "/proc/x.png: -o: cannot write a file in /proc"),   # os.access says yes for root
    ("/proc", True, "/proc: -o: cannot write a file in /proc"),
    ("/dev/null", False, "/dev/null: -o: exists and is not a regular file"),  # a rename would replace it
])
def test_check_writable_tries_a_real_file(path, folder, needle):
    from osdp_sim.fileio import check_writable
    with pytest.raises(UserError, match=re.escape(needle)):
        check_writable(path, "-o", folder=folder)


def test_check_writable_folders_and_files_are_told_apart(tmp_path):
    from osdp_sim.fileio import check_writable
    with pytest.raises(UserError, match="is a folder; give a file path"):
        check_writable(tmp_path, "-o")
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="exists and is not a folder"):
        check_writable(tmp_path / "f", "--records-dir", folder=True)
    check_writable(tmp_path / "a" / "b", "--records-dir", folder=True)
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())


def test_written_files_get_the_umask_mode_not_0600(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        os.umask(0o027)
        write_text_atomic(tmp_path / "b.json", "{}")
        assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o640
        os.chmod(tmp_path / "a.json", 0o600)                  # a replaced file keeps its mode
        write_text_atomic(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_non_utf8_and_directories_are_one_line_errors(tmp_path):
    from osdp_sim.fileio import read_text, read_yaml
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(UserError, match=r"latin1\.json: not UTF-8 text \(byte 0xe9 at offset 13\)"):
        read_json(bad, "plan")
    with pytest.raises(UserError, match=r"latin1\.json: not UTF-8 text \(byte 0xe9 at offset 13\)"):
        read_yaml(bad, "profile")
    with pytest.raises(UserError, match=r": is a directory, not a plan file"):
        read_text(tmp_path, "plan")


def test_deep_nesting_and_huge_numbers_are_one_line_errors(tmp_path):
    from osdp_sim.fileio import read_yaml
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    with pytest.raises(UserError, match=r"deep\.json: not a usable JSON file \(nested too deeply\)"):
        read_json(deep, "plan")
    with pytest.raises(UserError, match=r"deep\.json: not a usable YAML file \(nested too deeply\)"):
        read_yaml(deep, "profile")
    big = tmp_path / "big.json"
    big.write_text('{"x": ' + "9" * 5000 + "}")
    with pytest.raises(UserError, match=r"big\.json: not a usable JSON file \(Exceeds the limit"):
        read_json(big, "plan")


def test_yaml_alias_bombs_and_self_reference_are_refused(tmp_path):
    from osdp_sim.fileio import read_yaml
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: &x [1, 2]\nb: *x\n")                  # ordinary aliases still work
    assert read_yaml(ok, "campaign") == {"a": [1, 2], "b": [1, 2]}
    names = "abcdefghij"
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip(names, names[1:])]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 4000
    with pytest.raises(UserError, match=r"bomb\.yaml: its YAML aliases expand to more than"):
        read_yaml(bomb, "profile")
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [*a]\n")
    with pytest.raises(UserError, match=r"loop\.yaml: a YAML alias refers to a node that contains it"):
        read_yaml(loop, "profile")


def test_control_characters_in_yaml_are_one_line_errors(tmp_path):
    from osdp_sim.fileio import read_yaml
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"a: 1\n\x00b: 2\n")                   # raised while the loader is made
    with pytest.raises(UserError, match=r"nul\.yaml: not valid YAML \(unacceptable character #x0000"):
        read_yaml(path, "profile")


def test_an_endless_or_huge_file_is_refused_not_read_into_memory():
    from osdp_sim.fileio import read_text
    with pytest.raises(UserError, match=r"^/dev/zero: larger than 64 MiB; not a plan file"):
        read_text("/dev/zero", "plan")


def test_sizes_that_are_not_finite_or_under_a_byte_are_named():
    from osdp_sim.units import parse_bytes
    with pytest.raises(UserError, match=r"--mem-limit: size must be a finite number, got '1e400GiB'"):
        parse_bytes("1e400GiB", field="--mem-limit")
    with pytest.raises(UserError, match=r"--mem-limit: size must be at least one byte, got '0.5B'"):
        parse_bytes("0.5B", field="--mem-limit")
    assert parse_bytes("1.5KiB") == 1536


def test_calibrate_reads_an_existing_report_before_the_fit(tmp_path, capsys):
    from osdp_sim.cli.main import main
    report = tmp_path / "report.md"
    report.write_bytes(b"caf\xe9\n")
    rc = main(["calibrate", "--hw", "cpu-2core", "--records", "validate/records/cpu/n2",
               "-o", str(tmp_path / "fitted.yaml"), "--report", str(report), "--time-limit", "600"])
    err = capsys.readouterr().err
    assert rc == 2 and "report.md: not UTF-8 text (byte 0xe9 at offset 3)" in err
    assert not (tmp_path / "fitted.yaml").exists()           # stopped before the fit, not after it
