"""Predicted-vs-measured plot of a calibration: iteration time and peak memory, one point per
run, before calibration, after (in-sample) and leave-one-out, with the y = x line and the target
bands (10% for time, 3% for memory)."""

from pathlib import Path

TIME_BAND = 0.10
MEMORY_BAND = 0.03


def plot_calibration(path: str | Path, measured_time_s, measured_memory_bytes, series: dict,
                     title: str = "") -> Path:
    """`series`: label -> (predicted times in s, predicted peaks in bytes), e.g.
    {"before": (...), "after": (...), "leave-one-out": (...)}. Writes a PNG; returns its path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    styles = {"before": dict(marker="o", facecolors="none", edgecolors="0.55", s=36),
              "after": dict(marker="o", color="tab:blue", s=24),
              "leave-one-out": dict(marker="x", color="tab:orange", s=36)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    panels = [(axes[0], 0, 1e3, "iteration time (ms)", TIME_BAND),
              (axes[1], 1, 1 / 2**20, "peak memory (MiB)", MEMORY_BAND)]
    measured = (measured_time_s, measured_memory_bytes)
    for ax, k, scale, what, band in panels:
        keep = [i for i, m in enumerate(measured[k]) if m is not None]   # runs without a measurement
        xs = [measured[k][i] * scale for i in keep]
        values = list(xs)
        for label, preds in series.items():
            ys = [preds[k][i] * scale for i in keep]
            values += ys
            ax.scatter(xs, ys, label=label, zorder=3, **styles.get(label, {}))
        lo, hi = min(values) / 1.15, max(values) * 1.15
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, zorder=2, label="y = x")
        ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                        color="tab:green", alpha=0.12, zorder=1, label=f"±{band:.0%}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {what}")
        ax.set_ylabel(f"predicted {what}")
        ax.set_aspect("equal")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
