"""The scripts under bench/ and validate/ (osdp_sim.cli.common.run_script and the argument types):
bad input is one line on stderr and exit code 2, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("bench/search_keygraph.py", ["--model", "nosuch"], "unknown model 'nosuch'"),
    ("bench/search_keygraph.py", ["--hw", "nosuch.yaml"], "nosuch.yaml: file not found"),
    ("bench/search_keygraph.py", ["--root", "bad"], "root_strategies"),
    ("bench/search_keygraph.py", ["--micro-batch", "0"], "expected a positive whole number"),
    ("bench/search_graph_budget.py", ["--buckets", "0"], "expected a positive whole number"),
    ("bench/search_graph_budget.py", ["--root", "bad"], "root_strategies"),
    ("bench/search_bench.py", ["--time-limit", "-5"], "expected a positive, finite number"),
    ("bench/search_bench.py", ["--time-limit", "inf"], "expected a positive, finite number"),
    ("bench/search_bench.py", ["--lambda-points", "0"], "expected a positive whole number"),
    ("bench/search_graph_budget.py", ["--lambda-widen", "-1"], "expected a positive, finite number"),
    ("bench/search_queue_work.py", ["--abstract-graph", "1e-4,x"], "comma-separated numbers"),
    ("bench/pareto_depth.py", ["--layers", "8,0"], "expected a positive whole number"),
    ("bench/search_diagnostics.py", ["--seconds", "0"], "expected a positive, finite number"),
    ("validate/table.py", ["nosuch"], "nosuch: no such records folder or file"),
    ("validate/table.py", ["validate/records/table", "--predict", "nosuch"], "no hardware profile"),
    ("validate/make_plans.py", ["--model", "nosuch"], "unknown model"),
    ("validate/hf_report.py", ["nosuch", "--hw", "cpu-2core"], "nosuch: no such records folder or file"),
    ("validate/hf_report.py", ["validate/records/cpu-hf", "--hw", "nosuch"], "no hardware profile"),
    ("validate/hf_report.py", ["validate/records/cpu-hf", "--hw", "cpu-2core", "--report", "/proc/r.md"],
     "/proc/r.md: --report: cannot write a file in /proc"),
    ("validate/run_table.py", ["--plans", "nosuch"], "plan file not found"),
    ("validate/make_plans.py", ["--out", "/proc/plans"], "/proc/plans: --out: cannot create it (a special filesystem that holds no files)"),
    ("validate/run_table.py", ["--out", "/proc/table"], "/proc/table: --out: cannot create it (a special filesystem that holds no files)"),
    ("validate/run_table.py", ["--seeds", "0,x"], "--seeds: expected comma-separated whole numbers"),
    ("validate/run_table.py", ["--max-other", "nan"], "--max-other: expected a fraction 0-1"),
    ("bench/estimate_scaling.py", ["--layers", "0"], "expected a positive whole number"),
    ("bench/keygraph_passes.py", ["--reps", "0"], "expected a positive whole number"),
    ("bench/keygraph_passes.py", ["--model", "nosuch"], "unknown model 'nosuch'"),
    ("bench/keygraph_passes.py", ["--base", "nosuch-commit"], "--base: 'nosuch-commit' is not a commit"),
    ("bench/search_ab.py", ["--base", "nosuch-commit"], "--base: 'nosuch-commit' is not a commit"),
    ("bench/fast_estimate_plans.py", ["--rounds", "0"], "expected a positive whole number"),
    ("bench/fast_estimate_plans.py", ["--base", "nosuch-commit"], "--base: 'nosuch-commit' is not a commit"),
    ("bench/search_ab.py", ["--base", "HEAD", "--rounds", "0"], "expected a positive whole number"),
    ("bench/cold_start.py", ["--commit", "nosuch-commit"], "--commit: 'nosuch-commit' is not a commit"),
    ("bench/search_phases.py", ["--mem-limit-gib", "0"], "expected a positive, finite number"),
    ("bench/compile_time.py", ["--commit", "nosuch-commit"], "--commit: 'nosuch-commit' is not a commit"),
]


@pytest.mark.parametrize("script,args,message", CASES, ids=[f"{c[0]}{' '.join(c[1])}" for c in CASES])
def test_bad_input_is_one_line_and_exit_code_2(script, args, message, tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert message in lines[-1]
    # argparse prints its usage first; our own errors are the one line alone
    assert lines[-1].startswith(f"{Path(script).name}: error: ")
    assert len(lines) == 1 or lines[0].startswith("usage:")
