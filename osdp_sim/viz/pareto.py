"""Throughput vs peak memory: every evaluated plan, the exact Pareto front, the uniform baselines
and the plan chosen under each memory limit. PNG and SVG with the same stem, plus the front as CSV."""

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from osdp_sim.search.sweep import non_dominated  # noqa: E402
from osdp_sim.units import GiB, format_bytes  # noqa: E402

UNIFORM_STYLE = {"ddp": ("s", "#4c72b0", "uniform DDP"), "zero2": ("^", "#55a868", "uniform ZeRO-2"),
                 "zero3": ("v", "#c44e52", "uniform ZeRO-3 (FSDP)")}
LIMIT_COLOURS = ("#8172b2", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")


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


def plot_pareto(path, *, front: list, evaluated: list, uniform: dict, limits: list, title: str,
                subtitle: str = "", device_memory_bytes: float | None = None,
                x_max_bytes: float | None = None) -> list[Path]:
    """front: (peak_bytes, samples_per_s, plan); evaluated: (peak_bytes, samples_per_s);
    uniform: strategy -> [(peak_bytes, samples_per_s)] of its uniform plans; limits: bytes;
    device_memory_bytes: shade what exceeds the device; x_max_bytes: right end of the memory axis
    (points beyond are not drawn). Writes `path` (PNG) and the SVG beside it; returns both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 6.6))
    front = non_dominated(front)
    all_x = [p[0] / GiB for p in front] + [lim / GiB for lim in limits]
    for pts in uniform.values():
        all_x += [p[0] / GiB for p in pts]
    x_right = (x_max_bytes / GiB if x_max_bytes else max(all_x, default=1.0)) * 1.05
    evaluated = [p for p in evaluated if p[0] / GiB <= x_right]
    uniform = {k: [p for p in v if p[0] / GiB <= x_right] for k, v in uniform.items()}
    if evaluated:
        xs = [p[0] / GiB for p in evaluated]
        ys = [p[1] for p in evaluated]
        ax.scatter(xs, ys, s=4, color="#999999", alpha=0.25, linewidths=0, rasterized=True,
                   label=f"evaluated plans ({len(evaluated):,})", zorder=1)
    if front:
        fx = [p[0] / GiB for p in front] + [x_right]
        fy = [p[1] for p in front] + [front[-1][1]]
        ax.step(fx, fy, where="post", color="black", linewidth=1.6, zorder=3,
                label=f"Pareto front ({len(front)} plans)")
        ax.plot(fx[:-1], fy[:-1], "o", color="black", markersize=3, zorder=3)
    for name, pts in uniform.items():
        if not pts:
            continue
        marker, colour, label = UNIFORM_STYLE.get(name, ("x", "grey", name))
        ax.scatter([p[0] / GiB for p in pts], [p[1] for p in pts], marker=marker, s=46, color=colour,
                   edgecolors="white", linewidths=0.6, zorder=4, label=label)
    if device_memory_bytes and device_memory_bytes / GiB < x_right:
        ax.axvspan(device_memory_bytes / GiB, x_right, color="#f2dede", alpha=0.5, zorder=0, linewidth=0,
                   label=f"beyond the device's {format_bytes(device_memory_bytes)} usable")
    for i, lim in enumerate(sorted(limits)):
        colour = LIMIT_COLOURS[i % len(LIMIT_COLOURS)]
        ax.axvline(lim / GiB, color=colour, linestyle="--", linewidth=1.1, zorder=2)
        ax.annotate(f"limit {format_bytes(lim)}", (lim / GiB, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", color=colour, fontsize=8)
        best = best_under(front, lim)
        if best is None:
            ax.text(lim / GiB, ax.get_ylim()[1] * 0.02, f" {format_bytes(lim)}: nothing fits",
                    color=colour, fontsize=8, rotation=90, va="bottom")
            continue
        ax.scatter([best[0] / GiB], [best[1]], marker="*", s=220, color=colour, edgecolors="black",
                   linewidths=0.6, zorder=5, label=f"best plan within {format_bytes(lim)}: "
                   f"{best[1]:.2f} samples/s at {best[0] / GiB:.2f} GiB")
    ax.set_xlim(0, x_right)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("throughput (samples/s, all devices)")
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    svg = path.with_suffix(".svg")
    fig.savefig(path, dpi=130)
    fig.savefig(svg)
    plt.close(fig)
    return [path, svg]
