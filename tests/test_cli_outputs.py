"""Output paths of every command are checked before the work (fileio.check_writable: one policy,
missing folders are made), and flags that would be ignored are errors. Each case is a one-line
error with exit code 2 naming the flag; none of them starts the real work."""

import pytest

from osdp_sim.cli.main import main

SEARCH = ["search", "--hw", "titan8", "--model", "gpt2-tiny", "--no-split", "--micro-batch", "1",
          "--mem-limit", "4GiB"]
PARETO = ["pareto", "--hw", "titan8", "--model", "gpt2-tiny", "--no-split", "--micro-batch", "1"]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_no_split_with_splits_is_an_error(capsys):
    err = one_line_error(capsys, SEARCH + ["--splits", "1,2,4"])
    assert "--no-split: conflicts with --splits" in err
    err = one_line_error(capsys, PARETO + ["--splits", "2", "-o", "/tmp/never.png"])
    assert "--no-split: conflicts with --splits" in err


def test_search_output_that_is_a_folder_is_refused_before_the_search(capsys, tmp_path):
    err = one_line_error(capsys, SEARCH + ["-o", str(tmp_path)])
    assert f"{tmp_path}: -o: is a folder" in err
    assert "searching" not in err


def test_search_output_folders_are_made(capsys, tmp_path):
    path = tmp_path / "new" / "plan.json"
    assert main(SEARCH + ["-o", str(path)]) == 0
    assert path.is_file()


@pytest.mark.parametrize("target,flag,needle", [
    ("/proc/x.png", "-o", "/proc/x.png: -o: cannot write a file in /proc"),
    ("{d}/plot.png", "--csv", "{d}: --csv: is a folder"),
])
def test_pareto_outputs_checked_before_the_front(capsys, tmp_path, target, flag, needle):
    argv = PARETO + (["-o", target.format(d=tmp_path)] if flag == "-o" else
                     ["-o", target.format(d=tmp_path), "--csv", str(tmp_path)])
    err = one_line_error(capsys, argv)
    assert needle.format(d=tmp_path) in err and "computing the Pareto front" not in err
