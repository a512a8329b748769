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
