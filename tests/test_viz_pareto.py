"""Pareto plot and CSV: files written, the front non-dominated and sorted by memory."""

import csv

import pytest

from osdp_sim.cli.main import main
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.load import load_model
from osdp_sim.planner.baselines import uniform_candidates
from osdp_sim.planner.report import plan_oneline
from osdp_sim.planner.space import SearchSpace
from osdp_sim.viz.pareto import (AXIS_MARGIN, Throughput, best_under, non_dominated, plot_pareto,
                                 write_front_csv, zero3_share)

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
    fig = plot_pareto(tmp_path / "f.png", front=pts, evaluated=[(a, b) for a, b, _ in pts],
                      uniform={k: [(e.peak_memory_bytes, e.samples_per_s) for _, e in v] for k, v in uni.items()},
                      limits=[0.1 * GiB, 1e-6 * GiB], title="t", device_memory_bytes=0.2 * GiB)
    paths = fig.paths
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
    err = capsys.readouterr().err                  # each point's call says whether it was proven
    points = [ln for ln in err.splitlines() if ln.startswith("osdp-sim: sweep ")]
    assert points and all(ln.endswith("(proven)") for ln in points)
    rows_sweep = list(csv.DictReader(sweep.with_suffix(".csv").open()))
    assert [(r["peak_memory_bytes"], r["samples_per_s"]) for r in rows_sweep] == \
        [(r["peak_memory_bytes"], r["samples_per_s"]) for r in rows]


def _figure(tmp_path, **kw):
    uni = _uniform_points()
    pts = [(e.peak_memory_bytes, e.samples_per_s, p) for c in uni.values() for p, e in c]
    uniform = {k: [(e.peak_memory_bytes, e.samples_per_s) for _, e in v] for k, v in uni.items()}
    return pts, plot_pareto(tmp_path / "f.png", front=pts, evaluated=[(a, b) for a, b, _ in pts],
                            uniform=uniform, limits=[0.1 * GiB], title="t", **kw)


def test_axes_are_fitted_to_the_data_with_a_small_margin(tmp_path):
    pts, fig = _figure(tmp_path)
    xs = [p[0] / GiB for p in pts] + [0.1]
    ys = [p[1] for p in pts]
    for (lo, hi), data in ((fig.x_range_gib, xs), (fig.y_range, ys)):
        span = max(data) - min(data)
        assert lo <= min(data) and hi >= max(data)
        assert min(data) - lo <= AXIS_MARGIN * span * 1.001 and hi - max(data) <= AXIS_MARGIN * span * 1.001
    assert fig.y_range[0] > 0.0                  # not pinned at zero: the data sits far above it


def test_tokens_axis_scales_throughput_by_the_sequence_length(tmp_path):
    pts, samples = _figure(tmp_path)
    _, tokens = _figure(tmp_path, throughput=Throughput("tokens/s", 128))
    assert tokens.y_range == pytest.approx(tuple(128 * y for y in samples.y_range))
    assert any("tokens/s" in label for label in tokens.legend)


def test_baseline_labels_do_not_overlap_and_every_uniform_strategy_is_named(tmp_path):
    _, fig = _figure(tmp_path)
    boxes = fig.label_boxes
    assert len(boxes) == 3                       # one name per uniform strategy, on the plot
    ax0, ay0, ax1, ay1 = fig.axes_box
    assert all(ax0 <= b[0] and b[2] <= ax1 and ay0 <= b[1] and b[3] <= ay1 for b in boxes)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)


def test_zero3_share_counts_split_groups_by_their_sharded_slices():
    from osdp_sim.plan import GroupChoice
    from osdp_sim.plan.plan import Plan
    cfg = load_model("gpt2-tiny").config
    choices = {"root": GroupChoice("ddp")}
    for i in range(cfg.n_layers):
        choices[f"block{i}.attn"] = GroupChoice("zero3")
        choices[f"block{i}.mlp"] = GroupChoice("zero2", 4, 1)     # 1 of 4 slices ZeRO-3
    plan = Plan(model=cfg, devices=2, micro_batch=1, choices=choices, checkpoint=(False,) * cfg.n_layers)
    assert zero3_share(plan) == pytest.approx((1.0 + 0.25) / 2)


def test_legend_count_equals_what_the_command_reports(tmp_path, capsys, monkeypatch):
    import osdp_sim.viz.pareto as viz
    drawn = {}
    real = viz.plot_pareto

    def spy(*a, **kw):
        drawn["fig"] = real(*a, **kw)
        return drawn["fig"]
    monkeypatch.setattr(viz, "plot_pareto", spy)
    rc = main(["pareto", "--hw", "titan8", "--model", "gpt2-tiny", "--no-split", "--micro-batch", "1,2",
               "--mem-limit", "60MiB", "-o", str(tmp_path / "t.png")])
    assert rc == 0
    out = capsys.readouterr().out
    evaluated = int(out.split(" evaluated")[0].rsplit(", ", 1)[1].replace(",", ""))
    front = int(out.split(" plans,")[0].rsplit(": ", 1)[1])
    legend = " ".join(drawn["fig"].legend)
    assert f"evaluated plans ({evaluated:,}" in legend and f"Pareto front ({front} plans)" in legend


def test_labels_placed_on_one_point_are_moved_apart():
    import matplotlib.pyplot as plt
    from osdp_sim.viz.pareto import _place_without_overlap
    fig, ax = plt.subplots()
    texts = [ax.annotate(f"uniform strategy {i}", (0.5, 0.5), xytext=(8, -16), textcoords="offset points")
             for i in range(3)]
    fig.canvas.draw()
    before = [t.get_window_extent(fig.canvas.get_renderer()) for t in texts]
    assert before[0].overlaps(before[1])                      # they start on top of each other
    boxes = _place_without_overlap(fig, texts)
    plt.close(fig)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
