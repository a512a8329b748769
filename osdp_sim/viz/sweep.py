"""A sweep's plot: throughput (tokens/s) and peak memory per device against the swept axis, one
line per value of the second swept axis (or per combination of the others), the best uniform
baseline dashed; infeasible points drawn hollow at the least peak they need."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from osdp_sim.units import GiB, format_bytes  # noqa: E402

TITLES = {"model": "model", "devices": "GPUs", "mem_limit_bytes": "memory limit per device",
          "seq_len": "sequence length", "micro_batch": "micro-batch", "bandwidth_scale": "bandwidth scale",
          "compute_scale": "compute scale"}
COLOURS = ("#4c72b0", "#c44e52", "#55a868", "#8172b2", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")


def _label(a: str, v) -> str:
    if a == "mem_limit_bytes":
        return f"limit {format_bytes(v)}"
    if a in ("bandwidth_scale", "compute_scale"):
        return f"{TITLES[a]} x{v:g}"
    if a in ("devices", "seq_len", "micro_batch"):
        return f"{TITLES[a]} {v}"
    return str(v)


def x_axis(axes) -> str:
    """The axis along x: the first with more than one value (else the first swept)."""
    varying = axes.varying()
    return varying[0] if varying else (axes.swept() or ("model",))[0]


def plot_sweep(res, path) -> list[Path]:
    """Write the PNG at `path` and an SVG beside it; returns both paths."""
    axes = res.axes
    xa = x_axis(axes)
    others = [a for a in axes.varying() if a != xa]
    xs_all = list(getattr(axes, xa) or (getattr(res.points[0], xa),))
    categorical = xa == "model" or isinstance(xs_all[0], str)

    def xpos(p):
        v = getattr(p, xa)
        if categorical:
            return xs_all.index(v) if v in xs_all else [getattr(q, xa) for q in res.points].index(v)
        return v / GiB if xa == "mem_limit_bytes" else v

    series: dict = {}
    for p in res.points:
        series.setdefault(tuple(getattr(p, a) for a in others), []).append(p)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (key, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        name = ", ".join(_label(a, v) for a, v in zip(others, key)) or "searched plan"
        ok = [p for p in pts if p.tokens_per_s is not None]
        ax_t.plot([xpos(p) for p in ok], [p.tokens_per_s for p in ok], "o-", color=colour, label=name)
        base = [(xpos(p), max(b.samples_per_s for b in p.baselines.values() if b.feasible) * p.seq_len)
                for p in pts if any(b.feasible for b in p.baselines.values())]
        if base:
            ax_t.plot(*zip(*base), "--", color=colour, alpha=0.7, linewidth=1)
        ax_m.plot([xpos(p) for p in ok], [p.peak_memory_bytes / GiB for p in ok], "o-", color=colour, label=name)
        bad = [p for p in pts if p.tokens_per_s is None and p.min_peak_memory_bytes is not None]
        if bad:
            ax_m.plot([xpos(p) for p in bad], [p.min_peak_memory_bytes / GiB for p in bad], "o", color=colour,
                      markerfacecolor="none", markersize=8)
    limits = sorted({p.mem_limit_bytes for p in res.points})
    if xa == "mem_limit_bytes":
        ax_m.plot([v / GiB for v in limits], [v / GiB for v in limits], ":", color="grey", label="limit")
    else:
        for v in limits:
            ax_m.axhline(v / GiB, linestyle=":", color="grey")
    for ax in (ax_t, ax_m):
        ax.set_xlabel(TITLES[xa] + (" (GiB)" if xa == "mem_limit_bytes" else ""))
        ax.grid(alpha=0.3)
        if categorical:
            ax.set_xticks(range(len(xs_all)), [str(v) for v in xs_all])
        elif xa in ("devices", "seq_len", "micro_batch") and max(xs_all) >= 4 * min(xs_all):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs_all, [str(v) for v in xs_all])
        else:
            ax.set_xticks([v / GiB if xa == "mem_limit_bytes" else v for v in xs_all],
                          [f"{v / GiB:g}" if xa == "mem_limit_bytes" else f"x{v:g}" if isinstance(v, float)
                           else str(v) for v in xs_all])
        top = max([max(line.get_ydata()) for line in ax.get_lines() if len(line.get_ydata())] + [1e-9])
        ax.set_ylim(0, top * 1.08)          # room above the highest point
    ax_t.ticklabel_format(axis="y", style="plain")
    ax_t.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax_t.set_ylabel("tokens/s (whole job)")
    ax_m.set_ylabel("peak memory per device (GiB)")
    ax_t.set_title("throughput of the best plan")
    ax_m.set_title("its peak memory (dotted: the limit)")
    handles, labels = ax_t.get_legend_handles_labels()
    handles += [Line2D([], [], linestyle="--", color="black", linewidth=1),
                Line2D([], [], marker="o", linestyle="", color="black", markerfacecolor="none")]
    labels += ["best uniform baseline", "nothing fits: least peak"]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), frameon=False, fontsize=9)
    fig.suptitle(f"osdp-sim sweep on {res.hardware}: " + ", ".join(sorted({p.model for p in res.points})))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    path = Path(path)
    svg = path.with_suffix(".svg")
    fig.savefig(path, dpi=130)
    fig.savefig(svg)
    plt.close(fig)
    return [path, svg]
