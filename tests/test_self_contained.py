"""The repository stands alone: no file cites the developers' shared reference folder or an
absolute path of the machine it was written on (users have neither)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Built from pieces so this file does not match itself.
FORBIDDEN = re.compile("|".join([r"shared/" + "reference", r"-" + r"facts\.md",
                                 r"(^|[^.\w])/(" + "work|farm|root" + r")/"]))


def tracked_text_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:                      # not a git checkout (an sdist): every file
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / line for line in out.stdout.splitlines()]


def test_no_file_cites_the_shared_reference_folder_or_a_machine_path():
    hits = []
    for path in tracked_text_files():
        if path.suffix in (".png", ".pdf") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_the_pattern_catches_what_it_must():
    assert FORBIDDEN.search("see ../shared/" + "reference/osdp.md")
    assert FORBIDDEN.search("hardware-fa" + "cts.md")
    assert FORBIDDEN.search("# Sources: /" + "work/x")
    assert not FORBIDDEN.search("docs/hardware-profiles.md and ./work/x")
