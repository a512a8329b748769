"""The core (model, hardware, plan, estimate, search, plots) needs neither torch nor transformers:
a fresh interpreter that makes both unimportable still loads a config.json, estimates, searches
and plots."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys
class Block:                                     # torch and transformers cannot be imported
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
from osdp_sim.cli.main import main
assert main(["models", "tests/data/hf/qwen2-7b/config.json"]) == 0
assert main(["estimate", "--hw", "titan8", "--model", "gpt2-tiny", "--strategy", "zero3", "--micro-batch", "1"]) == 0
assert main(["search", "--hw", "titan8", "--model", "gpt2-tiny", "--mem-limit", "1GiB", "--no-split",
             "--micro-batch", "1,2", "--time-limit", "20"]) == 0
import osdp_sim.viz.pareto
assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
print("CORE-OK")
"""


def test_the_core_runs_without_torch_or_transformers():
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "CORE-OK" in p.stdout
