"""The timeline / plan-strip figure is written and reflects the plan."""

from osdp_sim.cli.main import main
from osdp_sim.plan import GroupChoice
from osdp_sim.viz.timeline import STRATEGY_COLOURS, _choice_colour


def test_estimate_plot_writes_png_and_svg(tmp_path, capsys):
    out = tmp_path / "step.png"
    assert main(["estimate", "--hw", "titan8", "--model", "gpt2-tiny", "--strategy", "zero3",
                 "--micro-batch", "2", "--checkpoint", "--plot", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert (tmp_path / "step.svg").read_text().startswith("<?xml")


def test_split_colour_is_between_its_strategy_and_zero3():
    import matplotlib.colors as mc
    half = _choice_colour(GroupChoice("ddp", 4, 2))
    a, b = mc.to_rgb(STRATEGY_COLOURS["ddp"]), mc.to_rgb(STRATEGY_COLOURS["zero3"])
    assert all(abs(h - (x + y) / 2) < 1e-9 for h, x, y in zip(half, a, b))
