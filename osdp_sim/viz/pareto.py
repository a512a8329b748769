"""Throughput vs peak memory: every evaluated plan, the exact Pareto front (coloured by how much of
each plan is ZeRO-3), the uniform baselines (named on the plot) and the plan chosen under each
memory limit. PNG and SVG with the same stem, plus the front as CSV."""

import csv
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402

from osdp_sim.planner.sweep import non_dominated  # noqa: E402
from osdp_sim.units import GiB, format_bytes  # noqa: E402

UNIFORM_STYLE = {"ddp": ("s", "#4c72b0", "uniform DDP"), "zero2": ("^", "#55a868", "uniform ZeRO-2"),
                 "zero3": ("v", "#c44e52", "uniform ZeRO-3 (FSDP)")}
LIMIT_COLOURS = ("#8172b2", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")
FRONT_CMAP = "viridis"
AXIS_MARGIN = 0.05                        # of the data's span, on each side of both axes


@dataclass(frozen=True)
class Throughput:
    """What the y axis shows: samples/s times `per_sample` (1 for samples, seq_len for tokens)."""
    unit: str = "samples/s"
    per_sample: float = 1.0

    def of(self, samples_per_s: float) -> float:
        return samples_per_s * self.per_sample


@dataclass
class ParetoFigure:
    """What plot_pareto drew, for the caller's report and for tests."""
    paths: list
    x_range_gib: tuple                    # the memory axis drawn
    y_range: tuple                        # the throughput axis drawn, in the Throughput's unit
    legend: list = field(default_factory=list)        # legend labels, in order
    label_boxes: list = field(default_factory=list)   # (x0, y0, x1, y1) pixels of every text placed on the axes
    axes_box: tuple = ()                  # (x0, y0, x1, y1) pixels of the plotting area


def zero3_share(plan) -> float:
    """Fraction of the blocks' operator groups sharded by ZeRO-3 (a split group counts its sharded
    slices), 0 for uniform DDP / ZeRO-2, 1 for uniform ZeRO-3."""
    keys = [k for k in plan.choices if k != "root"]
    if not keys:
        return 0.0
    share = 0.0
    for k in keys:
        c = plan.choices[k]
        share += c.sharded_slices / c.slices if c.slices > 1 else float(c.strategy == "zero3")
    return share / len(keys)


def best_under(front: list, limit_bytes: float):
    """The front point of highest throughput within the limit, or None."""
    fitting = [p for p in front if p[0] <= limit_bytes]
    return max(fitting, key=lambda p: p[1], default=None)


def write_front_csv(path, front: list, summarize=None) -> Path:
    """front: (peak_bytes, samples_per_s, plan); writes the non-dominated points by peak memory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["peak_memory_bytes", "peak_memory_gib", "samples_per_s", "micro_batch", "grad_accum",
                    "plan"])
        for peak, sps, plan in non_dominated(front):
            w.writerow([int(round(peak)), f"{peak / GiB:.3f}", f"{sps:.4f}", plan.micro_batch, plan.grad_accum,
                        summarize(plan) if summarize else ""])
    return path


def _span(values: list, floor: float | None = None) -> tuple:
    lo, hi = min(values), max(values)
    pad = AXIS_MARGIN * (hi - lo) if hi > lo else AXIS_MARGIN * max(abs(hi), 1e-9)
    lo -= pad
    if floor is not None:
        lo = max(lo, floor)
    return lo, hi + pad


def _place_without_overlap(fig, texts: list) -> list:
    """Nudge texts downwards, in order, until no two boxes overlap; return the final pixel boxes."""
    renderer = fig.canvas.get_renderer()
    placed = []
    for t in texts:
        for _ in range(40):
            bb = t.get_window_extent(renderer)
            if not any(bb.overlaps(o) for o in placed):
                break
            x, y = t.get_position()
            t.set_position((x, y - 10))             # offset points
        placed.append(t.get_window_extent(renderer))
    return [(b.x0, b.y0, b.x1, b.y1) for b in placed]


def plot_pareto(path, *, front: list, evaluated: list, uniform: dict, limits: list, title: str,
                subtitle: str = "", device_memory_bytes: float | None = None,
                x_max_bytes: float | None = None, throughput: Throughput = Throughput()) -> ParetoFigure:
    """front: (peak_bytes, samples_per_s, plan); evaluated: (peak_bytes, samples_per_s);
    uniform: strategy -> [(peak_bytes, samples_per_s)] of its uniform plans; limits: bytes;
    device_memory_bytes: shade what exceeds the device; x_max_bytes: right end of the memory axis
    (points beyond are not drawn). Both axes are fitted to what is drawn with a small margin.
    Writes `path` (PNG) and the SVG beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9.6, 6.8))
    front = non_dominated(front)
    x_cap = x_max_bytes / GiB if x_max_bytes else float("inf")
    shown = [p for p in evaluated if p[0] / GiB <= x_cap]
    uniform = {k: [p for p in v if p[0] / GiB <= x_cap] for k, v in uniform.items()}
    ys = lambda pts: [throughput.of(p[1]) for p in pts]          # noqa: E731
    xs = lambda pts: [p[0] / GiB for p in pts]                    # noqa: E731
    data_x = xs(front) + xs(shown) + [x for v in uniform.values() for x in xs(v)] + \
        [lim / GiB for lim in limits if lim / GiB <= x_cap]
    data_y = ys(front) + ys(shown) + [y for v in uniform.values() for y in ys(v)]
    x_range = _span(data_x or [0.0, 1.0], floor=0.0)
    y_range = _span(data_y or [0.0, 1.0], floor=0.0)

    if shown:
        label = f"evaluated plans ({len(evaluated):,})"
        if len(shown) < len(evaluated):
            label = f"evaluated plans ({len(evaluated):,}; {len(shown):,} within the memory axis)"
        ax.scatter(xs(shown), ys(shown), s=4, color="#999999", alpha=0.25, linewidths=0, rasterized=True,
                   label=label, zorder=1)
    if front:
        fx, fy = xs(front) + [x_range[1]], ys(front) + [ys(front)[-1]]
        ax.step(fx, fy, where="post", color="black", linewidth=1.4, zorder=3,
                label=f"Pareto front ({len(front)} plans)")
        shares = [zero3_share(p[2]) for p in front]
        sc = ax.scatter(fx[:-1], fy[:-1], c=shares, cmap=FRONT_CMAP, norm=Normalize(0.0, 1.0), s=18,
                        edgecolors="black", linewidths=0.3, zorder=4)
        bar = fig.colorbar(sc, ax=ax, pad=0.01, fraction=0.04)
        bar.set_label("front plan: share of block groups in ZeRO-3", fontsize=8)
    texts = []
    for name, pts in uniform.items():
        if not pts:
            continue
        marker, colour, label = UNIFORM_STYLE.get(name, ("x", "grey", name))
        ax.scatter(xs(pts), ys(pts), marker=marker, s=40, color=colour, edgecolors="white", linewidths=0.6,
                   zorder=5, label=label)
        top = max(pts, key=lambda p: p[1])
        # Beside the strategy's fastest plan, on the side with room (the right end has the colour bar).
        right_half = (top[0] / GiB - x_range[0]) > 0.6 * (x_range[1] - x_range[0])
        texts.append(ax.annotate(label.replace(" (FSDP)", ""), (top[0] / GiB, throughput.of(top[1])),
                                 xytext=(-8 if right_half else 8, -16), textcoords="offset points",
                                 ha="right" if right_half else "left", fontsize=8,
                                 color=colour, zorder=8,
                                 bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=colour, lw=0.5, alpha=0.9)))
    if device_memory_bytes and device_memory_bytes / GiB < x_range[1]:
        ax.axvspan(device_memory_bytes / GiB, x_range[1], color="#f2dede", alpha=0.5, zorder=0, linewidth=0,
                   label=f"beyond the device's {format_bytes(device_memory_bytes)} usable")
    for i, lim in enumerate(sorted(limits)):
        colour = LIMIT_COLOURS[i % len(LIMIT_COLOURS)]
        best = best_under(front, lim)
        if x_range[0] <= lim / GiB <= x_range[1]:
            ax.axvline(lim / GiB, color=colour, linestyle="--", linewidth=1.1, zorder=2)
        if best is None:
            ax.plot([], [], linestyle="--", color=colour, label=f"limit {format_bytes(lim)}: nothing fits")
            continue
        ax.scatter([best[0] / GiB], [throughput.of(best[1])], marker="*", s=220, color=colour,
                   edgecolors="black", linewidths=0.6, zorder=7,
                   label=f"limit {format_bytes(lim)} (dashed): best plan {throughput.of(best[1]):,.2f} "
                         f"{throughput.unit} at {best[0] / GiB:.2f} GiB")
    ax.set_xlim(*x_range)
    ax.set_ylim(*y_range)
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel(f"throughput ({throughput.unit}, all devices)")
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.canvas.draw()
    boxes = _place_without_overlap(fig, texts)
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    svg = path.with_suffix(".svg")
    fig.savefig(path, dpi=130)
    fig.savefig(svg)
    plt.close(fig)
    return ParetoFigure(paths=[path, svg], x_range_gib=tuple(x_range), y_range=tuple(y_range),
                        legend=[t.get_text() for t in legend.get_texts()], label_boxes=boxes,
                        axes_box=(frame.x0, frame.y0, frame.x1, frame.y1))
