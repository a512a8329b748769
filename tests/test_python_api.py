"""docs/python-api.md's worked example, run as written; and the API's argument checks."""

import re
from pathlib import Path

import pytest

import osdp_sim
from osdp_sim.errors import UserError

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def test_the_worked_example_runs_as_written(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    scope: dict = {}
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), scope)
    out = capsys.readouterr().out
    assert "optimal" in out and "front points, proven True" in out


def test_top_level_names_are_the_api_and_import_nothing_heavy():
    import subprocess
    import sys
    code = ("import sys, osdp_sim; assert callable(osdp_sim.search); "
            "assert 'torch' not in sys.modules; print(sorted(osdp_sim.__all__))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "estimate" in p.stdout and "pareto" in p.stdout


@pytest.mark.parametrize("call,needle", [
    (lambda: osdp_sim.search("gpt2-tiny", "titan8", "lots"), "mem_limit: expected a size"),
    (lambda: osdp_sim.search("gpt2-tiny", "titan8", "1GiB", time_limit_s=float("nan")), "time_limit_s"),
    (lambda: osdp_sim.load_profile("titan8", devices=16), "devices: expected 1..8 devices"),
    (lambda: osdp_sim.load_model(42), "model: expected a model name"),
    (lambda: osdp_sim.pareto("gpt2-tiny", "titan8", method="grid"), "method: expected 'sweep' or 'front'"),
])
def test_bad_arguments_are_user_errors_naming_the_field(call, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        call()


def test_a_limit_above_the_device_is_capped_to_its_usable_memory():
    r = osdp_sim.search("gpt2-tiny", "titan8", "1TiB", splits=(1,), micro_batches=(1,), time_limit_s=20)
    assert r.mem_limit_bytes == osdp_sim.load_profile("titan8").device.usable_memory_bytes
