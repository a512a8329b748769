"""Timeline of one simulated step (two streams) and the plan strip (choice per group, per block)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

KIND_COLOURS = {
    "fwd": "#4c72b0", "bwd": "#55a868", "recompute": "#8172b2", "optimizer": "#937860",
    "all_gather": "#dd8452", "reduce_scatter": "#c44e52", "all_reduce": "#da8bc3", "copy": "#8c8c8c",
}
STRATEGY_COLOURS = {"ddp": "#4c72b0", "zero2": "#55a868", "zero3": "#c44e52"}


def _choice_colour(choice) -> tuple:
    """Replicated strategy's colour blended toward zero3's by the sharded fraction."""
    import matplotlib.colors as mc
    base = mc.to_rgb(STRATEGY_COLOURS[choice.strategy])
    if not choice.is_split or choice.strategy == "zero3":
        return base
    z3 = mc.to_rgb(STRATEGY_COLOURS["zero3"])
    f = choice.shard_fraction
    return tuple((1 - f) * b + f * z for b, z in zip(base, z3))


def plot_step(est, plan, path, title: str = "") -> None:
    """Two panels: the simulated timeline of the last micro-step, and the plan strip."""
    fig, (ax, axp) = plt.subplots(2, 1, figsize=(12, 4.8), gridspec_kw={"height_ratios": [2, 1.3]})
    rows = {"compute": 1, "comm": 0}
    for t in est.timeline:
        if t.end_s <= t.start_s:
            continue
        ax.barh(rows[t.stream], (t.end_s - t.start_s) * 1e3, left=t.start_s * 1e3, height=0.8,
                color=KIND_COLOURS.get(t.kind, "grey"), edgecolor="white", linewidth=0.2)
    ax.set_yticks([0, 1], ["communication", "compute"])
    ax.set_xlabel("time in the step (ms)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in KIND_COLOURS.items()], ncol=7,
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    ax.set_title(title or "simulated step")

    blocks = plan.model.n_layers
    for row, group in ((1, "attn"), (0, "mlp")):
        for i in range(blocks):
            c = plan.choices[f"block{i}.{group}"]
            axp.bar(i, 0.9, bottom=row, color=_choice_colour(c), width=1.0, edgecolor="white", linewidth=0.3)
    for i, on in enumerate(plan.checkpoint):
        if on:
            axp.plot(i, 2.05, marker="v", color="black", markersize=3)
    axp.set_yticks([0.45, 1.45], ["mlp", "attention"])
    axp.set_xlim(-0.5, blocks - 0.5)
    axp.set_ylim(0, 2.3)
    axp.set_xlabel(f"block (root: {plan.choices['root'].label()}; triangles: checkpointed; "
                   "colour: ddp blue, zero2 green, zero3 red, splits blended by sharded fraction)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    if str(path).endswith(".png"):
        fig.savefig(str(path)[:-4] + ".svg")
    plt.close(fig)
