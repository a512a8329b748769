"""Pareto plot and CSV: files written, the front non-dominated and sorted by memory."""

import csv

from osdp_sim.cli.main import main
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.search.baselines import uniform_candidates
from osdp_sim.search.report import plan_oneline
from osdp_sim.search.space import SearchSpace
from osdp_sim.viz.pareto import best_under, non_dominated, plot_pareto, write_front_csv

GiB = 2**30


def test_non_dominated_keeps_the_staircase():
    pts = [(3, 10.0), (1, 5.0), (2, 5.0), (2, 7.0), (4, 9.0), (5, 12.0), (1, 4.0)]
    assert non_dominated(pts) == [(1, 5.0), (2, 7.0), (3, 10.0), (5, 12.0)]
    assert best_under(non_dominated(pts), 4.5) == (3, 10.0)
    assert best_under(non_dominated(pts), 0.5) is None


def _uniform_points():
    spec = load_model("gpt2-tiny")
    hw = load_profile("titan8")
    space = SearchSpace(strategies=("ddp", "zero2", "zero3"), splits=(1,), checkpoint=(False, True),
                        micro_batches=(1, 2, 4), global_batch=None, shard_groups=(8,), precision="bf16",
                        optimizer="adamw", devices=8, root_strategies=("ddp", "zero2", "zero3"))
    return {s: uniform_candidates(spec, hw, space, s) for s in ("ddp", "zero2", "zero3")}


def test_plot_and_csv_written(tmp_path):
    uni = _uniform_points()
    pts = [(e.peak_memory_bytes, e.samples_per_s, p) for c in uni.values() for p, e in c]
    paths = plot_pareto(tmp_path / "f.png", front=pts, evaluated=[(a, b) for a, b, _ in pts],
                        uniform={k: [(e.peak_memory_bytes, e.samples_per_s) for _, e in v] for k, v in uni.items()},
                        limits=[0.1 * GiB, 1e-6 * GiB], title="t", device_memory_bytes=0.2 * GiB)
    assert [p.name for p in paths] == ["f.png", "f.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in paths[1].read_bytes()[:400]
    out = write_front_csv(tmp_path / "f.csv", pts, plan_oneline)
    rows = list(csv.DictReader(out.open()))
    front = non_dominated(pts)
    assert len(rows) == len(front) < len(pts)
    assert [int(r["peak_memory_bytes"]) for r in rows] == [int(round(p[0])) for p in front]
    assert rows[0]["plan"].startswith(f"mb {front[0][2].micro_batch}x1; blocks 0-3: attention ")


def test_pareto_command_writes_png_svg_and_a_sorted_non_dominated_front(tmp_path, capsys):
    png = tmp_path / "plots" / "tiny.png"
    rc = main(["pareto", "--hw", "titan8", "--model", "gpt2-tiny", "--no-split", "--micro-batch", "1,2,4",
               "--mem-limit", "60MiB", "--mem-limit", "120MiB", "-o", str(png)])
    assert rc == 0
    assert png.exists() and png.with_suffix(".svg").exists()
    rows = list(csv.DictReader(png.with_suffix(".csv").open()))
    assert len(rows) >= 2
    peaks = [int(r["peak_memory_bytes"]) for r in rows]
    sps = [float(r["samples_per_s"]) for r in rows]
    assert peaks == sorted(peaks) and all(b > a for a, b in zip(sps, sps[1:]))
    out = capsys.readouterr().out
    assert "within 120.00 MiB:" in out and "Pareto front of gpt2-tiny on 8 x NVIDIA TITAN RTX" in out
    # The sweep (exact search() calls, each just below the last optimum's peak) finds the same front.
    sweep = tmp_path / "sweep.png"
    rc = main(["pareto", "--hw", "titan8", "--model", "gpt2-tiny", "--no-split", "--micro-batch", "1,2,4",
               "--mem-limit", "60MiB", "--mem-limit", "120MiB", "--method", "sweep", "--resolution", "0",
               "-o", str(sweep)])
    assert rc == 0
    rows_sweep = list(csv.DictReader(sweep.with_suffix(".csv").open()))
    assert [(r["peak_memory_bytes"], r["samples_per_s"]) for r in rows_sweep] == \
        [(r["peak_memory_bytes"], r["samples_per_s"]) for r in rows]
